"""Tests for the pure parts of feedrate.probe and feedrate.measuring (sample counting, warm-up
length, report serialization), and one ProcessProbe run on a real 2-worker DataLoader."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.utils.data import DataLoader, Dataset, default_collate

from feedrate.loader.batches import count_samples, sample_counter
from feedrate.loader.config import LoaderConfig
from feedrate.measuring.measure import measure, warmup_batches
from feedrate.measuring.processes import ProcessProbe, shm_used_bytes
from feedrate.render.text import plus_minus
from feedrate.results.processes import ProbeReport, ProcessFigures
from feedrate.units import rate

# --- doubles -----------------------------------------------------------------------------------


class CpuBusy(Dataset[torch.Tensor]):
    """Every item costs ``cpu_s`` of CPU time (not wall time), so a worker's CPU counter moves by
    a known amount however loaded the machine is."""

    def __init__(self, n: int, cpu_s: float) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        start = time.process_time()
        while time.process_time() - start < self.cpu_s:
            pass
        return torch.full((8,), float(i))


#: Hypothesis times each example; a loaded 2-core machine must not fail these tests for slowness.
no_deadline = settings(deadline=None)

#: The resolution of a process's CPU counters (/proc ticks, usually 10 ms).
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
#: Floating-point slack when comparing sums of ticks (0.05 - 0.01 is not 0.04 exactly).
EPS = 1e-9


def spin(cpu_s: float) -> None:
    """Spend ``cpu_s`` of this thread's CPU time, however loaded the machine is."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


# --- count_samples -----------------------------------------------------------------------------

leading = st.integers(min_value=0, max_value=64)
trailing = st.lists(st.integers(min_value=1, max_value=4), max_size=3)


@no_deadline
@given(n=leading, rest=trailing)
def test_count_tensor_leading_dim(n: int, rest: list[int]) -> None:
    assert count_samples(torch.zeros(n, *rest)) == n


@no_deadline
@given(n=leading, rest=trailing, k=st.integers(min_value=1, max_value=4))
def test_count_sequences_of_tensors(n: int, rest: list[int], k: int) -> None:
    fields = [torch.zeros(n, *rest)] + [torch.zeros(n) for _ in range(k - 1)]
    assert count_samples(tuple(fields)) == n
    assert count_samples(list(fields)) == n


@no_deadline
@given(n=leading, rest=trailing)
def test_count_mappings_use_first_value(n: int, rest: list[int]) -> None:
    assert count_samples({"x": torch.zeros(n, *rest), "y": torch.zeros(n + 1)}) == n
    assert count_samples({"inputs": {"ids": torch.zeros(n, 5)}, "label": 3}) == n


@no_deadline
@given(texts=st.lists(st.text(max_size=5), min_size=1, max_size=40))
def test_count_list_of_strings(texts: list[str]) -> None:
    assert count_samples(texts) == len(texts)
    assert count_samples({"text": texts}) == len(texts)
    assert count_samples((texts, torch.zeros(len(texts)))) == len(texts)


@no_deadline
@given(
    samples=st.lists(
        st.tuples(st.text(max_size=5), st.integers(0, 9), st.binary(max_size=3)),
        min_size=1,
        max_size=40,
    ),
    batch_size=st.integers(1, 64),
)
def test_count_batches_that_default_collate_made_of_text_fields(
    samples: list[tuple[str, int, bytes]], batch_size: int
) -> None:
    # default_collate makes a text field a tuple of the samples' strings: (32 captions, 32
    # labels) was counted as 2 samples, and a text pipeline measured 16 times too slow. Text
    # alone, two fields, in a batch_size of 2 with one sample: as well two samples of text.
    assume(batch_size >= len(samples) and not (batch_size == 2 != len(samples)))
    batch = default_collate(samples)
    assert isinstance(batch[0], tuple)
    assert count_samples(batch, batch_size) == len(samples)
    assert count_samples(default_collate([{"text": t, "y": y} for t, y, _ in samples])) == len(
        samples
    )
    assert count_samples(default_collate([(b, t) for t, _, b in samples]), batch_size) == len(
        samples
    )


