"""What does watching forked workers start (``feedrate.loader.started``) cost a start?

Every DataLoader feedrate starts with forked workers waits, after ``iter()``, until each worker
has marked that it reached ``worker_init_fn``, so that one hung in its fork is seen. A worker's
first batch cannot come before its start either, so the wait should cost little: this measures
it. For each worker count, rounds of two arms, interleaved (the order alternating):

* ``plain``: ``iter(loader)``, then its first batch;
* ``watched``: the loader's starts watched (``Starts``), ``started.iterate`` (``iter`` and the
  wait), then its first batch.

Per start: the seconds until ``iter`` (and the wait) returned, and until the first batch. The
medians and the ratio of the medians go to ``benchmarks/results/start-watch.{json,md}``.

    python benchmarks/start_watch.py                     # 2, 8, 32 and 96 workers, 7 rounds
    python benchmarks/start_watch.py --workers 8 --rounds 11
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import commit_label, guarded, machine_line, provenance
from torch.utils.data import DataLoader, TensorDataset

from feedrate.loader import started
from feedrate.loader.rebuild import allow_many_workers, quiet_worker_count_warning
from feedrate.machine.facts import collect
from feedrate.measuring.failures import stop_workers

SCHEMA = "feedrate.bench.start_watch/1"
ARMS = ("plain", "watched")


def start(workers: int, arm: str) -> dict[str, float]:
    """One start of a loader of ``workers`` forked workers: seconds to ``iter`` (and the wait)
    returning, and to its first batch."""
    data = TensorDataset(torch.arange(4096.0))
    with quiet_worker_count_warning():  # more workers than CPUs, on purpose
        loader = allow_many_workers(DataLoader(data, batch_size=16, num_workers=workers))
    starts = started.Starts(loader) if arm == "watched" else None
    began = time.perf_counter()
    it: Any = None
    try:
        if starts is None:
            it = iter(loader)
        else:
            it = started.iterate(lambda: iter(loader), starts, stop_workers)
        returned = time.perf_counter() - began
        next(it)
        first = time.perf_counter() - began
    finally:
        stop_workers(it)
    return {"iter_s": returned, "first_batch_s": first}


def run(counts: list[int], rounds: int, out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **provenance(),
        "machine": collect().to_dict(),
        "counts": [],
    }
    for workers in counts:
        got: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
        for r in range(rounds):
            for arm in ARMS if r % 2 == 0 else reversed(ARMS):
                got[arm].append(start(workers, arm))
                last = got[arm][-1]
                print(
                    f"w={workers:<3} {arm:<7} iter {last['iter_s'] * 1e3:7.1f} ms, first batch "
                    f"{last['first_batch_s'] * 1e3:7.1f} ms",
                    flush=True,
                )
        doc["counts"].append({"workers": workers, "rounds": got})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(render(doc))
    return doc


def median_ms(rounds: list[dict[str, float]], key: str) -> float:
    return 1e3 * statistics.median(r[key] for r in rounds)


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"# Watching forked workers start ({doc['date']}, {commit_label(doc)})",
        "",
        f"Machine: {machine_line(doc['machine'])}. Command: `{doc['command']}`.",
        "",
        "| workers | rounds | iter, plain | iter + wait, watched | first batch, plain "
        "| first batch, watched | watched / plain (first batch) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in doc["counts"]:
        plain, watched = c["rounds"]["plain"], c["rounds"]["watched"]
        first_p, first_w = median_ms(plain, "first_batch_s"), median_ms(watched, "first_batch_s")
        lines.append(
            f"| {c['workers']} | {len(plain)} | {median_ms(plain, 'iter_s'):.1f} ms "
            f"| {median_ms(watched, 'iter_s'):.1f} ms | {first_p:.1f} ms | {first_w:.1f} ms "
            f"| {first_w / first_p:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,8,32,96", help="worker counts (default 2,8,32,96)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per count (default 7)")
    ap.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/start-watch"), help="results stem"
    )
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    return guarded(lambda: run(counts, args.rounds, args.out), args.out, render)


if __name__ == "__main__":
    sys.exit(main())
