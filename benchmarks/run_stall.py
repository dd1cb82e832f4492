"""``feedrate run`` against a hand-timed loop, ``--autotune``'s time, and the observer's overhead.

    python benchmarks/run_stall.py                # about 6 minutes on 2 cores
    python benchmarks/run_stall.py --rounds 1     # a quick look

Three claims, each from runs of a real script, nothing mocked:

1. **The stall agrees with a hand-timed loop.** ``starve.py`` trains on the images example's
   loader (``examples/images.py``, ``num_workers=0``, JPEG decode on the main process) with a
   simulated 20 ms accelerator step (a sleep). The script times its own loop (the wait in
   ``next()`` against the loop's time, start-up included, per epoch); the stall feedrate
   reports for the same run must be within 5 points of it, and of the same script run without
   feedrate.
2. **``--autotune`` makes it faster.** The same script under ``feedrate run --autotune`` (a
   fresh cache each time: the cold case) must take at most 75% of the plain run's wall time.
3. **A loop that keeps up pays ≤ 1%.** ``keepup.py`` (an in-memory dataset, a 20 ms step, 512
   batches) run as ``python keepup.py`` and as ``feedrate run keepup.py``,
   interleaved (ABBA), compares the loop's own time (the median of the paired ratios, and the
   ratio of the fastest runs); the wall time of the whole
   command (start-up and the report included) is given apart, in seconds. feedrate must say
   the model is the bottleneck. The observer's own cost per batch is timed apart, in process.

Writes benchmarks/results/run_stall.md and run_stall.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common import machine_line, provenance

from feedrate import __version__
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

_TIMED_LOOP = """
import json, os, sys, time
EPOCHS = int(os.environ.get("BENCH_EPOCHS", "1"))
STEP = float(os.environ["BENCH_STEP"])
wait = loop = 0.0
batches = 0
for _epoch in range(EPOCHS):
    began = time.perf_counter()
    it = iter(loader)
    last = None
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            loop += t0 - began
            break
        t1 = time.perf_counter()
        wait += t1 - (began if last is None else t0)
        last = t1
        batches += 1
        time.sleep(STEP)
with open(os.environ["BENCH_OUT"], "w") as fh:
    json.dump({"wait_s": wait, "loop_s": loop, "batches": batches}, fh)
