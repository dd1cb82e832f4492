"""The Docker /dev/shm trap: the batches in flight predicted from one batch made in the main
process against /dev/shm free before anything risky runs (the doctor, tune and autotune do not
start a configuration predicted to overflow it, and say so); a run that dies of it named
``shm-too-small`` with the fixes. The machine facts stand in for a small /dev/shm where nothing
needs to run; where the test may mount one (root, a private mount namespace), a real 64 MiB
tmpfs over /dev/shm shows the whole trap through the command line."""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler

from feedrate.autotuning.start import starting_point
from feedrate.checks.machine import shm_finding, shm_fitting
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring.diagnosis import explain, hint, shm_exhausted
from feedrate.measuring.shm import main_process_batch
from feedrate.workflows import doctor as doctoring
from feedrate.workflows.doctor_trials import refuse_overflow

from faults import (
    BigSamples,
    ShmFullInWorkers,
    fault,
    one_shot_sampler,
    small_shm_unavailable,
    with_small_shm,
    write_target,
)
from pipelines import BusyDataset, SleepDataset, TinyDataset

MiB = 2**20
QUICK: dict[str, Any] = {"trial_seconds": 0.3, "timeout_s": 20.0}
#: DataLoader's own words when a loader has more workers than it suggests.
RAW_WARNING = "suggested max number of worker"


def facts(**changes: Any) -> MachineFacts:
    return dataclasses.replace(collect(), **changes)


def big(workers: int = 4, prefetch: int = 4, sample_bytes: int = 2 * MiB) -> DataLoader[Any]:
    """Batches of 4 samples: 8 MiB by default, 16 of them in flight at 4 workers, prefetch 4."""
    return DataLoader(
        BigSamples(sample_bytes=sample_bytes),
        batch_size=4,
        num_workers=workers,
        prefetch_factor=prefetch,
    )


