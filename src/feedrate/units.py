"""Quantities in words for findings' messages, and sizes read from words."""

from __future__ import annotations

import math
import numbers
import re

MiB = 2**20


def check_seconds(value: float | None, param: str) -> None:
    """``UserError`` naming ``param`` unless ``value`` is None or a finite number of seconds
    above 0: nan and inf pass ``<= 0`` tests, then break a timer (``setitimer``) or never
    end."""
    from feedrate.errors import UserError

    real = isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's too
    ok = real and math.isfinite(value) and value > 0  # type: ignore[arg-type,operator]
    if value is not None and not ok:
        raise UserError(
            f"{param} must be a positive, finite duration (s), got {value!r}", params=(param,)
        )


def size(n: float) -> str:
    """Bytes as a short human string for messages."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / MiB:.1f} MiB" if n >= MiB / 10 else f"{n / 1024:.0f} KiB"


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(text: str, param: str = "size") -> int:
    """'8G', '512MiB', '64K', '2.5gb' or plain bytes → bytes (K, M, G, T are powers of 1024;
    KB, MB, GB, TB powers of 1000). Raises ``UserError`` naming ``param`` and the input."""
    from feedrate.errors import UserError

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise UserError(
            f"{param} {text.strip()!r} is not a size: use e.g. 8G, 512M or 2GiB", params=(param,)
        )
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise UserError(f"{param} must be positive, got {text.strip()!r}", params=(param,))
    return value


def parse_sizes(text: str) -> list[int]:
    """``64K,1M,16M`` → bytes (``units.parse_size``: K, M, G are powers of 1024), each between
    1 byte and 16 GiB."""
    from feedrate.errors import UserError

    out = []
    for part in text.split(","):
        value = parse_size(part, "sizes")
        if value > 2**34:
            raise UserError(f"sizes: {part.strip()!r} is over 16G", params=("sizes",))
        out.append(value)
    return out


def rate(value: float) -> str:
    """Samples/s with thousands separators, one decimal below 100, three significant digits
    below 1: 1,570 (not 1.57e+03), 93.4, 0.0412 (not 0.0)."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value >= 1 or value <= 0 else f"{value:.3g}"


def counted(n: int, noun: str) -> str:
    """``1 trial``, ``3 trials``: ``n`` and the noun, plural where it needs to be."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
