"""``feedrate.autotune``: the same batches in the same order while it switches settings, tuning
for the loop that iterates it, the cache, re-tuning, and no worker left behind."""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import feedrate
import feedrate.search.tuner as tuner_module
from feedrate.autotuning import lanes, start
from feedrate.autotuning.lanes import Lane
from feedrate.autotuning.loader import AutoLoader
from feedrate.errors import UserError
from feedrate.loader import started
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.measuring import runqueue
from feedrate.results.autotune import AutotuneReport
from feedrate.search.actions import Action, Try
from feedrate.search.tuner import OnlineTuner, online
from feedrate.search.watch import RETUNE_STALL, WATCH_S

from faults import forks_that_hang
from pipelines import (
    BusyDataset,
    PairBatchSampler,
    ShardedStream,
    SleepDataset,
    TinyDataset,
    UnshardedStream,
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path / "cache"))


def epochs(loader: Any, n: int, step_s: float = 0.0) -> list[list[torch.Tensor]]:
    out = []
    for _ in range(n):
        torch.manual_seed(1234)  # the same global state before each epoch, on both sides
        batch_list = []
        for batch in loader:
            if step_s:
                time.sleep(step_s)
            batch_list.append(batch.clone())
        out.append(batch_list)
    return out


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return [len(e) for e in a] == [len(e) for e in b] and all(
        torch.equal(x, y) for ea, eb in zip(a, b, strict=True) for x, y in zip(ea, eb, strict=True)
    )


def switches(auto: AutoLoader) -> int:
    return sum(e.what.startswith("try ") for e in auto.report().events)


# 3 ms per sample, 16 a batch: one worker makes 20 batches/s, the loop wants ~250; the tuner
# has to move through several configurations inside the first epoch.
SLOW = SleepDataset(1000, sleep_s=0.003)


@pytest.fixture
def one_per_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start these tests' lanes are built around, one worker per usable CPU, though
    ``SLOW`` mostly waits (autotune would start it higher: tested on its own)."""
    monkeypatch.setattr(start, "WAITING_SHARE", 0.0)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def same_epoch_tuned(seed: int) -> AutotuneReport:
    """One epoch of ``SLOW`` under autotune (a 4 ms step): the same batches as the plain
    loader's, in order (asserted); what autotune reports."""
    make = lambda: DataLoader(SLOW, batch_size=16, generator=seeded(seed))  # noqa: E731
    want = epochs(make(), 1)
    with feedrate.autotune(make(), cache=False) as auto:
        got = epochs(auto, 1, step_s=0.004)
        report = auto.report()
    assert same(want, got)
    return report


@pytest.mark.parametrize(
    "make",
    [
        lambda: DataLoader(
            SLOW, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3)
        ),
        lambda: DataLoader(SLOW, batch_size=16, shuffle=True),  # the global generator
        lambda: DataLoader(
            SLOW,
            batch_size=16,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(5),
        ),
        lambda: DataLoader(SLOW, batch_sampler=PairBatchSampler(301)),
    ],
    ids=["seeded-shuffle", "global-shuffle", "drop-last", "custom-batch-sampler"],
)
def test_same_batches_in_the_same_order_while_switching(
    make: Callable[[], DataLoader[Any]], one_per_cpu: None
) -> None:
    want = epochs(make(), 2)
    with feedrate.autotune(make(), cache=False) as auto:
        got = epochs(auto, 2, step_s=0.004)
        assert switches(auto) >= 1  # it did change settings mid-stream
    assert same(want, got)


def test_loader_surface_and_set_epoch() -> None:
    ds = TinyDataset(100)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    plain = DataLoader(ds, batch_size=8, sampler=sampler)
    with feedrate.autotune(DataLoader(ds, batch_size=8, sampler=sampler), cache=False) as auto:
        assert len(auto) == len(plain) == 13
        assert auto.dataset is ds and auto.batch_size == 8 and auto.sampler is sampler
        auto.set_epoch(3)
        assert sampler.epoch == 3
        first = [b.clone() for b in auto]
    sampler.set_epoch(3)
    assert same([first], [[b for b in plain]])


def test_settles_on_a_configuration_that_feeds_the_loop(one_per_cpu: None) -> None:
    # 2 ms per sample, 8 a batch; a 50 ms step: 2 workers make 125 batches/s, far more than the
    # 20 the loop takes. The tuner starts at one worker per CPU and goes down while still fed.
    # (On a busy machine the loop's own time queued for a CPU is no data stall: runqueue.) Its
    # first batch, about 16 ms, is near the least a start from it reads (20 ms): pinned.
    loader = DataLoader(SleepDataset(400, sleep_s=0.002), batch_size=8)
    with feedrate.autotune(loader, cache=False) as auto:
        epochs(auto, 2, step_s=0.05)
        report = auto.report()
        assert report.settled
        assert auto.config.num_workers <= report.trials[0].config.num_workers
        assert any(e.what.startswith("settled") for e in report.events)
        assert "keeps the step fed" in str(report)


