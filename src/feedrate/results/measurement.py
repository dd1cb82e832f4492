"""``Measurement``: one configuration measured, as plain data (schema ``feedrate.measure/1``,
documented in docs/json-schema.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.processes import ProbeReport
from feedrate.results.spread import Spread

MEASURE_SCHEMA = "feedrate.measure/1"


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
    #: Samples in an epoch, where one ran to its end (a stream's length is known no other way).
    epoch_samples: int | None = None
    consumer: dict[str, Any] | None = None
    #: With an accelerator: each batch copied to it in the loop (``device``, ``non_blocking``,
    #: ``copy_s_per_batch`` and ``step_s_per_batch`` of device time, from CUDA events).
    transfer: dict[str, Any] | None = None
    #: Measured with every rank of a job loading at once: each rank's rate (median window,
    #: samples/s), in rank order; the figures above are the slowest rank's.
    rank_rates: list[float] | None = None
    #: Measured over a job's ranks: True where every rank read only its part of the data (a
    #: ``DistributedSampler``, one made with ``shard``, a library that splits by rank), False
    #: where they read every sample (``no-distributed-sampler``), None where not known (an
    #: IterableDataset may split by rank in ``__iter__``) or in one process.
    sharded: bool | None = None

    @property
    def job_rate(self) -> float:
        """samples/s of distinct samples the whole job loads: the slowest rank's rate times the
        ranks (training steps in lockstep), but one rank's where every rank reads every sample
        (the others load the same samples again); this process's rate outside a job."""
        if not self.rank_rates or self.sharded is False:
            return self.samples_per_s
        return self.samples_per_s * len(self.rank_rates)

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
            "epoch_samples": self.epoch_samples,
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
            "rank_rates": self.rank_rates,
            "sharded": self.sharded,
            "job_samples_per_s": self.job_rate,
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
            epoch_samples=d.get("epoch_samples"),
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
            rank_rates=d.get("rank_rates"),
            sharded=d.get("sharded"),
        )

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        return cls.from_dict(json.loads(text))
