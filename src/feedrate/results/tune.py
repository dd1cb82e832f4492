"""``TuneResult``: what ``tune`` found, as plain data (schema ``feedrate.tune/1``); a saved
result renders again without measuring.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedrate.results.findings import Finding
from feedrate.results.trial import Trial

TUNE_SCHEMA = "feedrate.tune/1"


def epoch_rate(samples_per_s: float, restart_s: float, samples_per_epoch: int | None) -> float:
    """A steady-state rate (samples/s) with ``restart_s`` paid at every epoch's start: samples
    per epoch over the epoch's steady-state time plus its restart. The rate itself where there
    is no restart to count or the epoch's length is unknown."""
    if restart_s <= 0 or not samples_per_epoch or samples_per_s <= 0:
        return samples_per_s
    return samples_per_epoch / (samples_per_epoch / samples_per_s + restart_s)


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
    #: Samples in one epoch (None: unknown, an IterableDataset).
    samples_per_epoch: int | None = None
    #: Seconds each epoch waits for restarted workers, counted on top of the steady-state
    #: median: your settings' and the recommendation's (0: persistent or no workers, or already
    #: in the rate, an epoch timed whole).
    baseline_restart_s: float = 0.0
    best_restart_s: float = 0.0
    #: Tuned over the ranks of a distributed job (every rank loading at once): the job's shape,
    #: ``world_size``, ``local_world_size``, ``nodes``, ``node_of_rank``, ``node_cpus``; None alone.
    #: Rates above are then the slowest rank's, in that rank's share of its node.
    ranks: dict[str, Any] | None = None
    _source: Any = field(default=None, repr=False, compare=False)

    @property
    def baseline_rate(self) -> float:
        """Your settings' rate (samples/s): the median window, with the restart of every epoch
        counted when its workers are not persistent."""
        return epoch_rate(self.baseline.median, self.baseline_restart_s, self.samples_per_epoch)

    @property
    def best_rate(self) -> float:
        """The recommendation's rate (samples/s), counted as ``baseline_rate`` is."""
        return epoch_rate(self.best.median, self.best_restart_s, self.samples_per_epoch)

    @property
    def speedup(self) -> float:
        """Best rate over the user's own, each epoch's restart counted (``best_rate`` over
        ``baseline_rate``)."""
        return self.best_rate / self.baseline_rate if self.baseline_rate > 0 else 0.0

    def __str__(self) -> str:
        """A few lines for ``print(result)`` in a notebook (the dataclass's repr is pages)."""
        partial = f"\npartial      {self.partial_reason}" if self.partial else ""
        return (
            f"recommended  {self.best.config.label()}: {self.best_rate:,.1f} samples/s, "
            f"{self.speedup:.2f}× your {self.baseline.config.label()}\n"
            f"why          {self.reason}\ncode         {self.code}{partial}"
        )

    @property
    def steady_speedup(self) -> float:
        """Best median over the user's own, restarts left out."""
        return self.best.median / self.baseline.median if self.baseline.median > 0 else 0.0

    @property
    def every_rank_reads_all(self) -> bool:
        """The ranks of the job each read every sample (``no-distributed-sampler``): their
        rates added up would count the same samples once per rank."""
        return any(f.id == "no-distributed-sampler" for f in self.findings)

    @property
    def job_rate(self) -> float:
        """samples/s of distinct samples the whole job loads at the recommendation: the
        slowest rank's rate times the ranks (training steps in lockstep), but one rank's where
        every rank reads every sample (as ``Measurement.job_rate``); the one process's rate
        outside a job."""
        ranks = 1 if self.every_rank_reads_all else (self.ranks or {}).get("world_size", 1)
        return self.best_rate * int(ranks)

    def node_rates(self) -> list[float]:
        """Each node's samples/s at the recommendation (its slowest rank times its ranks, or
        its slowest rank's alone where every rank reads every sample), by node number; empty
        outside a job."""
        rates = self.best.rank_rates
        if self.ranks is None or not rates:
            return []
        node_of = list(self.ranks.get("node_of_rank", []))
        scale = self.best_rate / min(rates) if min(rates) > 0 else 1.0  # restarts counted
        out = []
        for n in sorted(set(node_of)):
            mine = [r for r, k in zip(rates, node_of, strict=False) if k == n]
            out.append(min(mine) * scale * (1 if self.every_rank_reads_all else len(mine)))
        return out

    def loader(self, source: Any = None) -> Any:
        """The user's loader rebuilt with the best settings (a ``WebLoader``: a copy, its
        DataLoader rebuilt, the stages after it kept). A result loaded from JSON needs the
        original loader (or factory) passed in. Where the answer turns ``persistent_workers``
        on and the loader shuffles, its order differs from your loader's from the second epoch
        on (PyTorch draws the workers' base seed from the shuffle's generator at every epoch's
        ``iter()`` without persistent workers, at the first only with them); ``autotune``
        keeps your loader's order."""
        from feedrate.loader.rebuild import for_the_user, rebuilt

        src = source if source is not None else self._source
        if src is None:
            raise ValueError("this result has no loader attached: pass the original loader")
        with for_the_user():  # rebuilt: no warning of more workers than CPUs, measured to pay
            return rebuilt(src, self.best.config)

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
            "speedup_steady_state": self.steady_speedup,
            "samples_per_epoch": self.samples_per_epoch,
            "baseline_restart_s": self.baseline_restart_s,
            "best_restart_s": self.best_restart_s,
            "baseline_samples_per_s": self.baseline_rate,
            "best_samples_per_s": self.best_rate,
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
            "ranks": self.ranks,
            "job_samples_per_s": self.job_rate,
            "node_samples_per_s": self.node_rates(),
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
            samples_per_epoch=d.get("samples_per_epoch"),
            baseline_restart_s=d.get("baseline_restart_s", 0.0),
            best_restart_s=d.get("best_restart_s", 0.0),
            ranks=d.get("ranks"),
        )

    @classmethod
    def from_json(cls, text: str) -> TuneResult:
        return cls.from_dict(json.loads(text))