def test_remembers_for_the_next_run() -> None:
    # Microsecond samples and a 20 ms step: any configuration feeds it, so it settles quickly
    # even on a loaded machine (going down to the fewest workers that still feed it).
    def make() -> DataLoader[Any]:
        return DataLoader(TinyDataset(400), batch_size=8)

    with feedrate.autotune(make()) as first:
        for _ in range(6):
            epochs(first, 1, step_s=0.02)
            if first.report().settled:
                break
        assert first.report().settled
        chosen = first.config
    with feedrate.autotune(make()) as again:
        assert again.config == chosen
        assert "cached" in again.report().started_from
        assert again.report().settled  # it only watches


class FakeClock:
    """Each reading advances ``tick`` seconds, and the loop advances it by its step: the wait
    in next() is one tick, the step a tick plus what the loop adds."""

    def __init__(self, tick: float) -> None:
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_tunes_again_when_steps_get_faster() -> None:
    # On a fake clock, so no load on the machine changes what the loop is seen to wait: steps
    # of 50 ms fed at once, then (as if compiled) steps that wait half the time. The decision
    # itself is tested on its own in test_tuner; here the lanes, probe and tuner together.
    def make() -> DataLoader[Any]:
        return DataLoader(TinyDataset(400), batch_size=8, shuffle=True, generator=seeded(7))

    want = epochs(make(), 7)
    clock = FakeClock(0.001)
    step_s = 0.05
    got: list[list[torch.Tensor]] = []
    with AutoLoader(
        make(), max_workers=None, allow_threads=False, use_cache=False, machine=None, clock=clock
    ) as auto:
        for epoch in range(7):
            if epoch == 3:
                assert auto.report().settled
                clock.tick, step_s = 0.02, 0.0
            torch.manual_seed(1234)
            got.append([])
            for batch in auto:
                clock.t += step_s
                got[-1].append(batch.clone())
        report = auto.report()
    assert report.retunes >= 1
    assert any(e.what == "tune again" for e in report.events)
    assert same(want, got)


@pytest.mark.parametrize("queued_share", [0.0, 0.5], ids=["quiet", "queued-half"])
def test_no_time_between_two_batches_goes_uncounted(
    monkeypatch: pytest.MonkeyPatch, queued_share: float
) -> None:
    # Every second from one batch to the next is the loop's step or its wait, this loader's
    # own work included: time left out of both would let the workers fetch unseen (a burst).
    # Where the loop's thread sat queued for a CPU (half of all time, as on a busy machine),
    # the wait stays the data's here: without workers the thread makes the batch in next()
    # (with workers, that share is the loop's step: test_runqueue).
    seen: list[tuple[float, float, float]] = []
    real = OnlineTuner.observe

    def observe(self: OnlineTuner, samples: int, wait: float, step: float, now: float, *a: Any):  # type: ignore[no-untyped-def]
        seen.append((wait, step, now))
        real(self, samples, wait, step, now, *a)

    monkeypatch.setattr(OnlineTuner, "observe", observe)
    clock = FakeClock(0.001)
    loader = DataLoader(TinyDataset(64), batch_size=8)
    with AutoLoader(
        loader,
        max_workers=0,
        allow_threads=False,
        use_cache=False,
        machine=None,
        clock=clock,
        queued=lambda: clock.t * queued_share,
    ) as auto:
        for _ in auto:
            clock.t += 0.01
    assert len(seen) == 8
    for (_, _, before), (wait, step, now) in itertools.pairwise(seen):
        assert wait == pytest.approx(0.001)  # one tick of the clock, queued or not
        assert before + wait + step == pytest.approx(now)


def test_iterable_dataset_changes_settings_between_epochs_only() -> None:
    loader = DataLoader(ShardedStream(), batch_size=4, num_workers=2)
    want = sorted(float(x) for b in DataLoader(ShardedStream(), batch_size=4) for x in b.flatten())
    with feedrate.autotune(loader, cache=False) as auto:
        for _ in range(2):
            configs = set()
            got = []
            for batch in auto:
                configs.add(auto.config)
                got += [float(x) for x in batch.flatten()]
            assert len(configs) == 1  # one configuration for the whole epoch
            assert sorted(got) == want


class FailsAt(SleepDataset):
    """``SLOW``'s samples, but sample ``bad`` raises."""

    def __init__(self, bad: int) -> None:
        super().__init__(SLOW.n, SLOW.sleep_s)
        self.bad = bad

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad:
            raise ValueError(f"sample {index} is corrupt")
        return super().__getitem__(index)


