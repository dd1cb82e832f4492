"""What does autotune read of the main process's hand-off, pipeline by pipeline?

For each pipeline, ``feedrate.autotune(loader, cache=False)`` under the simulated consumer of
``benchmarks/autotune.py`` (a sleep of samples / R per batch, R half the pipeline's best rate),
for ``--epochs`` epochs (``--start W``: from a loader of W workers). Per trial of its search:
the samples/s delivered, the stall, the main process's CPU (cores), the share of the loop's wait
in ``next()`` its thread spent on a CPU (``wait_cpu``), that CPU time against the workers' CPU
time, and whether ``search.online_steps.receiving`` calls the main process busy receiving
batches (which lets the search try no workers, and stops a climb from one worker behind none).

    python benchmarks/handoff.py                              # 6 pipelines, 2 epochs (~5 min)
    python benchmarks/handoff.py --pipelines tabular --start 1

Results: ``benchmarks/results/handoff.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

from autotune import EPOCH_S, consumer_rate, long_epoch
from common import commit_label, guarded, machine_line, provenance

import feedrate
from feedrate.loader.batches import sample_counter
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import rebuild
from feedrate.machine.facts import collect
from feedrate.results.trial import Trial
from feedrate.search.online_steps import receiving

from pipelines import BY_NAME

SCHEMA = "feedrate.bench.handoff/1"
PIPELINES = "tabular,records,skewed,tokenize,images,remote"


def row(t: Trial) -> dict[str, Any]:
    return {
        "config": t.config.label(),
        "workers": t.config.num_workers,
        "samples_per_s": t.median,
        "stall": t.stall_fraction or 0.0,
        "main_cpu": t.main_cpu,
        "workers_cpu": t.workers_cpu,
        "wait_cpu": t.wait_cpu,
        "receive_cpu": t.receive_cpu,
        "against_workers": (t.receive_cpu or 0.0) / t.workers_cpu if t.workers_cpu > 0 else None,
        "receiving": receiving(t),
    }


def pipeline(name: str, epochs: int, start: int | None) -> dict[str, Any]:
    loader = BY_NAME[name].factory()
    rate, source = consumer_rate(name, loader, collect().cpus_usable)
    loader = long_epoch(loader, rate, EPOCH_S)
    if start is not None:
        cfg = LoaderConfig(start, prefetch_factor=2, persistent_workers=True) if start else None
        loader = rebuild(loader, cfg or LoaderConfig(0))
    count = sample_counter(loader)
    times = []
    with feedrate.autotune(loader, cache=False) as auto:
        for _ in range(epochs):
            began = time.perf_counter()
            for batch in auto:
                time.sleep(count(batch) / rate)
            times.append(time.perf_counter() - began)
        report = auto.report()
        settled = auto.config.label()
    trials = [row(t) for t in report.trials if t.median > 0]
    for t in trials:
        print(
            f"{name:<9} {t['config']:<22} {t['samples_per_s']:>9,.0f}/s stall {t['stall']:.2f} "
            f"wait_cpu {t['wait_cpu'] or 0:.2f} vs workers "
            f"{t['against_workers'] if t['against_workers'] is not None else float('nan'):.2f} "
            f"{'receiving' if t['receiving'] else ''}",
            flush=True,
        )
    return {
        "name": name,
        "rate": rate,
        "rate_source": source,
        "epochs_s": times,
        "settled": settled,
        "trials": trials,
    }


def run(names: list[str], epochs: int, start: int | None, out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **provenance(),
        "machine": collect().to_dict(),
        "pipelines": [],
    }
    for name in names:
        doc["pipelines"].append(pipeline(name, epochs, start))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(render(doc))
    return doc


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"# The main process's hand-off, as autotune reads it ({doc['date']}, {commit_label(doc)})",
        "",
        f"Machine: {machine_line(doc['machine'])}. Command: `{doc['command']}`.",
        "",
        "| pipeline | trial | samples/s | stall | main CPU | wait on a CPU "
        "| its CPU / workers' | receiving | settled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in doc["pipelines"]:
        for t in p["trials"]:
            share = t["against_workers"]
            lines.append(
                f"| {p['name']} | {t['config']} | {t['samples_per_s']:,.0f} | {t['stall']:.2f} "
                f"| {t['main_cpu']:.2f} | {t['wait_cpu'] or 0:.2f} "
                f"| {'-' if share is None else f'{share:.2f}'} "
                f"| {'yes' if t['receiving'] else 'no'} | {p['settled']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipelines", default=PIPELINES, help="comma-separated names")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--start", type=int, default=None, help="the loader's workers to start from")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/handoff"))
    args = ap.parse_args()
    names = args.pipelines.split(",")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown pipelines: {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    return guarded(lambda: run(names, args.epochs, args.start, args.out), args.out, render)


if __name__ == "__main__":
    sys.exit(main())
