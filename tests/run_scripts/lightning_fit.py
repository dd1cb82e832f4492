"""A Lightning fit with a training and a validation loader, neither touched by feedrate's
code: ``feedrate run`` must tell them apart (Lightning validates under inference mode) and
count what each delivered. Lightning inspects and rebuilds loaders, so this is a check that
the observed DataLoader still looks like one."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        time.sleep(0.01)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, index: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def quiet_trainer(**kwargs: Any) -> pl.Trainer:
    """A Trainer of 2 epochs on the CPU that prints, logs and saves nothing (``kwargs`` added)."""
    return pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        **kwargs,
    )


data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
train = DataLoader(data, batch_size=8, shuffle=True)
val = DataLoader(data, batch_size=32)

if __name__ == "__main__":
    trainer = quiet_trainer()
    trainer.fit(Model(), train, val)
    print("fit done")
