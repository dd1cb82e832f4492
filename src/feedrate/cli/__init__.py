"""The command line: parses, calls the library, prints. ``main`` is the ``feedrate`` command.

Exit status: 0 success, 2 a user mistake (bad target or option), 3 the pipeline failed while
measured (``doctor`` prints its report first), 130 interrupted.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Sequence

import click

from feedrate.cli import ranks
from feedrate.cli.commands import cli
from feedrate.cli.options import OPTION_OF
from feedrate.cli.run import run_command
from feedrate.errors import FeedrateError, UserError
from feedrate.measuring import interrupts

__all__ = ["cli", "main"]

cli.add_command(run_command)


def in_options(exc: FeedrateError) -> str:
    """The error's message, with the library arguments it names said as command-line options."""
    message = str(exc)
    for param in exc.params if isinstance(exc, UserError) else ():
        option = OPTION_OF.get(param)
        if option is not None:
            message = re.sub(rf"(?<![\w-]){re.escape(param)}(?![\w])(=?)", rf"{option}\1", message)
    return message


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and turns feedrate's errors into one-line
    messages and exit statuses, never a traceback for a user mistake."""
    ranks.ARGV[:] = list(argv) if argv is not None else sys.argv[1:]
    try:
        with interrupts.stoppable(sigterm=True):
            code = cli.main(
                args=list(argv) if argv is not None else None,
                prog_name="feedrate",
                standalone_mode=False,
            )
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        # The workers are stopped by now; a second Ctrl-C during exit's own clean-up (atexit
        # handlers) would only print a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        terminated = interrupts.last_signal() == signal.SIGTERM
        if not ranks.quiet():
            click.secho(
                f"feedrate: {'terminated' if terminated else 'interrupted'}", fg="red", err=True
            )
        sys.exit(143 if terminated else 130)
    except FeedrateError as exc:
        # One unwrapped line: scripts grep it, people read it.
        click.secho(f"feedrate: error: {in_options(exc)}", fg="red", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
