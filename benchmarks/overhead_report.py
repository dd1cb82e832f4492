"""Summaries and renderings of ``overhead.py``'s runs: the JSON record, the markdown and console
tables. Everything here works on plain data, so a saved JSON can be rendered again."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import commit_label, machine_line
from rich.table import Table

if TYPE_CHECKING:
    from overhead import Bench, Pipeline

TARGET_OVERHEAD = 0.02
"""The issue's target: measuring costs at most 2 % of samples/s (geometric mean over pipelines)."""
RESULTS = Path("benchmarks/results")
SCHEMA = "feedrate.bench.overhead/1"
BARE, FEEDRATE = "bare", "feedrate"


def build(bench: Bench, micro: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The raw record: settings, machine, pipelines and their schedules, micro-costs, every run.
    ``summarize`` adds the figures."""
    return {
        "schema": SCHEMA,
        **meta,
        "target_overhead": TARGET_OVERHEAD,
        "rounds": bench.rounds,
        "quick": bench.quick,
        "order": "ABBA: even rounds run the arms in listed order, odd rounds reversed",
        "arms": [a.__dict__ for a in bench.arms],
        "machine": bench.facts.to_dict(),
        "pipelines": {p.name: _pipeline(bench, p) for p in bench.pipelines},
        "micro_costs": micro,
        "runs": [r.to_dict() for r in bench.runs],
    }


def _pipeline(bench: Bench, p: Pipeline) -> dict[str, Any]:
    sched = bench.schedules[p.name]
    return {
        "target": p.target,
        "config": p.config.to_dict(),
        "config_label": p.config.label(),
        "batches_per_run": sched.batches,
        "method": sched.method,
        "discarded_batches_per_epoch": list(sched.skip),
        "counted_batches_per_epoch": list(sched.counted),
        "probe_attaches_timed": sched.timed("attach"),
        "probe_opens_timed": sched.timed("open"),
        "probe_closes_timed": sched.timed("close"),
    }


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Add per pipeline ``arms`` (median rates, per-round ratios) and ``accounting``, and the
    geometric means with a bootstrap interval over rounds, to ``record`` (in place; rerunnable
    on a saved record)."""
    arm_names = [a["name"] for a in record["arms"]]
    for name, p in record["pipelines"].items():
        mine = [r for r in record["runs"] if r["pipeline"] == name]
        p["arms"] = {a: _arm(mine, a, record["rounds"]) for a in arm_names}
        p["accounting"] = _accounting(mine, record["micro_costs"])
    pipes = record["pipelines"]
    record["geomean"] = {a: _geomean(pipes, a) for a in _measured_arms(arm_names)}
    record["target_met"] = _verdict(record["geomean"][FEEDRATE]["ratio_ci90"])
    return record


def _verdict(ratio_ci: list[float]) -> bool | None:
    """True when the whole 90 % interval of the overhead is within the target, False when all of
    it is beyond, None when the run cannot tell."""
    low, high = 1 - ratio_ci[1], 1 - ratio_ci[0]
    if high <= TARGET_OVERHEAD:
        return True
    return False if low > TARGET_OVERHEAD else None


def _overhead_cell(ratio: float, ci: list[float]) -> str:
    """Overhead (1 - ratio) and its 90 % interval, e.g. ``+1.4% [-3.0%, +6.2%]``."""
    return f"{1 - ratio:+.1%} [{1 - ci[1]:+.1%}, {1 - ci[0]:+.1%}]"


def _measured_arms(names: list[str]) -> list[str]:
    return [n for n in names if n != BARE]


def _gm(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in values))


def _geomean(pipelines: dict[str, Any], arm: str) -> dict[str, Any]:
    g = _gm([p["arms"][arm]["ratio_median"] for p in pipelines.values()])
    acc = 1 - _gm([1 - p["accounting"]["total"] for p in pipelines.values()])
    ci = _bootstrap([p["arms"][arm]["ratios"] for p in pipelines.values()])
    return {"ratio": g, "overhead": 1 - g, "ratio_ci90": ci, "accounted_overhead": acc}


