"""Forked DataLoader workers that never start: seen within a bound, started again, or named."""

from __future__ import annotations

import functools
import multiprocessing
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import feedrate
from feedrate.errors import WorkersNotStartedError
from feedrate.loader import started
from feedrate.loader.config import LoaderConfig
from feedrate.measuring.workers import Workers

from faults import Squares, fault, forks_that_hang
from pipelines import four_threads

_tag = {"worker": -1}


def _tag_worker(worker_id: int) -> None:
    _tag["worker"] = worker_id


class Tagged(Dataset[torch.Tensor]):
    """Each sample says which worker's ``worker_init_fn`` ran in the process that read it."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, _tag["worker"]])


@pytest.fixture
def short_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(started, "START_S", 3.0)


def test_forked_workers_are_seen_to_start_and_the_user_s_init_still_runs() -> None:
    loader = DataLoader(Tagged(), batch_size=4, num_workers=2, worker_init_fn=_tag_worker)
    starts = started.Starts(loader)
    assert starts.watched
    it = iter(loader)
    assert starts.wait(it, timeout_s=30.0) == []
    batches = list(it)
    assert torch.cat(batches)[:, 0].tolist() == list(range(16))
    # DataLoader hands batch k to worker k % 2: the user's worker_init_fn ran in each.
    assert [int(b[0, 1]) for b in batches] == [0, 1, 0, 1]


def test_spawned_or_main_process_loaders_are_not_watched() -> None:
    spawned = DataLoader(
        Squares(8),
        num_workers=1,
        multiprocessing_context=multiprocessing.get_context("spawn"),
        worker_init_fn=four_threads,
    )
    assert not started.Starts(spawned).watched
    # Its init function, which only lets the workers leave with this process, pickles.
    assert [int(b) for b in spawned] == [i * i for i in range(8)]
    in_process = DataLoader(Squares(8))
    assert not started.Starts(in_process).watched
    assert in_process.worker_init_fn is None  # left as it was


def test_a_worker_that_hangs_in_its_fork_is_started_again(short_start: None) -> None:
    loader = DataLoader(Squares(4096), batch_size=8)
    with forks_that_hang(1) as left:
        m = feedrate.measure(loader, LoaderConfig(num_workers=2), batches=20, device=None)
        assert left() == 0  # the first worker forked did hang
    assert any("hung in their fork" in n for n in m.notes), m.notes
    assert m.samples_per_s > 0  # the autouse no_leaks fixture: the hung child is gone too


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_that_never_start_are_named_not_waited_for(
    short_start: None, persistent: bool
) -> None:
    fault("worker-hangs-in-fork")
    loader = DataLoader(Squares(4096), batch_size=8)
    config = LoaderConfig(num_workers=2, persistent_workers=persistent)
    with forks_that_hang(100), pytest.raises(WorkersNotStartedError) as caught:
        feedrate.measure(loader, config, batches=20, device=None)
    message = str(caught.value)
    assert "did not start within 3 s of their fork, 2 times" in message
    assert "gh-112275" in message and "forkserver" in message
    assert caught.value.exit_code == 3


def test_the_checks_workers_start_again_too(short_start: None) -> None:
    # The doctor's looks inside workers (duplicates, copy-on-read, a stream's start) iterate a
    # loader of their own: a hang there is started again as a trial's is.
    loader = DataLoader(Squares(8), batch_size=None, num_workers=2)
    with forks_that_hang(1) as left, Workers(loader, timeout_s=30.0) as it:
        items = sorted(float(x) for x in it)
        assert left() == 0
    assert items == [float(i * i) for i in range(8)]


def test_an_iterator_that_does_not_run_the_marks_is_not_watched() -> None:
    # A DataLoader subclass whose iterator brings an init function of its own would look hung.
    loader = DataLoader(Squares(8), num_workers=2)
    starts = started.Starts(loader)
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    worker.start()
    try:
        own = SimpleNamespace(_workers=[worker], _worker_init_fn=print)
        assert starts.unstarted(own) == []
        wrapped = functools.partial(print, loader.worker_init_fn, 1, 0)  # as for data pipes
        assert starts.unstarted(SimpleNamespace(_workers=[worker], _worker_init_fn=wrapped)) == [
            worker.pid
        ]
    finally:
        worker.kill()
        worker.join()


class JoinCancelled(Dataset[tuple[bool, bool]]):
    """Each sample says whether its worker's queue would leave without joining its feeder
    thread, and whether feedrate's thread that watches for the main process runs there."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[bool, bool]:
        frame = sys._getframe(1)
        while frame.f_code.co_name != "_worker_loop":
            frame = frame.f_back  # type: ignore[assignment]
        watching = any(t.name == "feedrate-orphan" for t in threading.enumerate())
        return bool(frame.f_locals["data_queue"]._joincancelled), watching


def test_workers_join_their_feeder_thread_while_the_main_process_lives() -> None:
    # A worker that leaves without that join can die holding the write lock its siblings
    # share (its feeder thread between sending an item and releasing it): an IterableDataset's
    # worker is shut down as soon as its stream ends, and the other workers then hung for ever
    # (a stream probe, 2-3 times in 150 beside busy loops). Only an orphan skips the join.
    loader = DataLoader(JoinCancelled(), batch_size=None, num_workers=2)
    with Workers(loader, timeout_s=30.0) as it:
        seen = [tuple(item) for item in it]
    assert seen == [(False, True)] * 4


def test_an_orphaned_worker_cancels_the_join_and_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = SimpleNamespace(cancelled=False)
    queue.cancel_join_thread = lambda: setattr(queue, "cancelled", True)
    left: list[int] = []
    monkeypatch.setattr(started, "ORPHAN_EXIT_S", 0.0)
    monkeypatch.setattr(started.os, "_exit", left.append)
    started._orphaned(queue, parent=-1, poll_s=0.0)  # no process has pid -1: gone already
    assert queue.cancelled and left == [0]
