"""Pipelines of different kinds for the benchmarks: each a zero-argument factory that returns a
DataLoader with untuned user settings (``num_workers=0``), and a known bottleneck.

The three examples are loaded through ``load_target``; the others are defined here, as
module-level classes so DataLoader workers can pickle them. Everything is deterministic (data
derived from the index with a fixed hash, no shuffling) and sized so an epoch has at least 64
batches and the datasets together hold well under 1 GB.

    python benchmarks/pipelines.py            # list them with the per-sample cost measured here
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    get_worker_info,
)

from feedrate.loader.target import load_target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_MASK64 = (1 << 64) - 1


def mix64(value: int) -> int:
    """splitmix64's finalizer: a well-mixed 64-bit hash, the same in every process."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def spin(cpu_s: float) -> None:
    """Use ``cpu_s`` seconds of this process's CPU time (pure-Python work, holds the GIL)."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


# --- large tensors: the cost is moving bytes ----------------------------------------------------


class LargeTensors(Dataset[torch.Tensor]):
    """``float32 [3, side, side]`` per sample (3 MiB at 512), filled with one value: cheap to make,
    expensive to collate, pass through shared memory and receive."""

    def __init__(self, n: int = 512, side: int = 512) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((3, self.side, self.side), float(index % 251) / 251.0)


# --- pure-Python tokenization: GIL-bound CPU work ----------------------------------------------

_WORD = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")


def make_words(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct made-up words of 2-9 letters, deterministic."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: dict[str, None] = {}
    while len(words) < count:
        words["".join(rng.choice(letters, size=int(rng.integers(2, 10))))] = None
    return list(words)


def make_corpus(docs: int, words_per_doc: int, vocab: list[str], seed: int = 1) -> list[str]:
    """``docs`` documents of Zipf-distributed words with capitals, digits and punctuation."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.2, size=(docs, words_per_doc)), len(vocab)) - 1
    marks = rng.choice(np.array([" ", " ", " ", ", ", ". ", "! ", " 42 "]), (docs, words_per_doc))
    out = []
    for row, sep in zip(ranks, marks, strict=True):
        text = "".join(vocab[r] + s for r, s in zip(row, sep, strict=True))
        out.append(text.capitalize())
    return out


