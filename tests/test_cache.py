"""The cache tune and autotune share: one key function over one set of options, so autotune
starts from the answer of a plain ``tune`` of the same loader, on a machine with a GPU too. The
key holds the state of the pipeline (``identity``): two pipelines of one class and length have
two keys, one pipeline built twice, here or in another process, has one, and bulk data is never
read to make it."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import feedrate
from feedrate.autotuning.start import FROM_CACHE
from feedrate.loader.config import LoaderConfig
from feedrate.machine import cache, identity
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import device as devices
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.workflows.tune import tune

from library_data import N, hf_dataset, write_tars
from pipelines import TinyDataset


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path / "cache"))


class _LookedUp(Exception):
    pass


def key_tune_looks_up(loader: DataLoader[Any], facts: MachineFacts) -> str:
    """The key a plain ``tune(loader)`` reads its cached answer from (it stops there)."""
    keys: list[str] = []

    def spy(key: str, directory: Path | None = None) -> dict[str, Any] | None:
        keys.append(key)
        raise _LookedUp

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache, "load", spy)
        with pytest.raises(_LookedUp):
            tune(loader, machine=facts)
    return keys[0]


def tune_answer(best: LoaderConfig, facts: MachineFacts) -> dict[str, Any]:
    """A cached tune result whose answer is ``best``."""
    yours = Trial(LoaderConfig(), "your settings")
    return TuneResult(
        machine=facts.to_dict(),
        baseline=yours,
        best=Trial(best, "the answer"),
        trials=[yours],
        findings=[],
        search_seconds=1.0,
        reason="test",
        code="DataLoader(dataset)",
    ).to_dict()


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-only", "gpu"])
def test_autotune_starts_from_the_answer_of_a_plain_tune(
    gpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No GPU needed: the machine's facts report one, and the device tune resolves by default
    # ("auto") is cuda:0, so tune's key names it; autotune must resolve it the same way.
    facts = collect()
    if gpu:
        facts = replace(facts, accelerator="cuda", accelerator_name="Fake", accelerator_count=1)
    monkeypatch.setattr(devices, "device", lambda: torch.device("cuda", 0) if gpu else None)
    loader = DataLoader(TinyDataset(64), batch_size=8)
    answer = LoaderConfig(3, pin_memory=True)
    key = key_tune_looks_up(loader, facts)
    assert cache.save(key, tune_answer(answer, facts)) is not None
    assert tune(loader, machine=facts).from_cache  # tune's own entry: tune reads it back
    with feedrate.autotune(loader, machine=facts) as auto:
        assert auto.report().started_from == FROM_CACHE
        assert auto.config == replace(answer, persistent_workers=True)
        assert auto.report().settled  # it only watches


def test_the_device_is_part_of_a_tune_key() -> None:
    facts, loader = collect(), DataLoader(TinyDataset(64), batch_size=8)
    keys = {cache.key(facts, loader, cache.tune_options(device=d)) for d in (None, "cuda:0")}
    assert len(keys) == 2


def test_keys_of_earlier_versions_still_match() -> None:
    # Entries already on users' machines: a run without a device keeps its options as they
    # were, and autotune's own entries too.
    assert cache.tune_options(device=None) == {
        "consumer": None,
        "max_workers": None,
        "memory_limit": None,
        "allow_reorder": False,
        "allow_threads": False,
    }
    assert cache.tune_options(device="cuda:0", max_workers=4)["device"] == "cuda:0"
    assert cache.autotune_options(max_workers=None, allow_threads=False) == {
        "autotune": 1,
        "max_workers": None,
        "allow_threads": False,
    }


def test_a_cached_answer_beyond_max_workers_is_not_started_from() -> None:
    facts, loader = collect(), DataLoader(TinyDataset(64), batch_size=8)
    key = cache.key(facts, loader, cache.tune_options(device=None))
    cache.save(key, tune_answer(LoaderConfig(6), facts))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(devices, "device", lambda: None)
        with feedrate.autotune(loader, machine=facts, max_workers=2) as auto:
            assert auto.report().started_from != FROM_CACHE
            assert auto.config.num_workers <= 2


class OwnLoader(DataLoader[Any]):
    """Another loader class over the same dataset: another pipeline."""


def test_the_key_covers_what_makes_a_loader_different() -> None:
    # Issue 16.4: loader_a (w=0) and loader_b (w=2 persistent) of one Dataset class must not
    # share an answer: the user's settings are the baseline every figure is measured against.
    facts, options = collect(), cache.tune_options(device=None)
    base = DataLoader(TinyDataset(64), batch_size=8)
    same = DataLoader(TinyDataset(64), batch_size=8)
    others = [
        DataLoader(TinyDataset(64), batch_size=8, num_workers=2, persistent_workers=True),
        DataLoader(TinyDataset(64), batch_size=16),
        DataLoader(TinyDataset(64), batch_size=8, shuffle=True),
        DataLoader(TinyDataset(64), batch_size=8, collate_fn=lambda b: b),
        DataLoader(TinyDataset(64), batch_size=8, pin_memory=True),
        OwnLoader(TinyDataset(64), batch_size=8),
    ]
    key = cache.key(facts, base, options)
    assert cache.key(facts, same, options) == key
    assert len({key, *(cache.key(facts, o, options) for o in others)}) == 1 + len(others)


def test_a_cached_answer_names_the_target_asked_about() -> None:
    loader = DataLoader(TinyDataset(64), batch_size=8)
    first = tune(loader, budget_s=10, trial_seconds=0.2, target="a.py:loader", max_workers=2)
    again = tune(loader, budget_s=10, trial_seconds=0.2, target="b.py:loader", max_workers=2)
    assert not first.from_cache and again.from_cache
    assert again.target == "b.py:loader" and again.baseline.config == first.baseline.config


def test_a_cached_answer_over_the_tasks_left_now_is_tuned_again() -> None:
    # Cached where nothing limited processes, read in a container whose pids.max leaves 40
    # tasks (80%: 8 workers of 4): its 32 workers would not start, so tune searches again.
    loader = DataLoader(TinyDataset(1024), batch_size=8)
    roomy = replace(collect(), tasks_free=None)
    key = key_tune_looks_up(loader, roomy)
    cache.save(key, tune_answer(LoaderConfig(32, prefetch_factor=2), roomy))
    assert tune(loader, machine=roomy, budget_s=10, trial_seconds=0.2).from_cache
    few = replace(roomy, tasks_free=40)
    assert key_tune_looks_up(loader, few) == key  # the same machine, a limit now
    again = tune(loader, machine=few, budget_s=10, trial_seconds=0.2)
    assert not again.from_cache and again.best.config.num_workers <= 8


# -- the state a pipeline holds ---------------------------------------------------------------


class RootDataset(TinyDataset):
    """A user's dataset: two of one class and length differ by where they read."""

    def __init__(self, root: str, n: int = 64, transform: Any = None) -> None:
        super().__init__(n)
        self.root, self.transform = root, transform


