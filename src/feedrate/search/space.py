"""What a search may try (``Space``) and how trials compare: the noise between two trials, whether
one beats another, whether one keeps the consumer fed, and the budgets a configuration would
exceed. Pure functions over measured trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial
from feedrate.units import size

#: A gain must beat this relative margin (or the trials' own spread, if wider) to count.
NOISE_FLOOR = 0.03


#: With a consumer, a configuration keeps it fed when it waits for data at most this share of time.
STALL_MARGIN = 0.05


#: With a consumer, doubling the workers must cut the stall by at least this much to go on.
STALL_GAIN = 0.03


#: With a consumer, latency-bound workers are aimed at the consumer's pace with this to spare.
AIM_MARGIN = 0.1


#: Batches from this many bytes cost workers real CPU time to copy into shared memory (and the
#: main process to map): online, busy workers making them may be slower than no workers.
BIG_BATCH = 2**20


#: Online, no workers are tried after one worker fed the loop only when the stall predicted
#: without them (``zero_stall``) is below this: a bad trial costs training time.
ZERO_STALL = 0.25


#: /dev/shm needed per batch in flight, over the batch's own bytes (headroom for fragmentation).
SHM_HEADROOM = 1.5


#: Open files the main process holds per worker (queues, pipes) and per batch in flight (one per
#: tensor under the file_descriptor sharing strategy; a batch usually holds a few tensors).
FDS_PER_WORKER, FDS_PER_BATCH, FDS_BASE = 4, 4, 64


#: Tasks (``pids.max``, ``ulimit -u``) a worker process holds: ``TASKS_SEEN`` (on torch 2.13:
#: the worker's own thread, its result queue's feeder and one more), and ``TASKS_PER_WORKER``
#: with one to spare, as a search plans; a threaded worker holds its ``threads`` - 1 more.
TASKS_SEEN, TASKS_PER_WORKER = 3, 4


def tasks(cfg: LoaderConfig, per: int = TASKS_PER_WORKER) -> int:
    """The tasks ``cfg``'s workers hold together, ``per`` worker and their threads."""
    return cfg.num_workers * (per + cfg.threads - 1)


def workers_within_tasks(space: Space, threads: int = 1) -> int | None:
    """The most workers of ``threads`` threads the tasks budget holds; None without one."""
    if space.tasks_budget is None:
        return None
    return space.tasks_budget // (TASKS_PER_WORKER + threads - 1)


def most_workers(space: Space, threads: int = 1) -> int:
    """``max_workers``, within the tasks budget for workers of ``threads`` threads."""
    n = workers_within_tasks(space, threads)
    return space.max_workers if n is None else min(space.max_workers, n)


Proposal = tuple[LoaderConfig, str]


@dataclass(frozen=True)
class Space:
    """What may be tried: ``cpus`` usable, the user's ``baseline`` (its other settings are kept),
    the worker cap, the memory and /dev/shm budgets in bytes, the open files and the tasks
    (processes and threads) it may hold (None = unbounded)."""

    cpus: int
    baseline: LoaderConfig
    max_workers: int
    memory_budget: int | None = None
    #: The memory budget is a share of a cgroup's whole limit (``memory.max``), which the main
    #: process's own memory lies within: counted against it too. Elsewhere the budget is of
    #: the memory available with the main process already running (or ``--memory-limit``, the
    #: workers'), and only the workers count.
    memory_counts_main: bool = False
    shm_budget: int | None = None
    fd_budget: int | None = None
    tasks_budget: int | None = None
    consumer: bool = False
    allow_reorder: bool = False
    #: Threads per worker a threaded trial may use (1: threads cannot help this loader, e.g.
    #: an IterableDataset, or a thread-safety check failed); whether they may be recommended.
    max_threads: int = 1
    allow_threads: bool = False
    #: The CPUs one worker uses while it makes items, where a stream's probe measured it (its
    #: trials are whole epochs: see ``online_steps.fewer``); None elsewhere.
    busy_worker_cpu: float | None = None
    #: Samples per batch (the loader's ``batch_size``; None: a batch sampler of its own): with a
    #: trial's rate and batch bytes, the bytes its workers hand over per second.
    batch_size: int | None = None
    #: Why the loader keeps its own worker count (an IterableDataset that may not split its
    #: stream by worker: each worker added could yield all of it again), or None.
    kept_workers: str | None = None
    #: Where 2 workers were seen to yield the same samples: the most workers whose rate counts
    #: no copies (1); a trial with more (your settings) is never recommended. None elsewhere.
    copies_past: int | None = None
    #: What set ``max_workers``, in words (``budgets.cap_words``); "" where not said.
    cap: str = ""
    #: The batches of an epoch of a map-style loader, handed to its workers in turn
    #: (``rounds``); None for a stream, a sampler without a length, or batches taken out of
    #: order (``in_order=False``: a worker holding its prefetch is skipped, no fixed turn).
    epoch_batches: int | None = None


