"""The timing core of a measurement: warm-up, steady-state windows, epochs. Pure logic over an
iterator factory and an injectable clock, so it is tested without depending on speed.

How a run goes:

* ``iter()`` is called and the time to the first batch is the start-up (for later epochs: the
  epoch restart), never mixed into the steady state;
* the first ``warmup_batches`` batches of every epoch are discarded. The caller sets it to cover
  one batch from every worker *and* the queue the workers filled meanwhile
  (``num_workers × prefetch_factor``), so prefetched work is not credited to the window;
* the remaining batches are counted in ``windows`` consecutive windows, each closed after its share
  of the batch or time budget; the spread across windows is the noise estimate. Workers started
  together deliver in rounds (one batch each, then a gap as long as a batch takes one worker),
  so a window closed by time ends on a whole round (``round_batches``, the worker count), and a
  window cut short keeps only its whole rounds: a window that caught a burst but not the gap
  after it (or the reverse) would be off by up to one batch time, however many workers run;
* an epoch that ends early closes the open window as partial and a new epoch begins; when epochs
  are too short for windows (no batch past warm-up, or, when the epoch length is known, fewer than
  ``WHOLE_EPOCH_FACTOR`` warm-ups), the first epoch is warm-up and later epochs are timed whole,
  each epoch's restart included, and the result says so;
* a time budget bounds the whole run, start-up and restarts included: once a batch is counted, it
  stops at a deadline (``WindowPlan.deadline_s``), the open window kept as partial (an epoch timed
  whole ends first), and starts no epoch whose restart and warm-up (as long as the last epoch's;
  timed whole, the whole epoch) would reach the deadline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

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
        never past ``wall_s``; None (no bound) for a batch budget without ``wall_s``."""
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
    method: Method = "windows"
    #: The deadline, in s after the first ``iter()`` (None: none), and whether it ended the run.
    deadline_s: float | None = None
    stopped_by_deadline: bool = False


@dataclass
class Hooks:
    """Called at window boundaries and per batch (e.g. to read CPU counters, kick a watchdog)."""

    window_open: Callable[[], None] = lambda: None
    window_close: Callable[[], None] = lambda: None
    batch: Callable[[], None] = lambda: None


def run(
    make_iter: Callable[[], Iterable[Any]],
    plan: WindowPlan,
    count_samples: Callable[[Any], int],
    *,
    clock: Clock,
    hooks: Hooks | None = None,
    epoch_length: int | None = None,
    consume: Callable[[Any, int], object] | None = None,
    length_hint: int | None = None,
) -> Timeline:
    """Measure ``make_iter()``'s batches according to ``plan``. Raises ``EmptyLoaderError`` if an
    epoch yields nothing; exceptions from the iterator propagate unchanged.

    With ``epoch_length`` (batches per epoch, when known) the window closes at the epoch's last
    batch, before the iterator is asked for more: DataLoader shuts non-persistent workers down
    when it signals the end, and the window-close hook should still see them.

    With ``consume`` (called as ``consume(batch, samples)`` after each batch, like a training
    step), each window also records ``wait_s``: the time spent waiting for batches, the data
    stall. ``length_hint`` (an IterableDataset's ``__len__`` in batches, which it may not keep)
    only decides, until an epoch has ended, whether epochs are too short for windows.
    """
    runner = _Runner(
        plan, count_samples, clock, hooks or Hooks(), epoch_length, consume, length_hint
    )
    timeline = runner.timeline
    while not runner.done() and timeline.epochs < plan.max_epochs and not runner.out_of_time():
        runner.epoch(make_iter)
        if timeline.stopped_by_deadline:
            break
        if timeline.method == "windows" and runner.epoch_too_short():
            timeline.method = "whole-epochs"
    return timeline


