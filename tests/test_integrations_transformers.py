"""transformers' Trainer, for real: a tiny model (no hub, no download) trains two epochs on
CPU on the DataLoader the Trainer built from the arguments feedrate set."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

import feedrate
from feedrate.integrations import loader_from
from feedrate.loader.config import LoaderConfig
from feedrate.running.observer import Watch

hf = pytest.importorskip(
    "transformers", reason="transformers is not installed (feedrate[transformers])"
)

from feedrate.integrations.transformers import (  # noqa: E402
    FeedrateTrainerCallback,
    apply_to_args,
    quiet_builds,
    tune_trainer,
)

N, BATCH, SLEEP_S = 64, 8, 0.005
TUNE = {"budget_s": 8.0, "max_workers": 2}


class Pairs(Dataset[dict[str, torch.Tensor]]):
    """Features and a label; a few milliseconds of waiting per sample."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(SLEEP_S)
        return {"x": torch.full((8,), float(i)), "labels": torch.tensor([float(i % 2)])}


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}


class Seen(hf.TrainerCallback):  # type: ignore[misc]
    """The settings of the loader each epoch iterated."""

    def __init__(self) -> None:
        self.configs: list[feedrate.LoaderConfig] = []
        self.seeding: list[int] = []  # the worker count seed_worker was given

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        inner = loader_from(kwargs["train_dataloader"])
        assert inner is not None
        self.configs.append(feedrate.config_of(inner))
        self.seeding.append(inner.worker_init_fn.keywords["num_workers"])


pytestmark = pytest.mark.usefixtures("end_persistent_workers")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path / "cache"))
    yield


def trainer(root: Path, *callbacks: Any) -> Any:
    args = hf.TrainingArguments(
        output_dir=str(root / "out"),
        num_train_epochs=2,
        per_device_train_batch_size=BATCH,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return hf.Trainer(model=Tiny(), args=args, train_dataset=Pairs(), callbacks=list(callbacks))


def feedrate_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("feedrate:")]


def test_tune_trainer_sets_the_arguments_the_trainer_builds_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = Seen()
    t = trainer(tmp_path, seen)
    result = tune_trainer(t, **TUNE)
    best = result.best.config
    assert best.num_workers > 0  # the arguments said 0
    assert t.args.dataloader_num_workers == best.num_workers
    assert t.args.dataloader_prefetch_factor == best.prefetch_factor
    assert t.args.dataloader_persistent_workers == best.persistent_workers
    assert t.args.dataloader_pin_memory == best.pin_memory
    lines = feedrate_lines(capsys.readouterr().out)
    assert len(lines) == 1
    assert lines[0].startswith(
        f"feedrate: dataloader_num_workers={best.num_workers}, "
        f"dataloader_prefetch_factor={best.prefetch_factor}, "
        f"dataloader_persistent_workers={best.persistent_workers}, "
        f"dataloader_pin_memory={best.pin_memory} ("
    )
    t.train()
    assert t.state.epoch == pytest.approx(2.0) and t.state.global_step == 2 * N // BATCH
    assert seen.configs == [best, best]  # both epochs loaded with the tuned settings
    assert seen.seeding == [best.num_workers] * 2
    assert feedrate_lines(capsys.readouterr().out) == []  # said once, before training


def test_a_trainer_as_the_target_is_answered_in_its_arguments_words(tmp_path: Path) -> None:
    # `feedrate tune train.py:trainer`: the code line a Trainer user can use.
    from feedrate.loader.code import code_line
    from feedrate.loader.config import LoaderConfig
    from feedrate.loader.target import load_target

    from faults import write_target

    target = write_target(
        tmp_path,
        "from pathlib import Path\nfrom test_integrations_transformers import trainer\n"
        f"t = trainer(Path({str(tmp_path)!r}))\n",
    )
    loader = load_target(f"{target}:t")
    line = code_line(loader, LoaderConfig(4, prefetch_factor=2, persistent_workers=True))
    assert line == (
        "TrainingArguments(..., dataloader_num_workers=4, dataloader_pin_memory=False, "
        "dataloader_prefetch_factor=2, dataloader_persistent_workers=True)"
    )
    threaded = code_line(loader, LoaderConfig(2, prefetch_factor=2, threads=8))
    assert threaded.endswith(  # not a TrainingArguments argument: the Trainer's dataset
        "; Trainer(..., train_dataset=feedrate.threaded(train_dataset, 8))"
    )


def test_the_callback_tunes_this_run_s_loader_and_the_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen, callback = Seen(), FeedrateTrainerCallback(**TUNE)
    t = trainer(tmp_path, callback, seen)
    t.train()
    assert callback.result is not None and t.state.global_step == 2 * N // BATCH
    best = callback.result.best.config
    assert best.num_workers > 0
    assert seen.configs == [best, best]  # built before the callback ran, tuned inside
    assert seen.seeding == [best.num_workers] * 2  # seed_worker told the new worker count
    assert t.args.dataloader_num_workers == best.num_workers
    lines = feedrate_lines(capsys.readouterr().out)
    assert lines == [callback.message]
    assert lines[0].startswith(f"feedrate: dataloader_num_workers={best.num_workers}, ")
    t.train()  # the next train() builds its loader from the tuned arguments: no new search
    assert seen.configs[2:] == [best, best]
    assert feedrate_lines(capsys.readouterr().out) == []


def test_loaders_the_trainer_builds_after_tune_trainer_do_not_warn_of_many_workers(
    tmp_path: Path,
) -> None:
    """A count past the CPUs is feedrate's measured answer: the loaders the Trainer builds
    from the tuned arguments, built and iterated, do not print torch's rule of thumb (QA saw
    it twice); wrapped once however often it is called, bound to the trainer (a copy builds
    its own), and the Trainer's own method still warns."""
    t = trainer(tmp_path)
    many = LoaderConfig((os.cpu_count() or 1) + 2, prefetch_factor=2)
    t.args = apply_to_args(t.args, many)
    quiet_builds(t)
    quiet_builds(t)
    assert t.get_train_dataloader.__self__ is t and t.get_train_dataloader.__feedrate_quiet__

    def warned(build: Any) -> bool:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            next(iter(build()))
        return any("suggested max number of worker" in str(w.message) for w in caught)

    assert not warned(t.get_train_dataloader)
    assert warned(lambda: type(t).get_train_dataloader(t))  # without the wrapper, it warns


def test_feedrate_run_gives_the_trainer_s_loader_its_batch_size(tmp_path: Path) -> None:
    loader = trainer(tmp_path).get_train_dataloader()
    inner = loader_from(loader)
    assert inner is not None and inner.batch_size is None  # built from a batch_sampler
    assert Watch(loader, "train.py:9", None, 0.0).batch_size == BATCH
    assert Watch(inner, "train.py:9", None, 0.0).batch_size == BATCH
