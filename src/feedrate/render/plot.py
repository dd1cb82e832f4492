"""PNG plot of a tuning result: samples/s against num_workers, one line per setting combination,
with the worker memory of the main series below. Renders plain data; measures nothing.

matplotlib is an optional extra (``feedrate[plot]``), imported only when a plot is drawn. The
figure is built with ``Figure`` and the Agg canvas, never pyplot: no global state (backend,
current figure) is touched and nothing is left open after a plot.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feedrate.errors import UserError
from feedrate.render.text import rate
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

MISSING_MATPLOTLIB = "--plot and --html need matplotlib: pip install 'feedrate[plot]'"
DPI = 110
FIGSIZE = (9.0, 6.0)
MiB = 1024 * 1024
#: From this ratio of the largest to the smallest worker count, the x axis goes logarithmic.
LOG_SPAN = 16
#: More distinct worker counts than this get automatic ticks instead of one per count.
MAX_TICKS = 16

MARKERS = "os^Dv"
_NOTE_BOX = {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.6", "alpha": 0.9}
_NOTE: dict[str, Any] = {"textcoords": "offset points", "fontsize": 8.5, "zorder": 7}
_MAIN: dict[str, Any] = {"lw": 2.0, "ms": 5, "alpha": 1.0, "zorder": 3}
_OTHER: dict[str, Any] = {"lw": 1.2, "ms": 4, "alpha": 0.75, "zorder": 2}

SeriesKey = tuple[int | None, bool, bool | None, bool, int]


def plot_png(result: TuneResult, path: str | Path) -> Path:
    """Write the plot of ``result`` to ``path`` as a PNG and return the path."""
    out = Path(path)
    out.write_bytes(png_bytes(result))
    return out


def png_bytes(result: TuneResult) -> bytes:
    """The plot of ``result`` as PNG bytes (about 990x660 pixels)."""
    fig = _figure(result)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def series(trials: list[Trial]) -> list[tuple[str, list[Trial]]]:
    """Measured trials grouped by every setting but num_workers, largest group (the main series)
    first, each sorted by num_workers. A trial without workers has no prefetch or persistence
    settings, so it starts the largest group with the same pin_memory instead of standing alone."""
    groups: dict[SeriesKey, list[Trial]] = {}
    for t in trials:
        if t.measured:
            c = t.config
            key = (c.prefetch_factor, c.persistent_workers, c.in_order, c.pin_memory, c.threads)
            groups.setdefault(key, []).append(t)
    for key in [k for k in groups if k[0] is None]:
        hosts = [k for k in groups if k[0] is not None and k[3:] == key[3:]]
        if hosts:
            host = max(hosts, key=lambda k: len(groups[k]))
            groups[host] = groups.pop(key) + groups[host]
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    return [(_series_label(k), sorted(ts, key=lambda t: t.config.num_workers)) for k, ts in ordered]


def _series_label(key: SeriesKey) -> str:
    pf, persistent, in_order, pin, threads = key
    flags = [
        persistent and "persistent",
        in_order is False and "unordered",
        pin and "pin",
        threads > 1 and f"{threads} threads each",
    ]
    return ", ".join(["no workers" if pf is None else f"prefetch {pf}", *(f for f in flags if f)])


def _matplotlib() -> tuple[type[Figure], type[FigureCanvasAgg]]:
    """The Figure class and the Agg canvas, or the install hint when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UserError(MISSING_MATPLOTLIB) from exc
    return Figure, FigureCanvasAgg


