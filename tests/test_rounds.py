"""An epoch in rounds: DataLoader hands an epoch's batches to its workers in turn, so a worker
count between two that end a round only adds processes (the search on a pipeline built so that
the answer depends on it: ``test_search``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from feedrate.search.rounds import (
    fewest_alike,
    midway,
    on_a_round,
    round_fewer,
    rounds,
    worth_between,
)

BATCHES = 128
"""The ``remote`` benchmark's epoch: 128 batches."""


@given(st.integers(1, 3000), st.integers(1, 3000))
def test_the_fewest_alike_make_the_epoch_in_as_many_rounds(batches: int, workers: int) -> None:
    f = fewest_alike(workers, batches)
    assert f <= workers and rounds(f, batches) == rounds(workers, batches)
    assert f == 1 or rounds(f - 1, batches) > rounds(workers, batches)
    fewer = round_fewer(workers, batches)
    if fewer is None:
        assert rounds(workers, batches) == 1
    else:
        assert fewer > workers and rounds(fewer, batches) < rounds(workers, batches)
        assert rounds(fewer - 1, batches) == rounds(workers, batches)  # the fewest that do
        assert fewest_alike(fewer, batches) == fewer


@given(st.integers(1, 600), st.integers(0, 300), st.integers(2, 300))
def test_only_the_fewest_for_their_rounds_lie_between(batches: int, low: int, span: int) -> None:
    high = low + span
    worth = worth_between(low, high, batches)
    assert all(low < c < high and fewest_alike(c, batches) == c for c in worth)
    assert worth_between(low, high, None) == list(range(low + 1, high))
    mid = midway(low, high, batches)
    assert (mid is None) == (not worth) and (mid is None or mid in worth)
    assert midway(low, high, None) == (low + high) // 2  # no rounds: half way, as before


def test_a_step_moves_onto_a_round_within_reach() -> None:
    # Aimed at 54 from 32: 64 saves a round and lies within 1.25 x 54; aimed at 49 it does not,
    # and 43 makes the epoch in the rounds 49 would; aimed at 96 from 64, no count up to 100
    # saves one.
    assert on_a_round(54, BATCHES, above=32, most=512, reach=1.25) == 64
    assert on_a_round(49, BATCHES, above=32, most=512, reach=1.25) == 43
    assert on_a_round(96, BATCHES, above=64, most=100, reach=1.25) == 64
    assert on_a_round(96, BATCHES, above=64, most=512, reach=1.25) == 128
    assert on_a_round(54, None, above=32, most=512, reach=1.25) == 54  # a stream: as aimed
