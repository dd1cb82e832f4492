"""Test doubles: datasets with a known cost or a known fault, so each behaviour of feedrate has a
pipeline that provokes it. Module-level classes, so DataLoader workers can pickle them."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class TinyDataset(Dataset[torch.Tensor]):
    """Microseconds per sample: the main process does most of the work."""

    def __init__(self, n: int = 1024, width: int = 8) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.width,), float(index))


class SleepDataset(TinyDataset):
    """Latency-bound: every sample waits ``sleep_s`` without using the CPU."""

    def __init__(self, n: int = 1024, sleep_s: float = 0.002) -> None:
        super().__init__(n)
        self.sleep_s = sleep_s

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return super().__getitem__(index)


class BusyDataset(TinyDataset):
    """CPU-bound: every sample spins for ``cpu_s`` of CPU time."""

    def __init__(self, n: int = 1024, cpu_s: float = 0.001) -> None:
        super().__init__(n)
        self.cpu_s = cpu_s

    def __getitem__(self, index: int) -> torch.Tensor:
        end = time.process_time() + self.cpu_s
        while time.process_time() < end:
            pass
        return super().__getitem__(index)


class FailingDataset(TinyDataset):
    """Raises ``ValueError`` on one index."""

    def __init__(self, n: int = 256, bad_index: int = 37) -> None:
        super().__init__(n)
        self.bad_index = bad_index

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad_index:
            raise ValueError(f"corrupt record {index}")
        return super().__getitem__(index)


class KillingDataset(TinyDataset):
    """Inside a worker, sends itself ``signum`` when it reaches index ``at`` (a stand-in for the
    out-of-memory killer or a bus error). Harmless in the main process."""

    def __init__(self, n: int = 256, at: int = 40, signum: int = signal.SIGKILL) -> None:
        super().__init__(n)
        self.at, self.signum = at, signum

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.at and get_worker_info() is not None:
            os.kill(os.getpid(), self.signum)
            time.sleep(5)
        return super().__getitem__(index)


class HangingDataset(TinyDataset):
    """Blocks (interruptibly) for an hour at index ``at``."""

    def __init__(self, n: int = 256, at: int = 40) -> None:
        super().__init__(n)
        self.at = at

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= self.at:
            time.sleep(3600)
        return super().__getitem__(index)


class ShardedStream(IterableDataset[torch.Tensor]):
    """An IterableDataset that splits ``range(n)`` between workers."""

    def __init__(self, n: int = 512) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.full((4,), float(i))


class EmptyDataset(TinyDataset):
    def __len__(self) -> int:
        return 0
