"""A training loop for ``feedrate run``'s tests: a loader of sleeping samples, a sleeping step,
an evaluation loader under ``torch.no_grad()``. Arguments:

    train.py [--data-s S] [--step-s S] [--batches N] [--epochs E] [--workers W] [--eval N]
             [--exit CODE] [--crash] [--signal N] [--hang] [--print-batches] [--shuffle]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset[torch.Tensor]):
    """Item i is ``tensor([i])``, made in ``sleep_s`` seconds of sleep per batch of 4."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s / 4)
        return torch.tensor([float(i)])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data-s", type=float, default=0.0)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--eval", type=int, default=0)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--crash", action="store_true")
    p.add_argument("--signal", type=int, default=0, help="end by this signal, workers alive")
    p.add_argument("--hang", action="store_true")
    p.add_argument("--print-batches", action="store_true")
    p.add_argument("--shuffle", action="store_true")
    args = p.parse_args()
    print(f"argv={sys.argv!r} name={__name__}")
    loader = DataLoader(
        Sleepy(4 * args.batches, args.data_s),
        batch_size=4,
        num_workers=args.workers,
        shuffle=args.shuffle,
        generator=torch.Generator().manual_seed(0),
    )
    val = DataLoader(Sleepy(4 * args.eval, 0.0), batch_size=4) if args.eval else None
    for _epoch in range(args.epochs):
        for batch in loader:
            if args.print_batches:
                print("batch", batch.flatten().tolist())
            time.sleep(args.step_s)
            if args.hang:
                print("hanging", flush=True)
                time.sleep(600)
        if val is not None:
            with torch.no_grad():
                for _batch in val:
                    pass
    if args.crash:
        raise RuntimeError("the script's own failure")
    if args.signal:
        it = iter(loader)  # its workers started, alive when the signal ends the script
        next(it)
        os.kill(os.getpid(), args.signal)
    print("done", file=sys.stderr)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
