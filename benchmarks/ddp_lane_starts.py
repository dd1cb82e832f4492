"""Do autotune's lane starts hang in a two-rank job, with and without the fork guard?

Each job is ``torchrun --nproc-per-node 2`` on gloo: both ranks iterate an autotuned loader
(a map-style dataset of 3 ms waits, batch 4, a ``DistributedSampler``, at most 3 workers)
through whole epochs with training's all-reduce after every batch, then ``close()`` it, so that
the next epoch meets the other ranks anew and starts new workers right after those calls:
``--cycles`` times. A job not done within ``--timeout`` s hung (a worker that never started,
``feedrate.distributed.forks``); it is killed. The arms alternate job by job:

* ``guarded``: as feedrate runs;
* ``bare``: ``forks.guard_forks`` replaced by a no-op in the job's ranks.

    python benchmarks/ddp_lane_starts.py                       # 10 jobs x 30 cycles per arm
    python benchmarks/ddp_lane_starts.py --jobs 20 --arms guarded

Writes ``benchmarks/results/ddp-lane-starts.{json,md}`` (``--out`` for another folder). Beside
two busy loops (``python -c "while 1: pass"`` twice) a bare job hung about once in 500 cycles
on the development machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import machine_line, provenance

from feedrate.machine.facts import collect

SCHEMA = "feedrate.bench.ddp_lane_starts/1"
HERE = Path(__file__).resolve().parent

JOB = """
import os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
import feedrate
from feedrate.distributed import forks
from pipelines import CostPerSample

arm, cycles = sys.argv[1], int(sys.argv[2])
if arm == "bare":
    forks.guard_forks = lambda: False
dist.init_process_group("gloo")
ds = CostPerSample(240, wait_s=0.003)
loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=True, seed=3))
auto = feedrate.autotune(loader, cache=False, budget_s=20, max_workers=3)
for c in range(cycles):
    n = sum(1 for _ in auto if dist.all_reduce(torch.ones(1)) is None)
    assert n == len(auto), n
    auto.close()
print("started again:", sum("hung in the fork" in e.why for e in auto.report().events), flush=True)
dist.destroy_process_group()
"""


def end(proc: subprocess.Popen[str], script: Path) -> None:
    """Kill a job: torchrun's ranks (and their workers) are in sessions of their own, found
    by the job's script in their command lines; then torchrun's own session."""
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(script) in " ".join(p.info["cmdline"] or []):
                p.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def job(arm: str, cycles: int, timeout_s: float) -> dict[str, Any]:
    """One torchrun job of ``cycles`` epochs: whether it hung, its seconds."""
    with tempfile.TemporaryDirectory(prefix="fr-ddp-") as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB, encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path[1:]])}
        env["TMPDIR"] = tmp
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", "2", str(script), arm, str(cycles)]
        began = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=tmp,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
            hung = False
        except subprocess.TimeoutExpired:
            end(proc, script)
            out, err = proc.communicate()
            hung = True
        except BaseException:  # Ctrl-C: no job left running
            end(proc, script)
            raise
        took = time.monotonic() - began
    failed = not hung and proc.returncode != 0
    return {
        "arm": arm,
        "cycles": cycles,
        "hung": hung,
        "failed": failed,
        # lane starts whose workers hung in their fork and were started again, both ranks
        "started_again": sum(
            int(line.split(":")[1]) for line in (out or "").splitlines() if "started again:" in line
        ),
        "seconds": took,
        "error": (err or "")[-2000:] if failed else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10, help="jobs per arm")
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--arms", nargs="+", choices=["guarded", "bare"], default=["guarded", "bare"])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    for j in range(args.jobs):
        for arm in args.arms if j % 2 == 0 else list(reversed(args.arms)):
            run = job(arm, args.cycles, args.timeout) | {"job": j}
            runs.append(run)
            state = "HUNG" if run["hung"] else "failed" if run["failed"] else "ok"
            again = f", {run['started_again']} started again" if run["started_again"] else ""
            print(f"job {j} {arm:8s} {state} ({run['seconds']:.0f} s{again})", flush=True)
    machine = collect().to_dict()
    total = {
        arm: {
            "jobs": sum(1 for r in runs if r["arm"] == arm),
            # whole jobs only: a hung one's cycles before the hang are not known
            "cycles": sum(
                r["cycles"] for r in runs if r["arm"] == arm and not (r["hung"] or r["failed"])
            ),
            "hung": sum(1 for r in runs if r["arm"] == arm and r["hung"]),
            "failed": sum(1 for r in runs if r["arm"] == arm and r["failed"]),
            "started_again": sum(r["started_again"] for r in runs if r["arm"] == arm),
        }
        for arm in args.arms
    }
    doc = {
        "schema": SCHEMA,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        **provenance(),
        "runs": runs,
        "total": total,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ddp-lane-starts.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "# autotune's lane starts in a two-rank job",
        "",
        f"{doc['when']}, {machine_line(machine)}; {args.cycles} cycles a job.",
        "",
        "| arm | jobs | cycles of jobs that ended | hung | failed | lane starts started again |",
        "|---|---|---|---|---|---|",
        *(
            f"| {a} | {t['jobs']} | {t['cycles']:,} | {t['hung']} | {t['failed']} "
            f"| {t['started_again']} |"
            for a, t in total.items()
        ),
        "",
    ]
    (args.out / "ddp-lane-starts.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
