"""Turning the chosen trial into advice: the verdict on every trial, the persistent_workers
judgement and the one-sentence reason. Pure functions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial
from feedrate.search.bottleneck import bottleneck, busy_words
from feedrate.search.space import (
    NOISE_FLOOR,
    Space,
    beats,
    behind,
    contended,
    covers,
    eligible,
    fastest,
    others_busy,
    series,
    shortfall,
    tolerance,
)
from feedrate.units import rate, size

#: persistent_workers pays when restarting workers costs at least this share of an epoch...
PERSISTENT_SHARE = 0.01
#: ... or at least this many seconds per epoch.
PERSISTENT_SECONDS = 1.0


def verdicts(space: Space, trials: list[Trial], best: Trial, aside: Trial | None = None) -> None:
    """Fill in each trial's ``verdict``: ``best`` is ``propose.choose``'s answer from ``trials``
    less ``aside`` (a trial set aside before choosing: ``checks.transfer.pin_loser``), and every
    other trial says, by the rule that chose it, why it is not the answer."""
    allowed = eligible(space, [t for t in trials if t is not aside])
    top = fastest(allowed)
    fed = space.consumer and any(covers(t) for t in allowed)
    for t in trials:
        if not t.measured:
            continue
        if t is best:
            t.verdict = "recommended"
        elif t is aside:
            t.verdict = f"set aside for its pin_memory={not t.config.pin_memory} twin"
        elif not any(t is x for x in allowed):
            t.verdict = (
                "threads need --threads (a thread-safe __getitem__)"
                if t.config.threads > 1 and not space.allow_threads
                else f"over the memory budget of {size(space.memory_budget or 0)}"
            )
        elif space.consumer:
            stall = t.stall_fraction or 0.0
            t.verdict = (
                f"keeps the consumer fed ({stall:.0%} stall)"
                if covers(t)
                else f"consumer waits {stall:.0%} of the time"
            )
            if not fed and top is not None:  # none fed: chosen by the rule below
                t.verdict += f"; {_behind(top, t, best)}"
        elif top is not None:
            t.verdict = _behind(top, t, best)


def _behind(top: Trial, t: Trial, best: Trial) -> str:
    """Why ``t`` is not the answer ``best`` where the fastest ``top`` decides (``behind``)."""
    gap = behind(top, t)
    if t is top and gap is None:  # the fastest, but the answer is as good for less
        return "fastest, but the recommended costs less within its noise" + _gap_words(best, t)
    if gap is None:  # as good as the fastest, and no cheaper than the answer
        return "within noise of the fastest" + _gap_words(t, top)
    if gap == "outpaced":
        return (
            f"within the noise, but outpaced by {top.config.label()} side by side "
            f"({shortfall(t, top):.0%} slower over "
            f"{min(t.repeats, top.repeats)} runs each)"
        )
    if not beats(best, t):  # e.g. a hair faster than the cheaper recommendation
        return "within noise of the recommended" + _gap_words(t, best)
    return f"{shortfall(t, best):.0%} slower" if best.median > 0 else "slower"


def _gap_words(t: Trial, than: Trial) -> str:
    """Where ``t`` is within the noise of ``than`` yet reads ``NOISE_FLOOR`` or more slower in
    the table, both figures, in the same terms (``shortfall``, ``tolerance``): the gap and the
    gap it takes to tell the two apart. Nothing where the gap is smaller."""
    gap, takes = shortfall(t, than), tolerance(t, than)
    if gap < NOISE_FLOOR:
        return ""
    digits = 0 if f"{gap:.0%}" != f"{takes:.0%}" else 1
    return f" ({gap:.{digits}%} slower; telling them apart takes more than {takes:.{digits}%})"


def judge_persistent(best: Trial, epoch_samples: int | None) -> dict[str, Any]:
    """Whether keeping workers alive between epochs pays, from the measured start-up cost (the
    mean epoch restart when the measurement saw one) against the epoch's length."""
    w = best.config.num_workers
    if w == 0:
        return {"applies": False, "why": "no workers to keep alive"}
    restart = (
        sum(best.epoch_restart_s) / len(best.epoch_restart_s)
        if best.epoch_restart_s
        else best.startup_s
    )
    epoch_s = epoch_samples / best.median if epoch_samples and best.median > 0 else None
    share = restart / epoch_s if epoch_s else None
    pays = restart >= PERSISTENT_SECONDS or (share is not None and share >= PERSISTENT_SHARE)
    return {
        "applies": True,
        "recommended": bool(pays),
        "seconds_saved_per_epoch": restart,
        "epoch_seconds": epoch_s,
        "share_of_epoch": share,
        "measured_from": "epoch restarts" if best.epoch_restart_s else "start-up",
    }


def apply_persistent(best: Trial, judgement: dict[str, Any]) -> LoaderConfig:
    """The recommended config with persistent_workers set by the judgement (not trialled: the
    steady-state rate does not change, only each epoch's start)."""
    if not judgement.get("applies"):
        return best.config
    return replace(best.config, persistent_workers=bool(judgement["recommended"]))


def reason(
    space: Space,
    best: Trial,
    baseline: Trial,
    consumer: str | None,
    trials: list[Trial] | None = None,
) -> str:
    """One sentence: why this configuration; and when the answer rests on trials others
    loaded (``contended``: the answer itself, your settings, or one it was preferred to), a
    second saying so."""
    why = _reason(space, best, baseline, consumer, trials)
    if space.kept_workers:
        why = f"{why} No more workers than yours were tried: {space.kept_workers}."
    compared = [best, baseline, *(t for t in trials or [] if t.measured)]
    unique = list({id(t): t for t in compared}.values())
    loaded = [t for t in unique if contended(t, space.cpus)]
    if not loaded:
        return why
    busy = max(others_busy(t) or 0.0 for t in loaded)
    labels = list(dict.fromkeys(t.config.label() for t in loaded))
    names = " and ".join(labels) if len(labels) <= 3 else f"{len(labels)} of the trials"
    verb = "was" if len(labels) == 1 else "were"
    return (
        f"{why} Other processes kept {busy:.1f} of the {space.cpus} CPUs busy while {names} "
        f"{verb} measured: on a quiet machine the answer may differ."
    )


