"""Helpers shared by the benchmark scripts: the machine line of a report, and making sure no
worker outlives a run (SIGTERM behaves like Ctrl-C, leftover children are ended)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from feedrate.measuring import interrupts


def machine_line(m: dict[str, Any]) -> str:
    gib = (m.get("memory_total_bytes") or 0) / 2**30
    return (
        f"{m['cpus_usable']} usable CPUs (of {m['cpu_count']}), {gib:.1f} GiB RAM, "
        f"{m['platform']}, Python {m['python_version']}, torch {m['torch_version']}, "
        f"start method {m['start_method']}, accelerator {m['accelerator']}"
    )


def leftover_children() -> list[int]:
    """Worker processes still alive (there should be none); ends them so none outlive us."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    psutil.wait_procs(children, timeout=2.0)
    return [c.pid for c in children]


def git(*args: str) -> str | None:
    """``git ARGS`` output in the current folder, or None (not a checkout, no git)."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def provenance() -> dict[str, object]:
    """The commit measured, and whether src/ had changes not committed."""
    return {
        "feedrate_commit": git("rev-parse", "HEAD"),
        "src_uncommitted_changes": bool(git("status", "--porcelain", "src")),
    }


def commit_label(run: dict[str, Any]) -> str:
    """The commit a run measured (7 digits), and whether src/ had changes not committed."""
    sha = run.get("feedrate_commit")
    sha = sha[:7] if sha else "unknown"
    return sha + (" + uncommitted src changes" if run.get("src_uncommitted_changes") else "")


def earlier_records(
    path: Path, names: Sequence[str], quick: bool
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """--merge: the records of an earlier run (``path``) for the pipelines not in ``names``, each
    marked with the date and commit it was measured at, and that run's document (None if there
    is none). Exits when the earlier run was of the other mode (quick or full)."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return [], None
    if earlier.get("quick") != quick:
        sys.exit(f"--merge: {path} is a {'quick' if earlier.get('quick') else 'full'} run")
    kept = []
    for record in earlier.get("pipelines", []):
        if record["name"] not in names:
            record.setdefault(
                "run",
                {"date": earlier.get("date"), "feedrate_commit": earlier.get("feedrate_commit")},
            )
            kept.append(record)
    return kept, earlier


def guarded(run: Callable[[], dict[str, Any]], out: Path, render: Callable[[Any], str]) -> int:
    """Run a benchmark: SIGTERM acts as Ctrl-C, an interruption says where the results so far
    are (exit 130), no worker process outlives it; prints ``render(results)`` at the end."""
    try:
        # SIGTERM as Ctrl-C, so every finally block runs and workers are stopped.
        with interrupts.stoppable(sigterm=True):
            data = run()
    except KeyboardInterrupt:
        print("interrupted; results so far are in", out)
        return 130
    finally:
        left = leftover_children()
        if left:
            print(f"ended {len(left)} leftover worker processes: {left}")
    print(render(data))
    return 0
