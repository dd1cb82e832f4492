"""Do forks hang beside torch.distributed's threads, with and without feedrate's fork guard?

On CPython before 3.11.10 (3.10.15, 3.9.20, 3.8.20) a child of ``os.fork()`` can hang inside
the fork for good (gh-112275) when gloo's worker threads are making Python thread states at
that instant, which they do after every collective (``feedrate.distributed.forks``). This
counts it: a process in a one-rank gloo group runs ``--threads`` threads of back-to-back
all-reduces (a job whose ranks talk all the time) while it forks ``--forks`` children that exit
at once; a child not gone within 3 s hung (it is killed). The two arms run in processes of their
own, alternating (the guard cannot be taken back once installed):

* ``bare``: forks as DataLoader makes them;
* ``guarded``: after ``feedrate.distributed.forks.guard_forks()``.

    python benchmarks/fork_guard.py                    # 2 rounds x 1,500 forks each (~3 min)
    python benchmarks/fork_guard.py --rounds 3 --forks 2000

Writes ``benchmarks/results/fork-guard.{json,md}`` (``--out`` for another folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import machine_line, provenance

from feedrate.machine.facts import collect

SCHEMA = "feedrate.bench.fork_guard/1"
HANG_S = 3.0  # a child that exits at once and is not gone by then hung


def arm(mode: str, forks: int, threads: int) -> dict[str, Any]:
    """One arm in this process: forks made beside the all-reduce threads; how many hung."""
    import torch
    import torch.distributed as dist

    from feedrate.distributed import forks as guard

    store = tempfile.mktemp(prefix="fork-guard-")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    installed = guard.guard_forks() if mode == "guarded" else False
    stop = threading.Event()

    def talk() -> None:
        while not stop.is_set():
            dist.all_reduce(torch.ones(1))

    talkers = [threading.Thread(target=talk, daemon=True) for _ in range(threads)]
    for t in talkers:
        t.start()
    hung, began = 0, time.monotonic()
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        deadline = time.monotonic() + HANG_S
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.0005)
    took = time.monotonic() - began
    stop.set()
    for t in talkers:
        t.join()
    dist.destroy_process_group()
    return {"mode": mode, "installed": installed, "forks": forks, "hung": hung, "seconds": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--forks", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--arm", choices=["bare", "guarded"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:  # a child of this script: one arm, its result on stdout
        print(json.dumps(arm(args.arm, args.forks, args.threads)), flush=True)
        return
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = ["bare", "guarded"] if r % 2 == 0 else ["guarded", "bare"]
        for mode in order:
            cmd = [sys.executable, __file__, "--arm", mode, "--forks", str(args.forks)]
            cmd += ["--threads", str(args.threads)]
            # an arm whose own parent hung would never end: bounded, at 0.2 s a fork and more
            limit = 60 + 0.2 * args.forks + HANG_S * args.forks / 100
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=limit)
            run = json.loads(done.stdout.strip().splitlines()[-1]) | {"round": r}
            runs.append(run)
            print(
                f"round {r} {mode:8s} hung {run['hung']} of {run['forks']} "
                f"({run['seconds']:.1f} s)",
                flush=True,
            )
    total = {
        m: (
            sum(x["hung"] for x in runs if x["mode"] == m),
            sum(x["forks"] for x in runs if x["mode"] == m),
        )
        for m in ("bare", "guarded")
    }
    machine = collect().to_dict()
    doc = {
        "schema": SCHEMA,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "machine": machine,
        **provenance(),
        "threads": args.threads,
        "runs": runs,
        "total": {m: {"hung": h, "forks": n} for m, (h, n) in total.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fork-guard.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "# Forks beside torch.distributed's threads",
        "",
        f"{doc['when']}, {machine_line(machine)}; "
        f"{args.threads} threads of back-to-back gloo all-reduces.",
        "",
        "| arm | forks | hung |",
        "|---|---|---|",
        *(f"| {m} | {n:,} | {h} |" for m, (h, n) in total.items()),
        "",
    ]
    (args.out / "fork-guard.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
