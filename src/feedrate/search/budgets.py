"""How much of the machine a search may plan to use (memory, /dev/shm, open files, tasks, workers),
from the machine's facts: the ``Space`` that tune, autotune and the doctor search in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feedrate.loader.config import LoaderConfig
from feedrate.search.space import Space

if TYPE_CHECKING:
    from feedrate.machine.facts import MachineFacts

#: Past this many workers, ask for max_workers: start-up and shutdown get slow.
DEFAULT_MAX_WORKERS = 512
#: Share of available memory and of free /dev/shm a search may plan to use.
MEMORY_SHARE = 0.5
SHM_SHARE = 0.5
#: Share of the open-file soft limit, and of the tasks left to start, a search may plan to use.
FD_SHARE = TASKS_SHARE = 0.8


def space_for(
    facts: MachineFacts,
    baseline: LoaderConfig,
    *,
    consumer: bool,
    max_workers: int | None = None,
    memory_limit: int | None = None,
    allow_reorder: bool = False,
    epoch_batches: int | None = None,
    parts: int | None = None,
) -> Space:
    """The search space around ``baseline`` (the user's settings) on the machine ``facts``
    describe: at most ``max_workers`` (default ``DEFAULT_MAX_WORKERS``), ``memory_limit`` bytes
    (default ``MEMORY_SHARE`` of what is available, within a cgroup limit), ``SHM_SHARE`` of
    free /dev/shm, ``FD_SHARE`` of the open-file limit where batches hold files, and
    ``TASKS_SHARE`` of the tasks left to start (``pids.max``, ``ulimit -u``); without
    ``max_workers``, no more workers than ``epoch_batches`` (an epoch's batches, where known);
    never more than ``parts`` (``worker_cap``)."""
    available, limit = facts.memory_available_bytes, facts.memory_limit_bytes
    # A cgroup's limit is its whole memory, the main process's included (``memory_counts_main``).
    by_limit = memory_limit is None and limit is not None and (available or limit) >= limit
    if limit is not None:
        available = min(available or limit, limit)
    memory = memory_limit or (int(available * MEMORY_SHARE) if available else None)
    shm = int(facts.shm_free_bytes * SHM_SHARE) if facts.shm_free_bytes else None
    return Space(
        cpus=facts.cpus_usable,
        baseline=baseline,
        max_workers=worker_cap(max_workers, epoch_batches, parts),
        cap=cap_words(max_workers, epoch_batches, parts),
        memory_budget=memory,
        memory_counts_main=by_limit,
        shm_budget=shm,
        fd_budget=fd_budget(facts),
        tasks_budget=None if facts.tasks_free is None else int(facts.tasks_free * TASKS_SHARE),
        consumer=consumer,
        allow_reorder=allow_reorder,
        # Out of order, a worker holding its prefetch is skipped: no fixed turn, no rounds.
        epoch_batches=None if baseline.in_order is False else epoch_batches,
    )


def worker_cap(max_workers: int | None, epoch_batches: int | None, parts: int | None = None) -> int:
    """``max_workers`` if given; else ``DEFAULT_MAX_WORKERS``, and no more than an epoch's
    batches: past that every worker makes at most one batch an epoch and the rest sit idle,
    adding start-up, memory and each epoch's restart, no throughput. Never more than
    ``parts``, the shards a library hands out whole to workers (``libraries.worker_limit``):
    a worker past them gets none, and webdataset then fails."""
    if max_workers is not None:
        cap = max_workers
    elif epoch_batches is not None and epoch_batches > 0:
        cap = min(DEFAULT_MAX_WORKERS, epoch_batches)
    else:
        cap = DEFAULT_MAX_WORKERS
    return cap if parts is None else min(cap, parts)


def cap_words(max_workers: int | None, epoch_batches: int | None, parts: int | None = None) -> str:
    """What set ``worker_cap``'s count, in words: the user's ``max_workers``, the shards, an
    epoch's batches, or the default."""
    cap = worker_cap(max_workers, epoch_batches, parts)
    if max_workers is not None and cap == max_workers:
        return f"max_workers={max_workers}"
    if parts is not None and cap == parts:
        return f"the {parts} shards the dataset hands out whole, one worker each at most"
    if max_workers is None and epoch_batches is not None and cap == epoch_batches:
        return f"an epoch's {epoch_batches} batches, one a worker at most"
    return f"max_workers={cap} (the default)"


def fd_budget(facts: MachineFacts) -> int | None:
    """Only the file_descriptor sharing strategy holds a file per tensor in flight."""
    if facts.sharing_strategy != "file_descriptor" or facts.open_files_soft is None:
        return None
    return int(facts.open_files_soft * FD_SHARE)
