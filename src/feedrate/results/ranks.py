"""``RankFacts``: what one rank of a distributed job brings to its node's loading, gathered
from every rank so that the node's doctor can judge the sums (``checks.ranks``). Plain data
that round-trips through JSON; sizes in bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class RankFacts:
    """One rank's loader settings and environment. ``threads``: threads each worker fetches on
    (``feedrate.threaded``; 1 otherwise). ``torch_threads``: the rank's intra-op threads
    (``torch.get_num_threads()``); ``omp_num_threads``: its ``OMP_NUM_THREADS``, None when
    unset. ``sharded``: True when the rank reads only its part of the data (a
    ``DistributedSampler``, accelerate's shards, or a library that splits by rank), False for a
    map-style loader on torch's own samplers (every rank reads every sample), None when
    unknown (an IterableDataset that may split by rank in ``__iter__``, a custom sampler).
    ``dispatch_batches``: the loader is accelerate's ``DataLoaderDispatcher`` (rank 0 loads
    for every rank). ``memory_bytes``: the rank's main process and workers as measured (PSS,
    else USS); ``pinned_bytes``: pinned memory in flight; ``shm_in_flight_bytes``: the
    batches in flight through /dev/shm (batch × workers × prefetch_factor); each None when
    unknown."""

    rank: int
    node: int
    local_rank: int
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    threads: int
    torch_threads: int
    omp_num_threads: str | None
    sharded: bool | None
    dispatch_batches: bool
    batch_bytes: int | None = None
    memory_bytes: int | None = None
    pinned_bytes: int | None = None
    shm_in_flight_bytes: int | None = None
    #: The class of the loader's sampler (its batch sampler's where that is custom).
    sampler: str | None = None
    #: ``len(dataset)`` where a map-style dataset has one: ranks with different lengths are
    #: not reading the same data.
    dataset_len: int | None = None
    #: The CPUs the rank may run on (its affinity mask), None when unread: a node's ranks
    #: pinned each to its own CPUs have, together, the CPUs of all their masks.
    cpu_ids: list[int] | None = None

    @property
    def loads(self) -> bool:
        """Whether this rank's own DataLoader loads: under ``dispatch_batches`` only rank 0's
        does, and the others receive their batches from it."""
        return not self.dispatch_batches or self.rank == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankFacts:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
