"""transformers' Trainer with feedrate: a tiny model (built here, nothing downloaded) on a
pipeline that waits on storage.

``tune_trainer(trainer)`` tunes the DataLoader the Trainer builds and sets the answer in its
``TrainingArguments`` (``dataloader_num_workers``, ``dataloader_prefetch_factor``,
``dataloader_persistent_workers``, ``dataloader_pin_memory``); ``trainer.train()`` then builds
the tuned loader itself.

Try::

    python examples/hf_train.py                      # tune, then train 2 epochs on CPU
    feedrate tune examples/hf_train.py:trainer       # the Trainer's loader, on its own
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from feedrate.integrations.transformers import tune_trainer

LATENCY_MS = 5.0
SAMPLES = 256
BATCH_SIZE = 16


class Stored(Dataset[dict[str, torch.Tensor]]):
    """``n`` samples of 8 features and a label, each read after ``latency_ms``."""

    def __init__(self, n: int = SAMPLES, latency_ms: float = LATENCY_MS) -> None:
        self.n, self.latency_s = n, latency_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.latency_s)
        x = torch.full((8,), float(i % 7))
        return {"x": x, "labels": x.sum(0, keepdim=True)}


class Regression(torch.nn.Module):
    """What Trainer needs of a model: ``forward(**batch)`` returning the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}


def make_trainer(epochs: int = 2, samples: int = SAMPLES, output_dir: str | None = None) -> Trainer:
    args = TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="feedrate-hf-"),
        num_train_epochs=epochs,
        per_device_train_batch_size=BATCH_SIZE,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return Trainer(model=Regression(), args=args, train_dataset=Stored(samples))


def __getattr__(name: str) -> Any:
    # ``feedrate tune examples/hf_train.py:trainer`` builds it; importing the file does not.
    if name == "trainer":
        return make_trainer()
    raise AttributeError(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--budget-s", type=float, default=10.0)
    args = parser.parse_args()
    trainer = make_trainer(args.epochs, args.samples)
    tune_trainer(trainer, budget_s=args.budget_s)
    started = time.perf_counter()
    trainer.train()
    print(
        f"trained {trainer.state.epoch:.0f} epochs, {trainer.state.global_step} steps in "
        f"{time.perf_counter() - started:.1f} s with "
        f"dataloader_num_workers={trainer.args.dataloader_num_workers}"
    )


if __name__ == "__main__":
    main()