@no_deadline
@given(
    arr=hnp.arrays(
        dtype=st.sampled_from([np.float32, np.int64, np.uint8]),
        shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=8),
    )
)
def test_count_numpy_arrays(arr: np.ndarray[Any, Any]) -> None:
    assert count_samples(arr) == arr.shape[0]
    assert count_samples([arr, arr]) == arr.shape[0]


@no_deadline
@given(
    scalar=st.one_of(
        st.integers(), st.floats(allow_nan=False), st.none(), st.text(), st.binary(), st.booleans()
    ),
    default=st.integers(min_value=1, max_value=512),
)
def test_count_scalars_fall_back_to_default(scalar: object, default: int) -> None:
    assert count_samples(scalar, default) == default


@pytest.mark.parametrize(
    "batch", [torch.tensor(3.0), np.float64(2.0), np.array(5), [], (), {}], ids=repr
)
def test_count_shapeless_or_empty_falls_back_to_default(batch: object) -> None:
    assert count_samples(batch, 7) == 7


def test_count_list_of_plain_numbers_is_its_length() -> None:
    assert count_samples([1, 2, 3]) == 3


def test_sample_counter_without_automatic_batching_counts_items() -> None:
    loader = DataLoader(list(range(5)), batch_size=None)
    assert sample_counter(loader)(torch.zeros(9, 3)) == 1


def test_sample_counter_defaults_to_batch_size() -> None:
    loader = DataLoader(list(range(5)), batch_size=16)
    counter = sample_counter(loader)
    assert counter(torch.zeros(9, 3)) == 9
    assert counter(object()) == 16


def test_samples_of_text_alone_through_an_identity_collate_fn_count_by_the_batch() -> None:
    # A list of (caption, path) samples from collate_fn=lambda b: b, partial or under a batch
    # sampler: a tuple of strings there is a sample, not default_collate's text field.
    samples = [("a cat", "1.jpg"), ("a dog", "2.jpg"), ("a cow", "3.jpg")]
    loader = DataLoader(samples, batch_size=8, collate_fn=lambda b: b)
    assert sample_counter(loader)(samples) == 3
    assert count_samples(samples, 8, collated=False) == 3
    assert count_samples(default_collate(samples), 8) == 3  # collated: fields of 3


@pytest.mark.parametrize(
    "batch",
    [
        [(torch.zeros(3, 8, 8), i) for i in range(5)],
        [torch.tensor(float(i)) for i in range(5)],
    ],
    ids=["image-label-tuples", "0d-tensors"],
)
def test_count_uncollated_list_of_samples(batch: list[Any]) -> None:
    assert count_samples(batch, default=1) == 5


# --- warmup_batches ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (LoaderConfig(0), 1),
        (LoaderConfig(0, prefetch_factor=9, persistent_workers=True), 1),
        (LoaderConfig(1), 3),
        (LoaderConfig(2), 6),
        (LoaderConfig(4, prefetch_factor=1), 8),
    ],
)
def test_warmup_batches(config: LoaderConfig, expected: int) -> None:
    assert warmup_batches(config) == expected


@no_deadline
@given(
    workers=st.integers(min_value=1, max_value=128),
    prefetch=st.one_of(st.none(), st.integers(min_value=1, max_value=16)),
)
def test_warmup_covers_every_worker_and_the_queue(workers: int, prefetch: int | None) -> None:
    config = LoaderConfig(workers, prefetch_factor=prefetch)
    assert warmup_batches(config) == workers + config.queue_depth
    assert warmup_batches(config) == workers * (1 + (prefetch or 2))


# --- plain data --------------------------------------------------------------------------------


def full_report() -> ProbeReport:
    return ProbeReport(
        wall_s=2.5,
        main=ProcessFigures("main", 100, None, 1.25, 2.5, 0.5, 1 << 20, 2 << 20, 3 << 20),
        pin_memory_thread=ProcessFigures("pin_memory_thread", cpu_s=0.25, measured_s=2.5),
        workers=[
            ProcessFigures("worker", 101, 0, 2.0, 2.5, 0.8, 5 << 20, None, 9 << 20),
            ProcessFigures("worker", 102, 1, 1.5, 2.0, 0.75, 4 << 20, 6 << 20, 8 << 20),
        ],
        probe_cpu_s=0.0078125,
        shm_peak_bytes=4096,
    )


