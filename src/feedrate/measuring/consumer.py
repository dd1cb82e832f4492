"""The consumer a loader must keep up with (DESIGN.md): a rate, a step time, or a real step.

Accelerator work does not use host CPU, so a consumer that sleeps for the step's duration is a
faithful model of a GPU step for CPU-contention purposes; a real ``--step`` runs the user's
callable instead (on the CPU, it competes with the workers, which is the point).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from feedrate.errors import UserError

ConsumerKind = Literal["rate", "step-time", "step"]


@dataclass(frozen=True)
class Consumer:
    """Called as ``consumer(batch, samples)`` once per batch, as a training loop would."""

    kind: ConsumerKind
    samples_per_s: float | None = None
    step_s: float | None = None
    step: Callable[[Any], object] | None = None
    name: str | None = None

    def __call__(self, batch: Any, samples: int) -> None:
        if self.kind == "rate" and self.samples_per_s:
            time.sleep(samples / self.samples_per_s)
        elif self.kind == "step-time" and self.step_s:
            time.sleep(self.step_s)
        elif self.step is not None:
            self.step(batch)

    def describe(self) -> str:
        if self.kind == "rate":
            return f"a consumer of {self.samples_per_s:,.0f} samples/s"
        if self.kind == "step-time":
            return f"a consumer taking {self.step_s:g} s per batch"
        return f"the training step {self.name}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "samples_per_s": self.samples_per_s,
            "step_s": self.step_s,
            "name": self.name,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Consumer:
        return cls(
            data["kind"], data.get("samples_per_s"), data.get("step_s"), None, data.get("name")
        )


def _positive(value: float) -> bool:
    """A finite number above 0 (nan and inf are neither a pace nor a mistake to run with)."""
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def make_consumer(
    *,
    rate: float | None = None,
    step_time: float | None = None,
    step: Callable[[Any], object] | None = None,
    step_name: str | None = None,
) -> Consumer | None:
    """At most one of ``rate`` (samples/s), ``step_time`` (s per batch) or ``step``."""
    given = [x for x in (rate, step_time, step) if x is not None]
    if len(given) > 1:
        raise UserError(
            "give at most one of rate, step_time and step", params=("rate", "step_time", "step")
        )
    if rate is not None:
        if not _positive(rate):
            raise UserError(
                f"rate must be a positive number of samples/s, got {rate:g}", params=("rate",)
            )
        return Consumer("rate", samples_per_s=rate)
    if step_time is not None:
        if not _positive(step_time):
            raise UserError(
                f"step_time must be a positive number of seconds per batch, got {step_time:g}",
                params=("step_time",),
            )
        return Consumer("step-time", step_s=step_time)
    if step is not None:
        if not callable(step):
            raise UserError(f"step {step_name or ''} is not callable", params=("step",))
        return Consumer("step", step=step, name=step_name or getattr(step, "__name__", "step"))
    return None
