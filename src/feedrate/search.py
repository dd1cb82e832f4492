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
bisecting; without one, the fastest, where among
configurations within the noise of the fastest the cheapest wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from feedrate.config import LoaderConfig
from feedrate.results import Trial

#: A gain must beat this relative margin (or the trials' own spread, if wider) to count.
NOISE_FLOOR = 0.03
#: With a consumer, a configuration keeps it fed when it waits for data at most this share of time.
STALL_MARGIN = 0.05
#: With a consumer, doubling the workers must cut the stall by at least this much to go on.
STALL_GAIN = 0.03
#: With a consumer, latency-bound workers are aimed at the consumer's pace with this to spare.
AIM_MARGIN = 0.1
#: Batches from this many bytes cost workers real CPU time to copy into shared memory (and the
#: main process to map): online, busy workers making them may be slower than no workers.
BIG_BATCH = 2**20
#: Online, no workers are tried after one worker fed the loop only when the stall predicted
#: without them (``zero_stall``) is below this: a bad trial costs training time.
ZERO_STALL = 0.25
#: /dev/shm needed per batch in flight, over the batch's own bytes (headroom for fragmentation).
SHM_HEADROOM = 1.5
#: Open files the main process holds per worker (queues, pipes) and per batch in flight (one per
#: tensor under the file_descriptor sharing strategy; a batch usually holds a few tensors).
FDS_PER_WORKER, FDS_PER_BATCH, FDS_BASE = 4, 4, 64

Bottleneck = Literal["no-workers", "main-process", "cpu", "latency", "unknown"]
Proposal = tuple[LoaderConfig, str]


@dataclass(frozen=True)
class Space:
    """What may be tried: ``cpus`` usable, the user's ``baseline`` (its other settings are kept),
    the worker cap and the memory and /dev/shm budgets in bytes (None = unbounded)."""

    cpus: int
    baseline: LoaderConfig
    max_workers: int
    memory_budget: int | None = None
    shm_budget: int | None = None
    fd_budget: int | None = None
    consumer: bool = False
    allow_reorder: bool = False
    #: Threads per worker a threaded trial may use (1: threads cannot help this loader, e.g.
    #: an IterableDataset, or a thread-safety check failed); whether they may be recommended.
    max_threads: int = 1
    allow_threads: bool = False


def noise(a: Trial, b: Trial) -> float:
    """The relative difference two trials must exceed to be told apart: twice the standard
    error of their difference (from each trial's windows), and at least ``NOISE_FLOOR``."""
    return max(NOISE_FLOOR, 2 * math.hypot(a.noise, b.noise))


def beats(b: Trial, a: Trial) -> bool:
    """``b`` is faster than ``a`` by more than the noise of either."""
    return b.median > a.median * (1 + noise(a, b))


def covers(t: Trial) -> bool:
    return t.measured and t.stall_fraction is not None and t.stall_fraction <= STALL_MARGIN


def bottleneck(t: Trial, cpus: int) -> Bottleneck:
    """What limits ``t``, from where its CPU time went (1.0 = one core busy)."""
    if not t.measured:
        return "unknown"
    if t.config.num_workers == 0:
        return "no-workers"
    if t.main_cpu >= 0.85:
        return "main-process"
    own = t.main_cpu + t.workers_cpu
    if own >= 0.85 * cpus or t.worker_demand_mean >= 0.8:
        return "cpu"  # the workers use, or queue for, a core all the time
    if t.worker_demand_mean < 0.5:
        return "latency"  # workers mostly asleep: waiting on I/O, not on a CPU
    if (t.system_busy_cpus or 0.0) >= 0.85 * cpus:
        return "cpu"  # computing workers on CPUs that others fill: more workers only compete
    return "unknown"


def _with(base: LoaderConfig, workers: int, **changes: object) -> LoaderConfig:
    """``workers`` workers, the baseline's other settings. Trials keep their workers alive
    between epochs: restarting them is start-up, judged apart (``advice.judge_persistent``),
    and repeated restarts would only make trials slower."""
    pf = base.prefetch_factor if base.num_workers else None
    cfg = LoaderConfig(workers, base.pin_memory, pf, workers > 0, base.in_order, base.threads)
    return replace(cfg, **changes) if changes else cfg  # type: ignore[arg-type]


def series(space: Space, trials: list[Trial]) -> list[Trial]:
    """Measured trials that vary only num_workers from the baseline's other settings."""
    return [
        t for t in trials if t.measured and _with(space.baseline, t.config.num_workers) == t.config
    ]


def eligible(space: Space, trials: list[Trial]) -> list[Trial]:
    """Measured trials that may be recommended: threaded ones only when allowed."""
    return [t for t in trials if t.measured and (space.allow_threads or t.config.threads == 1)]