def _bootstrap(ratios: list[list[float]], draws: int = 2000) -> list[float]:
    """5th and 95th percentile of the geometric mean of per-pipeline median ratios, over rounds
    drawn with replacement (the same rounds for every pipeline, as they ran side by side)."""
    rng = random.Random(0)
    rounds = len(ratios[0])
    stats = []
    for _ in range(draws):
        pick = [rng.randrange(rounds) for _ in range(rounds)]
        stats.append(_gm([statistics.median(r[i] for i in pick) for r in ratios]))
    stats.sort()
    return [stats[int(0.05 * draws)], stats[int(0.95 * draws) - 1]]


def _arm(runs: list[dict[str, Any]], arm: str, rounds: int) -> dict[str, Any]:
    rate = {r["round"]: r["samples_per_s"] for r in runs if r["arm"] == arm}
    out: dict[str, Any] = {"median_samples_per_s": statistics.median(rate.values())}
    if arm == BARE:
        return out
    base = {r["round"]: r["samples_per_s"] for r in runs if r["arm"] == BARE}
    ratios = [rate[i] / base[i] for i in range(rounds)]
    med = statistics.median(ratios)
    return out | {
        "ratios": ratios,
        "ratio_median": med,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_ci90": _bootstrap([ratios]),
        "overhead": 1 - med,
    }


def _accounting(runs: list[dict[str, Any]], micro: dict[str, Any]) -> dict[str, float]:
    """Instrumentation time as a share of the measured span. Probe reads and the probe thread are
    timed in every feedrate run (median share); per-batch and wrapper costs come from the
    micro-benchmarks, scaled by the bare loop's median rates."""
    fr = [r for r in runs if r["arm"] == FEEDRATE]
    bare = [r for r in runs if r["arm"] == BARE]

    def share(key: str) -> float:
        return float(statistics.median(r[key] / r["seconds"] for r in fr))

    batches_per_s = statistics.median(r["batches"] / r["seconds"] for r in bare)
    samples_per_s = statistics.median(r["samples_per_s"] for r in bare)
    parts = {
        "probe_reads": share("probe_reads_s"),
        "probe_memory_reads": share("memory_reads_s"),
        "probe_thread": share("probe_thread_s"),
        "per_batch": micro["per_batch"]["added_s"] * batches_per_s,
        "wrapper": micro["wrapper_per_sample"]["added_s"] * samples_per_s,
    }
    total = sum(v for k, v in parts.items() if k != "probe_memory_reads")
    close_ms = 1e3 * statistics.median(r["close_median_s"] for r in fr)
    return parts | {"total": max(0.0, total), "window_close_ms": close_ms}


# --- rendering ----------------------------------------------------------------------------------


def _arm_cell(entry: dict[str, Any]) -> str:
    rate, ratio = entry["median_samples_per_s"], entry["ratio_median"]
    return f"{rate:,.0f} ({ratio:.3f}, {entry['ratio_min']:.3f}–{entry['ratio_max']:.3f})"


def _rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    arms = _measured_arms([a["name"] for a in data["arms"]])
    head = ["pipeline", "config", "batches/run", "bare", *arms, "overhead [90% CI]", "accounted"]
    rows = []
    for name, p in data["pipelines"].items():
        bare = f"{p['arms'][BARE]['median_samples_per_s']:,.0f}"
        cells = [_arm_cell(p["arms"][a]) for a in arms]
        fr = p["arms"][FEEDRATE]
        over = _overhead_cell(fr["ratio_median"], fr["ratio_ci90"])
        acc = f"{p['accounting']['total']:.1%}"
        rows.append([name, p["config_label"], str(p["batches_per_run"]), bare, *cells, over, acc])
    geo = data["geomean"]
    cells = [f"ratio {geo[a]['ratio']:.3f}" for a in arms]
    g = geo[FEEDRATE]
    acc = f"{g['accounted_overhead']:.1%}"
    over = _overhead_cell(g["ratio"], g["ratio_ci90"])
    rows.append(["geomean", "", "", "", *cells, over, acc])
    return head, rows


