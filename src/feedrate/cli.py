"""The ``feedrate`` command line: parses options, calls the library, prints. No logic of its own.

Exit status: 0 success, 2 a user mistake (bad target or option), 3 the pipeline failed while
measured (``doctor`` prints its report first), 130 interrupted.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from feedrate import __version__, interrupts
from feedrate.errors import FeedrateError, PipelineError, UserError

F = TypeVar("F", bound=Callable[..., Any])

_out = Console()
_err = Console(stderr=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from exc
    _err.print(f"wrote {path}")


def _file_option(name: str, dest: str, help_text: str) -> Callable[[F], F]:
    """An option naming a file to write (--json, --plot, --html)."""
    return click.option(name, dest, type=click.Path(dir_okay=False, path_type=Path), help=help_text)


def _device_option(fn: F) -> F:
    """--device: where the training loop copies batches (measure and tune)."""
    return click.option(
        "--device",
        default="auto",
        show_default=True,
        help="Copy each batch to this device in the measured loop (cuda, cuda:1, mps); auto: "
        "the accelerator torch sees, if any; cpu: no copy.",
    )(fn)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="feedrate")
def cli() -> None:
    """Find the DataLoader settings that make a PyTorch data pipeline keep up on this machine.

    TARGET is path/to/file.py:NAME or package.module:NAME, where NAME is a DataLoader or a
    zero-argument callable returning one.
    """


@cli.command()
@_file_option("--json", "json_path", "Also write the facts as JSON to this file.")
def env(json_path: Path | None) -> None:
    """Show the machine facts that decide DataLoader settings."""
    from feedrate import machine, render

    facts = machine.collect()
    _out.print(render.machine_table(facts))
    if json_path is not None:
        _write_json(json_path, {"schema": "feedrate.env/1", "machine": facts.to_dict()})


@cli.command()
@click.argument("target")
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
    type=click.FloatRange(min=0, min_open=True),
    help="Measure this many seconds of steady state (default 10).",
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
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Give up when no batch arrives for this many seconds.",
)
@_file_option(
    "--json", "json_path", "Also write the measurement as JSON (schema feedrate.measure/1)."
)
@_device_option
def measure(
    target: str,
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
) -> None:
    """Measure one configuration of TARGET's DataLoader: start-up, steady-state samples/s with
    its spread, CPU and memory of every process."""
    from feedrate import render
    from feedrate.config import LoaderConfig, config_of
    from feedrate.measuring import measure as run_measure

    if batches is not None and seconds is not None:
        raise UserError("give --batches or --seconds, not both")
    if persistent_workers and num_workers == 0:
        raise UserError("--persistent-workers needs workers (-w 1 or more)")
    loader = _load(target)
    own = config_of(loader)
    workers = own.num_workers if num_workers is None else num_workers
    config = LoaderConfig(
        num_workers=workers,
        pin_memory=own.pin_memory if pin_memory is None else pin_memory,
        prefetch_factor=prefetch_factor or own.prefetch_factor,
        persistent_workers=own.persistent_workers
        if persistent_workers is None
        else persistent_workers,
    ).normalized()
    with _err.status(f"measuring {target} ({config.label()}) …", spinner="dots"):
        result = run_measure(
            loader,
            config,
            batches=batches,
            seconds=seconds,
            windows_count=windows_count,
            timeout_s=timeout_s,
            target=target,
            device=device,
        )
    _out.print(render.measurement(result))
    if json_path is not None:
        _write_json(json_path, result.to_dict())


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """'8G', '512MiB', '2.5gb' or plain bytes → bytes. Raises UserError naming the input."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise UserError(f"--memory-limit {text!r} is not a size: use e.g. 8G, 512M or 2GiB")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise UserError(f"--memory-limit must be positive, got {text!r}")
    return value


def _consumer_options(fn: F) -> F:
    """--rate, --step-time and --step: what the loader must keep up with (tune and doctor)."""
    fn = click.option(
        "--step",
        "step_spec",
        metavar="FILE:FUNC",
        help="A real training step: a callable taking a batch.",
    )(fn)
    fn = click.option("--step-time", type=float, help="Consumer pace in seconds per batch.")(fn)
    return click.option(
        "--rate", type=float, help="Consumer pace in samples/s (a simulated accelerator)."
    )(fn)


