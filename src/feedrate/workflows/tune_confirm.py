"""After tune's search, before its answer: the trials the answer rests on measured again, side
by side. Trials that ran while other processes took the CPUs are measured again (their figure
is the machine's load, not the pipeline); the leader is measured with its closest rival and
your settings, interleaved, windows pooled; and where the cheapest configuration within the
noise of the fastest is more than ``NOISE_FLOOR`` slower, or is the fastest with the next
within its noise, both are measured again, in turn, until the gap is resolved
(``search.space.outpaced``) or the budget runs out.

Orchestration only: ``search`` decides (``choose``, ``contended``, ``beats``), the caller's
``trial`` measures.
"""

from __future__ import annotations

from typing import Protocol

from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial
from feedrate.search.propose import choose, unresolved
from feedrate.search.space import (
    RESOLVED_REPEATS,
    Space,
    contended,
)

#: Rivals within this share of the leader are measured again before the answer is given.
CONFIRM_WITHIN = 0.15

#: Of the fastest trials, this many are measured again when others' load fell on them.
CONTENDED_LEADERS = 3


class Measures(Protocol):
    """What these steps need of a search: its space and trials, a way to measure one more
    trial, and whether the budget leaves room for it."""

    space: Space
    trials: list[Trial]

    def trial(
        self, config: LoaderConfig, why: str, *, fatal: bool = False, record: bool = True
    ) -> Trial: ...

    def room(self) -> bool: ...


def again_where_contended(s: Measures, baseline: Trial) -> None:
    """The fastest trials, the answer so far and your settings, where others kept CPUs busy
    while they ran: measured again; a quiet repeat replaces the figure, a busy one is pooled
    with it (the answer then says it rests on a loaded machine)."""
    cpus = s.space.cpus
    ranked = sorted((t for t in s.trials if t.measured), key=lambda t: -t.median)
    pick = choose(s.space, s.trials)
    seen: set[int] = set()
    for t in [*ranked[:CONTENDED_LEADERS], *([pick] if pick else []), baseline]:
        if id(t) in seen or not t.measured or not contended(t, cpus):
            continue
        seen.add(id(t))
        if not s.room():
            return
        again = s.trial(t.config, "measured again: other processes were busy", record=False)
        if not again.measured:
            continue
        if contended(again, cpus):
            t.pool(again)
        else:
            t.take(again)


def confirm(s: Measures, baseline: Trial) -> None:
    """Measure the leader again, with its closest rival and your settings, interleaved, and
    pool the windows: one lucky window should not pick the answer, and the speed-up over
    your settings should compare measurements taken side by side. When pooling changes the
    leader, the new one is measured again too (at most twice more), within the budget."""
    again: set[int] = set()
    for round_ in range(3):
        best = choose(s.space, s.trials)
        if best is None or id(best) in again:
            return
        group = [best]
        if round_ == 0:
            rivals = sorted(
                (t for t in s.trials if t.measured and t is not best and t is not baseline),
                key=lambda t: -t.median,
            )
            group += [t for t in rivals[:1] if t.median >= best.median * (1 - CONFIRM_WITHIN)]
            group.append(baseline)
        for t in group:
            if id(t) in again:
                continue
            if not s.room():
                return
            t.pool(s.trial(t.config, "measured again, side by side", record=False))
            again.add(id(t))


def resolve(s: Measures) -> None:
    """While the answer (the cheapest within the noise of the fastest) is more than
    ``NOISE_FLOOR`` slower than the fastest, or is the fastest with the next within its noise:
    measure the two again, the one with fewer repeats first (``search.propose.unresolved``),
    until the gap is resolved, within the budget. A repeat that fails (a start refused, a
    worker killed) ends it: the answer stands on what was measured."""
    for _ in range(4 * RESOLVED_REPEATS):
        again = unresolved(s.space, s.trials, either=True)
        if again is None or not s.room():
            return
        behind, why = again
        repeat = s.trial(behind.config, why, record=False)
        if not repeat.measured:
            return
        behind.pool(repeat)
