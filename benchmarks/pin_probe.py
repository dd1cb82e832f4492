"""Where a batch's time goes with and without ``pin_memory``, on one machine with a CUDA device.

    python benchmarks/pin_probe.py [PIPELINE] [--rounds N] [--batches N] [--json PATH]

For a pipeline of ``benchmarks/pipelines.py`` (default ``large``: 12 MiB batches), it alternates
``pin_memory`` off and on, round after round in one process, and times each batch's three parts
on the host clock: making it (``next`` on the loader, which pins when ``pin_memory`` is on), the
copy to the device (``non_blocking`` when pinned, then a wait for the device), and in all. It runs
with the main process's torch threads as they are and with one thread (a DataLoader worker's
setting), and with 0 and 2 workers. The last batch stays referenced while the next is made, as
``for batch in loader:`` holds it; with 0 workers it also runs "dropped", each batch released
before the next is made (how the first version of this probe ran). It prints the median of each
part per configuration and the caching host allocator's counters, so a pinned run slower than a
pageable one shows which part grew. ``tune``'s trials time the loop end to end; this is the
breakdown.

With ``--feedrate`` it then measures the same pipeline with 0 workers through feedrate's own
``measure`` (the loop ``tune``'s trials run), pinned and not, interleaved: as ``tune`` runs it,
without its process probe (the thread that reads /proc while windows are open), and without
that nor the wrappers that name a failing sample. On an H200 the plain loop ran 1.65x faster
pinned while ``tune``'s pinned trial of ``large`` read slower (docs/accelerator.md): this
tells the loop's cost from the pipeline's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipelines


def _one_round(
    pipeline: str, workers: int, pin: bool, batches: int, keep: bool = True
) -> dict[str, float]:
    """One loader's batches timed in three parts. ``keep``: the last batch stays referenced
    while the next is made, as in ``for batch in loader:`` (and feedrate's loop); else it is
    dropped first, so the allocators get its memory back before the next batch needs some."""
    base = getattr(pipelines, pipeline)()
    loader = torch.utils.data.DataLoader(
        base.dataset,
        batch_size=base.batch_size,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=False,
    )
    make, copy, total = [], [], []
    it = iter(loader)
    for i in range(batches + 4):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        t1 = time.perf_counter()
        on_device = batch.to("cuda", non_blocking=pin)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        del on_device
        if not keep:
            del batch
        if i >= 4:  # the first batches start the workers and fill the allocators
            make.append(t1 - t0)
            copy.append(t2 - t1)
            total.append(t2 - t0)
    del it
    return {
        "make_ms": 1e3 * statistics.median(make),
        "copy_ms": 1e3 * statistics.median(copy),
        "total_ms": 1e3 * statistics.median(total),
    }


def _commit() -> str:
    """The checkout's commit, or "unknown" (a copy without git)."""
    try:
        here = Path(__file__).resolve().parent
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _feedrate_rounds(pipeline: str, rounds: int, seconds: float) -> dict[str, list[float]]:
    """samples/s of feedrate's ``measure`` with 0 workers, pinned or not, in three variants:
    as ``tune`` runs it; without the process probe's polling thread; and without that nor the
    dataset and collate wrappers that name a failing sample (``report_index=False``). The order
    turns round by round, so no variant always runs first."""
    from feedrate.loader.config import LoaderConfig
    from feedrate.measuring import measure as measuring
    from feedrate.measuring.processes import ProcessProbe

    real_poll = ProcessProbe._poll

    def no_poll(self: ProcessProbe) -> None:
        self._stop.wait()

    variants = [("as tune", True, True), ("no probe", False, True), ("bare", False, False)]
    runs = [(v, pin) for v in variants for pin in (False, True)]
    out: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            for (name, probe, index), pin in runs if r % 2 == 0 else runs[::-1]:
                ProcessProbe._poll = real_poll if probe else no_poll  # type: ignore[method-assign]
                config = LoaderConfig(num_workers=0, pin_memory=pin)
                source = getattr(pipelines, pipeline)
                result = measuring.measure(source, config, seconds=seconds, report_index=index)
                key = f"measure w=0 pin={'on' if pin else 'off'} {name}"
                out.setdefault(key, []).append(result.samples_per_s)
    finally:
        ProcessProbe._poll = real_poll  # type: ignore[method-assign]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", nargs="?", default="large")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--feedrate", action="store_true", help="also time feedrate's measure")
    parser.add_argument("--seconds", type=float, default=3.0, help="per --feedrate measurement")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("pin_probe: no CUDA device here; nothing to measure")
        return 0
    torch.zeros(1, device="cuda")
    threads_as_is = torch.get_num_threads()
    rows: dict[str, list[dict[str, float]]] = {}
    for threads in sorted({threads_as_is, 1}, reverse=True):
        torch.set_num_threads(threads)
        for workers, keep in ((0, True), (0, False), (2, True)):
            for r in range(args.rounds):
                for pin in (False, True) if r % 2 == 0 else (True, False):
                    key = f"threads={threads} w={workers} pin={'on' if pin else 'off'}"
                    key += "" if keep else " dropped"
                    rows.setdefault(key, []).append(
                        _one_round(args.pipeline, workers, pin, args.batches, keep)
                    )
    torch.set_num_threads(threads_as_is)
    result: dict[str, Any] = {
        "pipeline": args.pipeline,
        "rounds": args.rounds,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": _commit(),
        "configs": {},
    }
    print(f"{args.pipeline}: median ms per batch over {args.rounds} interleaved rounds")
    print(f"{'config':32} {'make':>8} {'copy':>8} {'total':>8}")
    for key, rounds in rows.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        result["configs"][key] = {"median": med, "rounds": rounds}
        print(f"{key:32} {med['make_ms']:8.2f} {med['copy_ms']:8.2f} {med['total_ms']:8.2f}")
    if args.feedrate:
        runs = _feedrate_rounds(args.pipeline, args.rounds, args.seconds)
        result["feedrate"] = runs
        for key, rates in runs.items():
            print(f"{key:40} {statistics.median(rates):10,.0f} samples/s (median)")
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is not None:
        host = {k: v for k, v in stats().items() if "alloc" in k or "free" in k or "num" in k}
        result["host_memory_stats"] = host
        print("caching host allocator:", json.dumps(host, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
