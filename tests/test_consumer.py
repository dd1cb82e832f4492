"""Consumers: validation names the bad option; each kind does what it models."""

from __future__ import annotations

import pytest
import torch

from feedrate.errors import UserError
from feedrate.measuring.consumer import Consumer, make_consumer
from feedrate.measuring.memory_run import consumer_rate


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


def test_a_real_steps_first_call_is_not_timed_alone() -> None:
    # A step's first call builds the model and loads kernels (seconds on a GPU): the rate of the
    # consumer alone is its steady pace, from the calls after it.
    now = [0.0]
    costs: list[float] = []

    def step(batch: object) -> None:
        costs.append(5.0 if not costs else 0.1)
        now[0] += costs[-1]

    consumer = Consumer("step", step=step, name="train.py:step")
    batch = torch.zeros(8, 3)
    rate = consumer_rate(consumer, batch, 8, seconds=1.0, clock=lambda: now[0])
    assert rate == pytest.approx(8 / 0.1)
    assert costs[0] == 5.0 and len(costs) >= 4
