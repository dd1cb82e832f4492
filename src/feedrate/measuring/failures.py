"""Turning a pipeline's failures into messages a user can act on, and never leaving workers behind.

* ``IndexReportingDataset`` wraps a map-style dataset so an exception raised while loading a sample
  carries the sample's index (as an exception note, which survives the trip from a worker);
* ``Watchdog`` ends a measurement that receives no batch for ``timeout_s``;
* ``diagnosis.explain`` (beside this module) says what a failure means;
* ``stop_workers`` ends a DataLoader iterator's workers within a bound (after an error or Ctrl-C,
  or when autotune drops a configuration, DataLoader's own shutdown can wait seconds per worker
  that is stuck in user code); ``share_temp_folder``, called before workers start, keeps what
  an ended worker leaves in the temporary directory inside this process's own folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing.connection
import multiprocessing.util
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from torch.utils.data import Dataset

from feedrate.errors import PipelineTimeoutError
from feedrate.loader.forwarding import Forwarding
from feedrate.measuring.diagnosis import COLLATE_NOTE, NOTE, WORKER_DIED
from feedrate.measuring.inner import real_iterator

#: The indices this process fetched last: a worker (or the main process) fetches a batch, then
#: collates it, so a collate_fn that raises was given these samples.
_last_indices: list[Any] = []

#: How long ``stop_workers`` waits for DataLoader's pin-memory thread: it looks at its stop
#: event every 0.1 s (``MP_STATUS_CHECK_INTERVAL``), or sooner when its queue wakes it.
PIN_THREAD_JOIN_S = 1.0


def _note(exc: BaseException, where: object, prefix: str = NOTE) -> None:
    add_note = getattr(exc, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(f"{prefix}{where}")


class IndexReportingCollate:
    """``collate_fn`` as it is, noting the batch's sample indices on an exception (the indices
    of the fetch just before, in this process). Picklable where ``fn`` is."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, samples: Any) -> Any:
        try:
            return self.fn(samples)
        except Exception as exc:
            shown = _last_indices[:8]
            more = ", ..." if len(_last_indices) > 8 else ""
            _note(exc, f"[{', '.join(map(repr, shown))}{more}]", COLLATE_NOTE)
            raise


class IndexReportingDataset(Forwarding, Dataset[Any]):
    """A map-style dataset that behaves exactly like ``inner`` (indexing, ``len``, attribute reads
    and writes) and notes the failing index on exceptions. Its ``__getitems__`` keeps ``inner``'s
    own ``__getitems__`` when it has one, else fetches one by one as DataLoader does."""

    def __len__(self) -> int:
        return len(self._feedrate_inner)

    @property
    def feedrate_per_index(self) -> bool:
        """Its ``__getitems__`` only loops over ``__getitem__`` (``inner`` has none of its own),
        so a threaded fetch may call ``__getitem__`` per index instead."""
        return getattr(self._feedrate_inner, "__getitems__", None) is None

    def __getitem__(self, index: Any) -> Any:
        try:
            return self._feedrate_inner[index]
        except Exception as exc:
            _note(exc, index)
            raise

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        _last_indices[:] = list(indices)
        inner = self._feedrate_inner
        own = getattr(inner, "__getitems__", None)
        if own:
            try:
                return own(indices)  # as it is: collate_fn may expect what it returns
            except Exception as exc:
                _note(exc, f"one of {list(indices)[:8]}")
                raise
        out: list[Any] = []
        index: Any = None
        try:
            for index in indices:
                out.append(inner[index])
        except Exception as exc:
            _note(exc, index)
            raise
        return out


def _raised_as(message: str) -> type[PipelineTimeoutError]:
    """A ``PipelineTimeoutError`` subclass that carries ``message``: an exception raised in
    another thread is given as a type, built there without arguments."""

    def init(self: PipelineTimeoutError) -> None:
        PipelineTimeoutError.__init__(self, message)

    return type("PipelineTimeoutError", (PipelineTimeoutError,), {"__init__": init})


