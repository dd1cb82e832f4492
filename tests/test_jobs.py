"""The tests' bounded jobs (``jobs.run_job``): a job that hangs fails its test with every
process's stacks, and none of its processes is left."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from jobs import left_behind, run_job

HANGS = """
import os, subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
def waits_for_ever():
    threading.Event().wait()
threading.Thread(target=waits_for_ever, name="stuck-helper", daemon=True).start()
print("started", flush=True)
child.wait()
"""


def test_a_job_that_hangs_fails_with_every_stack_and_leaves_nothing(tmp_path: Path) -> None:
    marker = f"feedrate-jobs-test-{os.getpid()}"
    (tmp_path / "hangs.py").write_text(HANGS, encoding="utf-8")
    args = [sys.executable, "hangs.py", marker]
    with pytest.raises(pytest.fail.Exception) as failed:
        run_job(args, timeout_s=3, env=dict(os.environ), cwd=tmp_path, marker=marker, merge=True)
    said = str(failed.value)
    assert "did not end within 3 s" in said and "started" in said
    assert "waits_for_ever" in said  # the helper thread's stack, from faulthandler
    assert "child.wait()" in said or "in wait" in said  # the main thread's
    left = left_behind(marker)
    assert left == []


def test_a_job_that_ends_gives_its_status_and_output(tmp_path: Path) -> None:
    args = [
        sys.executable,
        "-c",
        "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
    ]
    done = run_job(args, timeout_s=60, env=dict(os.environ), cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
