"""``Report``: what ``feedrate doctor`` found. Plain data that serializes to JSON and back, so a
saved report renders again without running the pipeline (``feedrate report``).

Schema ``feedrate.doctor/1`` (see ``Report.to_dict``): ``schema``, ``feedrate_version``,
``machine``, ``target``, ``config`` (the settings examined), ``batch_size``, ``consumer``,
``findings`` (each ``id``, ``severity``, ``message``, ``fix``; errors first), ``problems`` (how
many findings are errors or warnings), ``bottleneck`` (the class of your settings),
``alternative_bottleneck`` (the bottleneck finding's, where read at another configuration),
``trials`` (the configurations measured, as in ``feedrate.tune/1``), ``loader_alone`` and
``consumer_alone_samples_per_s`` (with a consumer), ``evidence`` (what the experiments saw),
``checks`` (each check's ``name``, ``status`` ok / failed / skipped, ``seconds``, ``detail``),
``seconds``, ``pipeline_error``; ``ranks`` in every rank of a distributed job (the job's
shape and each rank's facts, ``RankFacts``), null outside one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from feedrate.loader.config import LoaderConfig
from feedrate.results.findings import Finding, by_severity
from feedrate.results.trial import Trial

DOCTOR_SCHEMA = "feedrate.doctor/1"

CheckStatus = Literal["ok", "failed", "skipped"]


@dataclass
class CheckRun:
    """One step of the doctor: a check that ran (``ok``), failed (``detail`` says why) or was
    skipped (``detail`` says why: not asked for, not applicable, or an earlier failure)."""

    name: str
    status: CheckStatus
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckRun:
        return cls(d["name"], d["status"], d.get("seconds", 0.0), d.get("detail", ""))


@dataclass
class Report:
    """What the doctor found in a pipeline: ``findings`` (most important first), with the
    measurements and evidence behind them. ``pipeline_error`` is set when the pipeline itself
    failed (its own exception, a killed worker, a hang); the checks it stopped are in
    ``checks`` and in a ``check-failed`` finding."""

    machine: dict[str, Any]
    config: LoaderConfig
    findings: list[Finding]
    checks: list[CheckRun]
    seconds: float
    #: What limits your settings (the ``search.bottleneck`` vocabulary), for the header.
    bottleneck: str = ""
    #: Where the ``bottleneck`` finding was read at another configuration measured and names a
    #: different kind: ``{"config": ..., "kind": ...}``, shown beside that one; else None.
    alternative_bottleneck: dict[str, Any] | None = None
    trials: list[Trial] = field(default_factory=list)
    loader_alone: Trial | None = None
    consumer_alone_samples_per_s: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    target: str | None = None
    batch_size: int | None = None
    consumer: dict[str, Any] | None = None
    pipeline_error: str | None = None
    feedrate_version: str = ""
    #: In a distributed job: its shape (``Ranks.to_dict()``), ``per_rank``, each rank's
    #: ``RankFacts`` as a dict, from which the node's findings were judged, and
    #: ``cpus_per_rank``, the rank's share of the node's CPUs its worker counts were judged in.
    ranks: dict[str, Any] | None = None

    @property
    def problems(self) -> list[Finding]:
        """The errors and warnings, most important first (info findings are not problems)."""
        return [f for f in by_severity(self.findings) if f.severity != "info"]

    @property
    def healthy(self) -> bool:
        """No problem found: no error or warning (the checks that failed are warnings)."""
        return not self.problems

    def finding(self, finding_id: str) -> Finding | None:
        """The first finding with this id, or None."""
        return next((f for f in self.findings if f.id == finding_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": DOCTOR_SCHEMA,
            "feedrate_version": self.feedrate_version,
            "machine": self.machine,
            "target": self.target,
            "config": self.config.to_dict(),
            "batch_size": self.batch_size,
            "consumer": self.consumer,
            "findings": [f.to_dict() for f in by_severity(self.findings)],
            "problems": len(self.problems),
            "bottleneck": self.bottleneck,
            "alternative_bottleneck": self.alternative_bottleneck,
            "trials": [t.to_dict() for t in self.trials],
            "loader_alone": None if self.loader_alone is None else self.loader_alone.to_dict(),
            "consumer_alone_samples_per_s": self.consumer_alone_samples_per_s,
            "evidence": self.evidence,
            "checks": [c.to_dict() for c in self.checks],
            "seconds": self.seconds,
            "pipeline_error": self.pipeline_error,
            "ranks": self.ranks,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        if d.get("schema") != DOCTOR_SCHEMA:
            raise ValueError(f"not a {DOCTOR_SCHEMA} document (schema: {d.get('schema')!r})")
        alone = d.get("loader_alone")
        return cls(
            machine=d.get("machine", {}),
            config=LoaderConfig.from_dict(d["config"]),
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            checks=[CheckRun.from_dict(c) for c in d.get("checks", [])],
            seconds=d.get("seconds", 0.0),
            bottleneck=d.get("bottleneck", ""),
            alternative_bottleneck=d.get("alternative_bottleneck"),
            trials=[Trial.from_dict(t) for t in d.get("trials", [])],
            loader_alone=None if alone is None else Trial.from_dict(alone),
            consumer_alone_samples_per_s=d.get("consumer_alone_samples_per_s"),
            evidence=d.get("evidence", {}),
            target=d.get("target"),
            batch_size=d.get("batch_size"),
            consumer=d.get("consumer"),
            pipeline_error=d.get("pipeline_error"),
            feedrate_version=d.get("feedrate_version", ""),
            ranks=d.get("ranks"),
        )

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))
