"""The findings of a finished search (``tune_findings``), and the ones about the run itself: budgets
that kept configurations out, a check that failed.
"""

from __future__ import annotations

from typing import Any

from feedrate.checks.bottleneck import bottleneck_finding
from feedrate.checks.machine import cpu_quota_finding, pin_memory_finding
from feedrate.checks.workers import startup_finding, worker_count_finding, workers_past_cpus_finding
from feedrate.results.findings import Finding, by_severity
from feedrate.results.trial import Trial
from feedrate.search.space import Space


def skipped_finding(trials: list[Trial]) -> Finding | None:
    skipped = [t for t in trials if t.skipped]
    if not skipped:
        return None
    first = skipped[0]
    return Finding(
        "budget-limited",
        "info",
        f"{len(skipped)} configuration(s) not tried: {first.config.label()}: {first.skipped}",
        "raise --memory-limit or the container's memory / --shm-size if you want them tried",
    )


def check_failed_finding(check: str, error: str, skipped: list[str] | None = None) -> Finding:
    """A check (``check`` says what it does) that could not finish: why, and which later checks
    it took down with it. Its other findings stand."""
    rest = f"; not run because of it: {', '.join(skipped)}" if skipped else ""
    return Finding(
        "check-failed",
        "warning",
        f"the {check} failed: {error}{rest}",
        "fix that and run feedrate doctor again; the other findings stand",
    )


def tune_findings(
    space: Space,
    machine: dict[str, Any],
    baseline: Trial,
    best: Trial,
    trials: list[Trial],
    epoch_samples: int | None,
    batch_size: int | None = None,
) -> list[Finding]:
    found = [
        bottleneck_finding(best, space.cpus, space.consumer, batch_size=batch_size),
        pin_memory_finding(baseline, machine),
        worker_count_finding(baseline, best),
        workers_past_cpus_finding(baseline, best, space.cpus),
        startup_finding(baseline, epoch_samples),
        cpu_quota_finding(machine),
        skipped_finding(trials),
    ]
    return by_severity([f for f in found if f is not None])
