"""Options shared by several commands, and the option each library argument is given by."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

#: Library argument → command-line option: a library error about ``budget_s`` is shown to a
#: command-line user as one about ``--budget-s``.
OPTION_OF = {
    "budget_s": "--budget-s",
    "rate": "--rate",
    "step_time": "--step-time",
    "step": "--step",
    "max_workers": "--max-workers",
    "memory_limit": "--memory-limit",
    "device": "--device",
    "sizes": "--sizes",
    "batches": "--batches",
    "seconds": "--seconds",
    "trial_seconds": "--trial-seconds",
    "timeout_s": "--timeout",
    "checks": "--check",
    "args": "-- ARGS after TARGET",  # a script's own arguments (TargetSpec.args)
}


def target_arguments(fn: F) -> F:
    """TARGET, then the script's own arguments after ``--`` (its ``sys.argv[1:]`` while it is
    imported: ``feedrate tune train.py:loader --budget-s 30 -- --data /mnt/train``)."""
    fn = click.argument(
        "script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARGS...]"
    )(fn)
    return click.argument("target")(fn)


def file_option(name: str, dest: str, help_text: str) -> Callable[[F], F]:
    """An option naming a file to write (--json, --plot, --html); ``--json -`` is stdout."""
    kind = click.Path(dir_okay=False, path_type=Path, allow_dash=name == "--json")
    return click.option(name, dest, type=kind, help=help_text)


def device_option(fn: F) -> F:
    """--device: where the training loop copies batches (measure and tune)."""
    return click.option(
        "--device",
        default="auto",
        show_default=True,
        help="Copy each batch to this device in the measured loop (cuda, cuda:1, mps); auto: "
        "the accelerator torch sees, if any; cpu: no copy.",
    )(fn)


if TYPE_CHECKING:  # generic from click 8.2 on; the package accepts 8.1
    _FloatParam = click.ParamType[float]
else:
    _FloatParam = click.ParamType


class Positive(_FloatParam):
    """A finite number above zero, checked as the command line is read: before the TARGET,
    whose import may take minutes (a dataset built at import), not after it."""

    name = "float"  # the metavar in --help: FLOAT, as click writes its own

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number <= 0:
            self.fail(f"{value!r} is not a finite number above 0", param, ctx)
        return number


POSITIVE = Positive()


def consumer_options(fn: F) -> F:
    """--rate, --step-time and --step: what the loader must keep up with (tune and doctor)."""
    fn = click.option(
        "--step",
        "step_spec",
        metavar="FILE:FUNC",
        help="A real training step: a callable taking a batch.",
    )(fn)
    fn = click.option("--step-time", type=POSITIVE, help="Consumer pace in seconds per batch.")(fn)
    return click.option(
        "--rate", type=POSITIVE, help="Consumer pace in samples/s (a simulated accelerator)."
    )(fn)