def skipping_errors(loader: Any) -> tuple[list[torch.Tensor], list[str]]:
    """An epoch whose loop skips a batch that raises, as training code does with bad data."""
    got, errors, it = [], [], iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return got, errors
        except ValueError as exc:
            errors.append(str(exc).strip().splitlines()[-1].removeprefix("ValueError: "))
            continue
        time.sleep(0.004)
        got.append(batch.clone())


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_one_batch_is_raised_and_the_epoch_goes_on(workers: int) -> None:
    # A generator that raises is over: the loop that skipped sample 37's error lost the other
    # 61 batches of the epoch, with no word, where DataLoader's iterator goes on.
    make = lambda: DataLoader(FailsAt(37), batch_size=16, num_workers=workers)  # noqa: E731
    want, want_errors = skipping_errors(make())
    assert want_errors == ["sample 37 is corrupt"] and len(want) == len(make()) - 1
    with feedrate.autotune(make(), cache=False) as auto:
        for _ in range(2):
            got, errors = skipping_errors(auto)
            assert errors == want_errors
            assert len(got) == len(want) and all(map(torch.equal, got, want))


def test_a_second_iterator_is_an_epoch_of_its_own() -> None:
    # A look at a batch mid-epoch crashed the epoch under way ("'NoneType' object is not an
    # iterator"), and zip(loader, loader) split one epoch between its two iterators.
    make = lambda: DataLoader(SLOW, batch_size=16)  # noqa: E731
    want = epochs(make(), 1)[0]
    with feedrate.autotune(make(), cache=False) as auto:
        got = []
        for i, batch in enumerate(auto):
            got.append(batch.clone())
            if i == 20:
                assert torch.equal(next(iter(auto)), want[0])  # a fresh epoch's first
        assert len(got) == len(want) and all(map(torch.equal, got, want))
        pairs = [(a.clone(), b.clone()) for a, b in zip(auto, auto, strict=True)]
        assert len(pairs) == len(want) and all(torch.equal(a, b) for a, b in pairs)


def test_an_epoch_begun_before_the_last_one_is_let_go_is_tuned() -> None:
    # Lightning's fetchers make the next epoch's iterator, then drop the last epoch's (left
    # early): that is no second iterator, and the new epoch is autotune's, not the loader's own.
    make = lambda: DataLoader(SLOW, batch_size=16)  # noqa: E731
    want = epochs(make(), 1)[0]
    with feedrate.autotune(make(), cache=False) as auto:
        it = iter(auto)
        for _ in range(10):
            next(it)
        it = iter(auto)
        got = [next(it).clone()]
        assert it.tuning  # type: ignore[attr-defined]
        got += [b.clone() for b in it]
        assert len(got) == len(want) and all(map(torch.equal, got, want))


def test_a_loop_that_breaks_each_epoch_keeps_its_workers_and_settles(
    one_per_cpu: None,
) -> None:
    # A loop of a fixed number of steps per epoch left each epoch early: autotune ended every
    # lane's workers at each break, so no trial ever ended and every epoch forked anew.
    make = lambda: DataLoader(SLOW, batch_size=16, shuffle=True, generator=seeded(2))  # noqa: E731
    steps = 40  # of 63 batches
    with feedrate.autotune(make(), cache=False, budget_s=30) as auto:
        workers = []
        for _ in range(15):
            for i, _batch in enumerate(auto):
                time.sleep(0.004)
                if i + 1 == steps:
                    workers.append(sorted(p.pid for p in psutil.Process().children()))
                    break
            if auto.report().settled and len(workers) >= 2 and workers[-1] == workers[-2]:
                break
        report = auto.report()
        assert report.settled and report.trials, report
        assert workers[-1] and workers[-1] == workers[-2]  # the same workers, epoch to epoch


def test_the_settings_read_off_it_are_those_in_use() -> None:
    user = DataLoader(ShardedStream(64), batch_size=4, num_workers=1, drop_last=True)
    with feedrate.autotune(user, cache=False) as auto:
        for _ in range(3):
            for _batch in auto:
                running = auto.lane_iterator._num_workers
                assert auto.config.num_workers == auto.num_workers == running
            assert auto.num_workers == running  # between epochs: not the next epoch's
        assert auto.drop_last and auto.collate_fn is user.collate_fn and auto.timeout == 0
        assert auto.prefetch_factor == auto.config.normalized().prefetch_factor


def test_a_loader_dropped_unclosed_while_tuning_leaves_no_worker() -> None:
    # The probe's thread held the lane's iterator: its workers outlived the loader.
    def new() -> list[psutil.Process]:
        return [p for p in psutil.Process().children() if p.pid not in before]

    before = {p.pid for p in psutil.Process().children()}
    for _ in range(4):
        auto = feedrate.autotune(DataLoader(SleepDataset(600, 0.002), batch_size=8), cache=False)
        for _batch in auto:
            time.sleep(0.002)
        del auto, _batch
        gc.collect()
        deadline = time.monotonic() + 5.0
        while new() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert new() == []


def test_error_in_the_loop_and_break_leave_no_worker() -> None:
    loader = DataLoader(SleepDataset(400, sleep_s=0.001), batch_size=8)
    auto = feedrate.autotune(loader, cache=False)
    with pytest.raises(RuntimeError, match="boom"):
        for i, _ in enumerate(auto):
            if i == 5:
                raise RuntimeError("boom")
    for i, _ in enumerate(auto):  # usable again afterwards; a break ends the workers too
        if i == 3:
            break
    auto.close()  # the no_leaks fixture checks every worker is gone


