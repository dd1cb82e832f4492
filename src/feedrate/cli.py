"""The ``feedrate`` command line: parses options, calls the library, prints. No logic of its own.

Exit status: 0 success, 2 a user mistake (bad target or option), 3 the pipeline failed while
measured, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from feedrate import __version__
from feedrate.errors import FeedrateError, UserError

F = TypeVar("F", bound=Callable[..., Any])

_out = Console()
_err = Console(stderr=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from exc
    _err.print(f"wrote {path}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="feedrate")
def cli() -> None:
    """Find the DataLoader settings that make a PyTorch data pipeline keep up on this machine.

    TARGET is path/to/file.py:NAME or package.module:NAME, where NAME is a DataLoader or a
    zero-argument callable returning one.
    """


@cli.command()
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the facts as JSON to this file.",
)
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
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the measurement as JSON (schema feedrate.measure/1).",
)
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
) -> None:
    """Measure one configuration of TARGET's DataLoader: start-up, steady-state samples/s with
    its spread, CPU and memory of every process."""
    from feedrate import render
    from feedrate.config import LoaderConfig, config_of
    from feedrate.measure import measure as run_measure

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
        )
    _out.print(render.measurement(result))
    if json_path is not None:
        _write_json(json_path, result.to_dict())


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
