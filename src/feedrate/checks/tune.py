"""The findings of a finished search (``tune_findings``), and the ones about the run itself: budgets
that kept configurations out, a check that failed.
"""

from __future__ import annotations

from typing import Any

from feedrate.checks.bottleneck import bottleneck_finding
from feedrate.checks.machine import cpu_quota_finding, pin_memory_finding, task_limit_finding
from feedrate.checks.workers import startup_finding, worker_count_finding, workers_past_cpus_finding
from feedrate.results.findings import Finding, FindingDoc, by_severity
from feedrate.results.trial import Trial
from feedrate.search.space import Space

#: The fix for each budget a skipped configuration was predicted to exceed (by the words of
#: ``search.space.predict_over_budget``'s reasons).
_RAISE = {
    "memory": "raise --memory-limit (tune(memory_limit=...)) or the container's memory",
    "/dev/shm": "give /dev/shm more room (docker run --shm-size=..., or --ipc=host)",
    "open files": "raise the open-file limit (ulimit -n 65536), or share tensors through "
    "files: torch.multiprocessing.set_sharing_strategy('file_system')",
}


def skipped_finding(trials: list[Trial]) -> Finding | None:
    """Configurations not tried because they were predicted to exceed a budget; the fix names
    the budgets that kept them out, and only those."""
    skipped = [t for t in trials if t.skipped]
    if not skipped:
        return None
    first = skipped[0]
    fixes = [fix for word, fix in _RAISE.items() if any(word in (t.skipped or "") for t in skipped)]
    return Finding(
        "budget-limited",
        "info",
        f"{len(skipped)} configuration(s) not tried: {first.config.label()}: {first.skipped}",
        "; ".join(fixes or ["raise the budget they exceeded"]) + ", if you want them tried",
    )


def failed_trials_finding(trials: list[Trial]) -> Finding | None:
    """Configurations whose measurement failed (a worker killed, a hang, an error only with
    workers): the answer was chosen among the others, and this says so."""
    failed = [t for t in trials if t.error and not t.skipped]
    if not failed:
        return None
    first = failed[0]
    ran = [t for t in trials if t.measured]
    workers_ran = any(t.config.num_workers > 0 for t in ran)
    scope = "" if workers_ran else "; no configuration with workers ran, so the answer is w=0"
    return Finding(
        "trials-failed",
        "warning",
        f"{len(failed)} of {len(failed) + len(ran)} configurations failed, e.g. "
        f"{first.config.label()}: {first.error}{scope}",
        f"feedrate measure TARGET -w {first.config.num_workers} shows the failure in full; "
        "feedrate doctor TARGET looks for its cause",
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
        bottleneck_finding(
            best,
            space.cpus,
            space.consumer,
            batch_size=batch_size,
            workers_tried=any(t.measured and t.config.num_workers for t in trials),
        ),
        pin_memory_finding(baseline, machine),
        worker_count_finding(baseline, best),
        workers_past_cpus_finding(baseline, best, space.cpus),
        startup_finding(baseline, epoch_samples),
        cpu_quota_finding(machine),
        task_limit_finding(best.config, machine) or task_limit_finding(baseline.config, machine),
        skipped_finding(trials),
        failed_trials_finding(trials),
    ]
    return by_severity([f for f in found if f is not None])


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
    FindingDoc(
        id="trials-failed",
        title="Configurations whose measurement failed",
        means=(
            "Some configurations `tune` tried could not be measured: a worker was killed (a "
            "segmentation fault, the out-of-memory killer), the pipeline hung, or it raised only "
            "with workers. The answer was chosen among the configurations that ran; when none "
            "with workers ran, `num_workers=0` is the answer only because nothing else worked."
        ),
        evidence=(
            "From `tune`: each failed trial's error, as its measurement reported it (the "
            "signal that killed a worker, the time without a batch, the exception)."
        ),
        fix=(
            "`feedrate measure TARGET -w N` with the failed worker count shows the failure in "
            "full; `feedrate doctor TARGET` looks for its cause (a small `/dev/shm`, an open-file "
            "limit, a dataset that cannot be used from forked workers)."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="budget-limited",
        title="Configurations skipped as over a budget",
        means=(
            "The search did not start some configurations because it predicted they would exceed a "
            "budget: the memory the workers may use, the `/dev/shm` the batches in flight need, "
            "the open files, or (with an accelerator) the pinned memory. The answer is the best of "
            "those that fit."
        ),
        evidence=(
            "From `tune`: how many configurations were skipped, and the first with its prediction, "
            "made from what the trials so far measured: the largest worker's memory (USS) times "
            "the workers, against half the available memory (or `--memory-limit`; the main "
            "process, there with any setting, is counted only against a container's whole "
            "limit, which it lies within); the batch's bytes × "
            "`num_workers` × `prefetch_factor` × 1.5, against half the free `/dev/shm`; the open "
            "files the `file_descriptor` sharing strategy would hold, against 80% of the soft "
            "limit; the pinned memory in flight, against 10% of the machine's memory."
        ),
        fix=(
            "Raise the budget if you want them tried: `--memory-limit` (`tune(memory_limit=...)`), "
            "more memory or a larger `/dev/shm` for the container (`docker run --shm-size=...`), "
            "or `ulimit -n`."
        ),
        severity="info",
    ),
    FindingDoc(
        id="check-failed",
        title="A check could not finish",
        means=(
            "One of the doctor's steps (the look inside 2 workers, the `IterableDataset` duplicate "
            "run, the memory run, the throughput measurement) could not finish, so the findings it "
            "would have given are missing. The other findings stand."
        ),
        evidence=(
            "From `doctor`: the step's own error (the pipeline's exception with its sample index, "
            "a worker killed by a signal, no batch within `--timeout`) and the later steps not run "
            "because of it: once the pipeline itself has failed, the steps that would run it again "
            "are skipped."
        ),
        fix="Fix the cause the message names and run `feedrate doctor` again.",
        severity="warning",
    ),
)
