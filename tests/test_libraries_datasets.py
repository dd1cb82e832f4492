"""Hugging Face ``datasets``: an ``IterableDataset`` of several shards, shuffled with a seed
(the library reseeds that generator in every worker: no ``shared-rng``), batched by the
library (``.batch(16)`` with ``batch_size=None``), told its epoch through ``set_epoch``; built in
memory, no hub."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from torch.utils.data import DataLoader

import feedrate
from feedrate.loader.batches import sample_counter
from feedrate.loader.libraries import worker_limit
from feedrate.workflows import doctor as doctoring

from library_data import N, epoch_ids, hf_dataset, none_left

pytest.importorskip("datasets", reason="datasets is not installed")
# A stream's tuned answer may keep persistent workers: ended after each test, even where a
# failed assertion keeps its loader alive (see conftest.end_persistent_workers).
pytestmark = pytest.mark.usefixtures("end_persistent_workers")


def stream(shards: int = 4) -> Any:
    iterable = hf_dataset().to_iterable_dataset(num_shards=shards)
    return iterable.shuffle(seed=3, buffer_size=40).with_format("torch")


def test_a_seeded_shuffle_is_not_a_shared_generator() -> None:
    loader = DataLoader(stream(), batch_size=16, num_workers=2)
    report = doctoring.doctor(loader, checks=["shared-rng"])
    assert report.finding("shared-rng") is None
    assert {r.name: r.status for r in report.checks}["workers"] == "ok"


def test_autotune_every_sample_once_and_the_epoch_reaches_the_dataset() -> None:
    ds = stream()
    with feedrate.autotune(DataLoader(ds, batch_size=16), cache=False, budget_s=2) as auto:
        assert auto.config.num_workers > 0  # shards go to workers in turn: no probe needed
        orders = []
        for epoch in range(2):
            auto.set_epoch(epoch)
            assert ds.epoch == epoch
            orders.append(epoch_ids(auto, step_s=0.002))
            assert Counter(orders[-1]) == Counter(range(N))
        assert orders[0] != orders[1]  # the epoch reshuffled
    assert none_left()


def test_one_shard_keeps_the_worker_count_and_says_to_make_more(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Hugging Face gives each worker whole shards: with one, a second worker stops at once
    # ("Too many dataloader workers"), and the 2-worker probe blamed "too few distinct" items.
    with feedrate.autotune(DataLoader(stream(1), batch_size=16), cache=False, budget_s=2) as auto:
        assert Counter(epoch_ids(auto, step_s=0.002)) == Counter(range(N))
        assert auto.config.num_workers == 0
        reason = auto.report().started_from
    assert "it has 1" in reason and "num_shards=N" in reason, reason
    assert "too few distinct" not in reason
    assert "Too many dataloader workers" not in capfd.readouterr().err  # no probe ran
    assert none_left()


def test_the_doctor_says_workers_past_the_shards_read_nothing() -> None:
    # to_iterable_dataset() makes one shard: of 2 workers, one read nothing, and the doctor
    # put its figures down to "the work per batch is too small to hand over".
    report = doctoring.doctor(
        DataLoader(stream(1), batch_size=16, num_workers=2), checks=["workers-past-shards"]
    )
    found = report.finding("workers-past-shards")
    assert found is not None and "1 of your 2 workers have nothing to read" in found.message
    assert "num_workers=1" in found.fix and "num_shards=N" in found.fix
    fits = doctoring.doctor(
        DataLoader(stream(2), batch_size=16, num_workers=2), checks=["workers-past-shards"]
    )
    assert fits.finding("workers-past-shards") is None


def test_items_batched_by_the_library_count_their_samples() -> None:
    loader = DataLoader(hf_dataset().to_iterable_dataset().batch(16), batch_size=None)
    count = sample_counter(loader)
    assert [count(item) for item in loader] == [16] * (N // 16)


def test_the_tuned_answer_yields_every_sample_once() -> None:
    result = feedrate.tune(
        DataLoader(stream(), batch_size=16), budget_s=6, trial_seconds=0.4, use_cache=False
    )
    assert Counter(epoch_ids(result.loader())) == Counter(range(N))
    assert none_left()


def test_never_more_workers_than_shards() -> None:
    assert worker_limit(stream(3)) == 3  # a worker past them is stopped: it would only idle
    assert worker_limit(hf_dataset()) is None  # map-style: indices, not shards
