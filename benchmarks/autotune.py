"""What does ``feedrate.autotune`` cost while it tunes, and once it is tuned?

For each pipeline of ``pipelines.py`` a simulated accelerator consumes the batches: a sleep of
``samples / R`` per batch, with R = ``RATE_SHARE`` of the pipeline's best loader-only rate (read
from ``benchmarks/results/tune_vs_grid.json``, else measured here at one worker per CPU). Map-style
pipelines iterate a longer epoch (their indices repeated to about ``EPOCH_S`` seconds at R), so
an epoch is long against worker start-up, as in training.

1. *Static*: a few fixed configurations (pf=2, persistent), each on a fresh loader for
   ``SCREEN_EPOCHS`` epochs: the fewest workers that kept this consumer fed in tune_vs_grid's
   consumer grid, half and twice that (or 1, 2, 4, 8 when unknown). The best static configuration
   is the one with the shortest steady epoch (epochs after the first).
2. *Autotune against it, interleaved*: ``feedrate.autotune(loader, cache=False)`` and a fresh
   loader with the best static configuration, ``EPOCHS`` epochs each, one epoch of each in turn
   (the order alternating), so a drifting machine affects both alike. Criteria (issue 5): the
   first epoch ≤ 1.15 × the static first epoch; later epochs (median) ≤ 1.03 × the static ones.
3. *Watching*: the best static loader against ``autotune`` started from that configuration (as
   after an earlier run: from the cache, so it only watches), one epoch each, alternating order,
   ``ROUNDS`` rounds after a first epoch each. Consecutive rounds form A-B-B-A blocks, each
   compared whole (autotune's two epochs over the static loader's two): an epoch right after the
   other loader's can be slower than one after its own (``large`` showed ±30% that way), and a
   block gives each side one of each. Criterion: the median block ratio ≤ 1.01.

    python benchmarks/autotune.py                          # all pipelines (~30 min)
    python benchmarks/autotune.py --pipelines images,remote,tabular --quick
    python benchmarks/autotune.py --render benchmarks/results/autotune.json
    python benchmarks/autotune.py --watching-from benchmarks/results/autotune.json \
        --pipelines tabular,large --rounds 15      # step 3 only, with the main process's CPU

Results: ``benchmarks/results/autotune.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from common import commit_label, guarded, machine_line, provenance
from torch.utils.data import DataLoader, Sampler

import feedrate
from feedrate.loader.batches import sample_counter
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import is_iterable_style, rebuild
from feedrate.machine import cache
from feedrate.machine.facts import collect
from feedrate.measuring.measure import measure
from feedrate.results.autotune import AutotuneReport

from pipelines import BY_NAME, PIPELINES

SCHEMA = "feedrate.bench.autotune/1"
RATE_SHARE = 0.5
EPOCH_S, QUICK_EPOCH_S = 12.0, 6.0
EPOCHS, ROUNDS, SCREEN_EPOCHS = 3, 8, 2
FIRST_MAX, LATER_MAX, WATCH_MAX = 1.15, 1.03, 1.01


class Repeat(Sampler[int]):
    """The indices ``0..n-1``, ``times`` times over, in order."""

    def __init__(self, n: int, times: int) -> None:
        self.n, self.times = n, times

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.times):
            yield from range(self.n)

    def __len__(self) -> int:
        return self.n * self.times


def long_epoch(loader: DataLoader[Any], rate: float, epoch_s: float) -> DataLoader[Any]:
    """The same pipeline with its indices repeated to about ``epoch_s`` at ``rate``."""
    if is_iterable_style(loader) or loader.batch_size is None:
        return loader
    n = len(loader.dataset)  # type: ignore[arg-type]
    times = max(1, round(epoch_s * rate / n))
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=Repeat(n, times),
        collate_fn=loader.collate_fn,
        drop_last=loader.drop_last,
    )


def grid_record(name: str) -> dict[str, Any] | None:
    path = Path("benchmarks/results/tune_vs_grid.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return next((p for p in data.get("pipelines", []) if p["name"] == name), None)


def consumer_rate(name: str, loader: DataLoader[Any], cpus: int) -> tuple[float, str]:
    record = grid_record(name)
    if record is not None:
        return RATE_SHARE * record["grid"]["best"]["median"], "tune_vs_grid.json grid best"
    cfg = LoaderConfig(cpus, prefetch_factor=2, persistent_workers=True)
    m = measure(loader, cfg, seconds=3.0)
    return RATE_SHARE * m.samples_per_s, f"measured here at {cfg.label()}"


def static_candidates(name: str) -> list[int]:
    record = grid_record(name)
    fed = None if record is None else record["consumer"].get("fed_w")
    if fed is None and record is not None:
        entries = record["consumer"]["consumer_grid"]["configs"]
        measured = [e for e in entries if e["trial"].get("stall_fraction") is not None]
        if measured:
            fed = min(measured, key=lambda e: e["trial"]["stall_fraction"])["trial"]["config"][
                "num_workers"
            ]
    if fed is None:
        return [1, 2, 4, 8]
    return sorted({max(0, fed // 2), fed, max(1, fed * 2)})


def run_epochs(loader: Any, count: Any, rate: float, epochs: int) -> list[float]:
    """Wall time of each epoch with the simulated consumer."""
    times = []
    for _ in range(epochs):
        began = time.perf_counter()
        for batch in loader:
            time.sleep(count(batch) / rate)
        times.append(time.perf_counter() - began)
    return times


def static(loader: DataLoader[Any], w: int, rate: float, epochs: int) -> dict[str, Any]:
    cfg = LoaderConfig(w, prefetch_factor=2, persistent_workers=w > 0)
    run = rebuild(loader, cfg)
    times = run_epochs(run, sample_counter(loader), rate, epochs)
    del run
    return {"config": cfg.to_dict(), "label": cfg.label(), "epochs": times}


def watching(
    loader: DataLoader[Any], best: LoaderConfig, rate: float, rounds: int
) -> dict[str, Any]:
    """The static best against autotune started from it (it only watches), interleaved."""
    facts = collect()
    before = os.environ.get("FEEDRATE_CACHE_DIR")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["FEEDRATE_CACHE_DIR"] = folder
        cache.save(
            cache.key(facts, loader, cache.autotune_options(max_workers=None, allow_threads=False)),
            {"schema": "feedrate.autotune/1", "config": best.to_dict()},
        )
        plain = rebuild(loader, best)
        auto = feedrate.autotune(loader, machine=facts)
        count = sample_counter(loader)
        run_epochs(plain, count, rate, 1)  # first epochs: worker start-up, not watching
        run_epochs(auto, count, rate, 1)
        pairs, cpu_pairs = [], []
        for r in range(rounds):
            order = [("static", plain), ("autotune", auto)]
            got: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for label, it in order if r % 2 == 0 else reversed(order):
                cpu0 = time.process_time()
                got[label] = run_epochs(it, count, rate, 1)[0]
                cpu[label] = time.process_time() - cpu0
            pairs.append(got)
            cpu_pairs.append(cpu)
        settled_on = auto.config.label()
        retunes = auto.report().retunes
        auto.close()
        del plain
    if before is None:
        os.environ.pop("FEEDRATE_CACHE_DIR", None)
    else:
        os.environ["FEEDRATE_CACHE_DIR"] = before
    # The main process's CPU time per epoch (all of the loading without workers): the watching's
    # own cost, far less noisy than the epoch's wall time on a shared machine.
    return {
        "rounds": pairs,
        "ratio_median": statistics.median(block_ratios(pairs)),
        "ratios": [p["autotune"] / p["static"] for p in pairs],
        "main_cpu_rounds": cpu_pairs,
        "main_cpu_ratio_median": statistics.median(block_ratios(cpu_pairs)),
        "config": settled_on,
        "retunes": retunes,
    }


def block_ratios(rounds: list[dict[str, float]]) -> list[float]:
    """Autotune over static per A-B-B-A block (two consecutive rounds, in opposite orders);
    a lone round (fewer than two) counts as its own ratio."""
    blocks = [rounds[i : i + 2] for i in range(0, len(rounds) - 1, 2)] or [rounds]
    return [
        sum(r["autotune"] for r in b) / sum(r["static"] for r in b)
        for b in blocks
        if sum(r["static"] for r in b) > 0
    ]


def paired(
    loader: DataLoader[Any], best: LoaderConfig, rate: float, epochs: int
) -> tuple[list[float], list[float], AutotuneReport]:
    """Fresh autotune and a fresh static loader, one epoch of each in turn (order alternating):
    the epoch times of each and autotune's report."""
    plain = rebuild(loader, best)
    auto = feedrate.autotune(loader, cache=False)
    count = sample_counter(loader)
    times: dict[str, list[float]] = {"static": [], "autotune": []}
    order: list[tuple[str, Any]] = [("static", plain), ("autotune", auto)]
    for e in range(epochs):
        for label, it in order if e % 2 == 0 else reversed(order):
            times[label] += run_epochs(it, count, rate, 1)
    report = auto.report()
    auto.close()
    del plain
    return times["static"], times["autotune"], report


