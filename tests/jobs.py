"""Jobs of several processes (torchrun, ``--nproc-per-node``) run by the tests, bounded.

A job that does not end in time is asked for every thread's Python stack before it is killed:
it runs with ``PYTHONFAULTHANDLER=1``, so a SIGABRT to its processes (launcher, ranks and their
DataLoader workers, all in a session of the job's own) prints where each one waits, even one
blocked in C, into the output the test fails with. A hang seen once on a CI machine is then a
stack to read, not "it did not end"."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

#: Seconds the stacks are given to be written, after the SIGABRT, before the job is killed.
DUMP_S = 10.0


@dataclass
class Done:
    """What a job did: its exit status, all it printed (stdout, then stderr), its seconds."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def pythonpath(*first: Path | str) -> str:
    """A child's PYTHONPATH: ``first``, then this run's own. Replacing it instead loses where
    feedrate comes from when it runs from its sources, not installed (``benchmarks/gpu.sh``
    on a borrowed GPU machine: the jobs could not import it)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Absolute: the jobs run in a directory of their own (``PYTHONPATH=src`` would be lost).
    return os.pathsep.join([*(str(p) for p in first), *(os.path.abspath(p) for p in inherited)])


def left_behind(marker: str) -> list[psutil.Process]:
    """Processes with ``marker`` in their command line (a job's, which must all be gone)."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                left.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


def _members(session: int, marker: str | None) -> list[psutil.Process]:
    """The job's processes: its session's, and any found by ``marker`` (processes that made
    sessions of their own)."""
    found = [] if marker is None else left_behind(marker)
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == session and p not in found:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return found


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def run_job(
    args: Sequence[str],
    *,
    timeout_s: float,
    env: dict[str, str],
    cwd: Path,
    marker: str | None = None,
    merge: bool = False,
) -> Done:
    """Run ``args`` in a session of its own within ``timeout_s``; past it, every process of
    the job prints its stacks, is killed, and the test fails with them. ``merge``: stderr
    into stdout, in the order printed. The job's temporary directory is one of its own
    (``short_tmpdir``), removed after it: what its processes leave there (torchrun's
    ``torchelastic_*`` log folders, which it never removes) does not stay in /tmp."""
    with short_tmpdir() as job_tmp:
        return _run(args, timeout_s, {**env, "TMPDIR": job_tmp}, cwd, marker, merge)


@contextlib.contextmanager
def short_tmpdir() -> Iterator[str]:
    """A new folder directly in the temporary directory, removed on the way out. Short, unlike
    ``tmp_path`` (longer still under pytest-xdist): DataLoader workers listen on sockets in a
    ``pymp-*`` folder under ``TMPDIR``, and a socket's path holds at most 107 characters."""
    with tempfile.TemporaryDirectory(prefix="fr-", ignore_cleanup_errors=True) as folder:
        yield folder


def _run(
    args: Sequence[str],
    timeout_s: float,
    env: dict[str, str],
    cwd: Path,
    marker: str | None,
    merge: bool,
) -> Done:
    began = time.monotonic()
    proc = subprocess.Popen(
        list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        text=True,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal(_members(proc.pid, marker), signal.SIGABRT)  # faulthandler: every stack
        try:
            out, err = proc.communicate(timeout=DUMP_S)
        except subprocess.TimeoutExpired:
            _signal(_members(proc.pid, marker), signal.SIGKILL)
            out, err = proc.communicate()
        _signal(_members(proc.pid, marker), signal.SIGKILL)  # any left
        said = (out or "") + (err or "")
        pytest.fail(f"the job did not end within {timeout_s:g} s; its stacks:\n{said[-40000:]}")
    return Done(proc.returncode, out or "", err or "", time.monotonic() - began)
