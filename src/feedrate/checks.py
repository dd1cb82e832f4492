"""Diagnosis rules over measured data, one small pure function per finding id.

Each returns a ``Finding`` (with the evidence in its message and the fix as code or a command)
or None. ``tune_findings`` runs the ones that apply to a finished search.
"""

from __future__ import annotations

from typing import Any

from feedrate.advice import judge_persistent
from feedrate.findings import Finding, by_severity
from feedrate.results import Trial
from feedrate.search import Space, beats, bottleneck

_HELPS = {
    "no-workers": "keep num_workers=0; for more speed, cheaper per-batch work or bigger batches",
    "main-process": "cheapen collation (a collate_fn that builds one tensor), smaller batches "
    "through shared memory, or fewer, larger samples",
    "cpu": "more CPUs, cheaper per-sample work (decode at lower resolution, move augmentation "
    "to the GPU), or fewer threads per worker",
    "latency": "more workers (or threads inside workers), or caching the remote data locally",
    "unknown": "measure with a consumer (--rate, --step-time or --step) to see the data stall",
}


def bottleneck_finding(best: Trial, cpus: int, consumer: bool) -> Finding:
    kind = bottleneck(best, cpus)
    if consumer and best.stall_fraction is not None and best.stall_fraction <= 0.05:
        return Finding(
            "bottleneck",
            "info",
            f"consumer-bound: with {best.config.label()} the consumer waits for data only "
            f"{best.stall_fraction:.0%} of the time; the model, not the loader, sets the pace",
            "speed up the training step; the loader has headroom",
        )
    label = {
        "no-workers": "main-process work only (no workers)",
        "main-process": "main-process-bound (collation, unpickling, pinning)",
        "cpu": "CPU-bound in the workers",
        "latency": "latency-bound (workers mostly waiting)",
        "unknown": "no single bottleneck stood out",
    }[kind]
    queued = best.worker_demand_mean - best.worker_cpu_mean
    evidence = (
        f"main process {best.main_cpu:.0%} of a core, workers {best.workers_cpu:.0%} in total "
        f"({best.worker_cpu_mean:.0%} each, {queued:.0%} more queued for a CPU) at "
        f"{best.config.label()} on {cpus} usable CPUs"
    )
    return Finding("bottleneck", "info", f"{label}: {evidence}", _HELPS[kind])


def pin_memory_finding(baseline: Trial, machine: dict[str, Any]) -> Finding | None:
    if machine.get("accelerator", "none") != "none" or not baseline.config.pin_memory:
        return None
    return Finding(
        "pin-memory-no-accelerator",
        "warning",
        "pin_memory=True but this machine has no accelerator: pinning only speeds copies to a "
        "GPU, here it costs main-process CPU and locked memory for nothing",
        "DataLoader(..., pin_memory=False)",
    )


def worker_count_finding(baseline: Trial, best: Trial) -> Finding | None:
    """The user's num_workers against the measured optimum, with the samples/s lost."""
    if not baseline.measured or not best.measured or not beats(best, baseline):
        return None
    mine, good = baseline.config.num_workers, best.config.num_workers
    if mine == good:
        return None
    lost = best.median - baseline.median
    fid = "too-few-workers" if mine < good else "too-many-workers"
    return Finding(
        fid,
        "warning",
        f"num_workers={mine} gives {baseline.median:,.0f} samples/s; {good} measured "
        f"{best.median:,.0f} ({lost:,.0f} samples/s lost, {best.median / baseline.median:.2f}×)",
        f"DataLoader(..., num_workers={good})",
    )


def startup_finding(baseline: Trial, epoch_samples: int | None) -> Finding | None:
    """The user's workers restart every epoch (persistent_workers off) at a measured cost."""
    if baseline.config.num_workers == 0 or baseline.config.persistent_workers:
        return None
    judged = judge_persistent(baseline, epoch_samples)
    if not judged.get("recommended"):
        return None
    saved = judged["seconds_saved_per_epoch"]
    share = judged.get("share_of_epoch")
    of_epoch = f" ({share:.1%} of an epoch)" if share is not None else ""
    return Finding(
        "startup-cost",
        "warning" if (share or 0) >= 0.05 else "info",
        f"your {baseline.config.num_workers} workers take {saved:.2f} s to start and "
        f"persistent_workers is off, so every epoch loses {saved:.2f} s{of_epoch}",
        "DataLoader(..., persistent_workers=True)",
    )


def cpu_quota_finding(machine: dict[str, Any]) -> Finding | None:
    quota, count = machine.get("cpu_quota"), machine.get("cpu_count")
    if quota is None or count is None or quota >= count:
        return None
    return Finding(
        "cpu-quota",
        "warning",
        f"the container may use {quota:g} CPUs but os.cpu_count() says {count}: rules based on "
        "the CPU count start too many workers",
        f"size workers from the quota: num_workers ≈ {machine.get('cpus_usable')}",
    )


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


def tune_findings(
    space: Space,
    machine: dict[str, Any],
    baseline: Trial,
    best: Trial,
    trials: list[Trial],
    epoch_samples: int | None,
) -> list[Finding]:
    found = [
        bottleneck_finding(best, space.cpus, space.consumer),
        pin_memory_finding(baseline, machine),
        worker_count_finding(baseline, best),
        startup_finding(baseline, epoch_samples),
        cpu_quota_finding(machine),
        skipped_finding(trials),
    ]
    return by_severity([f for f in found if f is not None])
