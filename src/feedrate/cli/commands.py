"""The ``feedrate`` commands: each parses its options, calls the library, prints.

Exit status: 0 success, 2 a user mistake (bad target or option), 3 the pipeline failed while
measured (``doctor`` prints its report first), 130 interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from feedrate import __version__
from feedrate.cli.options import (
    POSITIVE,
    consumer_options,
    device_option,
    file_option,
    target_arguments,
)
from feedrate.cli.output import (
    TuneProgress,
    check_outputs,
    doctor_progress,
    err,
    human,
    load,
    out,
    show_saved,
    show_tune,
    shown_target,
    write_json,
)
from feedrate.cli.ranks import ARGV, rank_options
from feedrate.errors import PipelineError, UserError
from feedrate.units import parse_size, parse_sizes


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="feedrate")
def cli() -> None:
    """Find the DataLoader settings that make a PyTorch data pipeline keep up on this machine.

    TARGET is path/to/file.py:NAME or package.module:NAME, where NAME is a DataLoader or a
    zero-argument callable returning one.
    """


@cli.command()
@file_option("--json", "json_path", "Also write the facts as JSON to this file.")
def env(json_path: Path | None) -> None:
    """Show the machine facts that decide DataLoader settings."""
    from feedrate.machine import facts as machine
    from feedrate.render import console as render

    check_outputs(None, json=json_path)
    facts = machine.collect()
    human(json_path).print(render.machine_table(facts))
    if json_path is not None:
        write_json(json_path, {"schema": "feedrate.env/1", "machine": facts.to_dict()})


@cli.command()
@target_arguments
@click.option(
    "-w",
    "--num-workers",
    type=click.IntRange(min=0),
    help="Worker processes (default: the loader's own setting).",
)
@click.option(
    "--pin-memory/--no-pin-memory",
    default=None,
    help="Pin batches in page-locked memory (default: the loader's own setting).",
)
@click.option(
    "--prefetch-factor",
    type=click.IntRange(min=1),
    help="Batches each worker prepares ahead (default: the loader's own, or 2).",
)
@click.option(
    "--persistent-workers/--no-persistent-workers",
    default=None,
    help="Keep workers alive between epochs (default: the loader's own setting).",
)
@click.option(
    "--batches", type=click.IntRange(min=1), help="Measure this many steady-state batches."
)
@click.option(
    "--seconds",
    type=POSITIVE,
    help="Measure this many seconds of steady state (default 10); the whole run, start-up and "
    "epoch restarts included, stops by twice that, or that past the start-up if longer.",
)
@click.option(
    "--windows",
    "windows_count",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Windows the steady state is split into, for the spread.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=POSITIVE,
    default=60.0,
    show_default=True,
    help="Give up when no batch arrives for this many seconds.",
)
@file_option("--json", "json_path", "Also write it as JSON (schema feedrate.measure/1).")
@device_option
@rank_options(shard=True)
def measure(
    target: str,
    script_args: tuple[str, ...],
    num_workers: int | None,
    pin_memory: bool | None,
    prefetch_factor: int | None,
    persistent_workers: bool | None,
    batches: int | None,
    seconds: float | None,
    windows_count: int,
    timeout_s: float,
    json_path: Path | None,
    device: str,
    shard: bool,
) -> None:
    """Measure one configuration of TARGET's DataLoader: start-up, steady-state samples/s with
    its spread, CPU and memory of every process. Under torchrun or --nproc-per-node, all ranks
    measure it at once (each on its shard given a DistributedSampler or --shard): the slowest's."""
    from feedrate.loader.config import LoaderConfig
    from feedrate.loader.rebuild import config_of, loader_of
    from feedrate.render import console as render
    from feedrate.workflows.measure_node import measure_job

    check_outputs(target, json=json_path)
    loader = load(target, script_args, ARGV)
    target = shown_target(target, script_args)
    own = config_of(loader_of(loader))
    workers = own.num_workers if num_workers is None else num_workers
    if workers == 0 and (persistent_workers or prefetch_factor):  # DataLoader ignores them
        raise UserError("--persistent-workers and --prefetch-factor need workers (-w 1 or more)")
    config = LoaderConfig(
        num_workers=workers,
        pin_memory=own.pin_memory if pin_memory is None else pin_memory,
        prefetch_factor=prefetch_factor or own.prefetch_factor,
        persistent_workers=own.persistent_workers
        if persistent_workers is None
        else persistent_workers,
    ).normalized()
    with err.status(f"measuring {target} ({config.label()}) …", spinner="dots"):
        result = measure_job(
            loader,
            config,
            shard=shard,
            batches=batches,
            seconds=seconds,
            windows_count=windows_count,
            timeout_s=timeout_s,
            target=target,
            device=device,
        )
    human(json_path).print(render.measurement(result))
    if json_path is not None:
        write_json(json_path, result.to_dict())


