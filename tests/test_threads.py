"""``feedrate.threaded``: order kept, one pool per process made on first use, errors naming the
index, the dataset's own ``__getitems__`` kept, and the thread-safety check."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import feedrate
from feedrate.errors import PipelineError, UserError
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, rebuild
from feedrate.loader.threaded import SampleFetchError, Threaded, unthreaded
from feedrate.measuring.thread_safety import check

from pipelines import (
    BatchedReadDataset,
    FailingDataset,
    NoisyDataset,
    OpenFileDataset,
    RacyDataset,
    ShardedStream,
    SharedRngDataset,
    SleepDataset,
    TinyDataset,
    WhereDataset,
)


def fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("feedrate-fetch")]


def test_keeps_order_length_indexing_and_attributes() -> None:
    inner = SleepDataset(64, sleep_s=0.001)
    ds = feedrate.threaded(inner, 8)
    try:
        assert len(ds) == 64
        assert torch.equal(ds[5], inner[5])
        out = ds.__getitems__(list(range(40, 8, -1)))
        assert [int(x[0]) for x in out] == list(range(40, 8, -1))
        ds.sleep_s = 0.0  # writes reach the user's dataset, as a worker_init_fn expects
        assert inner.sleep_s == 0.0
    finally:
        ds.close()


def test_pool_made_on_first_use_and_closed() -> None:
    ds = feedrate.threaded(WhereDataset(32), 4)
    assert not fetch_threads()
    names = {name for _, _, name in ds.__getitems__(list(range(16)))}
    assert names and all(n.startswith("feedrate-fetch") for n in names)
    ds.close()
    assert not fetch_threads()


def test_each_worker_fetches_on_its_own_threads() -> None:
    ds = feedrate.threaded(WhereDataset(64), 4)
    ds.__getitems__([0, 1])  # a pool in the main process first: workers must not inherit it
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=lambda b: b)
    seen = [s for batch in loader for s in batch]
    ds.close()
    assert [s[0] for s in seen] == list(range(64))
    pids = {pid for _, pid, _ in seen}
    assert os.getpid() not in pids and len(pids) == 2
    assert all(name.startswith("feedrate-fetch") for _, _, name in seen)


def test_failure_names_the_index_in_process_and_from_a_worker() -> None:
    ds = feedrate.threaded(FailingDataset(64, bad_index=37), 8)
    with pytest.raises(SampleFetchError, match=r"sample index 37 .*ValueError") as info:
        ds.__getitems__(list(range(32, 48)))
    assert isinstance(info.value.__cause__, ValueError)
    ds.close()
    # From a worker, through measure (which ends the workers on the way out).
    loader = DataLoader(FailingDataset(64, bad_index=37), batch_size=16)
    with pytest.raises(PipelineError, match="sample index 37"):
        feedrate.measure(loader, LoaderConfig(1, threads=8), batches=4, windows_count=2)


def test_own_getitems_is_kept_in_ordered_chunks() -> None:
    ds = feedrate.threaded(BatchedReadDataset(64), 4)
    out = ds.__getitems__(list(range(10)))
    ds.close()
    assert [i for i, _ in out] == list(range(10))
    # Ten indices on four threads: chunks of three, each one call of the dataset's own method.
    assert [first for _, first in out] == [0, 0, 0, 3, 3, 3, 6, 6, 6, 9]


def test_refuses_iterable_datasets_and_bad_thread_counts() -> None:
    with pytest.raises(UserError, match="map-style"):
        feedrate.threaded(ShardedStream(), 4)
    for bad in (0, -1, 1000, 2.5, True):
        with pytest.raises(UserError, match="threads must be"):
            feedrate.threaded(TinyDataset(), bad)  # type: ignore[arg-type]


def test_pickles_without_its_pool() -> None:
    ds = feedrate.threaded(TinyDataset(16), 4)
    ds.__getitems__([0, 1, 2])
    again = pickle.loads(pickle.dumps(ds))
    ds.close()
    assert isinstance(again, Threaded) and again.threads == 4 and again._pool is None
    assert torch.equal(again[3], TinyDataset(16)[3])


def test_config_wraps_and_unwraps_the_dataset() -> None:
    loader = DataLoader(TinyDataset(32), batch_size=4)
    threaded = rebuild(loader, LoaderConfig(2, threads=8))
    assert isinstance(threaded.dataset, Threaded) and threaded.dataset.threads == 8
    assert config_of(threaded).threads == 8
    plain = rebuild(threaded, LoaderConfig(2))
    assert not isinstance(plain.dataset, Threaded) and config_of(plain).threads == 1
    cfg = LoaderConfig(2, threads=8)
    assert LoaderConfig.from_dict(cfg.to_dict()) == cfg
    assert "threads" not in LoaderConfig(2).to_dict()
    assert cfg.label().endswith("threads=8")
    assert "threads" not in cfg.kwargs()


def test_measure_with_threads_and_no_workers_leaves_no_thread() -> None:
    loader = DataLoader(SleepDataset(256, sleep_s=0.001), batch_size=16)
    m = feedrate.measure(loader, LoaderConfig(0, threads=8), batches=8, windows_count=2)
    assert m.samples_per_s > 0
    assert not fetch_threads()


# --- the safety check -----------------------------------------------------------------------


def test_check_passes_a_deterministic_thread_safe_dataset() -> None:
    result = check(SleepDataset(64, sleep_s=0.001), 8)
    assert result.ok and result.deterministic and result.compared == 32
    assert "matched" in result.describe()


def test_check_finds_a_wrong_answer_on_threads() -> None:
    result = check(RacyDataset(64), 8)
    assert not result.ok and result.mismatch is not None
    assert "different when fetched on threads" in result.reason()


def test_check_refuses_an_open_file(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))
    ds = OpenFileDataset(str(path))
    try:
        result = check(ds, 8)
    finally:
        ds.handle.close()
    assert not result.ok
    assert "handle is an open file" in result.reason()


@pytest.mark.parametrize("kind", ["numpy", "random", "torch"])
def test_check_refuses_a_shared_generator(kind: str) -> None:
    result = check(SharedRngDataset(kind=kind, nested=True), 8)
    assert not result.ok
    assert "transform.steps[0]['rng'] is a shared random generator" in result.reason()


def test_check_does_not_compare_a_random_dataset() -> None:
    result = check(NoisyDataset(64), 8)
    assert result.ok and result.deterministic is False
    assert "not compared" in result.describe()


def test_check_sees_through_a_threaded_wrapper() -> None:
    assert unthreaded(feedrate.threaded(RacyDataset(), 4)).__class__ is RacyDataset
    result: Any = check(feedrate.threaded(RacyDataset(64), 4), 8)
    assert not result.ok
