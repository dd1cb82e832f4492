"""Does ``feedrate.tune`` find what an exhaustive grid finds, in a fraction of the time?

For each pipeline of ``pipelines.py``:

* the grid: every ``num_workers`` × ``prefetch_factor`` × ``persistent_workers`` (``w=0`` once),
  each measured the way ``tune`` measures a trial (``measure(..., seconds=2.0,
  windows_count=4)``); configurations predicted to exceed the memory or /dev/shm caps, or that
  fail, are recorded as skipped;
* ``tune`` at its defaults (``budget_s=60``, no cache): its pick, its rate, its wall time;
* the grid's best and tune's pick measured again, alternating (AB, BA, AB, ...), because the
  machine drifts: the median of the per-round ratios pick/best is criterion (a) (≥ 0.95);
* criterion (b): tune's wall time ≤ 10% of the grid's and ≤ 60 s;
* criterion (c): ``tune(rate=R)`` with R half the grid's best rate chooses a ``num_workers``
  within one grid step of the fewest-worker grid configuration measuring ≥ 1.05 R; and, as
  ground truth measured with the consumer itself, of the fewest grid workers that keep it fed.

    python benchmarks/tune_vs_grid.py                       # 8 pipelines, full grid: ~3-4 h
    python benchmarks/tune_vs_grid.py --quick               # smaller grid: ~1 h
    python benchmarks/tune_vs_grid.py --quick --pipelines tabular,remote    # ~9 min
    python benchmarks/tune_vs_grid.py --pipelines images --merge   # measure images again and
                                                            # keep the other pipelines' records
    python benchmarks/tune_vs_grid.py --render benchmarks/results/tune_vs_grid.json

Run from the repository root. Results (written again after each pipeline, so an interrupted run
keeps what it finished): ``benchmarks/results/tune_vs_grid.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tune_vs_grid_report as report
from common import earlier_records, git, leftover_children, machine_line, provenance
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.utils.data import DataLoader

import feedrate
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import interrupts
from feedrate.measuring.consumer import Consumer, make_consumer
from feedrate.measuring.measure import measure
from feedrate.results.trial import Trial
from feedrate.search.space import Space, covers, predict_over_budget
from feedrate.workflows.tune import tune

from pipelines import BY_NAME, PIPELINES, Pipeline, epoch_batches, item_cost

FULL_WORKERS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
QUICK_WORKERS = (0, 1, 2, 4, 8, 16, 32, 64)
FULL_PREFETCH, QUICK_PREFETCH = (1, 2, 4, 8), (2, 4)
TRIAL_S, WINDOWS = 2.0, 4  # tune's defaults for one trial
BUDGET_S = 60.0  # tune's default budget
ROUNDS = 5  # interleaved re-measurements of each side (at ±15% per measurement, 3 are too few)
RATE_SHARE, COVER_MARGIN = 0.5, 1.05
SHM_CAP, MEMORY_CAP = 2 * 2**30, 6 * 2**30  # bytes the grid may plan for (shared machine)

console = Console(width=None if sys.stdout.isatty() else 150)


def grid_configs(workers: Sequence[int], prefetch: Sequence[int]) -> list[LoaderConfig]:
    """Every combination, ``w=0`` once (it has no prefetch or persistence), fewest workers first."""
    configs = [LoaderConfig(0)]
    for w in workers:
        if w > 0:
            configs += [
                LoaderConfig(w, prefetch_factor=pf, persistent_workers=p)
                for pf in prefetch
                for p in (False, True)
            ]
    return configs


@dataclass
class Bench:
    """Settings of one run and everything measured so far (plain data in ``results``)."""

    names: list[str]
    quick: bool
    out: Path
    rounds: int = ROUNDS
    facts: MachineFacts = field(default_factory=collect)
    results: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)  # earlier runs' records (--merge)
    kept_from: dict[str, Any] | None = None

    @property
    def workers(self) -> tuple[int, ...]:
        return QUICK_WORKERS if self.quick else FULL_WORKERS

    @property
    def prefetch(self) -> tuple[int, ...]:
        return QUICK_PREFETCH if self.quick else FULL_PREFETCH

    def space(self, loader: DataLoader[Any]) -> Space:
        """The caps the grid keeps to: tune's own budgets, tightened for a shared machine."""
        avail = self.facts.memory_available_bytes or MEMORY_CAP
        shm = self.facts.shm_free_bytes or SHM_CAP
        fds = self.facts.open_files_soft if self.facts.sharing_strategy == "file_descriptor" else 0
        return Space(
            cpus=self.facts.cpus_usable,
            baseline=LoaderConfig(0),
            max_workers=max(self.workers),
            memory_budget=min(avail // 2, MEMORY_CAP),
            shm_budget=min(shm // 2, SHM_CAP),
            fd_budget=int(fds * 0.8) if fds else None,
        )


# --- measuring ----------------------------------------------------------------------------------


def measure_one(
    loader: DataLoader[Any],
    cfg: LoaderConfig,
    facts: MachineFacts,
    consumer: Consumer | None = None,
) -> tuple[Trial, float]:
    """One configuration as tune measures a trial; a failure becomes an errored Trial."""
    began = time.perf_counter()
    try:
        m = measure(
            loader, cfg, seconds=TRIAL_S, windows_count=WINDOWS, machine=facts, consumer=consumer
        )
        trial = Trial.of(m, "grid")
    except PipelineError as exc:
        trial = Trial(cfg, "grid", error=str(exc))
    return trial, time.perf_counter() - began


def grid_entry(trial: Trial, wall_s: float) -> dict[str, Any]:
    return {
        "label": trial.config.label(),
        "median": trial.median,
        "wall_s": wall_s,
        "memory_bytes": trial.memory_bytes,
        "trial": trial.to_dict(),
    }


def run_grid(bench: Bench, p: Pipeline, loader: DataLoader[Any], ui: report.Ui) -> dict[str, Any]:
    configs = grid_configs(bench.workers, bench.prefetch)
    space, trials, entries = bench.space(loader), [], []
    began = time.perf_counter()
    for i, cfg in enumerate(configs):
        ui.step(f"{p.name}: grid {i + 1}/{len(configs)} {cfg.label()}")
        skip = predict_over_budget(space, trials, cfg)
        trial, wall = (
            (Trial(cfg, "grid", skipped=skip), 0.0)
            if skip
            else measure_one(loader, cfg, bench.facts)
        )
        trials.append(trial)
        entries.append(grid_entry(trial, wall))
        ui.grid_line(p.name, i, len(configs), trial, wall)
    measured = [e for e in entries if e["trial"]["spread"] is not None]
    best = max(measured, key=lambda e: e["median"])
    return {"configs": entries, "wall_s": time.perf_counter() - began, "best": best}


def run_tune(p: Pipeline, ui: report.Ui, rate: float | None = None) -> dict[str, Any]:
    label = "tune" if rate is None else f"tune --rate {rate:,.0f}"
    ui.step(f"{p.name}: {label}")
    began = time.perf_counter()
    result = tune(
        p.factory, rate=rate, budget_s=BUDGET_S, use_cache=False, progress=ui.tune_hook(p.name)
    )
    wall = time.perf_counter() - began
    return {
        "config": result.best.config.to_dict(),
        "label": result.best.config.label(),
        "median": result.best.median,
        "stall_fraction": result.best.stall_fraction,
        "search_seconds": result.search_seconds,
        "wall_s": wall,
        "partial": result.partial,
        "partial_reason": result.partial_reason,
        "reason": result.reason,
        "trials": [t.to_dict() for t in result.trials],
        "best": result.best.to_dict(),
    }


def remeasure(
    bench: Bench,
    p: Pipeline,
    loader: DataLoader[Any],
    best: LoaderConfig,
    pick: LoaderConfig,
    ui: report.Ui,
) -> dict[str, Any]:
    """Grid best and tune's pick measured back to back, the order alternating each round."""
    if best == pick:
        return {"same_config": True, "rounds": [], "ratio_median": 1.0}
    rounds = []
    for r in range(bench.rounds):
        pair = [("grid_best", best), ("tune", pick)]
        rates = {}
        for name, cfg in pair if r % 2 == 0 else reversed(pair):
            ui.step(f"{p.name}: re-measure round {r + 1}/{bench.rounds} {name} {cfg.label()}")
            trial, _ = measure_one(loader, cfg, bench.facts)
            rates[name] = trial.median
        ratio = rates["tune"] / rates["grid_best"] if rates["grid_best"] > 0 else 0.0
        rounds.append({**rates, "ratio": ratio})
        ui.note(
            f"{p.name}: round {r + 1} grid best {rates['grid_best']:,.0f}, "
            f"tune {rates['tune']:,.0f} samples/s, ratio {ratio:.3f}"
        )
    ratios = [r["ratio"] for r in rounds]
    return {
        "same_config": False,
        "rounds": rounds,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


# --- the consumer criterion -------------------------------------------------------------------


def consumer_grid(
    bench: Bench, p: Pipeline, loader: DataLoader[Any], rate: float, ui: report.Ui
) -> dict[str, Any]:
    """Ground truth with the consumer itself: the grid's worker counts (pf=2, persistent, the
    series tune walks), each measured feeding a consumer of ``rate``, fewest first, up to the
    first that keeps it fed (stall ≤ STALL_MARGIN)."""
    consumer = make_consumer(rate=rate)
    entries, covering = [], None
    for w in bench.workers:
        cfg = LoaderConfig(w, prefetch_factor=2, persistent_workers=w > 0)
        ui.step(f"{p.name}: consumer grid {cfg.label()}")
        trial, wall = measure_one(loader, cfg, bench.facts, consumer)
        entries.append(grid_entry(trial, wall))
        ui.note(f"{p.name:<9} consumer {cfg.label():<22} {report.outcome(trial)}  ({wall:.1f} s)")
        if covers(trial):
            covering = w
            break
    return {"configs": entries, "covering_w": covering}


def consumer_check(
    bench: Bench, p: Pipeline, loader: DataLoader[Any], grid: dict[str, Any], ui: report.Ui
) -> dict[str, Any]:
    rate = RATE_SHARE * grid["best"]["median"]
    covering = report.smallest_covering(grid["configs"], rate, COVER_MARGIN)
    with_workers = report.smallest_covering(grid["configs"], rate, COVER_MARGIN, min_w=1)
    tuned = run_tune(p, ui, rate=rate)
    truth = consumer_grid(bench, p, loader, rate, ui)
    tune_w, fed_w = tuned["config"]["num_workers"], truth["covering_w"]
    tune_covers = covers(Trial.from_dict(tuned["best"]))
    grid_w = None if covering is None else covering["trial"]["config"]["num_workers"]
    return {
        "rate": rate,
        "grid_covering": None if covering is None else covering["label"],
        "grid_w": grid_w,
        "grid_w_with_workers": (
            None if with_workers is None else with_workers["trial"]["config"]["num_workers"]
        ),
        "tune_w": tune_w,
        "tune_covers": tune_covers,
        "within_one_step": grid_w is not None
        and report.within_one_step(bench.workers, grid_w, tune_w),
        "fed_w": fed_w,
        "fed_agrees": report.fed_agrees(bench.workers, fed_w, tune_w, tune_covers),
        "tune": tuned,
        "consumer_grid": truth,
    }


def bench_pipeline(bench: Bench, p: Pipeline, ui: report.Ui) -> dict[str, Any]:
    loader = p.factory()
    record: dict[str, Any] = {
        "name": p.name,
        "kind": p.kind,
        "description": p.description,
        "batch_size": loader.batch_size,
        "epoch_batches": epoch_batches(loader),
        "item_cost_s": item_cost(loader),
    }
    grid = run_grid(bench, p, loader, ui)
    tuned = run_tune(p, ui)
    ui.advance()
    best = LoaderConfig.from_dict(grid["best"]["trial"]["config"])
    again = remeasure(bench, p, loader, best, LoaderConfig.from_dict(tuned["config"]), ui)
    ui.advance()
    consumer = consumer_check(bench, p, loader, grid, ui)
    ui.advance()
    record.update(grid=grid, tune=tuned, remeasure=again, consumer=consumer)
    record["run"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_commit": git("rev-parse", "HEAD"),
    }
    record["raw_ratio"] = report.raw_ratio(grid, tuned)
    record["criteria"] = report.criteria(grid, tuned, again, consumer)
    return record


# --- entry point --------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller grid (8 worker counts, pf 2,4)")
    ap.add_argument("--pipelines", help=f"comma-separated, of: {','.join(BY_NAME)} (default all)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="re-measurement rounds (default 5)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    ap.add_argument("--render", metavar="JSON", help="render a saved run again, no measuring")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the records of pipelines not measured now from the results already in --out",
    )
    args = ap.parse_args(argv)
    names = args.pipelines.split(",") if args.pipelines else [p.name for p in PIPELINES]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown pipelines {unknown}; known: {','.join(BY_NAME)}")
    args.names = names
    return args


def meta(argv: Sequence[str] | None, bench: Bench, began: float, done: bool) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "schema": report.SCHEMA,
        "command": " ".join(["python", "benchmarks/tune_vs_grid.py", *args]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "complete": done,
        "wall_s": time.perf_counter() - began,
        "loadavg_1m_end": os.getloadavg()[0],
        "quick": bench.quick,
        "grid": {
            "workers": list(bench.workers),
            "prefetch_factor": list(bench.prefetch),
            "persistent_workers": [False, True],
        },
        "trial": {
            "seconds": TRIAL_S,
            "windows": WINDOWS,
            "tune_budget_s": BUDGET_S,
            "rounds": bench.rounds,
            "rate_share": RATE_SHARE,
            "cover_margin": COVER_MARGIN,
            "grid_shm_cap_bytes": SHM_CAP,
            "grid_memory_cap_bytes": MEMORY_CAP,
        },
        "machine": bench.facts.to_dict(),
        "pipelines": _ordered([*bench.kept, *bench.results]),
        "merged_from": bench.kept_from,
    }


def _ordered(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {p.name: i for i, p in enumerate(PIPELINES)}
    return sorted(records, key=lambda r: order.get(r["name"], len(order)))


def _keep_earlier(bench: Bench) -> None:
    """--merge: the earlier results' records of the pipelines not measured now."""
    kept, earlier = earlier_records(bench.out / f"{report.STEM}.json", bench.names, bench.quick)
    if earlier is None:
        return
    bench.kept += kept
    bench.kept_from = {"command": earlier.get("command"), "date": earlier.get("date")}


def run(bench: Bench, argv: Sequence[str] | None, began: float) -> None:
    n = len(grid_configs(bench.workers, bench.prefetch))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        ui = report.Ui(progress)
        for name in bench.names:
            ui.start(name, n + 3)  # + tune, re-measure, consumer
            record = bench_pipeline(bench, BY_NAME[name], ui)
            bench.results.append(record)
            report.write(meta(argv, bench, began, done=False), bench.out)
            ui.note(report.summary_line(record))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        console.print(report.markdown(data))
        return 0
    began = time.perf_counter()
    bench = Bench(args.names, args.quick, args.out, args.rounds)
    if args.merge:
        _keep_earlier(bench)
    console.print(f"machine: {machine_line(bench.facts.to_dict())}")
    try:
        with interrupts.stoppable(sigterm=True):  # SIGTERM as Ctrl-C: workers are stopped
            run(bench, argv, began)
    except KeyboardInterrupt:
        console.print(
            f"[red]interrupted; kept {len(bench.results)} finished pipelines in {args.out}"
        )
        return 130
    finally:
        left = leftover_children()
        if left:
            console.print(f"[red]ended {len(left)} leftover worker processes: {left}")
    data = meta(argv, bench, began, done=True)
    report.write(data, bench.out)
    console.print(report.markdown(data))
    console.print(f"wall time {data['wall_s']:.0f} s; results in {args.out}/tune_vs_grid.*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
