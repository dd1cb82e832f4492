"""What the data libraries taught feedrate, tested without them: duplicates judged by identity
(random augmentation makes copies look different), items that are batches counted by their
samples, workers hidden behind a generator ``__iter__`` found and stopped, the user's class in
the code line, a fresh loader per doctor run for a factory, and a failed trial as a finding.
The real libraries are in ``test_libraries_<library>.py``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, get_worker_info

import feedrate
from feedrate.checks import dataset as checks_dataset
from feedrate.checks.streams import stream_splits, stream_verdict
from feedrate.errors import UserError
from feedrate.loader.batches import item_samples
from feedrate.loader.code import code_line
from feedrate.loader.target import load_source
from feedrate.measuring.dataset_objects import identity
from feedrate.measuring.inner import real_iterator
from feedrate.results.evidence import StreamDigests
from feedrate.results.streams import StreamSamples
from feedrate.workflows import doctor as doctoring

from faults import CrashInWorkers, Squares
from library_data import children, none_left


class Unsplit(IterableDataset[Any]):
    """Every worker yields all of it, each item with random content: ``(torch.randn(8), i)``."""

    def __iter__(self) -> Iterator[Any]:
        for i in range(400):
            yield torch.randn(8), i


class Split(Unsplit):
    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, 400, step):
            yield torch.randn(8), i


class GeneratorLoader(DataLoader[Any]):
    """Like litdata's and MosaicML's StreamingDataLoader: ``__iter__`` is a generator."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        for batch in super().__iter__():  # noqa: UP028 (as they do: the iterator on the stack)
            yield batch


def samples(a: list[str], b: list[str], ida: list[str], idb: list[str]) -> StreamSamples:
    return StreamSamples({0: a, 1: b}, 0.1, True, {0: ida, 1: idb})


# -- duplicates by identity -------------------------------------------------------------------


def test_identity_is_what_names_a_sample_not_what_it_shows() -> None:
    assert identity((torch.randn(8), 3)) == identity((torch.randn(8), 3)) != ""
    assert identity((torch.randn(8), 3)) != identity((torch.randn(8), 4))
    assert identity({"__key__": "s1", "jpg": torch.rand(3, 8, 8)}) == identity(
        {"__key__": "s1", "jpg": torch.rand(3, 8, 8)}
    )
    assert identity(torch.randn(8)) == ""  # nothing but floats: content must tell
    assert identity(torch.randint(0, 255, (3, 8, 8))) == ""  # pixels are data, not an id


def test_copies_with_different_augmentations_are_duplicates_by_identity() -> None:
    content_a, content_b = [f"a{i}" for i in range(32)], [f"b{i}" for i in range(32)]
    ids = [f"id{i}" for i in range(32)]
    seen = stream_verdict(samples(content_a, content_b, ids, ids))
    assert (seen.verdict, seen.by, seen.shared) == ("duplicates", "identity", 32)
    found = checks_dataset.duplicates_finding(samples(content_a, content_b, ids, ids), 2)
    assert found is not None and found.severity == "error"
    assert "the same ids, keys or labels" in found.message
    other = [f"id{i}" for i in range(32, 64)]
    assert stream_splits(samples(content_a, content_b, ids, other))


def test_labels_repeating_in_step_are_duplicates_and_out_of_step_are_not() -> None:
    content_a, content_b = [f"a{i}" for i in range(32)], [f"b{i}" for i in range(32)]
    labels = [str(i % 10) for i in range(32)]
    seen = stream_verdict(samples(content_a, content_b, labels, labels))
    assert seen.verdict == "duplicates" and seen.unit == "positions (labels)"
    shifted = labels[3:] + labels[:3]
    assert stream_verdict(samples(content_a, content_b, labels, shifted)).verdict == "split"


def test_different_content_alone_is_no_split() -> None:
    # Digests taken without seeding the workers alike (plain StreamDigests) cannot tell
    # copies augmented differently from different samples.
    unseeded = StreamDigests(
        {0: [f"a{i}" for i in range(32)], 1: [f"b{i}" for i in range(32)]}, 0.1, True
    )
    assert stream_verdict(unseeded).verdict == "unknown" and not stream_splits(unseeded)
    few = samples(["a", "b"], ["c", "d"], ["", ""], ["", ""])
    assert stream_verdict(few).verdict == "unknown"


