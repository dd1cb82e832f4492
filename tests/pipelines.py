"""Test doubles: datasets with a known cost or a known fault, so each behaviour of feedrate has a
pipeline that provokes it. Module-level classes, so DataLoader workers can pickle them."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
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
    """Blocks (interruptibly) for an hour at index ``at``, in short sleeps: a timeout raised in
    its thread from another one lands between two of them."""

    def __init__(self, n: int = 256, at: int = 40) -> None:
        super().__init__(n)
        self.at = at

    def __getitem__(self, index: int) -> torch.Tensor:
        deadline = time.monotonic() + 3600
        while index >= self.at and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().__getitem__(index)


class ShardedStream(IterableDataset[torch.Tensor]):
    """An IterableDataset that splits ``range(n)`` between workers; each item waits
    ``sleep_s`` (a read) and spins ``cpu_s`` of CPU."""

    def __init__(self, n: int = 512, sleep_s: float = 0.0, cpu_s: float = 0.0) -> None:
        self.n, self.sleep_s, self.cpu_s = n, sleep_s, cpu_s

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if self.sleep_s:
                time.sleep(self.sleep_s)
            end = time.process_time() + self.cpu_s
            while time.process_time() < end:
                pass
            yield torch.full((4,), float(i))


class EmptyDataset(TinyDataset):
    def __len__(self) -> int:
        return 0


# Doubles for the doctor: each provokes one trap (or is its fixed twin, which must not).


class ObjectListDataset(TinyDataset):
    """Copy-on-read: the records are a Python list of ``n`` tuples (a str and an int each), so
    forked workers copy the pages of every record they read."""

    def __init__(self, n: int = 200_000) -> None:
        super().__init__(n)
        self.records = [(f"images/{i:07d}.jpg", i * 7919) for i in range(n)]

    def __getitem__(self, index: int) -> torch.Tensor:
        path, label = self.records[index]
        return torch.tensor([float(label), float(len(path))])


class ArrayRecordsDataset(TinyDataset):
    """ObjectListDataset's fixed twin: the same records in two numpy arrays."""

    def __init__(self, n: int = 200_000) -> None:
        super().__init__(n)
        self.paths = np.array([f"images/{i:07d}.jpg" for i in range(n)])
        self.labels = np.arange(n, dtype=np.int64) * 7919

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(self.labels[index]), float(len(self.paths[index]))])


class UnshardedStream(IterableDataset[torch.Tensor]):
    """Every worker yields all of ``range(n)``: the classic duplicate-samples bug."""

    def __init__(self, n: int = 512) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(self.n):
            yield torch.full((4,), float(i))


class ConstantStream(IterableDataset[torch.Tensor]):
    """Sharded, but every item is the same: repeated values are not a repeated stream."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for _ in range(start, 256, step):
            yield torch.zeros(4)


def make_generator(kind: str, seed: int = 0) -> object:
    if kind == "numpy":
        return np.random.default_rng(seed)
    if kind == "randomstate":
        return np.random.RandomState(seed)
    if kind == "random":
        return random.Random(seed)
    return torch.Generator().manual_seed(seed)


class SharedRngDataset(TinyDataset):
    """Holds its own generator, created (and seeded) before the workers start: every worker
    draws the same "random" augmentation. ``nested`` puts it in a transform object's list."""

    def __init__(self, n: int = 256, kind: str = "numpy", nested: bool = False) -> None:
        super().__init__(n)
        self.kind = kind
        if nested:
            self.transform = Augment(make_generator(kind))
        else:
            self.rng = make_generator(kind)


class Augment:
    def __init__(self, rng: object) -> None:
        self.steps = [{"rng": rng}]


def reseed_worker(worker_id: int) -> None:
    """A worker_init_fn that gives the dataset's generator a per-worker seed (the fix)."""
    info = get_worker_info()
    assert info is not None
    info.dataset.rng = make_generator(info.dataset.kind, torch.initial_seed() % 2**32)


def four_threads(worker_id: int) -> None:
    """A worker_init_fn that undoes DataLoader's one thread per worker."""
    torch.set_num_threads(4)


def slow_init(worker_id: int) -> None:
    """A slow worker_init_fn (opening connections, loading an index): 0.3 s."""
    time.sleep(0.3)


class LargeSampleDataset(TinyDataset):
    """Cheap samples of ``nbytes`` each: batches are large in bytes, not in work."""

    def __init__(self, n: int = 4096, nbytes: int = 2**20) -> None:
        super().__init__(n, width=nbytes // 4)


class RandomStream(IterableDataset[torch.Tensor]):
    """Synthetic samples from the dataset's own generator, not split by worker: every worker
    draws, and yields, the same "random" stream."""

    def __init__(self, n: int = 256) -> None:
        self.n = n
        self.rng = np.random.default_rng(0)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for _ in range(self.n):
            yield torch.from_numpy(self.rng.standard_normal(4))


class WhereDataset(TinyDataset):
    """Each sample says where it was fetched: (index, process id, thread name)."""

    def __getitem__(self, index: int) -> tuple[int, int, str]:  # type: ignore[override]
        import threading

        time.sleep(0.001)
        return index, os.getpid(), threading.current_thread().name


class BatchedReadDataset(TinyDataset):
    """Defines its own ``__getitems__`` (one batched read) and counts its calls in a file-free
    way: the chunks it was asked for are returned alongside the samples."""

    def __getitems__(self, indices: list[int]) -> list[tuple[int, int]]:
        first = indices[0]
        return [(i, first) for i in indices]


class OpenFileDataset(TinyDataset):
    """Holds an open file that every sample seeks and reads: unsafe on threads."""

    def __init__(self, path: str, n: int = 64) -> None:
        super().__init__(n)
        self.handle = open(path, "rb")  # noqa: SIM115 - held on purpose

    def __getitem__(self, index: int) -> torch.Tensor:
        self.handle.seek(index)
        return torch.tensor(list(self.handle.read(1)))


class RacyDataset(TinyDataset):
    """Keeps per-call state on the dataset object: correct one at a time, wrong on threads."""

    def __init__(self, n: int = 64) -> None:
        super().__init__(n)
        self.current = 0

    def __getitem__(self, index: int) -> torch.Tensor:
        self.current = index
        time.sleep(0.002)
        return torch.full((2,), float(self.current))


class NoisyDataset(TinyDataset):
    """Random augmentation from the global generator: never the same sample twice."""

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(4)


class PairBatchSampler:
    """A custom batch sampler: pairs of indices, odd ones first, then a short last batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        order = list(range(1, self.n, 2)) + list(range(0, self.n, 2))
        for i in range(0, len(order), 2):
            yield order[i : i + 2]

    def __len__(self) -> int:
        return (self.n + 1) // 2
