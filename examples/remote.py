"""A pipeline that reads every sample from remote object storage (S3, GCS, HTTP shards).

This imitates datasets whose ``__getitem__`` issues one network request per sample (an S3 ``GET``
per object, a WebDataset/HTTP range read, a feature store lookup) and then decodes a small payload.
Each request waits about ``MEAN_LATENCY_MS`` (10 ms, ±20 %, and 1 in 100 requests waits
``TAIL_FACTOR`` times longer) while using almost no CPU, so the bottleneck is latency, not compute:
workers sit idle waiting, throughput grows with the number of requests in flight, and the best
``num_workers`` lies well past the core count (or threads per worker hide the wait without a
process each). The latency is simulated with ``time.sleep`` and deterministic per index; nothing
touches the network. ``FEEDRATE_EXAMPLE_LATENCY_MS`` overrides the mean latency (e.g. ``1`` for
quick tests); jitter and tail scale with it.

Try::

    feedrate measure examples/remote.py:loader -w 8
    feedrate tune examples/remote.py:loader
    python examples/remote.py                 # print a few batch shapes
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

NUM_OBJECTS = 2048
MEAN_LATENCY_MS = 10.0
"""Mean wait per request, in milliseconds, unless ``FEEDRATE_EXAMPLE_LATENCY_MS`` is set."""
JITTER_FRACTION = 0.2
"""Each request waits the mean times a factor uniform in ``[1 - JITTER_FRACTION, 1 + ...]``."""
TAIL_EVERY = 100
"""About one request in ``TAIL_EVERY`` is a slow one (a retry, a cold object)."""
TAIL_FACTOR = 5.0
"""A slow request waits this many times the mean."""
PAYLOAD_VALUES = 1024
"""16-bit samples per object; items are float32 tensors of this length."""
NUM_CLASSES = 10

_MASK64 = (1 << 64) - 1


def mean_latency_ms_from_env() -> float:
    """``FEEDRATE_EXAMPLE_LATENCY_MS`` if set, else ``MEAN_LATENCY_MS``."""
    value = os.environ.get("FEEDRATE_EXAMPLE_LATENCY_MS")
    return float(value) if value else MEAN_LATENCY_MS


def mix64(value: int) -> int:
    """A well-mixed 64-bit hash of ``value`` (splitmix64's finalizer), stable across processes."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def latency_s(index: int, mean_ms: float = MEAN_LATENCY_MS) -> float:
    """How long the request for object ``index`` waits, in seconds; the same on every call."""
    h = mix64(index)
    if h % TAIL_EVERY == 0:
        return mean_ms * TAIL_FACTOR / 1000.0
    unit = (h >> 11) / float(1 << 53)  # Uniform in [0, 1), independent of the tail draw.
    return mean_ms * (1.0 + JITTER_FRACTION * (2.0 * unit - 1.0)) / 1000.0


def object_bytes(index: int) -> bytes:
    """The stored payload of object ``index``: little-endian int16 samples, deterministic."""
    return (
        np.random.default_rng(index)
        .integers(-(2**15), 2**15, PAYLOAD_VALUES, dtype="<i2")
        .tobytes()
    )


class RemoteShards(Dataset[tuple[torch.Tensor, int]]):
    """Objects fetched one request each; items are ``(float32 [PAYLOAD_VALUES] tensor, label)``.

    ``mean_latency_ms`` defaults to ``FEEDRATE_EXAMPLE_LATENCY_MS`` or ``MEAN_LATENCY_MS``; it is
    fixed at construction so every worker, forked or spawned, waits the same.
    """

    def __init__(
        self, num_objects: int = NUM_OBJECTS, mean_latency_ms: float | None = None
    ) -> None:
        self.num_objects = num_objects
        self.mean_latency_ms = (
            mean_latency_ms_from_env() if mean_latency_ms is None else mean_latency_ms
        )

    def __len__(self) -> int:
        return self.num_objects

    def fetch(self, index: int) -> bytes:
        """Simulate the request: wait on the "network" (no CPU used), then return the bytes."""
        time.sleep(latency_s(index, self.mean_latency_ms))
        return object_bytes(index)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.num_objects:
            raise IndexError(f"object {index} out of range for {self.num_objects} objects")
        samples = np.frombuffer(self.fetch(index), dtype="<i2").astype(np.float32) / 32768.0
        return torch.from_numpy(samples), (mix64(index) >> 32) % NUM_CLASSES


loader = DataLoader(RemoteShards(), batch_size=16)


if __name__ == "__main__":
    for step, (values, labels) in enumerate(loader):
        print(f"batch {step}: values {tuple(values.shape)} {values.dtype}", end=", ")
        print(f"labels {tuple(labels.shape)} {labels.dtype}")
        if step == 2:
            break