def threaded(trials: list[Trial]) -> list[Trial]:
    return [t for t in trials if t.measured and t.config.threads > 1]


def _threads_win(space: Space, top: Trial, trials: list[Trial]) -> bool:
    """Threads may be recommended and one threaded trial already beats ``top``."""
    return space.allow_threads and any(beats(t, top) for t in threaded(trials))


def fastest(trials: list[Trial]) -> Trial | None:
    measured = [t for t in trials if t.measured]
    return max(measured, key=lambda t: t.median) if measured else None


def predict_over_budget(space: Space, trials: list[Trial], cfg: LoaderConfig) -> str | None:
    """Why ``cfg`` would exceed a budget, predicted from measured per-process memory and batch
    bytes; None when it fits or nothing is known yet."""
    measured = [t for t in trials if t.measured]
    per_worker = max((t.worker_uss_max_bytes or 0 for t in measured), default=0)
    main = max((t.main_uss_bytes or 0 for t in measured), default=0)
    batch = max((t.batch_bytes or 0 for t in measured), default=0)
    w, pf = cfg.num_workers, cfg.prefetch_factor or 0
    memory = main + w * per_worker
    if space.memory_budget is not None and per_worker and memory > space.memory_budget:
        return (
            f"predicted memory {memory / 2**30:.2f} GiB over the budget of "
            f"{space.memory_budget / 2**30:.2f} GiB ({per_worker / 2**20:.0f} MiB per worker)"
        )
    shm = int(batch * w * pf * SHM_HEADROOM)
    if space.shm_budget is not None and batch and shm > space.shm_budget:
        return (
            f"predicted /dev/shm use {shm / 2**20:.0f} MiB over the budget of "
            f"{space.shm_budget / 2**20:.0f} MiB ({w} workers × {pf} batches of "
            f"{batch / 2**20:.1f} MiB in flight)"
        )
    fds = FDS_BASE + w * (FDS_PER_WORKER + pf * FDS_PER_BATCH)
    if space.fd_budget is not None and w and fds > space.fd_budget:
        return (
            f"predicted {fds} open files over the budget of {space.fd_budget} "
            "(80% of the soft limit; raise it with ulimit -n)"
        )
    return None


def propose(space: Space, trials: list[Trial]) -> Proposal | None:
    """The next configuration to try and why, or None when the search is done."""
    return _first(_consumer_steps if space.consumer else _fastest_steps, space, trials)


def _first(
    steps: tuple[Callable[[Space, list[Trial]], Proposal | None], ...],
    space: Space,
    trials: list[Trial],
) -> Proposal | None:
    """The first step's proposal that is new and within max_workers."""
    tried = {t.config for t in trials}
    for step in steps:
        proposal = step(space, trials)
        if (
            proposal is not None
            and proposal[0] not in tried
            and proposal[0].num_workers <= space.max_workers
        ):
            return proposal
    return None


def _anchor_none(space: Space, trials: list[Trial]) -> Proposal | None:
    return _with(
        space.baseline, 0
    ), "no workers: cheap samples are fastest without inter-process copies"


def _anchor_cpus(space: Space, trials: list[Trial]) -> Proposal | None:
    return _with(space.baseline, space.cpus), f"one worker per usable CPU ({space.cpus})"


def _explore(space: Space, trials: list[Trial]) -> Proposal | None:
    """Go past the largest count tried while it is the fastest, its last step up gained more
    than the noise, and its workers mostly wait."""
    main = series(space, trials)
    top = max(main, key=lambda t: t.config.num_workers, default=None)
    if top is None or top.config.num_workers == 0 or fastest(main) is not top:
        return None
    w = top.config.num_workers
    lower = [t for t in main if 0 < t.config.num_workers < w]
    if lower and not beats(top, max(lower, key=lambda t: t.config.num_workers)):
        return None
    if _threads_win(space, top, trials):
        return None  # a few threaded workers beat it: more processes would only cost memory
    kind = bottleneck(top, space.cpus)
    if kind == "latency":
        step = _step_up(space, top, max(lower, key=lambda t: t.config.num_workers, default=None))
        why = (
            f"workers at {w} mostly wait ({top.worker_cpu_mean:.0%} CPU each, "
            f"{top.worker_demand_mean - top.worker_cpu_mean:.0%} queued for one): "
            f"{'four times' if step == 4 else 'twice'} the workers overlap more waits"
        )
        return _with(space.baseline, min(step * w, space.max_workers)), why
    if kind == "cpu" and w == space.cpus:
        return _with(space.baseline, w + 1), "one more worker than CPUs, to fill I/O gaps"
    if kind == "unknown":
        why = f"workers at {w} neither saturate the CPUs nor mostly wait: try more"
        return _with(space.baseline, min(2 * w, space.max_workers)), why
    return None


