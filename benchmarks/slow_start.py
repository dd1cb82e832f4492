"""Does tune's budget hold when workers start slowly? ``tune(budget_s=10)`` on a pipeline whose
``worker_init_fn`` sleeps 1.5 s (as opening a storage client in every worker does) and whose
workers are not persistent, so every epoch restarts them. Prints the wall seconds and the pick.

    python benchmarks/slow_start.py                 # this tree
    PYTHONPATH=OTHER/src python benchmarks/slow_start.py   # another checkout, e.g. an older commit
    feedrate measure benchmarks/slow_start.py:make_loader --seconds 1   # measure's own bound

Measured (2-core development machine, 2026-12-01): tune 165.9 s at c32404a (before issue 16),
10.8 s at db49140; measure --seconds 1 took 78.6 s at c32404a (49 epochs) and 3.2 s at 66f4919
(one epoch: its steady state lasts milliseconds, and the note says how little was measured).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import feedrate


class Squares(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i * i)])


def open_storage_client(worker_id: int) -> None:
    time.sleep(1.5)


def make_loader() -> DataLoader[Any]:
    """The pipeline, as a TARGET too: ``feedrate measure benchmarks/slow_start.py:make_loader``."""
    return DataLoader(Squares(), batch_size=16, num_workers=2, worker_init_fn=open_storage_client)


def main(argv: list[str]) -> None:
    budget_s = float(argv[0]) if argv else 10.0
    loader = make_loader()
    began = time.monotonic()
    result = feedrate.tune(loader, budget_s=budget_s, use_cache=False)
    seconds, pick = time.monotonic() - began, result.best.config.label()
    print(f"tune(budget_s={budget_s:g}): {seconds:.1f} s, picked {pick}")


if __name__ == "__main__":
    main(sys.argv[1:])