_BUDGET_HELP = "Seconds the search may take, start-up included (the checks after it add a few)."


@cli.command()
@target_arguments
@consumer_options
@click.option("--budget-s", type=POSITIVE, default=60.0, show_default=True, help=_BUDGET_HELP)
@click.option(
    "--timeout",
    "timeout_s",
    type=POSITIVE,
    default=60.0,
    show_default=True,
    help="Stop a trial as hung when no batch arrives for this many seconds (or for what is "
    "left of the budget, if less).",
)
@click.option("--max-workers", type=click.IntRange(min=0), help="Never try more workers.")
@click.option(
    "--memory-limit",
    metavar="SIZE",
    help="Memory the workers may use, e.g. 8G (default: half of what is available).",
)
@click.option(
    "--allow-reorder", is_flag=True, help="Allow in_order=False (batches in completion order)."
)
@click.option(
    "--threads",
    "allow_threads",
    is_flag=True,
    help="Allow recommending threads inside workers (feedrate.threaded): needs a thread-safe "
    "__getitem__, which a check tests first.",
)
@click.option("--fresh", is_flag=True, help="Measure again even if a cached result exists.")
@file_option("--json", "json_path", "Write the result as JSON (schema feedrate.tune/1).")
@file_option("--plot", "plot_path", "Write a PNG plot of samples/s against num_workers.")
@file_option("--html", "html_path", "Write a self-contained HTML report.")
@device_option
@rank_options(shard=True)
def tune(
    target: str,
    script_args: tuple[str, ...],
    rate: float | None,
    step_time: float | None,
    step_spec: str | None,
    budget_s: float,
    timeout_s: float,
    max_workers: int | None,
    memory_limit: str | None,
    allow_reorder: bool,
    allow_threads: bool,
    fresh: bool,
    json_path: Path | None,
    plot_path: Path | None,
    html_path: Path | None,
    device: str,
    shard: bool,
) -> None:
    """Find the DataLoader settings that make TARGET fastest on this machine, or, with a
    consumer (--rate, --step-time, --step), the cheapest that keep it fed; explain why."""
    from feedrate.loader.target import load_step, parse_target
    from feedrate.workflows.tune import tune as run_tune

    check_outputs(target, json=json_path, plot=plot_path, html=html_path)
    limit = parse_size(memory_limit, "memory_limit") if memory_limit is not None else None
    loader = load(target, script_args, ARGV)
    target = shown_target(target, script_args)
    step = load_step(parse_target(step_spec, script_args)) if step_spec else None
    with TuneProgress(budget_s) as progress:
        result = run_tune(
            loader,
            rate=rate,
            step_time=step_time,
            step=step,
            step_name=step_spec,
            budget_s=budget_s,
            timeout_s=timeout_s,
            max_workers=max_workers,
            memory_limit=limit,
            allow_reorder=allow_reorder,
            allow_threads=allow_threads,
            fresh=fresh,
            target=target,
            progress=progress.update,
            device=device,
            shard=shard,
        )
    show_tune(result, json_path, plot_path, html_path)


