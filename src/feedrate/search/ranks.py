"""One configuration measured on every rank at once, read as one figure: training steps in
lockstep, so the job goes at its slowest rank's pace. The search then decides as for one
process, on the slowest rank's figures within that rank's share of the node."""

from __future__ import annotations

from dataclasses import replace

from feedrate.results.measurement import Measurement


def slowest_rank(rates: list[float]) -> int:
    """The rank whose rate (samples/s) is lowest: the job goes at its pace."""
    if not rates:
        raise ValueError("no rank measured anything")
    return min(range(len(rates)), key=lambda r: rates[r])


def job_busy(busy: list[float | None], own: list[float], low: int) -> float | None:
    """The busy CPUs the machine had, as rank ``low`` sees them when the other ranks are its
    own job: what those ranks used themselves (``own``, CPUs per rank) is taken out of what
    "other processes" kept busy. None where no rank could read it."""
    known = [b for b in busy if b is not None]
    if not known:
        return None
    return max(0.0, max(known) - sum(c for r, c in enumerate(own) if r != low))


def largest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def slowest(measurements: list[Measurement]) -> Measurement:
    """The slowest rank's measurement (lowest median window), with ``rank_rates`` set, the
    machine's busy CPUs counted as that rank sees them (``job_busy``), and the largest
    /dev/shm any rank saw."""
    rates = [m.spread.median for m in measurements]
    low = slowest_rank(rates)
    m = measurements[low]
    processes = replace(m.processes)
    own = [
        x.processes.main.cpu_util + sum(w.cpu_util for w in x.processes.workers)
        for x in measurements
    ]
    busy = job_busy([x.processes.system_busy_cpus for x in measurements], own, low)
    if busy is not None:
        processes.system_busy_cpus = busy
    shm = largest([x.processes.shm_peak_bytes for x in measurements])
    if shm is not None:
        processes.shm_peak_bytes = shm
    return replace(
        m,
        processes=processes,
        rank_rates=rates,
        notes=[*m.notes, f"rank {low} was the slowest of {len(measurements)}"],
    )
