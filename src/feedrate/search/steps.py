"""The guided search: which configuration to try next, and which one to recommend.

Pure decisions over measured trials (no measuring here), so every rule is tested with synthetic
trials. The search reads the signals a measurement carries, the way an expert would:

* anchors first: no workers (cheap samples are fastest without inter-process copies) and one
  worker per usable CPU;
* workers mostly waiting (low CPU per worker) → latency-bound: double the workers, well past the
  CPU count, while each doubling gains more than the noise;
* workers or the main process saturating the CPUs → CPU-bound: look one step either side;
* refine between the best and its tried neighbours; then a deeper prefetch queue, and batches in
  completion order where allowed;
* never start a configuration whose predicted memory or /dev/shm use exceeds the budget.

With a consumer, the answer is the fewest workers that keep it fed (data stall under
``STALL_MARGIN``), found by stepping up (latency-bound: aimed at the consumer's pace) then
bisecting (``consumer_steps``); without one, the fastest, where among
configurations within the noise of the fastest the cheapest wins.
"""

from __future__ import annotations

import math
from dataclasses import replace

from feedrate.results.trial import Trial
from feedrate.search import rounds, scaling
from feedrate.search.bottleneck import WAITING_DEMAND, bottleneck
from feedrate.search.consumer_steps import POOL_CPUS, bisect, double
from feedrate.search.online_steps import copies, fewer, zero
from feedrate.search.space import (
    Proposal,
    Space,
    beats,
    covers,
    eligible,
    fastest,
    series,
    threaded,
    threads_win,
    with_workers,
)


def _anchor_none(space: Space, trials: list[Trial]) -> Proposal | None:
    why = "no workers: what inter-process copies cost (cheap samples are fastest without)"
    return with_workers(space.baseline, 0), why


def _anchor_cpus(space: Space, trials: list[Trial]) -> Proposal | None:
    return with_workers(space.baseline, space.cpus), f"one worker per usable CPU ({space.cpus})"


#: tune's ladder (``_explore``) then takes one more rung, at this many per CPU: its trials cost
#: only the search's budget, not training time, and a pool deeper still can pay (skewed cost on
#: 2 CPUs: 16 workers 7-16% above 8 in 4 of 5 interleaved rounds, where 8 ended the ladder:
#: ``benchmarks/results/issue17/compare-quick-1207g``). The bisection then looks between.
LADDER_CPUS = 8


def _explore(space: Space, trials: list[Trial]) -> Proposal | None:
    """Go past the largest count tried while it is the fastest. Latency-bound (its workers
    mostly wait) and gaining more than the noise on its last step: to the count the scaling
    predicts (``scaling.step_up``). CPU-bound: one more worker than CPUs, then twice, three and
    ``POOL_CPUS`` times the CPUs, then ``LADDER_CPUS`` times, while the top stays fastest
    (gaps in the workers' I/O, and a deeper pool against uneven samples, can pay past the core
    count by less than short trials resolve)."""
    main = series(space, trials)
    top = max(main, key=lambda t: t.config.num_workers, default=None)
    if top is None or top.config.num_workers == 0:
        return None
    kind = bottleneck(top, space.cpus)
    if kind == "cpu" and top.worker_demand_mean < WAITING_DEMAND:
        # Each worker mostly waits; their number fills the CPUs. More may still overlap more
        # waits (the CPU time per sample does not grow with the count): step up as for waiting
        # workers, and the noise check ends the climb where the gain ends.
        kind = "latency"
    best = fastest(main)
    w = top.config.num_workers
    # One waiting worker is only as fast as none (one request at a time, as on a rank's single
    # CPU): a tie with fewer workers does not stop the step up when the workers mostly wait.
    # Nor does one on the CPU-bound ladder past the CPUs, where a few percent are at stake and
    # two short trials' order is the noise's (skewed cost: 2 and 3 workers within 1% of each
    # other, either ahead, and 8 some 10% above both, side by side).
    climbing = kind == "latency" or (kind == "cpu" and w >= space.cpus)
    if best is not top and (not climbing or best is None or beats(best, top)):
        return None
    if threads_win(space, top, trials):
        return None  # a few threaded workers beat it: more processes would only cost memory
    if kind == "cpu" and w >= space.cpus:
        rungs = (
            space.cpus + 1,
            *(k * space.cpus for k in range(2, POOL_CPUS + 1)),
            LADDER_CPUS * space.cpus,
        )
        ladder = [c for c in rungs if c > w]
        if not ladder:
            return None
        why = (
            "one more worker than CPUs, to fill I/O gaps"
            if ladder[0] == space.cpus + 1
            else f"{w} workers as fast as any, within the noise: {ladder[0]} may fill more gaps"
        )
        return with_workers(space.baseline, ladder[0]), why
    lower = [t for t in main if 0 < t.config.num_workers < w]
    if lower and not beats(top, max(lower, key=lambda t: t.config.num_workers)):
        return None
    if kind == "latency":
        step = scaling.step_up(space, trials, top)
        if step is None:
            return None
        n, how = step
        why = (
            f"workers at {w} mostly wait ({top.worker_cpu_mean:.0%} CPU each, "
            f"{top.worker_demand_mean - top.worker_cpu_mean:.0%} queued for one): {how}"
        )
        return with_workers(space.baseline, n), why
    if kind == "unknown":
        n = min(2 * w, scaling.ceiling(space, trials, top, cpu=False).workers)
        why = f"workers at {w} neither saturate the CPUs nor mostly wait: try more"
        return (with_workers(space.baseline, n), why) if n > w else None
    return None


