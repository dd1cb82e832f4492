"""The Lightning callback, with Lightning itself: a tiny model trains two epochs on CPU, and
the loader the fit loop iterated has the settings feedrate chose (or is autotune's)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import feedrate
from feedrate.checks.stall import findings, next_step
from feedrate.integrations import shared
from feedrate.results.run import LoaderRun

from commands import feedrate_cli

pl = pytest.importorskip(
    "lightning.pytorch", reason="Lightning is not installed (feedrate[lightning])"
)

from feedrate.integrations.lightning import FeedrateCallback  # noqa: E402

from pipelines import SleepDataset  # noqa: E402

# A few milliseconds of waiting per sample: more workers pay on any machine, busy or not.
N, BATCH, SLEEP_S = 64, 8, 0.005
TUNE = {"budget_s": 8.0, "max_workers": 2}  # a search that completes, so it is cached


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TinyData(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.built: list[DataLoader[Any]] = []

    def setup(self, stage: str) -> None:
        self.dataset = SleepDataset(N, SLEEP_S)

    def train_dataloader(self) -> DataLoader[Any]:
        self.built.append(DataLoader(self.dataset, batch_size=BATCH, shuffle=True))
        return self.built[-1]


class Seen(pl.Callback):
    """What the fit loop iterated, epoch by epoch."""

    def __init__(self) -> None:
        self.loaders: list[Any] = []
        self.batches = 0

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.loaders.append(trainer.train_dataloader)

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache for the module: the first tune measures, the others may answer from it."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("feedrate-cache")
        mp.setenv("FEEDRATE_CACHE_DIR", str(path))
        yield path


@pytest.fixture
def said() -> Iterator[list[str]]:
    """The lines Lightning's rank-zero logger printed."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def fit(callback: FeedrateCallback, root: Path, reload: int = 0, **data: Any) -> tuple[Any, Seen]:
    seen = Seen()
    trainer = pl.Trainer(
        reload_dataloaders_every_n_epochs=reload,
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, seen],
        default_root_dir=root,
    )
    trainer.fit(TinyModel(), **data)
    return trainer, seen


def feedrate_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("feedrate:")]


def test_a_datamodule_trains_two_epochs_on_the_tuned_loader(
    cache: Path, tmp_path: Path, said: list[str]
) -> None:
    data = TinyData()
    callback = FeedrateCallback(**TUNE)
    trainer, seen = fit(callback, tmp_path, datamodule=data)
    assert trainer.current_epoch == 2 and seen.batches == 2 * N // BATCH
    assert callback.result is not None and callback.config == callback.result.best.config
    assert callback.config.num_workers > 0  # the datamodule's own loader has none
    assert len(seen.loaders) == 2 and seen.loaders[0] is seen.loaders[1]
    trained = seen.loaders[0]
    assert trained is not data.built[0] and trained.dataset is data.built[0].dataset
    assert feedrate.config_of(trained) == callback.config
    assert "train_dataloader" not in vars(data)  # the hook is its own again
    lines = feedrate_lines(said)
    assert lines == [callback.message]
    assert f"num_workers={callback.config.num_workers}, prefetch_factor=" in lines[0]

    # A second run of the same pipeline answers from the cache, measuring nothing, when the
    # first search completed (one cut short by its budget on a loaded machine is not kept).
    again = FeedrateCallback(**TUNE)
    trainer, seen = fit(again, tmp_path, datamodule=TinyData())
    assert again.result is not None and trainer.current_epoch == 2
    assert feedrate.config_of(seen.loaders[0]) == again.config
    assert again.result.from_cache is (not callback.result.partial)
    if again.result.from_cache:
        assert again.config == callback.config
        assert feedrate_lines(said)[-1].endswith("; from feedrate's cache)")


class SeenSettings(pl.Callback):
    """The settings each epoch's loader has, and whether it is one the datamodule built;
    no loader kept (a replaced loader's persistent workers end when it is dropped)."""

    def __init__(self, data: TinyData) -> None:
        self.data = data
        self.epochs: list[tuple[feedrate.LoaderConfig, bool]] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        loader = trainer.train_dataloader
        yours = any(loader is built for built in self.data.built)
        self.epochs.append((feedrate.config_of(loader), yours))