def _step_up(space: Space, top: Trial, prev: Trial | None) -> int:
    """Quadruple the workers while the last step scaled nearly linearly and the CPU time
    projected at four times the workers still fits the machine; else double."""
    projected = 4 * (top.main_cpu + top.workers_cpu)
    if prev is None:
        linear = projected <= 0.5 * space.cpus
    else:
        gained = top.median / prev.median if prev.median > 0 else 0.0
        linear = gained >= 0.8 * top.config.num_workers / prev.config.num_workers
    return 4 if linear and projected <= 0.85 * space.cpus else 2


def _one_worker(space: Space, trials: list[Trial]) -> Proposal | None:
    """When no workers beat one per CPU, check whether a single worker helps at all."""
    best = fastest(series(space, trials))
    if best is not None and best.config.num_workers == 0 and space.cpus > 1:
        return _with(
            space.baseline, 1
        ), "one worker: does moving the work off the main process pay?"
    return None


def _cpu_neighbour(space: Space, trials: list[Trial]) -> Proposal | None:
    best = fastest(series(space, trials))
    if best is None or best.config.num_workers != space.cpus or space.cpus < 2:
        return None
    if bottleneck(best, space.cpus) in ("cpu", "main-process"):
        return _with(
            space.baseline, space.cpus - 1
        ), "one worker fewer, leaving a core for the main process"
    return None


