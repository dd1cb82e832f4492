"""What ``feedrate run`` concludes from what it observed, as pure functions: which loaders
train and which evaluate, what limits a loader that stalls its loop (the one bottleneck
vocabulary of ``search.bottleneck``), the doctor's findings that the observations support, and
the next step. No finding ids of its own: ``data-stall``, ``bottleneck``, ``startup-cost``
and ``pin-memory-no-accelerator`` mean here what they mean for ``tune`` and ``doctor``.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from feedrate.checks.dataset import copies_in_run_finding
from feedrate.checks.machine import pin_memory_finding
from feedrate.checks.workers import data_stall_finding, startup_finding
from feedrate.loader.words import BY_TRAINER, in_words_of
from feedrate.results.findings import Finding, FindingDoc
from feedrate.results.run import AutotuneChange, LoaderRun, Role
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.search.bottleneck import LABELS, MAIN_BUSY, Bottleneck, bottleneck
from feedrate.search.rounds import fewest_alike, round_fewer
from feedrate.search.space import STALL_MARGIN

#: A loader taking fewer batches than this share of the busiest one's (in the same process),
#: or taking most of its batches with autograd off, is an evaluation loader.
EVAL_SHARE = 0.5
#: Workers suggested make batches this much faster than the loop steps.
WORKER_MARGIN = 0.1
#: Batches a loader must deliver past each epoch's first (which waits for start-up) and past
#: those its workers queue while it does (``num_workers * prefetch_factor``: they come at once)
#: before its figures advise anything: a crash after a handful of batches shows what ran, not
#: what the loop needs.
MIN_STEADY_BATCHES = 5
#: No finding ids of this module's own (see the docstring).
DOCS: tuple[FindingDoc, ...] = ()

_FIX: dict[str, str] = {
    "main-process": "move the work into worker processes: DataLoader(..., num_workers=N)",
    "cpu": "more CPUs, or cheaper per-sample work (decode at lower resolution, move "
    "augmentation to the accelerator)",
    "latency": "more workers (or threads inside workers: feedrate.threaded), or a local cache "
    "of the remote data",
    "unknown": "feedrate doctor on the loader, exposed as a name (file.py:NAME)",
}


def _fix(ld: LoaderRun, kind: str) -> str:
    """The fix for a bottleneck of ``kind``; where none stood out, the doctor on the loader,
    by its name where the run found one."""
    if kind == "main-process" and ld.config.num_workers:  # the main thread busy receiving
        return (
            "cheapen what the main process does per batch: collation (a collate_fn that builds "
            "one tensor), unpickling, pinning; fewer bytes per batch through shared memory"
        )
    if kind in _FIX and kind != "unknown":
        return _FIX[kind]
    return f"feedrate doctor {ld.name}" if ld.name else _FIX["unknown"]


def roles(loaders: list[LoaderRun]) -> list[Role]:
    """The role of each of one process's loaders: "eval" for one that took most of its
    batches with autograd off (``torch.no_grad()``, inference mode) or fewer than
    ``EVAL_SHARE`` of the batches of the busiest other loader; else "train"."""
    grad_on = {id(ld) for ld in loaders if ld.grad_off_batches * 2 < ld.batches}
    top = max((ld.batches for ld in loaders if id(ld) in grad_on), default=0)
    return [
        "train" if id(ld) in grad_on and ld.batches >= EVAL_SHARE * top else "eval"
        for ld in loaders
    ]


def observed_trial(ld: LoaderRun) -> Trial:
    """The loader's observation as a ``Trial`` (what the doctor's rules read): the rate it
    delivered over its whole loop (the figure the report shows beside it; its windows' spread
    too), its stall, start-up and restarts, and its CPU use
    (the main thread's while waiting, the workers' over the loop). Once ``--autotune`` tuned
    it, the settings are autotune's and the stall the settled one."""
    config = ld.settled_config
    per_batch = ld.samples / ld.batches if ld.batches else 0.0
    rates = [
        w.batches * per_batch / (w.wait_s + w.step_s)
        for w in ld.timeline
        if w.batches and w.wait_s + w.step_s > 0
    ]
    return Trial(
        config=config,
        reason="observed by feedrate run",
        samples_per_s=ld.samples / ld.loop_s if ld.loop_s > 0 else 0.0,
        spread=Spread.of_rates(rates or [0.0], span=True),  # its rate: the loop's, in all
        startup_s=ld.startup_s or 0.0,
        epoch_restart_s=list(ld.epoch_restart_s),
        main_cpu=ld.main_cpu_in_next or 0.0,
        workers_cpu=ld.workers.cpu_util or 0.0,
        workers_runq=ld.workers.runq_util,
        system_busy_cpus=ld.system_busy_cpus,
        batch_bytes=ld.batch_bytes,
        stall_fraction=ld.settled_stall,
    )