def test_process_figures_round_trip() -> None:
    fig = full_report().workers[1]
    assert ProcessFigures.from_dict(json.loads(json.dumps(fig.to_dict()))) == fig


def test_process_figures_from_dict_ignores_unknown_keys() -> None:
    fig = ProcessFigures.from_dict({"role": "worker", "pid": 5, "future_field": 1})
    assert fig == ProcessFigures("worker", pid=5)


@pytest.mark.parametrize("report", [full_report(), ProbeReport()], ids=["full", "empty"])
def test_probe_report_round_trip(report: ProbeReport) -> None:
    data = json.loads(json.dumps(report.to_dict()))
    assert ProbeReport.from_dict(data) == report
    assert ProbeReport.from_dict(data).to_dict() == data


def test_probe_report_from_empty_dict() -> None:
    assert ProbeReport.from_dict({}) == ProbeReport()


def test_shm_used_bytes_missing_path(tmp_path: Path) -> None:
    assert shm_used_bytes(str(tmp_path / "no" / "such" / "dir")) is None


def test_shm_used_bytes_existing_path(tmp_path: Path) -> None:
    (tmp_path / "page").write_bytes(bytes(4096))  # the filesystem holds at least this block
    used = shm_used_bytes(str(tmp_path))
    st = os.statvfs(tmp_path)
    assert isinstance(used, int)
    assert 0 < used <= st.f_blocks * st.f_frsize


# --- ProcessProbe ------------------------------------------------------------------------------


def test_probe_window_arithmetic_with_fake_iterator(tmp_path: Path) -> None:
    """Workers and the pin-memory thread are learnt from the iterator's attributes; the wall time
    given at the window ends is what the figures are measured over."""
    fake = SimpleNamespace(
        _workers=[SimpleNamespace(pid=os.getpid())],
        _pin_memory_thread=SimpleNamespace(native_id=threading.get_native_id()),
    )
    with ProcessProbe(shm_path=str(tmp_path / "missing")) as probe:
        probe.attach(fake)
        probe.window_open(10.0)
        spin(0.05)  # on this thread, standing in for the pin-memory thread
        probe.window_close(12.5)
        # A new epoch's worker is a new process in the same slot: same figures, new pid.
        fake._workers = [SimpleNamespace(pid=os.getppid())]
        probe.attach(fake)
        probe.window_open(20.0)
        probe.window_close(21.0)
    rep = probe.report()
    assert rep.wall_s == 3.5
    assert rep.main.pid == os.getpid()
    assert rep.main.measured_s == 3.5
    assert rep.pin_memory_thread is not None
    assert rep.pin_memory_thread.measured_s == 3.5
    assert [(w.worker_id, w.pid, w.measured_s) for w in rep.workers] == [(0, os.getppid(), 3.5)]
    assert rep.shm_peak_bytes is None  # no such shared-memory filesystem
    # The CPU spent in the first window counts for the thread and the process that spent it
    # (less a clock tick of counter resolution: both readings are whole ticks, and their
    # difference in floating point may fall a hair under one tick short), not for the main
    # process's other threads.
    assert rep.pin_memory_thread.cpu_s >= 0.05 - TICK_S - EPS
    assert rep.workers[0].cpu_s >= 0.05 - TICK_S - EPS
    assert rep.main.cpu_s < 0.05 - TICK_S
    for fig in (rep.main, rep.pin_memory_thread, rep.workers[0]):
        assert fig.cpu_util == fig.cpu_s / fig.measured_s


def test_probe_without_windows_reports_nothing_measured() -> None:
    with ProcessProbe() as probe:
        pass
    rep = probe.report()
    assert rep.wall_s == 0.0
    assert rep.workers == []
    assert rep.pin_memory_thread is None
    assert rep.main.cpu_util == 0.0


