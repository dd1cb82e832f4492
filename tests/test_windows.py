"""Tests for feedrate.windows: the timing core, driven by a fake clock and a scripted loader so
every rate is exact and nothing depends on the speed of the machine.

Times are dyadic fractions (0.125, 0.25, 0.5, ...) wherever a test compares floats exactly: their
sums are exact in binary floating point."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedrate.measuring.rates import stall_fraction, summarize
from feedrate.measuring.windows import (
    MIN_BATCHES_PER_WINDOW,
    EmptyLoaderError,
    Hooks,
    Timeline,
    Window,
    WindowPlan,
    run,
)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Cost = Callable[[int, int], float]


def constant(seconds: float) -> Cost:
    return lambda _epoch, _index: seconds


@dataclass
class ScriptedLoader:
    """An iterator factory: every call starts an epoch of ``length(epoch)`` batches. Fetching batch
    ``i`` of epoch ``e`` advances the clock by ``cost(e, i)``, plus ``startup(e)`` before the
    first batch. Each batch is the int ``batch_size`` (count it with ``int``). ``events`` records
    what happened, in order: ("iter", e), ("batch", e, i) and ("stop", e) when the consumer asks
    past the last batch (the moment a DataLoader would shut its workers down)."""

    clock: FakeClock
    cost: Cost
    length: Callable[[int], int] = lambda _epoch: 1000
    startup: Callable[[int], float] = lambda _epoch: 0.0
    batch_size: int = 4
    events: list[tuple[object, ...]] = field(default_factory=list)
    epochs_started: int = 0

    def __call__(self) -> Iterator[int]:
        epoch = self.epochs_started
        self.epochs_started += 1
        self.events.append(("iter", epoch))
        return self._epoch(epoch)

    def _epoch(self, epoch: int) -> Iterator[int]:
        for i in range(self.length(epoch)):
            self.clock.advance(self.cost(epoch, i) + (self.startup(epoch) if i == 0 else 0.0))
            self.events.append(("batch", epoch, i))
            yield self.batch_size
        self.events.append(("stop", epoch))


def scripted(
    cost: Cost | float,
    *,
    length: int | Callable[[int], int] = 1000,
    startup: float | Callable[[int], float] = 0.0,
    batch_size: int = 4,
) -> tuple[FakeClock, ScriptedLoader]:
    clock = FakeClock()
    loader = ScriptedLoader(
        clock,
        cost if callable(cost) else constant(cost),
        length if callable(length) else (lambda _e, n=length: n),
        startup if callable(startup) else (lambda _e, s=startup: s),
        batch_size,
    )
    return clock, loader


def measure(
    loader: ScriptedLoader, plan: WindowPlan, *, hooks: Hooks | None = None, **kw: int
) -> Timeline:
    return run(loader, plan, int, clock=loader.clock, hooks=hooks, **kw)


# --- start-up, restarts, warm-up ---------------------------------------------------------------


def test_startup_is_recorded_apart_and_not_in_windows() -> None:
    _, loader = scripted(0.5, startup=3.0)
    t = measure(loader, WindowPlan(windows=2, batches=4, warmup_batches=1))
    assert t.startup_s == 3.5  # start-up delay + the first batch: the time to the first batch
    assert t.method == "windows"
    assert [w.batches for w in t.windows] == [2, 2]
    assert all(w.start >= t.startup_s for w in t.windows)
    assert sum(w.seconds for w in t.windows) == 2.0
    assert summarize(t.windows).samples_per_s == 8.0  # 4 samples / 0.5 s, start-up left out
    assert t.epoch_restart_s == []


def test_epoch_restarts_are_recorded_apart() -> None:
    restart = [1.0, 2.0, 4.0, 8.0]
    _, loader = scripted(0.5, length=3, startup=lambda e: restart[e])
    # 2 batches per window; each 3-batch epoch gives one full window after its warm-up batch.
    t = measure(loader, WindowPlan(windows=3, batches=6, warmup_batches=1))
    assert t.startup_s == 1.5
    assert t.epoch_restart_s == [2.5, 4.5]
    assert loader.epochs_started == 3
    assert [(w.batches, w.full) for w in t.windows] == [(2, True)] * 3
    rate = summarize(t.windows)
    assert rate.samples_per_s == 8.0
    assert rate.min == rate.max == 8.0


def test_warmup_is_timed_and_counted_on_first_epoch() -> None:
    _, loader = scripted(lambda _e, i: 0.25 if i < 3 else 1.0, startup=2.0)
    t = measure(loader, WindowPlan(windows=1, batches=2, warmup_batches=3))
    assert t.startup_s == 2.25
    assert t.warmup_batches == 3
    assert t.warmup_s == 0.5  # batches 2 and 3, after the first
    assert t.windows[0].start == 2.75


def test_prefetched_warmup_batches_earn_no_credit() -> None:
    """Workers fill their queues during start-up: those batches arrive at once, at zero cost.
    Discarding them (warm-up = queue depth) leaves exactly the steady rate."""
    queue = 6

    def cost(_epoch: int, index: int) -> float:
        return 0.0 if index < queue else 0.5

    _, loader = scripted(cost, length=20, startup=5.0)
    t = measure(loader, WindowPlan(windows=3, batches=30, warmup_batches=queue))
    rate = summarize(t.windows)
    assert rate.samples_per_s == 8.0
    assert rate.min == rate.max == 8.0
    assert t.warmup_s == 0.0
    assert loader.epochs_started > 1  # every epoch's prefetched batches were discarded
    assert all(w.samples_per_s == 8.0 for w in t.windows)

    # The same run with too short a warm-up credits the free batches and flatters the loader.
    _, loader = scripted(cost, length=20, startup=5.0)
    flattered = measure(loader, WindowPlan(windows=3, batches=30, warmup_batches=1))
    assert summarize(flattered.windows).samples_per_s > 8.0


# --- plans -------------------------------------------------------------------------------------


def test_window_plan_sizes() -> None:
    assert WindowPlan(windows=4, batches=10).batches_per_window == 3
    assert WindowPlan(windows=5, batches=10).batches_per_window == 2
    assert WindowPlan(windows=4, seconds=2.0).seconds_per_window == 0.5
    assert WindowPlan(windows=4, batches=None, seconds=2.0).batches_per_window is None
    assert WindowPlan(windows=4, batches=8, seconds=None).seconds_per_window is None


def test_batch_plan_closes_windows_by_batches() -> None:
    _, loader = scripted(0.25)
    t = measure(loader, WindowPlan(windows=4, batches=10, seconds=None, warmup_batches=1))
    # ceil(10 / 4) = 3 batches per window, so 12 batches are measured.
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [(3, 0.75, True)] * 4
    assert t.epochs == 0  # the first epoch was still running when the windows were done


@pytest.mark.parametrize(("cost", "per_window"), [(0.25, 2), (0.125, 4)])
def test_seconds_plan_closes_windows_by_time(cost: float, per_window: int) -> None:
    _, loader = scripted(cost)
    t = measure(loader, WindowPlan(windows=4, seconds=2.0, warmup_batches=1))
    assert [(w.batches, w.seconds) for w in t.windows] == [(per_window, 0.5)] * 4
    assert all(w.full for w in t.windows)


def test_time_window_waits_for_min_batches() -> None:
    clock, loader = scripted(1.0)  # each batch is slower than a whole window
    t = measure(loader, WindowPlan(windows=3, seconds=1.5, warmup_batches=1))
    # Three such windows would take 7 s: the first batch past the deadline (2 × 1.5 s) ends the
    # run, in a partial window.
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [
        (MIN_BATCHES_PER_WINDOW, 2.0, True),
        (1, 1.0, False),
    ]
    assert t.stopped_by_deadline and clock.now == 4.0


def test_windows_are_consecutive() -> None:
    _, loader = scripted(0.25)
    t = measure(loader, WindowPlan(windows=3, batches=6, seconds=None, warmup_batches=2))
    for before, after in zip(t.windows, t.windows[1:], strict=False):
        assert after.start == before.start + before.seconds


def test_spread_across_windows_is_exact() -> None:
    # Warm-up batch, then 2 batches per window at 0.5 s, 0.25 s, 1.0 s, 0.125 s each.
    per_window = [0.5, 0.25, 1.0, 0.125]

    def cost(_epoch: int, index: int) -> float:
        return 1.0 if index == 0 else per_window[(index - 1) // 2]

    _, loader = scripted(cost)
    t = measure(loader, WindowPlan(windows=4, batches=8, warmup_batches=1))
    rate = summarize(t.windows)
    assert rate.windows == [8.0, 16.0, 4.0, 32.0]
    assert (rate.min, rate.max, rate.median) == (4.0, 32.0, 12.0)
    assert rate.samples_per_s == 32 / 3.75
    assert rate.batches_per_s == 8 / 3.75
    assert rate.rel_spread == (32.0 - 4.0) / 12.0
    assert rate.stdev == pytest.approx(statistics.stdev([8.0, 16.0, 4.0, 32.0]))


# --- short epochs ------------------------------------------------------------------------------


def test_epochs_shorter_than_a_window_are_iterated_again() -> None:
    _, loader = scripted(0.5, length=5, startup=3.0)
    t = measure(loader, WindowPlan(windows=2, batches=20, warmup_batches=1))
    # Each epoch: 1 warm-up batch, then 4 batches in a partial window; 20 batches in 5 epochs.
    assert loader.epochs_started == 5
    assert t.epochs == 5
    assert [(w.batches, w.full) for w in t.windows] == [(4, False)] * 5
    assert t.epoch_restart_s == [3.5] * 4
    assert t.warmup_batches == 5
    assert t.method == "windows"
    assert summarize(t.windows).samples_per_s == 8.0


def test_epoch_end_closes_window_at_last_batch_time() -> None:
    _, loader = scripted(0.5, length=4, startup=100.0)
    t = measure(loader, WindowPlan(windows=2, batches=21, warmup_batches=1))
    assert len(t.windows) == 7  # 7 x 3 batches make the 21 asked for
    # Each window ends at its epoch's last batch: the restart delay never lands in a window.
    assert [(w.seconds, w.full) for w in t.windows] == [(1.5, False)] * 7


def test_full_and_partial_windows_mix_across_epochs() -> None:
    _, loader = scripted(0.5, length=10)
    t = measure(loader, WindowPlan(windows=2, batches=12, warmup_batches=1))
    # 6 per window: epoch 1 gives a full one and 3 batches of a partial one; epoch 2 a full one.
    assert [(w.batches, w.full) for w in t.windows] == [(6, True), (3, False), (6, True)]
    rate = summarize(t.windows)
    assert rate.windows == [8.0, 8.0]  # the spread uses the full windows only


@pytest.mark.parametrize(("length", "warmup"), [(1, 1), (2, 2), (2, 5)])
def test_epochs_too_short_for_warmup_time_whole_epochs(length: int, warmup: int) -> None:
    _, loader = scripted(0.5, length=length, startup=lambda e: 2.0 if e == 0 else 1.0)
    per_epoch = 1.0 + 0.5 * length
    t = measure(loader, WindowPlan(windows=3, seconds=3 * per_epoch, warmup_batches=warmup))
    assert t.method == "whole-epochs"
    # The first epoch found out; then one whole epoch per window (the budget is exactly three),
    # start-up included.
    assert loader.epochs_started == t.epochs == 4
    assert t.startup_s == 2.5
    assert t.epoch_restart_s == [1.5] * 3
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [(length, per_epoch, True)] * 3
    assert summarize(t.windows).samples_per_s == 4 * length / per_epoch


def test_epoch_just_past_warmup_is_timed_whole_once_its_length_is_seen() -> None:
    # One batch a window after a warm-up of 2 would credit queued work: whole epochs instead.
    _, loader = scripted(0.5, length=3)
    t = measure(loader, WindowPlan(windows=2, batches=4, warmup_batches=2))
    assert t.method == "whole-epochs"
    assert all(w.batches == 3 for w in t.windows)


def test_max_epochs_bounds_the_run() -> None:
    _, loader = scripted(0.5, length=4)
    t = measure(loader, WindowPlan(windows=2, seconds=1000.0, warmup_batches=1, max_epochs=7))
    assert loader.epochs_started == t.epochs == 7
    assert len(t.windows) == 7
    assert sum(w.seconds for w in t.windows) == 7 * 1.5


def test_max_epochs_bounds_whole_epochs() -> None:
    _, loader = scripted(0.5, length=1)
    t = measure(loader, WindowPlan(windows=5, seconds=10.0, warmup_batches=1, max_epochs=3))
    assert t.method == "whole-epochs"
    assert loader.epochs_started == 3
    assert len(t.windows) == 2


# --- epoch_length and hooks --------------------------------------------------------------------


def _recording_hooks(events: list[tuple[object, ...]]) -> Hooks:
    return Hooks(
        window_open=lambda: events.append(("open",)),
        window_close=lambda: events.append(("close",)),
        batch=lambda: events.append(("hook-batch",)),
    )


def _closes_before_stop(events: list[tuple[object, ...]], epoch: int, length: int) -> bool:
    last = events.index(("batch", epoch, length - 1))
    stop = events.index(("stop", epoch))
    return ("close",) in events[last + 1 : stop]


def test_epoch_length_closes_window_before_iterator_ends() -> None:
    _, loader = scripted(0.5, length=4)
    hooks = _recording_hooks(loader.events)
    t = measure(
        loader, WindowPlan(windows=2, batches=20, warmup_batches=1), hooks=hooks, epoch_length=4
    )
    assert t.epochs == loader.epochs_started == 7
    for epoch in range(t.epochs):
        assert _closes_before_stop(loader.events, epoch, 4)
    assert [(w.batches, w.seconds) for w in t.windows] == [(3, 1.5)] * 7


def test_without_epoch_length_window_closes_after_iterator_ends() -> None:
    _, loader = scripted(0.5, length=4)
    hooks = _recording_hooks(loader.events)
    t = measure(loader, WindowPlan(windows=2, batches=20, warmup_batches=1), hooks=hooks)
    assert not _closes_before_stop(loader.events, 0, 4)
    assert [(w.batches, w.seconds) for w in t.windows] == [(3, 1.5)] * 7  # same times either way


def test_epoch_length_closes_whole_epoch_before_iterator_ends() -> None:
    _, loader = scripted(0.5, length=2, startup=1.0)
    hooks = _recording_hooks(loader.events)
    t = measure(
        loader, WindowPlan(windows=2, batches=2, warmup_batches=3), hooks=hooks, epoch_length=2
    )
    assert t.method == "whole-epochs"
    for epoch in range(1, t.epochs):
        assert _closes_before_stop(loader.events, epoch, 2)
    assert [(w.seconds, w.full) for w in t.windows] == [(2.0, True)] * 2


def test_hooks_pair_up_and_see_every_batch() -> None:
    _, loader = scripted(0.25, length=7)
    hooks = _recording_hooks(loader.events)
    measure(loader, WindowPlan(windows=3, batches=9, warmup_batches=2), hooks=hooks, epoch_length=7)
    kinds = [e[0] for e in loader.events]
    assert kinds.count("hook-batch") == kinds.count("batch")
    depth = 0
    for kind in kinds:
        if kind == "open":
            assert depth == 0
            depth += 1
        elif kind == "close":
            assert depth == 1
            depth -= 1
    assert depth == 0


# --- errors ------------------------------------------------------------------------------------


def test_empty_loader_raises() -> None:
    clock = FakeClock()
    with pytest.raises(EmptyLoaderError):
        run(lambda: iter(()), WindowPlan(), int, clock=clock)


def test_empty_later_epoch_raises() -> None:
    _, loader = scripted(0.5, length=lambda e: 3 if e == 0 else 0)
    with pytest.raises(EmptyLoaderError):
        measure(loader, WindowPlan(windows=2, batches=10, warmup_batches=1))


def test_iterator_exceptions_propagate_unchanged() -> None:
    class Boom(Exception):
        pass

    def batches() -> Iterator[int]:
        yield 4
        yield 4
        raise Boom("from the user's dataset")

    with pytest.raises(Boom, match="user's dataset"):
        run(batches, WindowPlan(windows=1, batches=5), int, clock=FakeClock())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"windows": 0}, "windows must be 1 or more"),
        ({"windows": 5, "batches": 4}, r"at least the number of windows \(5\)"),
        ({"seconds": 0.0}, "seconds must be positive"),
        ({"seconds": -1.0}, "seconds must be positive"),
    ],
)
def test_window_plan_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WindowPlan(**kwargs)  # type: ignore[arg-type]


# --- summarize ---------------------------------------------------------------------------------


def test_summarize_aggregates_and_spreads_the_same_full_windows() -> None:
    wins = [
        Window(start=0.0, seconds=1.0, batches=2, samples=8, full=True),
        Window(start=1.0, seconds=2.0, batches=2, samples=8, full=True),
        Window(start=3.0, seconds=0.5, batches=1, samples=100, full=False),
    ]
    rate = summarize(wins)
    assert rate.samples_per_s == 16 / 3.0  # the cut window is in neither figure
    assert rate.batches_per_s == 4 / 3.0
    assert rate.windows == [8.0, 4.0]
    assert (rate.min, rate.max, rate.median) == (4.0, 8.0, 6.0)
    assert rate.stdev == pytest.approx(math.sqrt(8.0))


def test_summarize_rate_lies_within_the_windows_it_shows() -> None:
    # QA: "steady state 189 samples/s" above "4 windows: median 76.9, range 70.0-99.5": the
    # machine others loaded freed up while epochs' ends cut 3 windows short, and those counted
    # in the rate but not in the spread.
    full = [
        Window(2.5 * i, 2.5, n // 32, n, full=True, wait_s=0.25)
        for i, n in enumerate((175, 192, 208, 249))  # 70-99.6 samples/s
    ]
    cut = [Window(10.0 + i, 1.0, 15, 480, wait_s=0.5) for i in range(3)]
    rate = summarize([*full, *cut])
    assert len(rate.windows) == 4 and (rate.min, rate.max) == (70.0, 249 / 2.5)
    assert rate.min <= rate.samples_per_s <= rate.max
    assert rate.samples_per_s == 824 / 10.0
    assert stall_fraction([*full, *cut]) == 1.0 / 10.0  # the stall of the same windows


def test_summarize_uses_partial_windows_when_no_full_ones() -> None:
    wins = [Window(0.0, 1.0, 1, 4), Window(1.0, 0.5, 1, 4)]
    rate = summarize(wins)
    assert rate.windows == [4.0, 8.0]
    assert rate.samples_per_s == 8 / 1.5


def test_summarize_spreads_all_windows_where_full_ones_are_few() -> None:
    # Epochs of a few dozen batches: every window cut at its epoch's end but one, which a pause
    # on a busy machine made full by time. Its rate alone was the spread (median 11,794 beside
    # 117,038 samples/s measured): the many partial windows are the spread.
    cut = [Window(start=float(i), seconds=0.02, batches=34, samples=2176) for i in range(29)]
    paused = Window(start=30.0, seconds=0.2, batches=34, samples=2176, full=True)
    rate = summarize([*cut, paused])
    assert len(rate.windows) == 30 and rate.median == pytest.approx(108_800)


def test_summarize_nothing() -> None:
    rate = summarize([])
    assert (rate.samples_per_s, rate.windows, rate.median, rate.rel_spread) == (0.0, [], 0.0, 0.0)


def test_single_window_has_no_spread() -> None:
    rate = summarize([Window(0.0, 2.0, 4, 16, full=True)])
    assert (rate.stdev, rate.rel_spread, rate.samples_per_s) == (0.0, 0.0, 8.0)


def test_window_rate_without_time_is_zero() -> None:
    assert Window(start=1.0, batches=1, samples=4).samples_per_s == 0.0


# --- the property: a constant pipeline measures its own rate -----------------------------------


@settings(max_examples=200, deadline=None)
@given(
    t=st.floats(min_value=1e-3, max_value=10.0, allow_nan=False, allow_infinity=False),
    b=st.integers(min_value=1, max_value=512),
    warmup=st.integers(min_value=1, max_value=8),
    length=st.integers(min_value=1, max_value=30),
    windows=st.integers(min_value=1, max_value=4),
    per_window=st.integers(min_value=1, max_value=6),
    by_time=st.booleans(),
    pass_length=st.booleans(),
    first_startup=st.floats(min_value=0.0, max_value=100.0),
)
def test_constant_pipeline_measures_b_over_t(
    t: float,
    b: int,
    warmup: int,
    length: int,
    windows: int,
    per_window: int,
    by_time: bool,
    pass_length: bool,
    first_startup: float,
) -> None:
    # The first epoch may start slowly: whole-epochs mode never times the first epoch, and
    # windows mode never times a start-up.
    _, loader = scripted(t, length=length, batch_size=b, startup=lambda e: first_startup * (e == 0))
    if by_time:
        plan = WindowPlan(windows, None, windows * per_window * t, warmup, max_epochs=60)
    else:
        plan = WindowPlan(windows, windows * per_window, None, warmup, max_epochs=60)
    kw = {"epoch_length": length} if pass_length else {}
    timeline = measure(loader, plan, **kw)
    rate = summarize(timeline.windows)
    assert timeline.windows
    assert rate.samples_per_s == pytest.approx(b / t, rel=1e-9)
    assert rate.min == pytest.approx(b / t, rel=1e-9)
    assert rate.max == pytest.approx(b / t, rel=1e-9)


# --- the deadline: a time budget bounds the wall time, start-up and restarts included --------


def test_the_deadline_is_twice_the_budget_or_the_budget_past_a_long_start_up() -> None:
    assert WindowPlan(seconds=1.0).deadline_s(startup_s=0.5) == 2.0
    assert WindowPlan(seconds=1.0).deadline_s(startup_s=1.5) == 2.5
    assert WindowPlan(seconds=1.0, wall_s=1.25).deadline_s(startup_s=1.5) == 1.25
    assert WindowPlan(windows=2, batches=10).deadline_s(startup_s=9.0) is None
    assert WindowPlan(windows=2, batches=10, wall_s=3.0).deadline_s(startup_s=9.0) == 3.0
    with pytest.raises(ValueError, match="wall_s must be positive"):
        WindowPlan(seconds=1.0, wall_s=0.0)


def test_slow_epoch_restarts_stop_at_the_deadline() -> None:
    # Every epoch waits 1.5 s for its workers (a worker_init_fn opening a storage client), then
    # 20 batches of 1/64 s, 6 of them warm-up: 14/64 s of steady state an epoch. 4 s of it would
    # take 19 epochs (34 s); the run ends by its 8 s deadline, starting no epoch whose restart
    # and warm-up would reach it.
    clock, loader = scripted(1 / 64, length=20, startup=1.5)
    t = measure(loader, WindowPlan(windows=4, seconds=4.0, warmup_batches=6))
    assert t.method == "windows" and t.deadline_s == 8.0 and t.stopped_by_deadline
    assert clock.now == 4 * (1.5 + 20 / 64) <= t.deadline_s
    assert loader.epochs_started == t.epochs == 4
    assert t.epoch_restart_s == [1.5 + 1 / 64] * 3
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [(14, 14 / 64, False)] * 4
    assert summarize(t.windows).samples_per_s == 4 * 64  # the steady state, restarts left out


def test_a_window_cut_by_the_deadline_is_kept_as_partial() -> None:
    # 2 s restarts, 12 batches of 0.25 s: the second epoch starts before the 8 s deadline and is
    # cut at its first batch past it.
    clock, loader = scripted(0.25, length=12, startup=2.0)
    t = measure(loader, WindowPlan(windows=2, seconds=4.0, warmup_batches=1))
    assert t.deadline_s == 8.0 and t.stopped_by_deadline and clock.now == 8.25
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [
        (8, 2.0, True),
        (3, 0.75, False),
        (4, 1.0, False),
    ]
    assert loader.epochs_started == 2 and t.epochs == 1


def test_whole_epochs_with_slow_restarts_stop_at_the_deadline() -> None:
    # One batch an epoch, 1.5 s to start each: 2 s per whole epoch. After the warm-up epoch one
    # whole epoch is timed, and none more once it would end past the 3 s deadline (not 5 whole
    # epochs, 12 s).
    clock, loader = scripted(0.5, length=1, startup=1.5)
    t = measure(loader, WindowPlan(windows=5, seconds=1.0, warmup_batches=1))
    assert t.method == "whole-epochs" and t.stopped_by_deadline and t.deadline_s == 3.0
    assert clock.now == 4.0  # the deadline waits for a first measured epoch
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [(1, 2.0, True)]


def test_two_whole_epochs_meet_a_time_budget() -> None:
    # 1 s whole epochs (0.5 s restart): two cover the 2 s budget, without waiting for 5.
    clock, loader = scripted(0.5, length=1, startup=0.5)
    t = measure(loader, WindowPlan(windows=5, seconds=2.0, warmup_batches=1))
    assert t.method == "whole-epochs" and not t.stopped_by_deadline
    assert [w.seconds for w in t.windows] == [1.0, 1.0] and clock.now == 3.0


def test_an_epoch_timed_whole_ends_past_the_deadline_rather_than_being_cut() -> None:
    # Epochs of 3 batches (warm-up 2: timed whole) with 0.5 s restarts; the third epoch is slower
    # than the second foretold (0.75 s batches) and passes the 4 s deadline: part of it would
    # carry its whole restart, so it runs to its end.
    cost = lambda e, _i: 0.25 if e < 2 else 0.75  # noqa: E731
    clock, loader = scripted(cost, length=3, startup=lambda e: 0.0 if e == 0 else 0.5)
    t = measure(loader, WindowPlan(windows=5, seconds=2.0, warmup_batches=2))
    assert t.method == "whole-epochs" and t.deadline_s == 4.0
    assert [(w.batches, w.seconds, w.full) for w in t.windows] == [(3, 1.25, True), (3, 2.75, True)]
    assert clock.now == 4.75


def test_wall_s_bounds_a_batch_plan() -> None:
    clock, loader = scripted(0.5)
    t = measure(loader, WindowPlan(windows=2, batches=100, warmup_batches=1, wall_s=3.0))
    assert t.stopped_by_deadline and clock.now == 3.5
    assert [(w.batches, w.full) for w in t.windows] == [(6, False)]


def test_hooks_see_every_window_close_at_the_deadline() -> None:
    events: list[tuple[object, ...]] = []
    _, loader = scripted(0.25, length=12, startup=2.0)
    t = measure(loader, WindowPlan(windows=2, seconds=4.0), hooks=_recording_hooks(events))
    assert t.stopped_by_deadline
    kinds = [e[0] for e in events if e[0] in ("open", "close")]
    assert kinds.count("open") == kinds.count("close") > 0


@settings(max_examples=200, deadline=None)
@given(
    cost=st.sampled_from([1 / 64, 1 / 16, 1 / 4, 1.0]),
    restart=st.sampled_from([0.0, 0.25, 1.5, 4.0]),
    first=st.sampled_from([0.0, 1.5, 10.0]),
    length=st.integers(min_value=1, max_value=40),
    warmup=st.integers(min_value=1, max_value=8),
    seconds=st.sampled_from([0.5, 1.0, 4.0]),
    windows=st.integers(min_value=1, max_value=5),
    pass_length=st.booleans(),
)
def test_a_time_budget_bounds_the_wall_time(
    cost: float,
    restart: float,
    first: float,
    length: int,
    warmup: int,
    seconds: float,
    windows: int,
    pass_length: bool,
) -> None:
    # Whatever the start-up, restarts and epoch lengths: the run ends by its deadline plus one
    # batch, or, where nothing could be measured by then, one batch after the first epoch that
    # was (the second, when epochs are timed whole).
    clock, loader = scripted(cost, length=length, startup=lambda e: first if e == 0 else restart)
    plan = WindowPlan(windows=windows, seconds=seconds, warmup_batches=warmup)
    t = measure(loader, plan, **({"epoch_length": length} if pass_length else {}))
    assert t.deadline_s is not None and t.windows
    first_epoch, epoch = first + length * cost, restart + length * cost
    assert clock.now <= max(t.deadline_s, first_epoch + 2 * epoch) + cost


# --- questionable behaviour, recorded ----------------------------------------------------------


def test_batch_plan_alone_measures_the_batches_asked_for() -> None:
    _, loader = scripted(1.0)
    t = measure(loader, WindowPlan(windows=2, batches=20, warmup_batches=1))
    assert sum(w.batches for w in t.windows) == 20


def test_zero_warmup_is_rejected_and_single_batch_epochs_still_measure() -> None:
    with pytest.raises(ValueError, match="the first batch carries start-up"):
        WindowPlan(windows=2, seconds=4.0, warmup_batches=0, max_epochs=20)
    _, loader = scripted(0.5, length=1)
    t = measure(loader, WindowPlan(windows=2, seconds=4.0, warmup_batches=1, max_epochs=20))
    assert t.method == "whole-epochs"
    assert [w.batches for w in t.windows] == [1] * 8  # 0.5 s epochs, timed whole, to 4 s
    assert sum(w.seconds for w in t.windows) == 4.0


def test_whole_epochs_honour_the_time_budget() -> None:
    _, loader = scripted(0.5, length=1, startup=0.5)  # 1 s per whole epoch, start-up included
    t = measure(loader, WindowPlan(windows=2, seconds=10.0, warmup_batches=1))
    assert t.method == "whole-epochs"
    assert sum(w.seconds for w in t.windows) >= 10.0


# --- consumer and data stall -------------------------------------------------------------------


def test_consumer_time_splits_window_into_work_and_stall() -> None:
    clock, loader = scripted(0.125)
    eaten: list[int] = []

    def consume(batch: int, samples: int) -> None:
        eaten.append(samples)
        clock.advance(0.375)

    t = run(loader, WindowPlan(windows=2, batches=8), int, clock=clock, consume=consume)
    assert eaten and set(eaten) == {4}
    assert stall_fraction(t.windows) == 0.125 / 0.5
    assert summarize(t.windows).samples_per_s == 4 / 0.5


def test_a_consumers_slow_first_call_is_warm_up_not_the_first_window() -> None:
    # A real training step's first call builds the model and loads CUDA kernels (seconds on a
    # GPU): that call is made on the warm-up batch, and the window opens once it returns.
    clock, loader = scripted(0.125)
    calls: list[int] = []

    def consume(batch: int, samples: int) -> None:
        clock.advance(5.0 if not calls else 0.375)
        calls.append(samples)

    plan = WindowPlan(windows=2, batches=8, warmup_batches=1)
    t = run(loader, plan, int, clock=clock, consume=consume)
    assert len(calls) == 9 and t.warmup_batches == 1
    assert summarize(t.windows).samples_per_s == 4 / 0.5  # 0.125 s to load + 0.375 s to step
    assert stall_fraction(t.windows) == 0.125 / 0.5
    assert t.warmup_s == pytest.approx(5.0)  # the first call, apart from the steady state


def test_a_wait_the_loop_spent_queued_for_a_cpu_is_no_stall() -> None:
    # Each batch takes 0.125 s to come, of which the loop's thread sat 0.1 s in the run queue
    # (a busy machine): only 0.025 s of it was waiting for data.
    clock, loader = scripted(0.125)

    def consume(batch: int, samples: int) -> None:
        clock.advance(0.375)

    def queued() -> float:  # 0.1 s of every 0.125 s spent loading, none of the step's
        return 0.1 * (clock.now // 0.5) + min(clock.now % 0.5, 0.1)

    plan = WindowPlan(windows=2, batches=8)
    t = run(loader, plan, int, clock=clock, consume=consume, queued=queued)
    assert stall_fraction(t.windows) == pytest.approx(0.025 / 0.5)
    assert summarize(t.windows).samples_per_s == 4 / 0.5  # the rate is the clock's alone


def test_without_consumer_every_interval_is_wait() -> None:
    clock, loader = scripted(0.25)
    t = run(loader, WindowPlan(windows=1, batches=4), int, clock=clock)
    assert stall_fraction(t.windows) == 1.0  # nothing but waiting: meaningless, so unreported


def test_known_short_epochs_are_timed_whole_after_a_first_warmup_epoch() -> None:
    # 10 batches an epoch, warm-up 4: windows would keep 6 of every 10 batches; timed whole.
    _, loader = scripted(0.25, length=10, startup=lambda e: 5.0 if e == 0 else 0.5)
    t = measure(loader, WindowPlan(windows=2, batches=20, warmup_batches=4), epoch_length=10)
    assert t.method == "whole-epochs"
    assert t.startup_s == 5.25
    assert all(w.batches == 10 for w in t.windows)
    assert [w.seconds for w in t.windows] == [3.0, 3.0]  # restart 0.5 + 10 x 0.25
    assert loader.epochs_started == 3


def test_long_enough_epochs_stay_in_windows() -> None:
    _, loader = scripted(0.25, length=12)
    t = measure(loader, WindowPlan(windows=2, batches=8, warmup_batches=4), epoch_length=12)
    assert t.method == "windows"


def test_an_unknown_short_epoch_seen_once_is_timed_whole_and_its_windows_dropped() -> None:
    # An IterableDataset (length unknown) of 10 batches, warm-up 4: the first epoch's window
    # holds 6 batches that were queued before it opened. Once the epoch's length is seen, those
    # windows are dropped and whole epochs are timed, as for a known short epoch.
    _, loader = scripted(0.25, length=10, startup=lambda e: 5.0 if e == 0 else 0.5)
    t = measure(loader, WindowPlan(windows=2, batches=20, warmup_batches=4))
    assert t.method == "whole-epochs"
    assert all(w.batches == 10 for w in t.windows)
    assert [w.seconds for w in t.windows] == [3.0, 3.0]


def test_an_unknown_long_epoch_keeps_its_windows() -> None:
    _, loader = scripted(0.25, length=40)
    t = measure(loader, WindowPlan(windows=2, batches=8, warmup_batches=4))
    assert t.method == "windows" and t.epochs == 0  # done inside the first epoch


# --- workers deliver in rounds ------------------------------------------------------------------


def bursts(workers: int, batch_s: float) -> Cost:
    """``workers`` started together: each round's first batch takes a worker's whole batch
    time, the rest of the round arrives at once (they were ready)."""
    return lambda _epoch, i: batch_s if i % workers == 0 else 0.0


@pytest.mark.parametrize("workers", [4, 16, 64])
def test_windows_closed_by_time_end_on_whole_rounds(workers: int) -> None:
    # The true rate is workers × 4 samples per second; a window that closed in the middle of a
    # burst would read up to one round too many or too few.
    _, loader = scripted(bursts(workers, 1.0), length=10_000)
    plan = WindowPlan(windows=4, seconds=2.0, warmup_batches=workers, round_batches=workers)
    t = measure(loader, plan)
    assert t.windows and all(w.batches % workers == 0 for w in t.windows)
    assert summarize(t.windows).samples_per_s == pytest.approx(workers * 4.0)
    assert summarize(t.windows).median == pytest.approx(workers * 4.0)


def test_without_rounds_a_burst_misleads_the_window() -> None:
    # The same pipeline measured without round alignment: windows split bursts, and the median
    # window is not the pipeline's rate. This is what round_batches is for.
    _, loader = scripted(bursts(16, 1.0), length=10_000)
    t = measure(loader, WindowPlan(windows=4, seconds=2.0, warmup_batches=16))
    assert summarize(t.windows).median != pytest.approx(16 * 4.0)


def test_a_window_cut_short_keeps_its_whole_rounds() -> None:
    # Epochs of 100 batches with 16 workers: after a warm-up of 16, each epoch holds five whole
    # rounds and part of a sixth; that part's burst is not a rate and is cut away.
    _, loader = scripted(bursts(16, 1.0), length=100)
    plan = WindowPlan(windows=2, seconds=20.0, warmup_batches=16, round_batches=16)
    t = measure(loader, plan, epoch_length=100)
    assert t.windows and all(w.batches % 16 == 0 for w in t.windows)
    assert summarize(t.windows).samples_per_s == pytest.approx(16 * 4.0)


def test_the_deadline_waits_for_a_first_whole_round() -> None:
    # A deadline that falls inside the first round after warm-up: the run finishes that round
    # (within twice the deadline) rather than report a rate from part of a burst.
    _, loader = scripted(bursts(8, 3.0), length=10_000)
    plan = WindowPlan(windows=4, seconds=1.0, warmup_batches=8, round_batches=8)
    t = measure(loader, plan)
    assert t.stopped_by_deadline
    assert [w.batches for w in t.windows] == [8]
    assert summarize(t.windows).samples_per_s == pytest.approx(8 * 4 / 3.0)


def test_round_batches_must_be_positive() -> None:
    with pytest.raises(ValueError, match="round_batches"):
        WindowPlan(round_batches=0)


def test_an_iterable_datasets_length_hint_times_short_epochs_whole_from_the_start() -> None:
    # 40 batches an epoch against a warm-up of 24: windows would hold the queue's backlog. The
    # epoch's length is unknown (an IterableDataset) but its hint says so before an epoch ends.
    _, loader = scripted(bursts(8, 1.0), length=40)
    plan = WindowPlan(windows=2, seconds=2.0, warmup_batches=24, round_batches=8)
    t = run(loader, plan, int, clock=loader.clock, length_hint=40)
    assert t.method == "whole-epochs" and t.epochs >= 2


# --- the steady hook: every rank of a job warm before the windows open -------------------------


def test_the_steady_hook_holds_the_windows_until_it_says_yes() -> None:
    # Until 3.0 s another rank is starting its workers and batches come slowly here (0.5 s);
    # after that, 0.25 s. The windows open when the hook says every rank is warm, and the
    # steady state gets its 2 s from then: the deadline moves from 4 s to 5 s.
    clock, loader = scripted(lambda _e, i: 0.5 if i < 6 else 0.25)
    hooks = Hooks(steady=lambda: clock.now >= 3.0)
    t = measure(loader, WindowPlan(windows=2, seconds=2.0, warmup_batches=2), hooks=hooks)
    assert t.windows[0].start == 3.0 and t.steady_wait_s == 2.0 and not t.unaligned
    assert t.deadline_s == 5.0 and not t.stopped_by_deadline and clock.now == 5.0
    assert t.warmup_batches == 6 and t.warmup_s == 2.5
    assert summarize(t.windows).samples_per_s == 16.0  # 4 samples / 0.25 s: no slow batch
    # The same run without the hook credits the other rank's start-up to this one.
    _, loader = scripted(lambda _e, i: 0.5 if i < 6 else 0.25)
    early = measure(loader, WindowPlan(windows=2, seconds=2.0, warmup_batches=2))
    assert summarize(early.windows).samples_per_s < 16.0


def test_a_steady_hook_that_never_says_yes_is_given_up_at_the_deadline() -> None:
    clock, loader = scripted(0.25)
    hooks = Hooks(steady=lambda: False)
    t = measure(loader, WindowPlan(windows=2, seconds=1.0, warmup_batches=2), hooks=hooks)
    assert t.unaligned and t.windows[0].start == 2.25 and t.steady_wait_s == 1.75
    assert clock.now == 3.25 and summarize(t.windows).samples_per_s == 16.0
    # Within wall_s: the steady state is cut short by the wall instead.
    clock, loader = scripted(0.25)
    plan = WindowPlan(windows=2, seconds=1.0, warmup_batches=2, wall_s=2.5)
    t = measure(loader, plan, hooks=hooks)
    assert t.unaligned and t.stopped_by_deadline and clock.now <= 2.75


def test_the_steady_hook_is_asked_in_the_first_epoch_only_until_it_says_yes() -> None:
    asked: list[int] = []

    def steady() -> bool:
        asked.append(1)
        return len(asked) >= 3

    _, loader = scripted(0.25, length=8)
    t = measure(
        loader, WindowPlan(windows=4, batches=16, warmup_batches=2), hooks=Hooks(steady=steady)
    )
    assert len(asked) == 3 and t.epochs >= 2 and t.steady_wait_s == 0.5
    assert summarize(t.windows).samples_per_s == 16.0


def test_a_long_warm_up_leaves_the_budget_its_steady_state() -> None:
    # Many workers: one batch each plus the queue is 12 batches (3 s) of warm-up. The deadline
    # of twice the budget (4 s) would leave 1 s of the 2 s asked for; it moves to 5 s.
    clock, loader = scripted(0.25)
    t = measure(loader, WindowPlan(windows=2, seconds=2.0, warmup_batches=12))
    assert t.deadline_s == 5.0 and sum(w.seconds for w in t.windows) == 2.0
    assert len(t.windows) == 2 and clock.now == 5.0
    # wall_s still bounds the run.
    clock, loader = scripted(0.25)
    t = measure(loader, WindowPlan(windows=2, seconds=2.0, warmup_batches=12, wall_s=4.0))
    assert t.deadline_s == 4.0 and t.stopped_by_deadline and clock.now <= 4.25
