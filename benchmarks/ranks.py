"""Tuning the node, not the rank: 2 ranks on this machine's CPUs, each loading its own shard
(``DistributedSampler``), on a CPU-bound and a latency-bound pipeline. Per pipeline, four
answers to "how many workers per rank?":

* *coordinated*: ``feedrate tune TARGET --nproc-per-node 2`` (every trial measured with both
  ranks loading at once);
* *uncoordinated*: ``feedrate tune TARGET`` in one process alone, what each rank would pick for
  itself, then used by both ranks;
* *Lightning*: ``suggested_max_num_workers(local_world_size=2)``, the bound Lightning's
  ``_worker_check`` suggests (usable CPUs // ranks − 1, at least 1);
* *grid*: an exhaustive per-rank grid of ``num_workers`` (pf=2, persistent workers), whose best
  is the reference.

Every answer and every grid configuration is then measured side by side by a harness launched
with ``torch.distributed.run`` (2 ranks): after a barrier both ranks measure the same
configuration at once, ``feedrate.measure(loader, config, seconds=4)`` each on its shard, and
the job's figure is the slowest rank's samples/s × 2 (training steps in lockstep). The
configurations are measured in ``rounds`` rounds, the order rotating each round; figures are
medians over the rounds, a ratio is the median of the per-round ratios. Writes
``benchmarks/results/ranks/ranks.{json,md}`` (``ranks-quick.*`` with ``--quick``).

    python benchmarks/ranks.py --quick        # a smaller grid, 3 rounds: ~6 min on 2 CPUs
    python benchmarks/ranks.py                # the full grid, 5 rounds
    python benchmarks/ranks.py --render benchmarks/results/ranks/ranks.json
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
from pathlib import Path
from typing import Any

from common import commit_label, guarded, machine_line, provenance

import feedrate

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "ranks"
RANKS = 2
SECONDS = 4.0  # per measurement, per rank: long against a queue of 64 workers × pf 2
PIPELINES = {  # name: (TARGET, kind)
    "ranks-cpu": ("benchmarks/pipelines.py:ranks_cpu", "CPU-bound, 1 ms CPU per sample"),
    "ranks-latency": (
        "benchmarks/pipelines.py:ranks_latency",
        "latency-bound, 5 ms wait + 0.05 ms CPU per sample",
    ),
}
FEW = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
GRID = {"ranks-cpu": FEW, "ranks-latency": (*FEW, 48, 64, 96, 128)}
QUICK_GRID = {"ranks-cpu": (0, 1, 2, 4, 8), "ranks-latency": (2, 8, 16, 32, 64)}
CANDIDATES = ("coordinated", "uncoordinated", "lightning")


def grid_config(workers: int) -> dict[str, Any]:
    """The grid's configuration with ``workers`` workers per rank: pf=2, persistent."""
    if workers == 0:
        return feedrate.LoaderConfig().to_dict()
    return feedrate.LoaderConfig(workers, prefetch_factor=2, persistent_workers=True).to_dict()


def label(config: dict[str, Any]) -> str:
    return feedrate.LoaderConfig.from_dict(config).label()


def key(config: dict[str, Any]) -> str:
    """One name per distinct configuration (normalized, so w=0's pf does not matter)."""
    return json.dumps(
        feedrate.LoaderConfig.from_dict(config).normalized().to_dict(), sort_keys=True
    )


# --- the answers ---------------------------------------------------------------------------------


def tune_pick(target: str, ranks: int | None, tmp: Path) -> dict[str, Any]:
    """``feedrate tune TARGET`` (with ``--nproc-per-node ranks`` unless None) at its defaults,
    measured afresh: its pick, its own figure and the wall time the command took."""
    path = tmp / f"tune-{ranks or 1}.json"
    command = [str(Path(sys.executable).parent / "feedrate"), "tune", target, "--fresh"]
    command += ["--json", str(path)] + (["--nproc-per-node", str(ranks)] if ranks else [])
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    wall = time.monotonic() - began
    if done.returncode != 0 or not path.exists():
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    result = json.loads(path.read_text())
    best = result["best"]
    return {
        "command": " ".join(["feedrate", *command[1:]]),
        "config": best["config"],
        "tune_samples_per_s": best.get("samples_per_s"),
        "search_seconds": result.get("search_seconds"),
        "wall_seconds": wall,
        "tune_job_samples_per_s": result.get("job_samples_per_s"),
        "tune_rank_rates": best.get("rank_rates"),
        "findings": [f["id"] for f in result.get("findings", [])],
        "partial": result.get("partial", False),
    }


