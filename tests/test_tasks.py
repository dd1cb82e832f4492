"""The limit of processes and threads (a container's ``pids.max``, ``ulimit -u``): every worker is
a process with a few threads, and past the limit its start fails with EAGAIN. ``tune`` plans
within it and the doctor names it (``task-limit``). Here under a real ``pids.max``, in a cgroup of
the test's own where this machine allows one (root and a pids controller), skipping with the
reason elsewhere. The search's side (the budget's ceiling, and the bisection towards a start
that failed) is in ``test_search``, the finding's words in ``test_checks``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from feedrate.autotuning.start import starting_point
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.workflows.doctor_trials import refuse_overflow

from faults import (
    fault,
    pids_limit_unavailable,
    pids_limited,
    refused_starts,
    run_in,
    write_target,
)
from pipelines import SleepDataset

_NO_PIDS = pids_limit_unavailable()
needs_pids = pytest.mark.skipif(_NO_PIDS is not None, reason=_NO_PIDS or "")

#: Tasks the limit leaves: the CLI's own process and threads, and about 20 workers' worth.
LEFT = 100

#: A pipeline that mostly waits (4 ms a sample): its search climbs far past the 2 CPUs, to
#: where the projected CPU time meets the CPUs, about 40 workers, 160 tasks and more.
WAITING = (
    "from torch.utils.data import DataLoader\nfrom pipelines import SleepDataset\n"
    "loader = DataLoader(SleepDataset(n=8192, sleep_s=0.004), batch_size=16{extra})\n"
)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_tune_does_not_start_your_settings_over_the_limit() -> None:
    fault("tune-baseline-over-pids")
    dataset = SleepDataset(n=64)
    loader = DataLoader(dataset, batch_size=4, num_workers=32)
    few = dataclasses.replace(collect(), tasks_free=40)
    with pytest.raises(PipelineError, match=r"w=32 pf=2 not started, task-limit: .*--pids-limit"):
        refuse_overflow(loader, LoaderConfig(32, prefetch_factor=2), few)
    refuse_overflow(loader, LoaderConfig(8, prefetch_factor=2), few)  # 32 tasks of 40 fit


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_autotune_starts_within_the_limit_and_says_so() -> None:
    fault("autotune-start-over-pids")
    loader = DataLoader(SleepDataset(n=1024), batch_size=4, num_workers=32)
    few = dataclasses.replace(collect(), tasks_free=40)  # 80%: 32 tasks, 8 workers
    start = starting_point(
        loader, few, max_workers=None, allow_threads=False, use_cache=False, split=True
    )
    assert start.config.num_workers == 8
    assert "lowered from 32 workers to 8 (task-limit)" in start.started_from
    roomy = dataclasses.replace(few, tasks_free=None)
    kept = starting_point(
        loader, roomy, max_workers=None, allow_threads=False, use_cache=False, split=True
    )
    assert kept.config.num_workers == 32 and kept.started_from == "your settings"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path / "cache"))  # the CLIs' too


@needs_pids
def test_tune_stays_within_a_real_pids_limit(tmp_path: Path) -> None:
    fault("pids-limit")
    target = write_target(tmp_path, WAITING.format(extra=""))
    out_json = tmp_path / "tune.json"
    cmd = [sys.executable, "-m", "feedrate", "tune", f"{target}:loader", "--budget-s", "20"]
    with pids_limited(LEFT) as group:
        done = run_in(group, *cmd, "--json", str(out_json))
        refused = refused_starts(group)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert refused == 0, out  # no fork or thread start was refused
    assert "Traceback" not in out and "Resource temporarily unavailable" not in out
    result = json.loads(out_json.read_text())
    free = result["machine"]["tasks_free"]
    assert free is not None and free < LEFT  # the CLI's own tasks already count
    tried = [t for t in result["trials"] if t["config"]["num_workers"] > 2]
    assert tried, out  # it went past the CPUs (the pipeline waits)
    assert all(t["error"] is None for t in result["trials"]), out
    assert all(4 * t["config"]["num_workers"] <= 0.8 * free for t in result["trials"])
    best = result["best"]["config"]["num_workers"]
    assert best >= 0.5 * 0.8 * free / 4, out  # it climbed to near the budget, not stopped low


def doctor_over_the_limit(tmp_path: Path, *args: str) -> tuple[Any, int]:
    """``feedrate doctor ARGS`` of a loader of 40 workers under ``LEFT`` tasks: the run, and the
    starts the kernel refused meanwhile."""
    target = write_target(tmp_path, WAITING.format(extra=", num_workers=40"))
    cmd = [sys.executable, "-m", "feedrate", "doctor", f"{target}:loader", *args]
    with pids_limited(LEFT) as group:
        done = run_in(group, *cmd)
        return done, refused_starts(group)


@needs_pids
def test_the_doctor_names_a_real_pids_limit(tmp_path: Path) -> None:
    fault("pids-limit-doctor")
    done, _ = doctor_over_the_limit(tmp_path, "--check", "task-limit")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out  # it ran: nothing it started died
    assert "error   task-limit" in done.stdout, out
    assert "40 worker processes" in done.stdout and "--pids-limit" in done.stdout, out
    assert "Traceback" not in out and "check-failed" not in out


@needs_pids
def test_the_doctor_does_not_start_a_run_over_a_real_pids_limit(tmp_path: Path) -> None:
    fault("pids-limit-doctor-runs")
    done, refused = doctor_over_the_limit(tmp_path, "--trial-seconds", "0.5")
    out = done.stdout + done.stderr
    assert refused == 0, out
    assert "error   task-limit" in done.stdout, out
    assert "Traceback" not in out and "can't start new thread" not in out
    assert "not started" in out, out