def _figure(result: TuneResult) -> Figure:
    figure_cls, canvas_cls = _matplotlib()
    fig = figure_cls(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    canvas_cls(fig)
    ax, mem = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    groups = series(result.trials)
    _x_axis(ax, result)
    _draw_series(ax, groups)
    _draw_unmeasured(ax, result.trials)
    _draw_references(ax, result)
    _y_axis(ax, result)
    _draw_choices(ax, result)
    _draw_memory(
        mem, [(i, *g) for i, g in enumerate(groups) if i == 0 or g[1][0].config.threads > 1]
    )
    _titles(fig, result)
    _legend(fig, ax, [label for label, _ in groups])
    return fig


def _legend(fig: Figure, ax: Axes, series_labels: list[str]) -> None:
    """Below the figure, where it never hides data: series first, then reference lines, then
    trials without figures."""
    handles, labels = ax.get_legend_handles_labels()

    def rank(i: int) -> int:
        lb = labels[i]
        return 0 if lb in series_labels else 2 if lb.startswith(("skipped", "failed")) else 1

    order = sorted(range(len(labels)), key=rank)
    hs, ls = [handles[i] for i in order], [labels[i] for i in order]
    fig.legend(hs, ls, loc="outside lower center", ncols=3, fontsize=8.5, frameon=False)


def _titles(fig: Figure, result: TuneResult) -> None:
    m = result.machine
    facts = [f"{m.get('cpus_usable', '?')} usable CPUs", f"torch {m.get('torch_version', '?')}"]
    if m.get("accelerator") not in (None, "none"):
        facts.append(str(m["accelerator"]))
    if result.batch_size:
        facts.append(f"batch size {result.batch_size}")
    partial = "  (partial result)" if result.partial else ""
    fig.suptitle(
        f"feedrate tune  {result.target or '(loader)'}{partial}\n{'  ·  '.join(facts)}",
        x=0.01,
        ha="left",
        fontsize=11,
    )


def _x_axis(ax: Axes, result: TuneResult) -> None:
    """num_workers, with a tick at each count tried and at the usable CPUs; log-like (symlog
    base 2, so 0 stays on the axis) when the counts span a wide range."""
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator, ScalarFormatter

    counts = sorted({t.config.num_workers for t in result.trials} | {0})
    cpus = int(result.machine.get("cpus_usable") or 0)
    hi = max(counts[-1], cpus, 1)
    log = counts[-1] / max(counts[1] if len(counts) > 1 else 1, 1) >= LOG_SPAN
    if log:
        ax.set_xscale("symlog", base=2, linthresh=1, linscale=0.6)
        ax.set_xlim(-0.25, hi * 1.25)
    else:
        ax.set_xlim(-0.04 * hi - 0.3, hi * 1.04 + 0.3)
    ticks = _ticks(counts, cpus, log, hi)
    many = len(ticks) > MAX_TICKS
    ax.xaxis.set_major_locator(MaxNLocator(integer=True) if many else FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def _ticks(counts: list[int], cpus: int, log: bool, hi: int) -> list[int]:
    """The counts tried, plus the CPU count unless a tried count sits too close to label both."""

    def near(c: int) -> bool:
        return max(c, cpus) / max(min(c, cpus), 1) < 1.3 if log else abs(c - cpus) < hi / 20

    if cpus and not any(near(c) for c in counts):
        return sorted([*counts, cpus])
    return counts


def _thousands(ax: Axes) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _y_axis(ax: Axes, result: TuneResult) -> None:
    tops = [t.spread.max for t in result.trials if t.measured and t.spread is not None]
    tops.append(consumer_rate(result) or 0.0)
    ax.set_ylim(0, max(max(tops) * 1.3, 1.0))
    _thousands(ax)
    ax.set_ylabel("samples/s (median window, ± standard error)")
    ax.grid(True, axis="both", alpha=0.25)


def _draw_series(ax: Axes, groups: list[tuple[str, list[Trial]]]) -> None:
    for i, (label, trials) in enumerate(groups):
        x = [t.config.num_workers for t in trials]
        y = [t.median for t in trials]
        err = [t.median * t.noise for t in trials]  # the ± of the console and the HTML
        fmt = "-" + MARKERS[i % len(MARKERS)]
        style: dict[str, Any] = {"label": label, "color": f"C{i}", **(_OTHER if i else _MAIN)}
        ax.errorbar(x, y, yerr=err, fmt=fmt, capsize=3, **style)


def _draw_unmeasured(ax: Axes, trials: list[Trial]) -> None:
    kinds = (
        ([t for t in trials if t.skipped], "grey", "skipped (predicted over budget)"),
        ([t for t in trials if t.error and not t.skipped], "red", "failed"),
    )
    for chosen, color, label in kinds:
        if chosen:
            x = [t.config.num_workers for t in chosen]
            ax.plot(x, [0] * len(x), "x", color=color, ms=7, mew=2, label=label, clip_on=False)


def _draw_references(ax: Axes, result: TuneResult) -> None:
    cpus = result.machine.get("cpus_usable")
    if cpus:
        ax.axvline(cpus, ls="--", color="0.35", lw=1, label=f"usable CPUs ({cpus})", zorder=1)
    need = consumer_rate(result)
    if need:
        label = f"consumer needs {rate(need)} samples/s"
        ax.axhline(need, ls="--", color="C3", lw=1.2, zorder=1, label=label)


def consumer_rate(result: TuneResult) -> float | None:
    """The consumer's pace in samples/s: given as a rate, or derived from a step time."""
    c = result.consumer or {}
    if c.get("samples_per_s"):
        return float(c["samples_per_s"])
    if c.get("step_s") and result.batch_size:
        return float(result.batch_size / c["step_s"])
    return None


def _draw_choices(ax: Axes, result: TuneResult) -> None:
    best, yours = result.best, result.baseline
    same = best.config == yours.config
    if yours.measured and not same:
        x = yours.config.num_workers
        ax.plot(x, yours.median, "o", ms=14, mfc="none", mec="black", mew=1.6, zorder=5)
        _note(ax, x, yours.median, f"yours: {yours.config.label()}", right=True)
    if best.measured:
        x = best.config.num_workers
        ax.plot(x, best.median, "*", ms=20, color="gold", mec="black", mew=1, zorder=6)
        mark = "best (= yours)" if same else "best"
        _note(ax, x, best.median, f"{mark}: {best.config.label()}\n{rate(best.median)} samples/s")


def _note(ax: Axes, x: float, y: float, text: str, right: bool = False) -> None:
    """A boxed label beside a point, inside the axes: above it, to the left unless the point is
    near the left edge (curves mostly rise to the right, leaving the upper left empty) or
    ``right`` asks otherwise; below it when the point is near the top."""
    fx, fy = ax.transAxes.inverted().transform(ax.transData.transform((x, y)))
    ha = "left" if right or fx < 0.25 else "right"
    above = fy < 0.8
    offset = (12 if ha == "left" else -12, 12 if above else -12)
    va = "bottom" if above else "top"
    ax.annotate(text, (x, y), xytext=offset, ha=ha, va=va, bbox=_NOTE_BOX, **_NOTE)


def _draw_memory(ax: Axes, groups: list[tuple[int, str, list[Trial]]]) -> None:
    """Memory of the main series, and of each threaded series beside it (same colours as
    above: threads are worth their place when they reach the rate for less memory)."""
    ax.set_xlabel("num_workers")
    ax.set_ylabel("memory (MiB)")
    ax.grid(True, alpha=0.25)
    top = 0.0
    for i, _, trials in groups:
        points = [(t.config.num_workers, t.memory_bytes / MiB) for t in trials if t.memory_bytes]
        if not points:
            continue
        x, y = zip(*points, strict=True)
        color = f"C{i}"
        ax.plot(x, y, "-s", color=color, ms=4, lw=1.5)
        if len(x) > 1:
            ax.fill_between(x, y, color=color, alpha=0.12)
        top = max(top, *y)
    if not top:
        ax.text(0.5, 0.5, "no memory figures", transform=ax.transAxes, ha="center", color="0.5")
        return
    ax.set_ylim(0, top * 1.25)
    _thousands(ax)
    label = " and ".join(lb for _, lb, _ in groups)
    title = f"memory (PSS) of the main process and workers, {label}"
    ax.set_title(title, fontsize=8.5, loc="left", color="0.3")
