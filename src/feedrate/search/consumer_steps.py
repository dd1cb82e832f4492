"""With a consumer (tune's ``--rate``/``--step``, and autotune, whose consumer is the training
loop): the steps towards the fewest workers that keep it fed. More workers while they cut the
stall (latency-bound ones aimed at the consumer's pace), a deeper pool of CPU-bound ones on
small batches, then a bisection between the fewest that feed it and the most that starve it.
Pure decisions over measured trials, as in ``steps``.
"""

from __future__ import annotations

import math

from feedrate.results.trial import Trial
from feedrate.search import rounds, scaling
from feedrate.search.bottleneck import bottleneck
from feedrate.search.online_steps import hands_over, idle_stall, receiving
from feedrate.search.space import (
    AIM_MARGIN,
    BIG_BATCH,
    STALL_GAIN,
    STALL_MARGIN,
    Proposal,
    Space,
    beats,
    covers,
    series,
    slows_the_loop,
    threaded,
    with_workers,
)
from feedrate.units import counted

#: CPU-bound workers are tried up to this many per CPU while each count is no slower (tune's
#: ladder past the CPUs; online, doubled on small batches): past a slow sample, more batches in
#: flight keep the CPUs busy (skewed cost on 2 CPUs: 8 workers 5-9% above 2 and 4, side by side,
#: where tune stopped at 4 or 6). The repeats of near-ties then tell if it paid.
POOL_CPUS = 4


def double(space: Space, trials: list[Trial]) -> Proposal | None:
    """Consumer mode: more workers until one keeps the consumer fed: twice as many (CPU-bound:
    up to ``POOL_CPUS`` per CPU), or for latency-bound ones the count aimed at its pace."""
    main = series(space, trials)
    if not main or any(covers(t) for t in main):
        return None
    if space.allow_threads and any(covers(t) for t in threaded(trials)):
        return None  # fewer threaded workers keep it fed: more processes would only cost
    top = max(main, key=lambda t: t.config.num_workers)
    w = top.config.num_workers
    lower = [t for t in main if t.config.num_workers < w]
    # One worker may trail none (its copies) and more still scale; not, online, where the loop's
    # thread is busy receiving what it makes (tabular rows after a re-tune: 1 worker at half
    # the rate of none, then 2, 4 and 7 all behind it), or the worker busy handing it over
    # (large tensors after a re-tune: 1, 2, 4 and 8 tried). Offline there is no such reading.
    online = top.wait_cpu is not None
    kind = bottleneck(top, space.cpus) if w else "no-workers"
    none = next((t for t in main if t.config.num_workers == 0), None)
    if online and kind == "cpu" and w >= space.cpus and none is not None and beats(none, top):
        return None  # CPU-bound at a worker per CPU or more and slower than none: more queue
    if lower and (w > 1 or (online and (receiving(top) or hands_over(space, top) is not None))):
        prev = max(lower, key=lambda t: t.config.num_workers)
        if beats(prev, top) or (slows_the_loop(top, prev) and not beats(top, prev)):
            return None  # they compete for the CPUs (with the loop too): more would compete more
        cut = (prev.stall_fraction or 0.0) - (top.stall_fraction or 0.0)
        if online and top.median < prev.median:  # a real cut delivers more: the loop's step grew
            cut = 0.0  # (large batches, 2 to 4 workers: 15% to 12% stall, 490 to 477 samples/s)
        if cut < STALL_GAIN and not beats(top, prev):  # neither less stall nor more delivered:
            return _pool(space, top, prev)  # more cannot feed it, unless a deeper pool may
    if online and kind == "latency" and idle_stall(top) <= STALL_MARGIN:
        return None  # what the loop waits for is its own receiving: more workers add to it
    if kind == "cpu" and 2 * w > POOL_CPUS * space.cpus:
        return None  # CPU-bound past the deepest pool worth trying (``_pool``): more only queue
    hard = scaling.ceiling(space, trials, top, cpu=False)  # memory, /dev/shm, files, tasks
    nxt, more = (1 if w == 0 else 2 * w), "more workers"
    if kind == "latency":
        nxt = _aim(space, top)
        more = f"{nxt}, as many as the consumer's pace needs if they scale (they mostly wait)"
    if nxt > hard.workers:
        nxt, more = hard.workers, f"{more}, up to {hard.workers}: {hard.what}"
    if kind == "latency":  # waiting workers: an epoch's rounds, not the CPUs, set its length
        moved = scaling.onto_a_round(space, w, nxt, hard, more)
        if moved is None:
            return None
        nxt, more = moved
    if nxt <= w:
        return None
    why = (
        f"{counted(w, 'worker')} {'leaves' if w == 1 else 'leave'} the consumer waiting "
        f"{top.stall_fraction or 0:.0%} of the time"
    )
    return with_workers(space.baseline, nxt), f"{why}: {more}"


def _pool(space: Space, top: Trial, prev: Trial) -> Proposal | None:
    """Twice ``top``'s workers: CPU-bound on small batches, no slower than ``prev``, and twice
    its count within ``POOL_CPUS`` per CPU."""
    w = top.config.num_workers
    if (
        2 * w > min(POOL_CPUS * space.cpus, space.max_workers)
        or w < space.cpus
        or beats(prev, top)
        or (top.batch_bytes or 0) >= BIG_BATCH
        or bottleneck(top, space.cpus) != "cpu"
    ):
        return None
    why = f"{w} workers keep the CPUs busy and the loop waiting, no slower than "
    why += f"{prev.config.num_workers}: {2 * w} keep more batches in flight past slow samples"
    return with_workers(space.baseline, 2 * w), why


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
    cpu = top.own_cpu
    if cpu > 0:
        factor = min(factor, max(2.0, 0.85 * space.cpus / cpu))
    return max(w + 1, math.ceil(w * factor - 1e-9))


def bisect(space: Space, trials: list[Trial]) -> Proposal | None:
    main = series(space, trials)
    fed = [t.config.num_workers for t in main if covers(t)]
    if not fed:
        return None
    c = min(fed)
    starved = [t.config.num_workers for t in main if not covers(t) and t.config.num_workers < c]
    if not starved or c - max(starved) <= 1:
        return None
    mid = rounds.midway(max(starved), c, space.epoch_batches)
    if mid is None:
        return None  # every count between makes an epoch in the rounds of one of the two
    return with_workers(
        space.baseline, mid
    ), f"fewer workers ({mid}) that may still keep the consumer fed"
