"""Result objects: plain, typed data that serializes to JSON and back, so a saved run can be
rendered again without measuring again.

Schema ``feedrate.measure/1`` (documented in docs/json-schema.md): ``schema``, ``feedrate_version``,
``machine``, ``target``, ``config``, ``batch_size``, ``samples_per_s``, ``batches_per_s``,
``spread``, ``startup_s``, ``epoch_restart_s``, ``warmup``, ``window``, ``processes``,
``batch_bytes``, ``consumer``, ``stall_fraction``, ``notes``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedrate.config import LoaderConfig
from feedrate.findings import Finding
from feedrate.probe import ProbeReport
from feedrate.windows import Rate

MEASURE_SCHEMA = "feedrate.measure/1"


@dataclass(frozen=True)
class Spread:
    """Steady-state samples/s of each window and their summary."""

    windows: list[float]
    median: float
    min: float
    max: float
    stdev: float

    @property
    def rel(self) -> float:
        """(max - min) / median, the relative width of the spread."""
        return (self.max - self.min) / self.median if self.median > 0 else 0.0

    def merged(self, other: Spread) -> Spread:
        """The spread of both measurements' windows together."""
        rates = [*self.windows, *other.windows]
        if not rates:
            return self
        return Spread(
            rates,
            statistics.median(rates),
            min(rates),
            max(rates),
            statistics.stdev(rates) if len(rates) > 1 else 0.0,
        )

    @classmethod
    def of(cls, rate: Rate) -> Spread:
        return cls(list(rate.windows), rate.median, rate.min, rate.max, rate.stdev)

    def to_dict(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "stdev": self.stdev,
            "rel": self.rel,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Spread:
        return cls(list(d["windows"]), d["median"], d["min"], d["max"], d["stdev"])


@dataclass(frozen=True)
class WindowSummary:
    """The steady state measured: totals over all windows, and how they were taken."""

    batches: int
    samples: int
    seconds: float
    epochs: int
    method: str
    warmup_batches: int
    warmup_s: float


@dataclass
class Measurement:
    """One DataLoader configuration, measured. Rates in samples/s and batches/s, times in s."""

    config: LoaderConfig
    samples_per_s: float
    batches_per_s: float
    spread: Spread
    startup_s: float
    epoch_restart_s: list[float]
    window: WindowSummary
    processes: ProbeReport
    machine: dict[str, Any]
    batch_size: int | None = None
    target: str | None = None
    notes: list[str] = field(default_factory=list)
    feedrate_version: str = ""
    batch_bytes: int | None = None
    stall_fraction: float | None = None
    consumer: dict[str, Any] | None = None
    #: With an accelerator: each batch copied to it in the loop (``device``, ``non_blocking``,
    #: ``copy_s_per_batch`` and ``step_s_per_batch`` of device time, from CUDA events).
    transfer: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        w = self.window
        return {
            "schema": MEASURE_SCHEMA,
            "feedrate_version": self.feedrate_version,
            "machine": self.machine,
            "target": self.target,
            "config": self.config.to_dict(),
            "batch_size": self.batch_size,
            "samples_per_s": self.samples_per_s,
            "batches_per_s": self.batches_per_s,
            "spread": self.spread.to_dict(),
            "startup_s": self.startup_s,
            "epoch_restart_s": self.epoch_restart_s,
            "warmup": {"batches": w.warmup_batches, "seconds": w.warmup_s},
            "window": {
                "batches": w.batches,
                "samples": w.samples,
                "seconds": w.seconds,
                "epochs": w.epochs,
                "method": w.method,
            },
            "processes": self.processes.to_dict(),
            "batch_bytes": self.batch_bytes,
            "consumer": self.consumer,
            "stall_fraction": self.stall_fraction,
            "transfer": self.transfer,
            "notes": self.notes,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        if d.get("schema") != MEASURE_SCHEMA:
            raise ValueError(f"not a {MEASURE_SCHEMA} document (schema: {d.get('schema')!r})")
        win, warm = d["window"], d["warmup"]
        return cls(
            config=LoaderConfig.from_dict(d["config"]),
            samples_per_s=d["samples_per_s"],
            batches_per_s=d["batches_per_s"],
            spread=Spread.from_dict(d["spread"]),
            startup_s=d["startup_s"],
            epoch_restart_s=list(d.get("epoch_restart_s", [])),
            window=WindowSummary(
                batches=win["batches"],
                samples=win["samples"],
                seconds=win["seconds"],
                epochs=win["epochs"],
                method=win["method"],
                warmup_batches=warm["batches"],
                warmup_s=warm["seconds"],
            ),
            processes=ProbeReport.from_dict(d["processes"]),
            machine=d.get("machine", {}),
            batch_size=d.get("batch_size"),
            target=d.get("target"),
            notes=list(d.get("notes", [])),
            feedrate_version=d.get("feedrate_version", ""),
            batch_bytes=d.get("batch_bytes"),
            stall_fraction=d.get("stall_fraction"),
            consumer=d.get("consumer"),
            transfer=d.get("transfer"),
        )

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        return cls.from_dict(json.loads(text))


TUNE_SCHEMA = "feedrate.tune/1"


def _sum_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


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
    main_cpu: float = 0.0
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
    system_busy_cpus: float | None = None
    #: Device seconds per batch of the copy to the accelerator, where there is one.
    copy_s_per_batch: float | None = None
    verdict: str = ""
    skipped: str | None = None
    error: str | None = None
    repeats: int = 1

    def pool(self, again: Trial) -> None:
        """Fold a repeat measurement of the same config into this trial (windows pooled)."""
        if self.spread is None or again.spread is None:
            return
        self.spread = self.spread.merged(again.spread)
        self.samples_per_s = (self.samples_per_s + again.samples_per_s) / 2
        self.repeats += 1

    @property
    def measured(self) -> bool:
        return self.skipped is None and self.error is None and self.spread is not None

    @property
    def median(self) -> float:
        """The rate compared across trials: the median window, robust to one noisy window."""
        return self.spread.median if self.spread is not None else 0.0

    @property
    def noise(self) -> float:
        """Relative standard error of the rate: the windows' standard deviation over the median
        and the square root of their number (half the relative range with one window)."""
        s = self.spread
        if s is None or s.median <= 0:
            return 0.0
        n = len(s.windows)
        return s.stdev / s.median / math.sqrt(n) if n > 1 else s.rel / 2

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
        workers = m.processes.workers
        uss = [w.uss_bytes for w in workers if w.uss_bytes is not None]
        pss = [w.pss_bytes for w in workers if w.pss_bytes is not None]
        return cls(
            config=m.config,
            reason=reason,
            samples_per_s=m.samples_per_s,
            spread=m.spread,
            startup_s=m.startup_s,
            epoch_restart_s=list(m.epoch_restart_s),
            main_cpu=m.processes.main.cpu_util,
            workers_cpu=sum(w.cpu_util for w in workers),
            workers_runq=_sum_known([w.runq_util for w in workers]),
            main_uss_bytes=m.processes.main.uss_bytes,
            workers_uss_bytes=sum(uss) if uss else None,
            worker_uss_max_bytes=max(uss) if uss else None,
            main_pss_bytes=m.processes.main.pss_bytes,
            workers_pss_bytes=sum(pss) if pss else None,
            shm_peak_bytes=m.processes.shm_peak_bytes,
            batch_bytes=m.batch_bytes,
            stall_fraction=m.stall_fraction,
            system_busy_cpus=m.processes.system_busy_cpus,
            copy_s_per_batch=(m.transfer or {}).get("copy_s_per_batch"),
        )

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["config"] = self.config.to_dict()
        out["spread"] = None if self.spread is None else self.spread.to_dict()
        out["epoch_restart_s"] = list(self.epoch_restart_s)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known["config"] = LoaderConfig.from_dict(d["config"])
        known["spread"] = None if d.get("spread") is None else Spread.from_dict(d["spread"])
        return cls(**known)


@dataclass
class TuneResult:
    """What ``tune`` found. Plain data: ``to_json``/``from_json`` round-trip it, and a saved
    result renders again without measuring (``feedrate report``)."""

    machine: dict[str, Any]
    baseline: Trial
    best: Trial
    trials: list[Trial]
    findings: list[Finding]
    search_seconds: float
    reason: str
    code: str
    target: str | None = None
    batch_size: int | None = None
    consumer: dict[str, Any] | None = None
    bottleneck: str = ""
    persistent: dict[str, Any] = field(default_factory=dict)
    partial: bool = False
    partial_reason: str | None = None
    from_cache: bool = False
    feedrate_version: str = ""
    _source: Any = field(default=None, repr=False, compare=False)

    @property
    def speedup(self) -> float:
        """Best rate over the user's own (medians)."""
        return self.best.median / self.baseline.median if self.baseline.median > 0 else 0.0

    def loader(self, source: Any = None) -> Any:
        """The user's loader rebuilt with the best settings. A result loaded from JSON needs the
        original loader (or factory) passed in."""
        from torch.utils.data import DataLoader

        from feedrate.config import allow_many_workers, rebuild

        src = source if source is not None else self._source
        if src is None:
            raise ValueError("this result has no loader attached: pass the original loader")
        loader = src() if callable(src) and not isinstance(src, DataLoader) else src
        tuned = rebuild(loader, self.best.config)
        cpus = self.machine.get("cpus_usable")
        if cpus and self.best.config.num_workers > cpus:
            allow_many_workers(tuned)  # measured to pay here: DataLoader's warning would alarm
        return tuned

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TUNE_SCHEMA,
            "feedrate_version": self.feedrate_version,
            "machine": self.machine,
            "target": self.target,
            "batch_size": self.batch_size,
            "consumer": self.consumer,
            "baseline": self.baseline.to_dict(),
            "best": self.best.to_dict(),
            "speedup": self.speedup,
            "reason": self.reason,
            "bottleneck": self.bottleneck,
            "code": self.code,
            "persistent": self.persistent,
            "trials": [t.to_dict() for t in self.trials],
            "findings": [f.to_dict() for f in self.findings],
            "search_seconds": self.search_seconds,
            "partial": self.partial,
            "partial_reason": self.partial_reason,
            "from_cache": self.from_cache,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TuneResult:
        if d.get("schema") != TUNE_SCHEMA:
            raise ValueError(f"not a {TUNE_SCHEMA} document (schema: {d.get('schema')!r})")
        return cls(
            machine=d.get("machine", {}),
            baseline=Trial.from_dict(d["baseline"]),
            best=Trial.from_dict(d["best"]),
            trials=[Trial.from_dict(t) for t in d.get("trials", [])],
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            search_seconds=d.get("search_seconds", 0.0),
            reason=d.get("reason", ""),
            code=d.get("code", ""),
            target=d.get("target"),
            batch_size=d.get("batch_size"),
            consumer=d.get("consumer"),
            bottleneck=d.get("bottleneck", ""),
            persistent=d.get("persistent", {}),
            partial=bool(d.get("partial", False)),
            partial_reason=d.get("partial_reason"),
            from_cache=bool(d.get("from_cache", False)),
            feedrate_version=d.get("feedrate_version", ""),
        )

    @classmethod
    def from_json(cls, text: str) -> TuneResult:
        return cls.from_dict(json.loads(text))
