"""The time a thread spent runnable but queued for a CPU, and the loop's wait in ``next()``
without it.

A loop that waits in ``next()`` for a batch already made, but whose thread sat in the run
queue while other processes held the CPUs, did not wait for data: no worker count would have
shortened that wait. On a busy machine it reached a tenth of a 40 ms step (two busy loops on
two CPUs), enough to call a fed loop starved and buy workers that do not help. So the loop's
own run-queue time during the wait is moved to its step: the step is the loop's pace on the
CPUs it gets (Linux ``/proc/<pid>/task/<tid>/schedstat``, its second field; elsewhere, or where
the kernel does not count it, zero, and the wait is the clock's alone).

Not without workers: the loop's thread then makes each batch itself inside ``next()``, and its
time queued for a CPU there is the data's, not the step's (moved, a loop that waited on its
data 62% of the time on a busy machine read 28%). ``of_loop`` says which.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable

#: A thread's cumulative run-queue seconds, read on the thread that calls it.
Queued = Callable[[], float]


class ThreadQueued:
    """Call it for the calling thread's cumulative seconds queued for a CPU (0.0 where it cannot
    be read). One file kept open per thread: a read is a ``pread`` of a few microseconds."""

    def __init__(self) -> None:
        self._fds: dict[int, int | None] = {}

    def __call__(self) -> float:
        tid = threading.get_native_id()
        fd = self._fds.get(tid, -1)
        if fd == -1:
            fd = self._fds[tid] = _open(tid)
        if fd is None:
            return 0.0
        try:
            return int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        """Close the files (a later call opens them again)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __del__(self) -> None:
        # Not contextlib.suppress: at interpreter exit the modules may be gone already.
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass


def _open(tid: int) -> int | None:
    try:
        return os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
    except OSError:
        return None


def never() -> float:
    """No run-queue time (or CPU time): the wait is the clock's alone (tests, a fake clock)."""
    return 0.0


def beside(clock: Callable[[], float]) -> Queued:
    """The run-queue time to read beside ``clock``: the thread's with the real clock
    (``time.perf_counter``), none with a fake one, whose seconds it could not be taken from."""
    return ThreadQueued() if clock is time.perf_counter else never


def of_loop(clock: Callable[[], float], num_workers: int) -> Queued:
    """The run-queue time to move from the loop's wait to its step: ``beside(clock)`` with
    workers, none without (the wait in ``next()`` is the batch being made, queued or not)."""
    return beside(clock) if num_workers > 0 else never


#: A reading of the loop's clock, its thread's run-queue time and its time on a CPU (s).
Mark = tuple[float, float, float]


class Marks:
    """Call it for a ``Mark``: ``clock()``, ``queued`` (default: ``beside(clock)``) and, on the
    real clock, the thread's CPU clock (``schedstat``'s own CPU time lags a running thread by
    up to a scheduler tick, as long as a small batch takes to arrive; a fake clock reads 0).
    Not ``exact``: the clock alone, the others NaN (read as none); 0.14 µs a mark against
    2.8-3.0 µs (``python benchmarks/watch_cost.py``, 2026-12-05, a quiet 2-CPU machine)."""

    def __init__(self, clock: Callable[[], float], queued: Queued | None = None) -> None:
        self.clock, self.queued = clock, queued or beside(clock)
        self.on_cpu = time.thread_time if clock is time.perf_counter else never
        self.exact = True

    def __call__(self) -> Mark:
        if not self.exact:
            return self.clock(), math.nan, math.nan
        return self.clock(), self.queued(), self.on_cpu()


def wait_and_step(asked: Mark, got: Mark, back: Mark, workers: bool = True) -> tuple[float, float]:
    """The loop's wait in ``next()`` (asked for a batch at ``asked``, got it at ``got``) and its
    step until it asked again at ``back``, the wait's run-queue time moved to the step where
    the batch came from ``workers`` (see the module's docstring)."""
    queued = got[1] - asked[1] if workers else 0.0
    return split(got[0] - asked[0], back[0] - got[0], queued)


def busy(asked: Mark, got: Mark) -> float:
    """The loop thread's seconds on a CPU while it waited in ``next()``: receiving the batch
    (the hand-off from a worker, in the main process), and autotune's own bookkeeping of the
    batch before (a few microseconds); none where either mark did not read it."""
    on_cpu = got[2] - asked[2]
    return on_cpu if on_cpu > 0 else 0.0


def split(wait: float, step: float, queued: float) -> tuple[float, float]:
    """``(wait, step)`` with the loop's run-queue seconds during the wait (``queued``) moved from
    the wait to the step; never more than the wait itself (NaN, not read: none)."""
    moved = min(queued, wait) if queued > 0 else 0.0
    return wait - moved, step + moved