@cli.command()
@click.argument("target")
@_consumer_options
@click.option(
    "--budget-s", type=float, default=60.0, show_default=True, help="Seconds the search may take."
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
@_file_option("--json", "json_path", "Write the result as JSON (schema feedrate.tune/1).")
@_file_option("--plot", "plot_path", "Write a PNG plot of samples/s against num_workers.")
@_file_option("--html", "html_path", "Write a self-contained HTML report.")
@_device_option
def tune(
    target: str,
    rate: float | None,
    step_time: float | None,
    step_spec: str | None,
    budget_s: float,
    max_workers: int | None,
    memory_limit: str | None,
    allow_reorder: bool,
    allow_threads: bool,
    fresh: bool,
    json_path: Path | None,
    plot_path: Path | None,
    html_path: Path | None,
    device: str,
) -> None:
    """Find the DataLoader settings that make TARGET fastest on this machine, or, with a
    consumer (--rate, --step-time, --step), the cheapest that keep it fed; explain why."""
    from feedrate.target import load_step
    from feedrate.tuning import tune as run_tune

    limit = parse_size(memory_limit) if memory_limit is not None else None
    loader = _load(target)
    step = load_step(step_spec) if step_spec else None
    with _TuneProgress(budget_s) as progress:
        result = run_tune(
            loader,
            rate=rate,
            step_time=step_time,
            step=step,
            step_name=step_spec,
            budget_s=budget_s,
            max_workers=max_workers,
            memory_limit=limit,
            allow_reorder=allow_reorder,
            allow_threads=allow_threads,
            fresh=fresh,
            target=target,
            progress=progress.update,
            device=device,
        )
    _show_tune(result, json_path, plot_path, html_path)


@cli.command()
@click.argument("target")
@_consumer_options
@click.option(
    "--check",
    "check_ids",
    metavar="ID",
    multiple=True,
    help="Look only for this finding id (repeatable; default: all).",
)
@click.option(
    "--trial-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=1.5,
    show_default=True,
    help="Seconds of steady state per configuration measured.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Stop a step as hung when no batch arrives for this many seconds.",
)
@_file_option("--json", "json_path", "Also write the report as JSON (schema feedrate.doctor/1).")
def doctor(
    target: str,
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
    from feedrate import render
    from feedrate.doctoring import doctor as run_doctor
    from feedrate.doctoring import wanted_checks
    from feedrate.target import load_step

    wanted_checks(check_ids or None)
    loader = _load(target)
    step = load_step(step_spec) if step_spec else None
    with _err.status(f"doctor: examining {target} …", spinner="dots") as status:
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
            progress=lambda name: status.update(f"doctor: {_STEP_NAMES.get(name, name)} …"),
        )
    _out.print(render.doctor_report(report))
    if json_path is not None:
        _write_json(json_path, report.to_dict())
    if report.pipeline_error is not None:
        raise PipelineError(report.pipeline_error)


_STEP_NAMES = {
    "workers": "looking inside 2 workers",
    "duplicates": "comparing what 2 workers yield",
    "memory": "watching worker memory",
    "performance": "measuring your settings and a few alternatives",
}


@cli.command()
@click.option(
    "--sizes",
    default="64K,1M,16M,128M",
    show_default=True,
    help="Copy sizes, comma-separated (K, M, G = KiB, MiB, GiB).",
)
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--device", default="auto", show_default=True, help="cuda, cuda:N or mps.")
@_file_option("--json", "json_path", "Write the figures as JSON (schema feedrate.transfer/1).")
def transfer(sizes: str, repeats: int, device: str, json_path: Path | None) -> None:
    """Host-to-device and device-to-host bandwidth from pageable and pinned memory, and the
    cost of pinning each batch against reusing a pinned buffer (as CUDA's bandwidthTest)."""
    from feedrate import checks_transfer, render
    from feedrate import transfer as tr

    byte_sizes = tr.parse_sizes(sizes)
    dev = tr.parse_device(device)
    if dev is None:
        _out.print(f"skipped: {tr.NO_ACCELERATOR}.")
        if json_path is not None:
            _write_json(json_path, {"schema": tr.SCHEMA, "skipped": tr.NO_ACCELERATOR})
        return
    with _err.status(f"timing copies to {dev} …", spinner="dots"):
        result = tr.bandwidth(dev, byte_sizes, repeats)
    findings = checks_transfer.bandwidth_findings(result.sizes)
    _out.print(render.transfer_result(result, findings))
    if json_path is not None:
        doc = result.to_dict()
        doc["findings"] = [f.to_dict() for f in findings]
        _write_json(json_path, doc)


@cli.command()
@click.argument(
    "run_json", metavar="RUN.json", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@_file_option("--plot", "plot_path", "Write a PNG plot (tune results).")
@_file_option("--html", "html_path", "Write a self-contained HTML report (tune results).")
def report(run_json: Path, plot_path: Path | None, html_path: Path | None) -> None:
    """Render a saved result (from --json) again, without measuring."""
    from feedrate import render
    from feedrate.report import Report
    from feedrate.results import Measurement, TuneResult

    try:
        document = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {run_json}: {exc}") from exc
    schema = document.get("schema") if isinstance(document, dict) else None
    if schema == "feedrate.tune/1":
        _show_tune(TuneResult.from_dict(document), None, plot_path, html_path)
    elif schema in ("feedrate.measure/1", "feedrate.doctor/1"):
        if plot_path or html_path:
            raise UserError("--plot and --html render tune results; this is not one")
        if schema == "feedrate.doctor/1":
            _out.print(render.doctor_report(Report.from_dict(document)))
        else:
            _out.print(render.measurement(Measurement.from_dict(document)))
    else:
        raise UserError(f"{run_json} is not a feedrate result (schema: {schema!r})")


def _show_tune(
    result: Any, json_path: Path | None, plot_path: Path | None, html_path: Path | None
) -> None:
    from feedrate import render

    _out.print(render.tune_result(result))
    if json_path is not None:
        _write_json(json_path, result.to_dict())
    if plot_path is not None:
        from feedrate.plot import plot_png

        _err.print(f"wrote {plot_png(result, plot_path)}")
    if html_path is not None:
        from feedrate.html import write_html

        write_html(result, html_path)
        _err.print(f"wrote {html_path}")


class _TuneProgress:
    """Live progress on stderr: the trial running, the budget left, a line per finished trial."""

    def __init__(self, budget_s: float) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.budget_s = budget_s
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[left]}"),
            console=_err,
            transient=True,
        )
        self.task = self.bar.add_task("loading", total=budget_s, left="")

    def __enter__(self) -> _TuneProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def update(self, event: Any) -> None:
        left = f"{max(0.0, event.budget_s - event.elapsed_s):.0f} s of budget left"
        self.bar.update(
            self.task,
            completed=min(event.elapsed_s, self.budget_s),
            left=left,
            description=f"trial {event.index + 1}: {event.config.label()}",
        )
        t = event.trial
        if t is None:
            return
        if t.skipped or t.error:
            what = f"skipped: {t.skipped}" if t.skipped else f"failed: {t.error}"
        else:
            what = f"{t.median:,.0f} samples/s ± {t.noise:.0%}"
        self.bar.console.print(
            f"  {t.config.label():24s} {what}  [dim]({t.reason})[/dim]", highlight=False
        )


def _load(target: str) -> Any:
    from feedrate.target import load_target

    # As `python -m` does: a package.module target is looked up from the current directory too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_target(target)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and turns feedrate's errors into one-line
    messages and exit statuses, never a traceback for a user mistake."""
    try:
        with interrupts.stoppable():
            code = cli.main(
                args=list(argv) if argv is not None else None,
                prog_name="feedrate",
                standalone_mode=False,
            )
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.secho("feedrate: interrupted", fg="red", err=True)
        sys.exit(130)
    except FeedrateError as exc:
        # One unwrapped line: scripts grep it, people read it.
        click.secho(f"feedrate: error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