def noise(a: Trial, b: Trial) -> float:
    """The relative difference two trials must exceed to be told apart: twice the standard
    error of their difference (from each trial's windows), and at least ``NOISE_FLOOR``."""
    return max(NOISE_FLOOR, 2 * math.hypot(a.noise, b.noise))


def beats(b: Trial, a: Trial) -> bool:
    """``b`` is faster than ``a`` by more than the noise of either: the same as ``a``'s
    ``shortfall`` behind ``b`` over its ``tolerance``."""
    return b.median > a.median * (1 + noise(a, b))


def shortfall(t: Trial, than: Trial) -> float:
    """How much slower ``t`` is than ``than``: the share of ``than``'s rate it lacks (negative
    where faster; 0 where ``than`` has no rate), the "N% slower" of the verdicts."""
    return 1 - t.median / than.median if than.median > 0 else 0.0


def tolerance(t: Trial, than: Trial) -> float:
    """The most ``shortfall(t, than)`` may be with ``t`` still within the noise of ``than``:
    ``beats``'s margin (``noise``) as a share of the faster rate, so a verdict can print the
    gap and the noise in the same terms."""
    n = noise(t, than)
    return n / (1 + n)


#: Measured this many times, interleaved with the leader, a trial the leader outpaces by more
#: than ``NOISE_FLOOR`` is taken as slower, even where its windows' spread is wider: short
#: trials on a busy machine cannot resolve a 5-10% gain, repeated side by side they can.
RESOLVED_REPEATS = 3


def outpaced(top: Trial, t: Trial) -> bool:
    """``top`` and ``t`` were both measured ``RESOLVED_REPEATS`` times and ``top`` is faster by
    more than ``NOISE_FLOOR``."""
    resolved = min(top.repeats, t.repeats) >= RESOLVED_REPEATS
    return resolved and top.median > t.median * (1 + NOISE_FLOOR)


#: Why a trial is not as good as the fastest: slower beyond the noise, or ``outpaced``.
Behind = Literal["beaten", "outpaced"]


def behind(top: Trial, t: Trial) -> Behind | None:
    """The answer's rule (``propose.choose``, and the verdicts that explain it): why ``t`` is
    not as good as the fastest ``top``, or None where it is (within the noise of ``top`` and
    not ``outpaced`` by it): of those, the cheapest is the answer."""
    if beats(top, t):
        return "beaten"
    return "outpaced" if outpaced(top, t) else None


#: The loop's own time per sample (its step's share of the time, over the rate) this much
#: longer with more workers: they compete with the loop's thread for the CPUs.
STEP_GROWTH = 0.5


def slows_the_loop(top: Trial, prev: Trial) -> bool:
    """``top`` (more workers) left the loop ``STEP_GROWTH`` more of its own time per sample than
    ``prev``: its workers compete with the loop's thread, whose wait for a CPU is its step's.
    Its stall then reads lower without more delivered (skewed CPU cost, 8 to 16 workers on 2
    CPUs: a stall of 81% to 70%, 3,077 to 2,417 samples/s); a consumer's own step is the same
    at any count unless it competes too."""

    def own(t: Trial) -> float:
        return (1.0 - (t.stall_fraction or 0.0)) / t.median if t.median > 0 else 0.0

    return own(prev) > 0 and own(top) > own(prev) * (1 + STEP_GROWTH)


def covers(t: Trial) -> bool:
    return t.measured and t.stall_fraction is not None and t.stall_fraction <= STALL_MARGIN


def with_workers(base: LoaderConfig, workers: int, **changes: object) -> LoaderConfig:
    """``workers`` workers, the baseline's other settings. Trials keep their workers alive
    between epochs: restarting them is start-up, judged apart (``advice.judge_persistent``),
    and repeated restarts would only make trials slower."""
    pf = base.prefetch_factor if base.num_workers else None
    cfg = LoaderConfig(workers, base.pin_memory, pf, workers > 0, base.in_order, base.threads)
    return replace(cfg, **changes) if changes else cfg  # type: ignore[arg-type]


def series(space: Space, trials: list[Trial]) -> list[Trial]:
    """Measured trials that vary only num_workers from the baseline's other settings."""
    return [
        t
        for t in trials
        if t.measured and with_workers(space.baseline, t.config.num_workers) == t.config
    ]


def eligible(space: Space, trials: list[Trial]) -> list[Trial]:
    """Measured trials that may be recommended: threaded ones only when allowed, none whose
    workers yield copies of the stream (``copies_past``), and those that held more memory
    than the budget (``--memory-limit``) only when none held less: then the one that held
    least."""
    allowed = [
        t
        for t in trials
        if t.measured
        and (space.allow_threads or t.config.threads == 1)
        and (space.copies_past is None or t.config.num_workers <= space.copies_past)
    ]
    within = [t for t in allowed if not over_memory(space, t)]
    return within or sorted(allowed, key=lambda t: t.memory_bytes)[:1]