class Watchdog:
    """Raises ``PipelineTimeoutError`` in the measuring thread when ``kick()`` is not called for
    ``timeout_s`` seconds. In the main thread of a POSIX process it uses SIGALRM; in any other
    thread (a measurement run from a thread pool, a notebook's worker thread) a timer thread
    raises it asynchronously in the measuring thread, which takes effect as soon as that thread
    runs Python code again (DataLoader's own waits come back to Python every few seconds)."""

    def __init__(self, timeout_s: float | None, describe: Callable[[], str]) -> None:
        self.timeout_s, self._describe = timeout_s, describe
        self.armed = False
        self._previous: Any = None
        self._last_kick = -float("inf")
        self._thread: threading.Thread | None = None
        self._target: int | None = None  # the measuring thread, off the main thread
        self._stop = threading.Event()

    def __enter__(self) -> Watchdog:
        if not self.timeout_s:
            return self
        self.armed = True
        if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGALRM, self._fire)
        else:
            self._target = threading.get_ident()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._watch, name="feedrate-watchdog", daemon=True
            )
            self._thread.start()
        self.kick()
        return self

    def kick(self) -> None:
        """A batch arrived. The timer is re-armed at most four times per timeout (a system call
        per batch costs fast pipelines measurable time), for ``1.25 × timeout_s``: so it fires
        between ``timeout_s`` and ``1.25 × timeout_s`` after the last batch."""
        if not (self.armed and self.timeout_s):
            return
        now = time.monotonic()
        if now - self._last_kick < self.timeout_s / 4:
            return
        self._last_kick = now
        if self._target is None:
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s * 1.25)

    def __exit__(self, *exc: object) -> None:
        self.disarm()

    def disarm(self) -> None:
        """Stop watching (e.g. before a shutdown that may legitimately take a while)."""
        if not self.armed:
            return
        self.armed = False
        if self._target is None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        assert self.timeout_s is not None and self._target is not None
        while not self._stop.wait(min(0.25, self.timeout_s / 4)):
            if self.armed and time.monotonic() - self._last_kick > self.timeout_s * 1.25:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._target), ctypes.py_object(_raised_as(self.message()))
                )
                return

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        raise PipelineTimeoutError(self.message())

    def message(self) -> str:
        return (
            f"no batch arrived within {self.timeout_s:.3g} s ({self._describe()}): the pipeline "
            "appears to hang; check for a deadlock or a blocking read in the dataset, or raise "
            "the timeout if a batch really takes that long (timeout_s=..., or --timeout)"
        )


def stop_workers(iterator: object, *, grace_s: float = 0.5) -> None:
    """End ``iterator``'s worker processes within about ``3 * grace_s`` (and a second for a
    pin-memory thread): ask them to leave as DataLoader's shutdown does (its pin-memory thread
    first, ``done_event``, then ``None`` on each index queue), terminate those still there
    after ``grace_s``, kill what is left after another ``grace_s``, then let DataLoader
    release its queues and threads. ``iterator`` may be what a DataLoader subclass's
    generator ``__iter__`` returned: its DataLoader iterator is found inside
    (``inner.real_iterator``).

    Asking first matters: a worker that leaves on its own runs ``multiprocessing``'s exit
    handlers, which remove what it made in the temporary directory when it first sent a tensor
    (torch's file-descriptor sharing listens on a socket there, in a ``pymp-*`` folder of the
    worker's own unless ``share_temp_folder`` ran before it started). One ended by a signal
    leaves those behind, at every configuration autotune drops. An idle worker (autotune drains
    a lane before it ends it) leaves in milliseconds; one busy in the dataset finishes its
    sample first, or is terminated after ``grace_s``."""
    iterator = real_iterator(iterator)
    workers = list(getattr(iterator, "_workers", None) or [])
    if not workers:
        return
    _unwatch(iterator)
    _ask_to_leave(iterator)
    alive = _wait_ended(workers, grace_s)
    for proc in alive:
        _quietly(proc.terminate)
    alive = _wait_ended(alive, grace_s)
    for proc in alive:
        _quietly(proc.kill)
    _wait_ended(alive, grace_s)
    pinning = getattr(iterator, "_pin_memory_thread", None)
    if pinning is not None and pinning.is_alive():
        # Stuck (on half a message from a worker ended mid-write): DataLoader's shutdown, here
        # or in the iterator's __del__, would join it with no bound. It is left to end with
        # the process (a daemon thread); its queue is closed without waiting for its feeder.
        it: Any = iterator
        _quietly(it._worker_result_queue.cancel_join_thread)
        _quietly(it._worker_result_queue.close)
        with contextlib.suppress(AttributeError):
            del it._pin_memory_thread  # DataLoader looks for it with hasattr()
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        _quietly(shutdown)


