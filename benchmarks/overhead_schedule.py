"""The schedule ``measure()`` follows for a batch budget, worked out without measuring, so the bare
loop in ``overhead.py`` can count exactly the same batches and the probe calls can be placed
inside or outside the timed span."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from feedrate.loader.config import LoaderConfig
from feedrate.measuring import windows
from feedrate.measuring.measure import warmup_batches

WINDOWS = 5
"""``windows_count`` of every measurement in the benchmark."""


@dataclass(frozen=True)
class Schedule:
    """What ``measure`` does with each epoch: ``skip`` batches discarded, then ``counted`` batches
    timed (from the last discarded batch, or from the ``iter()`` call when whole epochs are timed,
    start-up included). ``reads``: per probe call (attach, window open or close, in call order)
    whether it falls inside the timed span."""

    method: str
    skip: tuple[int, ...]
    counted: tuple[int, ...]
    reads: tuple[tuple[str, bool], ...]

    @property
    def batches(self) -> int:
        return sum(self.counted)

    def timed(self, kind: str) -> int:
        return sum(1 for k, inside in self.reads if k == kind and inside)


def plan_schedule(config: LoaderConfig, batches: int, epoch_length: int) -> Schedule:
    """Replay ``windows.run`` on a fake loader of ``epoch_length`` batches and a fake clock: with a
    batch budget the schedule depends on counts only, never on speed."""
    plan = windows.WindowPlan(WINDOWS, batches, None, warmup_batches(config))
    taken: list[int] = []
    calls: list[tuple[str, int, int]] = []

    def call(kind: str) -> None:
        calls.append((kind, len(taken) - 1, taken[-1]))

    def make_iter() -> Iterator[int]:
        taken.append(0)
        call("attach")  # measure's make_iter attaches the probe before any batch
        return _counting(epoch_length, taken)

    ticks = itertools.count()
    timeline = windows.run(
        make_iter,
        plan,
        lambda _batch: 1,
        clock=lambda: float(next(ticks)),
        hooks=windows.Hooks(window_open=lambda: call("open"), window_close=lambda: call("close")),
        epoch_length=epoch_length,
    )
    if timeline.method == "whole-epochs":  # the first epoch is warm-up, later ones timed whole
        skip = (taken[0], *[0] * (len(taken) - 1))
    else:
        skip = tuple(min(n, plan.warmup_batches) for n in taken)
    counted = tuple(n - k for n, k in zip(taken, skip, strict=True))
    reads = tuple((kind, counted[e] > 0 and skip[e] <= at < taken[e]) for kind, e, at in calls)
    return Schedule(timeline.method, skip, counted, reads)


def _counting(n: int, taken: list[int]) -> Iterator[int]:
    for i in range(n):
        taken[-1] += 1
        yield i