def over_memory(space: Space, t: Trial) -> bool:
    """``t`` measured, its workers' own memory (USS, as the budget's predictions count it) over
    the memory budget; the main process's too where the budget counts it
    (``memory_counts_main``). Elsewhere it is not counted: it is there with any setting, and
    already out of the memory available when the budget was read from it."""
    held = (t.workers_uss_bytes or 0) + ((t.main_uss_bytes or 0) if space.memory_counts_main else 0)
    return space.memory_budget is not None and held > space.memory_budget


def threaded(trials: list[Trial]) -> list[Trial]:
    return [t for t in trials if t.measured and t.config.threads > 1]


def threads_win(space: Space, top: Trial, trials: list[Trial]) -> bool:
    """Threads may be recommended and one threaded trial already beats ``top``."""
    return space.allow_threads and any(beats(t, top) for t in threaded(trials))


#: Other processes busy on this many CPUs (or this share of the usable ones, if more) during a
#: trial make its rate a figure for a machine that busy, not for this one when quiet.
CONTENDED_MIN = 0.5
CONTENDED_SHARE = 0.25


def others_busy(t: Trial) -> float | None:
    """CPUs other processes kept busy while ``t`` ran: the machine's busy CPUs less the
    pipeline's own (None where the machine's were not read)."""
    if not t.measured or t.system_busy_cpus is None:
        return None
    return max(0.0, t.system_busy_cpus - t.main_cpu - t.workers_cpu)


def contended(t: Trial, cpus: int) -> bool:
    """Others were busy enough during ``t`` for its rate to rest on their load."""
    busy = others_busy(t)
    return busy is not None and busy >= max(CONTENDED_MIN, CONTENDED_SHARE * cpus)


def fastest(trials: list[Trial]) -> Trial | None:
    measured = [t for t in trials if t.measured]
    return max(measured, key=lambda t: t.median) if measured else None


@dataclass(frozen=True)
class Peaks:
    """The largest sizes the measured trials saw (bytes; 0 where none was measured): one
    worker's memory, the main process's, and one batch."""

    per_worker: int
    main: int
    batch: int


def peaks(trials: list[Trial]) -> Peaks:
    measured = [t for t in trials if t.measured]
    return Peaks(
        max((t.worker_uss_max_bytes or 0 for t in measured), default=0),
        max((t.main_uss_bytes or 0 for t in measured), default=0),
        max((t.batch_bytes or 0 for t in measured), default=0),
    )


def memory_room(space: Space, seen: Peaks) -> int | None:
    """The memory budget's room for workers: the budget, less the main process where the
    budget counts it (``memory_counts_main``); None without a budget."""
    if space.memory_budget is None:
        return None
    return space.memory_budget - (seen.main if space.memory_counts_main else 0)


def predict_over_budget(space: Space, trials: list[Trial], cfg: LoaderConfig) -> str | None:
    """Why ``cfg`` would exceed a budget, predicted from measured per-process memory and batch
    bytes; None when it fits or nothing is known yet."""
    seen = peaks(trials)
    per_worker, batch = seen.per_worker, seen.batch
    w, pf = cfg.num_workers, cfg.prefetch_factor or 0
    memory, room = w * per_worker, memory_room(space, seen)  # as ``over_memory`` counts it
    if room is not None and per_worker and memory > room:
        main = " and the main process's" if space.memory_counts_main else ""
        held = memory + (seen.main if space.memory_counts_main else 0)
        return (
            f"predicted workers'{main} memory {size(held)} over the budget of "
            f"{size(space.memory_budget or 0)} ({size(per_worker)} per worker)"
        )
    shm = int(batch * w * pf * SHM_HEADROOM)
    if space.shm_budget is not None and batch and shm > space.shm_budget:
        return (
            f"predicted /dev/shm use {shm / 2**20:.0f} MiB over the budget of "
            f"{space.shm_budget / 2**20:.0f} MiB ({w} workers × {pf} batches of "
            f"{batch / 2**20:.1f} MiB in flight)"
        )
    fds = FDS_BASE + w * (FDS_PER_WORKER + pf * FDS_PER_BATCH)
    if space.fd_budget is not None and w and fds > space.fd_budget:
        return (
            f"predicted {fds} open files over the budget of {space.fd_budget} "
            "(80% of the soft limit; raise it with ulimit -n)"
        )
    if space.tasks_budget is not None and tasks(cfg) > space.tasks_budget:
        return (
            f"predicted {tasks(cfg)} processes and threads over the budget of "
            f"{space.tasks_budget} (80% of those left to start under pids.max or ulimit -u)"
        )
    return None
