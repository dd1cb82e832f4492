"""Lightning training with feedrate's callback: a tiny model on a pipeline that waits on storage.

Each sample waits ``LATENCY_MS`` (5 ms, as a read from network storage would) and uses almost no
CPU, so workers pay on any machine. The datamodule builds its loader with Lightning's defaults
(no workers); ``FeedrateCallback`` tunes it before the first epoch and Lightning trains on the
answer. The second run of the same pipeline answers from feedrate's cache.

Try::

    python examples/lightning_train.py                     # tune, then train 2 epochs
    python examples/lightning_train.py --online            # autotune while training
    python examples/lightning_train.py --devices 2         # DDP on CPU (gloo): rank 0 tunes
    feedrate tune examples/lightning_train.py:dm           # the datamodule's loader, on its own

Each epoch prints the settings of the loader the fit loop iterates, on every rank.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

import feedrate
from feedrate.integrations.lightning import FeedrateCallback

LATENCY_MS = 5.0
SAMPLES = 256
BATCH_SIZE = 16


class Stored(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` samples of 8 features and a target, each read after ``latency_ms``."""

    def __init__(self, n: int = SAMPLES, latency_ms: float = LATENCY_MS) -> None:
        self.n, self.latency_s = n, latency_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.latency_s)
        x = torch.full((8,), float(i % 7))
        return x, x.sum(0, keepdim=True)


class Data(pl.LightningDataModule):
    def __init__(self, samples: int = SAMPLES) -> None:
        super().__init__()
        self.samples = samples

    def setup(self, stage: str) -> None:
        self.dataset = Stored(self.samples)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.dataset, batch_size=BATCH_SIZE, shuffle=True)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.001)


class ShowLoader(pl.Callback):
    """Prints, at each epoch's start, what the fit loop iterates."""

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        loader = trainer.train_dataloader
        what = (
            f"autotune, {loader.config.label()} now"
            if isinstance(loader, feedrate.AutoLoader)
            else feedrate.config_of(loader).label()
        )
        print(
            f"rank {trainer.global_rank} epoch {trainer.current_epoch}: {what}, "
            f"{len(loader)} batches",
            flush=True,
        )


dm = Data()  # feedrate tune examples/lightning_train.py:dm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--budget-s", type=float, default=10.0)
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--online", action="store_true", help="autotune while training")
    args = parser.parse_args()
    given = {} if args.max_workers is None else {"max_workers": args.max_workers}
    callback = FeedrateCallback(budget_s=args.budget_s, online=args.online, **given)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, ShowLoader()],
    )
    trainer.fit(Regression(), datamodule=Data(args.samples))
    print(f"rank {trainer.global_rank} trained {trainer.current_epoch} epochs", flush=True)


if __name__ == "__main__":
    main()
