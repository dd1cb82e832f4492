"""litdata's ``StreamingDataset`` and ``StreamingDataLoader`` (whose ``__iter__`` is a
generator that hides the DataLoader iterator and its workers), on chunks written in
``tmp_path``: workers found and measured, all gone after ``close()``, every sample once per
epoch under tune's answer and autotune, the epoch count (which chooses the shuffle) carried
across rebuilds, and resumption through ``state_dict``."""

from __future__ import annotations

import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import feedrate
from feedrate.loader.code import code_line

from library_data import N, children, epoch_ids, none_left, write_litdata

litdata = pytest.importorskip("litdata", reason="litdata is not installed")
# A stream's tuned answer may keep persistent workers: ended after each test, even where a
# failed assertion keeps its loader alive (see conftest.end_persistent_workers).
pytestmark = pytest.mark.usefixtures("end_persistent_workers")


def make(root: Path, workers: int = 0) -> Any:
    ds = litdata.StreamingDataset(str(root), shuffle=True, seed=7)
    return litdata.StreamingDataLoader(ds, batch_size=16, num_workers=workers)


def test_hidden_workers_are_measured_and_named(tmp_path: Path) -> None:
    ds = litdata.StreamingDataset(str(write_litdata(tmp_path)), shuffle=True, seed=7)
    loader = litdata.StreamingDataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)
    m = feedrate.measure(loader, seconds=1.0, windows_count=2)
    assert len(m.processes.workers) == 2 and all(w.pid for w in m.processes.workers)
    assert all(w.measured_s > 0 for w in m.processes.workers)  # watched while they ran
    assert none_left()
    assert code_line(loader, feedrate.config_of(loader)).startswith("StreamingDataLoader(")


def test_autotune_every_sample_once_workers_found_and_gone(tmp_path: Path) -> None:
    root = write_litdata(tmp_path)
    auto = feedrate.autotune(make(root), cache=False, budget_s=2)
    seen_workers = 0
    epochs = []
    for _ in range(3):
        ids = []
        for batch in auto:
            ids += [int(i) for i in batch["id"]]
            seen_workers = max(seen_workers, len(children()))
        epochs.append(ids)
        assert Counter(ids) == Counter(range(N))
    assert seen_workers > 0  # autotune gave the stream workers: litdata splits it
    assert seen_workers <= 2 * 16  # never the escalation of hidden workers (107 on 2 CPUs)
    assert auto._user.current_epoch == 3  # the epoch count went on across the lanes
    assert epochs[0] != epochs[1] != epochs[2]  # so each epoch had its own shuffle
    auto.close()
    assert none_left(timeout_s=2.0)


def test_a_rebuilt_loader_goes_on_from_its_epoch(tmp_path: Path) -> None:
    loader = make(write_litdata(tmp_path))
    first = epoch_ids(loader)
    rebuilt = feedrate.rebuild(loader, feedrate.LoaderConfig(num_workers=0))
    assert rebuilt.current_epoch == 1 and epoch_ids(rebuilt) != first


def test_a_loader_rebuilt_with_more_workers_than_cpus_does_not_warn(tmp_path: Path) -> None:
    # StreamingDataLoader checks its worker count at its first batch, not at iter(): tune's
    # trials printed DataLoader's "suggested max number of worker" warning, once per trial.
    many = feedrate.LoaderConfig(num_workers=(os.cpu_count() or 1) + 1, prefetch_factor=2)
    rebuilt = feedrate.rebuild(make(write_litdata(tmp_path)), many)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Counter(epoch_ids(rebuilt)) == Counter(range(N))
    assert not [w for w in caught if "suggested max number of worker" in str(w.message)]
    assert none_left()


def test_the_tuned_answer_yields_every_sample_once(tmp_path: Path) -> None:
    result = feedrate.tune(
        make(write_litdata(tmp_path)), budget_s=6, trial_seconds=0.4, use_cache=False
    )
    assert Counter(epoch_ids(result.loader())) == Counter(range(N))
    assert none_left()


def test_state_dict_resumes_through_autotune(tmp_path: Path) -> None:
    root = write_litdata(tmp_path)
    auto = feedrate.autotune(make(root), cache=False, budget_s=2)
    it = iter(auto)
    head = [int(i) for _ in range(5) for i in next(it)["id"]]
    state = auto.state_dict()
    assert state["current_epoch"] == 1 and state["num_samples_yielded"] == 80
    auto.close()
    resumed = feedrate.autotune(make(root), cache=False, budget_s=2)
    resumed.load_state_dict(state)
    rest = epoch_ids(resumed)
    resumed.close()
    assert sorted(head + rest) == list(range(N))
