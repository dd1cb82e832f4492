"""Numbers as the renderers print them: rates, byte sizes, and the one ± of feedrate's output."""

from __future__ import annotations


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


def rate(value: float) -> str:
    """Samples/s with thousands separators (one decimal below 100)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def plus_minus(rel_se: float) -> str:
    """The ± printed after a rate: its relative standard error (``Spread.rel_se``) in percent,
    the same in the console, the HTML report and the plot's error bars."""
    return f"± {rel_se:.1%}"
