"""The spread of a rate over its measurement windows, and the one meaning of ± in feedrate's
output: ``Spread.rel_se``, the relative standard error of the rate."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Literal

#: How the windows' spread is estimated: their standard deviation ("stdev"), or 1.4826 × their
#: median absolute deviation ("mad"), which a few windows made of a full queue draining (a
#: burst) cannot inflate. autotune's short online trials use "mad"; measure and tune "stdev".
Estimator = Literal["stdev", "mad"]
#: Scales a median absolute deviation to a standard deviation (for normally distributed rates).
MAD_TO_SD = 1.4826


def deviation(rates: list[float], estimator: Estimator = "stdev") -> float:
    """The spread of ``rates`` as a standard deviation, by ``estimator`` (0 for fewer than 2)."""
    if len(rates) < 2:
        return 0.0
    if estimator == "mad":
        mid = statistics.median(rates)
        return MAD_TO_SD * statistics.median(abs(r - mid) for r in rates)
    return statistics.stdev(rates)


@dataclass(frozen=True)
class Spread:
    """Steady-state samples/s of each window and their summary; ``stdev`` is the windows'
    standard deviation as ``estimator`` estimates it. ``span``: the rate compared across
    trials is what the measurement delivered over its whole span (``Trial.median``), not the
    median window. autotune's online trials are judged so: their windows are a few rounds of
    workers that deliver in bursts, and where per-sample cost is uneven the median window
    misses the slow ones, the more so the fewer the workers (skewed CPU cost: the median window
    of 2 workers read above 8's while 8 delivered 4-20% more)."""

    windows: list[float]
    median: float
    min: float
    max: float
    stdev: float
    estimator: Estimator = "stdev"
    span: bool = False

    @classmethod
    def of_rates(
        cls, rates: list[float], estimator: Estimator = "stdev", *, span: bool = False
    ) -> Spread:
        """The spread of per-window rates (samples/s); all zero without windows."""
        if not rates:
            return cls([], 0.0, 0.0, 0.0, 0.0, estimator, span)
        rates = list(rates)
        med = statistics.median(rates)
        dev = deviation(rates, estimator)
        return cls(rates, med, min(rates), max(rates), dev, estimator, span)

    @property
    def rel(self) -> float:
        """(max - min) / median, the relative width of the spread."""
        return (self.max - self.min) / self.median if self.median > 0 else 0.0

    @property
    def rel_se(self) -> float:
        """The ± of feedrate's output: the relative standard error of the rate, the windows'
        standard deviation over their median and the square root of their number (with a
        single window, half its relative range)."""
        if self.median <= 0:
            return 0.0
        n = len(self.windows)
        return self.stdev / self.median / math.sqrt(n) if n > 1 else self.rel / 2

    def merged(self, other: Spread) -> Spread:
        """The spread of both measurements' windows together."""
        rates = [*self.windows, *other.windows]
        if not rates:
            return self
        return replace(Spread.of_rates(rates, self.estimator, span=self.span))

    def to_dict(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "stdev": self.stdev,
            "estimator": self.estimator,
            "span": self.span,
            "rel": self.rel,
            "rel_se": self.rel_se,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Spread:
        estimator: Estimator = "mad" if d.get("estimator") == "mad" else "stdev"
        return cls(
            list(d["windows"]),
            d["median"],
            d["min"],
            d["max"],
            d["stdev"],
            estimator,
            bool(d.get("span", False)),
        )
