"""Rules about the worker count and start-up: too few or too many workers, more than CPUs on
purpose, restarts every epoch, a data stall, a machine too busy to trust. Pure functions.
"""

from __future__ import annotations

from feedrate.results.findings import Finding, FindingDoc
from feedrate.results.trial import Trial
from feedrate.search.advice import judge_persistent
from feedrate.search.space import STALL_MARGIN, beats, contended, covers, others_busy
from feedrate.units import counted, size


def worker_count_finding(baseline: Trial, best: Trial, growing: bool = False) -> Finding | None:
    """The user's num_workers against the measured optimum, with the samples/s lost.
    ``growing``: ``best`` is the most workers measured and they mostly wait, so more may
    give more still (the doctor measured no further: ``tune`` does)."""
    if not baseline.measured or not best.measured or not beats(best, baseline):
        return None
    mine, good = baseline.config.num_workers, best.config.num_workers
    if mine == good:
        return None
    lost = best.median - baseline.median
    fid = "too-few-workers" if mine < good else "too-many-workers"
    further = (
        f"; {good} is the most measured here, and its workers mostly wait: more may give "
        "more still (`feedrate tune` measures how many)"
        if growing and good > mine
        else ""
    )
    return Finding(
        fid,
        "warning",
        f"num_workers={mine} gives {baseline.median:,.0f} samples/s; {good} measured "
        f"{best.median:,.0f} ({lost:,.0f} samples/s lost, {best.median / baseline.median:.2f}×)"
        + further,
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
        f"num_workers={w} is above the {counted(cpus, 'usable CPU')} on purpose: it measured "
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


def data_stall_finding(together: Trial, fix: str, whose: str = "your") -> Finding | None:
    """With a consumer: your settings (``whose``: "autotune's", once it tuned them) leave it
    waiting for data beyond ``STALL_MARGIN``. The fix is what would help the bottleneck
    found."""
    stall = together.stall_fraction
    if not together.measured or stall is None or stall <= STALL_MARGIN:
        return None
    return Finding(
        "data-stall",
        "warning",
        f"with {whose} settings ({together.config.label()}) the consumer waits for data "
        f"{stall:.0%} of the time: {together.median:,.0f} samples/s reach it",
        fix,
    )


def busy_machine_finding(trials: list[Trial], cpus: int) -> Finding | None:
    """Other processes kept CPUs busy while a trial ran (the machine's busy CPUs less the
    pipeline's own), judged trial by trial: one loaded trial among quiet ones is enough to tip
    a comparison, so the most loaded one decides and is named."""
    others = [(busy, t) for t in trials if (busy := others_busy(t)) is not None]
    if not others:
        return None
    busy, worst = max(others, key=lambda pair: pair[0])
    if not contended(worst, cpus):
        return None
    loaded = sum(1 for _, t in others if contended(t, cpus))
    which = (
        f"while {worst.config.label()} was measured"
        if loaded == 1
        else f"during {loaded} of the {len(others)} trials (most while {worst.config.label()} "
        "was measured)"
    )
    return Finding(
        "busy-machine",
        "info",
        f"other processes kept {busy:.1f} of the {counted(cpus, 'usable CPU')} busy {which}: "
        "rates are lower and noisier than on a quiet machine, and a verdict that rests on that "
        "trial holds for a machine this busy",
        "measure again on a quiet machine, or give the job CPUs of its own (taskset, cpusets, "
        "a container's --cpuset-cpus)",
    )


def workers_past_shards_finding(shards: int | None, workers: int) -> Finding | None:
    """More workers than the shards of a library that gives each worker whole shards
    (``libraries.worker_limit``: a Hugging Face ``IterableDataset``, a webdataset pipeline
    split by worker): the workers past them have nothing to read."""
    if shards is None or workers <= shards:
        return None
    idle = workers - shards
    return Finding(
        "workers-past-shards",
        "warning",
        f"num_workers={workers}, but the dataset has {shards} shard{'s' if shards != 1 else ''} "
        f"and its library gives each worker whole shards: {idle} of your {workers} workers "
        "have nothing to read (their start-up and memory buy nothing; webdataset may fail with "
        "'No samples found')",
        f"DataLoader(..., num_workers={shards}), or more shards to spread over more workers: "
        "to_iterable_dataset(num_shards=N) for Hugging Face, more shard files for webdataset",
    )


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
    FindingDoc(
        id="workers-past-shards",
        title="More workers than the stream has shards",
        means=(
            "An IterableDataset whose library hands whole shards to workers (a Hugging Face "
            "`IterableDataset`, whose shards `to_iterable_dataset()` sets to 1 by default; a "
            "webdataset pipeline split by worker) has fewer shards than `num_workers`: the "
            "workers past them get none and read nothing, and a measurement of those settings "
            "is one of fewer workers."
        ),
        evidence=(
            "From `doctor` and `tune`: the shards read off the dataset object (`num_shards`, "
            "the shard list) against `num_workers`; nothing is run. `tune` and `autotune` never "
            "try more workers than shards."
        ),
        fix=(
            "As many workers as shards, or more shards: `to_iterable_dataset(num_shards=N)`, "
            "more shard files."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="too-few-workers",
        title="Your num_workers is too low",
        means=(
            "Your `num_workers` is below a count that measured better: without a consumer, fewer "
            "than the fastest; with one, too few to keep it fed."
        ),
        evidence=(
            "From `tune` and `doctor`: your settings and the better count, measured again side by "
            "side; the samples/s of each and the samples/s lost; with a consumer, the share of "
            "time it waited for data at each. Reported only when the gain beats the noise. Where "
            "the doctor's better count is the most it measured and its workers mostly wait, the "
            "message says more may give more still: the doctor doubles once, `tune` goes on."
        ),
        fix="`DataLoader(..., num_workers=N)` with the count the message gives.",
        severity="warning",
    ),
    FindingDoc(
        id="too-many-workers",
        title="Your num_workers is too high",
        means=(
            "Your `num_workers` is above a count that measured better: without a consumer, fewer "
            "workers were faster (they competed for the CPUs, or the copies between processes cost "
            "more than they saved); with one, fewer workers keep it fed as well, for less memory "
            "and start-up."
        ),
        evidence=(
            "From `tune` and `doctor`: your settings and the better count, measured again side by "
            "side; without a consumer, the samples/s lost (only when the gain beats the noise); "
            "with one, the stall at each and the memory saved."
        ),
        fix="`DataLoader(..., num_workers=N)` with the count the message gives.",
        severity=(
            "warning without a consumer (samples/s are lost); info with one (only memory and "
            "start-up are at stake)"
        ),
    ),
    FindingDoc(
        id="workers-past-cpus",
        title="More workers than CPUs, on purpose",
        means=(
            "The recommendation uses more workers than usable CPUs because more of them measured "
            "faster, usually because they mostly wait (on storage or the network). DataLoader "
            "warns about any count above its suggested maximum; that warning is a rule of thumb, "
            "this count was measured."
        ),
        evidence=(
            "From `tune`: the recommended count against the usable CPUs, its samples/s against "
            "your settings', and each worker's CPU use."
        ),
        fix=(
            "`loader = result.loader()` (a rebuilt loader that does not warn), or "
            "`feedrate.allow_many_workers(your_loader)` to drop the warning from a loader you "
            "built."
        ),
        severity="info",
    ),
    FindingDoc(
        id="startup-cost",
        title="Workers restart every epoch at a measured cost",
        means=(
            "Your workers restart every epoch (`persistent_workers=False`), and starting them "
            "costs a measurable share of the epoch."
        ),
        evidence=(
            "From `tune` and `doctor`: the time each later epoch waited for its first batch (else "
            "the start-up to the first batch) against the epoch's length at the measured rate; "
            "reported from 1 s or 1% of an epoch. The doctor adds the likely cause when it sees "
            "one: a slow `worker_init_fn`, or the `spawn` or `forkserver` start method (every "
            "worker imports your modules and unpickles the dataset)."
        ),
        fix="`DataLoader(..., persistent_workers=True)`",
        severity="warning from 5% of an epoch; info below",
    ),
    FindingDoc(
        id="data-stall",
        title="The consumer waits for data",
        means=(
            "With a consumer (`--rate`, `--step-time` or `--step`), your settings leave it waiting "
            "for data more than 5% of the time: the accelerator, or the training step, idles while "
            "the loader catches up."
        ),
        evidence=(
            "From `doctor` with a consumer: at your settings, the share of the loop's time spent "
            "in `next()` waiting for a batch, and the samples/s that reached the consumer. Not "
            "reported when `too-few-workers` already says it."
        ),
        fix=(
            "What helps the bottleneck found (the `bottleneck` finding's fix); `feedrate tune "
            "TARGET --rate R` finds the fewest workers that keep a consumer of R samples/s fed."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="busy-machine",
        title="Other processes kept the CPUs busy",
        means=(
            "Other processes kept CPUs busy while the pipeline was measured. The rates are lower "
            "and noisier than on a quiet machine, and the worker count that measured best is the "
            "best for a machine that busy."
        ),
        evidence=(
            "From `doctor`: the machine's busy CPUs (all processes; in a container with a CPU "
            "quota or a cpuset, the container's) less the pipeline's own (main process and "
            "workers), judged for each configuration measured (one loaded trial can "
            "tip a comparison); reported when the most loaded one reaches 0.5 CPUs or a quarter "
            "of the usable CPUs, whichever is more, and it names that configuration."
        ),
        fix=(
            "Measure again on a quiet machine, or give the job CPUs of its own (`taskset`, "
            "cpusets, a container's `--cpuset-cpus`)."
        ),
        severity="info",
    ),
)
