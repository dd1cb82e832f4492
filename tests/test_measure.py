"""Measurement on real DataLoaders with workers: the figures exist and are consistent, and the
JSON round-trips. No timing thresholds: speed is proved in benchmarks/, not here."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from torch.utils.data import DataLoader, Dataset

from feedrate.loader.batches import epoch_samples
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.measuring.consumer import make_consumer
from feedrate.measuring.measure import measure
from feedrate.results.measurement import MEASURE_SCHEMA, Measurement
from feedrate.results.trial import Trial
from feedrate.search.advice import judge_persistent

from pipelines import BusyDataset, ShardedStream, SleepDataset, TinyDataset


def test_measure_with_workers_reports_every_process() -> None:
    loader = DataLoader(BusyDataset(n=512, cpu_s=0.001), batch_size=8)
    m = measure(loader, LoaderConfig(num_workers=2), batches=40, windows_count=4)
    assert m.config == LoaderConfig(2, False, 2, False)
    assert m.samples_per_s > 0 and m.batches_per_s > 0
    assert m.samples_per_s == pytest.approx(m.batches_per_s * 8)
    assert len(m.spread.windows) == 4
    assert m.spread.min <= m.spread.median <= m.spread.max
    assert m.startup_s > 0
    assert m.window.warmup_batches >= 2 + 4  # every worker + the prefetch queue
    workers = m.processes.workers
    assert [w.worker_id for w in workers] == [0, 1]
    assert all(w.pid for w in workers)
    # Of the 40 batches in the windows, at least 36 were fetched inside them (4 may have been
    # queued before), 8 ms of CPU each: 288 ms, less counter ticks (10 ms) and the instants
    # between two windows, where a busy machine may deschedule the main process.
    assert sum(w.cpu_s for w in workers) >= 0.7 * 36 * 0.008
    assert all((w.uss_bytes or 0) > 0 for w in workers)
    assert (m.processes.main.uss_bytes or 0) > 0


def test_short_dataset_is_reiterated_and_restarts_recorded() -> None:
    loader = DataLoader(TinyDataset(n=64), batch_size=8)  # 8 batches an epoch
    m = measure(loader, LoaderConfig(num_workers=1), batches=30, windows_count=3)
    assert m.window.epochs >= 3
    assert len(m.epoch_restart_s) >= 2
    assert m.window.batches >= 30


class _Ticking(Dataset[int]):
    """Each item moves a fake clock on by 0.25 s, but the last of an epoch of 10 by 0.0625 s."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        self.clock[0] += 0.0625 if i == 9 else 0.25
        return i


def test_window_totals_are_those_of_the_rate() -> None:
    # 1 s windows: two full ones, the epoch's quick last batch cut short, then a third full one
    # in the next epoch. The cut window counts in no figure, the totals included.
    clock = [0.0]
    loader = DataLoader(_Ticking(clock), batch_size=1)
    m = measure(loader, LoaderConfig(0), seconds=3.0, windows_count=3, clock=lambda: clock[0])
    assert m.spread.windows == [4.0, 4.0, 4.0] and m.window.epochs == 1
    assert m.samples_per_s == 4.0 and (m.window.samples, m.window.seconds) == (12, 3.0)


def test_whole_epochs_when_epochs_shorter_than_warmup() -> None:
    loader = DataLoader(TinyDataset(n=16), batch_size=8)  # 2 batches, warm-up is 3×(1+2)
    m = measure(loader, LoaderConfig(num_workers=3), batches=6, windows_count=3)
    assert m.window.method == "whole-epochs"
    assert any("whole epochs" in n for n in m.notes)


def test_iterable_dataset_and_no_batching() -> None:
    m = measure(DataLoader(ShardedStream(256), batch_size=4), LoaderConfig(2), batches=10)
    assert m.samples_per_s == pytest.approx(m.batches_per_s * 4)
    m = measure(DataLoader(TinyDataset(64), batch_size=None), LoaderConfig(0), batches=10)
    assert m.samples_per_s == pytest.approx(m.batches_per_s)


def test_a_stream_s_epoch_is_counted_where_one_ends_and_judges_persistent_workers() -> None:
    # A stream has no len(): persistent_workers was never weighed against its epoch, and tune
    # said "off (not worth it)" where keeping 11 workers saved a quarter of the time.
    loader = DataLoader(ShardedStream(96), batch_size=4)
    m = measure(loader, LoaderConfig(2, prefetch_factor=2), seconds=0.5, windows_count=2)
    assert m.epoch_samples == 96 and Measurement.from_dict(m.to_dict()).epoch_samples == 96
    trial = Trial.of(m, "a stream")
    assert epoch_samples(loader) is None and epoch_samples(loader, [trial]) == 96
    trial.epoch_restart_s = [0.2]  # 0.2 s to start again, each epoch of 96 samples
    trial.samples_per_s = 480.0  # an epoch of 0.2 s
    assert judge_persistent(trial, epoch_samples(loader, [trial]))["recommended"]


