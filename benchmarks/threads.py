"""Threads inside workers against worker processes alone, on latency-bound pipelines; and tune
with ``allow_threads`` on CPU-bound ones (it must not pick threads unless they measure better).

For each latency-bound pipeline, every configuration below is measured the way ``tune`` measures
a trial (``measure(..., seconds=2.0, windows_count=4)``), in ``--rounds`` rounds whose order
alternates (forward, backward, ...) so a drifting machine touches every configuration alike;
each figure is the median over rounds, with its range:

* processes only: ``num_workers`` in ``PROCESS_WORKERS`` (pf=2, persistent; 0 is DataLoader's
  default, no worker memory at all);
* threaded: ``num_workers`` in ``THREAD_WORKERS`` × threads per worker in ``THREADS`` (up to the
  batch size: a worker fetches one batch at a time).

Criteria (issue 8), with T* the fastest threaded configuration:

* (a) T* ≥ 2× the fastest processes-only configuration whose worker memory fits T*'s;
* (b) the fastest threaded configuration using ≤ 1/4 of the worker memory of the fastest
  processes-only configuration P* reaches ≥ P*'s samples/s.

Worker memory is the sum of the workers' USS (memory only they hold), as ``measure`` reports it.

    python benchmarks/threads.py                 # remote (batch 16) and remote-b64, 3 rounds,
                                                 # then tune --threads on images and tokenize
    python benchmarks/threads.py --quick         # 1 round, fewer configurations (~5 min)
    python benchmarks/threads.py --render benchmarks/results/threads.json

Results: ``benchmarks/results/threads.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import guarded, machine_line
from torch.utils.data import DataLoader

import feedrate
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.measuring.measure import measure
from feedrate.results.trial import Trial
from feedrate.workflows.tune import tune

from pipelines import BY_NAME, EXAMPLES

SCHEMA = "feedrate.bench.threads/1"
PROCESS_WORKERS = (0, 2, 4, 8, 16, 32, 48, 64, 96, 128)
THREAD_WORKERS = (1, 2, 4, 8, 16)
THREADS = (4, 8, 16, 32, 64)
QUICK_PROCESS_WORKERS = (0, 2, 8, 32, 64, 128)
QUICK_THREAD_WORKERS = (2, 4)
QUICK_THREADS = (8, 16, 64)
TRIAL_S, WINDOWS, ROUNDS = 2.0, 4, 3
CPU_PIPELINES = ("images", "tokenize")


def remote_b64() -> DataLoader[Any]:
    """The remote example with 64 samples a batch (more room for threads in one batch)."""
    from feedrate.loader.target import load_target

    loader = load_target(f"{EXAMPLES / 'remote.py'}:loader")
    return DataLoader(loader.dataset, batch_size=64)


LATENCY: dict[str, tuple[str, Callable[[], DataLoader[Any]]]] = {
    "remote": ("examples/remote.py: ~10 ms per object, batch 16", BY_NAME["remote"].factory),
    "remote-b64": ("the same objects, batch 64", remote_b64),
}


def configs(batch_size: int, quick: bool) -> list[LoaderConfig]:
    procs = QUICK_PROCESS_WORKERS if quick else PROCESS_WORKERS
    workers = QUICK_THREAD_WORKERS if quick else THREAD_WORKERS
    threads = [t for t in (QUICK_THREADS if quick else THREADS) if t <= batch_size]
    out = [LoaderConfig(w, prefetch_factor=2, persistent_workers=w > 0) for w in procs]
    out += [
        LoaderConfig(w, prefetch_factor=2, persistent_workers=True, threads=t)
        for w in workers
        for t in threads
    ]
    return out


def measure_one(loader: DataLoader[Any], cfg: LoaderConfig) -> Trial:
    try:
        return Trial.of(measure(loader, cfg, seconds=TRIAL_S, windows_count=WINDOWS), "bench")
    except PipelineError as exc:
        return Trial(cfg, "bench", error=str(exc))


def bench_latency(name: str, rounds: int, quick: bool) -> dict[str, Any]:
    description, factory = LATENCY[name]
    loader = factory()
    cfgs = configs(loader.batch_size or 1, quick)
    runs: dict[LoaderConfig, list[Trial]] = {c: [] for c in cfgs}
    for r in range(rounds):
        order = cfgs if r % 2 == 0 else list(reversed(cfgs))
        for i, cfg in enumerate(order):
            trial = measure_one(loader, cfg)
            runs[cfg].append(trial)
            rate = f"{trial.median:,.0f} samples/s" if trial.measured else f"failed: {trial.error}"
            mem = (trial.workers_uss_bytes or 0) / 2**20
            print(
                f"{name:<11} round {r + 1}/{rounds} {i + 1:>2}/{len(cfgs)} "
                f"{cfg.label():<36} {rate:>18}  workers {mem:,.0f} MiB",
                flush=True,
            )
    rows = [_row(cfg, trials) for cfg, trials in runs.items()]
    return {
        "name": name,
        "description": description,
        "batch_size": loader.batch_size,
        "rows": rows,
        "criteria": criteria(rows),
    }


def _row(cfg: LoaderConfig, trials: list[Trial]) -> dict[str, Any]:
    ok = [t for t in trials if t.measured]
    rates = [t.median for t in ok]
    mems = [t.workers_uss_bytes or 0 for t in ok]
    return {
        "config": cfg.to_dict(),
        "label": cfg.label(),
        "threaded": cfg.threads > 1,
        "samples_per_s": statistics.median(rates) if rates else None,
        "min": min(rates) if rates else None,
        "max": max(rates) if rates else None,
        "rounds": rates,
        "workers_uss_bytes": int(statistics.median(mems)) if mems else None,  # 0 without workers
        "errors": [t.error for t in trials if t.error],
    }


def criteria(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["samples_per_s"] and r["workers_uss_bytes"] is not None]
    procs = [r for r in ok if not r["threaded"]]
    threaded = [r for r in ok if r["threaded"]]
    if not procs or not threaded:
        return {"complete": False}
    t_best = max(threaded, key=lambda r: r["samples_per_s"])
    p_best = max(procs, key=lambda r: r["samples_per_s"])
    fits = [r for r in procs if r["workers_uss_bytes"] <= t_best["workers_uss_bytes"]]
    p_fit = max(fits, key=lambda r: r["samples_per_s"], default=None)
    quarter = [r for r in threaded if r["workers_uss_bytes"] <= p_best["workers_uss_bytes"] / 4]
    t_small = max(quarter, key=lambda r: r["samples_per_s"], default=None)
    ratio_a = t_best["samples_per_s"] / p_fit["samples_per_s"] if p_fit else None
    ratio_b = t_small["samples_per_s"] / p_best["samples_per_s"] if t_small else None
    return {
        "complete": True,
        "threaded_best": t_best["label"],
        "processes_best": p_best["label"],
        "processes_within_memory": None if p_fit is None else p_fit["label"],
        "ratio_same_memory": ratio_a,
        "a_pass": ratio_a is not None and ratio_a >= 2.0,
        "threaded_quarter_memory": None if t_small is None else t_small["label"],
        "ratio_quarter_memory": ratio_b,
        "memory_share": None
        if t_small is None
        else t_small["workers_uss_bytes"] / p_best["workers_uss_bytes"],
        "b_pass": ratio_b is not None and ratio_b >= 1.0,
    }


def bench_cpu(name: str) -> dict[str, Any]:
    began = time.perf_counter()
    result = tune(BY_NAME[name].factory, allow_threads=True, use_cache=False)
    wall = time.perf_counter() - began
    trials = [t for t in result.trials if t.measured]
    threaded = [t for t in trials if t.config.threads > 1]
    procs = [t for t in trials if t.config.threads == 1]
    best_p = max(procs, key=lambda t: t.median, default=None)
    best_t = max(threaded, key=lambda t: t.median, default=None)
    picked_threads = result.best.config.threads > 1
    better = best_t is not None and best_p is not None and best_t.median > best_p.median
    print(
        f"{name:<11} tune --threads: {result.best.config.label()} "
        f"({len(threaded)} threaded trials) in {wall:.0f} s",
        flush=True,
    )
    return {
        "name": name,
        "kind": BY_NAME[name].kind,
        "pick": result.best.config.label(),
        "pick_samples_per_s": result.best.median,
        "threaded_trials": [t.to_dict() for t in threaded],
        "picked_threads": picked_threads,
        "pass": (not picked_threads) or better,
        "wall_s": wall,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    facts = collect()
    print(f"machine: {machine_line(facts.to_dict())}", flush=True)
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", "benchmarks/threads.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        "quick": args.quick,
        "rounds": args.rounds,
        "trial": {"seconds": TRIAL_S, "windows": WINDOWS},
        "machine": facts.to_dict(),
        "latency": [],
        "cpu": [],
    }
    for name in args.latency:
        data["latency"].append(bench_latency(name, args.rounds, args.quick))
        write(data, args.out)
    if not args.quick and not args.latency_only:
        for name in CPU_PIPELINES:
            data["cpu"].append(bench_cpu(name))
            write(data, args.out)
    data["wall_s"] = time.perf_counter() - began
    write(data, args.out)
    return data


# --- report ---------------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**20:,.0f} MiB"


def _cell(rows: dict[str, dict[str, Any]], label: str | None) -> str:
    if label is None:
        return "none"
    r = rows[label]
    return f"{label}: {r['samples_per_s']:,.0f} ({_mib(r['workers_uss_bytes'])})"


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    out = [
        f"# Threads inside workers against processes{' (--quick)' if data['quick'] else ''}",
        "",
        f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']}, "
        f"{data.get('wall_s', 0) / 60:.0f} min, {data['rounds']} interleaved rounds.",
        "",
        f"Machine: {machine_line(m)}.",
        "",
        "| pipeline | fastest threaded | fastest processes-only | processes-only within the "
        "threaded memory | (a) ratio, same memory (≥ 2) | threaded within ¼ of P*'s memory | "
        "(b) ratio to P* (≥ 1) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in data["latency"]:
        rows = {r["label"]: r for r in p["rows"]}
        c = p["criteria"]
        if not c.get("complete"):
            out.append(f"| {p['name']} | incomplete | | | | | |")
            continue

        ra, rb = c["ratio_same_memory"], c["ratio_quarter_memory"]
        out.append(
            f"| {p['name']} | {_cell(rows, c['threaded_best'])} | "
            f"{_cell(rows, c['processes_best'])} | {_cell(rows, c['processes_within_memory'])} | "
            f"{'-' if ra is None else f'{ra:.2f}'} {'pass' if c['a_pass'] else '**fail**'} | "
            f"{_cell(rows, c['threaded_quarter_memory'])} | "
            f"{'-' if rb is None else f'{rb:.2f}'} {'pass' if c['b_pass'] else '**fail**'} |"
        )
    for p in data["latency"]:
        out += [
            "",
            f"**{p['name']}** ({p['description']}): samples/s, median of rounds (range); "
            "worker memory (USS, sum over workers)",
            "",
            "| configuration | samples/s | range | worker memory |",
            "|---|---|---|---|",
        ]
        for r in p["rows"]:
            if r["samples_per_s"] is None:
                out.append(f"| {r['label']} | failed: {r['errors'][:1]} | | |")
                continue
            out.append(
                f"| {r['label']} | {r['samples_per_s']:,.0f} | {r['min']:,.0f}–{r['max']:,.0f} "
                f"| {_mib(r['workers_uss_bytes'])} |"
            )
    if data["cpu"]:
        out += [
            "",
            "CPU-bound pipelines, `tune(allow_threads=True)` at its defaults: threads must not be "
            "picked unless a threaded trial measured faster than every processes-only one.",
            "",
            "| pipeline | kind | pick | threaded trials | picked threads | pass |",
            "|---|---|---|---|---|---|",
        ]
        for c in data["cpu"]:
            out.append(
                f"| {c['name']} | {c['kind']} | {c['pick']}: {c['pick_samples_per_s']:,.0f} | "
                f"{len(c['threaded_trials'])} | {c['picked_threads']} | "
                f"{'pass' if c['pass'] else '**fail**'} |"
            )
    return "\n".join(out) + "\n"


def chart(data: dict[str, Any], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(1, len(data["latency"])), squeeze=False)[0]
    for ax, p in zip(axes, data["latency"], strict=False):
        rows = [r for r in p["rows"] if r["samples_per_s"] and r["workers_uss_bytes"]]  # log x
        for threaded, style, label in ((False, "o-", "processes only"), (True, "s", "threaded")):
            pts = sorted(
                (r["workers_uss_bytes"] / 2**20, r["samples_per_s"], r["label"])
                for r in rows
                if r["threaded"] == threaded
            )
            if pts:
                x, y, _ = zip(*pts, strict=True)
                ax.plot(x, y, style, label=label, ms=5)
        ax.set_xscale("log")
        ax.set_xlabel("worker memory, MiB (USS, log scale)")
        ax.set_ylabel("samples/s (median of rounds)")
        ax.set_title(f"{p['name']}: {p['description']}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def write(data: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "threads.json").write_text(json.dumps(data, indent=1))
    (out / "threads.md").write_text(markdown(data))
    chart(data, out / "threads.png")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round, fewer configurations")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default {ROUNDS}, quick 1)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    ap.add_argument("--render", metavar="JSON", help="render a saved run again, no measuring")
    ap.add_argument(
        "--latency", default=",".join(LATENCY), help=f"of {','.join(LATENCY)} (default both)"
    )
    ap.add_argument("--latency-only", action="store_true", help="skip the CPU-bound tunes")
    args = ap.parse_args(argv)
    args.latency = [n for n in args.latency.split(",") if n]
    unknown = [n for n in args.latency if n not in LATENCY]
    if unknown:
        ap.error(f"unknown latency pipelines {unknown}")
    if args.render:
        data = json.loads(Path(args.render).read_text())
        write(data, args.out)
        print(markdown(data))
        return 0
    args.rounds = args.rounds or (1 if args.quick else ROUNDS)
    return guarded(lambda: run(args), args.out, markdown)


if __name__ == "__main__":
    sys.exit(main())
