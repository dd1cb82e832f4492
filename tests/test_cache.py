"""The cache tune and autotune share: one key function over one set of options, so autotune
starts from the answer of a plain ``tune`` of the same loader, on a machine with a GPU too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import feedrate
from feedrate.autotuning.start import FROM_CACHE
from feedrate.loader.config import LoaderConfig
from feedrate.machine import cache
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import device as devices
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.workflows.tune import tune

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
