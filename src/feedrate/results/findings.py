"""Findings: what is wrong or risky in a pipeline, with the evidence and the fix.

Each rule is a small pure function over measured data that returns a ``Finding`` or None, so it
is tested on its own with synthetic figures. A finding has a stable ``id`` (for scripts and
suppression), a ``severity``, a ``message`` citing the evidence, and a ``fix`` written as code or
a command.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from feedrate.loader.words import in_words_of

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    message: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(data["id"], data["severity"], data["message"], data["fix"])


def for_loader(findings: list[Finding], loader_class: str) -> list[Finding]:
    """``findings`` with their ``DataLoader(..., ...)`` advice said for a loader of
    ``loader_class`` (``StreamingDataLoader(...)``, ``TrainingArguments(...)``)."""
    return [
        replace(
            f, message=in_words_of(loader_class, f.message), fix=in_words_of(loader_class, f.fix)
        )
        for f in findings
    ]


def by_severity(findings: list[Finding]) -> list[Finding]:
    """Most important first; the order within a severity is kept."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))


@dataclass(frozen=True)
class FindingDoc:
    """One finding id, documented: a short ``title``; what it ``means``; the ``evidence`` it
    rests on (which command reports it and from what measurement or fact); the ``fix``; and the
    ``severity`` it is reported with (``error``, ``warning`` or ``info``, with the condition
    where it depends on one)."""

    id: str
    title: str
    means: str
    evidence: str
    fix: str
    severity: str


def over_ranks(per_rank: list[list[Finding]]) -> list[Finding]:
    """The findings of a job's ranks (``per_rank[r]``: rank r's), each id once: the most severe
    of its versions (the lowest rank's among equals), its message saying which ranks found it
    when not all of them did (each rank checks its own shard: a trap can be on some only)."""
    found: dict[str, tuple[Finding, list[int]]] = {}
    for rank, findings in enumerate(per_rank):
        for f in findings:
            kept, ranks = found.setdefault(f.id, (f, []))
            ranks.append(rank)
            if SEVERITY_ORDER.get(f.severity, 9) < SEVERITY_ORDER.get(kept.severity, 9):
                found[f.id] = (f, ranks)
    merged = []
    for finding, ranks in found.values():
        if len(ranks) < len(per_rank):
            where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_listed(ranks)}"
            finding = Finding(
                finding.id,
                finding.severity,
                f"on {where} of {len(per_rank)} (each rank checked its own loader): "
                f"{finding.message}",
                finding.fix,
            )
        merged.append(finding)
    return by_severity(merged)


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
