"""What does feedrate's measurement cost? Compare ``feedrate.measuring.measure`` with a bare
``for batch in loader`` loop on the same configuration, interleaved in one run.

Both sides rebuild the example's loader with the same ``LoaderConfig``, discard
``warmup_batches(config)`` batches at every epoch start, count the same steady-state batches per
epoch (the bare loop replays the exact schedule ``measure`` follows, worked out beforehand) and
time from the last warm-up batch (for epochs timed whole: from the ``iter()`` call) to the last
counted batch, summed over epochs. Only the instrumentation differs: ``measure`` adds the
index-reporting dataset wrapper, the psutil probe (CPU counters at window boundaries; a poller
thread watching /dev/shm and reading every process's memory) and the SIGALRM watchdog kicked per
batch.

Rounds alternate the order (bare, feedrate / feedrate, bare: ABBA) so drift hits both alike; each
round gives one ratio feedrate/bare per pipeline. Reported: median samples/s of each side, median
and min-max of the per-round ratios, their geometric mean over the pipelines, and an accounting of
the instrumentation's own time inside the measured span (see ``overhead_costs``).

    python benchmarks/overhead.py              # full run, about 8 minutes on 2 cores
    python benchmarks/overhead.py --quick      # about 2 minutes
    python benchmarks/overhead.py --attribute [ARM ...]  # adds ablation arms (parts switched off)
    python benchmarks/overhead.py --render benchmarks/results/overhead.json  # no measuring

Run from the repository root. Results go to ``benchmarks/results/``: ``overhead.{json,md}``, or
``overhead-quick.*``, ``overhead-attribution.*`` for ``--quick`` and ``--attribute`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import overhead_costs as costs
import overhead_report as report
from common import leftover_children, machine_line, provenance
from overhead_schedule import WINDOWS, Schedule, plan_schedule
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.utils.data import DataLoader

import feedrate
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import quiet_worker_count_warning, rebuild
from feedrate.loader.target import load_target
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import interrupts
from feedrate.measuring.failures import stop_workers
from feedrate.measuring.measure import measure

console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass(frozen=True)
class Pipeline:
    """An example at a fixed configuration and ``measure``'s batch budget per run (full run,
    ``--quick``). Budgets are chosen so windows do not line up with epochs, as time-closed windows
    would not; the images example's epochs (16 batches) are too short for windows, so ``measure``
    times 5 whole epochs after a warm-up epoch whatever the budget."""

    name: str
    target: str
    config: LoaderConfig
    batches: int
    quick_batches: int


PIPELINES = (
    Pipeline("images", "examples/images.py:loader", LoaderConfig(num_workers=2), 80, 80),
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


# --- the two sides ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One run; for feedrate arms also the instrumentation's own time inside the span (s)."""

    pipeline: str
    arm: str
    round: int
    samples: int
    batches: int
    seconds: float
    probe_reads_s: float | None = None
    memory_reads_s: float | None = None
    probe_thread_s: float | None = None
    close_median_s: float | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "samples_per_s": self.samples_per_s}


def bare_run(user_loader: DataLoader[Any], config: LoaderConfig, sched: Schedule) -> Run:
    """The same schedule as ``measure``, with nothing but a clock read and a sample count."""
    default = user_loader.batch_size or 1
    loader = rebuild(user_loader, config)
    seconds, samples = 0.0, 0
    for skip, counted in zip(sched.skip, sched.counted, strict=True):
        s, n = _bare_epoch(loader, skip, counted, default)
        seconds, samples = seconds + s, samples + n
    return Run("", BARE.name, 0, samples, sched.batches, seconds)


def _bare_epoch(
    loader: DataLoader[Any], skip: int, counted: int, default: int
) -> tuple[float, int]:
    t_call = time.perf_counter()  # a whole epoch (skip == 0) is timed from here
    with quiet_worker_count_warning():
        it = iter(loader)
    try:
        result = costs.bare_loop(it, skip, counted, default, start=t_call)
    except BaseException:
        stop_workers(it)
        raise
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    return result


@contextlib.contextmanager
def ablated(arm: Arm) -> Iterator[list[tuple[str, float]] | None]:
    """Switch off the parts of feedrate that ``arm`` leaves out (patched for this call only);
    with the probe on, time its reads. Yields the read log, or None without a probe."""
    with contextlib.ExitStack() as stack:
        if not arm.probe:
            stack.enter_context(costs.without_probe())
            yield None
            return
        log = stack.enter_context(costs.timed_probe())
        if not arm.memory:
            stack.enter_context(mock.patch.object(costs.PROBE, "_memory", lambda *_: None))
        yield log


