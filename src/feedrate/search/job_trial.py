"""One online trial measured on every rank of a job at once, read as the job's figures, for
``autotune`` under DDP: each rank sends what its own tuner measured (``rank_figures``), and
every rank reduces the same gathered list the same way (``job_figures``), so each rank's
``OnlineTuner`` is fed the same observations and takes the same decision. Training steps in
lockstep: the job delivers at its slowest rank's rate, and its data stall is the largest any
rank waited (the other ranks spend that time in the step's all-reduce, which reads as step).
Pure: plain-data documents in, plain data out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from feedrate.results.trial import Trial
from feedrate.search.ranks import job_busy, largest, slowest_rank


@dataclass(frozen=True)
class JobFigures:
    """The job's figures at one decision: ``trial`` (None: some rank measured too little to
    conclude), the round's ``spent_s`` (the longest any rank counted), the loop's ``batch_s``
    (seconds per batch, the slowest rank's; None: unknown) and ``switch_at``: the first batch
    of the epoch a new lane may take, past every batch any rank's lane already took (None:
    not known, as for an epoch timed whole)."""

    trial: Trial | None
    spent_s: float
    batch_s: float | None
    switch_at: int | None


def rank_figures(
    trial: Trial | None, *, spent_s: float, batch_s: float | None, taken: int | None
) -> dict[str, Any]:
    """What one rank sends for a decision: its ``trial`` (None: measured too little), the
    round's seconds on its clock, its seconds per batch, the batches its lanes took from the
    epoch's stream (None: not split)."""
    return {
        "trial": None if trial is None else trial.to_dict(),
        "spent_s": spent_s,
        "batch_s": batch_s,
        "taken": taken,
    }


def job_trial(trials: list[Trial], node_of: Sequence[int] | None = None) -> Trial:
    """The job's trial: the slowest rank's (its spread and processes), with the largest stall
    any rank saw, the longest start-up, every rank's rate in ``rank_rates``, and, as tune reads
    its trials (``search.ranks``), the busy CPUs within the slowest rank's share of its node
    (``node_of[r]``: rank ``r``'s node; None: all on one) and the largest /dev/shm."""
    rates = [t.samples_per_s for t in trials]
    slow = slowest_rank(rates)
    stalls = [t.stall_fraction for t in trials if t.stall_fraction is not None]
    own = [t.own_cpu for t in trials]
    busy = job_busy([t.system_busy_cpus for t in trials], own, slow, node_of)
    shm = largest([t.shm_peak_bytes for t in trials])
    return replace(
        trials[slow],
        stall_fraction=max(stalls) if stalls else None,
        startup_s=max(t.startup_s for t in trials),
        rank_rates=rates,
        system_busy_cpus=trials[slow].system_busy_cpus if busy is None else busy,
        shm_peak_bytes=trials[slow].shm_peak_bytes if shm is None else shm,
    )


def job_figures(docs: list[dict[str, Any]], node_of: Sequence[int] | None = None) -> JobFigures:
    """Every rank's ``rank_figures``, in rank order, read as the job's (``node_of``: each
    rank's node, as ``job_trial`` takes it)."""
    trials = [Trial.from_dict(d["trial"]) for d in docs if d["trial"] is not None]
    complete = len(trials) == len(docs)
    paces = [float(d["batch_s"]) for d in docs if d["batch_s"] is not None]
    taken = [int(d["taken"]) for d in docs if d["taken"] is not None]
    return JobFigures(
        trial=job_trial(trials, node_of) if complete and trials else None,
        spent_s=max(float(d["spent_s"]) for d in docs),
        batch_s=max(paces) if paces else None,
        switch_at=max(taken) if len(taken) == len(docs) and taken else None,
    )


def job_stall(stalls: list[float]) -> float:
    """The job's stall over a watch stretch: the largest any rank waited."""
    return max(stalls)