def test_the_main_thread_s_time_queued_for_a_cpu_is_read() -> None:
    # Without workers the main thread makes the batches: its run-queue time is its work held
    # up by other processes (search.bottleneck reads it), read as the workers' is.
    if not os.path.exists(f"/proc/{os.getpid()}/schedstat"):
        pytest.skip("no schedstat here: run-queue time is read on Linux only")
    loader = DataLoader(BusyDataset(n=256, cpu_s=0.001), batch_size=8)
    m = measure(loader, LoaderConfig(0), batches=10, windows_count=2)
    queued = m.processes.main.runq_util
    assert queued is not None and queued >= 0.0
    assert Trial.of(m, "w=0").main_runq == queued


def test_more_workers_than_cpus_no_warning_but_a_note() -> None:
    loader = DataLoader(SleepDataset(n=256, sleep_s=0.001), batch_size=4)
    cpus = collect().cpus_usable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = measure(loader, LoaderConfig(num_workers=cpus + 4), batches=10, windows_count=2)
    assert any("above the" in n and "usable CPUs" in n for n in m.notes)


def test_workers_past_the_batches_of_an_epoch_are_named_idle() -> None:
    loader = DataLoader(TinyDataset(n=24), batch_size=8)  # 3 batches an epoch
    m = measure(loader, LoaderConfig(5, persistent_workers=True), batches=12, windows_count=2)
    assert any("more than the 3 batches of an epoch: 2 workers get no batch" in n for n in m.notes)
    enough = measure(loader, LoaderConfig(3, persistent_workers=True), batches=12, windows_count=2)
    assert not any("batches of an epoch" in n for n in enough.notes)


def test_persistent_workers_and_pin_memory_config() -> None:
    loader = DataLoader(TinyDataset(n=64), batch_size=8)
    m = measure(loader, LoaderConfig(2, False, 3, True), batches=20, windows_count=2)
    assert m.config.persistent_workers and m.config.prefetch_factor == 3
    # 8 batches an epoch, 8 to warm up: whole epochs are timed, and every epoch after the first
    # has its restart (the time to its first batch) recorded apart.
    assert m.window.method == "whole-epochs" and m.window.epochs >= 2
    assert len(m.epoch_restart_s) == m.window.epochs - 1
    assert min(m.epoch_restart_s) > 0


def test_json_schema_and_round_trip() -> None:
    m = measure(DataLoader(TinyDataset(128), batch_size=16), LoaderConfig(1), batches=10)
    data = json.loads(m.to_json())
    assert data["schema"] == MEASURE_SCHEMA
    for key in ("machine", "config", "samples_per_s", "spread", "startup_s", "processes"):
        assert key in data
    assert data["config"] == {
        "num_workers": 1,
        "pin_memory": False,
        "prefetch_factor": 2,
        "persistent_workers": False,
    }
    assert data["machine"]["cpus_usable"] >= 1
    again = Measurement.from_json(m.to_json())
    assert again.to_dict() == data


def test_factory_source_is_accepted() -> None:
    m = measure(lambda: DataLoader(TinyDataset(64), batch_size=8), batches=5, windows_count=1)
    assert m.config.num_workers == 0


def test_consumer_stall_is_low_when_loader_is_ahead_and_high_when_behind() -> None:
    fast = DataLoader(SleepDataset(n=512, sleep_s=0.0005), batch_size=4)
    slow_step = make_consumer(step_time=0.02)
    m = measure(fast, LoaderConfig(num_workers=2), batches=20, windows_count=2, consumer=slow_step)
    assert m.stall_fraction is not None and m.stall_fraction < 0.5
    assert m.consumer == {"kind": "step-time", "samples_per_s": None, "step_s": 0.02, "name": None}
    slow = DataLoader(SleepDataset(n=512, sleep_s=0.01), batch_size=4)
    m = measure(slow, LoaderConfig(0), batches=6, windows_count=2, consumer=make_consumer(rate=1e6))
    assert m.stall_fraction is not None and m.stall_fraction > 0.5
    # No consumer and no copy to a device (device="cpu"): nothing to stall.
    alone = measure(slow, LoaderConfig(0), batches=2, windows_count=1, device="cpu")
    assert alone.stall_fraction is None


def test_batch_bytes_recorded() -> None:
    m = measure(DataLoader(TinyDataset(64, width=8), batch_size=16), batches=4, windows_count=1)
    assert m.batch_bytes == 16 * 8 * 4  # float32
