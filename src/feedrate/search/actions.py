"""What the online tuner (``search.tuner``) asks of its caller, which has the machine: measure
a configuration (``Try``), move to the one settled on (``Settle``), or run the thread-safety
check (``CheckThreads``)."""

from __future__ import annotations

from dataclasses import dataclass

from feedrate.loader.config import LoaderConfig


@dataclass(frozen=True)
class Try:
    """Measure ``config`` next, for ``why``."""

    config: LoaderConfig
    why: str


@dataclass(frozen=True)
class Settle:
    """Settled on ``config``, which leaves the loop ``stall`` of its time waiting: keep it (the
    next run starts there) and move to it if it is not the one in use."""

    config: LoaderConfig
    stall: float


@dataclass(frozen=True)
class CheckThreads:
    """Run the thread-safety check with ``threads`` threads; pass the verdict to
    ``threads_checked``."""

    threads: int


Action = Try | Settle | CheckThreads
