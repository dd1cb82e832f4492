"""The random state a measurement's run draws on, kept as it was for the user's loader: a run
made in this process (the batch ``shm`` makes before anything risky, the probes of
``workers``) draws the shuffle order, the workers' base seed and the augmentations from the
user's generators and the global ones, and ``autotune`` promises the same batches in the same
order as without it.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Generator
from typing import Any

import torch
from torch.utils.data import DataLoader

#: Where a loader's index stream may hold the sampler that shuffles: a batch sampler wraps a
#: sampler (``BatchSampler.sampler``) or another batch sampler (accelerate's
#: ``BatchSamplerShard.batch_sampler``), a dataset another dataset (``IterableDatasetShard``).
_INNER = ("sampler", "batch_sampler", "dataset")


def generators(loader: DataLoader[Any], depth: int = 4) -> list[torch.Generator]:
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
def kept(loader: DataLoader[Any]) -> Generator[None, None, None]:
    """The random state a batch draws on, as it was: the generators of the loader and of the
    samplers and datasets in it (``generators``: the shuffle order and the workers' seeds),
    torch's, Python's and numpy's global ones (samplers without a generator, and
    augmentations, draw on them)."""
    kept = [(g, g.get_state()) for g in generators(loader)]
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
