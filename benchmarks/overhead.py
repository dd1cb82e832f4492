"""What does feedrate's measurement cost? Compare ``feedrate.measure.measure`` with a bare
``for batch in loader`` loop on the same configuration, interleaved in one run.

Both sides rebuild the example's loader with the same ``LoaderConfig``, discard
``warmup_batches(config)`` batches at every epoch start, count the same steady-state batches per
epoch (the bare loop replays the exact schedule ``measure`` follows, computed beforehand) and time
from the last warm-up batch to the last counted batch, summed over epochs. Only the instrumentation
differs: ``measure`` adds the index-reporting dataset wrapper, the psutil probe (CPU and memory
reads at window boundaries, a /dev/shm polling thread) and the SIGALRM watchdog kicked per batch.

Rounds alternate the order (bare, feedrate / feedrate, bare: ABBA) so drift hits both alike; each
round gives one ratio feedrate/bare per pipeline. Reported: median samples/s of each side, median
and min-max of the per-round ratios, and their geometric mean over the pipelines.

    python benchmarks/overhead.py              # full run, about 8 minutes on 2 cores
    python benchmarks/overhead.py --quick      # about 1.5 minutes
    python benchmarks/overhead.py --attribute  # ablations that say where the overhead comes from

Run from the repository root. Results: ``benchmarks/results/overhead{,-attribution}.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal
from unittest import mock

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from torch.utils.data import DataLoader

import feedrate
import feedrate.measure
import feedrate.probe
from feedrate import windows
from feedrate.config import LoaderConfig, quiet_worker_count_warning, rebuild
from feedrate.failures import stop_workers
from feedrate.machine import MachineFacts, collect
from feedrate.measure import count_samples, measure, warmup_batches
from feedrate.probe import ProbeReport, ProcessProbe
from feedrate.target import load_target

TARGET_OVERHEAD = 0.02
"""The issue's target: measuring costs at most 2 % of samples/s (geometric mean over pipelines)."""
WINDOWS = 5
RESULTS = Path("benchmarks/results")
console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass(frozen=True)
class Pipeline:
    """An example at a fixed configuration; ``batches`` steady-state batches per run (full run),
    chosen so windows do not line up with epochs, as time-closed windows would not."""

    name: str
    target: str
    config: LoaderConfig
    batches: int
    quick_batches: int


PIPELINES = (
    Pipeline("images", "examples/images.py:loader", LoaderConfig(num_workers=2), 44, 22),
    Pipeline("remote", "examples/remote.py:loader", LoaderConfig(num_workers=8), 180, 90),
    Pipeline("tabular", "examples/tabular.py:loader", LoaderConfig(num_workers=0), 2400, 1200),
)


@dataclass(frozen=True)
class Arm:
    """One way of running a pipeline: the bare loop, or ``measure`` with parts switched off."""

    name: str
    kind: Literal["bare", "feedrate"]
    what: str
    report_index: bool = True
    watchdog: bool = True
    memory: bool = True
    probe: bool = True


BARE = Arm("bare", "bare", "for batch in loader, same schedule")
FEEDRATE = Arm("feedrate", "feedrate", "measure() as shipped")
ABLATIONS = (
    Arm("no-index", "feedrate", "report_index=False", report_index=False),
    Arm("no-watchdog", "feedrate", "timeout_s=None", watchdog=False),
    Arm("no-memory", "feedrate", "probe without memory_full_info reads", memory=False),
    Arm("no-probe", "feedrate", "probe replaced by a no-op", probe=False),
)


