"""What ``autotune`` tried and why, as plain data (schema ``feedrate.autotune/1``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial


@dataclass
class Event:
    """Something the tuner did: when (epoch, batch), what, why."""

    epoch: int
    batch: int
    what: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, "what": self.what, "why": self.why}


@dataclass
class AutotuneReport:
    """What ``autotune`` tried and why: plain data (``to_dict``), readable with ``str()``."""

    config: LoaderConfig
    settled: bool
    started_from: str
    trials: list[Trial] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    retunes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "feedrate.autotune/1",
            "config": self.config.to_dict(),
            "settled": self.settled,
            "started_from": self.started_from,
            "trials": [t.to_dict() for t in self.trials],
            "events": [e.to_dict() for e in self.events],
            "retunes": self.retunes,
        }

    def __str__(self) -> str:
        lines = [
            f"feedrate.autotune: {self.config.label()} "
            f"({'settled' if self.settled else 'still tuning'}; started from {self.started_from}; "
            f"{self.retunes} re-tunes)"
        ]
        for t in self.trials:
            stall = "-" if t.stall_fraction is None else f"{t.stall_fraction:.0%}"
            lines.append(
                f"  {t.config.label():<34} {t.median:>10,.0f} samples/s  stall {stall:>4}  "
                f"{t.reason}"
            )
        for e in self.events:
            lines.append(f"  epoch {e.epoch} batch {e.batch}: {e.what} — {e.why}")
        return "\n".join(lines)
