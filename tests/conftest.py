"""Shared fixtures. The autouse ``no_leaks`` fixture fails any test that leaves a child process
(a DataLoader worker, a subprocess) or a non-daemon thread behind."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

from jobs import short_tmpdir


def _hold_to_cpus(count: int) -> None:
    """Run the suite on at most ``count`` CPUs (forked workers and subprocesses inherit it).
    Its pipelines and epochs are sized for CI's 2-CPU machine: on a 16-CPU one, autotune starts
    16 workers whose warm-up outlasts a test's epoch, and a latency-bound search capped at 16
    workers cannot go past the CPU count (both seen on a 16-CPU GPU machine). Held to 2 CPUs,
    what a test asserts does not depend on the host; the benchmarks measure the host as it is.
    Under pytest-xdist each worker (gw0, gw1, ...) takes the next ``count`` CPUs, wrapping."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if count <= 0 or getaffinity is None:
        return
    cpus = sorted(getaffinity(0))
    if len(cpus) <= count:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = (int(worker) if worker.isdigit() else 0) * count
    os.sched_setaffinity(0, [cpus[(first + i) % len(cpus)] for i in range(count)])
    torch.set_num_threads(min(torch.get_num_threads(), count))


def pytest_configure(config: pytest.Config) -> None:
    # Not in pytest-xdist's controller, which runs no test: its workers would inherit its CPUs
    # and all share the first ones.
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        _hold_to_cpus(int(os.environ.get("FEEDRATE_TEST_CPUS", "2")))


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A short temporary folder of the test's own (``jobs.short_tmpdir``), for ``TMPDIR``."""
    with short_tmpdir() as folder:
        yield folder


def _children() -> list[psutil.Process]:
    """Child processes, less multiprocessing's resource tracker: the first spawn-context user
    starts it, and it rightly lives as long as the test session."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if not _is_resource_tracker(p)]


def _is_resource_tracker(p: psutil.Process) -> bool:
    try:
        return any("resource_tracker" in part for part in p.cmdline())
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    before_procs = {p.pid for p in _children()}
    before_mp = set(multiprocessing.active_children())
    before_threads = set(threading.enumerate())
    yield
    # Workers get a grace period to exit: DataLoader shuts them down with a join timeout.
    deadline = time.monotonic() + 5.0
    leaked: list[psutil.Process] = []
    while True:
        leaked = [p for p in _children() if p.pid not in before_procs and _alive(p)]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in leaked:
        with contextlib.suppress(psutil.Error):
            p.kill()
    threads = [
        t
        for t in threading.enumerate()
        if t not in before_threads and t.is_alive() and not t.daemon
    ]
    assert not leaked, f"test left child processes alive: {[p.pid for p in leaked]}"
    # Reaped behind multiprocessing's back (psutil's wait_procs does it): it still counts them
    # as running, holds their pipes open, and terminates their pids again at exit.
    lost = [
        p
        for p in multiprocessing.active_children()
        if p not in before_mp and not psutil.pid_exists(p.pid)
    ]
    assert not lost, f"multiprocessing never saw these children end: {[p.pid for p in lost]}"
    assert not threads, f"test left threads alive: {[t.name for t in threads]}"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def end_persistent_workers() -> Iterator[None]:
    """For test modules whose loaders keep persistent workers (``pytestmark =
    pytest.mark.usefixtures("end_persistent_workers")``): those workers outlive the loop until
    their loader goes, so end them after the test even when a failed assertion keeps the loader
    alive in its traceback (the leak check would kill them under the loader, which then raises
    in the middle of the report)."""
    yield
    for obj in gc.get_objects():
        if issubclass(type(obj), DataLoader) and obj._iterator is not None:
            obj._iterator = None  # its iterator's __del__ shuts the workers down
