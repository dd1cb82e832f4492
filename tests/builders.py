"""Hand-built results for tests that judge figures without measuring them: one rank's
``Measurement`` and one rank's ``RankFacts``, healthy unless told otherwise."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.measurement import Measurement, WindowSummary
from feedrate.results.processes import ProbeReport, ProcessFigures
from feedrate.results.ranks import RankFacts
from feedrate.results.run import LoaderRun, Window
from feedrate.results.spread import Spread

GiB = 2**30
MiB = 2**20


def measured(
    rate: float,
    *,
    workers: int = 2,
    main_cpu: float = 0.3,
    each: float = 0.2,
    queued: float = 0.0,
    node_busy: float | None = None,
    shm: int | None = None,
    batch: int = 16,
    config: LoaderConfig | None = None,
    **changes: Any,
) -> Measurement:
    """One rank's measurement at ``rate`` samples/s (windows within ±2%): its main process
    ``main_cpu`` of a core, ``workers`` workers each ``each`` of a core and ``queued`` for one,
    ``node_busy`` the busy CPUs it read on its node (all its ranks' included), ``shm`` the
    /dev/shm it held at most, ``batch`` samples a batch. ``changes``
    replace any other field (``processes`` included)."""
    m = Measurement(
        config=config or LoaderConfig(workers, prefetch_factor=2, persistent_workers=True),
        samples_per_s=rate,
        batches_per_s=rate / batch,
        spread=Spread.of_rates([rate * 0.98, rate, rate * 1.02]),
        startup_s=0.1,
        epoch_restart_s=[],
        window=WindowSummary(10, 80, 1.0, 1, "windows", 2, 0.1),
        processes=ProbeReport(
            wall_s=1.0,
            main=ProcessFigures("main", cpu_util=main_cpu),
            workers=[
                ProcessFigures("worker", cpu_util=each, runq_util=queued) for _ in range(workers)
            ],
            shm_peak_bytes=shm,
            system_busy_cpus=node_busy,
        ),
        machine={},
    )
    return replace(m, **changes)


def rank_facts(r: int, node: int = 0, local: int | None = None, **changes: Any) -> RankFacts:
    """Rank ``r``'s facts, a healthy rank: 2 workers, its own shard (a DistributedSampler of
    1000 samples), 1 intra-op thread, 1 GiB, small batches. ``changes`` replace any field."""
    facts = RankFacts(
        rank=r,
        node=node,
        local_rank=r if local is None else local,
        num_workers=2,
        prefetch_factor=2,
        pin_memory=True,
        threads=1,
        torch_threads=1,
        omp_num_threads="1",
        sharded=True,
        dispatch_batches=False,
        batch_bytes=MiB,
        memory_bytes=GiB,
        pinned_bytes=5 * MiB,
        shm_in_flight_bytes=4 * MiB,
        sampler="DistributedSampler",
        dataset_len=1000,
    )
    return replace(facts, **changes)


def loader_run(**changes: Any) -> LoaderRun:
    """What ``feedrate run`` saw of a starved training loader without workers: 100 batches in
    one epoch, 6 s waiting in ``next()`` against 2 s of steps, the main thread computing 95%
    of its wait (it makes the batches). ``changes`` replace any field."""
    base: dict[str, Any] = {
        "created_at": "train.py:9",
        "config": LoaderConfig(),
        "pid": 5,
        "batches": 100,
        "samples": 400,
        "epochs": 1,
        "wait_s": 6.0,
        "step_s": 2.0,
        "startup_s": 0.1,
        "main_cpu_in_next": 0.95,
        "timeline": [Window(0.0, 4.0, 3.0, 1.0, 50), Window(4.0, 4.0, 3.0, 1.0, 50)],
    }
    return LoaderRun(**{**base, **changes})