def test_bad_input() -> None:
    with pytest.raises(UserError, match="DataLoader"):
        feedrate.autotune([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(UserError, match="max_workers"):
        feedrate.autotune(DataLoader(TinyDataset(8)), max_workers=-1)
    for rate in (0, -5.0, float("nan"), "fast"):
        with pytest.raises(UserError, match="rate must be a positive number"):
            feedrate.autotune(DataLoader(TinyDataset(8)), rate=rate)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="budget_s must be a positive number"):
        feedrate.autotune(DataLoader(TinyDataset(8)), budget_s=0)


def test_budget_spent_settles_on_the_best_so_far(one_per_cpu: None) -> None:
    loader = DataLoader(SLOW, batch_size=16)
    with feedrate.autotune(loader, budget_s=0.01, cache=False) as auto:
        epochs(auto, 1, step_s=0.004)
        report = auto.report()
        assert report.settled and len(report.trials) == 1  # starved, yet no second trial
        assert [e.what for e in report.events][:1] == ["stop trying"]
        assert "budget_s=0.01" in str(report)


def test_a_rate_above_the_loops_pace_is_not_taken_as_fed() -> None:
    # Tiny samples and a 20 ms step: any configuration feeds this loop (~400 samples/s), none
    # is shown to deliver rate=50,000; the report says the loop limited what could be measured.
    loader = DataLoader(TinyDataset(800), batch_size=8)
    with feedrate.autotune(loader, rate=5e4, max_workers=4, cache=False) as a:
        epochs(a, 2, step_s=0.02)
        report = a.report()
        assert all(t.stall_fraction is not None and t.stall_fraction > 0.9 for t in report.trials)
        assert "rate=50,000" in str(report) and "cannot be measured" in str(report)


def test_a_loop_that_cannot_be_fed_is_not_re_tuned_from_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A step that takes no time waits for every batch whatever the settings: the stall it
    # settled with is kept in the cache, and the next run watching it does not tune again.
    # The loop thread's run-queue time is read as none here: beside busy loops its share of the
    # wait moves the stall by more than the re-tune margin between the two runs (a CI run of
    # 2026-12-05 re-tuned once), which is the run-queue correction's doing, not the cache's.
    # Samples take 5 ms, so a batch takes milliseconds against a step of microseconds: a busy
    # loop that pre-empts the step can still not lower the stall the first run settled with by
    # the margin (with 0.5 ms samples it did: 0.8 settled beside busy loops, 0.95 watched later).
    monkeypatch.setattr(runqueue, "beside", lambda clock: lambda: 0.0)

    def make() -> DataLoader[Any]:
        return DataLoader(SleepDataset(200, sleep_s=0.005), batch_size=4)

    with feedrate.autotune(make(), budget_s=0.01) as first:
        for _ in range(4):  # its one trial may end in a later epoch
            epochs(first, 1)
            if first.report().settled:
                break
        assert first.report().settled
    with feedrate.autotune(make()) as again:
        assert "cached" in again.report().started_from
        assert again._tuner.settled_stall is not None and again._tuner.settled_stall > RETUNE_STALL
        began = time.perf_counter()
        while time.perf_counter() - began < 3 * WATCH_S:  # a few watch windows
            epochs(again, 1)
        assert again.report().retunes == 0


def test_tunes_a_loader_with_its_own_non_persistent_workers() -> None:
    ds = SleepDataset(2000, sleep_s=0.003)
    want = epochs(DataLoader(ds, batch_size=16, num_workers=2), 1)
    with feedrate.autotune(DataLoader(ds, batch_size=16, num_workers=2), cache=False) as auto:
        got = epochs(auto, 1, step_s=0.002)
        assert "your settings" in auto.report().started_from
        assert switches(auto) >= 1  # it searched from there rather than settling at once
    assert same(want, got)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_max_workers_bounds_the_start_and_the_search() -> None:
    loader = DataLoader(SleepDataset(400, sleep_s=0.001), batch_size=8, num_workers=6)
    with feedrate.autotune(loader, max_workers=1, cache=False) as auto:
        assert auto.config.num_workers == 1
        epochs(auto, 1, step_s=0.001)
        assert all(t.config.num_workers <= 1 for t in auto.report().trials)


def test_iterable_dataset_that_does_not_split_its_stream_is_left_without_workers() -> None:
    with feedrate.autotune(DataLoader(UnshardedStream(), batch_size=4), cache=False) as auto:
        epochs(auto, 1)
        assert auto.config.num_workers == 0 and auto.report().settled
        assert "did not yield different items" in auto.report().started_from


def test_iterable_dataset_that_splits_its_stream_gets_workers() -> None:
    want = sorted(float(x) for b in DataLoader(ShardedStream(), batch_size=4) for x in b.flatten())
    with feedrate.autotune(DataLoader(ShardedStream(), batch_size=4), cache=False) as auto:
        assert auto.config.num_workers > 0  # 2 workers were seen to split the stream
        for _ in range(2):
            got = sorted(float(x) for batch in auto for x in batch.flatten())
            assert got == want  # every item once per epoch, whatever the settings


@pytest.mark.parametrize(
    ("make", "waits", "seen"),
    [
        (lambda: DataLoader(ShardedStream(96, sleep_s=0.01), batch_size=4), True, "2 workers"),
        (lambda: DataLoader(ShardedStream(96, cpu_s=0.01), batch_size=4), False, None),
        (
            lambda: DataLoader(SleepDataset(256, sleep_s=0.003), batch_size=16),
            True,
            "made in this process",
        ),
        (lambda: DataLoader(BusyDataset(256, cpu_s=0.002), batch_size=16), False, None),
    ],
    ids=["stream-waiting", "stream-cpu-bound", "map-waiting", "map-cpu-bound"],
)
def test_a_loader_that_mostly_waits_starts_with_more_workers_than_cpus(
    make: Callable[[], DataLoader[Any]], waits: bool, seen: str | None
) -> None:
    # A stream's settings change only between epochs, so its first epoch runs whole on the
    # count it starts at: 2 workers waiting on reads would leave it slow for an epoch. Its
    # probe's workers, on a CPU about 0-5% of the time here, project many more. A map-style
    # loader's first trial at one worker per CPU would run seconds of the first epoch at a
    # fraction of the speed: a batch made in this process (for the /dev/shm check),
    # was on a CPU a few percent of the time. CPU-bound ones (the test's run-queue time taken
    # out, should the machine be busy) start at one worker per usable CPU.
    if not waits and not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("needs Linux's schedstat: a busy machine would read as a waiting loader")
    cpus = collect().cpus_usable
    with feedrate.autotune(make(), cache=False) as auto:
        started = auto.report().started_from
        if waits:
            assert auto.config.num_workers > cpus and "projected" in started, started
            assert seen is not None and seen in started
        else:
            assert auto.config.num_workers == cpus and "one per usable CPU" in started, started


def test_a_break_during_a_switch_then_another_epoch_keeps_tuning(one_per_cpu: None) -> None:
    make = lambda: DataLoader(SLOW, batch_size=16, generator=seeded(9))  # noqa: E731
    want = epochs(make(), 1)
    with feedrate.autotune(make(), cache=False) as auto:
        for i, _ in enumerate(auto):
            time.sleep(0.004)
            if auto._tuner.pending is not None or i > 40:  # mid-drain (or late enough)
                break
        got = epochs(auto, 1, step_s=0.004)
        assert auto._tuner.pending is None
        assert auto.report().trials  # it went on measuring
    assert same(want, got)


def test_threads_with_leave_are_searched_and_checked(one_per_cpu: None) -> None:
    # 3 ms waits, 16 a batch, a loop of 2 ms: workers mostly wait, so with leave the tuner tries
    # threads inside workers (after the thread-safety check) and keeps the same batches.
    make = lambda: DataLoader(SLOW, batch_size=16, generator=seeded(4))  # noqa: E731
    want = epochs(make(), 2)
    with feedrate.autotune(make(), allow_threads=True, cache=False) as auto:
        got = epochs(auto, 2, step_s=0.002)
        tried = [t.config.threads for t in auto.report().trials]
        assert max(tried) > 1, auto.report()
    assert same(want, got)


def test_trials_know_the_batch_bytes() -> None:
    # The search reads them (big batches: busy workers may be copying, not computing).
    loader = DataLoader(TinyDataset(400, width=1024), batch_size=8)
    with feedrate.autotune(loader, cache=False) as a:
        epochs(a, 1, step_s=0.005)
        assert a.report().trials[0].batch_bytes == 8 * 1024 * 4


def test_a_lane_whose_workers_fail_to_start_loses_no_batch(
    monkeypatch: pytest.MonkeyPatch,
    one_per_cpu: None,
) -> None:
    # The second lane takes three index batches from the epoch's stream, then its start fails
    # (as when /dev/shm or memory runs out), on its own thread while the first lane drains:
    # those batches go back, and the first lane goes on with them once drained.
    starts: list[str] = []

    def failing_iter(obj: Any) -> Any:
        if isinstance(obj, DataLoader):
            starts.append(threading.current_thread().name)
            if len(starts) == 2:  # the first trial lane after the one the epoch began with
                feed = iter(obj.batch_sampler)  # type: ignore[arg-type]
                assert len([next(feed) for _ in range(3)]) == 3
                raise OSError("no space left in /dev/shm")
        return iter(obj)

    monkeypatch.setattr(lanes, "iter", failing_iter, raising=False)
    report = same_epoch_tuned(seed=2)
    assert starts[1] == "feedrate-lane-start", starts  # beside the lane in use, not holding it
    assert any("/dev/shm" in (t.error or "") for t in report.trials), report
    assert any(e.what.startswith("stay on") for e in report.events), report


@pytest.mark.parametrize("at_batch", [-1, 3], ids=["epoch-start", "next-lane"])
def test_a_lane_whose_worker_hangs_in_its_fork_starts_again_and_loses_no_batch(
    monkeypatch: pytest.MonkeyPatch, one_per_cpu: None, at_batch: int
) -> None:
    # The next worker forked after batch ``at_batch`` never starts (as beside torch.distributed's
    # threads on Python < 3.11.10): the epoch's first lane, or the next one, started beside the
    # loop. Seen within START_S, the lane's workers start again; every batch is yielded once, in
    # order, and the hung child is gone (no_leaks).
    monkeypatch.setattr(started, "START_S", 3.0)
    make = lambda: DataLoader(SLOW, batch_size=16, generator=seeded(4))  # noqa: E731
    want = epochs(make(), 1)
    got: list[torch.Tensor] = []
    lanes_started: list[LoaderConfig] = []
    real = lanes.Lane.start

    def start(lane: Lane, *args: Any, **kwargs: Any) -> None:
        lanes_started.append(lane.config)
        real(lane, *args, **kwargs)

    monkeypatch.setattr(lanes.Lane, "start", start)
    hangs: list[Callable[[], int]] = []
    with contextlib.ExitStack() as stack, feedrate.autotune(make(), cache=False) as auto:
        torch.manual_seed(1234)  # as epochs() does
        if at_batch < 0:
            hangs.append(stack.enter_context(forks_that_hang(1)))
        for i, batch in enumerate(auto):
            if i == at_batch:
                hangs.append(stack.enter_context(forks_that_hang(1)))
            time.sleep(0.004)
            got.append(batch.clone())
        assert hangs[0]() == 0  # a fork did hang
        events = auto.report().events
    assert same(want, [got])
    assert not any(e.what.startswith("stay on") for e in events), events  # started again
    assert any(e.what.endswith(" again") and "hung in the fork" in e.why for e in events), events
    assert len(lanes_started) >= 2, lanes_started  # a next lane started after the hang


def test_a_lane_with_no_thread_to_start_on_loses_no_batch(
    monkeypatch: pytest.MonkeyPatch, one_per_cpu: None
) -> None:
    # Where no thread can be had (a thread limit, memory), the next lane's start fails as a
    # failed fork does: found at the take-over, the lane in use goes on, every batch once.
    real = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "feedrate-lane-start":
            raise RuntimeError("can't start new thread")
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    report = same_epoch_tuned(seed=2)
    assert any("can't start new thread" in (t.error or "") for t in report.trials), report


def test_a_lane_starts_its_workers_on_the_loop_s_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # A new thread's current CUDA device is 0: DataLoader would pin the lane's batches there
    # (a second CUDA context on GPU 0 from every rank of a job). The start's thread takes the
    # loop's device.
    set_on: list[tuple[str, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: set_on.append((threading.current_thread().name, d))
    )
    loader = DataLoader(TinyDataset(64), batch_size=8)
    lane = Lane(loader, LoaderConfig(0), True, 0)
    try:
        lane.begin(lanes.Stream(iter(loader.batch_sampler), len(loader)))  # type: ignore[arg-type]
        lane.ready()
        assert lane.it is not None and len(next(lane.it)) == 8
    finally:
        lane.close()
    assert set_on == [("feedrate-lane-start", 3)]


def test_the_next_lane_starts_beside_the_loop_and_a_stop_meanwhile_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
    one_per_cpu: None,
) -> None:
    # Forking many workers takes seconds (96 took 2-3 s on 2 CPUs): the next lane starts on a
    # thread of its own and the loop drains the lane in use meanwhile. A start made to take
    # 3 s: two batches reach the loop before it ends. Leaving the loop then ends both lanes'
    # workers (conftest's no_leaks checks) and the start's thread.
    starting, started = threading.Event(), threading.Event()

    def slow_iter(obj: Any) -> Any:
        if threading.current_thread().name == "feedrate-lane-start" and not starting.is_set():
            starting.set()
            time.sleep(3.0)
            started.set()
        return iter(obj)

    monkeypatch.setattr(lanes, "iter", slow_iter, raising=False)
    meanwhile = []
    with feedrate.autotune(DataLoader(SLOW, batch_size=16), cache=False) as auto:
        for _ in auto:
            time.sleep(0.004)
            if starting.is_set():
                meanwhile.append(started.is_set())
                if len(meanwhile) == 2:
                    break
    assert meanwhile == [False, False]
    assert not [t for t in threading.enumerate() if t.name == "feedrate-lane-start"]


def test_measuring_the_configuration_in_use_again_keeps_its_workers(
    monkeypatch: pytest.MonkeyPatch,
    one_per_cpu: None,
) -> None:
    # Near-tied leaders are measured again in turn; where the one to measure again is the one
    # running, its trial goes on on the lane in use: no new workers (72 of them took 6 s to
    # start on 2 busy CPUs), and every batch still comes once, in order.
    starts: list[LoaderConfig] = []
    real_start = Lane.start

    def start(self: Lane, stream: Any, **kw: Any) -> None:
        starts.append(self.config)
        real_start(self, stream, **kw)

    again: list[LoaderConfig] = []
    real_next = OnlineTuner._next

    def first_again(self: OnlineTuner, spent: bool) -> Action:
        if not again:  # the first conclusion: the configuration in use, measured again
            again.append(self.config)
            return Try(self.config, "measured again (test)")
        return real_next(self, spent)

    monkeypatch.setattr(Lane, "start", start)
    monkeypatch.setattr(OnlineTuner, "_next", first_again)
    report = same_epoch_tuned(seed=3)
    assert again and [t.config for t in report.trials[:2]] == [again[0], again[0]], report
    assert starts[:2] != [again[0], again[0]], starts  # its lane went on


@pytest.mark.parametrize("settles_on", [0, 1])
def test_a_return_from_more_workers_takes_the_kept_lane_s_workers(
    monkeypatch: pytest.MonkeyPatch,
    one_per_cpu: None,
    settles_on: int,
) -> None:
    # A step up that does not beat the lane it left (remote: 30 workers, 39 at the same rate,
    # then 30 again) returns to that lane's workers, kept drained and idle meanwhile, rather
    # than forking them all again on the loop's time; every batch still comes once, in order,
    # and no lane's workers outlive the loader. Once settled, on the lane running (0) or on the
    # one kept (1), no lane is kept: only the settled lane's workers are alive.
    pids: list[tuple[LoaderConfig, tuple[int, ...]]] = []
    real_start = Lane.start

    def start(self: Lane, stream: Any, **kw: Any) -> None:
        real_start(self, stream, **kw)
        pids.append((self.config, tuple(w.pid for w in getattr(self.it, "_workers", []))))

    script: list[LoaderConfig] = []

    def up_then_back(self: OnlineTuner, spent: bool) -> Action:
        if not script:
            script.append(self.config)
            up = replace(self.config, num_workers=self.config.num_workers + 2)
            return Try(up, "more workers (test)")
        if len(script) == 1:
            script.append(self.config)
            return Try(script[0], "back (test)")
        return self._settle()

    def best(space: Any, trials: list[Any]) -> Any:
        return next(t for t in trials if t.config == script[settles_on])

    monkeypatch.setattr(Lane, "start", start)
    monkeypatch.setattr(OnlineTuner, "_next", up_then_back)
    monkeypatch.setattr(tuner_module, "choose", best)
    make = lambda: DataLoader(SLOW, batch_size=16, generator=seeded(6))  # noqa: E731
    want = epochs(make(), 3)
    with feedrate.autotune(make(), cache=False) as auto:
        got = epochs(auto, 3, step_s=0.004)
        first, up = script
        assert [c for c, _ in pids[:2]] == [first, up], pids
        back = next(p for c, p in pids[2:] if c == first)  # mid-epoch or at the next one
        assert back == pids[0][1] and back, pids  # the same processes
        assert auto.report().settled and auto.config == script[settles_on]
        assert auto._kept.lane is None
        running = {p for c, ps in pids if c == auto.config for p in ps}
        assert running and all(psutil.pid_exists(p) for p in running), pids
        assert not [p for _, ps in pids for p in ps if p not in running and psutil.pid_exists(p)]
    assert same(want, got)
    assert not any(psutil.pid_exists(p) for _, ps in pids for p in ps)  # closed: every lane's


class EndsOnce:
    """A lane's stand-in for ``Kept``: its configuration, and whether it ended."""

    def __init__(self, workers: int, interrupt: bool = False) -> None:
        self.config = LoaderConfig(workers, prefetch_factor=2, persistent_workers=True)
        self.ended, self.interrupt = False, interrupt

    def close(self) -> None:
        self.ended = True
        if self.interrupt:
            raise KeyboardInterrupt


def test_one_lane_is_kept_the_one_a_return_may_want_and_the_others_end() -> None:
    kept, w34, w47 = lanes.Kept(), EndsOnce(34), EndsOnce(47)
    best = lambda alive, going: w34.config if w34.config in alive else None  # noqa: E731
    kept.choose(cast(Lane, w34), w47.config, best)  # 34 drained, 47 tried: 34 kept
    assert kept.lane is w34 and not w34.ended
    kept.choose(cast(Lane, w47), EndsOnce(60).config, best)  # 47 drained, 60 tried: 34 stays
    assert kept.lane is w34 and w47.ended and not w34.ended
    assert kept.take(w47.config) is None and kept.take(w34.config) is w34  # a return
    assert kept.lane is None
    # None wanted: each ends, even where another's end is interrupted (Ctrl-C).
    a, b = EndsOnce(8, interrupt=True), EndsOnce(16)
    kept.lane = cast(Lane, a)
    with pytest.raises(KeyboardInterrupt):
        kept.choose(cast(Lane, b), LoaderConfig(0), lambda alive, going: None)
    assert a.ended and b.ended and kept.lane is None


def test_a_lane_started_beside_the_loop_has_worker_deaths_signalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DataLoader installs its SIGCHLD handler (a dead worker found at once) from the main
    # thread only: after an epoch begun without workers, a lane started on the start's thread
    # would leave a worker's death to DataLoader's 5 s poll. The loop's thread installs it.
    from torch.utils.data._utils import signal_handling

    monkeypatch.setattr(signal_handling, "_SIGCHLD_handler_set", False)
    before = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    loader = DataLoader(TinyDataset(64), batch_size=8)
    lane = Lane(loader, LoaderConfig(1), True, 0)
    try:
        lane.begin(lanes.Stream(iter(loader.batch_sampler), len(loader)))  # type: ignore[arg-type]
        lane.ready()
        assert len(next(lane.it)) == 8
        assert signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, None)
    finally:
        lane.close()
        signal.signal(signal.SIGCHLD, before)


