"""Every diagnosis rule on synthetic figures: the evidence that provokes it, the evidence that
must not, and a message that cites the numbers (rules in checks, checks_bottleneck,
checks_machine, checks_dataset)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from feedrate.checks import dataset as checks_dataset
from feedrate.checks.bottleneck import Pace, bottleneck_finding, bottleneck_kind, classify
from feedrate.checks.machine import (
    cpu_quota_finding,
    fd_limit_finding,
    pin_memory_finding,
    pin_memory_unused_finding,
    shm_finding,
    task_limit_finding,
)
from feedrate.checks.threads import thread_findings
from feedrate.checks.tune import check_failed_finding
from feedrate.checks.workers import (
    busy_machine_finding,
    consumer_worker_finding,
    data_stall_finding,
    startup_cause,
    startup_finding,
    worker_count_finding,
    workers_past_cpus_finding,
)
from feedrate.loader.config import LoaderConfig
from feedrate.loader.words import in_words_of
from feedrate.results.evidence import Container, SampleRun, StreamDigests, WorkerMemory, WorkerView
from feedrate.results.findings import Finding, for_loader
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.search.space import Space

MiB = 2**20


def trial(
    workers: int = 2,
    rate: float = 1000.0,
    main: float = 0.1,
    each: float = 0.9,
    *,
    noise: float = 0.02,
    stall: float | None = None,
    batch_bytes: int | None = None,
    runq: float = 0.0,
    persistent: bool = True,
    restart_s: float | None = None,
) -> Trial:
    cfg = LoaderConfig(workers, persistent_workers=persistent and workers > 0)
    return Trial(
        config=cfg,
        reason="test",
        samples_per_s=rate,
        spread=Spread([rate], rate, rate * (1 - noise), rate * (1 + noise), 0.0),
        startup_s=restart_s or 0.1,
        epoch_restart_s=[restart_s] if restart_s else [],
        main_cpu=main,
        workers_cpu=each * workers,
        workers_runq=runq * workers,
        batch_bytes=batch_bytes,
        stall_fraction=stall,
        main_uss_bytes=100 * MiB,
        workers_uss_bytes=50 * MiB * workers,
    )


def machine(**changes: Any) -> dict[str, Any]:
    facts = {
        "cpu_count": 2,
        "cpus_usable": 2,
        "cpu_quota": None,
        "shm_total_bytes": 64 * MiB,
        "shm_free_bytes": 64 * MiB,
        "open_files_soft": 1024,
        "sharing_strategy": "file_descriptor",
        "accelerator": "none",
        "accelerator_name": None,
        "accelerator_count": 0,
    }
    facts.update(changes)
    return facts


# -- bottleneck ------------------------------------------------------------------------------


def test_bottleneck_classes_from_cpu_figures() -> None:
    cpu = bottleneck_finding(trial(2, main=0.05, each=0.95), 2, False)
    assert cpu.id == "bottleneck" and cpu.severity == "info"
    assert cpu.message.startswith("CPU-bound in the workers") and "95% each" in cpu.message
    latency = bottleneck_finding(trial(8, main=0.1, each=0.05), 2, False)
    assert latency.message.startswith("latency-bound") and "more workers" in latency.fix
    main = bottleneck_finding(trial(2, main=0.95, each=0.3), 2, False)
    assert main.message.startswith("main-process-bound")


def test_ipc_bound_needs_many_bytes_and_a_busy_main_process() -> None:
    # 64 MiB batches of 64 samples at 1,000 samples/s: 1 GiB/s through shared memory.
    big = trial(2, main=0.9, each=0.4, batch_bytes=64 * MiB)
    assert classify(big, 2, batch_size=64) == "ipc"
    found = bottleneck_finding(big, 2, False, batch_size=64)
    assert found.message.startswith("IPC-bound")
    assert "1000.0 MiB/s of batches (64.0 MiB each)" in found.message
    assert "uint8" in found.fix
    small = trial(2, main=0.9, each=0.4, batch_bytes=64 * 1024)
    assert classify(small, 2, batch_size=64) == "main-process"
    idle_main = trial(2, main=0.1, each=0.95, batch_bytes=64 * MiB)
    assert classify(idle_main, 2, batch_size=64) == "cpu"


def test_workers_slower_than_none_is_ipc_or_no_workers_by_bytes() -> None:
    none = trial(0, rate=5000, main=1.0, each=0.0)
    heavy = trial(2, rate=1000, main=0.4, each=0.5, batch_bytes=16 * MiB)
    light = trial(2, rate=1000, main=0.4, each=0.5, batch_bytes=4096)
    assert classify(heavy, 2, 16, no_workers=none) == "ipc"
    assert classify(light, 2, 16, no_workers=none) == "no-workers"
    found = bottleneck_finding(light, 2, False, batch_size=16, no_workers=none)
    assert "with no workers it makes 5,000 samples/s against 1,000" in found.message
    # Within the noise, no verdict from the comparison.
    close = trial(0, rate=1010, main=1.0, each=0.0)
    assert classify(light, 2, 16, no_workers=close) != "no-workers"


def test_consumer_bound_data_bound_contention_and_uneven() -> None:
    fed = Pace(trial(2, stall=0.02), trial(2, rate=5000), 1000.0)
    found = bottleneck_finding(fed.together, 2, True, pace=fed)
    assert found.message.startswith("consumer-bound") and "2% of the time" in found.message
    assert "the loader alone makes 5,000" in found.message
    assert "the consumer alone takes 1,000" in found.message
    starved = Pace(trial(0, rate=300, stall=0.6), trial(0, rate=320, main=1.0), 1000.0)
    found = bottleneck_finding(starved.together, 2, True, pace=starved)
    assert found.message.startswith("data-bound") and "60%" in found.message
    assert "num_workers" in found.fix  # no workers: move the work into workers
    competing = Pace(trial(2, rate=600, stall=0.3), trial(2, rate=3000), 900.0, True)
    assert bottleneck_kind(competing.together, 2, pace=competing) == "contention"
    sleeping = Pace(trial(2, rate=600, stall=0.3), trial(2, rate=3000), 900.0, False)
    assert bottleneck_kind(sleeping.together, 2, pace=sleeping) == "uneven"
    # tune's use: a consumer run, nothing measured alone.
    assert bottleneck_finding(trial(2, stall=0.01), 2, True).message.startswith("consumer-bound")


def test_a_busy_main_process_is_not_fastest_without_workers_when_none_were_tried() -> None:
    # An IterableDataset whose worker count stays the user's (w=0): nothing was compared.
    alone = trial(0, rate=1570, main=1.95, each=0.0)
    assert bottleneck_finding(alone, 2, False).message.startswith("fastest without workers")
    found = bottleneck_finding(alone, 2, False, workers_tried=False)
    assert found.message.startswith("main-process-bound"), found.message
    assert "num_workers=N" in found.fix


# -- workers, start-up -------------------------------------------------------------------------


def test_worker_count_only_beyond_the_noise() -> None:
    mine, better = trial(0, rate=400), trial(2, rate=800)
    few = worker_count_finding(mine, better)
    assert few is not None and few.id == "too-few-workers" and few.severity == "warning"
    assert "400 samples/s lost" in few.message and "num_workers=2" in few.fix
    many = worker_count_finding(trial(8, rate=400), trial(2, rate=800))
    assert many is not None and many.id == "too-many-workers"
    noisy = trial(2, rate=800, noise=1.1)  # 800 ± 110%: not beyond 400
    assert worker_count_finding(mine, noisy) is None
    assert worker_count_finding(trial(2, rate=400), trial(2, rate=800)) is None
    assert "most measured" not in few.message
    # The most workers the doctor measured, mostly waiting: more may give more still.
    growing = worker_count_finding(trial(4, rate=195), trial(8, rate=393, each=0.01), True)
    assert growing is not None and "8 is the most measured here" in growing.message
    assert "feedrate tune" in growing.message


def test_workers_past_the_cpus_are_explained_with_the_warning_they_raise() -> None:
    past = workers_past_cpus_finding(trial(0, rate=90), trial(32, rate=3000), cpus=2)
    assert past is not None and past.id == "workers-past-cpus" and past.severity == "info"
    assert "num_workers=32 is above the 2 usable CPUs" in past.message
    assert "DataLoader will warn" in past.message and "allow_many_workers" in past.fix
    assert workers_past_cpus_finding(trial(0, rate=90), trial(2, rate=300), cpus=2) is None


def test_worker_count_with_a_consumer_is_about_the_stall() -> None:
    starved, fed = trial(0, rate=300, stall=0.5), trial(2, rate=600, stall=0.01)
    few = consumer_worker_finding(starved, fed)
    assert few is not None and few.id == "too-few-workers" and "50% of the time" in few.message
    many = consumer_worker_finding(trial(8, rate=600, stall=0.0), fed)
    assert many is not None and many.id == "too-many-workers" and many.severity == "info"
    assert "less memory" in many.message
    assert consumer_worker_finding(fed, trial(4, rate=600, stall=0.0)) is None
    assert consumer_worker_finding(starved, trial(4, rate=400, stall=0.3)) is None


def test_startup_cost_with_its_cause() -> None:
    mine = trial(4, rate=1000, persistent=False, restart_s=0.8)
    cause = startup_cause("spawn", init_s=0.5, age_s=0.8, pickled=300 * MiB)
    assert cause is not None and "worker_init_fn takes 0.50 s" in cause
    assert "under spawn every worker imports" in cause
    assert "unpickles the dataset (300.0 MiB)" in cause
    found = startup_finding(mine, epoch_samples=10_000, cause=cause)
    assert found is not None and found.id == "startup-cost" and found.severity == "warning"
    assert "0.80 s" in found.message and cause in found.message
    assert "persistent_workers=True" in found.fix
    kept = trial(4, rate=1000, persistent=True, restart_s=0.8)
    assert startup_finding(kept, epoch_samples=10_000) is None
    assert startup_cause("fork", init_s=0.001, age_s=0.05, pickled=None) is None


# -- machine -----------------------------------------------------------------------------------


def test_cpu_quota_and_pin_memory_without_accelerator() -> None:
    quota = cpu_quota_finding(machine(cpu_count=64, cpu_quota=4.0, cpus_usable=4))
    assert quota is not None and "4 CPUs but os.cpu_count() says 64" in quota.message
    assert cpu_quota_finding(machine()) is None
    pinned = Trial(LoaderConfig(2, pin_memory=True), "yours")
    assert pin_memory_finding(pinned, machine()) is not None
    assert pin_memory_finding(pinned, machine(accelerator="cuda")) is None


def test_pin_memory_unused_with_an_accelerator() -> None:
    gpu = machine(accelerator="cuda", accelerator_count=1, accelerator_name="NVIDIA H200")
    big = pin_memory_unused_finding(LoaderConfig(2), gpu, 8 * MiB)
    assert big is not None and big.id == "pin-memory-unused" and big.severity == "warning"
    assert "cuda × 1 (NVIDIA H200)" in big.message and "8.0 MiB" in big.message
    assert "not timed here" in big.message and "pin_memory=True" in big.fix
    small = pin_memory_unused_finding(LoaderConfig(2), gpu, 4096)
    assert small is not None and small.severity == "info"
    assert pin_memory_unused_finding(LoaderConfig(2, True), gpu, MiB) is None
    assert pin_memory_unused_finding(LoaderConfig(2), machine(), MiB) is None


def test_shm_too_small() -> None:
    cfg = LoaderConfig(4, prefetch_factor=2)  # 8 batches in flight
    over = shm_finding(cfg, machine(shm_free_bytes=60 * MiB), 10 * MiB)
    assert over is not None and over.id == "shm-too-small" and over.severity == "error"
    assert "60.0 MiB free" in over.message and "8 batches of 10.0 MiB" in over.message
    assert "SIGBUS" in over.message and "--shm-size=1g" in over.fix and "--ipc=host" in over.fix
    tight = shm_finding(cfg, machine(shm_free_bytes=100 * MiB), 10 * MiB)
    assert tight is not None and tight.severity == "warning"
    assert shm_finding(cfg, machine(shm_free_bytes=2**30), 10 * MiB) is None
    assert shm_finding(LoaderConfig(0), machine(shm_free_bytes=1), MiB) is None
    assert shm_finding(cfg, machine(shm_free_bytes=None), MiB) is None
    ours = shm_finding(cfg, machine(shm_free_bytes=MiB), MiB, suggested=True)
    assert ours is not None and "the suggested 4 workers" in ours.message


def test_task_limit_names_the_processes_and_threads_left() -> None:
    cfg = LoaderConfig(32, prefetch_factor=2)  # 32 workers of about 4 tasks: 128
    low = task_limit_finding(cfg, machine(tasks_free=90))  # even 3 each (96) would not fit
    assert low is not None and low.id == "task-limit" and low.severity == "error"
    assert "only 90 more processes and threads" in low.message
    assert "Resource temporarily unavailable" in low.message
    assert "num_workers=18 or fewer" in low.fix and "--pids-limit" in low.fix
    near = task_limit_finding(cfg, machine(tasks_free=100))  # 96 fit: they start, but close
    assert near is not None and near.severity == "warning"
    assert task_limit_finding(cfg, machine(tasks_free=100), at="error") is None  # not refused
    assert task_limit_finding(cfg, machine(tasks_free=150)) is not None
    assert task_limit_finding(cfg, machine(tasks_free=10_000)) is None
    assert task_limit_finding(cfg, machine(tasks_free=None)) is None
    assert task_limit_finding(LoaderConfig(0), machine(tasks_free=0)) is None
    threaded = task_limit_finding(LoaderConfig(4, threads=64), machine(tasks_free=250))
    assert threaded is not None and "about 67 each (268)" in threaded.message


def test_fd_limit_under_the_file_descriptor_strategy() -> None:
    cfg = LoaderConfig(16, prefetch_factor=4)
    low = fd_limit_finding(cfg, machine(open_files_soft=256), 3)
    assert low is not None and low.id == "fd-limit" and low.severity == "error"
    assert "open-file limit is 256" in low.message and "ulimit -n" in low.fix
    assert "file_system" in low.fix
    near = fd_limit_finding(cfg, machine(open_files_soft=330), 3)
    assert near is not None and near.severity == "warning"
    assert fd_limit_finding(cfg, machine(open_files_soft=65536), 3) is None
    other = machine(open_files_soft=16, sharing_strategy="file_system")
    assert fd_limit_finding(cfg, other, 3) is None
    assert fd_limit_finding(LoaderConfig(0), machine(open_files_soft=1), 3) is None


# -- dataset -----------------------------------------------------------------------------------


def view(worker_id: int, **changes: Any) -> WorkerView:
    base: dict[str, Any] = {
        "worker_id": worker_id,
        "pid": 1000 + worker_id,
        "age_s": 0.1,
        "init_s": 0.0,
        "torch_threads": 1,
        "cv2_threads": None,
        "env": {},
        "os_threads": 3,
        "draws": {},
    }
    base.update(changes)
    return WorkerView(**base)


def test_shared_rng_from_equal_draws() -> None:
    same = {"rng": ("numpy.random.Generator", "42")}
    found = checks_dataset.shared_rng_finding([view(0, draws=same), view(1, draws=same)], 4)
    assert found is not None and found.id == "shared-rng" and found.severity == "error"
    assert "self.rng (numpy.random.Generator)" in found.message and "drew 42" in found.message
    assert "np.random.default_rng(torch.initial_seed())" in found.fix
    assert "worker_init_fn" in found.fix
    latent = checks_dataset.shared_rng_finding([view(0, draws=same), view(1, draws=same)], 0)
    assert latent is not None and latent.severity == "warning"
    differ = [view(0, draws=same), view(1, draws={"rng": ("numpy.random.Generator", "7")})]
    assert checks_dataset.shared_rng_finding(differ, 4) is None
    undrawable = {"g": ("torch.Generator", None)}
    assert checks_dataset.shared_rng_finding([view(0, draws=undrawable)] * 2, 4) is None
    assert checks_dataset.shared_rng_finding([view(0, draws=same)], 4) is None
    seeded = {"<numpy.random>": ("numpy.random (global)", "99")}
    common = checks_dataset.shared_rng_finding([view(0, draws=seeded), view(1, draws=seeded)], 2)
    assert common is not None and "the global generator numpy.random (global)" in common.message
    assert "np.random.seed(torch.initial_seed() % 2**32)" in common.fix
    assert "self." not in common.message and "ds." not in common.fix


def digests(a: list[str], b: list[str]) -> StreamDigests:
    return StreamDigests({0: a, 1: b}, seconds=0.1, complete=True)


def test_iterable_duplicates_by_content() -> None:
    items = [f"d{i}" for i in range(32)]
    found = checks_dataset.duplicates_finding(digests(items, items), 4)
    assert found is not None and found.id == "iterable-duplicates" and found.severity == "error"
    assert "32 of the 32 distinct items" in found.message and "get_worker_info" in found.fix
    latent = checks_dataset.duplicates_finding(digests(items, items), 0)
    assert latent is not None and latent.severity == "warning"
    assert checks_dataset.duplicates_finding(digests(items[::2], items[1::2]), 4) is None
    assert checks_dataset.duplicates_finding(digests(["x"] * 32, ["x"] * 32), 4) is None
    assert checks_dataset.duplicates_finding(digests(items, []), 4) is None


def memory_run(early: int, late: int, fraction_batches: int = 100) -> SampleRun:
    workers = [WorkerMemory(i, 1000 + i, early, late, 3) for i in range(2)]
    return SampleRun(fraction_batches, 100, 2.0, 1.8, workers, 1, 4096)


def test_copy_on_read_needs_growth_and_python_containers() -> None:
    held = [Container("records", "list", 1_000_000, 3_000_000, 150 * MiB, "tuple")]
    found = checks_dataset.copy_on_read_finding(held, memory_run(20 * MiB, 90 * MiB))
    assert found is not None and found.id == "copy-on-read" and found.severity == "warning"
    assert "worker 0 20.0 MiB → 90.0 MiB" in found.message
    assert "self.records: list of 1,000,000 tuple" in found.message
    assert "100% of an epoch" in found.message
    assert "self.records = np.array" in found.fix
    assert checks_dataset.copy_on_read_finding(held, memory_run(20 * MiB, 21 * MiB)) is None
    assert checks_dataset.copy_on_read_finding([], memory_run(20 * MiB, 90 * MiB)) is None
    assert checks_dataset.copy_on_read_finding(held, None) is None
    # A small container needs less growth: a quarter of its size, but above the noise floor.
    small = [Container("names", "list", 20_000, 20_000, 8 * MiB, "str")]
    grown = memory_run(20 * MiB, 26 * MiB)
    assert checks_dataset.copy_on_read_finding(small, grown) is not None


@pytest.mark.parametrize(
    ("changes", "workers", "expected"),
    [
        ({"torch_threads": 4}, 2, True),
        ({"cv2_threads": 8}, 2, True),
        ({"env": {"OMP_NUM_THREADS": "16"}}, 1, True),
        ({}, 8, False),
        ({"torch_threads": 2}, 1, False),
        ({"torch_threads": 4}, 0, False),
        # numpy's OpenBLAS with no variable set: one thread per core, no variable says so.
        ({"pools": {"openblas": 2}}, 4, True),
        ({"pools": {"openblas": 1}}, 8, False),
    ],
)
def test_thread_oversubscription(changes: dict[str, Any], workers: int, expected: bool) -> None:
    views = [view(0, **changes), view(1, **changes)]
    found = checks_dataset.thread_finding(views, memory_run(MiB, MiB), workers, cpus=2)
    assert (found is not None) == expected
    if found is not None:
        assert found.id == "thread-oversubscription" and "on 2 usable CPUs" in found.message
        assert "torch.set_num_threads(1)" in found.fix
        if "cv2_threads" in changes:
            assert "cv2.setNumThreads(1)" in found.fix and "OpenCV 8" in found.message
        if "env" in changes:
            assert "OMP_NUM_THREADS=16" in found.message and "OMP_NUM_THREADS=1" in found.fix
        if "pools" in changes:
            assert "OpenBLAS 2" in found.message
            assert "threadpoolctl.threadpool_limits(1)" in found.fix
        assert "unset" not in found.fix  # unset, OpenBLAS and OpenMP run one thread per core


def test_data_stall_with_a_consumer() -> None:
    found = data_stall_finding(trial(2, rate=600, stall=0.3), "more workers")
    assert found is not None and found.id == "data-stall" and found.severity == "warning"
    assert "waits for data 30% of the time: 600 samples/s reach it" in found.message
    assert found.fix == "more workers"
    assert data_stall_finding(trial(2, stall=0.03), "x") is None
    assert data_stall_finding(trial(2), "x") is None


def test_busy_machine_from_cpus_others_kept_busy() -> None:
    quiet = trial(2, main=0.1, each=0.9)
    quiet.system_busy_cpus = 2.0  # all of it ours
    assert busy_machine_finding([quiet], 2) is None
    busy = trial(2, main=0.1, each=0.4)
    busy.system_busy_cpus = 1.9  # 1.0 CPU someone else's
    found = busy_machine_finding([quiet, busy], 2)
    assert found is not None and found.id == "busy-machine" and found.severity == "info"
    assert "1.0 of the 2 usable CPUs busy while w=2 pf=2 persistent was measured" in found.message
    assert busy_machine_finding([trial(2)], 2) is None  # not known


def test_one_loaded_trial_among_quiet_ones_is_named() -> None:
    # Judged trial by trial: an average over four quiet trials would hide the one that others
    # loaded, and that one alone can flip "2 workers" against "none".
    quiet = [trial(w, main=0.1, each=0.2) for w in (0, 1, 3)]
    for t in quiet:
        t.system_busy_cpus = t.main_cpu + t.workers_cpu
    loaded = trial(2, main=0.1, each=0.4)
    loaded.system_busy_cpus = 1.9
    found = busy_machine_finding([*quiet, loaded], 2)
    assert found is not None and "while w=2 pf=2 persistent was measured" in found.message


def test_check_failed_names_the_check_and_what_it_took_down() -> None:
    found = check_failed_finding("memory run", "ValueError: bad", ["throughput"])
    assert found.id == "check-failed" and found.severity == "warning"
    assert "the memory run failed: ValueError: bad" in found.message
    assert "not run because of it: throughput" in found.message


def test_advice_is_said_for_the_loader_it_is_for() -> None:
    found = [
        Finding(
            "too-few-workers", "warning", "num_workers=0 ...", "DataLoader(..., num_workers=4)"
        ),
        Finding("shared-rng", "warning", "...", "(DataLoader(..., worker_init_fn=worker_init_fn))"),
    ]
    assert for_loader(found, "DataLoader") == found
    litdata = for_loader(found, "StreamingDataLoader")
    assert litdata[0].fix == "StreamingDataLoader(..., num_workers=4)"
    assert litdata[1].fix == "(StreamingDataLoader(..., worker_init_fn=worker_init_fn))"
    trainer = for_loader(found, "TrainingArguments")
    assert trainer[0].fix == "TrainingArguments(..., dataloader_num_workers=4)"
    assert trainer[1] == found[1]  # TrainingArguments has no word for it: said of the DataLoader
    pinned = "`DataLoader(..., pin_memory=True, prefetch_factor=2)` and batch.to(device)"
    assert in_words_of("TrainingArguments", pinned) == (
        "`TrainingArguments(..., dataloader_pin_memory=True, dataloader_prefetch_factor=2)` "
        "and batch.to(device)"
    )


def test_threads_would_help_says_faster_only_where_threads_were_faster() -> None:
    """Threads beyond the noise of the recommendation are 'faster'; a tie on half the worker
    memory is 'as fast', its ratio under 1 no claim of a gain (QA read '0.99×' under the word
    'better'); a tie on as much memory is no finding."""
    space = Space(2, LoaderConfig(0), 128)
    best = trial(8, 1000.0)  # 400 MiB of workers

    def threaded(rate: float, workers: int) -> Trial:
        t = trial(workers, rate)
        return replace(t, config=replace(t.config, threads=8))

    faster = thread_findings(space, None, [best, threaded(1500.0, 8)], best)
    assert [f.id for f in faster] == ["threads-would-help"]
    assert "measured faster than the recommendation" in faster[0].message
    tie = thread_findings(space, None, [best, threaded(990.0, 2)], best)
    assert [f.id for f in tie] == ["threads-would-help"]
    assert "as fast as (within the noise)" in tie[0].message and "0.99×" in tie[0].message
    assert "faster" not in tie[0].message
    assert thread_findings(space, None, [best, threaded(990.0, 8)], best) == []