class TokenizedText(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Documents tokenized per sample by a naive Python tokenizer: lower-case, regex split, then
    greedy longest-match word pieces against a vocabulary dict, ids padded to ``length``."""

    def __init__(self, docs: int = 8192, words_per_doc: int = 200, length: int = 256) -> None:
        words = make_words(4000)
        self.corpus = make_corpus(docs, words_per_doc, words)
        pieces = {w[:k] for w in words[:1500] for k in range(2, len(w) + 1)}
        pieces |= set("abcdefghijklmnopqrstuvwxyz0123456789.,!")
        self.vocab = {p: i + 2 for i, p in enumerate(sorted(pieces))}  # 0 pad, 1 unknown
        self.length = length

    def __len__(self) -> int:
        return len(self.corpus)

    def pieces(self, word: str) -> Iterator[int]:
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                token = self.vocab.get(word[start:end])
                if token is not None:
                    yield token
                    start = end
                    break
            else:
                yield 1
                start += 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [t for w in _WORD.findall(self.corpus[index].lower()) for t in self.pieces(w)]
        ids = ids[: self.length]
        mask = [1] * len(ids) + [0] * (self.length - len(ids))
        return torch.tensor(ids + [0] * (self.length - len(ids))), torch.tensor(mask)


# --- a sharded stream: IterableDataset split across workers -------------------------------------


class ShardedStream(IterableDataset[torch.Tensor]):
    """Records read from ``shards`` shards; each worker streams the shards ``worker_id``,
    ``worker_id + num_workers``, ... Each record waits ``read_s`` (a read) and costs ``cpu_s``
    of CPU (parsing); items are ``float32 [256]`` tensors."""

    def __init__(
        self, shards: int = 64, per_shard: int = 128, read_s: float = 0.001, cpu_s: float = 0.0005
    ) -> None:
        self.shards, self.per_shard = shards, per_shard
        self.read_s, self.cpu_s = read_s, cpu_s

    def __len__(self) -> int:  # a hint for users; DataLoader warns if it is wrong
        return self.shards * self.per_shard

    def my_shards(self) -> range:
        info = get_worker_info()
        if info is None:
            return range(self.shards)
        return range(info.id, self.shards, info.num_workers)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for shard in self.my_shards():
            for record in range(self.per_shard):
                time.sleep(self.read_s)
                spin(self.cpu_s)
                yield torch.full((256,), float(mix64(shard * self.per_shard + record) % 997))


# --- skewed cost: a few samples are much slower -------------------------------------------------


class SkewedCost(Dataset[torch.Tensor]):
    """Most samples cost ``base_s`` of CPU; one in ``slow_every`` (chosen by hash) costs
    ``slow_factor`` times that: uneven per-sample cost that a shallow queue does not absorb."""

    def __init__(
        self, n: int = 4096, base_s: float = 0.0003, slow_every: int = 20, slow_factor: int = 20
    ) -> None:
        self.n, self.base_s = n, base_s
        self.slow_every, self.slow_factor = slow_every, slow_factor

    def __len__(self) -> int:
        return self.n

    def is_slow(self, index: int) -> bool:
        return mix64(index) % self.slow_every == 0

    def __getitem__(self, index: int) -> torch.Tensor:
        spin(self.base_s * (self.slow_factor if self.is_slow(index) else 1))
        return torch.full((64,), float(index))


# --- copy-on-read: a big Python object indexed per sample ---------------------------------------


class RecordList(Dataset[tuple[torch.Tensor, int]]):
    """A list of ``n`` Python dicts (strings, ints, a list of tags) indexed per sample. Reading a
    record touches its reference counts, so each forked worker copies the pages it reads: worker
    memory grows with the data seen (the classic copy-on-read leak)."""

    def __init__(self, n: int = 60_000) -> None:
        words = make_words(500, seed=2)
        self.records = [
            {
                "id": i,
                "text": " ".join(words[(mix64(i) >> k) % 500] for k in range(0, 48, 6)),
                "label": i % 7,
                "tags": [words[mix64(i + k) % 500] for k in range(3)],
            }
            for i in range(n)
        ]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        record = self.records[index]
        raw = record["text"].encode()[:64].ljust(64)
        features = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float() / 255.0
        return features, int(record["label"]) + len(record["tags"])


# --- a fixed cost per sample, for the ranks of a job ---------------------------------------------


class CostPerSample(Dataset[torch.Tensor]):
    """Each sample waits ``wait_s`` (a GET from remote storage) and then uses ``cpu_s`` of CPU
    (decoding); items are ``float32 [256]`` tensors derived from the index."""

    def __init__(self, n: int, cpu_s: float = 0.0, wait_s: float = 0.0) -> None:
        self.n, self.cpu_s, self.wait_s = n, cpu_s, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.wait_s:
            time.sleep(self.wait_s)
        spin(self.cpu_s)
        return torch.full((256,), float(mix64(index) % 997))


def rank_shard(dataset: Dataset[Any]) -> DistributedSampler[Any] | None:
    """This rank's shard of ``dataset`` when ``torch.distributed`` is initialized (in order, as
    the other pipelines read), else None: the whole dataset, as a single process reads it."""
    if dist.is_available() and dist.is_initialized():
        return DistributedSampler(dataset, shuffle=False)
    return None


# --- the registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pipeline:
    """A named factory with its kind (what bounds it) and a one-line description."""

    name: str
    kind: str
    description: str
    factory: Callable[[], DataLoader[Any]]


def images() -> DataLoader[Any]:
    return load_target(f"{EXAMPLES / 'images.py'}:loader")


def remote() -> DataLoader[Any]:
    return load_target(f"{EXAMPLES / 'remote.py'}:loader")


def tabular() -> DataLoader[Any]:
    return load_target(f"{EXAMPLES / 'tabular.py'}:loader")


def large() -> DataLoader[Any]:
    return DataLoader(LargeTensors(), batch_size=4)


def tokenize() -> DataLoader[Any]:
    return DataLoader(TokenizedText(), batch_size=32)


def sharded() -> DataLoader[Any]:
    return DataLoader(ShardedStream(), batch_size=32)


def skewed() -> DataLoader[Any]:
    return DataLoader(SkewedCost(), batch_size=16)


def records() -> DataLoader[Any]:
    return DataLoader(RecordList(), batch_size=32)


def ranks_cpu() -> DataLoader[Any]:
    """1 ms of CPU per sample, batch 32, this rank's shard under torch.distributed."""
    dataset = CostPerSample(16384, cpu_s=0.001)
    return DataLoader(dataset, batch_size=32, sampler=rank_shard(dataset))