# --- the schedule measure() follows -------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """Per epoch, the steady-state batches ``measure`` counts after ``warmup`` discarded ones, and
    how many probe reads at window opens and closes fall inside the timed span (a read after an
    epoch's last counted batch is not timed)."""

    warmup: int
    steady: tuple[int, ...]
    opens_timed: int
    closes_timed: int


def plan_schedule(config: LoaderConfig, batches: int, epoch_length: int) -> Schedule:
    """Replay ``windows.run`` on a fake loader of ``epoch_length`` batches and a fake clock: with a
    batch budget the schedule depends on counts only, never on speed."""
    plan = windows.WindowPlan(WINDOWS, batches, None, warmup_batches(config))
    taken: list[int] = []
    hooks_at: list[tuple[str, int, int]] = []

    def make_iter() -> Iterator[int]:
        taken.append(0)
        for i in range(epoch_length):
            taken[-1] += 1
            yield i

    def hook(kind: str) -> Callable[[], None]:
        return lambda: hooks_at.append((kind, len(taken) - 1, taken[-1]))

    ticks = itertools.count()
    timeline = windows.run(
        make_iter,
        plan,
        lambda _batch: 1,
        clock=lambda: float(next(ticks)),
        hooks=windows.Hooks(window_open=hook("open"), window_close=hook("close")),
        epoch_length=epoch_length,
    )
    if timeline.method != "windows":
        raise SystemExit(f"epochs of {epoch_length} batches are too short to get past warm-up")
    steady = tuple(n - plan.warmup_batches for n in taken)
    timed = [kind for kind, epoch, at in hooks_at if at < taken[epoch]]
    return Schedule(plan.warmup_batches, steady, timed.count("open"), timed.count("close"))


# --- the two sides ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    pipeline: str
    arm: str
    round: int
    samples: int
    batches: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def bare_run(user_loader: DataLoader[Any], config: LoaderConfig, sched: Schedule) -> Run:
    """The same schedule as ``measure``, with nothing but a clock read and a sample count."""
    default = user_loader.batch_size or 1
    seconds, samples = 0.0, 0
    loader = rebuild(user_loader, config)
    for steady in sched.steady:
        s, n = _bare_epoch(loader, sched.warmup, steady, default)
        seconds, samples = seconds + s, samples + n
    return Run("", BARE.name, 0, samples, sum(sched.steady), seconds)


def _bare_epoch(
    loader: DataLoader[Any], warmup: int, steady: int, default: int
) -> tuple[float, int]:
    with quiet_worker_count_warning():
        it = iter(loader)
    last, samples, start, end = warmup + steady, 0, 0.0, 0.0
    try:
        for i, batch in enumerate(it, 1):
            now = time.perf_counter()
            if i == warmup:
                start = now
            elif i > warmup:
                samples += count_samples(batch, default)
                if i == last:
                    end = now
                    break
    except BaseException:
        stop_workers(it)
        raise
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    return end - start, samples


class NullProbe:
    """Stands in for ``ProcessProbe`` in the ``no-probe`` ablation: no thread, no reads."""

    def __enter__(self) -> NullProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def attach(self, iterator: object) -> None:
        return None

    def window_open(self, wall: float) -> None:
        return None

    def window_close(self, wall: float) -> None:
        return None

    def report(self) -> ProbeReport:
        return ProbeReport()


@contextlib.contextmanager
def ablated(arm: Arm) -> Iterator[None]:
    """Switch off the parts of feedrate that ``arm`` leaves out (patched for this call only)."""
    with contextlib.ExitStack() as stack:
        if not arm.probe:
            stack.enter_context(mock.patch.object(feedrate.measure, "ProcessProbe", NullProbe))
        if not arm.memory:
            stack.enter_context(mock.patch.object(feedrate.probe, "_memory", lambda *_: None))
        yield


def feedrate_run(
    user_loader: DataLoader[Any], p: Pipeline, batches: int, arm: Arm, facts: MachineFacts
) -> Run:
    with ablated(arm):
        m = measure(
            user_loader,
            p.config,
            batches=batches,
            windows_count=WINDOWS,
            machine=facts,
            report_index=arm.report_index,
            timeout_s=60.0 if arm.watchdog else None,
        )
    w = m.window
    return Run("", arm.name, 0, w.samples, w.batches, w.seconds)


# --- the interleaved rounds ---------------------------------------------------------------------


@dataclass
class Bench:
    pipelines: Sequence[Pipeline]
    arms: Sequence[Arm]
    rounds: int
    quick: bool
    facts: MachineFacts
    loaders: dict[str, DataLoader[Any]] = field(default_factory=dict)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    def batches(self, p: Pipeline) -> int:
        return p.quick_batches if self.quick else p.batches

    def prepare(self) -> None:
        for p in self.pipelines:
            loader = load_target(p.target)
            self.loaders[p.name] = loader
            self.schedules[p.name] = plan_schedule(p.config, self.batches(p), len(loader))

    def one(self, p: Pipeline, arm: Arm, round_: int) -> Run:
        loader, sched = self.loaders[p.name], self.schedules[p.name]
        if arm.kind == "bare":
            run = bare_run(loader, p.config, sched)
        else:
            run = feedrate_run(loader, p, self.batches(p), arm, self.facts)
        if run.batches != sum(sched.steady):
            msg = f"{p.name}/{arm.name} counted {run.batches} batches, the schedule {sched.steady}"
            raise SystemExit(msg)
        run = Run(p.name, arm.name, round_, run.samples, run.batches, run.seconds)
        self.runs.append(run)
        return run


def order(arms: Sequence[Arm], round_: int) -> list[Arm]:
    """ABBA: even rounds run the arms in order, odd rounds in reverse."""
    return list(arms) if round_ % 2 == 0 else list(reversed(arms))


def run_rounds(bench: Bench) -> None:
    total = bench.rounds * len(bench.pipelines) * len(bench.arms)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("runs", total=total)
        for r in range(bench.rounds):
            for p in bench.pipelines:
                rates = {}
                for arm in order(bench.arms, r):
                    progress.update(task, description=f"round {r + 1}/{bench.rounds} {p.name}")
                    rates[arm.name] = bench.one(p, arm, r).samples_per_s
                    progress.advance(task)
                progress.console.print(_round_line(r, bench.rounds, p.name, rates))


def _round_line(r: int, rounds: int, name: str, rates: dict[str, float]) -> str:
    base = rates[BARE.name]
    parts = [
        f"{arm} {rate:,.0f}" + ("" if arm == BARE.name else f" ({rate / base:.3f})")
        for arm, rate in rates.items()
    ]
    return f"round {r + 1:>2}/{rounds} {name:<8} " + "  ".join(parts)


# --- summary and output -------------------------------------------------------------------------


def summarize(bench: Bench) -> dict[str, Any]:
    per_pipeline = {p.name: _pipeline_summary(bench, p) for p in bench.pipelines}
    geomean = {}
    for arm in bench.arms:
        if arm.kind == "bare":
            continue
        ratios = [s["arms"][arm.name]["ratio_median"] for s in per_pipeline.values()]
        g = math.exp(statistics.fmean(math.log(x) for x in ratios))
        geomean[arm.name] = {"ratio": g, "overhead": 1 - g}
    met = geomean[FEEDRATE.name]["overhead"] <= TARGET_OVERHEAD
    return {"pipelines": per_pipeline, "geomean": geomean, "target_met": met}


def _pipeline_summary(bench: Bench, p: Pipeline) -> dict[str, Any]:
    runs = [r for r in bench.runs if r.pipeline == p.name]
    by_round = {(r.round, r.arm): r.samples_per_s for r in runs}
    sched = bench.schedules[p.name]
    arms: dict[str, Any] = {}
    for arm in bench.arms:
        rates = [r.samples_per_s for r in runs if r.arm == arm.name]
        entry: dict[str, Any] = {"median_samples_per_s": statistics.median(rates)}
        if arm.kind != "bare":
            ratios = [
                by_round[(i, arm.name)] / by_round[(i, BARE.name)] for i in range(bench.rounds)
            ]
            entry |= _ratio_figures(ratios)
        arms[arm.name] = entry
    return {
        "target": p.target,
        "config": p.config.to_dict(),
        "config_label": p.config.label(),
        "batches_per_run": sum(sched.steady),
        "warmup_batches_per_epoch": sched.warmup,
        "steady_batches_per_epoch": list(sched.steady),
        "probe_opens_timed": sched.opens_timed,
        "probe_closes_timed": sched.closes_timed,
        "arms": arms,
    }


def _ratio_figures(ratios: list[float]) -> dict[str, Any]:
    med = statistics.median(ratios)
    return {
        "ratios": ratios,
        "ratio_median": med,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "overhead": 1 - med,
    }


def table(bench: Bench, summary: dict[str, Any]) -> Table:
    t = Table(title="feedrate measure() vs a bare loop (samples/s, medians over rounds)")
    for col in ("pipeline", "config", "batches/run", "bare", *_arm_names(bench), "overhead"):
        t.add_column(col, justify="left" if col in ("pipeline", "config") else "right")
    for name, s in summary["pipelines"].items():
        cells = [_arm_cell(s["arms"][a]) for a in _arm_names(bench)]
        bare = f"{s['arms'][BARE.name]['median_samples_per_s']:,.0f}"
        over = f"{s['arms'][FEEDRATE.name]['overhead']:+.1%}"
        t.add_row(name, s["config_label"], str(s["batches_per_run"]), bare, *cells, over)
    geo = summary["geomean"]
    cells = [f"ratio {geo[a]['ratio']:.3f}" for a in _arm_names(bench)]
    t.add_row("geomean", "", "", "", *cells, f"{geo[FEEDRATE.name]['overhead']:+.1%}")
    return t


def _arm_names(bench: Bench) -> list[str]:
    return [a.name for a in bench.arms if a.kind != "bare"]


def _arm_cell(entry: dict[str, Any]) -> str:
    rate, ratio = entry["median_samples_per_s"], entry["ratio_median"]
    return f"{rate:,.0f} ({ratio:.3f}, {entry['ratio_min']:.3f}–{entry['ratio_max']:.3f})"


def machine_line(facts: MachineFacts) -> str:
    gib = (facts.memory_total_bytes or 0) / 2**30
    return (
        f"{facts.cpus_usable} usable CPUs (of {facts.cpu_count}), {gib:.1f} GiB RAM, "
        f"{facts.platform}, Python {facts.python_version}, torch {facts.torch_version}, "
        f"start method {facts.start_method}, accelerator {facts.accelerator}"
    )


def markdown(bench: Bench, summary: dict[str, Any], meta: dict[str, Any]) -> str:
    names = _arm_names(bench)
    head = ["pipeline", "config", "batches/run", "bare samples/s", *names, "overhead"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summary["pipelines"].items():
        bare = f"{s['arms'][BARE.name]['median_samples_per_s']:,.0f}"
        cells = [_arm_cell(s["arms"][a]) for a in names]
        over = f"{s['arms'][FEEDRATE.name]['overhead']:+.1%}"
        row = [name, s["config_label"], str(s["batches_per_run"]), bare, *cells, over]
        lines.append("| " + " | ".join(row) + " |")
    geo = summary["geomean"]
    cells = [f"ratio {geo[a]['ratio']:.3f}" for a in names]
    over = f"**{geo[FEEDRATE.name]['overhead']:+.1%}**"
    lines.append("| **geometric mean** | | | | " + " | ".join(cells) + f" | {over} |")
    verdict = "met" if summary["target_met"] else "NOT met"
    return "\n".join(
        [
            f"`{meta['command']}` — {meta['date']}, feedrate {meta['feedrate_version']}, "
            f"{bench.rounds} rounds, {meta['wall_s']:.0f} s",
            "",
            "Cells: median samples/s (median ratio to bare, min–max over rounds). "
            "Overhead = 1 − median ratio feedrate/bare.",
            "",
            *lines,
            "",
            f"Target: overhead ≤ {TARGET_OVERHEAD:.0%} (geometric mean): {verdict}.",
            "",
            f"Machine: {machine_line(bench.facts)}.",
            "",
        ]
    )


def write(bench: Bench, summary: dict[str, Any], meta: dict[str, Any], stem: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "schema": "feedrate.bench.overhead/1",
        **meta,
        "target_overhead": TARGET_OVERHEAD,
        "rounds": bench.rounds,
        "windows_count": WINDOWS,
        "arms": [a.__dict__ for a in bench.arms],
        "machine": bench.facts.to_dict(),
        "summary": summary,
        "runs": [r.__dict__ | {"samples_per_s": r.samples_per_s} for r in bench.runs],
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(bench, summary, meta))


# --- boundary cost (attribution) ----------------------------------------------------------------


class TimedProbe(ProcessProbe):
    """``ProcessProbe`` that records how long each window-boundary read takes, in s."""

    spent: list[float] = []  # noqa: RUF012 (shared on purpose: measure() builds its own probe)

    def window_open(self, wall: float) -> None:
        t0 = time.perf_counter()
        super().window_open(wall)
        TimedProbe.spent.append(time.perf_counter() - t0)

    def window_close(self, wall: float) -> None:
        t0 = time.perf_counter()
        super().window_close(wall)
        TimedProbe.spent.append(time.perf_counter() - t0)


def boundary_costs(bench: Bench) -> dict[str, Any]:
    """Per pipeline: median ms per probe read at a window boundary (one measure() call each)."""
    out = {}
    for p in bench.pipelines:
        TimedProbe.spent = []
        with mock.patch.object(feedrate.measure, "ProcessProbe", TimedProbe):
            measure(bench.loaders[p.name], p.config, batches=bench.batches(p), machine=bench.facts)
        spent = sorted(TimedProbe.spent)
        out[p.name] = {
            "reads": len(spent),
            "median_ms": 1e3 * statistics.median(spent),
            "max_ms": 1e3 * spent[-1],
            "closes_timed": bench.schedules[p.name].closes_timed,
        }
    return out


# --- entry point --------------------------------------------------------------------------------


def leftover_children() -> list[int]:
    """Worker processes still alive (there should be none); ends them so none outlive us."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    psutil.wait_procs(children, timeout=2.0)
    return [c.pid for c in children]


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # so every finally block runs and workers are stopped


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, half-length runs")
    ap.add_argument("--attribute", action="store_true", help="add ablation arms")
    ap.add_argument("--rounds", type=int, help="rounds (default: 16, quick 6, attribute 8)")
    ap.add_argument("--only", nargs="+", choices=[p.name for p in PIPELINES], help="pipelines")
    return ap.parse_args(argv)


def make_bench(args: argparse.Namespace) -> Bench:
    default = 8 if args.attribute else 6 if args.quick else 16
    rounds = args.rounds or default
    arms = [BARE, FEEDRATE, *(ABLATIONS if args.attribute else ())]
    chosen = [p for p in PIPELINES if not args.only or p.name in args.only]
    return Bench(chosen, arms, rounds, args.quick, collect())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.perf_counter()
    bench = make_bench(args)
    console.print(f"machine: {machine_line(bench.facts)}")
    try:
        bench.prepare()
        run_rounds(bench)
        costs = boundary_costs(bench) if args.attribute else None
    finally:
        left = leftover_children()
        if left:
            console.print(f"[red]ended {len(left)} leftover worker processes: {left}")
    summary = summarize(bench)
    if costs is not None:
        summary["boundary_costs"] = costs
    meta = _meta(argv, time.perf_counter() - started)
    write(bench, summary, meta, "overhead-attribution" if args.attribute else "overhead")
    console.print(table(bench, summary))
    if costs is not None:
        console.print_json(data=costs)
    console.print(f"wall time {meta['wall_s']:.0f} s; results in {RESULTS}/")
    return 0


def _meta(argv: Sequence[str] | None, wall_s: float) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "command": " ".join(["python", "benchmarks/overhead.py", *args]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        "wall_s": wall_s,
    }


if __name__ == "__main__":
    sys.exit(main())