class _Runner:
    def __init__(
        self,
        plan: WindowPlan,
        count: Callable[[Any], int],
        clock: Clock,
        hooks: Hooks,
        epoch_length: int | None,
        consume: Callable[[Any, int], object] | None = None,
        length_hint: int | None = None,
    ):
        self.plan, self.count, self.clock, self.hooks = plan, count, clock, hooks
        self.epoch_length, self.consume = epoch_length, consume
        self.length_hint = length_hint  # batches an epoch says it has (not kept to)
        self._asked = 0.0
        self.timeline = Timeline()
        self.open: Window | None = None
        self._epoch_batches = 0
        self._seen_length: int | None = None  # an epoch's batches, once one ran to its end
        self._t0: float | None = None  # the first iter() call
        self._deadline: float | None = None  # on the clock, once the start-up is known
        self._lead_s: float | None = None  # the last epoch's time from iter() to counting

    def done(self) -> bool:
        """Enough full windows; or, when epochs cut windows short (and always when whole epochs
        are timed), enough windows that together cover the planned budget (with a time budget,
        ``MIN_WHOLE_EPOCHS`` whole epochs are enough)."""
        wins = self.timeline.windows
        whole = self.timeline.method == "whole-epochs"
        if not whole and sum(1 for w in wins if w.full) >= self.plan.windows:
            return True
        needed = self.plan.windows
        if whole and self.plan.batches is None:
            needed = min(needed, MIN_WHOLE_EPOCHS)
        if len(wins) < needed:
            return False
        if self.plan.batches is not None:
            return sum(w.batches for w in wins) >= self.plan.batches
        return sum(w.seconds for w in wins) >= (self.plan.seconds or 0.0)

    def measured(self) -> bool:
        """A batch was counted in a window: the run has a rate, and the deadline may end it."""
        return bool(self.timeline.windows) or bool(self.open and self.open.batches)

    def out_of_time(self) -> bool:
        """Before an epoch: past the deadline, or so near it that the next epoch would reach it
        before counting a batch (its restart and warm-up as long as the last epoch's; timed
        whole, the whole epoch). Marks the timeline stopped by the deadline."""
        late = self._deadline is not None and self.measured()
        if late and self.clock() + (self._lead_s or 0.0) > (self._deadline or 0.0):
            self.timeline.stopped_by_deadline = True
        return self.timeline.stopped_by_deadline

    def short_epochs(self) -> bool:
        """Epochs known (or, for an IterableDataset, seen) to be too short for windows: most of
        each would be warm-up."""
        n = self.epoch_length if self.epoch_length is not None else self._seen_length
        n = self.length_hint if n is None else n
        return n is not None and n < WHOLE_EPOCH_FACTOR * self.plan.warmup_batches

    def epoch_too_short(self) -> bool:
        too_short = self._epoch_batches <= self.plan.warmup_batches or self.short_epochs()
        if too_short and self.timeline.windows and self.epoch_length is None:
            # An epoch of unknown length turned out short: its windows, right after warm-up,
            # were mostly batches the workers had queued before they opened. Drop them.
            self.timeline.windows.clear()
            return True
        return too_short and not self.timeline.windows

    def epoch(self, make_iter: Callable[[], Iterable[Any]]) -> None:
        whole = self.timeline.method == "whole-epochs"
        t_call = self.clock()
        self._t0 = t_call if self._t0 is None else self._t0
        iterator: Iterator[Any] = iter(make_iter())
        self._asked, self._lead_s = t_call, None
        if whole:
            # Opened once the epoch's workers exist (so the hook can read them), timed from the
            # call: a whole epoch includes its start-up.
            self._open(t_call)
        self._epoch_batches = 0
        for batch in iterator:
            if self._batch(batch, t_call, whole):
                return
        if self._epoch_batches == 0:
            raise EmptyLoaderError("the loader yielded no batch")
        if self._seen_length is None:
            self._seen_length = self._epoch_batches
        self.timeline.epochs += 1
        if whole or self._lead_s is None:  # nothing counts before the epoch's end
            self._lead_s = self.clock() - t_call
        if self.open is not None:
            self._close(self.open.start + self.open.seconds, full=whole)

    def _batch(self, batch: Any, t_call: float, whole: bool) -> bool:
        """Take one batch of the epoch begun at ``t_call``; True when the run is over."""
        now = self.clock()
        self.hooks.batch()
        self._epoch_batches += 1
        if self._epoch_batches == 1:
            self._record_first(now - t_call)
        samples = self.count(batch)
        waited = now - self._asked
        if self.consume is not None:
            self.consume(batch, samples)
        if whole:
            self._add(samples, waited, now, close_when_full=False)
        elif self._epoch_batches <= self.plan.warmup_batches or self.short_epochs():
            self._warmup(now, t_call)
        elif self._add(samples, waited, now, close_when_full=True) and self.done():
            return True
        self._asked = self.clock() if self.consume is not None else now
        if self._epoch_batches == self.epoch_length:
            if self.open is not None:
                self._close(now, full=whole)
            return False  # the epoch is complete: let it end, before the deadline is looked at
        # An epoch timed whole is short, and part of it would carry a whole restart: it ends.
        if whole or self._deadline is None or now <= self._deadline or not self.measured():
            return False
        if not self._may_stop(now):
            return False  # a first window short of one whole round: finish the round
        self.timeline.stopped_by_deadline = True
        self._close(now, full=False)
        return True

    def _may_stop(self, now: float) -> bool:
        """At the deadline: the run may end unless its only window has not yet seen a whole
        round (it would have no rate worth the name), up to twice the deadline's time."""
        win, rnd = self.open, self.plan.round_batches
        if win is None or self.timeline.windows or win.aligned is not None or rnd == 1:
            return True
        late = 2 * (self._deadline or 0.0) - (self._t0 or 0.0)
        return win.batches % rnd == 0 or now > late

    def _record_first(self, seconds: float) -> None:
        if self.timeline.epochs == 0:
            self.timeline.startup_s = seconds
            bound = self.timeline.deadline_s = self.plan.deadline_s(seconds)
            self._deadline = None if bound is None else (self._t0 or 0.0) + bound
        else:
            self.timeline.epoch_restart_s.append(seconds)

    def _warmup(self, now: float, t_call: float) -> None:
        self.timeline.warmup_batches += 1
        if self._epoch_batches == self.plan.warmup_batches and not self.short_epochs():
            if self.timeline.epochs == 0:
                self.timeline.warmup_s = now - t_call - self.timeline.startup_s
            self._lead_s = now - t_call
            self._open(now)

    def _open(self, now: float) -> None:
        self.open = Window(start=now)
        self.hooks.window_open()

    def _add(self, samples: int, waited: float, now: float, *, close_when_full: bool) -> bool:
        """Count a batch that arrived at ``now`` after ``waited`` s into the open window; returns
        True when that closed the window."""
        if self.open is None:  # only after a window closed mid-epoch: the next one starts here
            self._open(now)
            return False
        win = self.open
        win.batches += 1
        win.samples += samples
        win.wait_s += waited
        win.seconds = now - win.start
        if win.batches % self.plan.round_batches == 0:
            win.aligned = (win.seconds, win.batches, win.samples, win.wait_s)
        if close_when_full and self._full(win):
            self._close(now, full=True)
            if not self.done():
                self._open(now)
            return True
        return False

    def _full(self, win: Window) -> bool:
        by_batches = self.plan.batches_per_window
        if by_batches is not None and win.batches >= by_batches:
            return True
        by_time = self.plan.seconds_per_window
        return (
            by_time is not None
            and win.seconds >= by_time
            and win.batches >= MIN_BATCHES_PER_WINDOW
            and win.batches % self.plan.round_batches == 0
        )

    def _close(self, now: float, *, full: bool) -> None:
        win = self.open
        self.open = None
        if win is None:
            return
        self.hooks.window_close()
        win.seconds = now - win.start
        win.full = full
        mid_round = win.batches % self.plan.round_batches != 0
        # Cut short mid-round (an epoch's end, the deadline): keep its whole rounds; with none,
        # keep it only as the run's one figure.
        cut = not full and mid_round and self.timeline.method == "windows"
        if cut and not win.cut_to_rounds() and self.timeline.windows:
            return
        if win.batches > 0 and win.seconds > 0:
            self.timeline.windows.append(win)
