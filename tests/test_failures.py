"""Each failure a pipeline can have, provoked on purpose: the message names the problem, and no
worker process outlives the test (the autouse ``no_leaks`` fixture checks that)."""

from __future__ import annotations

import pickle
import signal
import time

import pytest
from torch.utils.data import DataLoader

from feedrate.errors import PipelineError, PipelineTimeoutError, WorkerKilledError
from feedrate.loader.config import LoaderConfig
from feedrate.measuring.diagnosis import explain
from feedrate.measuring.failures import IndexReportingDataset, Watchdog
from feedrate.measuring.measure import measure

from pipelines import (
    EmptyDataset,
    FailingDataset,
    HangingDataset,
    KillingDataset,
    TinyDataset,
)


@pytest.mark.parametrize("workers", [0, 2])
def test_user_exception_names_type_message_and_index(workers: int) -> None:
    loader = DataLoader(FailingDataset(bad_index=37), batch_size=8)
    with pytest.raises(PipelineError) as info:
        measure(loader, LoaderConfig(num_workers=workers), batches=200, timeout_s=30)
    msg = str(info.value)
    assert "ValueError: corrupt record 37" in msg
    assert "sample index 37" in msg
    assert ("in worker" in msg) if workers else ("in the main process" in msg)
    assert "pipelines.py" in msg  # the user's own frame
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("signum", "cause"),
    [(signal.SIGKILL, "out-of-memory"), (signal.SIGBUS, "/dev/shm"), (signal.SIGSEGV, "native")],
)
def test_worker_killed_by_signal_names_signal_and_cause(signum: int, cause: str) -> None:
    loader = DataLoader(KillingDataset(at=40, signum=signum), batch_size=8)
    with pytest.raises(WorkerKilledError) as info:
        measure(loader, LoaderConfig(num_workers=2), batches=200, timeout_s=30)
    msg = str(info.value)
    assert signal.Signals(signum).name in msg
    assert cause in msg


def test_hang_ends_at_timeout_with_message() -> None:
    loader = DataLoader(HangingDataset(at=40), batch_size=8)
    start = time.monotonic()
    with pytest.raises(PipelineTimeoutError) as info:
        measure(loader, LoaderConfig(num_workers=2), batches=200, timeout_s=1.5)
    assert "no batch arrived within 1.5 s" in str(info.value)
    assert time.monotonic() - start < 30  # generous: it must end, not be fast


def test_hang_in_main_process_ends_at_timeout() -> None:
    loader = DataLoader(HangingDataset(at=40), batch_size=8)
    with pytest.raises(PipelineTimeoutError):
        measure(loader, LoaderConfig(num_workers=0), batches=200, timeout_s=1.0)


def test_empty_loader_is_reported() -> None:
    with pytest.raises(PipelineError, match="yielded no batch"):
        measure(DataLoader(EmptyDataset(), batch_size=4), batches=10)


def test_index_reporting_dataset_is_transparent() -> None:
    inner = TinyDataset(10)
    wrapped = IndexReportingDataset(inner)
    assert len(wrapped) == 10
    assert wrapped[3].tolist() == inner[3].tolist()
    assert [t[0].item() for t in wrapped.__getitems__([1, 2])] == [1.0, 2.0]
    wrapped.width = 3  # writes reach the user's dataset
    assert inner.width == 3
    clone = pickle.loads(pickle.dumps(wrapped))
    assert clone[2].tolist() == [2.0, 2.0, 2.0]


def test_index_reporting_dataset_keeps_own_getitems() -> None:
    class Batched(TinyDataset):
        def __getitems__(self, indices: list[int]) -> list[str]:
            return [f"batch:{i}" for i in indices]

    assert IndexReportingDataset(Batched(4)).__getitems__([0, 3]) == ["batch:0", "batch:3"]

    class Columns(TinyDataset):  # a whole batch as columns, for its own collate_fn
        def __getitems__(self, indices: list[int]) -> dict[str, list[int]]:
            return {"index": list(indices)}

    assert IndexReportingDataset(Columns(4)).__getitems__([1, 2]) == {"index": [1, 2]}


def test_explain_ignores_keyboard_interrupt() -> None:
    assert explain(KeyboardInterrupt(), None) is None


def test_watchdog_fires_and_disarms() -> None:
    with (
        pytest.raises(PipelineTimeoutError, match="stuck here"),
        Watchdog(0.2, lambda: "stuck here"),
    ):
        time.sleep(5)
    # disarmed: no alarm arrives after the block
    time.sleep(0.3)