def bench(name: str, quick: bool, rounds: int) -> dict[str, Any]:
    p = BY_NAME[name]
    base = p.factory()
    cpus = collect().cpus_usable
    rate, source = consumer_rate(name, base, cpus)
    loader = long_epoch(base, rate, QUICK_EPOCH_S if quick else EPOCH_S)
    epochs = 2 if quick else EPOCHS
    statics = []
    for w in static_candidates(name):
        s = static(loader, w, rate, SCREEN_EPOCHS)
        statics.append(s)
        print(f"{name:<9} static {s['label']:<22} epochs {_fmt(s['epochs'])}", flush=True)
    best = min(statics, key=lambda s: (statistics.median(s["epochs"][1:]), s["epochs"][0]))
    static_times, auto_times, report = paired(
        loader, LoaderConfig.from_dict(best["config"]), rate, epochs
    )
    print(
        f"{name:<9} autotune → {report.config.label():<18} epochs {_fmt(auto_times)}; "
        f"{best['label']} alongside: {_fmt(static_times)}",
        flush=True,
    )
    first_ratio = auto_times[0] / static_times[0]
    later_ratio = statistics.median(auto_times[1:]) / statistics.median(static_times[1:])
    watch = watching(loader, LoaderConfig.from_dict(best["config"]), rate, rounds)
    print(f"{name:<9} watching: ratio {watch['ratio_median']:.3f}", flush=True)
    return {
        "name": name,
        "kind": p.kind,
        "rate": rate,
        "rate_source": source,
        "epoch_batches": len(loader) if not is_iterable_style(loader) else None,
        "static": statics,
        "best_static": best["label"],
        "best_static_alongside": static_times,
        "autotune": {
            "epochs": auto_times,
            "config": report.config.label(),
            "report": report.to_dict(),
        },
        "first_ratio": first_ratio,
        "later_ratio": later_ratio,
        "watching": watch,
        "criteria": {
            "first": first_ratio <= FIRST_MAX,
            "later": later_ratio <= LATER_MAX,
            "watching": watch["ratio_median"] <= WATCH_MAX,
        },
    }