def _workers_unmeasured(best: Trial, trials: list[Trial] | None) -> str | None:
    """Where no configuration with workers was measured and the answer has none: why, which is
    no verdict on workers (None: some were)."""
    with_workers = [x for x in trials or [] if x.config.num_workers > 0]
    if best.config.num_workers > 0 or any(x.measured for x in with_workers):
        return None
    if any(x.error for x in with_workers):
        return (
            "Only num_workers=0 could be measured: every configuration with workers failed "
            "(see the trials-failed finding), so this is no verdict on workers."
        )
    return (
        f"Only num_workers=0 was measured within the budget ({rate(best.median)} samples/s): "
        "this is no verdict on workers; a larger budget (--budget-s) measures them."
    )


def _reason(
    space: Space,
    best: Trial,
    baseline: Trial,
    consumer: str | None,
    trials: list[Trial] | None,
) -> str:
    w, cpus = best.config.num_workers, space.cpus
    if consumer is not None:
        if covers(best):
            return (
                f"{w} workers are the fewest that keep {consumer} fed: the data stall drops "
                f"from {baseline.stall_fraction or 0:.0%} with your settings to "
                f"{best.stall_fraction or 0:.0%}."
            )
        return (
            f"No configuration tried keeps {consumer} fed on this machine; {w} workers are the "
            f"fewest within the noise of the least stall ({best.stall_fraction or 0:.0%} of the "
            "time waiting for data)."
        )
    kind = bottleneck(best, cpus)
    if space.max_workers == 0:  # max_workers=0, or a stream that must keep its count
        return f"No workers were tried: the search allowed none ({rate(best.median)} samples/s)."
    unmeasured = _workers_unmeasured(best, trials)
    if unmeasured is not None:
        return unmeasured
    past = space.copies_past
    copies = [
        x for x in trials or [] if x.measured and past is not None and x.config.num_workers > past
    ]
    if copies and best.config.num_workers <= (past or 0):
        return (
            f"{', '.join(x.config.label() for x in copies)} counted copies: each of their workers "
            f"yields the whole stream, so its samples/s are not samples; {best.config.label()} "
            f"is the pick of the rest ({rate(best.median)} samples/s)."
        )
    t = best.config.threads
    if t > 1:
        procs = [x for x in series(space, trials or []) if x.config.num_workers > 0]
        rival = max(procs, key=lambda x: x.median, default=None)
        than = (
            f" ({best.median / rival.median:.1f}× the fastest processes-only setting tried, "
            f"{rival.config.num_workers} workers)"
            if rival is not None and rival.median > 0
            else ""
        )
        return (
            f"Fetching waits, not computing: {w} worker{'s' if w != 1 else ''} each keeping "
            f"{t} requests in flight on threads overlap the waits for a fraction of the "
            f"memory of one process per request{than}."
        )
    with_workers = [x for x in trials or [] if x.config.num_workers > 0]
    if w == 0:  # no-workers, or latency: the main process waited on its fetches
        faster = max((x for x in with_workers if x.measured), key=lambda x: x.median, default=None)
        if faster is not None and faster.median > best.median:
            return (
                f"No workers is the cheapest within the noise of the fastest: "
                f"{faster.config.label()} measured {faster.median / best.median - 1:.0%} higher, "
                "inside the spread of the trials, so its worker processes and their memory buy "
                "nothing certain on this machine."
            )
        if kind == "latency":
            return (
                f"No workers measured fastest, although fetching mostly waits (the main process "
                f"{best.main_cpu:.0%} of a core): the workers' waits did not overlap, as behind "
                "one lock or a source that serves one request at a time."
            )
        return (
            "No workers measured fastest: handing samples to worker processes cost more in "
            "inter-process copies and start-up than it saved on this machine."
        )
    if kind == "latency":
        return (
            f"Workers spend most of their time waiting ({best.worker_cpu_mean:.0%} CPU each), so "
            f"{w} workers{' — more than the ' + str(cpus) + ' usable CPUs —' if w > cpus else ''}"
            " overlap the waits."
        )
    if kind == "main-process":
        return (
            f"The main process is the bottleneck ({best.main_cpu:.0%} of a core collating and "
            f"unpickling batches), so {w} workers are enough and more would not help."
        )
    if kind == "cpu":
        return (
            f"The pipeline is CPU-bound ({_cpu_load(best, cpus)}): {w} workers keep the usable "
            "CPUs busy and more would only compete."
        )
    return f"{w} workers measured fastest, beyond the noise of the alternatives tried."


def _cpu_load(best: Trial, cpus: int) -> str:
    """The figures a CPU-bound ``best`` was judged on (``search.bottleneck``): the busy CPUs,
    which processes outside the pipeline may fill more than its own (with several ranks, a
    rank's share of the node's), and its workers' wait for a CPU where longer than they ran."""
    text, _ = busy_words(best, cpus)
    queued = best.worker_demand_mean - best.worker_cpu_mean
    if queued > best.worker_cpu_mean:
        text += (
            f"; each worker queued for a CPU {queued:.0%} of the time, "
            f"ran {best.worker_cpu_mean:.0%}"
        )
    return text
