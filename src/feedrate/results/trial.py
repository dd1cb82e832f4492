"""``Trial``: one configuration tried while tuning, with its figures and verdict."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.measurement import Measurement
from feedrate.results.processes import ProbeReport
from feedrate.results.spread import Spread


def _sum_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def probe_fields(processes: ProbeReport) -> dict[str, Any]:
    """The probe's figures as ``Trial`` fields, the one mapping tune's and autotune's trials
    share: CPU per second of wall time (1.0 = one core) of the main process and of the workers
    together, their run-queue wait, memory in bytes (the workers' USS and PSS summed, the
    largest worker's USS), the /dev/shm peak, the CPUs the whole machine kept busy, and the
    pin-memory thread's CPU (with workers and pin_memory)."""
    workers, pin = processes.workers, processes.pin_memory_thread
    uss = [w.uss_bytes for w in workers if w.uss_bytes is not None]
    pss = [w.pss_bytes for w in workers if w.pss_bytes is not None]
    return {
        "main_cpu": processes.main.cpu_util,
        "main_runq": processes.main.runq_util,
        "workers_cpu": sum(w.cpu_util for w in workers),
        "workers_runq": _sum_known([w.runq_util for w in workers]),
        "main_uss_bytes": processes.main.uss_bytes,
        "workers_uss_bytes": sum(uss) if uss else None,
        "worker_uss_max_bytes": max(uss) if uss else None,
        "main_pss_bytes": processes.main.pss_bytes,
        "workers_pss_bytes": sum(pss) if pss else None,
        "shm_peak_bytes": processes.shm_peak_bytes,
        "system_busy_cpus": processes.system_busy_cpus,
        "pin_thread_cpu": None if pin is None else pin.cpu_util,
    }


@dataclass
class Trial:
    """One configuration tried while tuning: why, what it measured, and the verdict.

    A trial the search predicted to exceed a budget is recorded with ``skipped`` set and no
    figures; one whose measurement failed has ``error`` set."""

    config: LoaderConfig
    reason: str
    samples_per_s: float = 0.0
    spread: Spread | None = None
    startup_s: float = 0.0
    epoch_restart_s: list[float] = field(default_factory=list)
    #: Samples in an epoch, where the trial saw one end (``Measurement.epoch_samples``).
    epoch_samples: int | None = None
    main_cpu: float = 0.0
    #: The main thread's seconds per second queued for a CPU (Linux schedstat; None elsewhere):
    #: without workers it makes the batches, and on a busy machine this is its work held up.
    main_runq: float | None = None
    workers_cpu: float = 0.0
    workers_runq: float | None = None
    main_uss_bytes: int | None = None
    workers_uss_bytes: int | None = None
    worker_uss_max_bytes: int | None = None
    main_pss_bytes: int | None = None
    workers_pss_bytes: int | None = None
    shm_peak_bytes: int | None = None
    batch_bytes: int | None = None
    stall_fraction: float | None = None
    #: Online: the share of the loop's wait in ``next()`` its thread spent on a CPU, receiving
    #: batches (the hand-off from the workers); the rest it waited for them. None offline.
    wait_cpu: float | None = None
    #: Online: those seconds on a CPU per second of the trial (share of a core), the hand-off's
    #: cost in the loop's thread, against ``workers_cpu``. None offline.
    receive_cpu: float | None = None
    system_busy_cpus: float | None = None
    #: Device seconds per batch of the copy to the accelerator, where there is one.
    copy_s_per_batch: float | None = None
    #: With workers and pin_memory: DataLoader's pin-memory thread's CPU (share of a core). It
    #: copies every batch into pinned memory on one torch thread. None without that thread.
    pin_thread_cpu: float | None = None
    verdict: str = ""
    skipped: str | None = None
    error: str | None = None
    repeats: int = 1
    #: With several ranks loading at once: each rank's rate (samples/s), in rank order; the
    #: figures above are the slowest rank's (training steps in lockstep).
    rank_rates: list[float] | None = None

    def pool(self, again: Trial) -> None:
        """Fold a repeat measurement of the same config into this trial (windows pooled)."""
        if self.spread is None or again.spread is None:
            return
        self.spread = self.spread.merged(again.spread)
        self.samples_per_s = (self.samples_per_s + again.samples_per_s) / 2
        self.startup_s = max(self.startup_s, again.startup_s)  # what a start may cost
        self.epoch_samples = self.epoch_samples or again.epoch_samples
        if self.rank_rates is not None and again.rank_rates is not None:
            self.rank_rates = [
                (a + b) / 2 for a, b in zip(self.rank_rates, again.rank_rates, strict=False)
            ]
        self.repeats += 1

    def take(self, again: Trial) -> None:
        """Replace this trial's figures with a repeat's (the first measurement is not worth
        pooling: other processes took the CPUs), keeping its reason and counting the repeat."""
        repeats, reason = self.repeats, self.reason
        for f in fields(self):
            setattr(self, f.name, getattr(again, f.name))
        self.repeats, self.reason = repeats + 1, reason

    @property
    def measured(self) -> bool:
        return self.skipped is None and self.error is None and self.spread is not None

    @property
    def median(self) -> float:
        """The rate compared across trials: the median window, robust to one noisy window, or
        for a trial judged on its span (``Spread.span``), the samples/s it delivered over it."""
        if self.spread is None:
            return 0.0
        return self.samples_per_s if self.spread.span else self.spread.median

    @property
    def noise(self) -> float:
        """The ± of the rate: ``Spread.rel_se``, its relative standard error over the windows."""
        return 0.0 if self.spread is None else self.spread.rel_se

    @property
    def own_cpu(self) -> float:
        """The CPUs the pipeline's own processes used: the main process and its workers (1.0 =
        one core busy)."""
        return self.main_cpu + self.workers_cpu

    @property
    def worker_cpu_mean(self) -> float:
        n = self.config.num_workers
        return self.workers_cpu / n if n else 0.0

    @property
    def worker_demand_mean(self) -> float:
        """CPU each worker used plus time it waited for a CPU: what it would have used on an
        idle machine (1.0 = it always wanted a core)."""
        n = self.config.num_workers
        return (self.workers_cpu + (self.workers_runq or 0.0)) / n if n else 0.0

    @property
    def memory_bytes(self) -> int:
        """Memory of the main process and the workers together: the sum of their PSS (pages
        shared after fork counted once, split between the sharers) where the OS reports it,
        else of their USS. A worker's own USS is what adding one more costs."""
        main = self.main_pss_bytes if self.main_pss_bytes is not None else self.main_uss_bytes
        workers = self.workers_pss_bytes
        if workers is None:
            workers = self.workers_uss_bytes
        return (main or 0) + (workers or 0)

    @classmethod
    def of(cls, m: Measurement, reason: str) -> Trial:
        return cls(
            config=m.config,
            reason=reason,
            samples_per_s=m.samples_per_s,
            spread=m.spread,
            startup_s=m.startup_s,
            epoch_restart_s=list(m.epoch_restart_s),
            epoch_samples=m.epoch_samples,
            batch_bytes=m.batch_bytes,
            stall_fraction=m.stall_fraction,
            copy_s_per_batch=(m.transfer or {}).get("copy_s_per_batch"),
            rank_rates=None if m.rank_rates is None else list(m.rank_rates),
            **probe_fields(m.processes),
        )

    def to_dict(self) -> dict[str, Any]:
        """The trial as JSON: ``samples_per_s`` is the rate shown and compared (``median``), the
        figure of the console's samples/s column; ``aggregate_samples_per_s`` is the field
        ``samples_per_s`` (samples over seconds across the windows)."""
        out = dict(self.__dict__)
        out["samples_per_s"] = self.median if self.spread is not None else self.samples_per_s
        out["aggregate_samples_per_s"] = self.samples_per_s
        out["config"] = self.config.to_dict()
        out["spread"] = None if self.spread is None else self.spread.to_dict()
        out["epoch_restart_s"] = list(self.epoch_restart_s)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if "aggregate_samples_per_s" in d:  # written by to_dict: samples_per_s is the median
            known["samples_per_s"] = d["aggregate_samples_per_s"]
        known["config"] = LoaderConfig.from_dict(d["config"])
        known["spread"] = None if d.get("spread") is None else Spread.from_dict(d["spread"])
        return cls(**known)
