"""The doctor's header names the bottleneck of your settings; where the ``bottleneck`` finding
read the pipeline at another configuration and names another kind, that kind stands beside it.
Known figures through a fake ``measure_trial``: no timing."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console
from torch.utils.data import DataLoader

from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring.consumer import Consumer
from feedrate.render.doctor import doctor_report
from feedrate.results.doctor import Report
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.workflows.doctor_trials import Comparison

from pipelines import TinyDataset


def facts(**changes: Any) -> MachineFacts:
    return MachineFacts(**{**collect().to_dict(), "cpus_usable": 2, **changes})


class Figures:
    """Each worker count measures as its row says: (samples/s, main process's share of a core,
    each worker's share of a core)."""

    def __init__(self, rows: dict[int, tuple[float, float, float]]) -> None:
        self.rows = rows

    def __call__(self, cfg: LoaderConfig, why: str, consumer: Consumer | None) -> Trial:
        rate, main, each = self.rows[cfg.num_workers]
        spread = Spread([rate] * 3, rate, 0.98 * rate, 1.02 * rate, 0.01 * rate)
        return Trial(
            cfg,
            why,
            samples_per_s=rate,
            spread=spread,
            main_cpu=main,
            workers_cpu=each * cfg.num_workers,
            workers_runq=0.0,
        )


def compared(workers: int, rows: dict[int, tuple[float, float, float]]) -> Comparison:
    loader = DataLoader(TinyDataset(4096), batch_size=4, num_workers=workers)
    comparison = Comparison(loader, facts(), None, measure_trial=Figures(rows))
    comparison.run()
    return comparison


def report_of(comparison: Comparison) -> Report:
    assert comparison.baseline is not None
    return Report(
        machine=facts().to_dict(),
        config=comparison.baseline.config,
        findings=[],
        checks=[],
        seconds=1.0,
        trials=comparison.all_trials,
        batch_size=4,
        **comparison.bottlenecks(),
    )


def text_of(report: Report) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(doctor_report(report))
    return console.export_text()


def test_the_header_is_yours_and_the_alternative_s_bottleneck_is_beside_it() -> None:
    # QA: your w=0 mostly waits (main process 30% of a core), yet the header read "CPU-bound
    # in the workers", measured at the w=2 it tried (each worker busy 95% of a core).
    comparison = compared(0, {0: (300.0, 0.3, 0.0), 2: (1000.0, 0.1, 0.95)})
    assert comparison.bottleneck_kind() == "cpu"  # what the finding names, read at w=2
    two = with_two(comparison)
    assert comparison.bottlenecks() == {
        "bottleneck": "latency",
        "alternative_bottleneck": {"config": two.config.to_dict(), "kind": "cpu"},
    }
    report = report_of(comparison)
    text = text_of(Report.from_json(report.to_json()))  # as saved and read back, too
    header = next(line for line in text.splitlines() if line.startswith("bottleneck"))
    assert "latency-bound (fetching mostly waits) at your settings" in header
    assert "CPU-bound" not in header
    row = next(line for line in text.splitlines() if line.startswith(f"│ {two.config.label()} "))
    assert "bottleneck here: CPU-bound in the workers" in row


def with_two(comparison: Comparison) -> Trial:
    return next(t for t in comparison.all_trials if t.config.num_workers == 2)


def test_no_workers_computing_and_beaten_is_main_process_bound() -> None:
    # Yours computes in the main process and 2 workers beat it: not "fastest without workers".
    comparison = compared(0, {0: (500.0, 1.0, 0.0), 2: (1000.0, 0.1, 0.95)})
    kinds = comparison.bottlenecks()
    assert kinds["bottleneck"] == "main-process"
    assert kinds["alternative_bottleneck"] is not None
    assert kinds["alternative_bottleneck"]["kind"] == "cpu"


def test_where_the_finding_reads_yours_nothing_is_set_aside() -> None:
    comparison = compared(2, {2: (1000.0, 0.1, 0.95), 0: (550.0, 1.0, 0.0)})
    assert comparison.bottlenecks() == {"bottleneck": "cpu", "alternative_bottleneck": None}
    text = text_of(report_of(comparison))
    assert "CPU-bound in the workers at your settings" in text
    assert "bottleneck here" not in text


def test_where_yours_is_the_best_the_finding_s_kind_is_yours() -> None:
    # No workers fastest, read against the 2 workers that lost to it: that kind is yours.
    comparison = compared(0, {0: (1000.0, 1.0, 0.0), 2: (500.0, 0.3, 0.4)})
    kinds = comparison.bottlenecks()
    assert kinds == {"bottleneck": comparison.bottleneck_kind(), "alternative_bottleneck": None}
    assert kinds["bottleneck"] == "no-workers"


class Busy(Figures):
    """As ``Figures``, each worker queued ``queued`` of the time for a CPU, and the node's
    busy CPUs each trial read ``node_busy``."""

    def __init__(
        self, rows: dict[int, tuple[float, float, float]], queued: float, node_busy: float
    ) -> None:
        super().__init__(rows)
        self.queued, self.node_busy = queued, node_busy

    def __call__(self, cfg: LoaderConfig, why: str, consumer: Consumer | None) -> Trial:
        t = super().__call__(cfg, why, consumer)
        runq = self.queued * cfg.num_workers
        return replace(t, workers_runq=runq, system_busy_cpus=self.node_busy)


def test_a_rank_s_trials_are_judged_within_its_share_of_the_node() -> None:
    # Two ranks doctor a pipeline at once on a 2-CPU node, each within its share of one CPU:
    # 2 workers, each 30% of a core and queued 30%, the main process 10%: 0.7 of a core a
    # rank. The node read 1.5 busy, both ranks' 1.4 in it. Whole against one CPU that is a full
    # share ("cpu": computing workers on CPUs others fill); within its share, 0.7 + 0.1 / 2.
    loader = DataLoader(TinyDataset(4096), batch_size=4, num_workers=2)
    rows = {n: (300.0 * max(1, n), 0.1, 0.3) for n in range(8)}
    judged = []
    for ranks in (1, 2):
        c = Comparison(loader, facts(cpus_usable=1), None, measure_trial=Busy(rows, 0.3, 1.5))
        c.set_up(c.seconds, loader, ranks=ranks)
        c.run()
        assert c.baseline is not None
        judged.append((c.baseline.system_busy_cpus, c.bottlenecks()["bottleneck"]))
    assert judged[0] == (1.5, "cpu")  # one process: the machine's busy CPUs as read
    busy, kind = judged[1]
    assert busy == pytest.approx(0.7 + (1.5 - 2 * 0.7) / 2)
    assert kind != "cpu"