def test_the_doctor_and_autotune_see_random_copies_as_copies() -> None:
    loader = DataLoader(Unsplit(), batch_size=16)
    report = doctoring.doctor(loader, checks=["iterable-duplicates"], trial_seconds=0.5)
    assert report.finding("iterable-duplicates") is not None
    with feedrate.autotune(loader, cache=False, budget_s=2) as auto:
        ids = sorted(int(i) for _, b in auto for i in b)
        assert ids == list(range(400)) and auto.config.num_workers == 0
    with feedrate.autotune(
        DataLoader(Unsplit(), batch_size=16, num_workers=2), cache=False
    ) as auto:
        assert auto.config.num_workers == 2  # yours, never more workers on such a stream
        assert "did not yield different items" in auto.report().started_from
    with feedrate.autotune(DataLoader(Split(), batch_size=16), cache=False, budget_s=2) as auto:
        assert auto.config.num_workers > 0
        assert sorted(int(i) for _, b in auto for i in b) == list(range(400))
    assert none_left()


# -- items that are batches -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "count"),
    [
        ((torch.zeros(16, 3, 8, 8), torch.arange(16)), 16),  # webdataset .batched(16)
        ({"__key__": [f"k{i}" for i in range(5)], "cls": list(range(5))}, 5),  # a last batch
        ({"text": ["a"] * 16, "label": list(range(16))}, 16),  # Hugging Face .batch(16)
        ((torch.randn(8), 3), 1),
        ({"input_ids": list(range(128)), "attention_mask": [1] * 128, "label": 3}, 1),
        ({"input_ids": torch.zeros(128), "attention_mask": torch.ones(128)}, 1),
        (torch.zeros(3, 32, 32), 1),
        ("text", 1),
    ],
)
def test_an_item_counts_the_samples_it_holds(item: Any, count: int) -> None:
    assert item_samples(item) == count


def test_a_pipeline_known_to_batch_counts_a_lone_tensor() -> None:
    assert item_samples(torch.zeros(12, 4), batched=True) == 12


# -- hidden workers ---------------------------------------------------------------------------