def _wait_ended(workers: list[Any], timeout_s: float) -> list[Any]:
    """Wait up to ``timeout_s`` for ``workers`` (``multiprocessing`` processes) to end; the
    ones still alive. Each is waited through its own ``sentinel`` and reaped by its own
    ``exitcode`` (a ``waitpid`` of ``multiprocessing``'s): reaped by anyone else (psutil's
    ``wait_procs`` does), it would stay among ``multiprocessing``'s children for good, its
    exit code unknown, its two pipes open, and be sent SIGTERM at this process's exit under a
    pid the system may have given another process."""
    deadline = time.monotonic() + timeout_s
    alive = [proc for proc in workers if _running(proc)]
    while alive and (left := deadline - time.monotonic()) > 0:
        sentinels = {}
        for proc in alive:
            with contextlib.suppress(Exception):
                sentinels[proc.sentinel] = proc
        if not sentinels:
            break
        ready = multiprocessing.connection.wait(list(sentinels), timeout=left)
        ended = {id(sentinels[s]) for s in ready}
        # Ended, by its sentinel, yet not reaped here: someone else reaped it (SIGCHLD
        # ignored, say): nothing more to wait for, and no pid of its to signal.
        alive = [p for p in alive if _running(p) and id(p) not in ended]
    return alive


def _running(proc: Any) -> bool:
    try:
        return proc.exitcode is None
    except Exception:  # closed, or not a process of this one's: nothing to wait for
        return False


def share_temp_folder() -> None:
    """Give this process its ``multiprocessing`` temporary folder now (``pymp-*``, removed
    when it exits), so that worker processes started after this use it rather than making
    their own: a worker ends by a signal (killed, hung past a timeout, busy when stopped)
    without removing what it made, and its socket left in this process's folder goes when
    this process exits, where a folder of its own would stay in /tmp for good. Workers
    inherit the folder's name with the rest of ``multiprocessing``'s process config, whatever
    the start method. Idempotent; a folder that cannot be made is left to each worker."""
    with contextlib.suppress(OSError):
        multiprocessing.util.get_temp_dir()


def _ask_to_leave(iterator: object) -> None:
    """What DataLoader's ``_shutdown_workers`` does before its joins of up to 5 s each: its
    pin-memory thread stopped first (``pin_memory``), then the done event (a worker then skips
    what is still queued for it and does not wait to flush its result queue on the way out),
    and ``None``, the signal to leave, on every index queue."""
    pinning = getattr(iterator, "_pin_memory_thread", None)
    if pinning is not None and pinning.is_alive():
        # First, as DataLoader's shutdown does: a worker ended mid-write could leave the
        # thread that pins its batches waiting for the rest of a message for good.
        it: Any = iterator
        _quietly(it._pin_memory_thread_done_event.set)
        _quietly(functools.partial(it._worker_result_queue.put, (None, None)))
        _quietly(functools.partial(pinning.join, timeout=PIN_THREAD_JOIN_S))
    done = getattr(iterator, "_workers_done_event", None)
    if done is not None:
        _quietly(done.set)
    for queue in getattr(iterator, "_index_queues", None) or []:
        _quietly(functools.partial(queue.put, None))


def shut_down(iterator: object, loader: object = None) -> None:
    """Shut ``iterator``'s workers down now, gracefully (the DataLoader iterator inside a
    generator ``__iter__`` too, whose generator is closed), and those of ``loader``'s
    persistent iterator, rather than whenever the garbage collector gets to them."""
    real = real_iterator(iterator)
    shutdown = getattr(real, "_shutdown_workers", None)
    if shutdown is not None:
        _quietly(shutdown)
    if real is not iterator and hasattr(iterator, "gi_frame"):
        _quietly(iterator.close)  # type: ignore[attr-defined]
    persistent = getattr(loader, "_iterator", None)
    if persistent is not None and persistent is not real:
        stop_workers(persistent)


def quiesce(iterator: object, watchdog: Watchdog) -> None:
    """After a failure: stop the watchdog, and stop DataLoader's SIGCHLD handler from raising
    about workers already known dead while we clean up. The handler may fire between the two, so
    its report (which ``explain`` already covers) is swallowed and the step retried: all of it,
    finding the iterator too (a walk of the garbage collector's referents, long enough for the
    signal to land in; once a report interrupted it there and escaped, raw, in place of the
    error ``explain`` would have named)."""
    for _ in range(3):
        try:
            watchdog.disarm()
            _unwatch(real_iterator(iterator))
            return
        except RuntimeError as exc:
            if not WORKER_DIED.search(str(exc)):
                raise


def _unwatch(iterator: object) -> None:
    """Stop DataLoader's SIGCHLD handler from reporting workers we end on purpose."""
    if not getattr(iterator, "_worker_pids_set", False):
        return
    try:
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(iterator))  # type: ignore[attr-defined]
        iterator._worker_pids_set = False  # type: ignore[attr-defined]
    except Exception:  # internal API: worst case the handler reports a terminated worker
        pass


def _quietly(fn: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        fn()
