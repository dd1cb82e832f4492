"""One configuration measured on every rank at once, read as one figure: training steps in
lockstep, so the job goes at its slowest rank's pace. The search then decides as for one
process, on the slowest rank's figures within that rank's share of the node."""

from __future__ import annotations

from dataclasses import replace

from feedrate.results.measurement import Measurement


def slowest(measurements: list[Measurement]) -> Measurement:
    """The slowest rank's measurement (lowest median window), with ``rank_rates`` set and the
    machine's busy CPUs counted as that rank sees them when the other ranks are its own job:
    what the other ranks used is taken out of what "other processes" kept busy, so the
    job's own ranks do not read as contention. /dev/shm is the largest any rank saw."""
    if not measurements:
        raise ValueError("no rank measured anything")
    rates = [m.spread.median for m in measurements]
    low = min(range(len(measurements)), key=lambda r: rates[r])
    m = measurements[low]
    busy = [x.processes.system_busy_cpus for x in measurements]
    known = [b for b in busy if b is not None]
    processes = replace(m.processes)
    if known:
        others_ours = sum(_own_cpu(x) for r, x in enumerate(measurements) if r != low)
        processes.system_busy_cpus = max(0.0, max(known) - others_ours)
    shm = [x.processes.shm_peak_bytes for x in measurements]
    shm_known = [s for s in shm if s is not None]
    if shm_known:
        processes.shm_peak_bytes = max(shm_known)
    return replace(
        m,
        processes=processes,
        rank_rates=rates,
        notes=[*m.notes, f"rank {low} was the slowest of {len(measurements)}"],
    )


def _own_cpu(m: Measurement) -> float:
    p = m.processes
    return p.main.cpu_util + sum(w.cpu_util for w in p.workers)