def test_the_iterator_inside_a_generator_is_found() -> None:
    loader = GeneratorLoader(Squares(64), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    inner = real_iterator(it)
    assert len(inner._workers) == 2
    inner._shutdown_workers()


def test_hidden_workers_are_measured_and_every_lane_is_stopped() -> None:
    loader = GeneratorLoader(Squares(256), batch_size=4, num_workers=2, persistent_workers=True)
    m = feedrate.measure(loader, seconds=0.6, windows_count=2)
    assert len(m.processes.workers) == 2 and all(w.measured_s > 0 for w in m.processes.workers)
    auto = feedrate.autotune(GeneratorLoader(Squares(256), batch_size=4), cache=False, budget_s=1)
    most = 0
    for _ in range(3):
        for _batch in auto:
            most = max(most, len(children()))
    auto.close()
    assert most <= 2 * 8  # one lane and the next, never the lanes replaced
    assert none_left(timeout_s=2.0)
    assert code_line(loader, feedrate.config_of(loader)).startswith("GeneratorLoader(")


# -- fresh loaders, failed trials, state ------------------------------------------------------


def test_a_factory_gives_the_doctor_a_fresh_loader_per_run() -> None:
    built: list[DataLoader[Any]] = []

    def make() -> DataLoader[Any]:
        built.append(DataLoader(Squares(64), batch_size=8))
        return built[-1]

    doctoring.doctor(make, checks=["shm-too-small", "thread-oversubscription"])
    assert len(built) >= 3 and len({id(b) for b in built}) == len(built)


def test_a_failed_trial_is_a_finding_not_a_clean_bill() -> None:
    report = doctoring.doctor(
        DataLoader(CrashInWorkers(64), batch_size=8),
        checks=["too-few-workers", "trials-failed"],
        trial_seconds=0.3,
    )
    found = report.finding("trials-failed")
    assert found is not None and "failed" in found.message
    assert none_left()


def test_state_dict_needs_a_loader_that_has_one() -> None:
    with feedrate.autotune(DataLoader(Squares(), batch_size=8), cache=False) as auto:
        with pytest.raises(UserError, match="no state_dict"):
            auto.state_dict()
        with pytest.raises(UserError, match="no load_state_dict"):
            auto.load_state_dict({})


def test_the_epoch_growing_with_workers_is_said() -> None:
    found = checks_dataset.epoch_per_worker_finding(500, 4)
    assert found is not None and "2,000 with your num_workers=4" in found.message
    assert checks_dataset.epoch_per_worker_finding(None, 4) is None


def test_a_factory_target_loads_as_a_factory(tmp_path: Any) -> None:
    path = tmp_path / "pipe.py"
    path.write_text(
        "from torch.utils.data import DataLoader\n"
        "def make():\n    return DataLoader(list(range(8)), batch_size=4)\n"
        "loader = make()\n"
    )
    factory = load_source(f"{path}:make")
    assert callable(factory) and not isinstance(factory, DataLoader)
    first, second = factory(), factory()
    assert isinstance(first, DataLoader) and isinstance(second, DataLoader) and first is not second
    assert isinstance(load_source(f"{path}:loader"), DataLoader)


def test_a_subclass_of_a_library_dataset_is_known_as_one() -> None:
    from feedrate.loader import libraries

    base = type("StreamingDataset", (), {"__module__": "streaming.base.dataset"})
    mine = type("Augmented", (base,), {"__module__": "train"})
    assert libraries.splits_by_worker(mine()) is not None
    assert libraries.unsafe_to_iterate_here(mine()) is not None
    assert libraries.splits_by_worker(type("StreamingDataset", (), {})()) is None


# -- random draws are no repeated samples -----------------------------------------------------


def alternating(a: str, b: str, n: int = 32) -> list[str]:
    """What a worker yields when each item is a draw from the global generators alone: the
    probe seeds them before every item, one seed at even positions, another at odd ones."""
    return [a if i % 2 == 0 else b for i in range(n)]


def test_items_that_are_random_draws_are_split_whether_or_not_the_stream_is() -> None:
    drawn = alternating("x", "y")
    seen = stream_verdict(samples(drawn, drawn, [""] * 32, [""] * 32))
    assert (seen.verdict, seen.by) == ("split", "random")
    labels = alternating("3", "7")  # a random label beside the random data
    assert stream_verdict(samples(drawn, drawn, labels, labels)).verdict == "split"
    assert stream_verdict(samples(drawn, drawn, ["0"] * 32, ["0"] * 32)).verdict == "split"
    # Not seeded item by item (plain StreamDigests), or too few to tell: no split.
    assert stream_verdict(StreamDigests({0: drawn, 1: drawn}, 0.1, True)).verdict == "unknown"
    few = alternating("x", "y", 6)
    assert stream_verdict(samples(few, few, [""] * 6, [""] * 6)).verdict == "unknown"
    same = ["x"] * 32  # a constant is no draw
    assert stream_verdict(samples(same, same, [""] * 32, [""] * 32)).verdict == "unknown"


def test_samples_keep_their_identity_beside_random_parts() -> None:
    drawn, ids = alternating("x", "y"), [f"id{i}" for i in range(32)]
    seen = stream_verdict(samples(drawn, drawn, ids, ids))  # (torch.randn(8), i), not split
    assert (seen.verdict, seen.by) == ("duplicates", "identity")
    content = [f"d{i}" for i in range(32)]  # a sample's data with a random label
    labels = alternating("3", "7")
    seen = stream_verdict(samples(content, content, labels, labels))
    assert (seen.verdict, seen.by) == ("duplicates", "content")
    other = [f"d{i}" for i in range(32, 64)]
    assert stream_verdict(samples(content, other, labels, labels)).verdict == "split"


def test_a_label_that_never_changes_tells_nothing() -> None:
    a, b = [f"a{i}" for i in range(32)], [f"b{i}" for i in range(32)]
    seen = stream_verdict(samples(a, b, ["0"] * 32, ["0"] * 32))  # (sample, 0), split
    assert (seen.verdict, seen.by) == ("split", "content")
    assert stream_verdict(samples(a, a, ["0"] * 32, ["0"] * 32)).verdict == "duplicates"


class EndlessRandom(IterableDataset[Any]):
    """Synthetic data, not split and endless: ``torch.randn(8)`` for ever."""

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield torch.randn(8)


def test_autotune_gives_workers_to_an_endless_random_stream() -> None:
    with feedrate.autotune(DataLoader(EndlessRandom(), batch_size=16), cache=False) as auto:
        batches = list(itertools.islice(auto, 50))
        assert "keeps its worker count" not in auto.report().started_from
    assert len(batches) == 50 and none_left()


def _own_collate(batch: list[Any]) -> list[Any]:
    return batch


def test_the_code_line_keeps_what_decides_the_batches() -> None:
    """Pasted back, the line must yield what the loader yields: its own collate_fn, sampler
    (a DistributedSampler) and worker_init_fn are named, DataLoader's defaults are not."""
    data = Squares(16)
    tuned = feedrate.LoaderConfig(2, prefetch_factor=2)
    plain = code_line(DataLoader(data, batch_size=4, shuffle=True), tuned)
    assert plain.startswith("DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2")
    assert "collate_fn" not in plain and "sampler" not in plain
    own = DataLoader(
        data,
        batch_size=4,
        sampler=DistributedSampler(data, num_replicas=2, rank=0),
        collate_fn=_own_collate,
        worker_init_fn=print,
    )
    line = code_line(own, tuned)
    for part in ("sampler=sampler", "collate_fn=collate_fn", "worker_init_fn=worker_init_fn"):
        assert part in line, line