ACCOUNTING_PARTS = (
    ("probe_reads", "probe calls on the measuring thread"),
    ("probe_thread", "probe poller thread (CPU)"),
    ("probe_memory_reads", "  of which memory_full_info reads (wall)"),
    ("per_batch", "per-batch bookkeeping + watchdog"),
    ("wrapper", "index-reporting wrapper"),
    ("total", "total instrumentation time"),
)


def _accounting_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    names = list(data["pipelines"])
    head = ["share of the measured span", *names]
    rows = []
    for key, label in ACCOUNTING_PARTS:
        rows.append([label, *[f"{data['pipelines'][n]['accounting'][key]:.2%}" for n in names]])
    pipes = [data["pipelines"][n] for n in names]
    close = [f"{p['accounting']['window_close_ms']:.1f} ms" for p in pipes]
    timed = [
        f"{p['probe_attaches_timed']}/{p['probe_opens_timed']}/{p['probe_closes_timed']}"
        for p in pipes
    ]
    rows += [
        ["one window close (median)", *close],
        ["attach/open/close calls inside the span", *timed],
    ]
    poller = data["micro_costs"].get("poller_interference")
    if poller:
        cell = f"{1 - poller['ratio_median']:+.2%} (paired 1 s slices, w=0)"
        rows.append(["poller slowing the measuring thread, direct", cell, *[""] * (len(names) - 1)])
    return head, rows


def _rich(title: str, rows_of: Callable[[dict[str, Any]], Any], data: dict[str, Any]) -> Table:
    head, rows = rows_of(data)
    t = Table(title=title)
    for i, col in enumerate(head):
        t.add_column(col, justify="left" if i < 2 else "right")
    for row in rows:
        t.add_row(*row)
    return t


def table(data: dict[str, Any]) -> Table:
    return _rich("measure() vs a bare loop, samples/s (medians over rounds)", _rows, data)


def accounting_table(data: dict[str, Any]) -> Table:
    return _rich("where measure()'s time goes", _accounting_rows, data)


def _md(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(data: dict[str, Any]) -> str:
    g = data["geomean"][FEEDRATE]
    verdict = {True: "met", False: "**not met**", None: "**not resolved** by this run"}[
        data["target_met"]
    ]
    return "\n".join(
        [
            f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']} "
            f"({commit_label(data)}), "
            f"{data['rounds']} rounds (ABBA), {data['wall_s']:.0f} s",
            "",
            "Cells: median samples/s (median ratio to bare, min–max over rounds). overhead = "
            "1 − median ratio, with a 90 % bootstrap interval over rounds; accounted = the "
            "instrumentation's own time inside the measured span (measuring-thread time plus the "
            "poller thread's CPU), which leaves out interference such as GIL hand-offs.",
            "",
            *_md(*_rows(data)),
            "",
            f"Target overhead ≤ {TARGET_OVERHEAD:.0%} (geometric mean): {verdict} "
            f"(direct {_overhead_cell(g['ratio'], g['ratio_ci90'])}; accounted "
            f"{g['accounted_overhead']:.1%}).",
            "",
            *_md(*_accounting_rows(data)),
            "",
            f"Machine: {machine_line(data['machine'])}; {_load(data['loadavg_1m'])}.",
            "",
        ]
    )


def _load(load: dict[str, float]) -> str:
    start, end = load["start"], load["end"]
    return f"1-minute load average {start:.1f} at the start, {end:.1f} at the end"


def write(data: dict[str, Any], stem: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(data))
