"""A Lightning fit whose training loader feedrate's own callback tunes first (``FeedrateCallback``):
the trial loaders the callback's tune builds (inside Lightning's wrapper of every loader's
``__init__``) are feedrate's, not the user's; the loader it hands over is the one training
iterates, shown at the user's line. Under ``feedrate run --autotune`` this recursed without end:
each trial loader was taken for the user's and autotuned again."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning_fit import quiet_trainer  # this folder, the script's sys.path[0]
from torch.utils.data import DataLoader, Dataset

from feedrate.integrations.lightning import FeedrateCallback


class Waiting(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 128

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.full((4,), float(i))


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    trainer = quiet_trainer(callbacks=[FeedrateCallback(budget_s=5, max_workers=4)])
    trainer.fit(Model(), DataLoader(Waiting(), batch_size=8))  # the fit line
    print("fit done")
