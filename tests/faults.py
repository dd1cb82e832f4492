"""Fault injection the tests share: small pipelines that each provoke one thing a user meets
(a subclass with arguments of its own, a one-shot sampler, a dataset that crashes in workers,
slow worker start-up, a pipeline that hangs), and helpers to run the command line as a user
would and to see which processes it left behind. Each fault is a few lines, so a test names the
fault it provokes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

TESTS = Path(__file__).resolve().parent

#: Every bad input or fault the suite tries, by name, so the testing docs can count them.
FAULTS: list[str] = []


def fault(name: str) -> str:
    """Register ``name`` as a fault the suite tries; returns it (use as a test's id)."""
    FAULTS.append(name)
    return name


class Squares(Dataset[torch.Tensor]):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i * i)])


class CrashInWorkers(Squares):
    """Fine in the main process; every item read in a worker process kills it (SIGSEGV)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().__getitem__(i)


def one_shot_sampler(n: int) -> Any:
    """A generator used as a sampler: it can be iterated once only."""
    return (i for i in range(n))


def write_target(tmp_path: Path, body: str, name: str = "pipe.py") -> Path:
    """A TARGET file for the command line, able to import this folder's modules."""
    path = tmp_path / name
    path.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n{body}\n")
    return path


def default_signals() -> None:
    """For a child process (``preexec_fn``): SIGINT, SIGTERM and SIGHUP as a terminal delivers
    them, whatever this run inherited (a test run started with ``&`` passes SIGINT on ignored,
    and Python then installs no handler of its own; one under ``nohup`` ignores SIGHUP, and
    feedrate then leaves it ignored, as ``nohup`` asks)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a run under nohup ignores it: a terminal not


def start_cli(*args: str) -> subprocess.Popen[str]:
    """``feedrate ARGS`` in its own process, with Python's own signal handling."""
    return subprocess.Popen(
        [sys.executable, "-m", "feedrate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )


def wait_for_children(pid: int, count: int, timeout_s: float = 90.0) -> list[psutil.Process]:
    """The process's descendants, once there are at least ``count`` of them."""
    parent = psutil.Process(pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = parent.children(recursive=True)
        if len(kids) >= count:
            return kids
        time.sleep(0.1)
    raise AssertionError(f"{pid} did not start {count} workers in {timeout_s} s")


def loader_of_slow_squares(workers: int) -> DataLoader[torch.Tensor]:
    from pipelines import SleepDataset

    return DataLoader(SleepDataset(4096, sleep_s=0.05), batch_size=4, num_workers=workers)


class BigSamples(Dataset[torch.Tensor]):
    """Samples of ``sample_bytes`` each (zeros, cheap to make): batches of 4 are 8 MiB by
    default, so 4 workers × prefetch_factor 4 keep 128 MiB in flight, twice what Docker's
    default 64 MiB /dev/shm holds. ``pids`` (when a list is given, in the main process only)
    records where each sample was made."""

    def __init__(self, n: int = 256, sample_bytes: int = 2 * 2**20) -> None:
        self.n, self.width = n, sample_bytes // 4
        self.pids: list[int] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.pids is not None:
            self.pids.append(os.getpid())
        return torch.zeros(self.width)


class ShmFullInWorkers(Squares):
    """Fine in the main process; in a worker each item fails with torch's own words for a
    full /dev/shm, as when a worker cannot allocate a batch's shared file."""

    def __getitem__(self, i: int) -> torch.Tensor:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            raise RuntimeError(
                "unable to allocate shared memory(shm) for file </torch_1_2_3>: "
                "No space left on device (28)"
            )
        return super().__getitem__(i)


def small_shm_unavailable() -> str | None:
    """Why this machine cannot give a test a small /dev/shm of its own (a tmpfs mounted over
    it in a private mount namespace), or None when it can."""
    import shutil

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a small /dev/shm needs root"
    if shutil.which("unshare") is None:
        return "mounting a small /dev/shm needs unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"cannot mount a tmpfs in a private mount namespace here: {probe.stderr.strip()}"
    return None


def with_small_shm(megabytes: int, *argv: str, timeout_s: float = 60.0) -> Any:
    """Run ``argv`` with a ``megabytes`` MiB tmpfs over /dev/shm in a private mount namespace
    (Docker's default is 64): the machine's own /dev/shm is untouched. A CompletedProcess."""
    script = f'mount -t tmpfs -o size={megabytes}m tmpfs /dev/shm && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


#: Where this machine's pids controller lets a test make a cgroup of its own (v1, then v2).
PIDS_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def pids_root() -> Path | None:
    """Where a test may make a cgroup with a ``pids.max`` of its own here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    for root in PIDS_ROOTS:
        probe = root / f"feedrate-probe-{os.getpid()}"
        with contextlib.suppress(OSError):
            probe.mkdir()
            try:
                if (probe / "pids.max").exists():
                    return root
            finally:
                probe.rmdir()
    return None


def pids_limit_unavailable() -> str | None:
    """Why a test cannot run a command under a ``pids.max`` of its own here, or None."""
    if pids_root() is not None:
        return None
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a cgroup with a pids limit needs root"
    return "no writable cgroup pids controller here (cgroup v1 pids, or v2 with pids enabled)"


@contextlib.contextmanager
def pids_limited(more: int) -> Iterator[Path]:
    """A fresh cgroup whose ``pids.max`` leaves ``more`` tasks to whatever is moved into it (its
    ``cgroup.procs``), where ``pids_root`` says (check ``pids_limit_unavailable`` first).
    Removed after."""
    root = pids_root()
    assert root is not None, pids_limit_unavailable()
    group = root / f"feedrate-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(f"{more}\n")
        yield group
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # its last tasks may still be exiting
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


def run_in(
    group: Path, *argv: str, timeout_s: float = 120.0, env: dict[str, str] | None = None
) -> Any:
    """Run ``argv`` inside the cgroup ``group`` (moved there before it starts). A
    CompletedProcess."""
    script = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
    return subprocess.run(
        ["sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


def refused_starts(group: Path) -> int:
    """The starts (fork, thread) the kernel refused for ``group``'s limit (``pids.events``)."""
    text = (group / "pids.events").read_text()
    return int(text.split()[1]) if text.startswith("max") else 0


def open_storage_client(worker_id: int) -> None:
    """A worker_init_fn that takes 1.5 s, as opening a storage client in every worker does."""
    time.sleep(1.5)


def slow_start_loader(workers: int = 2, n: int = 512) -> DataLoader[torch.Tensor]:
    """Cheap samples behind workers that take 1.5 s to start, every epoch (they are not
    persistent): an epoch's steady state lasts milliseconds, its restart 1.5 s."""
    return DataLoader(
        Squares(n), batch_size=16, num_workers=workers, worker_init_fn=open_storage_client
    )


# Forks whose child hangs before any of its code runs (the next ``count`` forks of this
# process): what a fork beside a thread holding the interpreter's lock gives (CPython
# gh-112275), made certain. The hooks stay registered, inert once the count is spent.
_hang = {"left": 0, "this": 0}
_hooks_registered: list[bool] = []


def _hang_before_fork() -> None:
    _hang["this"] = int(_hang["left"] > 0)
    _hang["left"] = max(0, _hang["left"] - 1)


def _hang_in_child() -> None:
    if _hang["this"]:
        while True:
            time.sleep(60)


def _hang_after_in_parent() -> None:
    _hang["this"] = 0


@contextlib.contextmanager
def forks_that_hang(count: int) -> Iterator[Callable[[], int]]:
    """The next ``count`` forks in the block give children that never start; yields how many
    of them are still to come."""
    if not _hooks_registered:
        os.register_at_fork(
            before=_hang_before_fork,
            after_in_child=_hang_in_child,
            after_in_parent=_hang_after_in_parent,
        )
        _hooks_registered.append(True)
    _hang["left"] = count
    try:
        yield lambda: _hang["left"]
    finally:
        _hang["left"] = 0
