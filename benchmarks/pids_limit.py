"""``feedrate tune`` under a container's process limit (``pids.max``): what it recommends, whether
any of its trials failed to start, and how fast its answer is, measured again side by side.

Every worker is a process with a few threads, and a container's ``pids.max`` (Docker's
``--pids-limit``, the kubelet's ``podPidsLimit``) counts each. A latency-bound pipeline's
search climbs far past the CPUs, into that limit. Each arm runs in a fresh cgroup of its own
whose ``pids.max`` leaves ``--left`` tasks, with nothing cached:

1. ``feedrate tune TARGET --fresh --json``; kept: the answer, its trials, those that failed,
   the starts the kernel refused (``pids.events``), the tracebacks printed;
2. then each arm's answer, in rounds, alternating: ``feedrate measure TARGET`` with it, under
   the same limit.

With ``--against REV`` the same runs use feedrate at git revision REV (a temporary worktree of
this checkout) as the other arm, so a change is measured before and after in one run. Needs
root and a writable cgroup pids controller (v1's, or v2 with pids enabled).

    python benchmarks/pids_limit.py --against HEAD~1
    python benchmarks/pids_limit.py --left 100 --rounds 3 --target examples/remote.py:loader

Writes ``pids-limit.{json,md}`` under ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import git, machine_line, provenance
from first_epoch import head_label, worktree

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the cgroup helpers
from faults import pids_limit_unavailable, pids_limited, refused_starts, run_in

SCHEMA = "feedrate.bench.pids_limit/1"
HERE = Path(__file__).resolve().parent


def feedrate(
    src: Path, left: int, cache: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], int, float]:
    """``feedrate ARGS`` from ``src``, in a fresh cgroup of ``left`` tasks: the process, the
    starts refused, the seconds it took."""
    env = {**os.environ, "PYTHONPATH": str(src), "FEEDRATE_CACHE_DIR": str(cache)}
    with pids_limited(left) as group:
        began = time.perf_counter()
        cmd = [sys.executable, "-m", "feedrate", *args]
        done = run_in(group, *cmd, timeout_s=600, env=env)
        return done, refused_starts(group), time.perf_counter() - began


def tune_arm(src: Path, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / f"tune-{time.monotonic_ns()}.json"
    done, refusals, took = feedrate(
        src, args.left, tmp / "cache", "tune", args.target, "--fresh", "--json", str(out)
    )
    text = done.stdout + done.stderr
    record: dict[str, Any] = {
        "returncode": done.returncode,
        "seconds": round(took, 1),
        "refused_starts": refusals,
        "tracebacks": text.count("Traceback (most recent call last)"),
    }
    if done.returncode or not out.exists():
        return record | {"error": text[-2000:]}
    result = json.loads(out.read_text())
    trials = result["trials"]
    return record | {
        "tasks_free": result["machine"].get("tasks_free"),
        "best": result["best"]["config"],
        "best_samples_per_s": result["best_samples_per_s"],
        "trials": [[t["config"]["num_workers"], t["samples_per_s"], t["error"]] for t in trials],
        "failed": sum(1 for t in trials if t["error"]),
    }


def measure_args(config: dict[str, Any]) -> list[str]:
    cmd = ["-w", str(config["num_workers"])]
    if config.get("prefetch_factor"):
        cmd += ["--prefetch-factor", str(config["prefetch_factor"])]
    if config.get("persistent_workers"):
        cmd.append("--persistent-workers")
    return cmd


def measure_arm(
    src: Path, args: argparse.Namespace, tmp: Path, config: dict[str, Any]
) -> float | None:
    out = tmp / f"measure-{time.monotonic_ns()}.json"
    cmd = ["measure", args.target, *measure_args(config), "--seconds", str(args.seconds)]
    done, _, _ = feedrate(src, args.left, tmp / "cache", *cmd, "--json", str(out))
    if done.returncode or not out.exists():
        print(f"  measure failed: {(done.stdout + done.stderr)[-500:]}", flush=True)
        return None
    return float(json.loads(out.read_text())["samples_per_s"])


def run(args: argparse.Namespace, arms: dict[str, Path], tmp: Path) -> dict[str, Any]:
    unavailable = pids_limit_unavailable()
    if unavailable is not None:
        sys.exit(f"pids_limit.py: {unavailable}")
    tunes: dict[str, dict[str, Any]] = {}
    for label, src in arms.items():
        print(f"tune, {label} ...", flush=True)
        tunes[label] = tune_arm(src, args, tmp)
        print(f"  {json.dumps({k: v for k, v in tunes[label].items() if k != 'trials'})}")
    rates: dict[str, list[float]] = {label: [] for label in arms}
    head_src = next(iter(reversed(arms.values())))  # the answers are measured by this checkout
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for label in order:
            best = tunes[label].get("best")
            if best is None:
                continue
            rate = measure_arm(head_src, args, tmp, best)
            if rate is not None:
                rates[label].append(rate)
                print(f"round {r} {label}: {rate:,.0f} samples/s", flush=True)
    return {"tunes": tunes, "rates": rates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="examples/remote.py:loader")
    ap.add_argument("--left", type=int, default=100, help="the cgroup's pids.max")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="each measurement's steady state")
    ap.add_argument("--against", metavar="REV", help="also run feedrate at this git revision")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        arms = {head_label(): HERE.parent / "src"}
        if args.against:
            arms = {f"{args.against} (before)": worktree(args.against, Path(tmp) / "b"), **arms}
        try:
            data = run(args, arms, Path(tmp))
        finally:
            if args.against:
                where = str(Path(tmp) / "b")
                subprocess.run(
                    ["git", "-C", str(HERE.parent), "worktree", "remove", "--force", where]
                )
    report(args, data)


def report(args: argparse.Namespace, data: dict[str, Any]) -> None:
    from feedrate.machine.facts import collect

    doc = {
        "schema": SCHEMA,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/pids_limit.py", *sys.argv[1:]]),
        "machine": collect().to_dict(),
        **provenance(),
        "against": args.against and git("-C", str(HERE.parent), "rev-parse", args.against),
        "target": args.target,
        "pids_max": args.left,
        **data,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pids-limit.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# `feedrate tune {args.target}` under pids.max={args.left}",
        "",
        f"{doc['when']}, `{doc['command']}`",
        "",
        f"Machine: {machine_line(doc['machine'])}",
        "",
        "| feedrate | answer | its tune's figure | trials failed | starts refused | "
        "tracebacks printed | tune s | measured again (median samples/s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, t in data["tunes"].items():
        rates = data["rates"][label]
        again = f"{statistics.median(rates):,.0f} ({len(rates)} rounds)" if rates else "-"
        best = t.get("best")
        answer = "failed" if best is None else measure_args(best)
        lines.append(
            f"| {label} | `{' '.join(answer) if best else answer}` | "
            f"{t.get('best_samples_per_s') or 0:,.0f} | {t.get('failed', '-')} | "
            f"{t['refused_starts']} | {t['tracebacks']} | {t['seconds']} | {again} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "pids-limit.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