def test_a_reloaded_loader_gets_the_same_settings_without_a_new_search(
    cache: Path, tmp_path: Path, said: list[str]
) -> None:
    data = TinyData()
    callback = FeedrateCallback(**TUNE)
    seen = SeenSettings(data)
    trainer = pl.Trainer(
        reload_dataloaders_every_n_epochs=1,
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, seen],
        default_root_dir=tmp_path,
    )
    trainer.fit(TinyModel(), datamodule=data)
    assert trainer.current_epoch == 2 and len(data.built) == 2  # built again for epoch 1
    assert seen.epochs == [(callback.config, False)] * 2
    assert feedrate_lines(said) == [callback.message]  # one search, said once
    data.built.clear()


def test_a_loader_given_to_fit_is_replaced_by_the_tuned_one(cache: Path, tmp_path: Path) -> None:
    loader = DataLoader(SleepDataset(N, SLEEP_S), batch_size=BATCH, shuffle=True)
    callback = FeedrateCallback(**TUNE)
    trainer, seen = fit(callback, tmp_path, train_dataloaders=loader)
    assert trainer.current_epoch == 2 and seen.batches == 2 * N // BATCH
    assert seen.loaders[0] is not loader and seen.loaders[0].dataset is loader.dataset
    assert feedrate.config_of(seen.loaders[0]) == callback.config


def test_online_trains_two_epochs_on_autotune(cache: Path, tmp_path: Path, said: list[str]) -> None:
    callback = FeedrateCallback(online=True, budget_s=2.0, max_workers=2)
    trainer, seen = fit(callback, tmp_path, datamodule=TinyData())
    assert trainer.current_epoch == 2 and seen.batches == 2 * N // BATCH
    assert all(isinstance(x, feedrate.AutoLoader) for x in seen.loaders)
    assert callback.autoloaders == [seen.loaders[0]]
    settled = feedrate_lines(said)
    assert len(settled) == 2 and settled[-1] == callback.message
    report = callback.autoloaders[0].report()
    verb = "settled on" if report.settled else "had not settled, last on"
    assert settled[-1].startswith(f"feedrate: autotune {verb} num_workers=")
    assert callback.config == report.config


def test_online_refuses_what_only_tune_takes() -> None:
    with pytest.raises(feedrate.UserError, match="memory_limit"):
        FeedrateCallback(online=True, memory_limit=1 << 30)


def _rank(zero: bool, sent: list[Any]) -> Any:
    """A two-rank trainer as the callback sees it; ``broadcast`` hands out rank 0's object."""

    def broadcast(obj: Any, src: int = 0) -> Any:
        if zero:
            sent.append(obj)
        return sent[0]

    return SimpleNamespace(
        world_size=2,
        num_devices=2,
        is_global_zero=zero,
        strategy=SimpleNamespace(broadcast=broadcast),
    )