# -- the prediction's evidence and its rule -----------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_batch_is_made_in_the_main_process() -> None:
    loader = big(sample_bytes=MiB // 4)
    dataset = loader.dataset
    assert isinstance(dataset, BigSamples)
    dataset.pids = []
    made = main_process_batch(loader)
    assert made.bytes == 4 * (MiB // 4) and made.tensors == 1
    assert dataset.pids == [os.getpid()] * 4  # no worker made any of it


def test_the_batch_says_how_much_of_its_time_was_on_a_cpu() -> None:
    # 16 waits of 3 ms: a few percent on a CPU (the collate's); 16 spins of 2 ms: nearly all
    # (the test's wait for a CPU on a busy machine left out, where schedstat shows it); a batch
    # made within MIN_TIMED_S says too little.
    waiting = main_process_batch(DataLoader(SleepDataset(64, sleep_s=0.003), batch_size=16))
    assert waiting.cpu_share is not None and waiting.cpu_share < 0.15
    assert main_process_batch(DataLoader(TinyDataset(64), batch_size=4)).cpu_share is None
    if Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        busy = main_process_batch(DataLoader(BusyDataset(64, cpu_s=0.002), batch_size=16))
        assert busy.cpu_share is not None and busy.cpu_share > 0.5


class FirstCalls(torch.utils.data.Dataset[torch.Tensor]):
    """Items that wait 5 ms each; the first spins 10 ms of CPU before, as first calls do."""

    def __init__(self) -> None:
        self.first = True

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.first:
            self.first = False
            end = time.thread_time() + 0.01
            while time.thread_time() < end:
                pass
        time.sleep(0.005)
        return torch.tensor([float(i)])


def test_a_short_first_batch_s_first_calls_are_not_read_as_the_pipeline_s_cpu() -> None:
    # 4 waits of 5 ms a batch; the first batch also spins 10 ms of first calls: a third of its
    # time on a CPU, against a few percent for the batches after it. Asked to, the share is read
    # from the second batch.
    retimed = main_process_batch(DataLoader(FirstCalls(), batch_size=4), retime_below_s=0.25)
    assert retimed.cpu_share is not None and retimed.cpu_share < 0.15, retimed.cpu_share
    if Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        first = main_process_batch(DataLoader(FirstCalls(), batch_size=4))
        assert first.cpu_share is not None and first.cpu_share > 0.15, first.cpu_share


def test_the_batch_leaves_the_random_state_and_a_one_shot_sampler_alone() -> None:
    def seeded() -> DataLoader[Any]:
        gen = torch.Generator().manual_seed(3)
        return DataLoader(list(range(32)), batch_size=4, shuffle=True, generator=gen)

    loader = seeded()
    assert main_process_batch(loader).bytes == 4 * 8
    assert [b.tolist() for b in loader] == [b.tolist() for b in seeded()]  # same order
    before = torch.get_rng_state(), random.getstate()
    main_process_batch(DataLoader(list(range(32)), batch_size=4, shuffle=True))
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    fault("one-shot-sampler-before-a-run")
    once = DataLoader(list(range(64)), batch_size=4, sampler=one_shot_sampler(64))
    assert main_process_batch(once).bytes is None
    assert len(list(once)) == 16  # the user's run still gets every batch


def test_the_batch_leaves_a_shuffling_sampler_inside_a_batch_sampler_alone() -> None:
    # As accelerate shards a loader on several processes: DataLoader(batch_sampler=
    # BatchSamplerShard(BatchSampler(RandomSampler(generator=g)))), whose own sampler is a
    # SequentialSampler. g draws the epoch's order as the first batch is made: it must be as it
    # was after, or the run's first epoch (and every one after) is shuffled otherwise.
    class Shard(Sampler[list[int]]):
        def __init__(self, batch_sampler: BatchSampler) -> None:
            self.batch_sampler = batch_sampler

        def __iter__(self) -> Iterator[list[int]]:
            return iter(self.batch_sampler)

        def __len__(self) -> int:
            return len(self.batch_sampler)

    def nested() -> DataLoader[Any]:
        shuffled = RandomSampler(range(32), generator=torch.Generator().manual_seed(3))
        batches = Shard(BatchSampler(shuffled, batch_size=4, drop_last=False))
        return DataLoader(list(range(32)), batch_sampler=batches)

    loader = nested()
    assert main_process_batch(loader).bytes == 4 * 8
    assert [b.tolist() for b in loader] == [b.tolist() for b in nested()]  # same order


def test_the_nearest_configuration_that_fits() -> None:
    machine = {"shm_free_bytes": 64 * MiB}
    over = LoaderConfig(4, prefetch_factor=4)
    assert shm_finding(over, machine, 8 * MiB) is not None
    # 64 MiB holds 5 batches of 8 MiB with headroom: fewer workers first, then a shallower queue.
    assert shm_fitting(over, machine, 8 * MiB) == LoaderConfig(1, prefetch_factor=4)
    assert shm_fitting(over, machine, 16 * MiB) == LoaderConfig(1, prefetch_factor=2)
    assert shm_fitting(over, machine, 64 * MiB) == LoaderConfig(0)
    fits = LoaderConfig(2, prefetch_factor=2)
    assert shm_fitting(fits, machine, MiB) is fits


@pytest.mark.parametrize(
    "words",
    [
        "unable to allocate shared memory(shm) for file </torch_9_1_0>: No space left on "
        "device (28)",
        "unable to write to file </torch_18693_1954506_0>",
        "DataLoader worker (pid 77) is killed by signal: Bus error.",
    ],
    ids=[fault("shm-unable-to-allocate"), fault("shm-unable-to-write"), fault("shm-bus-error")],
)
def test_the_words_of_a_full_shm_are_recognised(words: str) -> None:
    assert shm_exhausted(words)
    advice = hint(words)
    assert advice is not None and "/dev/shm" in advice
    for fix in ("--shm-size", "--ipc=host", "emptyDir", "medium: Memory", "prefetch_factor"):
        assert fix in advice
    assert "file_system" in advice  # named, and said not to help
    error = explain(RuntimeError(words), None)
    assert isinstance(error, PipelineError) and "/dev/shm" in str(error)


def test_other_failures_are_not_taken_for_it() -> None:
    for words in ("[Errno 28] No space left on device: '/data/cache'", "CUDA out of memory"):
        assert not shm_exhausted(words)


# -- the doctor -----------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_doctor_predicts_it_before_running_anything_risky() -> None:
    loader = big(sample_bytes=MiB // 4)  # batches of 1 MiB, 16 in flight
    docker = {"shm_free_bytes": 8 * MiB, "shm_total_bytes": 8 * MiB}
    report = doctoring.doctor(loader, machine=docker, **QUICK)
    shm = report.finding("shm-too-small")
    assert shm is not None and shm.severity == "error", report.findings
    assert "16 batches of 1.0 MiB" in shm.message and "8.0 MiB free" in shm.message
    assert "--shm-size" in shm.fix and "--ipc=host" in shm.fix and "emptyDir" in shm.fix
    assert "num_workers × prefetch_factor ≤ 5" in shm.fix and "file_system" in shm.fix
    runs = {c.name: c for c in report.checks}
    assert runs["batch"].status == "ok"
    for risky in ("memory", "performance"):
        assert runs[risky].status == "skipped" and "overflow /dev/shm" in runs[risky].detail
    assert report.pipeline_error is None and report.finding("check-failed") is None
    roomy = doctoring.doctor(loader, checks=["shm-too-small"], machine={"shm_free_bytes": 2**34})
    assert roomy.finding("shm-too-small") is None


def test_a_run_that_dies_of_it_is_named() -> None:
    fault("shm-full-in-a-worker")
    loader = DataLoader(ShmFullInWorkers(), batch_size=4, num_workers=2)
    report = doctoring.doctor(loader, machine={"shm_free_bytes": 2**34}, **QUICK)
    assert report.pipeline_error is not None and "/dev/shm" in report.pipeline_error
    shm = report.finding("shm-too-small")
    assert shm is not None and shm.severity == "error"
    assert "memory run" in shm.message and "died because /dev/shm ran out" in shm.message
    assert "--shm-size" in shm.fix and "--ipc=host" in shm.fix
    assert report.findings[0].id == "shm-too-small"  # before the check-failed that goes with it


# -- tune and autotune ----------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_tune_does_not_start_a_configuration_that_would_overflow() -> None:
    fault("tune-baseline-over-shm")
    loader = big(sample_bytes=MiB // 4)
    dataset = loader.dataset
    assert isinstance(dataset, BigSamples)
    dataset.pids = []
    small = facts(shm_free_bytes=8 * MiB)
    config = LoaderConfig(4, prefetch_factor=4)
    with pytest.raises(PipelineError, match=r"w=4 pf=4 not started, shm-too-small: .* --shm-size"):
        refuse_overflow(loader, config, small)
    assert set(dataset.pids) == {os.getpid()}  # sized in the main process, no worker started
    refuse_overflow(loader, config, facts(shm_free_bytes=2**34))
    refuse_overflow(loader, LoaderConfig(0), small)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_autotune_starts_within_shm_and_says_so() -> None:
    fault("autotune-start-over-shm")
    loader = big(sample_bytes=MiB // 4)
    small = facts(shm_free_bytes=8 * MiB, cpus_usable=4)
    start = starting_point(
        loader, small, max_workers=None, allow_threads=False, use_cache=False, split=True
    )
    assert start.config.num_workers * (start.config.prefetch_factor or 0) <= 5
    assert shm_finding(start.config, small.to_dict(), MiB) is None
    assert "shm-too-small" in start.started_from and "lowered from w=4 pf=4" in start.started_from
    roomy = starting_point(
        loader,
        facts(shm_free_bytes=2**34),
        max_workers=None,
        allow_threads=False,
        use_cache=False,
        split=True,
    )
    assert roomy.config.num_workers == 4 and roomy.started_from == "your settings"


# -- a real 64 MiB /dev/shm -----------------------------------------------------------------------

_NO_MOUNT = small_shm_unavailable()
needs_mount = pytest.mark.skipif(_NO_MOUNT is not None, reason=_NO_MOUNT or "")

BIG_TARGET = (
    "from torch.utils.data import DataLoader\nfrom faults import BigSamples\n"
    "loader = DataLoader(BigSamples(), batch_size=4, num_workers=4, prefetch_factor=4)\n"
)


@needs_mount
def test_a_docker_sized_shm_is_named_by_the_doctor(tmp_path: Path) -> None:
    fault("docker-default-shm")
    target = write_target(tmp_path, BIG_TARGET)
    done = with_small_shm(64, sys.executable, "-m", "feedrate", "doctor", f"{target}:loader")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out  # it ran: nothing it started died
    assert "error   shm-too-small" in done.stdout and "64.0 MiB free" in done.stdout, out
    assert "check-failed" not in out
    assert RAW_WARNING not in out


@needs_mount
def test_a_run_that_overflows_a_real_shm_is_recognised(tmp_path: Path) -> None:
    fault("docker-default-shm-overflowed")
    # The facts claim a roomy /dev/shm, so the doctor starts the runs and one dies of it.
    script = tmp_path / "overflow.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import warnings\nwarnings.simplefilter('ignore')\n"
        "from torch.utils.data import DataLoader\nfrom faults import BigSamples\n"
        "from feedrate.workflows.doctor import doctor\n"
        "loader = DataLoader(BigSamples(), batch_size=4, num_workers=4, prefetch_factor=4)\n"
        "report = doctor(loader, machine={'shm_free_bytes': 2**40}, trial_seconds=0.3)\n"
        "shm = report.finding('shm-too-small')\n"
        "print(shm.severity if shm else None, shm.message if shm else None)\n"
        "print(report.pipeline_error)\n"
    )
    done = with_small_shm(64, sys.executable, str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    first, error = done.stdout.splitlines()[:2]
    assert first.startswith("error ") and "died because /dev/shm ran out" in first, done.stdout
    assert "/dev/shm" in error and "--shm-size" in error
