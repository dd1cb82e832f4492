"""One configuration measured on every rank at once, read as one figure: training steps in
lockstep, so the job goes at its slowest rank's pace. The search then decides as for one
process, on the slowest rank's figures within that rank's share of the node.

Which rank is slowest is judged against the noise. Ranks of the same shape differ by chance
in a short trial, the more so with many workers (their batches arrive in bursts), and the
lowest of several noisy figures is lower than any rank's pace over a whole epoch: read as the
job's, it would hold every noisy configuration back. So when every rank's rate lies within
``AGREE_SE`` standard errors of the slowest's, the ranks are one pace and their windows are
pooled; only a rank slower beyond its noise (a slower shard, a busier node) sets the job's
figure alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from feedrate.results.measurement import Measurement
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial

#: Ranks whose rates differ by less than this many combined standard errors agree.
AGREE_SE = 2.0


def slowest_rank(rates: list[float]) -> int:
    """The rank whose rate (samples/s) is lowest: the job goes at its pace."""
    if not rates:
        raise ValueError("no rank measured anything")
    return min(range(len(rates)), key=lambda r: rates[r])


def job_busy(
    busy: list[float | None], own: list[float], low: int, node_of: Sequence[int] | None = None
) -> float | None:
    """The busy CPUs within rank ``low``'s share of its node, to be judged against that share:
    its own (``own``, CPUs per rank) and its part of what other processes kept busy. The node's
    ranks share its CPUs, so what they used is the job's own, not other processes' load, and
    what processes outside the job used (the node's busy CPUs, ``busy``, less every local
    rank's own) is split between them: a rank's share then reads full only when the node is.
    ``node_of[r]``: rank ``r``'s node (None: all on one). None where no rank of ``low``'s node
    could read the busy CPUs."""
    local = [r for r in range(len(own)) if node_of is None or node_of[r] == node_of[low]]
    known = [b for b in (busy[r] for r in local) if b is not None]
    if not known:
        return None
    others = max(0.0, max(known) - sum(own[r] for r in local))
    return own[low] + others / len(local)


def alike_ranks_busy(trial: Trial, ranks: int) -> Trial:
    """``trial``, measured by one of ``ranks`` ranks of a node each measuring alike at the same
    time (the doctor's ranks), with its busy CPUs read within its share of the node as
    ``job_busy`` reads a job's: the other ranks' own load, not gathered here, taken as this
    rank's. Unchanged for one rank, or where the busy CPUs were not read."""
    if ranks <= 1 or trial.system_busy_cpus is None:
        return trial
    own = trial.own_cpu
    busy = job_busy([trial.system_busy_cpus] * ranks, [own] * ranks, 0)
    return replace(trial, system_busy_cpus=busy)


def largest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def agree(spreads: list[Spread], low: int) -> bool:
    """Every rank's rate within ``AGREE_SE`` combined standard errors of rank ``low``'s."""
    base = spreads[low]

    def se(s: Spread) -> float:
        return s.rel_se * s.median

    return all(s.median - base.median <= AGREE_SE * math.hypot(se(s), se(base)) for s in spreads)


def slowest(measurements: list[Measurement], node_of: Sequence[int] | None = None) -> Measurement:
    """The slowest rank's measurement (lowest median window), with ``rank_rates`` set, the
    busy CPUs within that rank's share of its node (``job_busy``; ``node_of``: each rank's
    node, None: all on one), and the largest /dev/shm any rank saw. When the ranks agree
    within their noise (``agree``), its rate is theirs pooled: every rank's windows, and the
    mean of their aggregate rates."""
    rates = [m.spread.median for m in measurements]
    low = slowest_rank(rates)
    m = measurements[low]
    notes = [f"rank {low} was the slowest of {len(measurements)}"]
    if len(measurements) > 1 and agree([x.spread for x in measurements], low):
        pooled = [w for x in measurements for w in x.spread.windows]
        n = len(measurements)
        m = replace(
            m,
            spread=Spread.of_rates(pooled, m.spread.estimator),
            samples_per_s=sum(x.samples_per_s for x in measurements) / n,
            batches_per_s=sum(x.batches_per_s for x in measurements) / n,
        )
        notes = [f"the {n} ranks' rates agreed within their noise: pooled"]
    processes = replace(m.processes)
    own = [x.processes.own_cpu for x in measurements]
    busy = job_busy([x.processes.system_busy_cpus for x in measurements], own, low, node_of)
    if busy is not None:
        processes.system_busy_cpus = busy
    shm = largest([x.processes.shm_peak_bytes for x in measurements])
    if shm is not None:
        processes.shm_peak_bytes = shm
    return replace(
        m,
        processes=processes,
        rank_rates=rates,
        notes=[*m.notes, *notes],
    )
