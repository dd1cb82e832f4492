"""Rules about the worker count and start-up: too few or too many workers, more than CPUs on
purpose, restarts every epoch, a data stall, a machine too busy to trust. Pure functions.
"""

from __future__ import annotations

from feedrate.results.findings import Finding
from feedrate.results.trial import Trial
from feedrate.search.advice import judge_persistent
from feedrate.search.space import STALL_MARGIN, beats, covers
from feedrate.units import size

#: Other processes busy on this many CPUs (or this share of the usable ones, if more) make the
#: machine too busy for rates to be taken at face value.
BUSY_OTHERS_MIN = 0.5


BUSY_OTHERS_SHARE = 0.25


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


def workers_past_cpus_finding(baseline: Trial, best: Trial, cpus: int) -> Finding | None:
    """More workers than usable CPUs, chosen because they measured faster: say that
    DataLoader's warning about it is expected, and how to drop it."""
    w = best.config.num_workers
    if not best.measured or w <= cpus:
        return None
    return Finding(
        "workers-past-cpus",
        "info",
        f"num_workers={w} is above the {cpus} usable CPUs on purpose: it measured "
        f"{best.median:,.0f} samples/s (your settings {baseline.median:,.0f}), each worker "
        f"busy {best.worker_cpu_mean:.0%} of a core. DataLoader will warn that this is more "
        "than it suggests; that warning is a rule of thumb, this count was measured",
        "loader = result.loader()  # or feedrate.allow_many_workers(your_loader): no warning",
    )


def consumer_worker_finding(baseline: Trial, best: Trial) -> Finding | None:
    """With a consumer: the user's num_workers against the fewest measured that keep it fed."""
    if not baseline.measured or not best.measured or not covers(best):
        return None
    mine, good = baseline.config.num_workers, best.config.num_workers
    if mine == good:
        return None
    stall, best_stall = baseline.stall_fraction or 0.0, best.stall_fraction or 0.0
    if not covers(baseline):
        return Finding(
            "too-few-workers",
            "warning",
            f"num_workers={mine} leaves the consumer waiting for data {stall:.0%} of the time "
            f"({baseline.median:,.0f} samples/s); {good} measured {best_stall:.0%} "
            f"({best.median:,.0f} samples/s, {best.median - baseline.median:,.0f} more)",
            f"DataLoader(..., num_workers={good})",
        )
    if good >= mine:
        return None
    saved = baseline.memory_bytes - best.memory_bytes
    memory = f", {size(saved)} less memory" if saved > 0 else ""
    return Finding(
        "too-many-workers",
        "info",
        f"num_workers={mine} keeps the consumer fed ({stall:.0%} stall), and so does {good} "
        f"({best_stall:.0%} stall{memory}): the extra workers cost memory and start-up for "
        "nothing",
        f"DataLoader(..., num_workers={good})",
    )


def startup_cause(
    start_method: str | None, init_s: float | None, age_s: float | None, pickled: int | None
) -> str | None:
    """Why workers are slow to start, from what the workers reported and the start method."""
    parts = []
    if init_s is not None and age_s and init_s >= 0.2 * age_s and init_s >= 0.05:
        parts.append(f"worker_init_fn takes {init_s:.2f} s")
    if start_method in ("spawn", "forkserver"):
        pickled_size = f" ({size(pickled)})" if pickled else ""
        parts.append(
            f"under {start_method} every worker imports your modules (torch among them) and "
            f"unpickles the dataset{pickled_size}"
        )
    if not parts:
        return None
    lead = f"each worker took {age_s:.2f} s to start: " if age_s else ""
    return lead + "; ".join(parts)


def startup_finding(
    baseline: Trial, epoch_samples: int | None, cause: str | None = None
) -> Finding | None:
    """The user's workers restart every epoch (persistent_workers off) at a measured cost;
    ``cause``, when known, says why they are slow to start."""
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
        f"persistent_workers is off, so every epoch loses {saved:.2f} s{of_epoch}"
        + (f" ({cause})" if cause else ""),
        "DataLoader(..., persistent_workers=True)",
    )


def data_stall_finding(together: Trial, fix: str) -> Finding | None:
    """With a consumer: your settings leave it waiting for data beyond ``STALL_MARGIN``. The fix
    is what would help the bottleneck found."""
    stall = together.stall_fraction
    if not together.measured or stall is None or stall <= STALL_MARGIN:
        return None
    return Finding(
        "data-stall",
        "warning",
        f"with your settings ({together.config.label()}) the consumer waits for data "
        f"{stall:.0%} of the time: {together.median:,.0f} samples/s reach it",
        fix,
    )


def busy_machine_finding(trials: list[Trial], cpus: int) -> Finding | None:
    """Other processes kept CPUs busy while the trials ran (the machine's busy CPUs less the
    pipeline's own): the rates, and verdicts drawn from them, hold for a machine that busy."""
    others = [
        t.system_busy_cpus - t.main_cpu - t.workers_cpu
        for t in trials
        if t.measured and t.system_busy_cpus is not None
    ]
    if not others:
        return None
    busy = sum(others) / len(others)
    if busy < max(BUSY_OTHERS_MIN, BUSY_OTHERS_SHARE * cpus):
        return None
    return Finding(
        "busy-machine",
        "info",
        f"other processes kept {busy:.1f} of the {cpus} usable CPUs busy while the pipeline "
        "was measured: rates are lower and noisier than on a quiet machine, and the worker "
        "count that measured best is the best for a machine this busy",
        "measure again on a quiet machine, or give the job CPUs of its own (taskset, cpusets, "
        "a container's --cpuset-cpus)",
    )
