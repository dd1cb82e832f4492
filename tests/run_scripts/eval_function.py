"""A loop with an evaluation function that leaves autograd on while it iterates (transformers'
Trainer turns it off only around each step): its loader is an evaluation loader all the same,
and ``--autotune`` leaves it as it is."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

train = DataLoader(torch.arange(64.0), batch_size=4)
val = DataLoader(torch.arange(16.0), batch_size=4)


def evaluate(loader: DataLoader[torch.Tensor]) -> float:
    total = 0.0
    for batch in loader:
        with torch.no_grad():  # per step, as transformers' prediction_step
            total += float(batch.sum())
    return total


if __name__ == "__main__":
    for _epoch in range(2):
        for _batch in train:
            pass
        evaluate(val)
    print("done")
