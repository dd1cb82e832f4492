"""DataLoader workers that were forked and never started.

A child of ``os.fork()`` in a process with other threads can hang before any of its code runs:
a lock another thread held at the fork is held for ever in the child (CPython gh-112275 before
3.11.10, beside ``torch.distributed``'s threads; a C library's lock beside its own threads).
DataLoader then waits for that worker's batches for ever: it sees the process alive and raises
nothing. ``Starts`` marks each worker as it reaches ``worker_init_fn`` (its pid in shared
memory, written before the user's function runs), so the one that never got there is named
within ``START_S`` rather than never. Only forked workers are watched: a spawned one imports
torch and unpickles the dataset first, which can take longer than any bound worth setting, and
it does not inherit another thread's lock. Nor are workers an iterator starts out of sight (a
generator ``__iter__``'s, forked at its first ``next()``), or with an init function of its own.
The same init function lets every worker, forked or spawned, leave with the main process.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader

from feedrate.errors import WorkersNotStartedError

#: How long forked workers get to reach ``worker_init_fn`` (s). A fork that will start does so
#: within milliseconds of getting a CPU (at most seconds with hundreds of processes on 2 CPUs);
#: one that hung in the fork never does.
START_S = 30.0

#: ``wait``'s first and longest pause between looks (s): the last worker forked usually marks
#: within a millisecond, so the pause doubles from the first to the longest.
POLL_S = (0.0002, 0.005)

#: How many times workers are started before one that never started is an error: the hang is
#: a race, so the next fork almost always starts.
START_TRIES = 2

#: How often a worker looks whether its main process is still there (s), and how long after
#: it is gone the worker leaves by itself should torch's loop not have ended it (s): that loop
#: looks every 5 s, a dataset blocked in a read never.
ORPHAN_POLL_S = 0.5
ORPHAN_EXIT_S = 10.0


class _Marked:
    """``worker_init_fn`` that first writes its worker's pid into ``pids`` (where the workers
    are forked; None: not watched) and lets the worker leave with its main process."""

    def __init__(self, pids: Any, fn: Callable[[int], None] | None) -> None:
        self.pids, self.fn = pids, fn

    def __call__(self, worker_id: int) -> None:
        if self.pids is not None:
            self.pids[worker_id] = os.getpid()
        _leave_with_main_process(sys._getframe(1))
        if self.fn is not None:
            self.fn(worker_id)


def _leave_with_main_process(frame: FrameType | None) -> None:
    """In a DataLoader worker (``frame``: its init function's caller): never outlive the main
    process. torch's worker sees a dead main process within 5 s and leaves its loop, but, unless
    the loader was shut down, then joins its queue's feeder thread, which waits for ever on a
    full pipe whose read end the sibling workers hold open: a tune killed by SIGKILL or the OOM
    killer left 100 workers for hours. A thread of the worker's own (``_orphaned``) cancels that
    join once the main process is gone, and ends the worker should it still be there
    ``ORPHAN_EXIT_S`` later. Not before: a worker that leaves without that join can die with
    the queue's write lock, shared by its siblings, held by its feeder thread, and they would
    wait for it for ever (an IterableDataset's worker is shut down when its stream ends, while
    the others go on). Where torch's worker loop looks otherwise, nothing is done."""
    for _ in range(4):
        if frame is None:
            return
        if frame.f_code.co_name == "_worker_loop":
            queue = frame.f_locals.get("data_queue")
            if callable(getattr(queue, "cancel_join_thread", None)):
                watch = functools.partial(_orphaned, queue, os.getppid())
                threading.Thread(target=watch, name="feedrate-orphan", daemon=True).start()
            return
        frame = frame.f_back


def _orphaned(queue: Any, parent: int, poll_s: float = ORPHAN_POLL_S) -> None:
    """Wait until this process's ``parent`` is gone, then cancel the join of ``queue``'s
    feeder thread (nobody will read what it holds) and, ``ORPHAN_EXIT_S`` later, leave."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    queue.cancel_join_thread()
    time.sleep(ORPHAN_EXIT_S)
    os._exit(0)


class Starts:
    """The start marks of ``loader``'s workers: its ``worker_init_fn`` is wrapped, where it
    has workers. Their start is watched where they are forked (else ``watched`` is False);
    every worker leaves with the main process."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.watched = loader.num_workers > 0 and _start_method(loader) == "fork"
        self._loader = loader
        self._pids: Any = None
        self._marked: _Marked | None = None
        self.hung: list[int] = []  # the pids of workers seen hung, for the caller to report
        if self.watched:
            # Raw shared memory, allocated before the fork: the child writes, this process reads.
            self._pids = multiprocessing.RawArray(ctypes.c_long, loader.num_workers)
        if loader.num_workers > 0:
            self._marked = _Marked(self._pids, loader.worker_init_fn)
            loader.worker_init_fn = self._marked

    def unstarted(self, iterator: object) -> list[int]:
        """The pids of ``iterator``'s workers that are alive and have not marked their start
        (a dead one is DataLoader's to report). ``iterator``: what ``iter(loader)`` returned;
        behind a generator, the loader's persistent iterator, else nothing is watched; nor
        an iterator that does not run the marking init function (a subclass's own)."""
        if not self.watched:
            return []
        if getattr(iterator, "_workers", None) is None:
            iterator = getattr(self._loader, "_iterator", None)
        workers = getattr(iterator, "_workers", None)
        if not workers or not self._runs_marks(iterator):
            return []
        return [
            w.pid
            for i, w in enumerate(workers)
            if i < len(self._pids) and self._pids[i] != w.pid and _alive(w)
        ]

    def wait(
        self,
        iterator: object,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> list[int]:
        """Wait until every worker of ``iterator`` has started, ``timeout_s`` (``START_S``)
        at most: the pids of those that had not by then (none: all started)."""
        end = clock() + (START_S if timeout_s is None else timeout_s)
        pause = POLL_S[0]
        while stuck := self.unstarted(iterator):
            if clock() >= end:
                return stuck
            time.sleep(pause)
            pause = min(2 * pause, POLL_S[1])
        return []

    def _runs_marks(self, iterator: object) -> bool:
        init = getattr(iterator, "_worker_init_fn", None)
        while isinstance(init, functools.partial):  # DataLoader's own wrapping, for data pipes
            init = next((a for a in init.args if isinstance(a, _Marked)), init.func)
        return init is self._marked


def iterate(
    make: Callable[[], Any],
    starts: Starts,
    end: Callable[[Any], None],
    timeout_s: float | None = None,
) -> Any:
    """``make()`` (an ``iter()`` of the loader ``starts`` watches), once its forked workers have
    all started. Should one not start within ``timeout_s``, ``end(iterator)`` ends them (and
    gives back what they took) and ``make`` is called again, ``START_TRIES`` times in all;
    then ``WorkersNotStartedError``."""
    stuck: list[int] = []
    for _ in range(START_TRIES):
        made = make()
        if not (stuck := starts.wait(made, timeout_s)):
            return made
        starts.hung.extend(stuck)
        end(made)
    raise not_started(stuck, timeout_s)


def bound(timeout_s: float | None) -> float:
    """The start bound under a hang timeout of ``timeout_s``: every try within it."""
    return START_S if not timeout_s else min(START_S, timeout_s / (START_TRIES + 1))


def notes(starts: Starts) -> list[str]:
    """What a measurement says of the workers ``starts`` saw hung (none: nothing)."""
    if not starts.hung:
        return []
    shown = ", ".join(str(p) for p in starts.hung)
    return [
        f"worker process(es) {shown} hung in their fork and the workers were started again: "
        "the start-up time includes the wait for them"
    ]


def not_started(pids: list[int], timeout_s: float | None = None) -> WorkersNotStartedError:
    """The error for workers that never started, with what to do."""
    waited = START_S if timeout_s is None else timeout_s
    shown = ", ".join(str(p) for p in pids[:8]) + (" ..." if len(pids) > 8 else "")
    return WorkersNotStartedError(
        f"DataLoader worker process(es) {shown} did not start within {waited:.0f} s of their "
        f"fork, {START_TRIES} times: a fork beside other threads hung before any of its code "
        "ran. Python before 3.11.10 (3.10.15, 3.9.20) hangs so beside torch.distributed's "
        "threads (CPython gh-112275), and upgrading fixes it; elsewhere, "
        "multiprocessing_context='forkserver' or 'spawn' in the DataLoader avoids forking"
    )


def _start_method(loader: DataLoader[Any]) -> str:
    context = loader.multiprocessing_context
    if context is not None:
        return str(context.get_start_method())
    # Not get_start_method(): it would fix the process's default; the first listed is it.
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


def _alive(worker: Any) -> bool:
    try:
        return bool(worker.is_alive())
    except (AssertionError, ValueError):  # not this process's child, or closed
        return False
