"""Console rendering (rich) of the doctor's report: the summary, what it measured, the findings.
Takes plain data, prints; measures nothing."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from feedrate.render.console import findings_list, kv_table, title_of
from feedrate.render.text import noise_of, rate, size
from feedrate.results.doctor import Report
from feedrate.results.trial import Trial
from feedrate.search.bottleneck import LABELS as BOTTLENECK_LABELS
from feedrate.units import counted


def _trial_row(t: Trial, report: Report) -> tuple[str, ...]:
    label = t.config.label() + (" (yours)" if t is report.trials[0] else "")
    if t.skipped or t.error:
        note = f"skipped: {t.skipped}" if t.skipped else f"failed: {t.error}"
        return (label, t.reason, "-", "-", "-", note)
    stall = "" if t.stall_fraction is None else f"{t.stall_fraction:.0%}"
    runs = f" ({t.repeats} runs)" if t.repeats > 1 else ""
    return (
        label,
        t.reason,
        f"{rate(t.median)} {noise_of(t)}{runs}",
        f"{t.main_cpu:.0%} / {t.workers_cpu:.0%}",
        stall,
        _bottleneck_note(t, report),
    )


def _bottleneck_note(t: Trial, report: Report) -> str:
    """The bottleneck of an alternative, beside it, where the finding read it there and it
    differs from yours (the summary's ``bottleneck`` row is yours)."""
    other = report.alternative_bottleneck
    if other is None or t is report.trials[0] or t.config.to_dict() != other.get("config"):
        return ""
    kind = str(other.get("kind", ""))
    return f"bottleneck here: {BOTTLENECK_LABELS.get(kind, kind)}"


def doctor_trials(report: Report) -> Table:
    """The configurations the doctor measured, yours first (with a consumer, then yours without
    it; a stall column with a consumer, a note column when one was skipped or failed)."""
    shown = list(report.trials)
    if report.loader_alone is not None:
        shown.insert(1, report.loader_alone)  # next to yours, which ran with the consumer
    rows = [_trial_row(t, report) for t in shown]
    columns = [
        ("config", "left"),
        ("why", "left"),
        ("samples/s", "right"),
        ("CPU main / workers", "right"),
        ("stall", "right"),
        ("note", "left"),
    ]
    keep = [i for i in range(len(columns)) if i < 4 or any(row[i] for row in rows)]
    table = Table(title="Measured", title_justify="left")
    for i in keep:
        col, justify = columns[i]
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def doctor_summary(report: Report) -> Table:
    m, shape = report.machine, report.ranks or {}
    shm = size(m.get("shm_free_bytes"))
    share, local = shape.get("cpus_per_rank"), int(shape.get("local_world_size") or 1)
    each = (
        f" ({share} per rank: {local} ranks here, worker counts judged per rank)"
        if share is not None and local > 1
        else ""
    )
    rows = [
        ("your settings", f"{report.config.label()}, batch_size={report.batch_size}"),
        (
            "machine",
            f"{counted(int(m.get('cpus_usable') or 0), 'usable CPU')}{each}, /dev/shm {shm} free, "
            f"accelerator {m.get('accelerator', 'none')}",
        ),
    ]
    if report.consumer is not None:
        alone = report.consumer_alone_samples_per_s
        pace = f"; alone {rate(alone)} samples/s" if alone else ""
        rows.append(("consumer", f"{report.consumer.get('kind')}{pace}"))
    if report.bottleneck:  # yours: an alternative's, where it differs, is beside it
        label = BOTTLENECK_LABELS.get(report.bottleneck, report.bottleneck)
        rows.append(("bottleneck", f"{label} at your settings"))
    # "ran", not "ok": a step that ran may have found what it looks for (duplicates).
    said = {"ok": "ran", "skipped": "skipped ({})"}
    steps = " · ".join(
        f"{c.name} {said.get(c.status, c.status)}".format(c.detail) for c in report.checks
    )
    rows.append(("checks", f"{steps}; {report.seconds:.0f} s in all"))
    return kv_table(rows, title=title_of("doctor", report.target, report.ranks))


def doctor_report(report: Report) -> RenderableType:
    """The whole console report of the doctor: what was measured, then the findings grouped by
    severity, errors first; "no problems found" when there is no error or warning."""
    parts: list[Any] = [doctor_summary(report), Text("")]
    if report.trials:
        parts += [doctor_trials(report), Text("")]
    problems = report.problems
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        parts.append(Text(f"Findings ({count})", style="bold"))
    else:
        parts.append(Text("no problems found", style="bold green"))
    if report.findings:  # else findings_list would say "no problems found" again
        parts.append(findings_list(report.findings))
    return Group(*parts)
