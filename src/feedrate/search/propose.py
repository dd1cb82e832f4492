"""The search's two entry points and its answer: ``propose`` (tune's next trial), ``propose_online``
(autotune's), ``choose`` (the recommendation), ``unresolved`` (the trial to measure again
before the answer stands) and ``keep`` (the lane autotune keeps for a return).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial
from feedrate.search.space import (
    NOISE_FLOOR,
    RESOLVED_REPEATS,
    Proposal,
    Space,
    behind,
    covers,
    eligible,
    fastest,
    peaks,
    predict_over_budget,
)
from feedrate.search.steps import CONSUMER_STEPS, FASTEST_STEPS, ONLINE_STEPS


def propose(space: Space, trials: list[Trial]) -> Proposal | None:
    """The next configuration to try and why, or None when the search is done."""
    return _first(CONSUMER_STEPS if space.consumer else FASTEST_STEPS, space, trials)


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


def propose_online(space: Space, trials: list[Trial]) -> Proposal | None:
    """``autotune``'s next configuration while training runs: from where it started, fewer
    workers while the step stays fed, more while the stall falls (threads where allowed), then
    bisect; None when settled. No anchors: every trial costs training time."""
    return _first(ONLINE_STEPS, space, trials)


def choose(space: Space, trials: list[Trial]) -> Trial | None:
    """The recommendation, among the ``eligible`` trials: with a consumer the fewest workers
    (then least memory) that keep it fed; without one, or when none keeps it fed, the cheapest
    that the fastest is not ``behind`` (within its noise and not ``outpaced`` by it once both
    were measured side by side enough times; with a consumer its rate is what it delivered to
    the consumer, so the fastest stalls least and a stall a few points lower is no reason to
    pay for more workers). ``advice.verdicts`` explains the answer by the same rule."""
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
    equal = [t for t in measured if behind(top, t) is None]
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


def unresolved(
    space: Space, trials: list[Trial], *, either: bool = False
) -> tuple[Trial, str] | None:
    """The trial to measure again before ``choose``'s answer stands, and why, or None: while no
    trial keeps a consumer fed and the answer (the cheapest within the noise of the fastest) is
    more than ``NOISE_FLOOR`` slower than the fastest, the one of the two with fewer repeats,
    until both have ``RESOLVED_REPEATS`` (then ``outpaced`` takes a gap past the floor as real).
    With ``either`` (tune, whose repeats cost only its budget) the same where the answer is the
    fastest itself and the fastest of the rest lies within its noise: one trial of each can
    order them either way (tokenize on 2 CPUs, compare-quick-1207i: 2 workers at 1.07 of 8 in
    one round, 0.73-0.94 in the other four; tune picked 2, 0.86 of 8 over the 5 rounds)."""
    measured = eligible(space, trials)
    top, pick = fastest(measured), choose(space, trials)
    if top is None or pick is None:
        return None
    if space.consumer and any(covers(t) for t in measured):
        return None  # the answer is the cheapest that keeps the consumer fed
    if pick is top:
        rival = fastest([t for t in measured if t is not top]) if either else None
        if rival is None or behind(top, rival) is not None:
            return None  # the rest lie beyond its noise, or were outpaced: the answer stands
        pair = (rival, top)
    elif _gap(top, pick) <= NOISE_FLOOR:
        return None  # the gap is within the floor: the cheaper one is as good
    else:
        pair = (pick, top)
    again = min(pair, key=lambda t: t.repeats)
    if again.repeats >= RESOLVED_REPEATS:
        return None
    a, b = (t.config.label() for t in pair)
    return again, f"measured again: {a} lies within the noise of {b}, the fastest"


def repeat_costs(
    space: Space,
    trials: list[Trial],
    again: Trial,
    up: Collection[LoaderConfig],
    horizon_s: float,
) -> tuple[float, float]:
    """While training runs: what measuring ``again`` again costs, and what finding out could
    save over ``horizon_s`` (s). A repeat of a configuration whose workers are not ``up`` (the
    lane running, or one kept for a return) starts them anew, which takes its ``startup_s``
    (beside the loop, but from its CPUs); the answer it may change is at most the gap between
    the fastest and ``choose``'s answer slower (the 32, 52 and 72 workers of a remote pipeline,
    near-tied, cost 2 to 6 s a start for a gap worth under a second an epoch)."""
    top, pick = fastest(eligible(space, trials)), choose(space, trials)
    gap = _gap(top, pick) if top is not None and pick is not None else 0.0
    return (0.0 if again.config in up else again.startup_s), gap * horizon_s


def _gap(top: Trial, pick: Trial) -> float:
    return top.median / pick.median - 1 if pick.median > 0 else 0.0


def keep(
    space: Space, trials: list[Trial], alive: list[LoaderConfig], going: LoaderConfig
) -> LoaderConfig | None:
    """Online: which lane of ``alive`` (drained, their workers idle) keeps its workers while a
    lane of ``going`` is tried, so that a return to it starts none: the one the trials so far
    would settle on without ``going`` (``choose``: the best so far; on a return, the rival
    that near-tied leaders are measured against again), where a worker's memory was measured
    and both lanes' workers together fit the budgets (``predict_over_budget`` of one loader
    with both counts; a drained lane's /dev/shm is counted, though it holds no batch). None:
    none is kept. A return otherwise forks every worker again on the loop's time: ``remote``
    in ``benchmarks/autotune.py`` tried 30 workers, 39 at the same rate, then 30 again, which
    put its loop 0.45 s further behind the static loader's; another run tried 34, 47 and 60
    before 34 (so the best so far is kept, not the last); near-tied 34 and 45 were measured
    in turn, 34, 45, 34, 45, 34, each 45 forked anew, 0.36-0.43 s behind each time."""
    best = choose(space, [t for t in trials if t.config != going])
    if best is None or best.config not in alive:
        return None
    kept, more = best.config.num_workers, going.num_workers
    if kept == 0 or not peaks(trials).per_worker:
        return None
    both = replace(going, num_workers=kept + more)
    return best.config if predict_over_budget(space, trials, both) is None else None
