"""How far latency-bound workers can go in one step. While the rate per worker holds (the last
step scaled about linearly), the rate, and with it the CPU time, grows with the count, so the
count that meets a ceiling (the CPUs, the memory, /dev/shm or open-file budget, max_workers)
is predicted from what was measured: the search goes there instead of doubling its way up.
Pure functions over measured trials."""

from __future__ import annotations

import math
from dataclasses import dataclass

from feedrate.results.trial import Trial
from feedrate.search import rounds
from feedrate.search.space import (
    FDS_BASE,
    FDS_PER_BATCH,
    FDS_PER_WORKER,
    SHM_HEADROOM,
    Space,
    memory_room,
    peaks,
    series,
    workers_within_tasks,
)
from feedrate.units import counted

#: The share of the usable CPUs a step's projected CPU time may fill.
CPU_CEILING = 0.85

#: A step scaled about linearly when its rate grew by at least this share of the workers' ratio.
LINEAR = 0.8

#: One step multiplies the workers by at most this (a projection from few workers is rough).
MAX_FACTOR = 16

#: A ceiling within this factor of the workers tried is reached: no step up is worth a trial.
NEAR = 1.25

#: A stream's first epoch starts with at most this many workers per usable CPU, and this many
#: more than the CPUs: the projection rests on 2 workers' first items, and what a worker costs
#: in memory is not measured yet (the search goes on from there, an epoch a trial).
STREAM_START_PER_CPU = 4
STREAM_START_OVER_CPUS = 32


@dataclass(frozen=True)
class Ceiling:
    """The count at which the first budget would be met, and that budget in words."""

    workers: int
    what: str


def lower_neighbour(space: Space, trials: list[Trial], top: Trial) -> Trial | None:
    """The measured processes-only trial with the most workers below ``top``'s, no workers
    included (the main process fetching alone counts as one worker)."""
    w = top.config.num_workers
    lower = [t for t in series(space, trials) if t.config.num_workers < w]
    return max(lower, key=lambda t: t.config.num_workers, default=None)


def scaled_linearly(top: Trial, prev: Trial | None) -> bool:
    """From ``prev`` to ``top`` the rate grew about as much as the workers (no workers counts
    as one); without ``prev``, nothing says so."""
    if prev is None or prev.median <= 0:
        return False
    ratio = top.config.num_workers / max(1, prev.config.num_workers)
    return top.median / prev.median >= LINEAR * ratio