def test_probe_sees_real_workers() -> None:
    loader = DataLoader(CpuBusy(64, cpu_s=0.003), batch_size=2, num_workers=2)
    it = iter(loader)
    try:
        with ProcessProbe() as probe:
            probe.attach(it)
            for _ in range(3):
                next(it)
            probe.window_open(time.perf_counter())
            for _ in range(20):
                next(it)
            probe.window_close(time.perf_counter())
            for _ in it:  # to the end: the workers exit
                pass
    finally:
        it._shutdown_workers()  # type: ignore[attr-defined]
    rep = probe.report()
    assert len(rep.workers) == 2
    assert [w.worker_id for w in rep.workers] == [0, 1]
    assert all(w.pid is not None and w.pid != os.getpid() for w in rep.workers)
    assert len({w.pid for w in rep.workers}) == 2
    assert all(w.measured_s > 0 for w in rep.workers)
    # At least 16 of the 20 batches were fetched inside the window (the 4 the workers may have
    # had queued before it opened excepted), 2 samples of 3 ms CPU each: 96 ms in all, less a
    # clock tick of counter resolution per worker.
    assert sum(w.cpu_s for w in rep.workers) >= 16 * 0.006 - 2 * TICK_S - EPS
    assert all(w.uss_bytes is not None and w.uss_bytes > 0 for w in rep.workers)
    assert rep.main.uss_bytes is not None and rep.main.uss_bytes > 0
    assert rep.pin_memory_thread is None  # pin_memory was off
    assert rep.wall_s > 0


# --- questionable behaviour, recorded ----------------------------------------------------------


def test_whole_epochs_measurement_counts_worker_cpu() -> None:
    # 6 batches per epoch = warm-up for 2 workers (2 + 2 x 2): whole epochs are timed.
    loader = DataLoader(CpuBusy(6, cpu_s=0.02), batch_size=1)
    m = measure(loader, LoaderConfig(num_workers=2), batches=3, windows_count=3, timeout_s=60.0)
    assert m.window.method == "whole-epochs"
    assert len(m.processes.workers) == 2
    # 3 epochs x 6 items x 20 ms of CPU were spent in workers inside the windows: 360 ms. Each
    # epoch's new workers may finish their first item before the probe has read them (the main
    # process is descheduled on a busy machine), and counters tick at 10 ms: at least half.
    assert sum(w.cpu_s for w in m.processes.workers) >= 0.5 * 3 * 6 * 0.02


def test_a_stopped_probe_does_not_finish_its_pass_over_the_workers_memory() -> None:
    # Reading smaps takes milliseconds a process: a stop (every trial of autotune ends its
    # probe) must not wait for a pass over a hundred workers, which the loop would pay.
    reads: list[int] = []
    started = threading.Event()

    class SlowMemory:
        pid = os.getpid()

        def memory_full_info(self) -> Any:
            reads.append(1)
            started.set()
            time.sleep(0.05)
            return SimpleNamespace(uss=1, pss=1, rss=1)

    probe = ProcessProbe(shm_interval_s=0.01)
    probe._workers = {i: (SlowMemory(), ProcessFigures("worker", worker_id=i)) for i in range(60)}  # type: ignore[misc]
    probe._in_window, probe._memory_due = True, 0.0
    probe.__enter__()
    assert started.wait(30)
    probe.__exit__()
    assert probe._thread is not None and not probe._thread.is_alive()
    assert len(reads) < 60  # it gave up within the pass


# --- rates in words ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (1570.4, "1,570"),
        (100.0, "100"),
        (93.44, "93.4"),
        (0.5123, "0.512"),
        (0.0412, "0.0412"),
        (0.0, "0.0"),
    ],
)
def test_a_rate_reads_in_plain_digits(value: float, words: str) -> None:
    assert rate(value) == words


def test_a_rate_of_one_window_claims_no_precision() -> None:
    assert plus_minus(0.0, 1) == "(1 window: no ±)"
    assert plus_minus(0.021, 4) == "± 2.1%" and plus_minus(0.021) == "± 2.1%"