def watch_only(name: str, earlier: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Step 3 alone, on the best static configuration and rate of an earlier run's record."""
    p = BY_NAME[name]
    loader = long_epoch(p.factory(), earlier["rate"], EPOCH_S)
    best = next(s for s in earlier["static"] if s["label"] == earlier["best_static"])
    watch = watching(loader, LoaderConfig.from_dict(best["config"]), earlier["rate"], rounds)
    print(
        f"{name:<9} watching: ratio {watch['ratio_median']:.3f}, main-process CPU "
        f"{watch['main_cpu_ratio_median']:.4f}",
        flush=True,
    )
    return {
        "name": name,
        "kind": p.kind,
        "rate": earlier["rate"],
        "best_static": earlier["best_static"],
        "watching": watch,
        "criteria": {"watching": watch["ratio_median"] <= WATCH_MAX},
    }


def watching_markdown(data: dict[str, Any]) -> str:
    out = [
        "# autotune: the cost of watching",
        "",
        f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']}"
        f" (commit {commit_label(data)}), {data.get('wall_s', 0) / 60:.0f} min; "
        "configurations and rates from "
        f"`{data['watching_from']}`.",
        "",
        f"Machine: {machine_line(data['machine'])}.",
        "",
        "The best static loader against autotune started from it (from the cache: it only "
        "watches), one epoch of each in turn, the order alternating; each figure is the median "
        "over A-B-B-A blocks of two rounds. Wall: the epoch's time; CPU: the main process's CPU "
        "time in the epoch.",
        "",
        "| pipeline | configuration | rounds | wall, autotune / static (range of blocks) | "
        "CPU, autotune / static (range of blocks) | re-tunes | ≤ 1.01 |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in data["pipelines"]:
        w = p["watching"]
        wall, cpu = block_ratios(w["rounds"]), block_ratios(w["main_cpu_rounds"])
        out.append(
            f"| {p['name']} | {w['config']} | {len(w['ratios'])} | {w['ratio_median']:.3f} "
            f"({min(wall):.3f}–{max(wall):.3f}) | "
            f"{w['main_cpu_ratio_median']:.4f} ({min(cpu):.3f}–{max(cpu):.3f}) | "
            f"{w['retunes']} | {_mark(p['criteria']['watching'])} |"
        )
    return "\n".join(out) + "\n"


def _fmt(times: list[float]) -> str:
    return ", ".join(f"{t:.2f} s" for t in times)


def _mark(ok: bool) -> str:
    return "pass" if ok else "**fail**"


def markdown(data: dict[str, Any]) -> str:
    out = [
        f"# autotune while training runs{' (--quick)' if data['quick'] else ''}",
        "",
        f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']}"
        f" (commit {commit_label(data)}), {data.get('wall_s', 0) / 60:.0f} min.",
        "",
        f"Machine: {machine_line(data['machine'])}.",
        "",
        f"Consumer: a sleep of samples / R per batch, R = {RATE_SHARE:.0%} of the pipeline's best "
        f"loader-only rate. Criteria: first epoch ≤ {FIRST_MAX} × the best static first epoch; "
        f"later epochs ≤ {LATER_MAX} × its steady epoch; watching ≤ {WATCH_MAX} × static. "
        "Where the run has them, the best static's epochs are those run alongside autotune "
        "(one epoch of each in turn).",
        "",
        "| pipeline | kind | R (samples/s) | best static | its epochs | autotune settled on | "
        "autotune epochs | first / static | later / static | watching / static (range, "
        "blocks) | first | "
        "later | watching |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in data["pipelines"]:
        # Runs before the interleaved comparison: the best static's screening epochs.
        alongside = p.get("best_static_alongside") or next(
            s["epochs"] for s in p["static"] if s["label"] == p["best_static"]
        )
        c = p["criteria"]
        w = p["watching"]
        blocks = block_ratios(w["rounds"])
        watched = statistics.median(blocks)
        c = {**c, "watching": watched <= WATCH_MAX}
        out.append(
            f"| {p['name']} | {p['kind']} | {p['rate']:,.0f} | {p['best_static']} | "
            f"{_fmt(alongside)} | {p['autotune']['config']} | "
            f"{_fmt(p['autotune']['epochs'])} | {p['first_ratio']:.3f} | "
            f"{p['later_ratio']:.3f} | {watched:.3f} "
            f"({min(blocks):.3f}–{max(blocks):.3f}, {len(blocks)}) | {_mark(c['first'])} | "
            f"{_mark(c['later'])} | {_mark(c['watching'])} |"
        )
    out += ["", "Static configurations measured (epoch times):", ""]
    for p in data["pipelines"]:
        cells = "; ".join(f"{s['label']}: {_fmt(s['epochs'])}" for s in p["static"])
        out.append(f"* {p['name']}: {cells}")
    return "\n".join(out) + "\n"


def render(data: dict[str, Any]) -> str:
    return watching_markdown(data) if data.get("watching_from") else markdown(data)


def write(data: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "autotune-watching" if data.get("watching_from") else "autotune"
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(render(data))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter epochs, 2 epochs each")
    ap.add_argument("--pipelines", help="comma-separated (default all)")
    ap.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"watching rounds (default {ROUNDS}, even)"
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    ap.add_argument("--render", metavar="JSON", help="render a saved run again, no measuring")
    ap.add_argument(
        "--watching-from",
        metavar="JSON",
        help="measure only the watching (step 3), on the best static configurations and rates "
        "of this earlier run; results in autotune-watching.*",
    )
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        print(render(data))
        return 0
    earlier: dict[str, Any] = {}
    if args.watching_from:
        earlier = {
            p["name"]: p for p in json.loads(Path(args.watching_from).read_text())["pipelines"]
        }
    names = args.pipelines.split(",") if args.pipelines else [p.name for p in PIPELINES]
    if earlier:
        names = [n for n in names if n in earlier] if args.pipelines else list(earlier)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown pipelines {unknown}; known: {','.join(BY_NAME)}")
    began = time.perf_counter()
    facts = collect()
    print(f"machine: {machine_line(facts.to_dict())}", flush=True)
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", "benchmarks/autotune.py", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "quick": args.quick,
        "watching_from": args.watching_from,
        "machine": facts.to_dict(),
        "pipelines": [],
    }

    def run() -> dict[str, Any]:
        for name in names:
            data["pipelines"].append(
                watch_only(name, earlier[name], args.rounds)
                if earlier
                else bench(name, args.quick, args.rounds)
            )
            data["wall_s"] = time.perf_counter() - began
            write(data, args.out)
        return data

    return guarded(run, args.out, render)


if __name__ == "__main__":
    sys.exit(main())