@pytest.mark.parametrize(("own_workers", "cached"), [(0, False), (1, True)])
def test_a_start_whose_workers_cannot_start_runs_the_loader_s_own_settings(
    monkeypatch: pytest.MonkeyPatch, own_workers: int, cached: bool
) -> None:
    # A loader that mostly waits starts past the CPUs (34 workers on 2 CPUs for remote), or at
    # the count another machine's run cached. Where this machine cannot start that many (a
    # process limit: fork fails with EAGAIN), the loop runs the loader's own settings, as it
    # would have without autotune, and tunes from there (a cached start too): every batch
    # once, in order, the failure in the report, no configuration that fails run after.
    if cached:
        from_cache = (online(LoaderConfig(6)), start.FROM_CACHE, 0.0)
        monkeypatch.setattr(start, "_start_config", lambda *a: from_cache)
    tried: list[LoaderConfig] = []
    real_start = Lane.start

    def failing(self: Lane, stream: Any, **kw: Any) -> None:
        tried.append(self.config)
        if self.config.num_workers > own_workers:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        real_start(self, stream, **kw)

    monkeypatch.setattr(Lane, "start", failing)
    make = lambda: DataLoader(  # noqa: E731
        SLOW, batch_size=16, num_workers=own_workers, generator=seeded(8)
    )
    want = epochs(make(), 2)
    with feedrate.autotune(make(), cache=False) as auto:
        got = epochs(auto, 2, step_s=0.004)
        report = auto.report()
    assert same(want, got)
    assert tried[0].num_workers > own_workers, tried  # the start, past the CPUs
    assert tried[1].num_workers == own_workers, tried
    assert auto.config.num_workers <= own_workers
    assert report.trials[0].config == tried[0], report
    assert "Resource temporarily unavailable" in (report.trials[0].error or ""), report
    assert any(e.what == f"run {tried[1].label()}" for e in report.events), report.events
    assert not report.settled or len(report.trials) > 1  # it tuned from there


