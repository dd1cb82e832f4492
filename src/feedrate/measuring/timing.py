"""The shapes of a measurement's timing (see ``windows`` for how a run goes): what to measure
(``WindowPlan``), what was seen (``Window``, ``Timeline``), and the calls a run makes
(``Hooks``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Clock = Callable[[], float]

#: Steady-state seconds measured when neither a batch count nor a duration is given.
DEFAULT_SECONDS = 10.0
Method = Literal["windows", "whole-epochs"]

#: Epochs shorter than this many warm-ups are timed whole (after a first one as warm-up): in
#: windows, most of every epoch would be discarded and the rest would be a few batches.
WHOLE_EPOCH_FACTOR = 3

#: A window closed by time still waits for this many batches, so one slow batch is not a rate.
MIN_BATCHES_PER_WINDOW = 2

#: With a budget of S seconds the run ends by ``DEADLINE_FACTOR × S`` after the first ``iter()``,
#: or S after the first batch when start-up takes longer: room for warm-up and restarts.
DEADLINE_FACTOR = 2.0

#: Timed whole, this many epochs meet a time budget: each carries a restart (maybe seconds).
MIN_WHOLE_EPOCHS = 2


class EmptyLoaderError(Exception):
    """The loader's iterator ended without yielding a single batch."""


@dataclass(frozen=True)
class WindowPlan:
    """How much to measure: ``batches`` or ``seconds`` in total (steady state only), split into
    ``windows`` windows. ``max_epochs`` bounds the run when epochs are tiny; ``wall_s`` (s after
    the first ``iter()``) caps its deadline (see ``deadline_s``)."""

    windows: int = 5
    batches: int | None = None
    seconds: float | None = None
    warmup_batches: int = 1
    max_epochs: int = 1000
    wall_s: float | None = None
    #: Batches in one round of deliveries (one from every worker; 1 without workers).
    round_batches: int = 1

    def __post_init__(self) -> None:
        if self.windows < 1:
            raise ValueError("windows must be 1 or more")
        if self.round_batches < 1:
            raise ValueError("round_batches must be 1 or more")
        if self.batches is None and self.seconds is None:
            object.__setattr__(self, "seconds", DEFAULT_SECONDS)
        if self.warmup_batches < 1:
            raise ValueError("warmup_batches must be 1 or more: the first batch carries start-up")
        if self.max_epochs < 1:
            raise ValueError("max_epochs must be 1 or more")
        if self.batches is not None and self.batches < self.windows:
            raise ValueError(f"batches must be at least the number of windows ({self.windows})")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError("seconds must be positive")
        if self.wall_s is not None and self.wall_s <= 0:
            raise ValueError("wall_s must be positive")

    def deadline_s(self, startup_s: float) -> float | None:
        """Seconds after the first ``iter()`` by which the run stops, start-up and restarts
        included: ``max(DEADLINE_FACTOR × seconds, seconds + startup_s)`` with a time budget,
        never past ``wall_s``; None (no bound) for a batch budget without ``wall_s``. The run
        moves it when its first window opens, to leave ``seconds`` of steady state (``windows``)."""
        bound = None
        if self.seconds is not None:
            bound = max(DEADLINE_FACTOR * self.seconds, self.seconds + startup_s)
        if self.wall_s is not None:
            bound = self.wall_s if bound is None else min(bound, self.wall_s)
        return bound

    @property
    def batches_per_window(self) -> int | None:
        return None if self.batches is None else math.ceil(self.batches / self.windows)

    @property
    def seconds_per_window(self) -> float | None:
        return None if self.seconds is None else self.seconds / self.windows


@dataclass
class Window:
    """One steady-state window: ``batches`` and ``samples`` that arrived during ``seconds``."""

    start: float
    seconds: float = 0.0
    batches: int = 0
    samples: int = 0
    full: bool = False
    wait_s: float = 0.0
    #: (seconds, batches, samples, wait_s) when the window last ended a whole round.
    aligned: tuple[float, int, int, float] | None = None

    def cut_to_rounds(self) -> bool:
        """Drop the batches after the last whole round; False when it has none."""
        if self.aligned is None:
            return False
        self.seconds, self.batches, self.samples, self.wait_s = self.aligned
        return True

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Timeline:
    """What a run saw, in seconds of the injected clock."""

    startup_s: float = 0.0
    epoch_restart_s: list[float] = field(default_factory=list)
    warmup_s: float = 0.0
    warmup_batches: int = 0
    windows: list[Window] = field(default_factory=list)
    epochs: int = 0
    #: Samples in the first epoch that ran to its end, counted (None: none did).
    epoch_samples: int | None = None
    method: Method = "windows"
    #: The deadline, in s after the first ``iter()`` (None: none), and whether it ended the run.
    deadline_s: float | None = None
    stopped_by_deadline: bool = False
    #: Seconds the warm-up went on waiting for the ``steady`` hook, and whether the windows
    #: opened without it (it had not said yes by the deadline).
    steady_wait_s: float = 0.0
    unaligned: bool = False


@dataclass
class Hooks:
    """Called at window boundaries and per batch (e.g. to read CPU counters, kick a watchdog)."""

    window_open: Callable[[], None] = lambda: None
    window_close: Callable[[], None] = lambda: None
    batch: Callable[[], None] = lambda: None
    #: Asked once the first epoch's warm-up is done, at every batch until it answers True:
    #: whether the windows may open (see the module doc).
    steady: Callable[[], bool] = lambda: True
