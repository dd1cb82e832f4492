"""feedrate against what users do today: the exhaustive grid, the folklore rules and the other
tuners on PyPI, on the benchmark pipelines, measured in one run with one method.

For each pipeline:

1. the grid: every ``num_workers`` × ``prefetch_factor`` × ``persistent_workers`` of
   ``tune_vs_grid.py`` (``--quick``: num_workers 0, 1, 2, 4, 8, 16, 32, 64 at pf=2, persistent),
   each measured like a tune trial; its best configuration and its wall time;
2. the rules: PyTorch's default (``num_workers=0``), "as many workers as CPUs", Lightning's
   suggestion (usable CPUs − 1), "4 workers per GPU" (4 × GPUs; on a machine without a GPU, 4,
   one device's worth);
3. the tuners: ``loadtune`` 0.3.0 and ``dataloader-param-helper`` 0.1.1, each run the way its
   documentation says (``peers/run_peer.py``, in their own environment, ``.venv-peers``, made on
   first use with the same pinned CPU torch), and ``feedrate.tune`` and ``feedrate.autotune``
   (iterated by a loop that does nothing, for up to ``AUTOTUNE_EPOCHS`` epochs): the
   configuration each picks and its tuning time, or the exact reason it could not run;
4. every distinct configuration picked, and the grid's best, measured again in ``--rounds``
   rounds whose order rotates each round, so a drifting machine touches every method alike: each
   method's ratio to the grid best is the median of its per-round ratios, with their range.

    python benchmarks/compare.py                  # all 8 pipelines, full grid: hours on 2 cores
    python benchmarks/compare.py --pipelines sharded,skewed --merge   # some again, keep the rest
    python benchmarks/compare.py --quick          # images, remote, tabular; small grid (~10 min)
    python benchmarks/compare.py --render benchmarks/results/compare.json

Results: ``benchmarks/results/compare.{json,md,png}`` (``--quick``: ``compare-quick.*``), written
after every pipeline. Each pipeline is measured in one run (its grid, every method, and the
interleaved rounds together); ``--merge`` keeps the earlier run's other pipelines, each marked
with the date and commit it was measured at, so the full suite can be measured in parts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import commit_label, earlier_records, guarded, machine_line, provenance
from torch.utils.data import DataLoader
from tune_vs_grid import FULL_PREFETCH, FULL_WORKERS, grid_configs, measure_one

import feedrate
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import MachineFacts, collect

from pipelines import BY_NAME, PIPELINES

SCHEMA = "feedrate.bench.compare/1"
QUICK_WORKERS, QUICK_PIPELINES = (0, 1, 2, 4, 8, 16, 32, 64), ("images", "remote", "tabular")
ROUNDS, QUICK_ROUNDS = 3, 1
AUTOTUNE_EPOCHS = 4
PEERS = ("loadtune", "dataloader-param-helper")
HERE = Path(__file__).resolve().parent
PEERS_ENV = HERE.parent / ".venv-peers"
PEERS_PINS = (
    "torch==2.13.0",  # the CPU build feedrate pins: never a second (CUDA) torch
    "loadtune==0.3.0",
    "dataloader-param-helper==0.1.1",
    "py-cpuinfo==9.0.0",  # dataloader-param-helper imports it without declaring it
    "numpy",
    "pillow",
    "psutil",
)


def peers_python() -> Path:
    """The peers' environment's python, made (once) with the pinned packages."""
    python = PEERS_ENV / "bin" / "python"
    if not python.exists():
        print(f"making the peers' environment in {PEERS_ENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_ENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, PEERS_PINS[0]], check=True)
        subprocess.run([*pip, *PEERS_PINS[1:]], check=True)
    return python


def rules(facts: MachineFacts) -> dict[str, tuple[LoaderConfig, str]]:
    cpus, gpus = facts.cpus_usable, facts.accelerator_count
    per_gpu = 4 * gpus if gpus else 4
    return {
        "pytorch default": (LoaderConfig(0), "num_workers=0"),
        "workers = CPUs": (_cfg(cpus), f"{cpus} usable CPUs"),
        "Lightning (CPUs − 1)": (_cfg(max(0, cpus - 1)), f"{cpus} − 1"),
        "4 per GPU": (
            _cfg(per_gpu),
            f"4 × {gpus} GPUs" if gpus else "no GPU here: 4, one device's worth",
        ),
    }


def _cfg(w: int) -> LoaderConfig:
    return LoaderConfig(w, prefetch_factor=2 if w else None, persistent_workers=w > 0)


def run_peer(peer: str, pipeline: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "peer.json"
        cmd = [
            str(peers_python()),
            str(HERE / "peers" / "run_peer.py"),
            "--peer",
            peer,
            "--pipeline",
            pipeline,
            "--json",
            str(out),
            "--quiet",
        ]
        began = time.perf_counter()
        env = {**os.environ, "FEEDRATE_PEER_CPUS": str(collect().cpus_usable)}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        wall = time.perf_counter() - began
        try:
            result: dict[str, Any] = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = (proc.stderr or proc.stdout)[-300:]
            return {"ok": False, "reason": f"run_peer.py exited {proc.returncode}: {tail}"}
    result["wall_s"] = wall
    if result.get("ok") and result.get("config"):
        c = result["config"]
        w = int(c.get("num_workers") or 0)
        result["feedrate_config"] = LoaderConfig(
            w,
            pin_memory=bool(c.get("pin_memory")),
            prefetch_factor=c.get("prefetch_factor") or None,
            persistent_workers=bool(c.get("persistent_workers")),
        ).to_dict()
    return result


def run_autotune(loader: DataLoader[Any]) -> dict[str, Any]:
    began = time.perf_counter()
    auto = feedrate.autotune(loader, cache=False)
    settled_after, epochs = None, 0
    try:
        while epochs < AUTOTUNE_EPOCHS:
            for _ in auto:
                pass
            epochs += 1
            if auto.report().settled:
                settled_after = time.perf_counter() - began
                break
        report = auto.report()
    finally:
        auto.close()
    return {
        "config": report.config.to_dict(),
        "settled": report.settled,
        "epochs": epochs,
        "wall_s": settled_after if settled_after is not None else time.perf_counter() - began,
        "report": report.to_dict(),
    }


def bench(name: str, quick: bool, rounds: int, facts: MachineFacts) -> dict[str, Any]:
    p = BY_NAME[name]
    loader = p.factory()
    workers = QUICK_WORKERS if quick else FULL_WORKERS
    configs = [_cfg(w) for w in workers] if quick else grid_configs(FULL_WORKERS, FULL_PREFETCH)
    began = time.perf_counter()
    grid = []
    for cfg in configs:
        trial, wall = measure_one(loader, cfg, facts)
        grid.append(
            {
                "label": cfg.label(),
                "config": cfg.to_dict(),
                "median": trial.median,
                "error": trial.error,
                "wall_s": wall,
            }
        )
        print(f"{name:<9} grid {cfg.label():<24} {trial.median:>10,.0f}", flush=True)
    grid_wall = time.perf_counter() - began
    best = max((g for g in grid if not g["error"]), key=lambda g: g["median"])
    picks: dict[str, dict[str, Any]] = {}
    for method, (cfg, why) in rules(facts).items():
        picks[method] = {"config": cfg.to_dict(), "why": why, "wall_s": 0.0, "ok": True}
    for peer in PEERS:
        r = run_peer(peer, name)
        picks[peer] = {
            "config": r.get("feedrate_config"),
            "ok": bool(r.get("ok")) and r.get("feedrate_config") is not None,
            "why": r.get("reason") or r.get("how"),
            "wall_s": r.get("tuning_wall_s") or r.get("wall_s"),
            "raw": r,
        }
        print(f"{name:<9} {peer}: {picks[peer]['config'] or picks[peer]['why']}", flush=True)
    t0 = time.perf_counter()
    tuned = feedrate.tune(p.factory, use_cache=False)
    picks["feedrate tune"] = {
        "config": tuned.best.config.to_dict(),
        "ok": True,
        "why": tuned.reason,
        "wall_s": time.perf_counter() - t0,
    }
    auto = run_autotune(p.factory())
    picks["feedrate autotune"] = {
        "config": auto["config"],
        "ok": auto["settled"],
        "why": f"settled after {auto['epochs']} epochs of a loop that does nothing"
        if auto["settled"]
        else f"not settled within {AUTOTUNE_EPOCHS} epochs",
        "wall_s": auto["wall_s"],
        "report": auto["report"],
    }
    if not auto["settled"]:
        picks["feedrate autotune"]["ok"] = True  # its configuration in use is still measured
    for method in ("feedrate tune", "feedrate autotune"):
        print(f"{name:<9} {method}: {LoaderConfig.from_dict(picks[method]['config']).label()}")
    remeasure(loader, best, picks, rounds, facts, name)
    return {
        "name": name,
        "kind": p.kind,
        "grid": grid,
        "grid_wall_s": grid_wall,
        "grid_best": best,
        "methods": picks,
    }


def remeasure(
    loader: DataLoader[Any],
    best: dict[str, Any],
    picks: dict[str, dict[str, Any]],
    rounds: int,
    facts: MachineFacts,
    name: str,
) -> None:
    """Every distinct configuration picked and the grid best, in rotating order per round."""
    best_cfg = LoaderConfig.from_dict(best["config"])
    distinct = [best_cfg]
    for pick in picks.values():
        if pick["ok"] and pick["config"]:
            cfg = LoaderConfig.from_dict(pick["config"])
            if cfg not in distinct:
                distinct.append(cfg)
    rates: dict[LoaderConfig, list[float]] = {c: [] for c in distinct}
    per_round: list[dict[LoaderConfig, float]] = []
    for r in range(rounds):
        shift = r % len(distinct)
        order = distinct[shift:] + distinct[:shift]
        got = {}
        for cfg in order:
            trial, _ = measure_one(loader, cfg, facts)
            got[cfg] = trial.median
            rates[cfg].append(trial.median)
        per_round.append(got)
        print(
            f"{name:<9} round {r + 1}: "
            + ", ".join(f"{c.label()} {v:,.0f}" for c, v in got.items()),
            flush=True,
        )
    for pick in picks.values():
        if not (pick["ok"] and pick["config"]):
            continue
        cfg = LoaderConfig.from_dict(pick["config"])
        ratios = [g[cfg] / g[best_cfg] for g in per_round if g[best_cfg] > 0]
        pick["samples_per_s"] = statistics.median(rates[cfg])
        pick["ratio"] = statistics.median(ratios) if ratios else None
        pick["ratio_range"] = [min(ratios), max(ratios)] if ratios else None
    best["remeasured"] = statistics.median(rates[best_cfg])


# --- report -------------------------------------------------------------------------------------


def _cell(pick: dict[str, Any]) -> str:
    if not pick["ok"] or not pick.get("config"):
        return f"could not run: {str(pick.get('why'))[:80]}"
    label = LoaderConfig.from_dict(pick["config"]).label()
    ratio = pick.get("ratio")
    lo, hi = pick.get("ratio_range") or (ratio, ratio)
    spread = f" ({lo:.2f}–{hi:.2f})" if ratio is not None and hi != lo else ""
    t = pick.get("wall_s") or 0.0
    timing = f", {t:.0f} s" if t else ""
    return f"{label}: **{ratio:.2f}**{spread}{timing}" if ratio is not None else label


def _overall(pipelines: list[dict[str, Any]], method: str) -> str:
    """A method over the pipelines it ran on: the geometric mean of its ratios, and the worst."""
    ratios = [p["methods"][method].get("ratio") for p in pipelines]
    ran = [r for r in ratios if r is not None and r > 0]
    if not ran:
        return "ran on none"
    some = f" ({len(ran)} of {len(ratios)})" if len(ran) < len(ratios) else ""
    return f"**{statistics.geometric_mean(ran):.2f}**, worst {min(ran):.2f}{some}"


def stem(quick: bool) -> str:
    return "compare-quick" if quick else "compare"


def _in_suite_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {p.name: i for i, p in enumerate(PIPELINES)}
    return sorted(records, key=lambda r: order.get(r["name"], len(order)))


def markdown(data: dict[str, Any]) -> str:
    methods = list(data["pipelines"][0]["methods"]) if data["pipelines"] else []
    merged = [p for p in data["pipelines"] if p.get("run")]
    out = [
        f"# feedrate against the grid, the rules and the other tuners"
        f"{' (--quick)' if data['quick'] else ''}",
        "",
        f"`{data['command']}` — {data['date']}, feedrate {data['feedrate_version']} "
        f"(commit {commit_label(data)}), "
        f"{data.get('wall_s', 0) / 60:.0f} min, {data['rounds']} interleaved round(s).",
        "",
        f"Machine: {machine_line(data['machine'])}.",
        "",
        *(
            [
                "Kept from earlier runs (`--merge`): "
                + "; ".join(
                    f"{p['name']} ({p['run']['date']}, commit {commit_label(p['run'])})"
                    for p in merged
                )
                + ".",
                "",
            ]
            if merged
            else []
        ),
        "Each cell: the configuration picked, **its samples/s over the grid best's** measured in "
        "the same rounds (median, range over rounds), and the tuning time.",
        "",
        "| pipeline | grid best (grid time) | " + " | ".join(methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for p in data["pipelines"]:
        gb = p["grid_best"]
        cells = [_cell(p["methods"][m]) for m in methods]
        out.append(
            f"| {p['name']} ({p['kind']}) | {gb['label']}: "
            f"{gb.get('remeasured', gb['median']):,.0f} ({p['grid_wall_s']:.0f} s) | "
            + " | ".join(cells)
            + " |"
        )
    if len(data["pipelines"]) > 1:
        grid_min = sum(p["grid_wall_s"] for p in data["pipelines"]) / 60
        out.append(
            f"| **all**: geometric mean, worst | ({grid_min:.0f} min) | "
            + " | ".join(_overall(data["pipelines"], m) for m in methods)
            + " |"
        )
    out += ["", "Why each could not run, where it could not:", ""]
    for p in data["pipelines"]:
        for m, pick in p["methods"].items():
            if not pick["ok"]:
                out.append(f"* {p['name']}, {m}: {pick.get('why')}")
    return "\n".join(out) + "\n"


def chart(data: dict[str, Any], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ps = data["pipelines"]
    if not ps:
        return
    methods = list(ps[0]["methods"])
    fig = Figure(figsize=(11, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        xs, ys, errs, failed = [], [], [], []
        for j, p in enumerate(ps):
            pick = p["methods"][m]
            if pick.get("ratio") is None:
                failed.append(j + i * width)
                continue
            lo, hi = pick.get("ratio_range") or (pick["ratio"], pick["ratio"])
            xs.append(j + i * width)
            ys.append(pick["ratio"])
            errs.append((pick["ratio"] - lo, hi - pick["ratio"]))
        if xs:
            bars = list(zip(*errs, strict=True))
            ax.bar(xs, ys, width, color=f"C{i}", label=m, yerr=bars, capsize=2)
        if failed:  # an empty slot would read as "not measured": mark "could not run"
            label = f"{m}: × could not run" if not xs else "_nolegend_"
            ax.plot(failed, [0.03] * len(failed), "x", color=f"C{i}", ms=7, mew=2, label=label)
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ps))], [p["name"] for p in ps])
    ax.set_ylabel("samples/s ÷ grid best (median of rounds)")
    ax.set_title("Each method's pick against the exhaustive grid's best", fontsize=10)
    fig.legend(loc="outside lower center", fontsize=7, ncols=5)
    fig.savefig(path, dpi=110)


def write(data: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = stem(data["quick"])
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    (out / f"{name}.md").write_text(markdown(data))
    chart(data, out / f"{name}.png")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 pipelines, small grid, 1 round")
    ap.add_argument("--pipelines", help="comma-separated (default: all, or 3 with --quick)")
    ap.add_argument("--rounds", type=int, help=f"rounds (default {ROUNDS}, quick {QUICK_ROUNDS})")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    ap.add_argument("--render", metavar="JSON", help="render a saved run again, no measuring")
    ap.add_argument(
        "--merge", action="store_true", help="keep the other pipelines of the earlier results"
    )
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        write(data, args.out)
        print(markdown(data))
        return 0
    default = QUICK_PIPELINES if args.quick else [p.name for p in PIPELINES]
    names = args.pipelines.split(",") if args.pipelines else list(default)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown pipelines {unknown}; known: {','.join(BY_NAME)}")
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    began = time.perf_counter()
    facts = collect()
    print(f"machine: {machine_line(facts.to_dict())}", flush=True)
    peers_python()
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", "benchmarks/compare.py", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "quick": args.quick,
        "rounds": rounds,
        "machine": facts.to_dict(),
        "pipelines": [],
    }

    earlier = args.out / f"{stem(args.quick)}.json"
    kept = earlier_records(earlier, names, args.quick)[0] if args.merge else []

    def run() -> dict[str, Any]:
        done: list[dict[str, Any]] = []
        for name in names:
            done.append(bench(name, args.quick, rounds, facts))
            data["pipelines"] = _in_suite_order(kept + done)
            data["wall_s"] = time.perf_counter() - began
            write(data, args.out)
        return data

    return guarded(run, args.out, markdown)


if __name__ == "__main__":
    sys.exit(main())
