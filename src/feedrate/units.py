"""Quantities in words for findings' messages."""

from __future__ import annotations

MiB = 2**20


def size(n: float) -> str:
    """Bytes as a short human string for messages."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / MiB:.1f} MiB" if n >= MiB / 10 else f"{n / 1024:.0f} KiB"
