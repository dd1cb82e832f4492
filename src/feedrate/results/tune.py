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
        from feedrate.loader.rebuild import allow_many_workers, loader_of, rebuild

        src = source if source is not None else self._source
        if src is None:
            raise ValueError("this result has no loader attached: pass the original loader")
        loader = loader_of(src)
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
