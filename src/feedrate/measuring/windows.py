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
* with a ``steady`` hook (e.g. every rank of a job warm: ``distributed.channel.Gate``), the
  first epoch's warm-up goes on, batch by batch, until the hook says the windows may open, so
  every rank times the others' steady state, not their start-up; a hook that has not opened
  by the deadline is no longer waited for (``Timeline.unaligned``);
* an epoch that ends early closes the open window as partial and a new epoch begins; when epochs
  are too short for windows (no batch past warm-up, or, when the epoch length is known, fewer than
  ``WHOLE_EPOCH_FACTOR`` warm-ups), the first epoch is warm-up and later epochs are timed whole,
  each epoch's restart included, and the result says so;
* a time budget bounds the whole run, start-up and restarts included: once a batch is counted, it
  stops at a deadline (``WindowPlan.deadline_s``, moved when the first window opens so that it
  leaves the budget's seconds of steady state after the first epoch's warm-up, never past
  ``wall_s``), the open window kept as partial (an epoch timed whole ends first), and starts no
  epoch whose restart and warm-up (as long as the last epoch's; timed whole, the whole epoch)
  would reach the deadline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from feedrate.measuring import runqueue
from feedrate.measuring.runqueue import Queued
from feedrate.measuring.timing import (
    DEADLINE_FACTOR,
    DEFAULT_SECONDS,
    MIN_BATCHES_PER_WINDOW,
    MIN_WHOLE_EPOCHS,
    WHOLE_EPOCH_FACTOR,
    Clock,
    EmptyLoaderError,
    Hooks,
    Method,
    Timeline,
    Window,
    WindowPlan,
)

__all__ = [
    "DEADLINE_FACTOR",
    "DEFAULT_SECONDS",
    "MIN_BATCHES_PER_WINDOW",
    "MIN_WHOLE_EPOCHS",
    "WHOLE_EPOCH_FACTOR",
    "Clock",
    "EmptyLoaderError",
    "Hooks",
    "Method",
    "Timeline",
    "Window",
    "WindowPlan",
    "run",
]


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
    queued: Queued = runqueue.never,
) -> Timeline:
    """Measure ``make_iter()``'s batches according to ``plan``. Raises ``EmptyLoaderError`` if an
    epoch yields nothing; exceptions from the iterator propagate unchanged.

    With ``epoch_length`` (batches per epoch, when known) the window closes at the epoch's last
    batch, before the iterator is asked for more: DataLoader shuts non-persistent workers down
    when it signals the end, and the window-close hook should still see them.

    With ``consume`` (called as ``consume(batch, samples)`` after each batch, like a training
    step), each window also records ``wait_s``: the time spent waiting for batches, the data
    stall, less what the loop spent queued for a CPU (``queued``: its thread's cumulative
    run-queue seconds, see ``runqueue``). ``length_hint`` (an IterableDataset's ``__len__`` in
    batches, which it may not keep) only decides, until an epoch has ended, whether epochs are
    too short for windows.
    """
    runner = _Runner(
        plan, count_samples, clock, hooks or Hooks(), epoch_length, consume, length_hint, queued
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
        queued: Queued = runqueue.never,
    ):
        self.plan, self.count, self.clock, self.hooks = plan, count, clock, hooks
        self.epoch_length, self.consume = epoch_length, consume
        self.length_hint = length_hint  # batches an epoch says it has (not kept to)
        self._asked = 0.0
        # Only a consumer's loop has a stall to take the run queue out of.
        self.queued = queued if consume is not None else runqueue.never
        self._asked_queued = 0.0  # the loop's run-queue seconds when it asked
        self.timeline = Timeline()
        self.open: Window | None = None
        self._epoch_batches = self._epoch_samples = 0
        self._seen_length: int | None = None  # an epoch's batches, once one ran to its end
        self._t0: float | None = None  # the first iter() call
        self._deadline: float | None = None  # on the clock, once the start-up is known
        self._lead_s: float | None = None  # the last epoch's time from iter() to counting
        self._warm_at: float | None = None  # the first epoch's warm-up done, on the clock
        self._steady = False  # the ``steady`` hook said yes (or was given up on)

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
        self._asked_queued = self.queued()
        if whole:
            # Opened once the epoch's workers exist (so the hook can read them), timed from the
            # call: a whole epoch includes its start-up.
            self._open(t_call)
        self._epoch_batches = self._epoch_samples = 0
        for batch in iterator:
            if self._batch(batch, t_call, whole):
                return
        if self._epoch_batches == 0:
            raise EmptyLoaderError("the loader yielded no batch")
        if self._seen_length is None:
            self._seen_length = self._epoch_batches
            self.timeline.epoch_samples = self._epoch_samples
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
        self._epoch_samples += samples
        waited = now - self._asked
        if self.consume is not None:
            waited, _ = runqueue.split(waited, 0.0, self.queued() - self._asked_queued)
            self.consume(batch, samples)
            # A batch is done once consumed: windows run from one step's end to another's, so
            # warm-up ends after its last step (a real step's first calls, which build the model
            # and load CUDA kernels, are warm-up, not the first window's), and a window holds
            # as many steps as loads.
            now = self.clock()
        if whole:
            self._add(samples, waited, now, close_when_full=False)
        elif self._warming():
            self._warmup(now, t_call)
        elif self._add(samples, waited, now, close_when_full=True) and self.done():
            return True
        if self.consume is not None:  # the hooks' own time (a window opened) is no stall
            self._asked, self._asked_queued = self.clock(), self.queued()
        else:
            self._asked = now
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

    def _warming(self) -> bool:
        """The batch just taken is warm-up: within the epoch's warm-up count, in an epoch too
        short for windows, or, in the first epoch, while the ``steady`` hook holds the windows
        back."""
        if self._epoch_batches <= self.plan.warmup_batches or self.short_epochs():
            return True
        return self.timeline.epochs == 0 and self.open is None and not self._steady

    def _warmup(self, now: float, t_call: float) -> None:
        self.timeline.warmup_batches += 1
        if self._epoch_batches < self.plan.warmup_batches or self.short_epochs():
            return
        first = self.timeline.epochs == 0
        if first and not self._steady and not self._may_open(now):
            return
        if first:
            self.timeline.warmup_s = now - t_call - self.timeline.startup_s
            self._steady_from(now)
        self._lead_s = now - t_call
        self._open(now)

    def _may_open(self, now: float) -> bool:
        """The first epoch's warm-up is done: may its windows open? The ``steady`` hook says;
        past the deadline the run had, it is no longer waited for."""
        self._warm_at = now if self._warm_at is None else self._warm_at
        if self.hooks.steady():
            self._steady = True
        elif self._deadline is not None and now > self._deadline:
            self._steady = self.timeline.unaligned = True
        else:
            return False
        self.timeline.steady_wait_s = now - self._warm_at
        return True

    def _steady_from(self, now: float) -> None:
        """The first window opens at ``now``: a time budget gets its seconds of steady state
        from here, however long start-up, warm-up (one batch per worker and the queue: long
        with many workers) and the wait for the ``steady`` hook took, within ``wall_s``."""
        if self._deadline is None or not self.plan.seconds:
            return
        cap = (self._t0 or 0.0) + self.plan.wall_s if self.plan.wall_s else math.inf
        self._deadline = max(self._deadline, min(now + self.plan.seconds, cap))
        self.timeline.deadline_s = self._deadline - (self._t0 or 0.0)

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
