"""A run's steady-state rate from its windows: the aggregate (samples over seconds) and the
spread across windows, and the share of time the loop waited for data. Every figure is taken
from the same windows (``steady``), so the rate lies within the spread's range."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from feedrate.measuring.windows import Window


@dataclass(frozen=True)
class Rate:
    """Steady-state rate over the windows, with its spread (samples/s)."""

    samples_per_s: float
    batches_per_s: float
    windows: list[float]
    median: float
    min: float
    max: float
    stdev: float

    @property
    def rel_spread(self) -> float:
        """(max - min) / median: how far apart the windows were, as a fraction."""
        return (self.max - self.min) / self.median if self.median > 0 else 0.0


def steady(windows: list[Window]) -> list[Window]:
    """The windows a run's figures are taken from: the full ones where they are at least half of
    them, else all (epochs of a few dozen batches cut most windows at their end, and the one
    full window among 30, filled by time in a pause, read a tenth of the rate the rest did).
    The rate, its spread and the stall all come from these, so the rate lies within the
    spread's range: with cut windows counted in the rate alone, a run on a machine others
    loaded read 189 samples/s over full windows of 70-99.5."""
    full = [w for w in windows if w.full]
    return full if full and 2 * len(full) >= len(windows) else windows


def stall_fraction(windows: list[Window]) -> float:
    """Share of the ``steady`` windows' time spent waiting for batches (0 = never, 1 = always)."""
    windows = steady(windows)
    seconds = sum(w.seconds for w in windows)
    return sum(w.wait_s for w in windows) / seconds if seconds > 0 else 0.0


def summarize(windows: list[Window]) -> Rate:
    """Aggregate rate (total samples / total seconds) and the per-window spread, both over the
    ``steady`` windows."""
    windows = steady(windows)
    seconds = sum(w.seconds for w in windows)
    samples = sum(w.samples for w in windows)
    batches = sum(w.batches for w in windows)
    rates = [w.samples_per_s for w in windows]
    if not rates or seconds <= 0:
        return Rate(0.0, 0.0, [], 0.0, 0.0, 0.0, 0.0)
    return Rate(
        samples_per_s=samples / seconds,
        batches_per_s=batches / seconds,
        windows=rates,
        median=statistics.median(rates),
        min=min(rates),
        max=max(rates),
        stdev=statistics.stdev(rates) if len(rates) > 1 else 0.0,
    )