def _refine(space: Space, trials: list[Trial]) -> Proposal | None:
    """Bisect between the best count and a tried neighbour more than 25% away: the next higher
    one, and the next lower one unless the best scaled linearly from it (then the peak is not
    below)."""
    main = series(space, trials)
    best = fastest(main)
    if best is None or best.config.num_workers == 0 or _threads_win(space, best, trials):
        return None
    b = best.config.num_workers
    by_count = {t.config.num_workers: t for t in main}
    higher = [c for c in sorted(by_count) if c > b]
    lower = [c for c in sorted(by_count) if 0 < c < b and _peak_may_be_below(best, by_count[c])]
    for other in ([higher[0]] if higher else []) + ([lower[-1]] if lower else []):
        if abs(other - b) > max(1, b // 4):
            mid = (b + other) // 2
            return _with(space.baseline, mid), f"between the best so far ({b}) and {other}"
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
        return _with(space.baseline, w, threads=t_max), why
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
    return _with(space.baseline, 2 * w, threads=t_max), why


def _threads_report(space: Space, trials: list[Trial]) -> Proposal | None:
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
    why = (
        f"for the report: {w} workers on {t_max} threads each keep twice the requests in "
        f"flight of {b} worker processes (threads are recommended only with --threads)"
    )
    return _with(space.baseline, w, threads=t_max), why


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


_fastest_steps = (
    _anchor_none,
    _anchor_cpus,
    _one_worker,
    _threads,
    _explore,
    _cpu_neighbour,
    _refine,
    _prefetch,
    _reorder,
    _threads_report,
)


def _double(space: Space, trials: list[Trial]) -> Proposal | None:
    """Consumer mode: more workers until one configuration keeps the consumer fed: twice as
    many, or for latency-bound workers the count aimed at the consumer's pace (``_aim``)."""
    main = series(space, trials)
    if not main or any(covers(t) for t in main):
        return None
    if space.allow_threads and any(covers(t) for t in threaded(trials)):
        return None  # fewer threaded workers keep it fed: more processes would only cost
    top = max(main, key=lambda t: t.config.num_workers)
    w = top.config.num_workers
    lower = [t for t in main if t.config.num_workers < w]
    if lower and w > 1:
        prev = max(lower, key=lambda t: t.config.num_workers)
        cut = (prev.stall_fraction or 0.0) - (top.stall_fraction or 0.0)
        if cut < STALL_GAIN and not beats(top, prev):
            # The last doubling neither cut the stall nor delivered more (a step that takes
            # next to no time stalls ~100% at any rate): more workers cannot feed it.
            return None
    nxt, more = (1 if w == 0 else min(2 * w, space.max_workers)), "more workers"
    if w and bottleneck(top, space.cpus) == "latency":
        nxt = min(_aim(space, top), space.max_workers)
        more = f"{nxt}, as many as the consumer's pace needs if they scale (they mostly wait)"
    return (
        _with(space.baseline, nxt),
        f"{w} workers leave the consumer waiting {top.stall_fraction or 0:.0%} of the time: {more}",
    )


def _aim(space: Space, top: Trial) -> int:
    """Latency-bound workers scale about linearly: the count that would deliver the consumer's
    own pace (its rate without the stall) with ``AIM_MARGIN`` to spare, between x1.25 and x16
    the count tried, and no more than the CPU time projected at that count leaves room for.
    Every starved trial costs (training time online, budget offline): aim, don't crawl."""
    w = top.config.num_workers
    stall = min(top.stall_fraction or 0.0, 0.99)
    pace = top.median / (1 - stall) if top.median > 0 else math.inf
    need = pace / top.median * (1 + AIM_MARGIN) if top.median > 0 else 16.0
    factor = min(16.0, max(1.25, need))
    cpu = top.main_cpu + top.workers_cpu
    if cpu > 0:
        factor = min(factor, max(2.0, 0.85 * space.cpus / cpu))
    return max(w + 1, math.ceil(w * factor - 1e-9))


def _bisect(space: Space, trials: list[Trial]) -> Proposal | None:
    main = series(space, trials)
    fed = [t.config.num_workers for t in main if covers(t)]
    if not fed:
        return None
    c = min(fed)
    starved = [t.config.num_workers for t in main if not covers(t) and t.config.num_workers < c]
    if not starved or c - max(starved) <= 1:
        return None
    mid = (c + max(starved)) // 2
    return _with(space.baseline, mid), f"fewer workers ({mid}) that may still keep the consumer fed"


_consumer_steps = (_anchor_none, _threads, _double, _bisect, _threads_report)


def _fewer(space: Space, trials: list[Trial]) -> Proposal | None:
    """Online: the fewest workers tried keep the consumer fed; half as many may too."""
    main = series(space, trials)
    fed = [t.config.num_workers for t in main if covers(t)]
    if not fed or min(fed) == 0:
        return None
    c = min(fed)
    if any(not covers(t) and t.config.num_workers < c for t in main):
        return None  # _bisect's ground
    if c == 1 and zero_stall(next(t for t in main if t.config.num_workers == 1)) > ZERO_STALL:
        return None  # the worker's CPU time, moved into the loop, would stall it
    return _with(space.baseline, c // 2), f"{c} workers keep the step fed: fewer may too"


def zero_stall(t: Trial) -> float:
    """The stall predicted without workers for a loop fed by ``t``: each second of the loop would
    also do the CPU work the workers did in it (their inter-process copies aside)."""
    work = t.workers_cpu
    step = 1.0 - (t.stall_fraction or 0.0)
    return work / (work + step) if work + step > 0 else 0.0


def _zero(space: Space, trials: list[Trial]) -> Proposal | None:
    """Online, once more workers stopped helping and none feeds the loop: no workers at all
    (cheap samples are fastest without inter-process copies). Not when the workers mostly
    waited and more of them did help (latency-bound: without them the loop would wait on every
    read), nor when busy workers made small batches (the work itself is the cost); idle workers
    that more of them did not speed up, or busy ones making big batches, point at the copies
    between processes instead."""
    main = series(space, trials)
    if not main or any(covers(t) for t in main) or any(t.config.num_workers == 0 for t in main):
        return None
    best = fastest(main)
    if best is None:
        return None
    kind = bottleneck(best, space.cpus)
    fewest = min(main, key=lambda t: t.config.num_workers)
    if kind == "latency" and best is not fewest and beats(best, fewest):
        return None
    if kind == "cpu" and (best.batch_bytes or 0) < BIG_BATCH:
        return None
    return _with(space.baseline, 0), "more workers stopped helping: no workers at all?"


_online_steps = (_fewer, _threads, _double, _bisect, _zero)


def propose_online(space: Space, trials: list[Trial]) -> Proposal | None:
    """``autotune``'s next configuration while training runs: from where it started, fewer
    workers while the step stays fed, more while the stall falls (threads where allowed), then
    bisect; None when settled. No anchors: every trial costs training time."""
    return _first(_online_steps, space, trials)


def choose(space: Space, trials: list[Trial]) -> Trial | None:
    """The recommendation: with a consumer the fewest workers (then least memory) that keep it
    fed; without one, or when none keeps it fed, the cheapest within the noise of the fastest
    (with a consumer its rate is what it delivered to the consumer, so the fastest stalls least
    and a stall a few points lower is no reason to pay for more workers)."""
    measured = eligible(space, trials)
    if not measured:
        return None
    if space.consumer:
        fed = [t for t in measured if covers(t)]
        if fed:
            return min(
                fed,
                key=lambda t: (
                    t.config.num_workers,
                    t.config.threads,
                    bool(t.config.pin_memory),
                    t.memory_bytes,
                ),
            )
    top = max(measured, key=lambda t: t.median)
    equal = [t for t in measured if not beats(top, t)]
    return min(
        equal,
        key=lambda t: (
            t.config.num_workers,
            t.config.threads,
            t.config.prefetch_factor or 0,
            bool(t.config.pin_memory),  # locked memory: only where it pays
            t.memory_bytes,
        ),
    )
