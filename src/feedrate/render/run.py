"""``feedrate run``'s report: on the console (rich), as a self-contained HTML page with the stall
timeline plotted (matplotlib, the optional ``plot`` extra), and the timeline alone as PNG bytes.
Renders plain data (``RunReport``); measures nothing."""

from __future__ import annotations

import base64
import html
import io
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from feedrate.errors import UserError
from feedrate.render.console import findings_list
from feedrate.render.text import rate, size
from feedrate.results.run import LoaderRun, RunReport, Window

if TYPE_CHECKING:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

SPARKS = "▁▂▃▄▅▆▇█"
#: Windows shown at most in a console sparkline (neighbours merge beyond).
SPARK_WIDTH = 60
MISSING_MATPLOTLIB = "--html needs matplotlib for the timeline: pip install 'feedrate[plot]'"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:,.1f} s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _stalls(before: float | None, after: float | None) -> str:
    """The stall with the user's settings and once tuned, in words (either may be unmeasured:
    autotune started from other settings, or the run ended first)."""
    yours = "not measured" if before is None else f"{before:.0%}"
    tuned = "not measured" if after is None else f"{after:.0%}"
    return f"stall with your settings {yours}, over the last half of the batches {tuned}"


def merged(timeline: list[Window], width: int) -> list[Window]:
    """``timeline`` in at most ``width`` windows, neighbours summed."""
    if len(timeline) <= width:
        return timeline
    per = -(-len(timeline) // width)
    out = []
    for i in range(0, len(timeline), per):
        part = timeline[i : i + per]
        out.append(
            Window(
                part[0].t_s,
                sum(w.span_s for w in part),
                sum(w.wait_s for w in part),
                sum(w.step_s for w in part),
                sum(w.batches for w in part),
            )
        )
    return out


def sparkline(timeline: list[Window], width: int = SPARK_WIDTH) -> str:
    """The stall per window as block characters (▁ none, █ all); a space for a window in
    which the loop did not run (between epochs)."""
    marks = []
    for w in merged(timeline, width):
        stall = w.stall
        marks.append(" " if stall is None else SPARKS[min(7, int(stall * 8))])
    return "".join(marks)


def _workers(ld: LoaderRun) -> str:
    if not ld.settled_config.num_workers and not ld.workers.cpu_util:
        return "-"
    cpu = "-" if ld.workers.cpu_util is None else f"{ld.workers.cpu_util:.0%} CPU"
    memory = ld.workers.pss_bytes or ld.workers.uss_bytes
    return f"{cpu}, {size(memory)}" if memory else cpu


def _facts(ld: LoaderRun) -> list[str]:
    per_s = ld.samples / ld.loop_s if ld.loop_s > 0 else 0.0
    restarts = len(ld.epoch_restart_s)
    again = ""
    if restarts:
        mean = sum(ld.epoch_restart_s) / restarts
        again = f" (then {_seconds(mean)} at each of {restarts} restarts)"
    batch = "" if ld.batch_size is None else f" · batch_size {ld.batch_size}"  # unknown: left out
    return [
        f"{ld.config.label()}{batch} · {ld.epochs} epoch(s) · "
        f"{ld.loader_type} of {ld.dataset_type}",
        f"{ld.batches:,} batches · {ld.samples:,} samples · {rate(per_s)} samples/s",
        f"waited {_seconds(ld.wait_s)} in next() · stepped {_seconds(ld.step_s)} · "
        f"stall {_pct(ld.stall)}",
        f"start-up {_seconds(ld.startup_s)}{again} · workers {_workers(ld)}"
        + (f" · /dev/shm peak {size(ld.shm_peak_bytes)}" if ld.shm_peak_bytes else ""),
    ]


def loader_block(ld: LoaderRun, *, detail: bool = True) -> RenderableType:
    """One loader: where it was built, what it did, its stall over time; with ``detail``,
    its findings and next step."""
    head = Text()
    head.append(f"{ld.role} loader ", style="bold")
    head.append(ld.name or ld.created_at, style="bold cyan")
    where = f"rank {ld.rank}, pid {ld.pid}" if ld.rank is not None else f"pid {ld.pid}"
    built = f"; built at {ld.created_at}" if ld.name else ""
    head.append(f"  ({where}{built})", style="dim")
    parts: list[RenderableType] = [head]
    parts += [Text(f"  {line}") for line in _facts(ld)]
    parts.append(Text(f"  stall over time |{sparkline(ld.timeline)}|", style="magenta"))
    tuned = ld.autotune
    if tuned is not None and tuned.error:
        parts.append(Text(f"  autotune could not wrap it: {tuned.error}", style="yellow"))
    elif tuned is not None and tuned.after is not None:
        parts.append(
            Text(
                f"  autotune: {tuned.before.label()} → {tuned.after.label()} "
                f"({'settled' if tuned.settled else 'still tuning'}, started from "
                f"{tuned.started_from}; {_stalls(tuned.stall_before, tuned.stall_after)})",
                style="green",
            )
        )
    if detail:
        if ld.findings or ld.bottleneck is not None:
            parts.append(findings_list(ld.findings))
        else:  # no bottleneck read: it saw too little to judge, not "no problems"
            parts.append(
                Text("not judged: too little observed (see the next step)", style="yellow")
            )
        if ld.next_step:
            steps = Text()
            steps.append("next step", style="bold green")
            for i, line in enumerate(ld.next_step, 1):
                steps.append(f"\n  {i}. {line}")
            parts.append(steps)
    return Group(*parts)


def same_loader(loaders: list[LoaderRun]) -> list[list[LoaderRun]]:
    """The loaders grouped by where they were built and their role (one group holds every
    rank's copy of a loader), in the order met; in each group, the most stalled first."""
    groups: dict[tuple[str, str], list[LoaderRun]] = {}
    for ld in loaders:
        groups.setdefault((ld.role, ld.created_at), []).append(ld)
    return [sorted(g, key=lambda ld: -(ld.settled_stall or 0.0)) for g in groups.values()]


def _brief(ld: LoaderRun) -> str:
    where = f"rank {ld.rank} (pid {ld.pid})" if ld.rank is not None else f"pid {ld.pid}"
    return (
        f"{where}: {ld.batches:,} batches, {ld.samples:,} samples, waited "
        f"{_seconds(ld.wait_s)}, stepped {_seconds(ld.step_s)}, stall {_pct(ld.stall)}"
    )


def run_report(report: RunReport) -> RenderableType:
    """The report for the console: the verdict, then each training loader with its timeline,
    findings and next step, then the evaluation loaders apart (no findings: their stall
    costs evaluation time, not training time)."""
    status = f"exit {report.exit_code}" + (", interrupted" if report.interrupted else "")
    title = Text()
    title.append("feedrate run", style="bold")
    title.append(f" {shlex.join(report.command)}  ({status}, {report.wall_s:,.1f} s)")
    parts: list[RenderableType] = [Text(""), title, Text(report.verdict, style="bold")]
    for group in same_loader(report.loaders):  # training loaders first
        worst = group[0]
        parts += [Text(""), loader_block(worst, detail=worst.role == "train")]
        parts += [Text(f"  also {_brief(ld)}", style="dim") for ld in group[1:]]
    notes = [n for p in report.processes for n in p.notes]
    parts += [Text(f"note: {n}", style="yellow") for n in notes]
    return Group(*parts)


# --- the timeline plot and the HTML page ------------------------------------------------------


def timeline_png(report: RunReport) -> bytes:
    """The stall per window of every loader against the run's time, as PNG bytes."""
    fig = _timeline_figure(report)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _matplotlib() -> tuple[type[Figure], type[FigureCanvasAgg]]:
    """The Figure class and the Agg canvas, or the install hint when matplotlib is missing
    (``feedrate run --html`` asks before the script runs, not after)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UserError(MISSING_MATPLOTLIB) from exc
    return Figure, FigureCanvasAgg


def check_plotting() -> None:
    """Raise ``UserError`` now if the HTML report could not be drawn."""
    _matplotlib()


def _timeline_figure(report: RunReport) -> Figure:
    figure_cls, canvas_cls = _matplotlib()
    fig = figure_cls(figsize=(9.0, 4.0), dpi=110, layout="constrained")
    canvas_cls(fig)
    ax = fig.subplots()
    for ld in report.loaders:
        points = [(w.t_s + w.span_s / 2, w.stall) for w in ld.timeline]
        xs = [x for x, s in points if s is not None]
        ys = [100 * s for _, s in points if s is not None]
        style = "-" if ld.role == "train" else "--"
        ax.plot(xs, ys, style, marker=".", ms=3, lw=1.4, label=f"{ld.role}: {ld.label}")
    ax.set_xlabel("seconds since the command started")
    ax.set_ylabel("stall (% of the loop waiting in next())")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    if report.loaders:
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle("data stall over time", fontsize=11)
    return fig


_STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; color: #1f2328; background: #f6f8fa; margin: 0; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eaeef2; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 13px ui-monospace, monospace; } img { max-width: 100%; }
li.warning { color: #9a6700; } li.error { color: #cf222e; } .fix { color: #59636e; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _table_html(loaders: list[LoaderRun]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("loader", "where", "settings", "batches", "samples", "waited", "stepped")
    )
    rows = []
    for ld in loaders:
        cells = [ld.name or ld.created_at, ld.label, ld.config.label()]
        nums = [f"{ld.batches:,}", f"{ld.samples:,}", _seconds(ld.wait_s), _seconds(ld.step_s)]
        rows.append(
            "<tr>"
            + "".join(f"<td><code>{_e(c)}</code></td>" for c in cells)
            + "".join(f'<td class="n">{_e(n)}</td>' for n in nums)
            + f'<td class="n"><b>{_e(_pct(ld.stall))}</b></td></tr>'
        )
    return f"<table><tr>{head}<th>stall</th></tr>{''.join(rows)}</table>"


def _loader_html(ld: LoaderRun) -> str:
    items = [
        f'<li class="{_e(f.severity)}"><code>{_e(f.id)}</code> {_e(f.message)}'
        f'<div class="fix">fix: <code>{_e(f.fix)}</code></div></li>'
        for f in ld.findings
    ]
    steps = "".join(f"<li><code>{_e(s)}</code></li>" for s in ld.next_step)
    out = f"<h3><code>{_e(ld.label)}</code></h3><ul>{''.join(items)}</ul>"
    return out + (f"<p>next step:</p><ol>{steps}</ol>" if steps else "")


def render_html(report: RunReport) -> str:
    """The report as one HTML document: the verdict, the timeline, the loaders (training, then
    evaluation), their findings and next step."""
    png = base64.b64encode(timeline_png(report)).decode("ascii")
    train = [ld for ld in report.loaders if ld.role == "train"]
    evaluation = [ld for ld in report.loaders if ld.role == "eval"]
    body = [
        f"<h1>feedrate run <code>{_e(shlex.join(report.command))}</code></h1>",
        f"<p>exit {report.exit_code}, {report.wall_s:,.1f} s"
        + (", interrupted" if report.interrupted else "")
        + f" · feedrate {_e(report.feedrate_version)}</p>",
        f"<p><b>{_e(report.verdict)}</b></p>",
        f'<img alt="stall over time" src="data:image/png;base64,{png}">',
    ]
    if train:
        body += ["<h2>Training loaders</h2>", _table_html(train), *map(_loader_html, train)]
    if evaluation:
        body += ["<h2>Evaluation loaders</h2>", _table_html(evaluation)]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>feedrate run</title>\n<style>{_STYLE}</style>\n</head>\n"
        f"<body>\n<main>\n{''.join(body)}\n</main>\n</body>\n</html>\n"
    )


def write_html(report: RunReport, path: str | Path) -> Path:
    out = Path(path)
    out.write_text(render_html(report), encoding="utf-8")
    return out
