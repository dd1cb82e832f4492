"""The online search's own steps (``autotune``, training running): fewer workers where the
fewest tried keep the step fed, and no workers at all where the copies between processes may
be the cost. The other steps are the guided search's (``search.steps``)."""

from __future__ import annotations

import math

from feedrate.results.trial import Trial
from feedrate.search.bottleneck import WAITING_DEMAND, bottleneck, ipc_bytes_per_s
from feedrate.search.rounds import fewest_alike
from feedrate.search.space import (
    BIG_BATCH,
    STALL_MARGIN,
    ZERO_STALL,
    Proposal,
    Space,
    beats,
    covers,
    fastest,
    series,
    with_workers,
)

#: A stream's fewer workers are those its fed trial kept busy, times this (its noise, and a
#: rate per worker that falls as the workers' share of the CPUs grows).
BUSY_MARGIN = 1.25


def fewer(space: Space, trials: list[Trial]) -> Proposal | None:
    """Online: the fewest workers tried keep the consumer fed; half as many may too. A
    stream's trial is a whole epoch, so a count that does not feed it costs one: where its
    probe measured what a busy worker uses (``Space.busy_worker_cpu``), and the workers' CPU
    was read, the count its fed trial kept busy (their CPU over one busy worker's), with
    ``BUSY_MARGIN``, or none (from one worker: none, as elsewhere, where ``zero`` allows)."""
    main = series(space, trials)
    fed = [t.config.num_workers for t in main if covers(t)]
    if not fed or min(fed) == 0:
        return None
    c = min(fed)
    if any(not covers(t) and t.config.num_workers < c for t in main):
        return None  # _bisect's ground
    top = next(t for t in main if t.config.num_workers == c)
    if c == 1 and zero_stall(top) > ZERO_STALL:
        return None  # the worker's CPU time, moved into the loop, would stall it
    per_worker = space.busy_worker_cpu
    if per_worker is None or per_worker <= 0 or top.workers_cpu <= 0 or c == 1:
        half = fewest_alike(c // 2, space.epoch_batches)  # as many rounds of an epoch, fewer
        return with_workers(space.baseline, half), f"{c} workers keep the step fed: fewer may too"
    busy = top.workers_cpu / per_worker
    n = max(1, math.ceil(busy * BUSY_MARGIN))
    if n >= c:
        return None
    return with_workers(space.baseline, n), (
        f"{c} workers keep the step fed, {busy:.1f} of them busy ({top.workers_cpu:.2f} CPUs "
        f"at {per_worker:.2f} a busy worker): {n} may too (a stream's trial is a whole epoch)"
    )


def zero_stall(t: Trial) -> float:
    """The stall predicted without workers for a loop fed by ``t``: each second of the loop would
    also do the CPU work the workers did in it (their inter-process copies aside)."""
    work = t.workers_cpu
    step = 1.0 - (t.stall_fraction or 0.0)
    return work / (work + step) if work + step > 0 else 0.0


def zero(space: Space, trials: list[Trial]) -> Proposal | None:
    """Online, once more workers stopped helping and none feeds the loop: no workers at all
    (cheap samples are fastest without inter-process copies). Not when the workers mostly
    waited and more of them did help (latency-bound: without them the loop would wait on every
    read), nor, with small batches and the main process not busy receiving them, when the
    workers were busy (the work itself is the cost) or their CPU time, moved into the loop,
    would stall it more than the fastest did (``zero_stall``: skewed CPU work and a tokenizer
    nearly fed, their workers idle for want of a faster loop). Idle workers that more of them
    did not speed up, busy ones making big batches, or a main process busy receiving batches
    (``receiving``, in any trial: the hand-off is the cost of the pipeline's batches, and a
    reading near its threshold falls either side from trial to trial) point at the copies
    between processes instead. Never where no worker made
    a ``ZERO_GAIN``-th of the fastest's rate: alone, the main process does one worker's work
    (after a re-tune, which forgets the counts that scaled, latency-bound trials of 24 and 45
    workers at 54 and 27 samples/s each against 1,300 in all)."""
    main = series(space, trials)
    best = _unfed(main)
    if best is None:
        return None
    kind = bottleneck(best, space.cpus)
    fewest = min(main, key=lambda t: t.config.num_workers)
    handoff = any(receiving(t) for t in main)  # the batches' cost, whatever the count
    if kind == "latency" and best is not fewest and beats(best, fewest) and not handoff:
        return None
    small = (best.batch_bytes or 0) < BIG_BATCH
    worse = zero_stall(best) > (best.stall_fraction or 0.0) + STALL_MARGIN
    if small and not handoff and (kind == "cpu" or worse):
        return None  # the workers' work, moved into the loop, would stall it more than now
    if len({t.config.num_workers for t in main}) > 1:
        why = "more workers stopped helping"
    else:  # one count tried (a stream's trial is a whole epoch)
        why = f"{best.config.label()} leaves the loop waiting"
    return with_workers(space.baseline, 0), f"{why}: no workers at all?"


def _unfed(main: list[Trial]) -> Trial | None:
    """The fastest of ``main`` (a series of worker counts), where none of them feeds the loop,
    none was without workers, and one worker made at least a ``ZERO_GAIN``-th of its rate
    (alone, the main process does about one worker's work): the ground for trying none."""
    if not main or any(covers(t) for t in main) or any(t.config.num_workers == 0 for t in main):
        return None
    best = fastest(main)
    if best is None:
        return None
    each = max(t.median / (t.config.num_workers * t.config.threads) for t in main)
    return None if ZERO_GAIN * each < best.median else best


def copies(space: Space, trials: list[Trial]) -> Proposal | None:
    """Online, before more workers: none at all, where the fastest trial's workers spent a
    large part of their CPU time handing batches over (``hands_over``), which no workers saves
    and more workers only add to (``large``, 12 MiB batches of cheap tensors: 2 workers handed
    over 1.1 GB per second of their CPU, 1.36 CPUs, and delivered 490 samples/s, 4 and 5
    workers 477 and 488, none 799). A reason for the trial, not a measure of the copy: the
    trial of no workers decides. Not for a stream (``Space.busy_worker_cpu`` measured), whose
    trial is a whole epoch: there ``zero`` waits until more workers stopped helping."""
    if space.busy_worker_cpu is not None:
        return None
    best = _unfed(series(space, trials))
    moved = None if best is None else hands_over(space, best)
    if best is None or moved is None:
        return None
    w = best.config.num_workers
    return with_workers(space.baseline, 0), (
        f"{w} workers handed over {moved / 2**20:,.0f} MiB of batches per second of their CPU "
        "time: the hand-off between processes may cost more than the work: no workers?"
    )


def hands_over(space: Space, t: Trial) -> float | None:
    """The bytes of batches ``t``'s workers handed to the main process per second of their CPU
    time, where it was ``COPY_BYTES_PER_CPU_S`` or more and they were not mostly waiting (each
    wanting a CPU at least ``WAITING_DEMAND`` of the time). Each byte is written into
    a fresh shared-memory segment (the kernel zeroes its pages first), mapped and freed by
    the main process: such workers spend a large part of their time on the hand-off (decoding
    images: 96 MB). None below it, for workers that mostly wait (big downloads hand over much
    for little CPU, whatever the main process's own thread does), or where the loader's batch
    size is not known (a batch sampler of its own)."""
    if not space.batch_size or t.workers_cpu <= 0 or t.worker_demand_mean < WAITING_DEMAND:
        return None
    moved = ipc_bytes_per_s(t, space.batch_size)
    per_cpu = None if moved is None else moved / t.workers_cpu
    return per_cpu if per_cpu is not None and per_cpu >= COPY_BYTES_PER_CPU_S else None


#: Online, workers handing this many bytes of batches to the main process per second of their
#: CPU time are taken as busy with the hand-off (``copies``). ``large`` in
#: ``benchmarks/autotune.py`` (2026-12-05): without workers the process used 6.4 ms of CPU a
#: 12 MiB batch, its loop included; with 2 workers they and the main process used 13.2 ms. The
#: hand-off, about 0.5 ns a byte, is then a quarter or more of the workers' CPU time.
COPY_BYTES_PER_CPU_S = 512 * 2**20


def receiving(t: Trial) -> bool:
    """The main process of ``t`` was busy receiving batches: ``MAIN_HANDOFF`` of a core, or its
    loop's thread on a CPU ``WAIT_HANDOFF`` of its wait in ``next()`` at a cost of at least
    ``HANDOFF_SHARE`` of the workers' CPU time. More workers only add to that hand-off; no
    workers removes it."""
    if t.config.num_workers == 0:
        return False
    on_cpu, per_s = t.wait_cpu or 0.0, t.receive_cpu or 0.0
    handoff = on_cpu >= WAIT_HANDOFF and per_s >= HANDOFF_SHARE * t.workers_cpu
    return t.main_cpu >= MAIN_HANDOFF or handoff


def idle_stall(t: Trial) -> float:
    """The share of ``t``'s time its loop waited in ``next()`` off a CPU: the part of the stall
    that more workers may cut. The rest, the loop's thread on a CPU while it waited, is each
    batch's hand-off to it, which more workers only add to (``remote``, 30 workers under
    ``benchmarks/autotune.py``'s consumer: a 15% stall, its thread on a CPU 70% of it; 39
    workers then delivered no more). The whole stall where that was not read (offline)."""
    if t.wait_cpu is None:
        return t.stall_fraction or 0.0
    return (t.stall_fraction or 0.0) * (1.0 - t.wait_cpu)


#: Online, a main process this busy (share of a core) receiving small batches spends a real part
#: of the pipeline's cost on the hand-off between processes, which no workers saves: tabular rows
#: and dict records measure 0.45-0.5 at 2 workers, a tokenizer and skewed CPU work 0.06-0.15.
MAIN_HANDOFF = 0.3

#: Online, the loop's thread on a CPU this share of its wait in ``next()``, and that CPU time at
#: least ``HANDOFF_SHARE`` of the workers', is receiving batches: the step's own CPU does not
#: count, as it does in ``MAIN_HANDOFF``. The share alone is not enough: a loop fed well waits
#: only for the hand-off itself. Measured in autotune's trials on a 2-CPU machine, busy and less
#: so (share, then CPU against the workers'; ``benchmarks/handoff.py``): tabular rows 0.63-0.85
#: and 0.32-0.51 (the process read 0.20-0.28 of a core in all), dict records 0.64-0.80 and
#: 0.45-0.57; skewed CPU work 0.12-0.74 and 0.04-0.10, a tokenizer 0.80-0.91 and 0.09-0.10,
#: images 0.52-0.92 and 0.02-0.03, remote reads 0.01-0.62 and 0.17-0.26 (kept from no workers
#: by ``ZERO_GAIN`` and, with few workers, its idle loop).
WAIT_HANDOFF = 0.5
HANDOFF_SHARE = 0.3

#: How much faster than one worker the main process alone may load, without the copies between
#: processes: 12 MiB batches measured 2.5x (``large``: 18.9 s an epoch without workers, 47.7 s
#: with one).
ZERO_GAIN = 4.0
