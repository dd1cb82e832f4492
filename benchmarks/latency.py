"""Latency-bound pipelines with slow batches: feedrate tune at its defaults against the
processes-only grid (issue #17, item 1).

Object-store-like pipelines: one simulated GET per sample (``examples/remote.py``'s
``RemoteShards``: a ``time.sleep`` of the mean latency ±20%, one request in 100 five times
slower, no CPU), small objects, batch 64, 320 batches an epoch. Without workers a batch takes
0.3-2 s. For each pipeline:

1. the grid: ``num_workers`` in ``GRID_WORKERS`` at prefetch_factor=2, persistent workers,
   each measured as tune measures a trial but for ``GRID_S`` s of steady state;
2. ``feedrate.tune`` at its defaults (60 s budget, no cache), its wall time recorded;
3. tune's pick and the grid's best measured again in ``--rounds`` interleaved rounds
   (order rotating); the ratio is the median of the per-round ratios, with their range.

Target: tune's pick ≥ 0.95 of the grid best on every pipeline, within the default budget.
Also recorded: what threads would give (tune's report-only threaded trial).

    python benchmarks/latency.py                      # 3 pipelines, ~20 min on 2 cores
    python benchmarks/latency.py --latencies 10 --rounds 2

Results: ``benchmarks/results/latency.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import guarded, machine_line, provenance
from torch.utils.data import DataLoader

import feedrate
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring.measure import measure
from feedrate.results.trial import Trial

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from remote import RemoteShards

SCHEMA = "feedrate.bench.latency/1"
GRID_WORKERS = (0, 2, 8, 32, 64, 96, 128, 192, 256, 384, 512)
GRID_S = 4.0
BATCH, BATCHES = 64, 320
LATENCIES_MS = (5.0, 10.0, 25.0)
ROUNDS = 3


def make_loader(latency_ms: float) -> DataLoader[Any]:
    return DataLoader(RemoteShards(BATCH * BATCHES, latency_ms), batch_size=BATCH)


def cfg(w: int) -> LoaderConfig:
    return (
        LoaderConfig(w) if w == 0 else LoaderConfig(w, prefetch_factor=2, persistent_workers=True)
    )


def rate(loader: DataLoader[Any], config: LoaderConfig, facts: MachineFacts) -> float:
    try:
        m = measure(loader, config, seconds=GRID_S, windows_count=4, machine=facts)
    except feedrate.PipelineError as exc:
        print(f"  {config.label()}: failed: {exc}", flush=True)
        return 0.0
    return Trial.of(m, "grid").median


def bench(latency_ms: float, rounds: int, facts: MachineFacts) -> dict[str, Any]:
    name = f"objects-{latency_ms:g}ms"
    loader = make_loader(latency_ms)
    grid = []
    began = time.perf_counter()
    for w in GRID_WORKERS:
        r = rate(loader, cfg(w), facts)
        grid.append({"config": cfg(w).to_dict(), "label": cfg(w).label(), "median": r})
        print(f"{name} grid {cfg(w).label():<24} {r:>10,.0f}", flush=True)
    grid_s = time.perf_counter() - began
    best = max(grid, key=lambda g: g["median"])
    t0 = time.perf_counter()
    tuned = feedrate.tune(lambda: make_loader(latency_ms), use_cache=False)
    tune_s = time.perf_counter() - t0
    pick = tuned.best.config
    print(f"{name} tune: {pick.label()} in {tune_s:.0f} s", flush=True)
    threaded = [t for t in tuned.trials if t.measured and t.config.threads > 1]
    best_cfg = LoaderConfig.from_dict(best["config"])
    distinct = [best_cfg] + ([pick] if pick != best_cfg else [])
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        order = distinct[r % len(distinct) :] + distinct[: r % len(distinct)]
        got = {c.label(): rate(loader, c, facts) for c in order}
        per_round.append(got)
        print(f"{name} round {r + 1}: {got}", flush=True)
    ratios = [g[pick.label()] / g[best_cfg.label()] for g in per_round if g[best_cfg.label()]]
    return {
        "name": name,
        "latency_ms": latency_ms,
        "w0_batch_s": BATCH / grid[0]["median"] if grid[0]["median"] else None,
        "grid": grid,
        "grid_s": grid_s,
        "grid_best": best,
        "tune": {
            "config": pick.to_dict(),
            "label": pick.label(),
            "wall_s": tune_s,
            "search_seconds": tuned.search_seconds,
            "partial": tuned.partial,
            "trials": [
                {"label": t.config.label(), "median": t.median, "reason": t.reason}
                for t in tuned.trials
                if t.measured
            ],
            "threads": [{"label": t.config.label(), "median": t.median} for t in threaded],
        },
        "rounds": per_round,
        "ratio": statistics.median(ratios) if ratios else None,
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Latency-bound pipelines with slow batches: tune against the processes-only grid",
        "",
        f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']} (commit "
        f"{data.get('commit') or '?'}), {data.get('wall_s', 0) / 60:.0f} min.",
        "",
        f"Machine: {machine_line(data['machine'])}.",
        "",
        "Batch 64, 320 batches an epoch, one simulated GET per sample. Grid: num_workers "
        f"{', '.join(map(str, GRID_WORKERS))} at prefetch_factor=2, persistent, {GRID_S:g} s "
        "each. Ratio: tune's pick over the grid best, median of interleaved rounds (range).",
        "",
        "| pipeline | w=0 batch | grid best | tune's pick (tuning time) | ratio | threads "
        "(report only) |",
        "|---|---|---|---|---|---|",
    ]
    for p in data["pipelines"]:
        t = p["tune"]
        thr = ", ".join(f"{x['label']}: {x['median']:,.0f}" for x in t["threads"]) or "—"
        lo, hi = p["ratio_range"] or (0, 0)
        w0 = f"{p['w0_batch_s']:.2f} s" if p["w0_batch_s"] else "?"
        lines.append(
            f"| {p['name']} | {w0} | {p['grid_best']['label']}: "
            f"{p['grid_best']['median']:,.0f} | {t['label']} ({t['wall_s']:.0f} s) | "
            f"**{p['ratio']:.2f}** ({lo:.2f}–{hi:.2f}) | {thr} |"
        )
    return "\n".join(lines) + "\n"


def write(data: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency.json").write_text(json.dumps(data, indent=1))
    (out / "latency.md").write_text(markdown(data))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--latencies", help="mean GET latencies in ms, comma-separated")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    latencies = [float(x) for x in args.latencies.split(",")] if args.latencies else LATENCIES_MS
    facts = collect()
    began = time.perf_counter()
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", "benchmarks/latency.py", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "machine": facts.to_dict(),
        "pipelines": [],
    }

    def run() -> dict[str, Any]:
        for latency in latencies:
            data["pipelines"].append(bench(latency, args.rounds, facts))
            data["wall_s"] = time.perf_counter() - began
            write(data, args.out)
        return data

    return guarded(run, args.out, markdown)


if __name__ == "__main__":
    sys.exit(main())
