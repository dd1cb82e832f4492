"""Reading the worker processes of the loaders being iterated, from a daemon thread at a low
rate, so the training loop pays nothing for it: each worker's CPU and run-queue time every
``cpu_every_s`` (two small /proc reads per worker) with the machine's busy CPUs, its memory
(USS, PSS: a slower smaps read) every ``memory_every_s``, and /dev/shm in use above its level
at start; and once more as DataLoader ends an iterator's workers (``read_at_shutdown``)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from feedrate.measuring.processes import runq_wait, shm_used_bytes, system_busy
from feedrate.running.observer import Watch

#: Seconds from the first loader iterated to the first reading.
FIRST_READ_S = 0.2


def read_at_shutdown(sampler: Callable[[], Sampler | None]) -> None:
    """Have DataLoader's multi-process iterator call ``sampler().last_reading`` before it
    shuts its workers down (once per class; patched on the class, so no iterator holds a
    reference to anything of feedrate's). Never the user's problem: a failure is ignored."""
    from torch.utils.data import dataloader

    cls: Any = dataloader._MultiProcessingDataLoaderIter
    if getattr(cls, "__feedrate_run__", False):
        return
    own = cls._shutdown_workers

    @functools.wraps(own)
    def _shutdown_workers(self: Any) -> None:
        try:
            taker = sampler()
            if taker is not None and not getattr(self, "_shutdown", True):
                taker.last_reading(self)
        except Exception:
            pass
        finally:
            own(self)  # whatever happened above (a Ctrl-C too), the workers are shut down

    cls._shutdown_workers = _shutdown_workers
    cls.__feedrate_run__ = True


def worker_pids(iterator: object) -> list[int]:
    """The pids of a DataLoader iterator's worker processes (none without workers)."""
    workers = getattr(iterator, "_workers", None) or []
    return [pid for w in workers if isinstance(pid := getattr(w, "pid", None), int)]


class Sampler:
    """Started at the first loader iterated; ``stop()`` at exit."""

    def __init__(
        self,
        watches: Callable[[], list[Watch]],
        *,
        cpu_every_s: float = 1.0,
        memory_every_s: float = 5.0,
        shm_path: str = "/dev/shm",
    ) -> None:
        self._watches = watches
        self._cpu_every, self._memory_every = cpu_every_s, memory_every_s
        self._shm_path = shm_path
        self._shm_base = shm_used_bytes(shm_path)
        self._handles: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="feedrate-run", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self.read(memory=False)  # the last figures

    def _run(self) -> None:
        ticks_per_memory = max(1, round(self._memory_every / self._cpu_every))
        tick = 0
        wait = min(FIRST_READ_S, self._cpu_every)  # the first soon: short runs get figures too
        while not self._stop.wait(wait):
            wait = self._cpu_every
            tick += 1
            try:
                self.read(memory=tick % ticks_per_memory == 1 or ticks_per_memory == 1)
            except Exception:  # a process gone between two reads, or psutil refusing
                continue

    def read(self, *, memory: bool) -> None:
        """One reading of every watched loader's workers (and of /dev/shm)."""
        shm = shm_used_bytes(self._shm_path)
        busy = (time.perf_counter(), system_busy())
        for watch in self._watches():
            tuner = watch.tuner  # autotune's (--autotune or the script's): its lane's workers
            pids = worker_pids(watch.iterator if tuner is None else tuner.lane_iterator)
            if pids:
                self._read(watch, pids, busy, memory=memory)
            if pids and shm is not None and self._shm_base is not None:
                watch.shm_peak = max(watch.shm_peak or 0, max(0, shm - self._shm_base))

    def last_reading(self, iterator: object) -> None:
        """A reading of ``iterator``'s workers as DataLoader is about to end them (an epoch's
        end without ``persistent_workers``, or the iterator's end): the CPU they used since the
        last reading, up to a second of it, is counted too. Workers that last an epoch of a
        second or two were read once or not at all, and their CPU read as a fraction of it."""
        pids = worker_pids(iterator)
        if not pids:
            return
        busy = (time.perf_counter(), system_busy())
        for watch in self._watches():
            lane = None if watch.tuner is None else watch.tuner.lane_iterator
            if watch.iterator is iterator or lane is iterator:
                self._read(watch, pids, busy, memory=False)

    def _read(
        self, watch: Watch, pids: list[int], busy: tuple[float, float], *, memory: bool
    ) -> None:
        uss = pss = 0
        for pid in pids:
            handle = self._handle(pid)
            if handle is None:
                continue
            try:
                # Counters only grow: the larger reading wins (the sampler's thread and the
                # last reading at shutdown may store theirs in either order).
                t = handle.cpu_times()
                cpu = float(t.user + t.system)
                watch.worker_cpu[pid] = max(cpu, watch.worker_cpu.get(pid, 0.0))
                queued = runq_wait(pid)
                if queued is not None:
                    watch.worker_runq[pid] = max(queued, watch.worker_runq.get(pid, 0.0))
                if memory:
                    info = handle.memory_full_info()
                    uss += int(getattr(info, "uss", 0))
                    pss += int(getattr(info, "pss", 0) or 0)
            except psutil.Error:
                continue
        if watch.busy_first is None:
            watch.busy_first = busy
        if watch.busy_last is None or busy[0] > watch.busy_last[0]:
            watch.busy_last = busy
        if memory and uss:
            watch.worker_uss = max(watch.worker_uss or 0, uss)
            watch.worker_pss = max(watch.worker_pss or 0, pss) if pss else watch.worker_pss

    def _handle(self, pid: int) -> psutil.Process | None:
        handle = self._handles.get(pid)
        if handle is None:
            try:
                handle = self._handles[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return handle
