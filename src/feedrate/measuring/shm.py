"""One batch made in the main process (no workers), before anything risky runs: its bytes and
tensors are what the /dev/shm and open-file predictions need (``checks.machine.shm_finding``),
and making it starts no worker, so nothing goes through /dev/shm. Its share of time on a CPU
tells a pipeline that mostly waits (on storage, a network) from one that computes.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.loader.batches import batch_nbytes, count_tensors
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, is_iterable_style, rebuild
from feedrate.measuring.diagnosis import explain
from feedrate.measuring.failures import IndexReportingDataset, Watchdog
from feedrate.measuring.runqueue import Marks, busy

#: A first batch made faster than this (s) says too little of where its time goes to be read
#: (first calls, page faults); a loader that fast needs few workers whatever it waits on.
MIN_TIMED_S = 0.02


@dataclass(frozen=True)
class MainBatch:
    """The first batch of the loader's own batching, made without workers: its ``bytes`` (the
    tensors' storage) and ``tensors``; ``batch`` kept only when asked for. ``cpu_share``: the
    share of the time making it took (its wait for a CPU on a busy machine left out) that this
    thread spent on one; None when it took less than ``MIN_TIMED_S``."""

    bytes: int | None
    tensors: int | None
    batch: Any = None
    cpu_share: float | None = None


def main_process_batch(
    loader: DataLoader[Any], *, timeout_s: float = 30.0, keep_batch: bool = False
) -> MainBatch:
    """Make ``loader``'s first batch in this process (``num_workers=0``, its other settings).
    Raises ``PipelineError`` when the dataset or collate_fn fails, ``PipelineTimeoutError``
    when no batch comes within ``timeout_s``. An empty loader gives ``MainBatch(None, None)``."""
    if _one_shot(loader):
        return MainBatch(None, None)
    config = LoaderConfig(0, False, None, False, config_of(loader).in_order)
    dataset = None if is_iterable_style(loader) else IndexReportingDataset(loader.dataset)
    run = rebuild(loader, config, dataset=dataset)
    it: Any = None
    with (
        _random_state_kept(loader),
        Watchdog(timeout_s, lambda: "one batch made in the main process"),
    ):
        try:
            it = iter(run)
            mark = Marks(time.perf_counter)
            asked = mark()
            batch = next(it, None)
            got = mark()
        except Exception as exc:
            error = explain(exc, it)
            if error is None:
                raise
            raise error from exc
    if batch is None:
        return MainBatch(None, None)
    wall = got[0] - asked[0] - (got[1] - asked[1])  # on the CPUs it got: not queued
    share = min(1.0, busy(asked, got) / wall) if wall >= MIN_TIMED_S else None
    kept = batch if keep_batch else None
    return MainBatch(batch_nbytes(batch), count_tensors(batch), kept, share)


def _one_shot(loader: DataLoader[Any]) -> bool:
    """The loader's index stream (or IterableDataset) is an iterator, used up once iterated:
    taking a batch from it would take that batch from the user's own run."""
    sources: list[object] = [loader.batch_sampler, loader.sampler]
    if is_iterable_style(loader):
        sources.append(loader.dataset)
    return any(s is not None and isinstance(s, Iterator) for s in sources)


#: Where a loader's index stream may hold the sampler that shuffles: a batch sampler wraps a
#: sampler (``BatchSampler.sampler``) or another batch sampler (accelerate's
#: ``BatchSamplerShard.batch_sampler``), a dataset another dataset (``IterableDatasetShard``).
_INNER = ("sampler", "batch_sampler", "dataset")


def _generators(loader: DataLoader[Any], depth: int = 4) -> list[torch.Generator]:
    """The ``torch.Generator`` objects a batch of ``loader`` may draw on: the loader's own and
    those of its sampler, batch sampler and dataset, and of the samplers and datasets these
    wrap, ``depth`` levels down. A shuffling sampler inside a batch sampler (accelerate's
    ``BatchSamplerShard`` on several processes, whose ``RandomSampler`` has a generator of its
    own) draws the epoch's order from its generator as the batch is made."""
    found: dict[int, torch.Generator] = {}
    seen: set[int] = set()
    level: list[object] = [loader]
    for _ in range(depth + 1):
        inner: list[object] = []
        for obj in level:
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            g = _attribute(obj, "generator")
            if isinstance(g, torch.Generator):
                found.setdefault(id(g), g)
            inner.extend(_attribute(obj, name) for name in _INNER)
        level = inner
    return list(found.values())


def _attribute(obj: object, name: str) -> Any:
    """``obj.name``, or None where it has none or reading it fails (a dataset's own
    ``__getattr__``): a generator missed here is the user's no less, never an error."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


@contextlib.contextmanager
def _random_state_kept(loader: DataLoader[Any]) -> Generator[None, None, None]:
    """The random state a batch draws on, as it was: the generators of the loader and of the
    samplers and datasets in it (``_generators``: the shuffle order and the workers' seeds),
    torch's, Python's and numpy's global ones (samplers without a generator, and
    augmentations, draw on them)."""
    kept = [(g, g.get_state()) for g in _generators(loader)]
    py = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            for g, state in kept:
                g.set_state(state)
            random.setstate(py)
            if np is not None:
                np.random.set_state(np_state)
