"""Numbers as the renderers print them: rates, byte sizes, and the one ± of feedrate's output."""

from __future__ import annotations

from typing import Any

from feedrate.units import rate

__all__ = ["noise_of", "plus_minus", "rate", "size"]


def size(n: int | float | None) -> str:
    """Bytes as a short human string (binary units)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def noise_of(trial: Any) -> str:
    """``plus_minus`` of a trial's rate, told how many windows it rests on."""
    spread = getattr(trial, "spread", None)
    return plus_minus(trial.noise, None if spread is None else len(spread.windows))


def plus_minus(rel_se: float, windows: int | None = None) -> str:
    """The ± printed after a rate: its relative standard error (``Spread.rel_se``) in percent,
    the same in the console, the HTML report and the plot's error bars. A rate of one window
    (``windows``) has no spread to tell: it says so, where ± 0.0% claimed it exact."""
    if windows == 1:
        return "(1 window: no ±)"
    return f"± {rel_se:.1%}"