def lightning_pick(ranks: int) -> dict[str, Any]:
    """Lightning's suggestion for ``ranks`` local ranks, from its own function where installed.
    Its ``_worker_check`` only warns when that bound is above 1 and the loader has fewer than
    2 workers; the bound is what a user who follows it would set."""
    try:
        from lightning.fabric.utilities.data import suggested_max_num_workers
    except ImportError:  # the same rule, lightning 2.6's fabric/utilities/data.py
        workers = max(1, len(os.sched_getaffinity(0)) // ranks - 1)
        source = "the rule copied from lightning 2.6 (not installed)"
    else:
        workers = suggested_max_num_workers(ranks)
        source = "lightning.fabric.utilities.data.suggested_max_num_workers"
    return {"config": grid_config(workers), "source": source}


# --- the harness: both ranks measure each configuration at once ---------------------------------


def side_by_side(target: str, configs: list[dict[str, Any]], rounds: int, tmp: Path) -> Any:
    """Launch the harness on ``RANKS`` ranks; its record of every round."""
    spec, out = tmp / "spec.json", tmp / "rounds.json"
    spec.write_text(json.dumps({"target": target, "configs": configs, "rounds": rounds}))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(RANKS), __file__, "--harness", str(spec), str(out)]
    subprocess.run(command, check=True, cwd=REPO)
    return json.loads(out.read_text())


def harness(spec_path: str, out_path: str) -> None:
    """One rank of the harness (under torch.distributed.run): every round, each configuration
    in turn (rotated by one each round), measured by all ranks at once after a barrier; rank 0
    writes the per-rank figures and the job's (the slowest rank × ranks)."""
    import torch.distributed as dist

    from feedrate.distributed.channel import Channel
    from feedrate.loader.target import load_source

    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group("gloo")
    channel = Channel.open("benchmarks/ranks.py", 600.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    source, configs = load_source(spec["target"]), spec["configs"]
    rounds = []
    for r in range(spec["rounds"]):
        shift = r % len(configs)
        record = []
        for config in configs[shift:] + configs[:shift]:
            dist.barrier()
            rate, error = one_rank(source, config, channel)
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, (rate, error))
            rates = [g[0] for g in gathered]
            job = min(rates) * world if all(x is not None for x in rates) else None
            errors = [g[1] for g in gathered if g[1]]
            record.append({"config": config, "per_rank": rates, "job": job, "errors": errors})
            if rank == 0:
                print(f"round {r + 1}: {label(config)}: {job or 0:,.0f} samples/s", flush=True)
        rounds.append(record)
    if rank == 0:
        Path(out_path).write_text(json.dumps(rounds))
    channel.close()
    dist.destroy_process_group()


def one_rank(source: Any, config: dict[str, Any], channel: Any) -> tuple[float | None, str | None]:
    """This rank's samples/s on its shard, or None and why the measurement failed. Its windows
    open once every rank is warm (the gate tune's trials use), so each rank is timed while the
    others are in their steady state, not starting or stopping their workers."""
    gate = channel.gate()
    try:
        m = feedrate.measure(
            source,
            feedrate.LoaderConfig.from_dict(config),
            seconds=SECONDS,
            windows_count=4,
            device=None,
            steady=gate,
        )
    except Exception as exc:  # the other ranks still need this rank's figure
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        gate.arrive()
    return m.samples_per_s, None


# --- deciding what the rounds say ----------------------------------------------------------------