def _one_worker(space: Space, trials: list[Trial]) -> Proposal | None:
    """When no workers beat one per CPU, check whether a single worker helps at all."""
    best = fastest(series(space, trials))
    if best is not None and best.config.num_workers == 0 and space.cpus > 1:
        why = "one worker: does moving the work off the main process pay?"
        return with_workers(space.baseline, 1), why
    return None


def _cpu_neighbour(space: Space, trials: list[Trial]) -> Proposal | None:
    best = fastest(series(space, trials))
    if best is None or best.config.num_workers != space.cpus or space.cpus < 2:
        return None
    if bottleneck(best, space.cpus) in ("cpu", "main-process"):
        return with_workers(
            space.baseline, space.cpus - 1
        ), "one worker fewer, leaving a core for the main process"
    return None


def _refine(space: Space, trials: list[Trial]) -> Proposal | None:
    """Bisect where a better or cheaper answer may lie, down to counts 25% apart: between the
    best count and the next higher one tried (the peak may lie between), and between the
    fewest workers within the noise of the best and the next lower count, unless the step up
    from that one scaled linearly (then nothing between is as fast). Only counts that end an
    epoch's round are tried (``rounds.midway``)."""
    main = series(space, trials)
    best = fastest(main)
    if best is None or best.config.num_workers == 0 or threads_win(space, best, trials):
        return None
    b = best.config.num_workers
    by_count = {t.config.num_workers: t for t in main}
    low = min(c for c in by_count if c > 0 and not beats(best, by_count[c]))
    higher = [c for c in sorted(by_count) if c > b]
    lower = [
        c
        for c in sorted(by_count)
        if 0 < c < low and _peak_may_be_below(by_count[low], by_count[c])
    ]
    pairs = ([(b, higher[0])] if higher else []) + ([(low, lower[-1])] if lower else [])
    for near, other in pairs:
        mid = rounds.midway(min(near, other), max(near, other), space.epoch_batches)
        if abs(other - near) > max(1, near // 4) and mid is not None:
            what = "the best so far" if near == b else "the fewest workers as fast as the best"
            return with_workers(space.baseline, mid), f"between {what} ({near}) and {other}"
    return None


def _peak_may_be_below(best: Trial, lower: Trial) -> bool:
    """The lower count was within the noise of the best, or the step up from it scaled less
    than linearly (the curve was already bending, so its top may lie between them)."""
    if not beats(best, lower) or lower.median <= 0:
        return True
    gained = best.median / lower.median
    return gained < 0.8 * best.config.num_workers / lower.config.num_workers


def _waiting_best(space: Space, trials: list[Trial]) -> Trial | None:
    """The fastest processes-only trial with workers, when its workers mostly wait."""
    best = fastest([t for t in series(space, trials) if t.config.num_workers > 0])
    if best is None or bottleneck(best, space.cpus) != "latency":
        return None
    return best


def _threads(space: Space, trials: list[Trial]) -> Proposal | None:
    """With leave to recommend threads, as soon as workers are seen mostly waiting: overlap the
    waits on threads inside a few workers instead of in more processes, doubling the threaded
    workers while they gain and still mostly wait."""
    if space.max_threads <= 1 or not space.allow_threads:
        return None
    best = _waiting_best(space, trials)
    if best is None:
        return None
    t_max = space.max_threads
    ours = [t for t in threaded(trials) if t.config.threads == t_max]
    if not ours:
        w = min(space.cpus, best.config.num_workers)
        why = (
            f"workers at {best.config.num_workers} mostly wait ({best.worker_cpu_mean:.0%} CPU "
            f"each): {w} workers fetching on {t_max} threads each overlap as many waits for a "
            "fraction of the memory"
        )
        return with_workers(space.baseline, w, threads=t_max), why
    if space.consumer and any(covers(t) for t in ours):
        return None
    top = max(ours, key=lambda t: t.config.num_workers)
    w = top.config.num_workers
    lower = [t for t in ours if t.config.num_workers < w]
    if fastest(ours) is not top or bottleneck(top, space.cpus) != "latency":
        return None
    if lower and not beats(top, max(lower, key=lambda t: t.config.num_workers)):
        return None
    why = (
        f"{w} threaded workers still mostly wait ({top.worker_cpu_mean:.0%} CPU each): "
        f"twice the workers, {t_max} threads each"
    )
    return with_workers(space.baseline, 2 * w, threads=t_max), why


def threads_report(space: Space, trials: list[Trial]) -> Proposal | None:
    """Without leave, once the processes are searched: one threaded trial with twice the
    requests in flight of the best worker count, so the report can say what threads would
    give, measured (it is never recommended)."""
    if space.max_threads <= 1 or space.allow_threads or threaded(trials):
        return None
    procs = [t for t in series(space, trials) if t.config.num_workers > 0]
    best = fastest(procs)
    if best is None or not any(bottleneck(t, space.cpus) == "latency" for t in procs):
        return None  # the workers never mostly waited: threads would only compete for CPUs
    t_max, b = space.max_threads, best.config.num_workers
    w = min(b, max(1, math.ceil(2 * b / t_max)))
    keep = (
        f"1 worker on {t_max} threads keeps"
        if w == 1
        else f"{w} workers on {t_max} threads each keep"
    )
    why = (
        f"for the report: {keep} {w * t_max / b:.3g}× the requests in flight of {b} worker "
        f"process{'es' if b > 1 else ''} (threads are recommended only with --threads)"
    )
    return with_workers(space.baseline, w, threads=t_max), why


def _prefetch(space: Space, trials: list[Trial]) -> Proposal | None:
    best = fastest(eligible(space, trials))
    if best is None or best.config.num_workers == 0:
        return None
    pf = best.config.prefetch_factor or 2
    deeper = replace(best.config, prefetch_factor=pf * 2)
    shallower = [t for t in trials if t.config == replace(best.config, prefetch_factor=pf // 2)]
    if pf >= 8 or (shallower and not beats(best, shallower[0]) and pf > 2):
        return None
    return deeper, f"a deeper queue (prefetch_factor={pf * 2}) absorbs uneven per-sample cost"


def _reorder(space: Space, trials: list[Trial]) -> Proposal | None:
    best = fastest(eligible(space, trials))
    if not space.allow_reorder or best is None or best.config.num_workers == 0:
        return None
    return replace(best.config, in_order=False), "batches in completion order, past slow samples"


FASTEST_STEPS = (
    _anchor_none,
    _anchor_cpus,
    _one_worker,
    _threads,
    _explore,
    _cpu_neighbour,
    _refine,
    _prefetch,
    _reorder,
    threads_report,
)


CONSUMER_STEPS = (_anchor_none, _threads, double, bisect, threads_report)


ONLINE_STEPS = (fewer, copies, _threads, double, bisect, zero)