def feedrate_run(user_loader: DataLoader[Any], bench: Bench, p: Pipeline, arm: Arm) -> Run:
    with ablated(arm) as log:
        m = measure(
            user_loader,
            p.config,
            batches=bench.batches(p),
            windows_count=WINDOWS,
            machine=bench.facts,
            report_index=arm.report_index,
            timeout_s=60.0 if arm.watchdog else None,
        )
    w, extra = m.window, {}
    if log is not None:
        reads = costs.timed_reads(log, bench.schedules[p.name].reads)
        extra = {
            "probe_reads_s": reads["reads_s"],
            "memory_reads_s": costs.TimedProbe.memory_s,
            "close_median_s": reads["close_median_s"],
            "probe_thread_s": m.processes.probe_cpu_s,
        }
    return Run("", arm.name, 0, w.samples, w.batches, w.seconds, **extra)


# --- the interleaved rounds ---------------------------------------------------------------------


@dataclass
class Bench:
    pipelines: Sequence[Pipeline]
    arms: Sequence[Arm]
    rounds: int
    quick: bool
    facts: MachineFacts = field(default_factory=collect)
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
            run = feedrate_run(loader, self, p, arm)
        if run.batches != sched.batches:
            msg = f"{p.name}/{arm.name} counted {run.batches} batches, the schedule {sched}"
            raise SystemExit(msg)
        run = Run(**{**run.__dict__, "pipeline": p.name, "round": round_})
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


def micro_costs() -> dict[str, Any]:
    """Per-batch and per-sample costs, on the tabular example (the cheapest samples, so the
    most sensitive to them); the summary scales them by each pipeline's own rates."""
    loader = load_target("examples/tabular.py:loader")
    batch = next(iter(loader))
    return {
        "per_batch": costs.per_batch_cost(batch),
        "wrapper_per_sample": costs.wrapper_cost(loader),
        "poller_interference": costs.poller_interference(loader),
    }


# --- entry point --------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, half-length runs")
    ap.add_argument(
        "--attribute",
        nargs="*",
        choices=[a.name for a in ABLATIONS],
        help="add ablation arms (all when none named)",
    )
    ap.add_argument("--rounds", type=int, help="rounds (default: 14, quick 4, attribute 8)")
    ap.add_argument("--only", nargs="+", choices=[p.name for p in PIPELINES], help="pipelines")
    ap.add_argument("--render", metavar="JSON", help="summarize and render a saved run again")
    return ap.parse_args(argv)


def make_bench(args: argparse.Namespace) -> Bench:
    attribute = args.attribute is not None
    rounds = args.rounds or (8 if attribute else 4 if args.quick else 14)
    named = args.attribute or [a.name for a in ABLATIONS]
    ablations = [a for a in ABLATIONS if attribute and a.name in named]
    arms = [BARE, FEEDRATE, *ablations]
    chosen = [p for p in PIPELINES if not args.only or p.name in args.only]
    return Bench(chosen, arms, rounds, args.quick)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.render:
        record = json.loads(Path(args.render).read_text())
        show(report.summarize(record), Path(args.render).stem)
        return 0
    started, meta = time.perf_counter(), _meta(argv)
    bench = make_bench(args)
    console.print(f"machine: {machine_line(bench.facts.to_dict())}")
    try:
        with interrupts.stoppable(sigterm=True):  # SIGTERM as Ctrl-C: workers are stopped
            bench.prepare()
            run_rounds(bench)
            micro = micro_costs()
    finally:
        left = leftover_children()
        if left:
            console.print(f"[red]ended {len(left)} leftover worker processes: {left}")
    meta["wall_s"] = time.perf_counter() - started
    meta["loadavg_1m"]["end"] = os.getloadavg()[0]
    record = report.summarize(report.build(bench, micro, meta))
    show(record, _stem(args))
    return 0


def _stem(args: argparse.Namespace) -> str:
    """Results name: a quick or attribution run never overwrites the full run's results."""
    return (
        "overhead"
        + ("" if args.attribute is None else "-attribution")
        + ("-quick" if args.quick else "")
    )


def show(record: dict[str, Any], stem: str) -> None:
    """Write ``benchmarks/results/<stem>.{json,md}`` and print the tables."""
    report.write(record, stem)
    console.print(report.table(record))
    console.print(report.accounting_table(record))
    console.print(f"wall time {record['wall_s']:.0f} s; results in {report.RESULTS}/{stem}.*")


def _meta(argv: Sequence[str] | None) -> dict[str, Any]:
    """Facts about this run, taken at its start (the code measured is what was imported)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "command": " ".join(["python", "benchmarks/overhead.py", *args]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "loadavg_1m": {"start": os.getloadavg()[0]},
    }


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        console.print("[red]interrupted; no worker process left running, no results written")
        sys.exit(130)