def test_a_stream_s_next_configuration_that_cannot_start_leaves_the_last_one_on() -> None:
    # A stream changes settings at an epoch's start, on the loop's thread. Should the next
    # configuration's workers not start, the last epoch's takes the epoch: every item once an
    # epoch, the failure in the report.
    want = sorted(float(x) for b in DataLoader(ShardedStream(), batch_size=4) for x in b.flatten())
    tried: list[LoaderConfig] = []
    real_start = Lane.start

    def only_the_first(self: Lane, stream: Any, **kw: Any) -> None:
        tried.append(self.config)
        if self.config != tried[0]:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        real_start(self, stream, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Lane, "start", only_the_first)
        with feedrate.autotune(DataLoader(ShardedStream(), batch_size=4), cache=False) as auto:
            for _ in range(3):
                got = sorted(float(x) for batch in auto for x in batch.flatten())
                assert got == want
            report = auto.report()
    moves = [c for c in tried if c != tried[0]]
    assert moves, tried  # a move was tried at an epoch's start, and failed
    assert auto.config not in moves  # none that failed (then the one that ran, or no workers)
    failed = [t for t in report.trials if t.error]
    assert failed and "Cannot allocate memory" in (failed[0].error or ""), report
    assert any(e.what == f"run {tried[0].label()}" for e in report.events), report.events


def test_a_settled_loader_watches_by_the_clock_alone_while_the_stall_stays_low(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Reading the loop thread's run-queue and CPU times makes a mark 20× dearer (about 3 µs);
    # a stall under the margin without them is under with them: the clock alone is read.
    reads: list[int] = []
    monkeypatch.setattr(runqueue, "beside", lambda clock: lambda: reads.append(1) or 0.0)
    cached = (online(LoaderConfig(0)), start.FROM_CACHE, 0.0)
    monkeypatch.setattr(start, "_start_config", lambda *a: cached)
    with feedrate.autotune(DataLoader(TinyDataset(800), batch_size=4), cache=False) as auto:
        assert auto.report().settled
        epochs(auto, 1, step_s=0.002)  # 200 batches, each waited for a few µs
        assert auto.report().retunes == 0
    assert len(reads) <= 3, len(reads)  # around the first batch, not two of 200 batches
