"""A hanging pipeline ends with a timeout error wherever feedrate runs: in the main thread
(SIGALRM) and off it (a thread pool, a notebook's worker thread), without and with workers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils.data import DataLoader

import feedrate
from feedrate.errors import PipelineTimeoutError

from faults import fault
from pipelines import HangingDataset


@pytest.mark.parametrize(
    ("case", "workers"),
    [(fault("hang-off-the-main-thread"), 0), ("hang-in-workers-off-the-main-thread", 2)],
)
def test_a_hang_off_the_main_thread_times_out(case: str, workers: int) -> None:
    loader = DataLoader(HangingDataset(at=8), batch_size=2, num_workers=workers)
    began = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(feedrate.measure, loader, batches=50, timeout_s=2.0)
        with pytest.raises(PipelineTimeoutError, match="no batch arrived within 2 s"):
            job.result(timeout=90)
    assert time.monotonic() - began < 90  # it ended by itself, long before any outer limit


def test_a_hang_in_the_main_thread_times_out() -> None:
    with pytest.raises(PipelineTimeoutError, match=r"raise the timeout .*timeout_s"):
        feedrate.measure(DataLoader(HangingDataset(at=8), batch_size=2), batches=50, timeout_s=1.0)
