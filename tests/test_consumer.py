"""Consumers: validation names the bad option; each kind does what it models."""

from __future__ import annotations

import pytest

from feedrate.errors import UserError
from feedrate.measuring.consumer import Consumer, make_consumer


def test_none_without_options() -> None:
    assert make_consumer() is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0.0}, "rate must be a positive number"),
        ({"rate": -5.0}, "rate must be a positive number"),
        ({"rate": float("nan")}, "rate must be a positive number"),
        ({"rate": float("inf")}, "rate must be a positive number"),
        ({"step_time": 0.0}, "step_time must be a positive number"),
        ({"step_time": float("inf")}, "step_time must be a positive number"),
        ({"rate": 10.0, "step_time": 1.0}, "at most one"),
    ],
)
def test_bad_options_are_named(kwargs: dict[str, float], message: str) -> None:
    # The library speaks its own names (rate, step_time); the command line says --rate.
    with pytest.raises(UserError, match=message) as info:
        make_consumer(**kwargs)
    assert set(info.value.params) <= {"rate", "step_time", "step"} and info.value.params


def test_step_consumer_calls_the_step_with_each_batch() -> None:
    seen: list[object] = []
    consumer = make_consumer(step=seen.append, step_name="train.py:step")
    assert consumer is not None
    consumer("batch-1", 4)
    assert seen == ["batch-1"]
    assert "train.py:step" in consumer.describe()


def test_round_trip_and_descriptions() -> None:
    rate = make_consumer(rate=2400.0)
    assert rate is not None and "2,400 samples/s" in rate.describe()
    assert Consumer.from_dict(rate.to_dict()) == rate
    step = make_consumer(step_time=0.05)
    assert step is not None and "0.05 s per batch" in step.describe()
