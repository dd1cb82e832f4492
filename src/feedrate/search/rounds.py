"""An epoch in rounds. In order, DataLoader hands an epoch's batches to its workers in turn
(batch i to worker i mod n, the turn starting again each epoch), so each worker makes its
batches one after another and the epoch lasts as long as the busiest worker's ``ceil(B / n)``
batches. Every count that makes the epoch in as many rounds as a smaller one only adds processes
competing for the CPUs: on ``remote`` (128 batches an epoch, 2 CPUs), 43, 49 and 63 workers (3
rounds) measured 0.88-0.93 of 64 (2 rounds), and 96 (2 rounds too) 0.83, in 6 interleaved rounds
(``benchmarks/rounds.py``, results in ``benchmarks/results/issue17/rounds-1207``). Where the
epoch's length is unknown (a stream, a sampler without one, batches taken out of order) every
count is its own. Pure functions."""

from __future__ import annotations

import math


def rounds(workers: int, batches: int) -> int:
    """The rounds ``workers`` workers make an epoch of ``batches`` batches in."""
    return math.ceil(batches / workers)


def fewest_alike(workers: int, batches: int | None) -> int:
    """The fewest workers that make an epoch of ``batches`` in as many rounds as ``workers``
    (``workers`` itself where the epoch's length is unknown, or without workers)."""
    if not batches or workers <= 0:
        return workers
    return math.ceil(batches / rounds(workers, batches))


def round_fewer(workers: int, batches: int | None) -> int | None:
    """The fewest workers that make an epoch in fewer rounds than ``workers``; None where
    ``workers`` make it in one round, or the epoch's length is unknown."""
    if not batches or workers <= 0:
        return None
    r = rounds(workers, batches)
    return None if r <= 1 else math.ceil(batches / (r - 1))


def on_a_round(target: int, batches: int | None, *, above: int, most: int, reach: float) -> int:
    """Where a step from ``above`` workers aimed at ``target`` goes: the fewest that make an
    epoch in fewer rounds than ``target`` where that lies within ``reach`` times ``target``
    and ``most``; else the fewest that make it in ``target``'s rounds, where more than
    ``above``; else the fewest that save ``above`` a round, within ``most``; else ``above``
    (no count up to ``most`` shortens the epoch). ``target`` (within ``most``) itself where the
    epoch's length is unknown or it is not above ``above``."""
    target = min(target, most)
    if not batches or target <= above:
        return target
    up = round_fewer(target, batches)
    if up is not None and up <= min(most, math.floor(target * reach)):
        return up
    down = fewest_alike(target, batches)
    if down > above:
        return down
    saves = round_fewer(above, batches)
    return saves if saves is not None and saves <= most else above


def worth_between(low: int, high: int, batches: int | None) -> list[int]:
    """The counts strictly between ``low`` and ``high`` that are each the fewest for their
    rounds (every count between, where the epoch's length is unknown)."""
    counts = range(low + 1, high)
    if not batches:
        return list(counts)
    return sorted({c for c in (fewest_alike(n, batches) for n in counts) if low < c < high})


def midway(low: int, high: int, batches: int | None) -> int | None:
    """Of ``worth_between``'s counts, the one nearest half way from ``low`` to ``high`` (the
    fewer of two as near); None where none lies between."""
    worth = worth_between(low, high, batches)
    half = (low + high) // 2
    return min(worth, key=lambda c: (abs(c - half), c), default=None)


def the_fewest(workers: int, batches: int) -> str:
    """``workers`` as a round's fewest, in words: "64, the fewest that make an epoch's 128
    batches in 2 rounds"."""
    return (
        f"{workers}, the fewest that make an epoch's {batches} batches in "
        f"{rounds(workers, batches)} rounds"
    )