@cli.command()
@target_arguments
@consumer_options
@click.option(
    "--check",
    "check_ids",
    metavar="ID",
    multiple=True,
    help="Look only for this finding id (repeatable; default: all).",
)
@click.option(
    "--trial-seconds",
    type=POSITIVE,
    default=1.5,
    show_default=True,
    help="Seconds of steady state per configuration measured.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=POSITIVE,
    default=30.0,
    show_default=True,
    help="Stop a step as hung when no batch arrives for this many seconds.",
)
@file_option("--json", "json_path", "Also write the report as JSON (schema feedrate.doctor/1).")
@rank_options(shard=False)
def doctor(
    target: str,
    script_args: tuple[str, ...],
    rate: float | None,
    step_time: float | None,
    step_spec: str | None,
    check_ids: tuple[str, ...],
    trial_seconds: float,
    timeout_s: float,
    json_path: Path | None,
) -> None:
    """Find what is wrong or risky in TARGET's pipeline on this machine: the bottleneck, and
    traps such as a small /dev/shm, workers copying the dataset, duplicate samples, shared
    random generators, oversubscribed threads. Each finding cites the evidence and the fix.

    Exits 0 when it ran (findings or not), 2 for a bad target or option, 3 when the pipeline
    itself failed (the report, with what was found before, is still printed).
    """
    from feedrate.loader.target import load_step, parse_target
    from feedrate.render.doctor import doctor_report
    from feedrate.workflows.doctor import doctor as run_doctor
    from feedrate.workflows.doctor import wanted_checks

    wanted_checks(check_ids or None)
    check_outputs(target, json=json_path)
    loader = load(target, script_args, ARGV)
    target = shown_target(target, script_args)
    step = load_step(parse_target(step_spec, script_args)) if step_spec else None
    with err.status(f"doctor: examining {target} …", spinner="dots") as status:
        report = run_doctor(
            loader,
            rate=rate,
            step_time=step_time,
            step=step,
            step_name=step_spec,
            checks=check_ids or None,
            trial_seconds=trial_seconds,
            timeout_s=timeout_s,
            target=target,
            progress=doctor_progress(status),
        )
    human(json_path).print(doctor_report(report))
    if json_path is not None:
        write_json(json_path, report.to_dict())
    if report.pipeline_error is not None:
        raise PipelineError(report.pipeline_error)


@cli.command()
@click.option(
    "--sizes",
    default="64K,1M,16M,128M",
    show_default=True,
    help="Copy sizes, comma-separated (K, M, G = KiB, MiB, GiB).",
)
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--device", default="auto", show_default=True, help="cuda, cuda:N or mps.")
@file_option("--json", "json_path", "Write the figures as JSON (schema feedrate.transfer/1).")
def transfer(sizes: str, repeats: int, device: str, json_path: Path | None) -> None:
    """Host-to-device and device-to-host bandwidth from pageable and pinned memory, and the
    cost of pinning each batch against reusing a pinned buffer (as CUDA's bandwidthTest)."""
    from feedrate.render import console as render
    from feedrate.workflows.transfer import transfer as run_transfer

    check_outputs(None, json=json_path)
    byte_sizes = parse_sizes(sizes)
    with err.status(f"timing copies to {device} …", spinner="dots"):
        result = run_transfer(byte_sizes, repeats=repeats, device=device)
    human(json_path).print(render.transfer_result(result))
    if json_path is not None:
        write_json(json_path, result.to_dict())


@cli.command()
@click.argument(
    "run_json", metavar="RUN.json", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@file_option("--plot", "plot_path", "Write a PNG plot (tune results; a run's stall timeline).")
@file_option("--html", "html_path", "Write a self-contained HTML report (tune results and runs).")
def report(run_json: Path, plot_path: Path | None, html_path: Path | None) -> None:
    """Render a saved result again, without measuring: the --json of run, tune, doctor,
    measure or transfer."""
    check_outputs(None, plot=plot_path, html=html_path)
    try:
        document = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {run_json}: {exc}") from exc
    show_saved(run_json, document, plot_path, html_path)


@cli.command()
@click.argument("finding_id", metavar="ID", required=False)
def explain(finding_id: str | None) -> None:
    """What a finding means, the evidence it rests on, and the fix (without ID: every id)."""
    from feedrate.checks.catalog import CATALOG, close_matches

    if finding_id is None:
        for entry in CATALOG.values():
            out.print(f"[bold]{entry.id}[/bold]  {entry.title}", highlight=False)
        return
    doc = CATALOG.get(finding_id)
    if doc is None:
        near = close_matches(finding_id)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UserError(f"no finding {finding_id!r}{hint} (feedrate explain lists them)")
    out.print(f"[bold]{doc.id}[/bold] ({doc.severity}): {doc.title}", highlight=False)
    for label, text in (("means", doc.means), ("evidence", doc.evidence), ("fix", doc.fix)):
        out.print(f"\n[bold]{label}[/bold]  {text}", highlight=False)
