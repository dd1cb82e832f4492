"""Per-process CPU and memory, and /dev/shm use, while a loader runs (psutil).

The measuring thread reads only CPU counters, and only at window boundaries (one small /proc
read per process), so the probe costs the measured loop nothing per batch. A daemon thread does
the rest while windows are open: /dev/shm usage every ``shm_interval_s`` (one ``statvfs``, to
catch the peak of batches that come and go) and every process's memory every
``memory_interval_s`` (reading smaps is slow enough that doing it at window ends would eat into
the windows).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any

import psutil

from feedrate.machine import cgroups
from feedrate.machine.cgroups import CpuPool
from feedrate.measuring import inner
from feedrate.results.processes import ProbeReport, ProcessFigures


def shm_used_bytes(path: str = "/dev/shm") -> int | None:
    """Bytes in use on the shared-memory filesystem, or None where it does not exist."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _thread_cpu(proc: psutil.Process, native_id: int | None) -> float:
    if native_id is None:
        return 0.0
    try:
        for t in proc.threads():
            if t.id == native_id:
                return float(t.user_time + t.system_time)
    except psutil.Error:
        pass
    return 0.0


def _cpu(proc: psutil.Process) -> float | None:
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


def runq_wait(pid: int) -> float | None:
    """Seconds ``pid`` has spent runnable but waiting for a CPU (Linux schedstat), or None.
    Tells a worker starved of CPU (runnable, waiting) from one waiting on I/O (sleeping)."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def system_busy(pool: CpuPool | None = None) -> float:
    """CPU seconds spent busy so far (summed over CPUs) where this process competes for them
    (``pool``, default ``cgroups.cpu_pool()`` read once): its cgroup's usage where a CPU quota
    binds it, the CPUs of its cpuset where that holds only some, else the whole machine's. In
    a container of 2 CPUs on a host of 64, the host's other tenants make no busy machine."""
    pool = pool or _pool()
    used = pool.busy_s()
    if used is not None:
        return used
    if pool.cpus:
        times = psutil.cpu_times(percpu=True)
        mine = [times[c] for c in pool.cpus if c < len(times)]
    else:  # the machine's: one line of /proc/stat, not one per CPU
        mine = [psutil.cpu_times()]
    return float(sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in mine))


@functools.cache
def _pool() -> CpuPool:
    return cgroups.cpu_pool()


def _add(fig: ProcessFigures, cpu_s: float, wall_s: float) -> None:
    fig.cpu_s += cpu_s
    fig.measured_s += wall_s


def _memory(proc: psutil.Process, fig: ProcessFigures) -> None:
    try:
        info = proc.memory_full_info()
    except psutil.Error:
        return
    uss = getattr(info, "uss", None)
    pss = getattr(info, "pss", None)
    fig.uss_bytes = max(fig.uss_bytes or 0, int(uss)) if uss is not None else fig.uss_bytes
    fig.pss_bytes = max(fig.pss_bytes or 0, int(pss)) if pss is not None else fig.pss_bytes
    fig.rss_bytes = max(fig.rss_bytes or 0, int(info.rss))


#: The memory poller waits this many times as long as its last pass took before the next one.
MEMORY_DUTY = 200


