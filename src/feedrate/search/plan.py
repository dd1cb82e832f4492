"""The step a budgeted search takes next, the one loop ``tune`` (between trials) and ``autotune``
(at the end of each online trial) share: propose, record what is predicted over a budget as
skipped, keep threads out of the answer unless allowed, ask for the thread-safety check before
the first threaded trial, and stop when the budget is spent. Pure: the caller measures, runs
the check and reads the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from feedrate.loader.config import LoaderConfig
from feedrate.results.evidence import ThreadCheck
from feedrate.results.trial import Trial
from feedrate.search.space import Proposal, Space, predict_over_budget
from feedrate.search.steps import threads_report

#: What the search does next (see ``next_trial``).
Action = Literal["try", "check_threads", "report_only", "budget_spent", "done"]


@dataclass(frozen=True)
class NextTrial:
    """``action`` on ``config`` (None when ``done``) for ``why``, and the proposals predicted
    over a budget on the way, as skipped trials for the caller to record."""

    action: Action
    config: LoaderConfig | None = None
    why: str = ""
    skipped: tuple[Trial, ...] = ()


def without_threads(space: Space) -> Space:
    """The space once threads are out of the search (a thread-safety check failed)."""
    return replace(space, max_threads=1, allow_threads=False)


def after_thread_check(space: Space, check: ThreadCheck) -> Space:
    """The space the search goes on in after the thread-safety check ``check``."""
    return space if check.ok else without_threads(space)


def report_due(space: Space, trials: list[Trial]) -> bool:
    """The search will end with a threaded trial for the report only (threads are not allowed,
    workers were seen mostly waiting): its time is kept out of the budget the search spends."""
    return threads_report(space, trials) is not None


def next_trial(
    space: Space,
    trials: list[Trial],
    propose: Callable[[Space, list[Trial]], Proposal | None],
    *,
    spent: bool,
    thread_check: ThreadCheck | None = None,
) -> NextTrial:
    """The next step of a search over ``space`` after ``trials``, with ``propose`` (``propose``
    or ``propose_online``); ``spent``: the budget leaves no room for another trial;
    ``thread_check``: the verdict of the thread-safety check, once it ran.

    In this order: a proposal predicted over a memory, /dev/shm or open-file budget is skipped
    (and the next one considered); a threaded one that may not be recommended is
    ``report_only`` (measured, if at all, after the answer); with the budget ``spent`` the
    search stops with it still to try (``budget_spent``); a threaded one before the check ran
    is ``check_threads`` (run it, then ask again); else ``try``. ``done``: nothing left."""
    if thread_check is not None:
        space = after_thread_check(space, thread_check)
    seen, skipped = list(trials), []
    while (proposal := propose(space, seen)) is not None:
        config, why = proposal
        skip = predict_over_budget(space, seen, config)
        if skip is not None:
            skipped.append(Trial(config, why, skipped=skip))
            seen.append(skipped[-1])
            continue
        threads = config.threads > 1
        action: Action = "try"
        if threads and not space.allow_threads:
            action = "report_only"
        elif spent:
            action = "budget_spent"
        elif threads and thread_check is None:
            action = "check_threads"
        return NextTrial(action, config, why, tuple(skipped))
    return NextTrial("done", skipped=tuple(skipped))