def median_or_none(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def figures(rounds: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per configuration (by ``key``): the job's samples/s of each round, their median, and the
    slower rank's share of the faster's (how evenly the ranks loaded)."""
    out: dict[str, dict[str, Any]] = {}
    for record in rounds:
        for m in record:
            f = out.setdefault(key(m["config"]), {"config": m["config"], "jobs": [], "errors": []})
            f["jobs"].append(m["job"])
            f["errors"] += m["errors"]
    for f in out.values():
        f["median"] = median_or_none(f["jobs"])
    return out


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """The median over rounds of ``a``'s job figure over ``b``'s in the same round."""
    pairs = [x / y for x, y in zip(a["jobs"], b["jobs"], strict=True) if x and y]
    return statistics.median(pairs) if pairs else None


def decide(pipeline: dict[str, Any], cpus: int) -> dict[str, Any]:
    """The grid's best, each answer's figure against it, and the targets' verdicts."""
    figs = figures(pipeline["rounds"])
    grid = [figs[key(grid_config(w))] for w in pipeline["grid"]]
    best = max((g for g in grid if g["median"] is not None), key=lambda g: g["median"])
    rows = {}
    for name in CANDIDATES:
        config = pipeline["answers"][name]["config"]
        f = figs[key(config)]
        workers = feedrate.LoaderConfig.from_dict(config).num_workers
        rows[name] = {
            "config": config,
            "job_samples_per_s": f["median"],
            "jobs": f["jobs"],
            "vs_grid_best": ratio(f, best),
            "oversubscribes": workers * RANKS > cpus,
        }
    coord, alone = (
        figs[key(rows["coordinated"]["config"])],
        figs[key(rows["uncoordinated"]["config"])],
    )
    same = coord is alone
    ahead = None if same else ratio(coord, alone)
    return {
        "grid_best": {"config": best["config"], "job_samples_per_s": best["median"]},
        "grid_figures": [
            {"config": g["config"], "job_samples_per_s": g["median"], "jobs": g["jobs"]}
            for g in grid
        ],
        "candidates": rows,
        "coordinated_vs_uncoordinated": ahead,
        "same_pick": same,
        "errors": sorted({e for f in figs.values() for e in f["errors"]}),
        "target_95": (rows["coordinated"]["vs_grid_best"] or 0) >= 0.95,
        "target_ahead": is_ahead(rows["uncoordinated"]["oversubscribes"], same, ahead),
    }


def is_ahead(oversubscribes: bool, same: bool, ratio: float | None) -> bool | None:
    """The second target: None where the uncoordinated pick does not oversubscribe (it does
    not apply); the same pick is a tie, not ahead."""
    if not oversubscribes:
        return None
    return not same and (ratio or 0.0) > 1.0


# --- running it all -----------------------------------------------------------------------------


def one_pipeline(name: str, grid: tuple[int, ...], rounds: int, tmp: Path) -> dict[str, Any]:
    """The answers for pipeline ``name``, then all of them and the grid in the same rounds."""
    target = PIPELINES[name][0]
    print(f"{name}: tuning with {RANKS} ranks, then alone", flush=True)
    answers = {
        "coordinated": tune_pick(target, RANKS, tmp),
        "uncoordinated": tune_pick(target, None, tmp),
        "lightning": lightning_pick(RANKS),
    }
    configs = {key(grid_config(w)): grid_config(w) for w in grid}
    for answer in answers.values():
        configs.setdefault(key(answer["config"]), answer["config"])
    for n, a in answers.items():
        print(f"{name}: {n} picks {label(a['config'])}", flush=True)
    began = time.monotonic()
    measured = side_by_side(target, list(configs.values()), rounds, tmp)
    return {
        "name": name,
        "target": target,
        "kind": PIPELINES[name][1],
        "grid": list(grid),
        "answers": answers,
        "rounds": measured,
        "side_by_side_seconds": time.monotonic() - began,
    }


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    facts = feedrate.machine_facts().to_dict()
    doc: dict[str, Any] = {
        "schema": "feedrate.bench.ranks/1",
        "command": "python benchmarks/ranks.py " + " ".join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        **provenance(),
        "machine": facts,
        "machine_line": machine_line(facts),
        "quick": args.quick,
        "ranks": RANKS,
        "rounds": args.rounds,
        "seconds_per_measurement": SECONDS,
        "load": [os.getloadavg()[0]],
        "pipelines": [],
    }
    grids = QUICK_GRID if args.quick else GRID
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.pipelines.split(","):
            pipeline = one_pipeline(name, grids[name], args.rounds, Path(tmp))
            pipeline.update(decide(pipeline, facts["cpus_usable"]))
            doc["pipelines"].append(pipeline)
            doc["load"].append(os.getloadavg()[0])
            doc["wall_seconds"] = time.monotonic() - began
            write(doc, args.out)
    return doc


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("ranks-quick" if doc["quick"] else "ranks")
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    stem.with_suffix(".md").write_text(report(doc))


# --- rendering ----------------------------------------------------------------------------------


def cell(row: dict[str, Any]) -> str:
    job, r = row["job_samples_per_s"], row["vs_grid_best"]
    return f"{label(row['config'])}: {job or 0:,.0f} ({r or 0:.2f})"


def verdicts(p: dict[str, Any]) -> list[str]:
    """The targets' lines for pipeline ``p``, as measured."""
    coord = p["candidates"]["coordinated"]
    lines = [
        f"* {p['name']}: coordinated ≥ 0.95 of the grid best: "
        f"**{'met' if p['target_95'] else 'missed'}** ({coord['vs_grid_best'] or 0:.2f})"
    ]
    alone = p["candidates"]["uncoordinated"]
    if not alone["oversubscribes"]:
        ahead = "not applicable: uncoordinated does not oversubscribe"
    elif p["same_pick"]:
        ahead = "**not met**: both picked the same configuration (a tie)"
    else:
        verdict = "met" if p["target_ahead"] else "not met"
        ahead = (
            f"**{verdict}** (coordinated / uncoordinated {p['coordinated_vs_uncoordinated']:.2f})"
        )
    lines.append(f"* {p['name']}: coordinated ahead where uncoordinated oversubscribes: {ahead}")
    return lines


def report(doc: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.1f}" for x in doc["load"])
    lines = [
        "# The node as the unit of tuning: 2 ranks on this machine",
        "",
        f"`{doc['command']}` — {doc['date']}, feedrate {doc['feedrate_version']}, "
        f"commit {commit_label(doc)}, {doc.get('wall_seconds', 0) / 60:.1f} min.",
        "",
        f"Machine: {doc['machine_line']}. Load average {load} (at the start and after each "
        "pipeline).",
        "",
        f"Each cell: the job's samples/s (the slowest of {doc['ranks']} ranks × "
        f"{doc['ranks']}, both ranks measuring at once, {doc['seconds_per_measurement']:g} s "
        f"each), median of {doc['rounds']} rounds, and in brackets the median per-round ratio "
        "to the grid's best. Configurations are per rank; * = workers × ranks > usable CPUs.",
        "",
        "| pipeline | grid best | coordinated | uncoordinated | Lightning |",
        "|---|---|---|---|---|",
    ]
    for p in doc["pipelines"]:
        best = p["grid_best"]
        cells = [
            cell(p["candidates"][n]) + (" *" if p["candidates"][n]["oversubscribes"] else "")
            for n in CANDIDATES
        ]
        lines.append(
            f"| {p['name']} ({p['kind']}) | {label(best['config'])}: "
            f"{best['job_samples_per_s']:,.0f} | " + " | ".join(cells) + " |"
        )
    lines += ["", "Targets:", ""]
    for p in doc["pipelines"]:
        lines += verdicts(p)
    lines += ["", "The grid (job samples/s, median over rounds):", ""]
    for p in doc["pipelines"]:
        grid = ", ".join(
            f"{label(g['config'])} {g['job_samples_per_s'] or 0:,.0f}" for g in p["grid_figures"]
        )
        lines.append(f"* {p['name']}: {grid}")
    lines += ["", "The tunes (their own figures):", ""]
    for p in doc["pipelines"]:
        for n in ("coordinated", "uncoordinated"):
            a = p["answers"][n]
            own = a.get("tune_job_samples_per_s") or a.get("tune_samples_per_s") or 0
            lines.append(
                f"* {p['name']}, {n}: `{a['command']}` → {label(a['config'])}, "
                f"{own:,.0f} samples/s, search {a['search_seconds'] or 0:.0f} s, "
                f"command {a['wall_seconds']:.0f} s"
            )
    errors = [(p["name"], e) for p in doc["pipelines"] for e in p.get("errors", [])]
    if errors:
        lines += ["", "Measurements that failed:", ""]
        lines += [f"* {n}: {e}" for n, e in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--harness"]:
        harness(argv[1], argv[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller grid, 3 rounds")
    parser.add_argument("--rounds", type=int, help="rounds of side-by-side measurement")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", type=Path, help="print the report of a results file")
    args = parser.parse_args(argv)
    if args.render:
        print(report(json.loads(args.render.read_text())), end="")
        return 0
    args.rounds = args.rounds or (3 if args.quick else 5)
    unknown = set(args.pipelines.split(",")) - set(PIPELINES)
    if unknown:
        parser.error(f"unknown pipelines {sorted(unknown)}; known: {','.join(PIPELINES)}")
    return guarded(lambda: run(args, argv), args.out, report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
