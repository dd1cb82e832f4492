"""Judging and rendering for ``tune_vs_grid.py``: the criteria as pure functions over the plain
record, the markdown tables, and the console progress. A saved JSON renders again
(``tune_vs_grid.py --render``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import commit_label, machine_line
from rich.progress import Progress

from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial
from feedrate.workflows.tune import Progress as TuneProgress

SCHEMA = "feedrate.bench.tune_vs_grid/1"
RATIO_MIN = 0.95
"""(a) tune's pick reaches at least this share of the grid best's samples/s."""
TIME_SHARE_MAX, TIME_MAX_S = 0.10, 60.0
"""(b) tune takes at most this share of the grid's wall time, and at most this many seconds."""
STEM = "tune_vs_grid"


def write(data: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{STEM}.md").write_text(markdown(data))


def _mark(ok: bool) -> str:
    return "pass" if ok else "**fail**"


def _rate(x: float) -> str:
    return f"{x:,.0f}"


def _ratio(x: float | None) -> str:
    return "off grid" if x is None else f"{x:.3f}"


def _interleaved(again: dict[str, Any]) -> str:
    if again["same_config"]:
        return "1 (same config)"
    ratios = [r["ratio"] for r in again["rounds"]]
    return f"{again['ratio_median']:.3f} ({min(ratios):.2f}–{max(ratios):.2f})"


def row(p: dict[str, Any]) -> list[str]:
    grid, tune, c, k = p["grid"], p["tune"], p["consumer"], p["criteria"]
    best = grid["best"]
    share = k["tune_grid_time_share"]
    stalls = "" if c.get("tune_covers", True) else ", pick stalls"
    fed = c.get("fed_w", "?")
    consumer = (
        f"{c['tune_w']} vs {c['grid_w']}; fed from {'none' if fed is None else fed} "
        f"(R={_rate(c['rate'])}{stalls})"
    )
    return [
        p["name"],
        p["kind"],
        f"{best['label']}: {_rate(best['median'])}",
        f"{tune['label']}: {_rate(tune['median'])}",
        _interleaved(p["remeasure"]),
        _ratio(p["raw_ratio"]),
        f"{tune['wall_s']:.0f}",
        f"{grid['wall_s']:.0f}",
        "-" if share is None else f"{share:.0%}",
        consumer,
        _mark(k["a_ratio"]),
        _mark(k["b_time"]),
        _mark(k["c_consumer"]),
        "-" if "c_fed" not in k else _mark(k["c_fed"]),
    ]


HEAD = [
    "pipeline",
    "kind",
    "grid best: samples/s",
    "feedrate pick: samples/s (tune's own)",
    "ratio, interleaved (range)",
    "ratio, raw",
    "tune s",
    "grid s",
    "tune/grid",
    "consumer: feedrate w vs grid w; fed from w",
    "(a) ≥95%",
    "(b) time",
    "(c) consumer",
    "(c) fed",
]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def detail_row(p: dict[str, Any]) -> list[str]:
    grid, tune, c = p["grid"], p["tune"], p["consumer"]
    skipped = sum(1 for e in grid["configs"] if e["trial"]["spread"] is None)
    stall = c["tune"]["stall_fraction"]
    rounds = ", ".join(f"{r['ratio']:.3f}" for r in p["remeasure"]["rounds"]) or "-"
    return [
        p["name"],
        f"{p['item_cost_s'] * 1e3:.3f}",
        str(p["epoch_batches"] or "-"),
        f"{len(grid['configs'])} ({skipped} skipped)",
        f"{len(tune['trials'])}, {tune['search_seconds']:.0f} s"
        + (" partial" if tune["partial"] else ""),
        rounds,
        f"{c['grid_covering']}; w≥1: {c['grid_w_with_workers']}",
        _consumer_grid(c.get("consumer_grid")),
        f"{c['tune']['label']}, stall {'-' if stall is None else f'{stall:.0%}'}, "
        f"{c['tune']['wall_s']:.0f} s",
    ]


def _consumer_grid(truth: dict[str, Any] | None) -> str:
    if truth is None:
        return "-"
    cells = []
    for e in truth["configs"]:
        stall = e["trial"].get("stall_fraction")
        w = e["trial"]["config"]["num_workers"]
        cells.append(f"{w}: {_rate(e['median'])} ({'-' if stall is None else f'{stall:.0%}'})")
    return ", ".join(cells)


DETAIL_HEAD = [
    "pipeline",
    "ms/sample (main process)",
    "batches/epoch",
    "grid configs",
    "tune trials, search time",
    "interleaved ratios per round",
    "grid smallest covering",
    "with the consumer: w samples/s (stall)",
    "tune --rate R: pick, stall, time",
]


def markdown(data: dict[str, Any]) -> str:
    ps = data["pipelines"]
    grid = data["grid"]
    lines = [
        f"# tune vs exhaustive grid{' (--quick)' if data['quick'] else ''}",
        "",
        f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']} "
        f"({commit_label(data)}), "
        f"{data['wall_s'] / 60:.0f} min{'' if data['complete'] else ', INCOMPLETE'}.",
        "",
        f"Machine: {machine_line(data['machine'])}.",
        "",
        *_runs(data),
        f"Grid: num_workers {grid['workers']} × prefetch_factor {grid['prefetch_factor']} × "
        "persistent_workers {False, True} (w=0 once); every configuration measured like a tune "
        f"trial ({data['trial']['seconds']:g} s, {data['trial']['windows']} windows, median). "
        f"Criteria: (a) interleaved ratio ≥ {RATIO_MIN}; (b) tune ≤ {TIME_SHARE_MAX:.0%} of the "
        f"grid's time and ≤ {TIME_MAX_S:g} s; (c) with a consumer of R = "
        f"{data['trial']['rate_share']:.0%} of the grid best, tune's num_workers within one grid "
        "step of the fewest-worker grid configuration measuring ≥ 1.05 R.",
        "",
        *_table(HEAD, [row(p) for p in ps]),
        "",
        *_table(DETAIL_HEAD, [detail_row(p) for p in ps]),
        "",
        "Ratios are feedrate's pick over the grid's best: *interleaved* from the re-measurements "
        "(alternating order each round; median and range of the per-round ratios; `same "
        "config` when there was nothing to re-measure), *raw* from the grid's own measurement "
        "of the pick (`off grid` when the "
        "pick's worker count is not in the grid). *pick stalls*: tune found no configuration "
        "that keeps the consumer fed (data stall ≤ 5%) and recommended the fewest workers "
        "within the noise of the least stall. *w≥1*: the grid's smallest covering configuration "
        "among those with workers "
        "(with `num_workers=0` loading runs in series with the step, so it cannot hide it). "
        "*fed from w*: the fewest workers (pf=2, persistent) that kept the consumer itself fed "
        "(stall ≤ 5%) when measured with it, `none` if no worker count in the grid did; "
        "*(c) fed* passes when tune's pick keeps the consumer fed within one grid step of that "
        "count, or when neither found one that does.",
        "",
    ]
    return "\n".join(lines)


def _runs(data: dict[str, Any]) -> list[str]:
    """When records come from more than one run (``--merge``), when and at which commit each
    pipeline was measured."""
    if not data.get("merged_from"):
        return []
    parts = [
        f"{p['name']} {p['run']['date']} ({commit_label(p['run'])})"
        for p in data["pipelines"]
        if p.get("run")
    ]
    return [f"Pipelines measured in more than one run (`--merge`): {'; '.join(parts)}.", ""]


def summary_line(p: dict[str, Any]) -> str:
    r = row(p)
    return (
        f"[bold]{p['name']}[/bold]: grid best {r[2]}; feedrate {r[3]}; ratio {r[4]} (raw {r[5]}); "
        f"tune {r[6]} s vs grid {r[7]} s ({r[8]}); consumer w {r[9]}; "
        f"(a) {r[10]} (b) {r[11]} (c) {r[12]}, fed {r[13]}"
    )


# --- judging -----------------------------------------------------------------------------------


def smallest_covering(
    entries: list[dict[str, Any]], rate: float, margin: float, min_w: int = 0
) -> Any:
    """The grid entry with the fewest workers (then least memory) measuring ≥ margin × rate."""
    ok = [
        e
        for e in entries
        if e["trial"]["spread"] is not None
        and e["median"] >= rate * margin
        and e["trial"]["config"]["num_workers"] >= min_w
    ]
    return min(
        ok, key=lambda e: (e["trial"]["config"]["num_workers"], e["memory_bytes"]), default=None
    )


def fed_agrees(workers: Sequence[int], fed_w: int | None, tune_w: int, tune_fed: bool) -> bool:
    """Tune's pick keeps the consumer fed within one grid step of the fewest workers that did
    when measured with it, or neither kept it fed."""
    if fed_w is None:
        return not tune_fed
    return tune_fed and within_one_step(workers, fed_w, tune_w)


def within_one_step(workers: Sequence[int], grid_w: int, tune_w: int) -> bool:
    """``tune_w`` lies between the grid neighbours of ``grid_w`` (it may be off the grid)."""
    j = list(workers).index(grid_w)
    return workers[max(j - 1, 0)] <= tune_w <= workers[min(j + 1, len(workers) - 1)]


def criteria(
    grid: dict[str, Any], tuned: dict[str, Any], again: dict[str, Any], consumer: dict[str, Any]
) -> dict[str, Any]:
    share = tuned["wall_s"] / grid["wall_s"] if grid["wall_s"] > 0 else None
    return {
        "a_ratio": again["ratio_median"] >= RATIO_MIN,
        "b_time": share is not None and share <= TIME_SHARE_MAX and tuned["wall_s"] <= TIME_MAX_S,
        "tune_grid_time_share": share,
        "c_consumer": consumer["within_one_step"],
        "c_fed": consumer["fed_agrees"],
    }


def raw_ratio(grid: dict[str, Any], tuned: dict[str, Any]) -> float | None:
    """Tune's pick as measured in the grid over the grid's best (None when off the grid)."""
    pick = LoaderConfig.from_dict(tuned["config"])
    for e in grid["configs"]:
        if LoaderConfig.from_dict(e["trial"]["config"]) == pick and e["trial"]["spread"]:
            return e["median"] / grid["best"]["median"]
    return None


# --- console ------------------------------------------------------------------------------------


class Ui:
    """Live progress (pipeline, step i/N, elapsed) with a line per finished measurement."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("", total=None)

    def start(self, name: str, total: int) -> None:
        self.progress.reset(self.task, total=total, description=name)

    def step(self, description: str) -> None:
        self.progress.update(self.task, description=description)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def note(self, text: str) -> None:
        self.progress.console.print(text)

    def grid_line(self, name: str, i: int, n: int, trial: Trial, wall: float) -> None:
        self.advance()
        self.note(
            f"{name:<9} {i + 1:>3}/{n} {trial.config.label():<22} {outcome(trial)}  ({wall:.1f} s)"
        )

    def tune_hook(self, name: str) -> Callable[[TuneProgress], None]:
        def hook(event: TuneProgress) -> None:
            if event.trial is not None:
                self.note(
                    f"{name:<9} tune {event.config.label():<22} {outcome(event.trial)}"
                    f"  (at {event.elapsed_s:.0f} s) {event.reason}"
                )

        return hook


def outcome(t: Trial) -> str:
    if t.skipped or t.error:
        return f"skipped: {t.skipped or t.error}"
    stall = "" if t.stall_fraction is None else f", stall {t.stall_fraction:.0%}"
    return f"{t.median:>10,.0f} samples/s ± {t.noise:.0%}{stall}"