class CachingDataset(TinyDataset):
    """Keeps what it made: its cache fills as it runs, its switch is part of the pipeline."""

    def __init__(self, use_cache: bool = True) -> None:
        super().__init__(64)
        self.use_cache, self._cache = use_cache, dict[int, torch.Tensor]()

    def __getitem__(self, index: int) -> torch.Tensor:
        if not self.use_cache:
            return super().__getitem__(index)
        return self._cache.setdefault(index, super().__getitem__(index))


class Collate:
    """A collate_fn that is an object: its ``max_len`` is part of the pipeline."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len

    def __call__(self, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(batch)[:, : self.max_len]


def scale(x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    return x * factor


def scale_by(factor: float) -> Any:
    return lambda x: x * factor


def heavy(batch: dict[str, Any]) -> dict[str, Any]:
    """A ``set_transform`` of a Hugging Face dataset."""
    return {"x": torch.tanh(torch.tensor(batch["x"]))}


def hf_formatted() -> Any:
    return hf_dataset().with_format("torch")


def hf_transformed() -> Any:
    ds = hf_dataset()
    ds.set_transform(heavy)
    return ds


def wds_split(urls: str) -> Any:
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().to_tuple("npy")


def wds_unsplit(urls: str) -> Any:
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False, workersplitter=None)
    return ds.decode().to_tuple("npy")


def user_loaders() -> dict[str, DataLoader[Any]]:
    """Pairs of one class and length that only their state tells apart."""
    return {
        "root a": DataLoader(RootDataset("a")),
        "root b": DataLoader(RootDataset("b")),
        "partial 2": DataLoader(RootDataset("a", transform=functools.partial(scale, factor=2.0))),
        "partial 3": DataLoader(RootDataset("a", transform=functools.partial(scale, factor=3.0))),
        "lambdas": DataLoader(RootDataset("a", transform=[lambda x: x + 1, lambda x: x + 2][0])),
        "lambdas 2": DataLoader(RootDataset("a", transform=[lambda x: x + 1, lambda x: x + 2][1])),
        "closure 2": DataLoader(RootDataset("a", transform=scale_by(2.0))),
        "closure 3": DataLoader(RootDataset("a", transform=scale_by(3.0))),
        "default 2": DataLoader(RootDataset("a", transform=[lambda x, k=2: x * k, 0][0])),
        "default 3": DataLoader(RootDataset("a", transform=[lambda x, k=3: x * k, 0][0])),
        "cached": DataLoader(CachingDataset(use_cache=True)),
        "not cached": DataLoader(CachingDataset(use_cache=False)),
        "tags": DataLoader(RootDataset("a", transform={"flip", "crop", "blur", "jitter"})),
        "collate 16": DataLoader(RootDataset("a"), collate_fn=Collate(16)),
        "collate 32": DataLoader(RootDataset("a"), collate_fn=Collate(32)),
    }


def all_loaders(urls: str) -> dict[str, DataLoader[Any]]:
    return {
        **user_loaders(),
        "hf format": DataLoader(hf_formatted(), batch_size=16),
        "hf transform": DataLoader(hf_transformed(), batch_size=16),
        "wds split": DataLoader(wds_split(urls), batch_size=16),
        "wds unsplit": DataLoader(wds_unsplit(urls), batch_size=16),
    }


def fingerprints(urls: str) -> dict[str, str]:
    """Each loader's fingerprint, as JSON (run in a fresh process too)."""
    return {
        name: json.dumps(cache.fingerprint(loader), sort_keys=True)
        for name, loader in all_loaders(urls).items()
    }


