"""The lanes of ``autotune``: the epoch's index stream handed from one DataLoader (one per
configuration) to the next, so every batch of the epoch is yielded exactly once, in order.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils import signal_handling

from feedrate.loader import started
from feedrate.loader import threaded as fetching
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import (
    quiet_worker_count_warning,
    rebuild,
)
from feedrate.measuring.failures import share_temp_folder, stop_workers


class Stream:
    """The epoch's index batches, drawn from the user's batch sampler as lanes ask for them
    (never the whole epoch at once: an epoch of a million samples would be a million Python
    ints held, and made before the first batch). Batches a lane took but never used (its
    workers failed to start) are put back, to be handed out first."""

    def __init__(self, source: Iterator[list[Any]], length: int | None) -> None:
        self._source = source
        self._back: list[list[Any]] = []
        self.length = length  # batches in the epoch, where the batch sampler knows
        self.taken = 0

    def take(self) -> list[Any] | None:
        if self._back:
            batch = self._back.pop()
        else:
            try:
                batch = next(self._source)
            except StopIteration:
                return None
        self.taken += 1
        return batch

    def put_back(self, batches: list[list[Any]]) -> None:
        self._back.extend(reversed(batches))
        self.taken -= len(batches)

    def left(self) -> bool:
        """Whether batches may remain (unknown length: assume so)."""
        return bool(self._back) or self.length is None or self.taken < self.length


class Feed(Sampler[list[Any]]):
    """The batch sampler of a lane: it takes index batches from the epoch's stream as
    DataLoader asks, until frozen; then the ``tail`` it was given (batches taken for it from the
    stream, so that its last batch is one every rank of a job knows). While ``kept`` is a list
    it records what it took, so a lane that fails to start can put it back."""

    def __init__(self) -> None:
        self.stream: Stream | None = None
        self.frozen = False
        self.kept: list[list[Any]] | None = None
        self.tail: list[list[Any]] = []

    def set(self, stream: Stream) -> None:
        self.stream, self.frozen, self.tail = stream, False, []

    def __iter__(self) -> Iterator[list[Any]]:
        while not self.frozen and self.stream is not None:
            batch = self.stream.take()
            if batch is None:
                return
            if self.kept is not None:
                self.kept.append(batch)
            yield batch
        while self.tail:
            yield self.tail.pop(0)

    def __len__(self) -> int:
        stream = self.stream
        if stream is None or self.frozen:
            return len(self.tail)
        if stream.length is None:
            return 1 << 30  # unknown: as long as the user's sampler goes on
        return max(0, stream.length - stream.taken)


class Lane:
    """One configuration's DataLoader (persistent workers, reused across epochs) and feed;
    ``clock``: the caller's, which times its start."""

    def __init__(
        self,
        user: DataLoader[Any],
        config: LoaderConfig,
        split: bool,
        seed: int | None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config, self._clock = config, clock
        self.feed = Feed() if split else None
        persistent = replace(config, persistent_workers=config.num_workers > 0)
        # rebuild's loaders do not warn of more workers than CPUs (``allow_many_workers``): that
        # warning, which iter() of a generator __iter__ (a StreamingDataLoader's) would print
        # outside quiet_worker_count_warning, is ours to judge.
        self.loader = rebuild(user, persistent, batch_sampler=self.feed)
        if seed is not None:
            # Worker seeds from the epoch's own draw; the user's generator is left alone.
            self.loader.generator = torch.Generator().manual_seed(seed)
        # A forked worker that never starts is named, not waited for ever.
        self.starts = started.Starts(self.loader)
        self.it: Any = None
        self.start_s = 0.0
        self._starting: threading.Thread | None = None
        self._failed: BaseException | None = None

    def start(self, stream: Stream | None, *, keep: bool = False, quiet: bool = True) -> None:
        """Start iterating; with a stream, on its next batches. Should the workers fail to
        start, the batches this lane took go back to the stream; with ``keep`` it goes on
        recording them until ``kept`` (or ``give_back``) says whether it stays. ``start_s``:
        how long it took (new workers start here); ``quiet``: DataLoader's worker-count
        warning silenced around it (the loop's thread only)."""
        began = self._clock()
        try:
            self._start(stream, keep, quiet)
        finally:
            self.start_s = self._clock() - began

    def begin(self, stream: Stream, *, keep: bool = False) -> None:
        """``start`` on a thread of its own, while the loop drains the lane in use (which
        takes no more of ``stream``): forking many workers takes seconds (10 to 35 ms each on a
        2-CPU machine), which the loop would otherwise wait. ``ready`` waits for it."""

        device = loop_device()
        if self.config.num_workers > 0:
            worker_deaths_signalled()

        def run() -> None:
            try:
                if device is not None:  # a new thread starts on GPU 0: pin on the loop's GPU
                    torch.cuda.set_device(device)
                # Not quiet_worker_count_warning: warnings' filters are the whole process's,
                # not a thread's; rebuild's allow_many_workers keeps this loader from warning.
                self.start(stream, keep=keep, quiet=False)
            except BaseException as exc:  # raised by ready(), in the loop's thread
                self._failed = exc

        self._starting = threading.Thread(target=run, name="feedrate-lane-start", daemon=True)
        try:
            self._starting.start()
        except RuntimeError as exc:  # no thread to be had: the take-over finds it, as a fork's
            self._starting, self._failed = None, exc

    def ready(self) -> None:
        """Wait for ``begin``'s start to end; raise what it raised (its batches are back in
        the stream, as with ``start``)."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def start_error(self) -> str | None:
        """``ready``, as a take-over reads it: None, or why the workers did not start (memory,
        /dev/shm, open files, no thread); the batches this lane took are back in the stream."""
        try:
            self.ready()
        except Exception as exc:
            return str(exc)
        return None

    def restart(self, stream: Stream) -> None:
        """After a drain (the next lane could not start): go on with ``stream``'s next batches,
        the persistent workers kept."""
        self.thaw(stream)
        self.start(stream)

    def _start(self, stream: Stream | None, keep: bool, quiet: bool) -> None:
        quieted = quiet_worker_count_warning() if quiet else contextlib.nullcontext()
        share_temp_folder()  # stop_workers may have to terminate this lane's workers
        if self.feed is None or stream is None:
            with quieted:
                self._iterate(None)
            return
        self.feed.set(stream)
        self.feed.kept = []
        try:
            with quieted:
                self._iterate(stream)
        except BaseException:
            self.feed.frozen = True
            stream.put_back(self.feed.kept)
            raise
        finally:
            if not keep:
                self.feed.kept = None

    def _iterate(self, stream: Stream | None) -> None:
        """``iter()``, once its forked workers have started: should one hang in its fork (a
        race with another thread: ``loader.started``), they all end, the batches they took go
        back to ``stream``, and the start is tried again, its workers seeded alike."""
        generator = self.loader.generator  # None: the global one draws the workers' seed
        state = torch.get_rng_state() if generator is None else generator.get_state()

        def make() -> Any:
            self.it = iter(self.loader)
            return self.it

        def end(_: Any) -> None:
            self._end_workers()
            if stream is not None and self.feed is not None and self.feed.kept:
                stream.put_back(self.feed.kept)
                self.feed.kept.clear()
            if generator is None:
                torch.set_rng_state(state)
            else:
                generator.set_state(state)

        started.iterate(make, self.starts, end)

    def stays(self) -> None:
        """The lane stays: what it took is its own."""
        assert self.feed is not None
        self.feed.kept = None

    def give_back(self, stream: Stream) -> None:
        """The lane will not run (another rank's could not start): the batches it took go
        back to ``stream``, to be handed out first. Close it after."""
        assert self.feed is not None and self.feed.kept is not None
        self.feed.frozen = True
        stream.put_back(self.feed.kept)
        self.feed.kept = None

    def freeze(self, tail: list[list[Any]] | None = None) -> None:
        """Take no more batches from the stream (those taken are still yielded), then
        ``tail``'s."""
        assert self.feed is not None
        self.feed.tail = list(tail or [])
        self.feed.frozen = True

    def thaw(self, stream: Stream | None = None) -> None:
        """Take batches from the stream again; its ``tail`` goes back to ``stream`` first."""
        assert self.feed is not None
        if self.feed.tail and stream is not None:
            stream.put_back(self.feed.tail)
        self.feed.tail = []
        self.feed.frozen = False

    def close(self) -> None:
        """End the lane's workers: those of its iterator and of its loader's persistent one
        (the same, unless the loader's ``__iter__`` is a generator that hides it), once any
        start under way has ended (it would leave workers behind)."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        self._failed = None  # its traceback holds the half-started iterator
        self._end_workers()
        fetching.close(self.loader.dataset)

    def _end_workers(self) -> None:
        if self.it is not None:
            stop_workers(self.it)
            self.it = None
        persistent = getattr(self.loader, "_iterator", None)
        if persistent is not None:
            stop_workers(persistent)
            self.loader._iterator = None


#: Which of the lanes alive (their configurations) keeps its workers while a lane of the second
#: argument runs, or None: ``OnlineTuner.keep``.
KeepRule = Callable[[list[LoaderConfig], LoaderConfig], LoaderConfig | None]


class Kept:
    """The drained lane whose workers wait, idle, for a return to its configuration: autotune
    keeps one at a time, the one ``KeepRule`` names, so that a step up which does not beat it
    returns without forking its workers again."""

    def __init__(self) -> None:
        self.lane: Lane | None = None

    def take(self, config: LoaderConfig) -> Lane | None:
        """The kept lane, where it is of ``config`` (then no longer kept); else None."""
        lane = self.lane
        if lane is None or lane.config != config:
            return None
        self.lane = None
        return lane

    def choose(
        self,
        drained: Lane | None,
        going: LoaderConfig,
        rule: KeepRule,
        *,
        draining: LoaderConfig | None = None,
    ) -> None:
        """Of ``drained`` and the lane kept, the one ``rule`` names (``draining``: a lane still
        draining, a candidate for later) stays kept while ``going`` runs; the others end, each
        even where another's end is interrupted."""
        alive = [lane for lane in (drained, self.lane) if lane is not None]
        if not alive:
            return
        wanted = rule([lane.config for lane in alive] + ([draining] if draining else []), going)
        self.lane = next((lane for lane in alive if lane.config == wanted), None)
        with contextlib.ExitStack() as ends:
            for lane in alive:
                if lane is not self.lane:
                    ends.callback(lane.close)

    def only(self, config: LoaderConfig) -> None:
        """Autotune settled on ``config``: the lane kept ends unless it is of ``config`` (the
        move there takes it); no return comes to any other."""
        if self.lane is not None and self.lane.config != config:
            self.close()

    def close(self) -> None:
        lane, self.lane = self.lane, None
        if lane is not None:
            lane.close()


def loop_device() -> int | None:
    """The calling thread's current CUDA device, where CUDA is in use (a thread that starts a
    lane for it sets the same, or DataLoader would pin its batches on GPU 0)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return None
    return torch.cuda.current_device()


def worker_deaths_signalled() -> None:
    """DataLoader's SIGCHLD handler, installed from the loop's thread where it is the main one
    (as DataLoader's first ``iter()`` with workers would): DataLoader installs it from the main
    thread only, so a lane started on another thread, after an epoch begun without workers,
    would leave a worker's death to DataLoader's 5 s poll. Once per process; elsewhere a no-op."""
    set_handler = getattr(signal_handling, "_set_SIGCHLD_handler", None)
    if set_handler is not None:  # private in torch: where it moved, the 5 s poll remains
        set_handler()
