"""Where an ``AutoLoader`` starts, alone or with the other ranks of a job: its share of the
node (``_starting``), the tuner it starts with, and the meeting of the ranks at the first
iteration, after which every rank starts from rank 0's settings (``_join``, ``_meet``).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch.utils.data import DataLoader

from feedrate.autotuning.ranked import Job
from feedrate.autotuning.start import Start, starting_point, tuner_for
from feedrate.distributed import forks, group
from feedrate.distributed.node import pinned_apart, share
from feedrate.loader.batches import epoch_length
from feedrate.machine.facts import MachineFacts, collect
from feedrate.search.tuner import OnlineTuner


class Meeting:
    """The part of ``AutoLoader`` that sets where it starts and meets the other ranks."""

    _user: DataLoader[Any]
    _machine: MachineFacts | None
    _max_workers: int | None
    _threads: bool
    _use_cache: bool
    _split: bool
    _rate: float | None
    _budget_s: float
    _coordinate: bool | None
    _job: Job | None
    _joined: bool
    _tuner: OnlineTuner
    _local_ranks: int
    _facts: MachineFacts
    _start: Start
    _cache_key: str | None

    def _starting(self, local_ranks: int, node_cpus: int | None = None) -> Start:
        """Where this process starts, within its share of the node's CPUs, memory, /dev/shm and
        open files (``local_ranks`` share it, ``node_cpus`` their CPUs where each is pinned)."""
        self._local_ranks, self._facts = local_ranks, self._machine or collect()
        facts = share(self._facts, local_ranks, node_cpus)
        self._start = starting_point(
            self._user,
            facts,
            max_workers=self._max_workers,
            allow_threads=self._threads,
            use_cache=self._use_cache,
            split=self._split,
        )
        return self._start

    def _tuner_of(self, start: Start, *, counted: bool) -> OnlineTuner:
        self._cache_key = start.cache_key
        return tuner_for(start, rate=self._rate, budget_s=self._budget_s, counted=counted)

    def _join(self) -> None:
        """At the first iteration of a distributed job (collective): the other ranks met."""
        if group.active():
            forks.guard_forks()  # lanes fork workers between the job's collectives
            if self._coordinate is not False:
                self._meet(Job.open())  # should it fail, the next iteration tries again
        self._joined = True

    def _meet(self, job: Job) -> None:
        """Rank 0's start on every rank, trials on batch counts (after ``close()``: as it was)."""
        self._job = job
        weakref.finalize(self, job.close)  # a loader dropped unclosed closes its channel
        if not self._tuner.counted:
            start, ranks = self._start, job.channel.ranks
            pinned = pinned_apart(self._facts, ranks.node_cpus)
            if job.main and (ranks.local_world != self._local_ranks or pinned):
                try:  # the launcher did not say how many ranks share the node, or what CPUs
                    start = self._starting(ranks.local_world, ranks.node_cpus)
                except Exception as exc:
                    job.failing(exc)
                    raise
            self._tuner = self._tuner_of(Start.from_dict(job.first(start.to_dict())), counted=True)
            if not job.main:
                self._cache_key = None  # rank 0 keeps what the job settles on
        job.same_length(epoch_length(self._user) if self._split else None)
