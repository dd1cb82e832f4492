"""A two-rank CPU training loop for ``feedrate run -- torchrun --nproc_per_node=2``: gloo, a
DistributedSampler, each rank its own shard of 32 batches of 4."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    dist.init_process_group("gloo")
    data = TensorDataset(torch.arange(256, dtype=torch.float32))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
    for (batch,) in loader:
        time.sleep(0.005)
        dist.all_reduce(batch.sum())
    print(f"rank {os.environ['RANK']} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