def ranks_latency() -> DataLoader[Any]:
    """5 ms of waiting and 0.05 ms of CPU per sample, batch 32, this rank's shard under
    torch.distributed."""
    dataset = CostPerSample(65536, cpu_s=0.00005, wait_s=0.005)
    return DataLoader(dataset, batch_size=32, sampler=rank_shard(dataset))


PIPELINES = (
    Pipeline("images", "CPU-bound", "examples/images.py: JPEG decode + augment", images),
    Pipeline("remote", "latency-bound", "examples/remote.py: ~10 ms sleep per object", remote),
    Pipeline("tabular", "tiny samples", "examples/tabular.py: 16-float rows, batch 256", tabular),
    Pipeline("large", "IPC/shm-bound", "3x512x512 float32 per sample, batch 4 (12 MiB)", large),
    Pipeline("tokenize", "GIL-bound CPU", "naive Python word-piece tokenizer, batch 32", tokenize),
    Pipeline(
        "sharded",
        "I/O + CPU stream",
        "IterableDataset, shards split per worker, 1 ms read",
        sharded,
    ),
    Pipeline("skewed", "skewed CPU", "0.3 ms CPU per sample, 5% of samples 20x slower", skewed),
    Pipeline("records", "copy-on-read", "60k Python dicts indexed per sample, batch 32", records),
)
#: For the ranks of a job (benchmarks/ranks.py): map-style, each rank on its shard.
RANK_PIPELINES = (
    Pipeline("ranks-cpu", "CPU-bound", "1 ms CPU per sample, batch 32, sharded", ranks_cpu),
    Pipeline(
        "ranks-latency",
        "latency-bound",
        "5 ms wait + 0.05 ms CPU per sample, batch 32, sharded",
        ranks_latency,
    ),
)
BY_NAME = {p.name: p for p in PIPELINES}


def item_cost(loader: DataLoader[Any], items: int = 256) -> float:
    """Mean seconds per sample in this process, without workers or collation: the dataset's own
    cost (for an IterableDataset, the first ``items`` it yields)."""
    dataset = loader.dataset
    began = time.perf_counter()
    if isinstance(dataset, IterableDataset):
        it = iter(dataset)
        count = sum(1 for _, _ in zip(range(items), it, strict=False))
    else:
        count = min(items, len(dataset))  # type: ignore[arg-type]
        for i in range(count):
            dataset[i]
    return (time.perf_counter() - began) / max(count, 1)


def epoch_batches(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


if __name__ == "__main__":
    for p in PIPELINES + RANK_PIPELINES:
        built = time.perf_counter()
        loader = p.factory()
        built = time.perf_counter() - built
        cost = item_cost(loader)
        print(
            f"{p.name:<9} {p.kind:<17} {cost * 1e3:8.3f} ms/sample  "
            f"{epoch_batches(loader)} batches/epoch  built in {built:.2f} s  {p.description}"
        )
