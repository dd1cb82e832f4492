"""DataLoader workers that were forked and never started.

A child of ``os.fork()`` in a process with other threads can hang before any of its code runs:
a lock another thread held at the fork is held for ever in the child (CPython gh-112275 before
3.11.10, beside ``torch.distributed``'s threads; a C library's lock beside its own threads).
DataLoader then waits for that worker's batches for ever: it sees the process alive and raises
nothing. ``Starts`` marks each worker as it reaches ``worker_init_fn`` (its pid in shared
memory, written before the user's function runs), so the one that never got there is named
within ``START_S`` rather than never. Only forked workers are watched: a spawned one imports
torch and unpickles the dataset first, which can take longer than any bound worth setting, and
it does not inherit another thread's lock.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from feedrate.errors import WorkersNotStartedError

#: How long forked workers get to reach ``worker_init_fn`` (s). A fork that will start does so
#: within milliseconds of getting a CPU (at most seconds with hundreds of processes on 2 CPUs);
#: one that hung in the fork never does.
START_S = 30.0

#: How often ``wait`` looks again (s).
POLL_S = 0.005

#: How many times workers are started before one that never started is an error: the hang is
#: a race, so the next fork almost always starts.
START_TRIES = 2


class _Marked:
    """``worker_init_fn`` that first writes its worker's pid into ``pids`` (picklable where the
    user's function is)."""

    def __init__(self, pids: Any, fn: Callable[[int], None] | None) -> None:
        self.pids, self.fn = pids, fn

    def __call__(self, worker_id: int) -> None:
        self.pids[worker_id] = os.getpid()
        if self.fn is not None:
            self.fn(worker_id)


class Starts:
    """The start marks of ``loader``'s workers: its ``worker_init_fn`` is wrapped, where its
    workers are forked (else ``watched`` is False and nothing changes)."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.watched = loader.num_workers > 0 and _start_method(loader) == "fork"
        self._loader_iterator = lambda: getattr(loader, "_iterator", None)
        self._pids: Any = None
        if self.watched:
            # Raw shared memory, allocated before the fork: the child writes, this process reads.
            self._pids = multiprocessing.RawArray(ctypes.c_long, loader.num_workers)
            loader.worker_init_fn = _Marked(self._pids, loader.worker_init_fn)

    def unstarted(self, iterator: object) -> list[int]:
        """The pids of ``iterator``'s workers that are alive and have not marked their start
        (a dead one is DataLoader's to report). ``iterator``: what ``iter(loader)`` returned;
        behind a generator, the loader's persistent iterator, else nothing is watched."""
        workers = getattr(iterator, "_workers", None)
        if workers is None:
            workers = getattr(self._loader_iterator(), "_workers", None)
        if not self.watched or not workers:
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
        bound = START_S if timeout_s is None else timeout_s
        end = clock() + bound
        while stuck := self.unstarted(iterator):
            if clock() >= end:
                return stuck
            time.sleep(POLL_S)
        return []


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
        end(made)
    raise not_started(stuck, timeout_s)


def not_started(pids: list[int], timeout_s: float | None = None) -> WorkersNotStartedError:
    """The error for workers that never started, with what to do."""
    bound = START_S if timeout_s is None else timeout_s
    shown = ", ".join(str(p) for p in pids[:8]) + (" ..." if len(pids) > 8 else "")
    return WorkersNotStartedError(
        f"DataLoader worker process(es) {shown} did not start within {bound:.0f} s of their "
        "fork: a fork beside other threads hung before any of its code ran (on Python before "
        "3.11.10 beside torch.distributed's threads, CPython gh-112275: upgrading Python fixes "
        "it; otherwise multiprocessing_context='forkserver' or 'spawn' avoids forking)"
    )


def _start_method(loader: DataLoader[Any]) -> str:
    context = loader.multiprocessing_context
    if context is None:
        return multiprocessing.get_start_method()
    return str(context.get_start_method())


def _alive(worker: Any) -> bool:
    try:
        return bool(worker.is_alive())
    except (AssertionError, ValueError):  # not this process's child, or closed
        return False