@pytest.fixture
def shards(tmp_path: Path) -> str:
    pytest.importorskip("webdataset", reason="webdataset is not installed")
    pytest.importorskip("datasets", reason="datasets is not installed")
    return write_tars(tmp_path)


def test_pipelines_of_one_class_and_length_have_other_keys(shards: str) -> None:
    # QA: a Hugging Face dataset formatted for torch and one with a transform; webdataset
    # split by worker and not (each worker reading every shard): each was served the other's
    # answer. And a user's dataset over another root, transform, or collate_fn's settings.
    facts, options = collect(), cache.tune_options(device=None)
    loaders = all_loaders(shards)
    keys = {name: cache.key(facts, loader, options) for name, loader in loaders.items()}
    assert len(set(keys.values())) == len(keys), keys


def test_one_pipeline_built_twice_has_one_key(shards: str) -> None:
    # Webdataset draws a seed at random for each WebDataset: it is left out.
    facts, options = collect(), cache.tune_options(device=None)
    first, again = all_loaders(shards), all_loaders(shards)
    for name, loader in first.items():
        assert cache.key(facts, loader, options) == cache.key(facts, again[name], options), name


def test_one_pipeline_has_one_key_in_a_fresh_process(shards: str) -> None:
    # Another process, another hash seed (the order of sets): no address, id or random draw.
    script = (
        "import json, sys; sys.path[:0] = [sys.argv[1]]; import test_cache; "
        "print(json.dumps(test_cache.fingerprints(sys.argv[2])))"
    )
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    done = subprocess.run(
        [sys.executable, "-c", script, here, shards],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == fingerprints(shards)


def test_the_key_does_not_move_as_the_pipeline_runs(shards: str) -> None:
    # Autotune reads the cache on a loader that may have run an epoch: a resumable stream's
    # position (datasets' state_dict), its epoch and what a cache holds are left out.
    facts, options = collect(), cache.tune_options(device=None)
    stream = hf_dataset().to_iterable_dataset(num_shards=4).with_format("torch")
    loaders = [
        DataLoader(stream, batch_size=16),
        DataLoader(wds_split(shards), batch_size=16),
        DataLoader(CachingDataset(), batch_size=16),
    ]
    before = [cache.key(facts, loader, options) for loader in loaders]
    for loader in loaders:
        assert sum(1 for _ in loader) > 0
    stream.set_epoch(3)
    assert [cache.key(facts, loader, options) for loader in loaders] == before


class Holder(TinyDataset):
    """A dataset holding bulk data: none of it may be read to tell it apart."""

    def __init__(self, **held: Any) -> None:
        super().__init__(64)
        self.__dict__.update(held)


def nodes(state: Any) -> int:
    return 1 + sum(nodes(item) for item in state) if isinstance(state, list) else 1


class UnreadTensor(torch.Tensor):
    """A tensor whose values must not be read."""

    def tolist(self) -> Any:
        raise AssertionError("the values of a large tensor were read")

    def numpy(self, *, force: bool = False) -> Any:
        raise AssertionError("the values of a large tensor were read")


class UnreadArray(np.ndarray):
    """An array whose values must not be read."""

    def tolist(self) -> Any:
        raise AssertionError("the values of a large array were read")

    def tobytes(self, order: Any = "C") -> bytes:
        raise AssertionError("the values of a large array were read")


def test_bulk_data_counts_by_shape_never_by_its_values() -> None:
    needle = "needle-7f3a"
    table = hf_dataset().add_column("text", [f"{needle}-{i}" for i in range(N)])
    # 40 GB and 20 GB as they seem, no memory as they are (one value, broadcast).
    huge = torch.zeros(1).expand(1_000_000, 10_000).as_subclass(UnreadTensor)
    ds = Holder(
        huge=huge,
        array=np.broadcast_to(np.zeros(1, dtype=np.float16), (100_000, 100_000)).view(UnreadArray),
        table=table,
        ids=list(range(1_000_000)),
        tags={f"{needle}-{i}" for i in range(1000)},
        text=needle * 1_000_000,
        blob=b"\0" * 10_000_000,
        mean=torch.tensor([0.5, 0.25]),
    )
    state = identity.state_of(ds)
    text = json.dumps(state)
    found = text_nodes(state)
    assert [
        "array",
        "test_cache.UnreadTensor",
        [1_000_000, 10_000],
        "torch.float32",
        "cpu",
    ] in found
    assert ["array", "test_cache.UnreadArray", [100_000, 100_000], "float16", "cpu"] in found
    assert any(n[0] == "table" and n[-1] == N for n in found if len(n) == 4)  # schema, rows
    assert needle not in text and len(text) < 20_000  # the table's rows, the set, the string
    assert [0.5, 0.25] in found  # a tiny array (a mean) counts by its values
    assert identity.state_of(Holder(x=huge)) != identity.state_of(Holder(x=huge[:1]))
    # A list counts by its length, its head and its tail.
    ids = identity.state_of(list(range(1_000_000)))[0]
    assert ids[:2] == ["builtins.list", 1_000_000] and len(ids[2]) == identity.MAX_ITEMS
    assert ids[2][0] == 0 and ids[2][-1] == 999_999


def text_nodes(state: Any) -> list[Any]:
    """Every list inside ``state``, flattened, to look one up."""
    found: list[Any] = []
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            found.append(item)
            stack.extend(item)
    return found


class Unreadable:
    """An object whose attributes fail: a key is still made."""

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        raise RuntimeError("closed")


def test_the_walk_is_bounded_in_depth_in_size_and_stops_at_cycles() -> None:
    deep: list[Any] = []
    for _ in range(10_000):  # past the recursion limit
        deep = [deep]
    wide = [[list(range(64)) for _ in range(64)] for _ in range(64)]  # 266,304 values
    loop = Holder()
    loop.me, loop.items = loop, [loop]
    states = identity.state_of(deep, wide, loop)
    assert ["unreadable", "test_cache.Unreadable"] in text_nodes(identity.state_of(Unreadable()))
    assert max(nodes(s) for s in states) <= 3 * identity.MAX_NODES
    assert "deeper" in json.dumps(states[0]) and "..." in json.dumps(states[1])
    assert ["ref", 0] in text_nodes(identity.state_of(loop))


def test_no_address_in_the_state() -> None:
    loaders = user_loaders()
    for name, loader in loaders.items():
        text = json.dumps(identity.state_of(loader.dataset, loader.collate_fn, object()))
        assert "0x" not in text and " at " not in text, name


def test_an_entry_written_before_the_state_counted_is_not_read() -> None:
    # Keys without the pipeline's state: not found any more, and nothing fails on them.
    facts, loader = collect(), DataLoader(RootDataset("a"))
    options = cache.tune_options(device=None)
    with pytest.MonkeyPatch.context() as patch:
        before = cache.fingerprint
        patch.setattr(
            cache, "fingerprint", lambda lo: {k: v for k, v in before(lo).items() if k != "state"}
        )
        old = cache.key(facts, loader, options)
    cache.save(old, tune_answer(LoaderConfig(2), facts))
    new = cache.key(facts, loader, options)
    assert new != old and cache.load(new) is None and cache.load(old) is not None
