"""What does a settled autotune cost the main process per batch, in its own Python?

A loader without workers over a cheap tensor dataset (5,000 batches of 4: the loading itself
costs about 20 µs a batch, so autotune's per-batch work shows), against ``feedrate.autotune``
of the same loader started from settings cached for it (it only watches: the clock and the
loop thread's run-queue time at each batch, the epoch's index stream, the watch's sums).
Epochs alternate (ABBA); the main process's CPU time per batch, median over the epochs, is
printed. ``--profile`` adds a profile of one watching epoch (``PROFILE_FILTER=feedrate``: its
functions alone). ``--workers N``: both loaders with
N persistent workers (prefetch 2), so what the main process does to receive batches is in both.
Then the stall of each of autotune's watch windows, by the clock alone or with the run-queue
time, and what one of its marks costs (``timeit``): with the loop thread's run-queue and CPU
times, and by the clock alone (what a settled autotune reads while the stall stays low).

    python benchmarks/watch_cost.py
    python benchmarks/watch_cost.py --epochs 10 --profile
    python benchmarks/watch_cost.py --workers 12
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import timeit
from typing import Any

import torch
from common import commit_label, machine_line, provenance
from torch.utils.data import DataLoader, TensorDataset

import feedrate
from feedrate.loader.config import LoaderConfig
from feedrate.machine import cache
from feedrate.machine.facts import collect
from feedrate.measuring.runqueue import Marks

DATA = TensorDataset(torch.arange(20000.0))


def make(workers: int = 0) -> DataLoader[Any]:
    if not workers:
        return DataLoader(DATA, batch_size=4)
    return DataLoader(
        DATA, batch_size=4, num_workers=workers, prefetch_factor=2, persistent_workers=True
    )


def epoch_cpu(loader: Any) -> float:
    began = time.process_time()
    for _ in loader:
        pass
    return time.process_time() - began


def mark_costs(calls: int = 200_000) -> str:
    """What one of autotune's marks costs the loop's thread, with the run-queue and CPU times
    (in a trial, or confirming a stall) and by the clock alone (watching under the margin)."""
    marks = Marks(time.perf_counter)
    marks()
    exact = timeit.timeit(marks, number=calls) / calls
    marks.exact = False
    lean = timeit.timeit(marks, number=calls) / calls
    return (
        f"a mark (two a batch): {exact * 1e6:.2f} µs with the run-queue and CPU times, "
        f"{lean * 1e6:.2f} µs by the clock alone"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6, help="epochs of each (default 6)")
    ap.add_argument("--profile", action="store_true", help="profile one watching epoch")
    ap.add_argument("--workers", type=int, default=0, help="workers of both loaders (default 0)")
    args = ap.parse_args(argv)
    facts = collect()
    with tempfile.TemporaryDirectory() as folder:
        os.environ["FEEDRATE_CACHE_DIR"] = folder
        options = cache.autotune_options(max_workers=None, allow_threads=False)
        w = args.workers
        config = LoaderConfig(w, prefetch_factor=2 if w else None, persistent_workers=w > 0)
        settled = {"schema": "feedrate.autotune/1", "config": config.to_dict()}
        # With workers this loop (which does nothing) still waits on them: the stall it settles
        # with is left to the first watch window to measure, or it would read as come back.
        cache.save(cache.key(facts, make(w), options), settled | ({} if w else {"stall": 0.0}))
        plain, auto = make(w), feedrate.autotune(make(w), machine=facts)
        windows: list[tuple[float, bool]] = []  # each watch window's stall, read by the clock
        watched = auto._tuner.watched  # alone or not (before the window's verdict)
        auto._tuner.watched = lambda stall, now: (  # type: ignore[method-assign]
            windows.append((stall, auto._tuner._watch.lean)),
            watched(stall, now),
        )
        epoch_cpu(plain), epoch_cpu(auto)  # warm
        cpu: dict[str, list[float]] = {"plain": [], "autotune": []}
        for r in range(args.epochs):
            for name in ("plain", "autotune") if r % 2 == 0 else ("autotune", "plain"):
                cpu[name].append(epoch_cpu(plain if name == "plain" else auto))
        batches = len(plain)
        per = {k: 1e6 * statistics.median(v) / batches for k, v in cpu.items()}
        print(f"machine: {machine_line(facts.to_dict())}; commit {commit_label(provenance())}")
        print(
            f"{batches} batches an epoch, {w} workers, {args.epochs} epochs each: main-process "
            "CPU per batch "
            f"plain {per['plain']:.1f} µs, autotune watching {per['autotune']:.1f} µs "
            f"(+{per['autotune'] - per['plain']:.1f} µs); re-tunes {auto.report().retunes}"
        )
        print(f"the reference window (the first): {windows[0][0]:.3f}" if windows else "")
        for lean in (True, False):
            read = [f"{x:.3f}" for x, by_clock in windows[1:] if by_clock == lean]
            what = "by the clock alone" if lean else "with the run-queue time"
            print(f"windows read {what}: {len(read)}: {', '.join(read)}")
        print(mark_costs())
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            epoch_cpu(auto)
            prof.disable()
            only = os.environ.get("PROFILE_FILTER", "")  # e.g. feedrate: its functions alone
            pstats.Stats(prof).sort_stats("tottime").print_stats(only, 25)
        auto.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
