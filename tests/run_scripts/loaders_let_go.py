"""Loaders the script lets go of: a persistent one built per call, one left by a break. Their
workers end when the script drops them, under ``feedrate run`` as without it."""

import gc
import time

import psutil
import torch
from torch.utils.data import DataLoader, TensorDataset

DATA = TensorDataset(torch.arange(256.0))
sanity = DataLoader(DATA, batch_size=16, num_workers=2)


def one_epoch() -> None:
    loader = DataLoader(DATA, batch_size=16, num_workers=2, persistent_workers=True)
    for _ in loader:
        pass


def a_few_batches() -> None:
    for i, _ in enumerate(sanity):
        if i == 2:
            break


def live_children() -> int:
    gc.collect()
    deadline = time.monotonic() + 10  # workers are joined as their iterator goes
    while psutil.Process().children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(psutil.Process().children())


for _ in range(3):
    one_epoch()
    a_few_batches()
    print("live", live_children(), flush=True)
