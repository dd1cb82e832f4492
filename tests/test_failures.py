"""Each failure a pipeline can have, provoked on purpose: the message names the problem, and no
worker process outlives the test (the autouse ``no_leaks`` fixture checks that)."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from torch.utils.data import DataLoader

from feedrate.errors import PipelineError, PipelineTimeoutError, WorkerKilledError
from feedrate.loader.config import LoaderConfig
from feedrate.measuring.diagnosis import explain
from feedrate.measuring.failures import IndexReportingDataset, Watchdog, stop_workers
from feedrate.measuring.measure import measure

from commands import feedrate_cli
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


def test_a_second_report_of_the_death_during_clean_up_keeps_the_named_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch's SIGCHLD handler may report the dead worker again while feedrate is still finding
    # the iterator to unwatch (a gc walk): that report used to escape raw, in place of
    # WorkerKilledError. Here it lands there, on purpose, every time.
    import sys

    from feedrate.measuring import failures

    real = failures.real_iterator
    reported: list[bool] = []

    def reporting_once(it: object) -> object:
        if sys._getframe(1).f_code.co_name == "quiesce" and not reported:
            reported.append(True)
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error. ")
        return real(it)

    monkeypatch.setattr(failures, "real_iterator", reporting_once)
    loader = DataLoader(KillingDataset(at=40, signum=signal.SIGBUS), batch_size=8)
    with pytest.raises(WorkerKilledError) as info:
        measure(loader, LoaderConfig(num_workers=2), batches=200, timeout_s=30)
    assert reported, "the report never landed in quiesce"
    assert "SIGBUS" in str(info.value)


def test_a_crash_in_the_main_process_shows_where_it_happened(
    tmp_path: Path, short_tmp: str
) -> None:
    # No worker to report it: the process itself dies (num_workers=0). It used to end with
    # nothing printed at all; now with the Python line of the dataset that crashed.

    from faults import write_target

    target = write_target(
        tmp_path,
        "import os, signal, torch\nfrom torch.utils.data import DataLoader, Dataset\n"
        "class Crashes(Dataset):\n"
        "    def __len__(self): return 512\n"
        "    def __getitem__(self, i):\n"
        "        if i >= 40: os.kill(os.getpid(), signal.SIGSEGV)  # a native crash\n"
        "        return torch.zeros(8)\n"
        "loader = DataLoader(Crashes(), batch_size=16)\n",
    )
    # A process killed by a signal cleans nothing up: its multiprocessing folder stays in TMPDIR.
    env = {**os.environ, "TMPDIR": short_tmp}
    done = feedrate_cli("measure", f"{target}:loader", "--seconds", "1", env=env, timeout=120)
    assert done.returncode == -signal.SIGSEGV
    assert "Segmentation fault" in done.stderr
    line = next(i for i, t in enumerate(target.read_text().splitlines(), 1) if "native" in t)
    assert f'File "{target}", line {line} in __getitem__' in done.stderr, done.stderr


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


@pytest.fixture
def private_temp(monkeypatch: pytest.MonkeyPatch, short_tmp: str) -> Iterator[Path]:
    """The temporary directory that workers forked from now on see: a short folder of the
    test's own (sockets' paths are short). The folder ``multiprocessing`` made in the real one
    for this process, if any, is forgotten for the test, or the workers would share it (a
    forked child inherits its parent's) and make none; one made during the test is removed
    after it, by the finalizer that would have removed it at exit."""
    monkeypatch.setattr(tempfile, "tempdir", short_tmp)
    config = multiprocessing.current_process()._config
    monkeypatch.setitem(config, "tempdir", None)
    yield Path(short_tmp)
    made = config.get("tempdir")
    for finalizer in list(multiprocessing.util._finalizer_registry.values()):
        if made is not None and made in (getattr(finalizer, "_args", None) or ()):
            finalizer()


def _leftover_pymp(folder: Path) -> list[str]:
    ours = multiprocessing.current_process()._config.get("tempdir")
    return sorted(str(p) for p in folder.glob("pymp-*") if str(p) != ours)


@pytest.mark.parametrize("persistent", [False, True])
def test_stopped_workers_leave_no_folder_in_the_temporary_directory(
    private_temp: Path, persistent: bool
) -> None:
    # Each worker that sends a tensor makes a pymp-* folder for torch's file-descriptor sharing;
    # a worker ended by a signal leaves it behind (autotune ends one set per configuration it
    # drops: 163 folders in one run of test_autotune.py before the fix). Idle workers asked to
    # leave remove their own. The grace is long so that a loaded machine cannot fail the test.
    loader = DataLoader(
        TinyDataset(16),
        batch_size=2,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context="fork",  # the workers see this test's temporary directory
    )
    it = iter(loader)
    for _ in range(3):
        next(it)
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    assert len(_leftover_pymp(private_temp)) >= 1  # the workers made theirs: the test can fail
    stop_workers(it, grace_s=20.0)
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert _leftover_pymp(private_temp) == []


def test_workers_ended_by_a_signal_leave_no_folder_in_the_temporary_directory(
    private_temp: Path,
) -> None:
    # Hung workers are terminated at the timeout, and a worker ended by a signal cleans nothing
    # up. measure() gives this process its pymp-* folder before the workers start, so they put
    # their sockets there (removed when this process exits) rather than each in a folder of its
    # own, left in /tmp for good (2 per run of this test before).
    loader = DataLoader(HangingDataset(at=40), batch_size=8)
    with pytest.raises(PipelineTimeoutError):  # long enough for batches on a loaded machine
        measure(loader, LoaderConfig(num_workers=2), batches=200, timeout_s=10)
    assert _leftover_pymp(private_temp) == []
    ours = Path(multiprocessing.current_process()._config["tempdir"])
    assert ours.parent == private_temp
    assert list(ours.glob("listener-*"))  # the workers' sockets: they did use it


def _open_pipes() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc/self/fd")
@pytest.mark.parametrize("hung", [False, True], ids=["idle", "hung"])
def test_stopped_workers_are_reaped_and_their_pipes_closed(hung: bool) -> None:
    # Reaped by psutil, workers stayed among multiprocessing's children for good, each with two
    # pipes open: autotune's tests left about 14 descriptors each, and a serial test session
    # went past the 1,024 that select() accepts. Hung workers are terminated, idle ones leave.
    dataset = HangingDataset(at=4) if hung else TinyDataset(16)
    before = _open_pipes()
    loader = DataLoader(dataset, batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    workers = list(it._workers)  # type: ignore[attr-defined]
    stop_workers(it, grace_s=5.0 if not hung else 1.0)
    assert all(w.exitcode is not None for w in workers)
    assert not set(multiprocessing.active_children()) & set(workers)
    del it, loader, workers
    gc.collect()
    deadline = time.monotonic() + 10.0  # a queue's feeder thread closes its end as it leaves
    while _open_pipes() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _open_pipes() <= before


def test_a_stuck_pin_memory_thread_does_not_hang_the_stop() -> None:
    # DataLoader stops its pin-memory thread before its workers: one ended mid-write can leave
    # the thread waiting for the rest of a message. Its shutdown (in stop_workers, or the
    # iterator's __del__ after) joins the thread with no bound. Pinning needs an accelerator,
    # so the thread here is a stand-in that ignores the request to stop.
    release = threading.Event()
    loader = DataLoader(TinyDataset(16), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    workers = list(it._workers)  # type: ignore[attr-defined]
    stuck = threading.Thread(target=release.wait, args=(60.0,), daemon=True)
    stuck.start()
    it._pin_memory_thread = stuck  # type: ignore[attr-defined]
    it._pin_memory_thread_done_event = threading.Event()  # type: ignore[attr-defined]
    ended = threading.Event()

    def stop_and_drop() -> None:
        nonlocal it
        stop_workers(it, grace_s=1.0)
        it = None  # type: ignore[assignment]  # its __del__ shuts it down
        gc.collect()
        ended.set()

    stopper = threading.Thread(target=stop_and_drop, daemon=True)
    stopper.start()
    try:
        assert ended.wait(30.0), "stop_workers, or the iterator's shutdown after it, hung"
        assert all(w.exitcode is not None for w in workers)
    finally:
        release.set()
        stopper.join(5.0)
