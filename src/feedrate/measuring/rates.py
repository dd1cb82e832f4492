"""A run's steady-state rate from its windows: the aggregate (samples over seconds) and the
spread across windows, and the share of time the loop waited for data."""

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


def stall_fraction(windows: list[Window]) -> float:
    """Share of the windows' time spent waiting for batches (0 = never, 1 = always)."""
    seconds = sum(w.seconds for w in windows)
    return sum(w.wait_s for w in windows) / seconds if seconds > 0 else 0.0


def summarize(windows: list[Window]) -> Rate:
    """Aggregate rate (total samples / total seconds) and the per-window spread. Partial windows
    count in the aggregate; the spread uses the full windows where they are at least half of
    them, else all: epochs of a few dozen batches cut most windows at their end, and the one
    full window among 30 (a pause filled it by time) read a tenth of the rate the rest did."""
    seconds = sum(w.seconds for w in windows)
    samples = sum(w.samples for w in windows)
    batches = sum(w.batches for w in windows)
    full = [w for w in windows if w.full]
    spread_from = full if full and 2 * len(full) >= len(windows) else windows
    rates = [w.samples_per_s for w in spread_from]
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