def ceiling(space: Space, trials: list[Trial], top: Trial, *, cpu: bool = True) -> Ceiling:
    """The worker count, at ``top``'s other settings, whose projected use first meets a
    ceiling: its CPU time (main process and workers, growing with the rate) at
    ``CPU_CEILING`` of the usable CPUs (unless ``cpu`` is False), the memory budget (per
    worker as measured), the /dev/shm budget (batches in flight), the open-file budget, the
    tasks budget, ``max_workers``, or half way to the fewest workers above ``top``'s whose
    trial failed (a bisection towards a limit no budget saw)."""
    w = top.config.num_workers
    pf = top.config.prefetch_factor or 2
    found = [Ceiling(space.max_workers, space.cap or f"max_workers={space.max_workers}")]
    own = top.own_cpu
    if cpu and own > 0:
        n = math.floor(w * CPU_CEILING * space.cpus / own)
        found.append(Ceiling(n, f"{CPU_CEILING:.0%} of the {counted(space.cpus, 'usable CPU')}"))
    seen = peaks(trials)
    room = memory_room(space, seen)
    if room is not None and seen.per_worker:
        n = room // seen.per_worker
        mib = seen.per_worker / 2**20
        found.append(Ceiling(n, f"the memory budget ({mib:.0f} MiB per worker)"))
    if space.shm_budget is not None and seen.batch:
        n = int(space.shm_budget // (seen.batch * pf * SHM_HEADROOM))
        found.append(Ceiling(n, "the /dev/shm budget"))
    if space.fd_budget is not None:
        n = (space.fd_budget - FDS_BASE) // (FDS_PER_WORKER + pf * FDS_PER_BATCH)
        found.append(Ceiling(n, "the open-file budget"))
    fit = workers_within_tasks(space, top.config.threads)
    if fit is not None:
        found.append(Ceiling(fit, "the budget of processes and threads (pids.max, ulimit -u)"))
    failed = [t.config.num_workers for t in trials if t.error and _above(t, top)]
    if failed:  # a start that failed (EAGAIN, ENOMEM, a worker killed): a limit lies below it
        f = min(failed)
        found.append(Ceiling((w + f) // 2, f"the midpoint to the {f} workers that failed"))
    return min(found, key=lambda c: c.workers)


def _above(t: Trial, top: Trial) -> bool:
    """``t`` has more workers than ``top``, of as many threads."""
    return t.config.num_workers > top.config.num_workers and t.config.threads == top.config.threads


def step_up(space: Space, trials: list[Trial], top: Trial) -> tuple[int, str] | None:
    """The next worker count for latency-bound ``top`` and why. Where the last step scaled
    linearly: the count that meets the first ceiling (at most ``MAX_FACTOR`` times ``top``'s);
    once the projected CPU ceiling is reached, twice the workers (workers that still mostly wait
    leave gaps on the CPUs, and the noise check stops the climb where the gain ends). Where it
    did not: twice the workers, unless the step was longer than a doubling (then the peak lies
    below it, for the bisection). Never past a hard ceiling (memory, /dev/shm, open files,
    ``max_workers``); None once one is reached. Each count is moved onto an epoch's round
    (``rounds.on_a_round``): a count between two that end one only adds processes."""
    w = top.config.num_workers
    prev = lower_neighbour(space, trials, top)
    hard = ceiling(space, trials, top, cpu=False)
    if hard.workers < w * NEAR:
        return None
    n = min(2 * w, hard.workers)
    up_to = "" if n == 2 * w else f", up to {n}: {hard.what}"
    if not scaled_linearly(top, prev):
        if prev is not None and w > 2 * max(1, prev.config.num_workers):
            return None  # a long step that bent: the peak lies below it (bisected there)
        return onto_a_round(space, w, n, hard, f"twice the workers overlap more waits{up_to}")
    assert prev is not None
    gained = top.median / prev.median
    limit = ceiling(space, trials, top)
    if limit.workers < w * NEAR:
        why = (
            f"{_grew(prev, gained)} and the CPU time projects the CPUs busy: twice the workers, "
            f"while the gain beats the noise{up_to}"
        )
        return onto_a_round(space, w, n, hard, why)
    n = min(limit.workers, MAX_FACTOR * w)
    aim = f"meet {limit.what}" if n == limit.workers else f"head for {limit.what}"
    why = f"{_grew(prev, gained)}: at that rate per worker, {n} workers {aim}"
    return onto_a_round(space, w, n, hard, why)


def onto_a_round(space: Space, w: int, n: int, hard: Ceiling, why: str) -> tuple[int, str] | None:
    """``n`` waiting workers, aimed at from ``w`` (tune's step up, a consumer's aim), moved
    onto an epoch's round within ``hard`` (``rounds.on_a_round``), and ``why`` with where to;
    None where no count up to ``hard`` makes the epoch in fewer rounds than ``w``."""
    batches = space.epoch_batches
    m = rounds.on_a_round(n, batches, above=w, most=hard.workers, reach=NEAR)
    if m <= w:
        return None
    if m != n and batches:
        why += f"; {rounds.the_fewest(m, batches)}"
    return m, why


def _grew(prev: Trial, gained: float) -> str:
    """How the rate changed from ``prev``'s, in words: one worker that waits overlaps no wait,
    and may only match no workers."""
    w = prev.config.num_workers
    was = "no workers" if w == 0 else counted(w, "worker")
    return f"the rate grew ×{gained:.1f} from {was}" if gained >= 1.05 else f"as fast as {was}"


#: What ``stream_start`` read its share from, for a stream.
STREAM_SEEN = "2 workers making the stream's first items were"


def stream_start(
    cpus: int,
    cpu_share: float | None,
    max_workers: int,
    *,
    seen: str = STREAM_SEEN,
    per_cpu: int | None = STREAM_START_PER_CPU,
) -> Ceiling | None:
    """Where a stream's first epoch starts (an IterableDataset's settings change only between
    epochs, so its first epoch runs whole on the count it starts at), from ``cpu_share``, the
    share of their time 2 probe workers making its first items spent on a CPU: the count whose
    workers fill ``CPU_CEILING`` of the usable CPUs, within ``STREAM_START_PER_CPU`` per CPU,
    ``STREAM_START_OVER_CPUS`` over them and ``max_workers``. None where that is not more
    than one worker per usable CPU (the usual start) or nothing was measured (``map_start``:
    the same for a map-style loader)."""
    if cpu_share is None or cpus < 1:
        return None
    most = min(max_workers, cpus + STREAM_START_OVER_CPUS)
    if per_cpu is not None:
        most = min(most, per_cpu * cpus)
    n = most if cpu_share <= 0 else min(most, math.floor(CPU_CEILING * cpus / cpu_share))
    if n <= cpus:
        return None
    return Ceiling(
        n,
        f"{n} workers: {seen} on a CPU {cpu_share:.0%} of the time, so about {n} fill "
        f"{CPU_CEILING:.0%} of the {counted(cpus, 'usable CPU')} (at most {most}; projected, "
        "not measured)",
    )


def map_start(cpus: int, cpu_share: float | None, max_workers: int) -> Ceiling | None:
    """``stream_start`` for a map-style loader, from the share of its time a batch made in the
    main process was on a CPU (the first, or the second where the first was short). Its first
    trial is a stretch of batches, not an epoch (a start too high is left after it), so no
    per-CPU bound holds it: on 2 CPUs, 4 per CPU kept ``remote`` (its batch on a CPU 4% of the
    time) at 8 workers, a third of its rate, for the first 40 batches of
    ``benchmarks/autotune.py``'s epoch, 0.5 s behind the static loader by then."""
    seen = "a batch made in this process was"
    return stream_start(cpus, cpu_share, max_workers, seen=seen, per_cpu=None)
