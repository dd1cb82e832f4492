"""tune() on real pipelines built to need a given answer, plus its contract: JSON, cache, bad
input, partial results. Assertions are about choices with wide margins, never about speed."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import feedrate
import feedrate.loader.threaded
from feedrate.errors import PipelineError, UserError
from feedrate.loader.config import LoaderConfig
from feedrate.results.tune import TUNE_SCHEMA, TuneResult
from feedrate.workflows.tune import tune

from pipelines import EmptyDataset, FailingDataset, RacyDataset, SleepDataset, TinyDataset

FAST = {"trial_seconds": 0.5, "use_cache": False}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path / "cache"))


def test_tiny_samples_choose_no_workers() -> None:
    loader = DataLoader(TinyDataset(50_000), batch_size=256, num_workers=2)
    r = tune(loader, budget_s=30, **FAST)
    assert r.best.config.num_workers == 0
    assert r.baseline.config == LoaderConfig(2)
    assert all(t.reason for t in r.trials)
    assert r.code == "DataLoader(dataset, batch_size=256, num_workers=0)"


def test_latency_bound_goes_past_the_cpu_count() -> None:
    loader = DataLoader(SleepDataset(4096, sleep_s=0.004), batch_size=4)
    r = tune(loader, budget_s=60, max_workers=16, **FAST)
    cpus = r.machine["cpus_usable"]
    assert r.best.config.num_workers > cpus
    # What took the search past the CPU count: workers that mostly wait.
    assert any("mostly wait" in t.reason for t in r.trials), [t.reason for t in r.trials]
    # The label of the answer: latency, unless other processes filled the CPUs meanwhile (then
    # its workers queue for a core, and "cpu" is what was measured).
    best = r.best
    others = (best.system_busy_cpus or 0.0) - best.main_cpu - best.workers_cpu
    assert r.bottleneck == "latency" or (r.bottleneck == "cpu" and others >= 0.5), (
        r.bottleneck,
        others,
    )
    assert r.speedup > 2
    assert any(f.id == "too-few-workers" for f in r.findings)
    # More workers than CPUs on purpose: said in a finding, and the loader handed back does not
    # raise DataLoader's "suggested max number of worker" warning (a check it runs per epoch).
    assert any(f.id == "workers-past-cpus" for f in r.findings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r.loader().check_worker_number_rationality()
    assert not [w for w in caught if "suggested max" in str(w.message)]
    # The leader and your settings were measured again side by side, windows pooled.
    assert r.best.repeats >= 2 and r.baseline.repeats >= 2


def test_consumer_step_time_picks_the_fewest_workers_that_keep_it_fed() -> None:
    # A worker makes a batch every 160 ms; the consumer takes one every 100 ms: one worker
    # starves it, two keep it fed.
    loader = DataLoader(SleepDataset(4096, sleep_s=0.01), batch_size=16)
    r = tune(loader, step_time=0.1, budget_s=60, max_workers=16, **FAST)
    assert r.consumer is not None and r.consumer["step_s"] == 0.1
    # The margin is 5% stall; a loaded 2-core host can leave the best a hair above it (epoch
    # restarts and per-batch hand-over cost a few percent), so the choice is what is asserted.
    assert r.best.stall_fraction is not None and r.best.stall_fraction <= 0.15
    assert 2 <= r.best.config.num_workers <= 4
    assert r.baseline.stall_fraction is not None and r.baseline.stall_fraction > 0.3
    assert "fewest" in r.reason or "stall least" in r.reason


def test_threads_with_leave_recommend_few_threaded_workers() -> None:
    # 4 ms waits, 16 samples a batch: 2 workers on 16 threads keep 32 waits in flight, twice
    # what the 16 processes allowed here can.
    loader = DataLoader(SleepDataset(8192, sleep_s=0.004), batch_size=16)
    r = tune(loader, budget_s=60, max_workers=16, allow_threads=True, **FAST)
    assert r.best.config.threads == 16 and r.best.config.num_workers <= 8
    assert r.code.startswith("DataLoader(feedrate.threaded(dataset, 16), batch_size=16")
    assert any(f.id == "threads-chosen" for f in r.findings)
    assert isinstance(r.loader().dataset, feedrate.loader.threaded.Threaded)


def test_threads_without_leave_are_measured_and_reported_not_chosen() -> None:
    loader = DataLoader(SleepDataset(8192, sleep_s=0.004), batch_size=16)
    r = tune(loader, budget_s=60, max_workers=16, **FAST)
    assert r.best.config.threads == 1
    assert sum(t.config.threads > 1 for t in r.trials) == 1
    found = [f for f in r.findings if f.id == "threads-would-help"]
    assert found, [(t.config.label(), t.median, t.error) for t in r.trials]
    assert "--threads" in found[0].fix and "matched" in found[0].message


def test_a_dataset_unsafe_on_threads_blocks_them() -> None:
    loader = DataLoader(RacyDataset(4096), batch_size=16)
    r = tune(loader, budget_s=40, max_workers=8, allow_threads=True, **FAST)
    assert all(t.config.threads == 1 for t in r.trials)
    found = [f for f in r.findings if f.id == "threads-unsafe"]
    assert found and "different when fetched on threads" in found[0].message


def test_json_round_trip_schema_and_loader() -> None:
    source = DataLoader(TinyDataset(20_000), batch_size=128)
    r = tune(source, budget_s=20, **FAST)
    data = json.loads(r.to_json())
    assert data["schema"] == TUNE_SCHEMA
    for key in ("machine", "baseline", "best", "trials", "findings", "search_seconds"):
        assert key in data
    assert {"config", "samples_per_s"} <= set(data["best"]) and {"config"} <= set(data["baseline"])
    assert all({"id", "severity", "message", "fix"} <= set(f) for f in data["findings"])
    again = TuneResult.from_json(r.to_json())
    assert again.to_dict() == data
    rebuilt = r.loader()
    assert isinstance(rebuilt, DataLoader) and rebuilt.dataset is source.dataset
    assert rebuilt.num_workers == r.best.config.num_workers
    with pytest.raises(ValueError, match="pass the original loader"):
        again.loader()
    assert again.loader(source).num_workers == r.best.config.num_workers


def test_second_tune_comes_from_the_cache_unless_fresh() -> None:
    loader = DataLoader(TinyDataset(20_000), batch_size=128)
    first = tune(loader, budget_s=20, trial_seconds=0.5)
    second = tune(loader, budget_s=20, trial_seconds=0.5)
    assert not first.from_cache and second.from_cache
    assert second.best.config == first.best.config
    third = tune(loader, budget_s=20, trial_seconds=0.5, fresh=True)
    assert not third.from_cache
    other = tune(DataLoader(TinyDataset(20_000), batch_size=64), budget_s=20, trial_seconds=0.5)
    assert not other.from_cache  # another batch size is another pipeline


def test_short_budget_gives_a_partial_result() -> None:
    loader = DataLoader(SleepDataset(4096, sleep_s=0.004), batch_size=4)
    r = tune(loader, budget_s=5, trial_seconds=1.5, use_cache=False)
    assert r.partial and r.partial_reason and "budget" in r.partial_reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget_s": 1}, "too short to measure anything"),
        ({"rate": 0}, "--rate must be positive"),
        ({"rate": -1.0}, "--rate must be positive"),
        ({"rate": 10.0, "step_time": 0.1}, "at most one"),
    ],
)
def test_bad_input_is_named(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(UserError, match=message):
        tune(DataLoader(TinyDataset(64), batch_size=8), use_cache=False, **kwargs)  # type: ignore[arg-type]


def test_empty_loader_and_failing_dataset() -> None:
    with pytest.raises(PipelineError, match="yielded no batch"):
        tune(DataLoader(EmptyDataset(), batch_size=4), budget_s=10, **FAST)
    with pytest.raises(PipelineError, match="sample index 3"):
        tune(DataLoader(FailingDataset(bad_index=3), batch_size=4), budget_s=10, **FAST)
