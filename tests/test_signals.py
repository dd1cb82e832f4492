"""What a terminated or twice-interrupted command leaves: no worker process, the exit status
launchers expect (143 for SIGTERM, as `timeout`, Slurm, Kubernetes and CI send it; 129 for
SIGHUP, a terminal closed; 130 for Ctrl-C), and one line instead of a traceback."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from faults import fault, start_cli, wait_for_children, write_target

BODY = "from faults import loader_of_slow_squares\nloader = loader_of_slow_squares(3)\n"


def _stop(tmp_path: Path, *signals: tuple[int, float]) -> tuple[int, str, list[psutil.Process]]:
    """Start ``feedrate tune`` on a slow pipeline with 3 workers, send each signal after its
    pause once the workers run, and return the exit status, stderr and the workers still alive
    a few seconds after."""
    target = write_target(tmp_path, BODY)
    proc = start_cli("tune", f"{target}:loader", "--budget-s", "120", "--fresh")
    try:
        workers = wait_for_children(proc.pid, 3)
        time.sleep(1.0)
        for signum, pause in signals:
            os.kill(proc.pid, signum)
            time.sleep(pause)
        _, stderr = proc.communicate(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=5.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr, alive


@pytest.mark.parametrize(
    ("case", "signum", "code", "word"),
    [
        (fault("sigterm-during-tune"), signal.SIGTERM, 143, "terminated"),
        (fault("sighup-during-tune"), signal.SIGHUP, 129, "hung up"),  # the terminal closed
    ],
)
def test_sigterm_stops_every_worker_and_exits_143(
    tmp_path: Path, case: str, signum: int, code: int, word: str
) -> None:
    got, stderr, alive = _stop(tmp_path, (signum, 0.0))
    assert not alive, f"workers left running: {[p.pid for p in alive]}"
    assert got == code, stderr
    assert word in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("case", [fault("second-ctrl-c-during-clean-up")])
def test_a_second_ctrl_c_during_clean_up_prints_no_traceback(tmp_path: Path, case: str) -> None:
    code, stderr, alive = _stop(tmp_path, (signal.SIGINT, 0.05), (signal.SIGINT, 0.0))
    assert not alive, f"workers left running: {[p.pid for p in alive]}"
    assert code == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