def steady_batches(ld: LoaderRun) -> int:
    """The batches that tell the loop's steady pace: those past each epoch's first, less the
    queue the workers of the loader's own settings filled at start-up (they come at once), at
    most half of them: a long run with a deep queue (64 workers × 4 over 250 slow steps) is
    judged, a handful of batches out of that queue is not."""
    past = ld.batches - ld.epochs
    queued = ld.config.num_workers * (ld.config.prefetch_factor or 2)
    return max(0, past - min(queued, past // 2))


def too_little(ld: LoaderRun) -> str | None:
    """What the run saw of ``ld``, where too little to advise on (fewer than
    ``MIN_STEADY_BATCHES`` steady batches, in fewer epochs: every epoch's start is evidence,
    as in a loop that calls ``next(iter(loader))`` each step, or trains on one batch an
    epoch); None where enough."""
    steady = steady_batches(ld)
    if steady >= MIN_STEADY_BATCHES or ld.epochs >= MIN_STEADY_BATCHES:
        return None
    return (
        f"{ld.batches:,} batch(es) in {ld.epochs} epoch(s) over {ld.loop_s:.2f} s of loop "
        f"({steady} past start-up, where advice needs {MIN_STEADY_BATCHES})"
    )


def bottleneck_of(ld: LoaderRun, cpus: int) -> Bottleneck | None:
    """What limits the loop: "consumer" when it waits for data at most ``STALL_MARGIN`` of its
    time; without workers, "main-process" when the main thread computed while it waited,
    else "latency"; with workers, what ``search.bottleneck`` reads from where their CPU time
    went, as for a trial of ``tune``: the main thread busy receiving, workers that use or queue
    for a CPU (a busy machine's workers wait in the run queue, not on I/O: "cpu"), or workers
    mostly asleep ("latency"). Once ``--autotune`` tuned it, its settled stall decides whether
    it still waits. None where the run saw too little of it to tell (``too_little``)."""
    if too_little(ld) is not None:
        return None
    stall = ld.settled_stall or 0.0
    if ld.tuned:
        return "consumer" if stall <= STALL_MARGIN else "unknown"
    if stall <= STALL_MARGIN:
        return "consumer"
    if ld.config.num_workers == 0:
        return "main-process" if _making(ld) >= MAIN_BUSY else "latency"
    if ld.workers.cpu_util is None:
        return "unknown"
    return bottleneck(observed_trial(ld), cpus)


def _making(ld: LoaderRun) -> float:
    """The share of the main thread's wait in ``next()`` spent making batches: on a CPU, or,
    without workers, queued for one (computing that other processes held up, not sleeping)."""
    main = ld.main_cpu_in_next or 0.0
    return main + (ld.main_queued_in_next or 0.0) if ld.config.num_workers == 0 else main


def _evidence(ld: LoaderRun, kind: str, cpus: int) -> str:
    if ld.tuned:
        # The figures of the run mix autotune's trials; they do not tell what limits its
        # answer (the user's settings, in ``ld.config``, ran only in its first trial if at all).
        how = "settled" if ld.autotune is not None and ld.autotune.settled else "still tuning"
        answer = ld.settled_config.label()
        return f"{answer}, autotune's ({how}): the run does not tell what limits it"
    main = ld.main_cpu_in_next
    parts = [f"{ld.config.label()}"]
    if main is not None:
        parts.append(f"the main thread computed {main:.0%} of its wait in next()")
    queued = ld.main_queued_in_next or 0.0
    if ld.config.num_workers == 0 and queued >= 0.05:
        parts.append(f"and was queued for a CPU {queued:.0%} of it")
    if ld.config.num_workers and ld.workers.cpu_util is not None:
        each = ld.workers.cpu_util / ld.config.num_workers
        parts.append(f"workers {ld.workers.cpu_util:.0%} of a core in total ({each:.0%} each)")
        queued = ld.workers.runq_util or 0.0
        if queued >= 0.05 * ld.config.num_workers:
            parts.append(f"queued for a CPU {queued / ld.config.num_workers:.0%} of the time each")
        if ld.system_busy_cpus is not None and ld.system_busy_cpus >= 0.85 * cpus:
            parts.append(f"the machine {ld.system_busy_cpus:.1f} of {cpus} CPUs busy")
    if ld.config.num_workers == 0:
        parts.append(
            "so the dataset's work runs in the training process itself"
            if kind == "main-process"
            else "so it slept (I/O, locks, remote storage) rather than computed"
        )
    return ", ".join(parts)


def bottleneck_finding(ld: LoaderRun, kind: Bottleneck, cpus: int) -> Finding:
    """The ``bottleneck`` finding of an observed loader."""
    stall = ld.settled_stall or 0.0
    if kind == "consumer":
        return Finding(
            "bottleneck",
            "info",
            f"consumer-bound: the loop waits for data only {stall:.0%} of its time "
            f"({observed_trial(ld).config.label()}): the model, not the loader, sets the pace",
            "speed up the training step; more loader work will not help",
        )
    return Finding(
        "bottleneck",
        "info",
        f"data-bound: the loop waits for data {stall:.0%} of its time; {LABELS[kind]}: "
        f"{_evidence(ld, kind, cpus)}",
        _fix(ld, kind),
    )


def workers_needed(ld: LoaderRun, cpus: int, ranks: int = 1) -> int | None:
    """Workers that would make batches as fast as the loop steps, where the run shows it: the
    seconds of data work per batch (the wait, less start-up, plus the step's share the loop
    overlapped) over the seconds of step per batch, with ``WORKER_MARGIN`` to spare; capped
    at the usable CPUs for CPU-bound work, or workers on a CPU half the time or more (more
    would only compete): at this rank's share of them, where ``ranks`` share the node. Of
    counts that make an epoch in as many rounds, the fewest (``search.rounds``)."""
    steady = ld.batches - ld.epochs
    if steady <= 0 or ld.step_s <= 0:
        return None
    waits = ld.wait_s - (ld.startup_s or 0.0) - sum(ld.epoch_restart_s)
    step = ld.step_s / ld.batches
    make = max(0.0, waits) / steady
    if ld.config.num_workers:
        make = (make + step) * ld.config.num_workers  # each worker's batch, end to end
    raw = math.ceil(make / step * (1 + WORKER_MARGIN))
    # As many as make an epoch in the same rounds of one batch per worker are enough; where
    # those are no more than the run had, only a count that saves a round can go faster.
    needed = fewest_alike(raw, ld.epoch_batches)
    if raw > ld.config.num_workers >= needed > 0:
        needed = round_fewer(ld.config.num_workers, ld.epoch_batches) or raw
    # Workers computing half the time or more (spawned ones importing torch, too): more of
    # them than CPUs only compete.
    w = ld.config.num_workers
    demand = (ld.workers.cpu_util or 0.0) + (ld.workers.runq_util or 0.0)  # queued: computing
    computing = w > 0 and demand / w >= 0.5
    cpu_bound = _making(ld) >= MAIN_BUSY or ld.bottleneck == "cpu" or computing
    return max(1, min(needed, cpus // max(1, ranks)) if cpu_bound else needed)


def next_step(ld: LoaderRun, command: list[str], cpus: int, ranks: int = 1) -> list[str]:
    """What to do next, in order: the change the run showed (``--autotune``'s), else the
    settings to try with the gain they can bring (each rank's, where ``ranks`` of the job
    share this node's CPUs), then the commands that find them."""
    steps: list[str] = []
    tuned = ld.autotune
    if ld.tuned and tuned is not None and tuned.after is not None:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in tuned.after.kwargs().items())
        moved = (
            f"autotune kept {tuned.after.label()} ("  # not "moved w=0 → w=0"
            if tuned.after == tuned.before
            else f"autotune moved {tuned.before.label()} → {tuned.after.label()} ("
        )
        if tuned.settled:
            steps.append(
                f"{moved}{_stalls(tuned, 'once tuned')}); to keep it without autotune: "
                + in_words_of(words_of(ld), f"DataLoader(..., {kwargs})")
            )
        else:  # a trial, not an answer: keeping it by hand could keep a configuration it left
            steps.append(
                f"{moved}{_stalls(tuned, 'over the last half of the batches')}), a trial: it was "
                "still tuning when the run ended; a longer run lets it settle on settings to keep"
            )
    seen = too_little(ld)
    if seen is not None:  # what it saw is in the report; advice would rest on almost nothing
        return [
            *steps,
            f"too little observed to advise: {seen}; run it longer (more batches) for advice",
        ]
    stall = ld.settled_stall or 0.0
    if ld.bottleneck == "consumer":
        return [
            *steps,
            f"The loop does not wait on data ({stall:.0%} of its time): the model is the "
            "bottleneck, so more loader work (workers, prefetching) will not help.",
        ]
    saved = max(0.0, ld.wait_s - (ld.startup_s or 0.0))
    # Main-process-bound with workers: more workers would only add to what the main process
    # receives.
    receiving = ld.config.num_workers > 0 and ld.bottleneck == "main-process"
    needed = None if receiving or ld.stream_kept else workers_needed(ld, cpus, ranks)
    w = ld.config.num_workers
    if ld.stream_copies and w >= 2:  # each worker yields every sample: fewer is the fix
        steps.append(
            f"split the stream by worker (iterable-duplicates' fix): until then each of the {w} "
            "workers yields every sample, and num_workers=1 (or 0) yields each once"
        )
    elif ld.stream_kept and tuned is None:  # another count changes what the stream yields
        steps.append(f"keep num_workers={w} until the stream splits by worker: {ld.stream_kept}")
    if needed is not None and needed != ld.config.num_workers and tuned is None:
        each = f" in each of the {ranks} ranks on this node" if ranks > 1 else ""
        steps.append(
            in_words_of(words_of(ld), f"try DataLoader(..., num_workers={needed})")
            + f"{each}: the run shows it takes about that many "
            f"to make batches as fast as the loop steps; up to {saved:,.1f} s of the "
            f"{ld.loop_s:,.1f} s loop ({stall:.0%}) was spent waiting"
        )
    if tuned is None and not ld.handed_over:  # --autotune leaves feedrate's answers as they are
        steps.append(f"feedrate run --autotune {shlex.join(command)}")
    step_s = ld.step_s / ld.batches if ld.batches else 0.0
    if ld.name:
        steps.append(f"feedrate tune {ld.name} --step-time {step_s:.3g}")
    elif not ld.tuned and not ld.handed_over:  # tuned already: in code, or by --autotune
        line = INTEGRATION_LINES[ld.built_by or "plain"]
        steps.append(f"in code, at {ld.created_at}: {line}")
    return steps


#: The line in code for a loader a trainer builds (``LoaderRun.built_by``): wrapped by hand it
#: would be built again by the trainer without the wrapper, or lose the trainer's sampler.
INTEGRATION_LINES = {
    "plain": "loader = feedrate.autotune(DataLoader(...))",
    "lightning": "Trainer(..., callbacks=[FeedrateCallback()])  "
    "# from feedrate.integrations.lightning import FeedrateCallback",
    "transformers": "tune_trainer(trainer) before trainer.train()  "
    "# from feedrate.integrations.transformers import tune_trainer",
    "accelerate": "tune_prepared(accelerator, loader) after accelerator.prepare(...)  "
    "# from feedrate.integrations.accelerate import tune_prepared",
}


def words_of(ld: LoaderRun) -> str:
    """Whose words the advice for ``ld`` takes: a transformers ``Trainer``'s loader is set by
    its ``TrainingArguments``."""
    return BY_TRAINER if ld.built_by == "transformers" else ld.loader_type


def _stalls(tuned: AutotuneChange, after: str) -> str:
    """The stall with the user's settings and with autotune's (``after`` says over what), or
    why the first is not known: autotune did not run them."""
    late = "not measured" if tuned.stall_after is None else f"{tuned.stall_after:.0%}"
    if tuned.stall_before is None:
        start = tuned.started_from or "other settings"
        return f"stall {late} {after}; your settings did not run: autotune started from {start}"
    return f"stall {tuned.stall_before:.0%} with your settings → {late} {after}"


def findings(ld: LoaderRun, machine: dict[str, Any], cpus: int) -> list[Finding]:
    """The doctor's findings that the observation supports, most important first (``cpus``:
    the usable CPUs): where it saw too little (``too_little``), only those of its settings;
    ``startup-cost`` only where workers started again (more than one epoch)."""
    trial = observed_trial(ld)
    found: list[Finding] = []
    kind: Bottleneck = ld.bottleneck or "unknown"  # type: ignore[assignment]
    whose = "the tuned" if ld.handed_over else "your"
    if trial.config != ld.config:  # while still tuning, the stall mixes autotune's trials
        whose = (
            "autotune's" if ld.autotune is not None and ld.autotune.settled else "autotune's latest"
        )
    copies = ld.stream_kept if ld.stream_copies else None  # more workers add copies: no fix
    if too_little(ld) is not None:  # facts of its settings, not judgements of its figures
        pinned = pin_memory_finding(trial, machine)
        known = [copies_in_run_finding(copies, ld.config.num_workers)] if copies else []
        return known + ([pinned] if pinned is not None else [])
    fix = "split the stream by worker first (iterable-duplicates)" if copies else _fix(ld, kind)
    stall = data_stall_finding(trial, fix, whose)
    if stall is not None and ld.role == "train":
        found.append(stall)
    epoch_samples = ld.epoch_batches * ld.batch_size if ld.epoch_batches and ld.batch_size else None
    # Workers start again at each epoch after the first: with one, persistent ones save nothing.
    restarts = startup_finding(trial, epoch_samples) if ld.epochs > 1 else None
    for extra in (restarts, pin_memory_finding(trial, machine)):
        if extra is not None:
            found.append(extra)
    if copies:  # its rates count copies: no bottleneck is read from them
        return [copies_in_run_finding(copies, ld.config.num_workers), *found]
    found.append(bottleneck_finding(ld, kind, cpus))
    return found


def verdict(train: list[LoaderRun], evaluation: list[LoaderRun]) -> str:
    """The run in one sentence."""
    if not train and not evaluation:
        return "no DataLoader was iterated (in the processes feedrate could follow)"
    if not train:
        return "only evaluation loaders were iterated (taken with autograd off)"
    judged = [ld for ld in train if too_little(ld) is None]
    if not judged:  # short: how much it saw is in the loader's next step
        most = max(train, key=lambda ld: ld.batches)
        return f"too little observed to advise: {most.batches:,} batch(es), at {most.label}"
    worst = max(judged, key=lambda ld: ld.settled_stall or 0.0)
    stall = worst.settled_stall or 0.0
    tuned = ""
    if worst.tuned and worst.autotune is not None:
        tuned = (
            " once autotune tuned it"
            if worst.autotune.settled
            else " over the last half of its batches, while autotune was still tuning it"
        )
    if stall <= STALL_MARGIN:
        return (
            f"training does not wait on data{tuned} (at most {stall:.0%} of the loop): the "
            "model is the bottleneck, more loader work will not help"
        )
    return f"training waits on data {stall:.0%} of its loop time{tuned}, at {worst.label}"
