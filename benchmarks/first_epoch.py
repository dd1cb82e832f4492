"""autotune's first epoch against a static loader's, repeated: the figure issue 17 judges
autotune by, which one run of ``benchmarks/autotune.py`` measures once.

Each repetition runs in a fresh process: one epoch of the static configuration, then autotune's
first epoch (it starts with nothing cached), with the simulated consumer of
``benchmarks/autotune.py`` (a sleep of samples / R per batch, its R and its 12 s epoch). With
``--against REV`` the same repetitions run, alternating, on feedrate at git revision REV (a
temporary worktree of this checkout), so a change is measured before and after in one run.
Where autotune falls behind is kept too: at each of its events (a switch, a settle) and at the
epoch's end, how many seconds its epoch is behind the static one at the same batch.

    python benchmarks/first_epoch.py --pipeline large --static-workers 0 --reps 5
    python benchmarks/first_epoch.py --pipeline large --static-workers 0 --against a97c393

Writes ``first-epoch-PIPELINE.{json,md}`` under ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import git, machine_line, provenance

from feedrate.measuring import interrupts

SCHEMA = "feedrate.bench.first_epoch/1"
HERE = Path(__file__).resolve().parent


def arm(name: str, workers: int) -> dict[str, Any]:
    """One repetition in this process: a static epoch, then autotune's first."""
    from autotune import EPOCH_S, consumer_rate, long_epoch, sample_counter

    import feedrate
    from feedrate.loader.config import LoaderConfig
    from feedrate.loader.rebuild import rebuild
    from feedrate.machine.facts import collect

    from pipelines import BY_NAME

    base = BY_NAME[name].factory()
    rate, _ = consumer_rate(name, base, collect().cpus_usable)
    loader = long_epoch(base, rate, EPOCH_S)
    count = sample_counter(loader)

    def epoch(it: Any) -> tuple[float, list[float]]:
        began, got = time.perf_counter(), []
        for batch in it:
            got.append(time.perf_counter() - began)
            time.sleep(count(batch) / rate)
        return time.perf_counter() - began, got

    cfg = LoaderConfig(workers, prefetch_factor=2 if workers else None, persistent_workers=True)
    static, static_at = epoch(rebuild(loader, cfg))
    auto = feedrate.autotune(loader, cache=False)
    try:
        first, first_at = epoch(auto)
        report = auto.report()
    finally:
        auto.close()
    events = [(e.batch, e.what) for e in report.events if e.epoch == 1]
    marks = sorted({b for b, _ in events if b < len(static_at)} | {len(static_at) - 1})
    behind = [(b, first_at[b] - static_at[b]) for b in marks if b < len(first_at)]
    return {
        "events": events,
        "behind_s": behind,
        "static_s": static,
        "autotune_s": first,
        "ratio": first / static,
        "trials": [t.config.num_workers for t in report.trials],
        "settled_on": report.config.label(),
        "retunes": report.retunes,
        "feedrate": str(Path(feedrate.__file__).parent),
    }


def worktree(rev: str, into: Path) -> Path:
    """A checkout of ``rev`` of this repository at ``into``; its ``src``."""
    repo = str(HERE.parent)
    subprocess.run(
        ["git", "-C", repo, "worktree", "add", "-q", "--detach", str(into), rev], check=True
    )
    return into / "src"