def test_under_ddp_rank_zero_tunes_and_the_others_apply_its_answer(
    cache: Path, monkeypatch: pytest.MonkeyPatch, said: list[str]
) -> None:
    sent: list[Any] = []
    zero, one = FeedrateCallback(**TUNE), FeedrateCallback(**TUNE)
    make = lambda: DataLoader(SleepDataset(N, SLEEP_S), batch_size=BATCH)  # noqa: E731
    tuned_zero = zero._apply(_rank(True, sent), make())
    assert len(sent) == 1 and zero.config is not None

    def no_measuring(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rank other than 0 measured")

    monkeypatch.setattr(shared, "tune", no_measuring)
    theirs = make()
    tuned_one = one._apply(_rank(False, sent), theirs)
    assert one.config == zero.config
    assert feedrate.config_of(tuned_one) == feedrate.config_of(tuned_zero) == zero.config
    assert tuned_one.dataset is theirs.dataset
    assert len(feedrate_lines(said)) == 1  # rank 0 spoke, rank 1 did not


def test_ddp_on_two_cpu_ranks_trains_both_on_rank_zero_s_answer(tmp_path: Path) -> None:
    # The example, as a user runs it: Lightning's DDP launcher starts rank 1 as a second
    # process, gloo carries rank 0's answer, and Lightning gives each rank its own shard.
    script = Path(__file__).resolve().parents[1] / "examples" / "lightning_train.py"
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path)}
    flags = ["--devices", "2", "--samples", "64", "--budget-s", "8", "--max-workers", "2"]
    done = subprocess.run(
        [sys.executable, str(script), *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=100,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    told = feedrate_lines(out.splitlines())
    assert len(told) == 1 and "tuned to num_workers=" in told[0]
    epochs = re.findall(r"rank (\d) epoch (\d): (.+?), (\d+) batches", out)
    assert sorted((r, e) for r, e, _, _ in epochs) == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    assert len({label for _, _, label, _ in epochs}) == 1  # every rank on the same settings
    assert {n for _, _, _, n in epochs} == {"2"}  # 64 samples, 16 a batch, half a rank
    workers = int(told[0].split("num_workers=")[1].split(",")[0])
    assert epochs[0][2].startswith(f"w={workers}")
    assert out.count("trained 2 epochs") == 2


def test_online_under_ddp_needs_the_loader_s_own_distributed_sampler(said: list[str]) -> None:
    # Lightning gives DistributedSamplers to DataLoaders, not to autotune's wrapper.
    callback = FeedrateCallback(online=True, budget_s=2.0)
    plain = DataLoader(SleepDataset(N, 0.0), batch_size=BATCH)
    with pytest.raises(feedrate.UserError, match="its own DistributedSampler"):
        callback._apply(_rank(True, []), plain)
    sampler = torch.utils.data.DistributedSampler(plain.dataset, num_replicas=2, rank=0)
    sharded = DataLoader(plain.dataset, batch_size=BATCH, sampler=sampler)
    auto = callback._apply(_rank(True, []), sharded)
    try:
        assert isinstance(auto, feedrate.AutoLoader) and len(auto) == N // BATCH // 2
    finally:
        auto.close()


def observed(handed_over: bool) -> LoaderRun:
    """A training loader of Lightning's, as ``feedrate run`` saw it: it waited 9 s of a 10 s
    loop with w=2, either tuned by the callback in the script or set so by the user."""
    return LoaderRun(
        created_at="train.py:9",
        config=feedrate.LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True),
        pid=1,
        batch_size=BATCH,
        epochs=1,
        batches=20,
        samples=20 * BATCH,
        wait_s=9.0,
        step_s=1.0,
        startup_s=0.1,
        built_by="lightning",
        handed_over=handed_over,
    )


def test_feedrate_run_calls_the_callback_s_answer_the_tuned_settings_not_yours() -> None:
    tuned, yours = observed(handed_over=True), observed(handed_over=False)
    stall = {f.id: f.message for f in findings(tuned, {}, 2)}["data-stall"]
    assert stall.startswith("with the tuned settings (w=2 pf=2 persistent) the consumer waits")
    steps = " | ".join(next_step(tuned, ["train.py"], 2))
    assert "--autotune" not in steps and "FeedrateCallback()" not in steps  # already tuned
    # A loader the user configured is still the user's.
    stall = {f.id: f.message for f in findings(yours, {}, 2)}["data-stall"]
    assert stall.startswith("with your settings (w=2 pf=2 persistent) the consumer waits")
    steps = " | ".join(next_step(yours, ["train.py"], 2))
    assert "feedrate run --autotune train.py" in steps and "FeedrateCallback()" in steps


def test_feedrate_run_records_the_callback_s_loader_as_handed_over(tmp_path: Path) -> None:
    scripts = Path(__file__).resolve().parent / "run_scripts"
    out = tmp_path / "run.json"
    done = feedrate_cli(
        "run", "--json", str(out), "lightning_callback.py", cwd=scripts, cache=tmp_path / "cache"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (train,) = json.loads(out.read_text())["loaders"]
    assert train["handed_over"] is True and train["batch_size"] == 8
    said = [f["message"] for f in train["findings"]] + train["next_step"]
    assert not [s for s in said if "your settings" in s]
    assert not [s for s in said if "--autotune" in s or "FeedrateCallback()" in s]