"""
STARVE = f"""import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
from images import loader  # num_workers=0, batch_size=32
{_TIMED_LOOP}"""
KEEPUP = f"""import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(4096, 64)), batch_size=16, shuffle=True)
{_TIMED_LOOP}"""


def run(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Run one command; its wall time, the loop's own figures and feedrate's report."""
    out, report = cwd / "loop.json", cwd / "report.json"
    for stale in (out, report):
        stale.unlink(missing_ok=True)
    argv = [a.replace("REPORT", str(report)) for a in argv]
    began = time.perf_counter()
    done = subprocess.run(
        argv, env={**env, "BENCH_OUT": str(out)}, cwd=cwd, capture_output=True, text=True
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    loop = json.loads(out.read_text())
    record: dict[str, Any] = {"wall_s": wall, **loop, "hand_stall": loop["wait_s"] / loop["loop_s"]}
    if report.exists():
        doc = json.loads(report.read_text())
        (loader,) = [ld for ld in doc["loaders"] if ld["role"] == "train"]
        record["feedrate"] = {
            k: loader[k] for k in ("stall", "wait_s", "step_s", "batches", "bottleneck")
        }
        record["verdict"] = doc["verdict"]
        if loader.get("autotune"):
            tuned = loader["autotune"]
            record["autotune"] = {k: tuned[k] for k in ("after", "settled", "stall_after")}
    return record


def feedrate(*args: str) -> list[str]:
    return [sys.executable, "-m", "feedrate", "run", "--json", "REPORT", *args]


def median(records: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in records)


def stall_claims(folder: Path, rounds: int, epochs: int) -> dict[str, Any]:
    env = {**os.environ, "BENCH_STEP": "0.02", "BENCH_EPOCHS": str(epochs)}
    (folder / "starve.py").write_text(STARVE)
    plain, observed, tuned = [], [], []
    for i in range(rounds):
        print(f"  starve round {i + 1}/{rounds}", flush=True)
        plain.append(run([sys.executable, "starve.py"], env, folder))
        observed.append(run(feedrate("starve.py"), env, folder))
        cache = {**env, "FEEDRATE_CACHE_DIR": tempfile.mkdtemp(prefix="cache-", dir=folder)}
        tuned.append(run(feedrate("--autotune", "starve.py"), cache, folder))
    gaps = [abs(r["feedrate"]["stall"] - r["hand_stall"]) for r in observed]
    return {
        "plain_python": plain,
        "feedrate_run": observed,
        "feedrate_run_autotune": tuned,
        "stall_gap_points_max": 100 * max(gaps),
        "stall_vs_plain_python_points": 100
        * abs(median([r["feedrate"] for r in observed], "stall") - median(plain, "hand_stall")),
        "autotune_time_ratio": median(tuned, "wall_s") / median(observed, "wall_s"),
        "autotune_round_ratios": [
            t["wall_s"] / o["wall_s"] for t, o in zip(tuned, observed, strict=True)
        ],
    }


def overhead_claim(folder: Path, rounds: int) -> dict[str, Any]:
    env = {**os.environ, "BENCH_STEP": "0.02", "BENCH_EPOCHS": "2"}
    (folder / "keepup.py").write_text(KEEPUP)
    bare, observed = [], []
    for i in range(rounds):  # ABBA: drift in the machine's load hits both alike
        print(f"  keep-up round {i + 1}/{rounds}", flush=True)
        pair = [([sys.executable, "keepup.py"], bare), (feedrate("keepup.py"), observed)]
        for argv, into in pair if i % 2 == 0 else reversed(pair):
            into.append(run(argv, env, folder))
    paired = [o["loop_s"] / b["loop_s"] - 1 for o, b in zip(observed, bare, strict=True)]
    return {
        "plain_python": bare,
        "feedrate_run": observed,
        "loop_overhead": statistics.median(paired),
        "loop_overhead_pairs": paired,
        "loop_overhead_fastest": min(r["loop_s"] for r in observed) / min(r["loop_s"] for r in bare)
        - 1,
        "wall_extra_s": median(observed, "wall_s") - median(bare, "wall_s"),
        "verdicts": sorted({r["verdict"] for r in observed}),
    }


def per_batch_cost(batches: int = 200_000, repeats: int = 7) -> dict[str, Any]:
    """The observer's own cost per batch, in this process: iterating prepared batches through
    ``ObservedIterator`` against iterating them bare (the fastest of ``repeats`` each, so a
    busy machine inflates neither)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from feedrate.running.observer import ObservedIterator, Watch

    loader = DataLoader(TensorDataset(torch.zeros(64, 3)), batch_size=16)
    batches_list = [[torch.zeros(16, 3)]] * batches

    def bare() -> float:
        began = time.perf_counter()
        for _batch in iter(batches_list):
            pass
        return time.perf_counter() - began

    def observed() -> float:
        watch = Watch(loader, "bench.py:1", None, time.perf_counter())
        watch.new_epoch(time.perf_counter())
        began = time.perf_counter()
        for _batch in ObservedIterator(iter(batches_list), watch):
            pass
        return time.perf_counter() - began

    b = min(bare() for _ in range(repeats))
    o = min(observed() for _ in range(repeats))
    return {"batches": batches, "per_batch_us": (o - b) / batches * 1e6}


def markdown(doc: dict[str, Any]) -> str:
    s, o = doc["stall"], doc["overhead"]

    def row(name: str, recs: list[dict[str, Any]]) -> str:
        fr = [r["feedrate"]["stall"] for r in recs if "feedrate" in r]
        shown = f"{100 * statistics.median(fr):.1f}%" if fr else "-"
        return (
            f"| {name} | {median(recs, 'wall_s'):.2f} s | {median(recs, 'loop_s'):.2f} s | "
            f"{100 * median(recs, 'hand_stall'):.1f}% | {shown} |"
        )

    tuned = [r["autotune"] for r in s["feedrate_run_autotune"] if "autotune" in r]
    settled = ", ".join(
        f"{LoaderConfig.from_dict(t['after']).label()}"
        f" ({'settled' if t['settled'] else 'still tuning'}, {100 * (t['stall_after'] or 0):.0f}%"
        " stall over the last half)"
        for t in tuned
    )
    rounds = ", ".join(f"{r:.2f}" for r in s["autotune_round_ratios"])
    lines = [
        f"`{doc['command']}` — {doc['date']}, feedrate {doc['feedrate_version']} "
        f"({(doc['feedrate_commit'] or 'unknown')[:7]}"
        f"{' + uncommitted src changes' if doc['src_uncommitted_changes'] else ''}), "
        f"{doc['rounds']} rounds, {doc['seconds']:.0f} s",
        "",
        "## The images example at num_workers=0 with a 20 ms step (medians)",
        "",
        "| run | wall | loop | stall, hand-timed | stall, feedrate |",
        "|---|---|---|---|---|",
        row("python starve.py", s["plain_python"]),
        row("feedrate run starve.py", s["feedrate_run"]),
        row("feedrate run --autotune starve.py (cold cache)", s["feedrate_run_autotune"]),
        "",
        f"* feedrate's stall against the same run's hand-timed loop: at most "
        f"{s['stall_gap_points_max']:.1f} points apart (target ≤ 5): "
        f"{'met' if s['stall_gap_points_max'] <= 5 else 'NOT met'}; against the script run "
        f"without feedrate (medians): {s['stall_vs_plain_python_points']:.1f} points.",
        f"* `--autotune` wall time / plain `feedrate run`: {s['autotune_time_ratio']:.2f} "
        f"(target ≤ 0.75): {'met' if s['autotune_time_ratio'] <= 0.75 else 'NOT met'} (round by "
        f"round: {rounds}); autotune chose, round by round: {settled}.",
        "",
        "## A loop that keeps up: in-memory data, a 20 ms step, 512 batches (ABBA, medians)",
        "",
        "| run | wall | loop |",
        "|---|---|---|",
        f"| python keepup.py | {median(o['plain_python'], 'wall_s'):.2f} s | "
        f"{median(o['plain_python'], 'loop_s'):.3f} s |",
        f"| feedrate run keepup.py | {median(o['feedrate_run'], 'wall_s'):.2f} s | "
        f"{median(o['feedrate_run'], 'loop_s'):.3f} s |",
        "",
        f"* overhead on the loop (the training time), median of the {len(o['loop_overhead_pairs'])}"
        f" paired ratios: {100 * o['loop_overhead']:+.2f}% (target ≤ 1%): "
        f"{'met' if o['loop_overhead'] <= 0.01 else 'NOT met'} (pairs "
        f"{', '.join(f'{100 * p:+.1f}%' for p in o['loop_overhead_pairs'])}; fastest run against "
        f"fastest run {100 * o['loop_overhead_fastest']:+.2f}%); the whole command "
        f"takes {o['wall_extra_s']:+.2f} s more (feedrate's start, the report at exit).",
        f"* feedrate's verdict: {'; '.join(o['verdicts'])}.",
        f"* the observer's own cost per batch (two wall-clock and two thread-CPU readings, the "
        f"counting): {doc['per_batch']['per_batch_us']:.2f} µs, "
        f"{doc['per_batch']['per_batch_us'] / 200:.3f}% of a 20 ms step "
        f"({doc['per_batch']['per_batch_us'] / 10:.2f}% of a 1 ms one).",
        "",
        f"Machine: {machine_line(doc['machine'])}; 1-minute load average "
        f"{doc['load_start']:.1f} at the start, {doc['load_end']:.1f} at the end.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10, help="epochs of starve.py (16 batches)")
    args = parser.parse_args()
    began, load_start = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="run-stall-") as tmp:
        folder = Path(tmp)
        stall = stall_claims(folder, args.rounds, args.epochs)
        overhead = overhead_claim(folder, max(2, 2 * args.rounds))
    doc = {
        "command": "python benchmarks/run_stall.py"
        + (f" --rounds {args.rounds}" if args.rounds != 3 else ""),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": __version__,
        **provenance(),
        "machine": collect().to_dict(),
        "rounds": args.rounds,
        "seconds": time.monotonic() - began,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "stall": stall,
        "overhead": overhead,
        "per_batch": per_batch_cost(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "run_stall.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = markdown(doc)
    (RESULTS / "run_stall.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