class ProcessProbe:
    """Attach to a DataLoader iterator, then call ``window_open``/``window_close`` around each
    measured window; ``report()`` gives the figures. Use as a context manager."""

    def __init__(
        self,
        *,
        shm_path: str = "/dev/shm",
        shm_interval_s: float = 0.05,
        memory_interval_s: float = 0.25,
    ) -> None:
        self._me = psutil.Process()
        self._shm_path, self._shm_interval = shm_path, shm_interval_s
        self._memory_interval = memory_interval_s
        self._in_window = False
        self._memory_due = 0.0
        self._lock = threading.RLock()
        self._shm_base = shm_used_bytes(shm_path)
        self._shm_peak = self._shm_base
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe_tid: int | None = None
        self._pin_tid: int | None = None
        self._workers: dict[int, tuple[psutil.Process, ProcessFigures]] = {}
        self._attached: object = None  # the iterator last attached (looked into again later)
        self._children_before: set[int] | None = None
        self._start: dict[str, float] = {}
        self._report = ProbeReport()
        self._system_busy_s = 0.0

    def __enter__(self) -> ProcessProbe:
        self._thread = threading.Thread(target=self._poll, name="feedrate-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _poll(self) -> None:
        self._probe_tid = threading.get_native_id()
        while not self._stop.wait(self._shm_interval):
            # Without workers nothing goes through /dev/shm: skip the system call.
            used = shm_used_bytes(self._shm_path) if self._workers else None
            if used is not None and (self._shm_peak is None or used > self._shm_peak):
                self._shm_peak = used
            if self._in_window and self._attached is not None:
                # Workers a generator __iter__ starts at its first next() (and, epoch by
                # epoch, anew) are seen while they run, not only at window boundaries.
                self._learn(self._attached)
            now = time.monotonic()
            if self._in_window and now >= self._memory_due:
                self._read_memory(stoppable=True)
                took = time.monotonic() - now
                # Reading smaps costs real CPU (kernel time, per process): keep it to ~0.5% duty.
                self._memory_due = now + max(self._memory_interval, MEMORY_DUTY * took)

    def _read_memory(self, *, stoppable: bool = False) -> None:
        """Read every process's memory (smaps: milliseconds each). ``stoppable``: the poller
        gives up at a stop, which would otherwise wait for a pass over a hundred workers."""
        with self._lock:
            workers = list(self._workers.values())
        for proc, fig in workers:
            if stoppable and self._stop.is_set():
                return
            _memory(proc, fig)
        _memory(self._me, self._report.main)

    def attach(self, iterator: object) -> None:
        """Learn the worker processes and the pin-memory thread of a DataLoader iterator (called
        again for every epoch: non-persistent workers are new processes each time). What
        ``iter()`` returned may hide them (a generator ``__iter__``, whose workers start at its
        first ``next()``): they are looked for again when a window opens, in the iterator it
        holds, else among the child processes started since the first ``attach``."""
        if self._children_before is None:
            self._children_before = inner.children()
        self._attached = iterator
        self._learn(iterator)

    def _learn(self, iterator: object) -> None:
        with self._lock:  # the poller learns too
            self._learn_locked(iterator)

    def _learn_locked(self, iterator: object) -> None:
        real = inner.real_iterator(iterator)
        workers: list[Any] = list(getattr(real, "_workers", None) or [])
        opaque = real is iterator and not inner.is_generator(iterator)
        if (
            not workers
            and iterator is not None
            and opaque
            and not hasattr(real, "_dataset_fetcher")
        ):
            # An iterator of another kind that holds its workers where feedrate cannot see:
            # the processes this one started since the first attach (a generator's are
            # found inside it, from its first next() on).
            workers = inner.new_children(self._children_before or ())
        for worker_id, proc in enumerate(workers):
            pid = getattr(proc, "pid", None)
            known = self._workers.get(worker_id)
            if pid is None or (known is not None and known[0].pid == pid):
                continue
            try:
                handle = psutil.Process(pid)
            except psutil.Error:
                continue
            fig = known[1] if known else ProcessFigures("worker", worker_id=worker_id)
            fig.pid = pid
            with self._lock:
                self._workers[worker_id] = (handle, fig)
            if self._in_window:  # started since the window opened: all its CPU time is in it
                self._start.setdefault(f"w{worker_id}:{pid}", 0.0)
                self._start.setdefault(f"q{worker_id}:{pid}", 0.0)
        if any(fig.uss_bytes is None for _, fig in self._workers.values()):
            self._memory_due = 0.0  # a worker never read yet: read at the next poll
        pin = getattr(real, "_pin_memory_thread", None)
        if pin is not None:
            self._pin_tid = getattr(pin, "native_id", None)
            if self._report.pin_memory_thread is None:
                self._report.pin_memory_thread = ProcessFigures("pin_memory_thread")

    def _counters(self, wall: float) -> dict[str, float]:
        out = {"wall": wall, "main": _cpu(self._me) or 0.0, "system": system_busy()}
        queued = runq_wait(self._me.pid)  # its main thread's: the loop's, making w=0 batches
        if queued is not None:
            out["mainq"] = queued
        out["probe"] = _thread_cpu(self._me, self._probe_tid)
        out["pin"] = _thread_cpu(self._me, self._pin_tid)
        for worker_id, (proc, _fig) in self._workers.items():
            cpu = _cpu(proc)
            if cpu is not None:
                out[f"w{worker_id}:{proc.pid}"] = cpu
            wait = runq_wait(proc.pid)
            if wait is not None:
                out[f"q{worker_id}:{proc.pid}"] = wait
        return out

    def window_open(self, wall: float) -> None:
        if self._attached is not None:
            self._learn(self._attached)
        with self._lock:
            self._start = self._counters(wall)
            self._in_window = True

    def window_close(self, wall: float) -> None:
        if self._attached is not None:
            self._learn(self._attached)  # workers a generator started during the window
        with self._lock:
            self._in_window = False
            end = self._counters(wall)
        start, rep = self._start, self._report
        span = max(0.0, wall - start.get("wall", wall))

        def delta(key: str) -> float:
            return max(0.0, end.get(key, 0.0) - start.get(key, 0.0))

        rep.wall_s += span
        self._system_busy_s += delta("system")
        rep.probe_cpu_s += delta("probe")
        pin_s = delta("pin")
        _add(rep.main, max(0.0, delta("main") - pin_s - delta("probe")), span)
        if "mainq" in start and "mainq" in end:
            rep.main.runq_s = (rep.main.runq_s or 0.0) + delta("mainq")
        if rep.pin_memory_thread is not None:
            _add(rep.pin_memory_thread, pin_s, span)
        for worker_id, (proc, fig) in self._workers.items():
            key = f"w{worker_id}:{proc.pid}"
            if key in start and key in end:
                _add(fig, delta(key), span)
                runq = f"q{worker_id}:{proc.pid}"
                if runq in start and runq in end:
                    fig.runq_s = (fig.runq_s or 0.0) + delta(runq)

    def report(self) -> ProbeReport:
        """The figures. Memory read by the poller; where a run was too short for it to read
        any, read once now (the processes still running can be read)."""
        rep = self._report
        if rep.main.uss_bytes is None:
            self._read_memory()
        rep.main.pid = self._me.pid
        rep.workers = [fig for _, (_, fig) in sorted(self._workers.items())]
        for fig in [rep.main, rep.pin_memory_thread, *rep.workers]:
            if fig is not None and fig.measured_s > 0:
                fig.cpu_util = fig.cpu_s / fig.measured_s
                if fig.runq_s is not None:
                    fig.runq_util = fig.runq_s / fig.measured_s
        if rep.wall_s > 0:
            rep.system_busy_cpus = self._system_busy_s / rep.wall_s
        if self._shm_peak is not None and self._shm_base is not None:
            rep.shm_peak_bytes = max(0, self._shm_peak - self._shm_base)
        return rep
