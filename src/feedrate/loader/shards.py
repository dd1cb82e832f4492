"""Each rank on its own shard: the loader's ``DistributedSampler``, or one made for the
measurement (``feedrate tune --shard``) when the loader has none."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from feedrate.errors import UserError
from feedrate.loader.rebuild import config_of, is_iterable_style, rebuild


def distributed_sampler(loader: DataLoader[Any]) -> DistributedSampler[Any] | None:
    """The loader's ``DistributedSampler``, directly or under its batch sampler."""
    for s in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(s, DistributedSampler):
            return s
    return None


def sharded(loader: DataLoader[Any], rank: int, world: int) -> DataLoader[Any]:
    """``loader`` reading only rank ``rank``'s shard of ``world``: a ``DistributedSampler``
    in place of its sampler (shuffled where the loader shuffles), its batch size and settings
    kept. Refused, with the fix, where feedrate cannot split the data itself."""
    if distributed_sampler(loader) is not None:
        return loader
    if is_iterable_style(loader):
        raise UserError(
            f"cannot shard {type(loader.dataset).__name__} for the measurement: an "
            "IterableDataset splits its stream itself (e.g. webdataset's split_by_node, or "
            "by torch.distributed.get_rank() in __iter__); drop --shard once it does"
        )
    if loader.batch_size is None and loader.batch_sampler is not None:
        raise UserError(
            "cannot shard a loader built with its own batch_sampler for the measurement: give "
            "that batch sampler a DistributedSampler (or split by rank in it) and drop --shard"
        )
    shuffle = isinstance(loader.sampler, RandomSampler)
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle, drop_last=False
    )
    return rebuild(loader, config_of(loader), sampler=sampler)
