"""What one rank brings to its node's loading (``RankFacts``), read off its loader and its
environment, for the node's doctor (``checks.ranks``) to judge summed over the node's ranks."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from feedrate.checks.transfer import pinned_in_flight
from feedrate.distributed.group import Ranks
from feedrate.loader import libraries
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, is_iterable_style
from feedrate.loader.shards import distributed_sampler
from feedrate.machine.facts import cpu_ids
from feedrate.results.ranks import RankFacts

#: torch's own samplers, which know nothing of ranks: every rank draws from the whole dataset.
RANKLESS_SAMPLERS = (SequentialSampler, RandomSampler)


def rank_facts(
    loader: DataLoader[Any],
    ranks: Ranks,
    *,
    batch_bytes: int | None = None,
    memory_bytes: int | None = None,
    config: LoaderConfig | None = None,
) -> RankFacts:
    """This rank's facts: ``loader``'s settings (an accelerate-prepared loader's own
    DataLoader), or ``config`` where those measured were other than its own (``feedrate
    measure -w 8``), whether it reads only its part of the data, its threads, and, from what
    was measured (``batch_bytes`` of one batch, ``memory_bytes`` of the main process and its
    workers), the pinned memory and /dev/shm its batches in flight take."""
    base = base_loader(loader)
    config = config or config_of(base)
    return RankFacts(
        rank=ranks.rank,
        node=ranks.node,
        local_rank=ranks.local_rank,
        num_workers=config.num_workers,
        prefetch_factor=config.prefetch_factor,
        pin_memory=config.pin_memory,
        threads=config.threads,
        torch_threads=torch.get_num_threads(),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        sharded=sharded(loader),
        dispatch_batches=dispatching(loader),
        batch_bytes=batch_bytes,
        memory_bytes=memory_bytes,
        pinned_bytes=pinned_in_flight(config, batch_bytes),
        shm_in_flight_bytes=None if batch_bytes is None else batch_bytes * config.queue_depth,
        sampler=_sampler_name(base),
        dataset_len=None if is_iterable_style(base) else _length(base.dataset),
        cpu_ids=cpu_ids(),
    )


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # a map-style dataset without a length, or one that fails to say
        return None


def _accelerate(obj: object, *names: str) -> bool:
    """``obj``'s class (or a base of it) is accelerate's ``names``; accelerate not imported."""
    return any(
        c.__name__ in names and c.__module__.split(".")[0] == "accelerate"
        for c in type(obj).__mro__
    )


def dispatching(loader: object) -> bool:
    """accelerate's ``DataLoaderDispatcher`` (``dispatch_batches``): the main process loads
    the batches of every rank and sends each its part."""
    return _accelerate(loader, "DataLoaderDispatcher")


def base_loader(loader: DataLoader[Any]) -> DataLoader[Any]:
    """The DataLoader an accelerate-prepared loader iterates, else ``loader``."""
    base = (
        getattr(loader, "base_dataloader", None)
        if _accelerate(loader, "DataLoaderAdapter")
        else None
    )
    return base if isinstance(base, DataLoader) else loader


def sharded(loader: DataLoader[Any]) -> bool | None:
    """Whether each rank reads only its part of the data (see ``RankFacts.sharded``)."""
    base = base_loader(loader)
    if distributed_sampler(base) is not None or dispatching(loader):
        return True
    if _accelerate(base.batch_sampler, "BatchSamplerShard") or _accelerate(
        base.dataset, "IterableDatasetShard"
    ):
        return True
    if libraries.splits_by_rank(base.dataset) is not None:
        return True
    if is_iterable_style(base):
        return None  # it may split by rank in __iter__ (get_rank()): not known from outside
    batches = base.batch_sampler
    samplers = [base.sampler, getattr(batches, "sampler", None)]
    if any(_knows_ranks(s) for s in [*samplers, batches]):
        return True
    if type(base.sampler) in RANKLESS_SAMPLERS and type(batches) in (BatchSampler, type(None)):
        return False
    return None


def _knows_ranks(sampler: object) -> bool:
    """A sampler of the user's that splits by rank names it the way DistributedSampler does."""
    return sampler is not None and all(hasattr(sampler, a) for a in ("rank", "num_replicas"))


def _sampler_name(loader: DataLoader[Any]) -> str | None:
    batches = loader.batch_sampler
    if batches is not None and type(batches) is not BatchSampler:
        return type(batches).__name__
    return None if is_iterable_style(loader) else type(loader.sampler).__name__