def head_label() -> str:
    """This checkout's commit (short), marked where src/ has changes not committed."""
    repo = str(HERE.parent)
    sha = git("-C", repo, "rev-parse", "--short", "HEAD") or "HEAD"
    return sha + (" + changes" if git("-C", repo, "status", "--porcelain", "src") else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default="large")
    ap.add_argument("--static-workers", type=int, default=0, help="the static configuration")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--against", metavar="REV", help="also run feedrate at this git revision")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:  # a child: one repetition, its result on stdout
        print(json.dumps(arm(args.pipeline, args.static_workers)), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        head = head_label()
        arms = {head: HERE.parent / "src"}
        if args.against:
            label = f"{args.against} (before)" if args.against in head else args.against
            arms = {label: worktree(args.against, Path(tmp) / "before"), **arms}
        runs: list[dict[str, Any]] = []
        try:
            with interrupts.stoppable(sigterm=True):  # SIGTERM as Ctrl-C: the worktree goes
                repetitions(args, arms, runs)
        except KeyboardInterrupt:
            print("interrupted: the report covers the repetitions done", flush=True)
        finally:
            if args.against:
                where = str(Path(tmp) / "before")
                subprocess.run(
                    ["git", "-C", str(HERE.parent), "worktree", "remove", "--force", where]
                )
    if runs:
        report(args, runs)


def repetitions(
    args: argparse.Namespace, arms: dict[str, Path], runs: list[dict[str, Any]]
) -> None:
    """The repetitions, alternating the arms' order, appended to ``runs`` as they end; one that
    fails is reported (its error output) and left out."""
    for r in range(args.reps):
        for label, src in arms.items() if r % 2 == 0 else reversed(arms.items()):
            cmd = [sys.executable, __file__, "--arm", "--pipeline", args.pipeline]
            cmd += ["--static-workers", str(args.static_workers)]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
            try:
                stdout = run_arm(cmd, env)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                print(f"rep {r} {label}: failed\n{exc.stderr or exc}", flush=True)
                continue
            run = json.loads(stdout.strip().splitlines()[-1]) | {"arm": label, "rep": r}
            runs.append(run)
            print(
                f"rep {r} {label:>8}: static {run['static_s']:.2f} s, autotune "
                f"{run['autotune_s']:.2f} s ({run['ratio']:.3f}), trials {run['trials']}, "
                f"feedrate from {run['feedrate']}",
                flush=True,
            )


def run_arm(cmd: list[str], env: dict[str, str], timeout_s: float = 600.0) -> str:
    """One repetition's stdout. It runs in a process group of its own: past ``timeout_s``, or
    on Ctrl-C here, the whole group is killed, its DataLoader workers with it."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
    return stdout


def report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    from feedrate.machine.facts import collect

    machine = collect().to_dict()
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    medians = {a: statistics.median(r["ratio"] for r in runs if r["arm"] == a) for a in arms}
    doc = {
        "schema": SCHEMA,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/first_epoch.py", *sys.argv[1:]]),
        "machine": machine,
        **provenance(),
        "against": args.against and git("-C", str(HERE.parent), "rev-parse", args.against),
        "pipeline": args.pipeline,
        "static_workers": args.static_workers,
        "runs": runs,
        "median_ratio": medians,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"first-epoch-{args.pipeline}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# autotune's first epoch on {args.pipeline}",
        "",
        f"`{doc['command']}`, {doc['when']}, {machine_line(machine)}.",
        "",
        f"Each repetition a fresh process: a static epoch (w={args.static_workers}), then "
        "autotune's first epoch; ratio = autotune / static (issue 17's speed share is 1 / ratio).",
        "",
        "| feedrate | ratios, in order | median | speed share | trials (workers) |",
        "|---|---|---|---|---|",
    ]
    behind = [
        "",
        "Seconds autotune's epoch was behind the static one at its events' batches:",
        "",
    ]
    for a in arms:
        mine = [r for r in runs if r["arm"] == a]
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in mine)
        trials = "; ".join(str(r["trials"]) for r in mine)
        lines.append(f"| {a} | {ratios} | {medians[a]:.3f} | {1 / medians[a]:.3f} | {trials} |")
        for r in mine:
            what = dict(r.get("events", []))
            seen = ", ".join(
                f"{b}: {s:+.2f}" + (f" ({what[b]})" if b in what else " (the end)")
                for b, s in r.get("behind_s", [])
            )
            behind.append(f"* {a}, rep {r['rep']}: {seen}")
    lines += behind if len(behind) > 3 else []
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
