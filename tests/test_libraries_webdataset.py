"""webdataset, as its users write it: shards split by worker (the default), a stream that is
not (``workersplitter=None``) with a random crop, items batched in the pipeline
(``.batched(16)`` with ``batch_size=None``), ``wds.WebLoader`` with stages after its
DataLoader, and resampled shards with ``.with_epoch(n)``. Tar shards written in ``tmp_path``."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import feedrate
from feedrate.loader.batches import sample_counter
from feedrate.loader.libraries import worker_limit
from feedrate.loader.target import load_target
from feedrate.workflows import doctor as doctoring

from library_data import N, epoch_ids, none_left, random_crop, write_tars

wds = pytest.importorskip("webdataset", reason="webdataset is not installed")
# A stream's tuned answer may keep persistent workers: ended after each test, even where a
# failed assertion keeps its loader alive (see conftest.end_persistent_workers).
pytestmark = pytest.mark.usefixtures("end_persistent_workers")


def pipeline(urls: str, **kwargs: Any) -> Any:
    return wds.WebDataset(urls, shardshuffle=False, empty_check=False, **kwargs).decode()


def test_a_stream_not_split_by_worker_is_found_despite_random_crops(tmp_path: Path) -> None:
    # Every worker reads every shard; the crops differ, the keys do not.
    ds = pipeline(write_tars(tmp_path), workersplitter=None).map(random_crop)
    loader = DataLoader(ds.to_tuple("npy", "cls", "id"), batch_size=16)
    report = doctoring.doctor(loader, checks=["iterable-duplicates"], trial_seconds=0.5)
    found = report.finding("iterable-duplicates")
    assert found is not None and "same ids, keys or labels" in found.message
    with feedrate.autotune(loader, cache=False, budget_s=2) as auto:
        for _ in range(2):
            assert sorted(epoch_ids(auto)) == list(range(N))  # never a worker added
        assert auto.config.num_workers == 0 and auto.report().settled
    assert none_left()


def test_split_shards_arrive_once_per_epoch_under_autotune(tmp_path: Path) -> None:
    ds = pipeline(write_tars(tmp_path)).map(random_crop).to_tuple("npy", "id")
    with feedrate.autotune(DataLoader(ds, batch_size=16), cache=False, budget_s=2) as auto:
        assert auto.config.num_workers > 0  # the library splits by worker: no probe needed
        for _ in range(3):
            assert sorted(epoch_ids(auto, step_s=0.002)) == list(range(N))
    assert none_left()


def waiting(sample: dict[str, Any]) -> dict[str, Any]:
    """Each sample waits 2 ms, as a read from remote storage: more workers would help."""
    time.sleep(0.002)
    return sample


def test_never_more_workers_than_shards(tmp_path: Path) -> None:
    # Two shards split by worker, samples that wait: more workers would overlap more waits,
    # but a third worker gets no shard, and webdataset's own check fails it ("No samples
    # found in dataset; perhaps you have fewer shards than workers").
    urls = write_tars(tmp_path, shards=2)
    ds = wds.WebDataset(urls, shardshuffle=False).decode().map(waiting).to_tuple("npy", "id")
    assert worker_limit(ds) == 2
    with feedrate.autotune(DataLoader(ds, batch_size=8), cache=False, budget_s=3) as auto:
        for _ in range(3):
            assert sorted(epoch_ids(auto)) == list(range(N))
            assert auto.config.num_workers <= 2
    result = feedrate.tune(DataLoader(ds, batch_size=8), budget_s=6, use_cache=False)
    assert all(t.config.num_workers <= 2 for t in result.trials), result.trials
    assert all(t.error is None for t in result.trials)
    assert none_left()


def test_items_batched_in_the_pipeline_count_their_samples(tmp_path: Path) -> None:
    ds = pipeline(write_tars(tmp_path)).to_tuple("npy", "cls", "id").batched(16)
    loader = DataLoader(ds, batch_size=None)
    count = sample_counter(loader)
    assert [count(item) for item in loader] == [16] * (N // 16)
    m = feedrate.measure(loader, seconds=0.3, windows_count=1)
    assert m.samples_per_s == pytest.approx(16 * m.batches_per_s)


def test_the_tuned_answer_yields_every_sample_once(tmp_path: Path) -> None:
    ds = pipeline(write_tars(tmp_path)).to_tuple("npy", "id").batched(16)
    result = feedrate.tune(
        DataLoader(ds, batch_size=None), budget_s=6, trial_seconds=0.4, use_cache=False
    )
    # Not held past its epoch: a stream's answer may keep persistent workers (they live as long
    # as their loader), and none must be left.
    assert Counter(epoch_ids(result.loader())) == Counter(range(N))
    assert none_left()


def test_a_webloader_is_tuned_inside_and_keeps_its_stages(tmp_path: Path) -> None:
    urls = write_tars(tmp_path)
    target = tmp_path / "pipe.py"
    target.write_text(
        "import webdataset as wds\n"
        f"ds = wds.WebDataset({urls!r}, shardshuffle=False).decode().to_tuple('npy', 'id')\n"
        "loader = wds.WebLoader(ds.batched(16), batch_size=None, num_workers=2)"
        ".unbatched().batched(12)\n"
    )
    inner = load_target(f"{target}:loader")
    assert type(inner) is DataLoader and inner.num_workers == 2
    from feedrate.loader.code import code_line

    assert code_line(inner, feedrate.config_of(inner)).startswith("WebLoader(dataset,")
    # The library takes it as the command line does, as an object or a function's result
    # (it raised "expected a torch.utils.data.DataLoader, got WebLoader").
    staged = wds.WebLoader(pipeline(urls).to_tuple("npy", "id").batched(16), batch_size=None)
    for source in (staged.unbatched().batched(12), lambda: staged):
        m = feedrate.measure(source, seconds=0.2, windows_count=1)
        assert m.samples_per_s == pytest.approx(16 * m.batches_per_s)  # the inner loader's
    web = wds.WebLoader(pipeline(urls).to_tuple("npy", "id").batched(16), batch_size=None)
    with feedrate.autotune(web.unbatched().batched(12), cache=False, budget_s=2) as auto:
        for _ in range(2):
            batches = list(auto)
            assert {len(b[1]) for b in batches} == {12}  # the stages after it ran
            assert sorted(i for b in batches for i in b[1].tolist()) == list(range(N))
    # tune's answer is a WebLoader again, its stages kept (it was the DataLoader inside alone).
    staged = web.unbatched().batched(12)
    result = feedrate.tune(staged, budget_s=8, trial_seconds=0.3, use_cache=False)
    out = result.loader()
    assert type(out) is type(staged) and out is not staged
    assert feedrate.config_of(out.pipeline[0]) == result.best.config
    assert {len(b[1]) for b in out} == {12}
    assert sorted(i for b in out for i in b[1].tolist()) == list(range(N))
    assert staged.pipeline[0] is web.pipeline[0]  # the user's pipeline unchanged
    del out
    assert none_left()


def test_resampled_shards_with_epoch_say_the_epoch_grows_with_workers(tmp_path: Path) -> None:
    ds = wds.WebDataset(write_tars(tmp_path), resampled=True).decode().with_epoch(50)
    loader = DataLoader(ds.to_tuple("npy", "id"), batch_size=10, num_workers=2)
    report = doctoring.doctor(loader, checks=["epoch-per-worker"])
    found = report.finding("epoch-per-worker")
    assert found is not None and "100 with your num_workers=2" in found.message
    assert "WebLoader(dataset, ...).with_epoch" in found.fix
