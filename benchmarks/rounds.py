"""An epoch in rounds: worker counts that make an epoch in the same number of rounds, measured
side by side.

In order, DataLoader hands an epoch's batches to its workers in turn, so the epoch lasts as long
as the busiest worker's ``ceil(batches / workers)`` batches (``feedrate.search.rounds``). This
measures a pipeline at worker counts either side of a round's edge (by default ``remote``'s 128
batches an epoch: 43, 49 and 63 workers make it in 3 rounds, 64 and 96 in 2), each as tune
measures a trial (2 s, 4 windows, pf=2, persistent), the order reversed every other round, and
gives each count's median and its ratio to the fewest workers of the fewest rounds, round by
round.

    python benchmarks/rounds.py                                  # remote, 43,49,63,64,96, 6 rounds
    python benchmarks/rounds.py --pipeline remote --workers 32,43,64,128 --rounds 4

Writes ``rounds.{json,md}`` under ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import commit_label, guarded, machine_line, provenance
from tune_vs_grid import measure_one

import feedrate
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.search.rounds import fewest_alike, rounds

from pipelines import BY_NAME, epoch_batches

SCHEMA = "feedrate.bench.rounds/1"


def bench(args: argparse.Namespace) -> dict[str, Any]:
    facts = collect()
    loader = BY_NAME[args.pipeline].factory()
    batches = epoch_batches(loader)
    if batches is None:
        sys.exit(f"rounds.py: {args.pipeline} has no epoch length (a stream): nothing to compare")
    counts = sorted(set(args.workers))
    rates: dict[int, list[float]] = {w: [] for w in counts}
    per_round: list[dict[int, float]] = []
    for r in range(args.rounds):
        order = counts if r % 2 == 0 else list(reversed(counts))
        got: dict[int, float] = {}
        for w in order:
            cfg = LoaderConfig(w, prefetch_factor=2, persistent_workers=True)
            trial, _ = measure_one(loader, cfg, facts)
            got[w] = trial.median
            rates[w].append(trial.median)
        per_round.append(got)
        print(f"round {r + 1}: " + ", ".join(f"w={w} {v:,.0f}" for w, v in got.items()), flush=True)
    ref = min(counts, key=lambda w: (rounds(w, batches), w))
    rows = []
    for w in counts:
        ratios = [g[w] / g[ref] for g in per_round if g[ref] > 0]
        rows.append(
            {
                "workers": w,
                "rounds": rounds(w, batches),
                "fewest_alike": fewest_alike(w, batches),
                "median": statistics.median(rates[w]),
                "rates": rates[w],
                "ratio": statistics.median(ratios) if ratios else None,
                "ratio_range": [min(ratios), max(ratios)] if ratios else None,
            }
        )
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/rounds.py " + " ".join(sys.argv[1:]),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "machine": facts.to_dict(),
        "pipeline": args.pipeline,
        "epoch_batches": batches,
        "reference": ref,
        "rows": rows,
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# An epoch in rounds: {data['pipeline']}, {data['epoch_batches']} batches an epoch",
        "",
        f"`{data['command']}` — {data['date']}, commit {commit_label(data)}.",
        "",
        f"Machine: {machine_line(data['machine'])}.",
        "",
        f"Each count pf=2, persistent, measured as a tune trial; ratio: over w={data['reference']}"
        " (the fewest workers of the fewest rounds) in the same round, median (range).",
        "",
        "| workers | rounds an epoch | fewest for those rounds | samples/s (median) | ratio |",
        "|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        lo, hi = row["ratio_range"] or (0.0, 0.0)
        lines.append(
            f"| {row['workers']} | {row['rounds']} | {row['fewest_alike']} | "
            f"{row['median']:,.0f} | **{row['ratio']:.2f}** ({lo:.2f}–{hi:.2f}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="remote", choices=sorted(BY_NAME))
    parser.add_argument(
        "--workers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[43, 49, 63, 64, 96],
        help="comma-separated worker counts",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    def run() -> dict[str, Any]:
        data = bench(args)
        (args.out / "rounds.json").write_text(json.dumps(data, indent=1) + "\n")
        (args.out / "rounds.md").write_text(markdown(data))
        return data

    return guarded(run, args.out, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
