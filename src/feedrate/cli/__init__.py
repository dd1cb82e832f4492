"""The command line: parses, calls the library, prints. ``main`` is the ``feedrate`` command.

Exit status: 0 success, 2 a user mistake (bad target or option), 3 the pipeline failed while
measured (``doctor`` prints its report first), 130 interrupted (143 terminated, 129 hung up).
"""

from __future__ import annotations

import contextlib
import difflib
import faulthandler
import os
import re
import signal
import sys
from collections.abc import Sequence

import click

from feedrate.cli import ranks
from feedrate.cli.commands import cli
from feedrate.cli.options import OPTION_OF
from feedrate.cli.run import run_command
from feedrate.distributed.launcher import other_rank
from feedrate.errors import FeedrateError, TargetError, UserError
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


#: A command's help asked for by giving it nothing (click 8.2 on); click 8.1 prints it itself.
_HELP_ERRORS: tuple[type[Exception], ...] = tuple(
    e for e in [getattr(click.exceptions, "NoArgsIsHelpError", None)] if e is not None
)


def option_error(exc: click.ClickException) -> str:
    """A mistake on the command line in one line, as feedrate's other errors are said: click's
    message and where help is; for an unknown option, feedrate's own it may misspell, or, on a
    command that takes a TARGET, that a script's own options go after ``--``."""
    said = exc.format_message().rstrip(".")
    message = said[:1].lower() + said[1:]  # as feedrate's own: "unknown check 'x'"
    if isinstance(exc, click.NoSuchOption):
        name = exc.option_name
        close = difflib.get_close_matches(name, exc.possibilities or [], n=3, cutoff=0.8)
        message = f"no such option {name!r}"
        command = getattr(exc.ctx, "command", None)  # one that takes a script's arguments
        script = any(p.name == "script_args" for p in getattr(command, "params", []))
        if close:
            message += f": did you mean {' or '.join(repr(c) for c in close)}?"
            if script:
                message += f" (a script's own option goes after --: TARGET -- {name} ...)"
        elif script:
            message += f": a script's own arguments go after -- (TARGET -- {name} ...)"
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def _show_crashes() -> None:
    """A crash in native code in this process (a dataset's ``__getitem__`` that segfaults while
    its batch is made here, with ``num_workers=0``) prints the Python lines it happened at
    instead of nothing. Not in forked workers: their deaths are reported by feedrate, named
    (SIGSEGV, SIGBUS from a full /dev/shm) without a dump. Once per process."""
    if faulthandler.is_enabled() or _CRASHES_SHOWN:
        return
    _CRASHES_SHOWN.append(True)
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no real stderr file
        faulthandler.enable(all_threads=False)  # the crashing thread: the dataset's line
        os.register_at_fork(after_in_child=faulthandler.disable)


_CRASHES_SHOWN: list[bool] = []


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and turns feedrate's errors into one-line
    messages and exit statuses, never a traceback for a user mistake."""
    _show_crashes()
    ranks.ARGV[:] = list(argv) if argv is not None else sys.argv[1:]
    kept = sys.argv  # a TARGET's script has its own while the command runs (cli.output.load)
    try:
        with interrupts.stoppable(sigterm=True):
            code = cli.main(
                args=list(argv) if argv is not None else None,
                prog_name="feedrate",
                standalone_mode=False,
            )
    except click.ClickException as exc:
        if isinstance(exc, _HELP_ERRORS):  # `feedrate` alone: its help, as click prints it
            exc.show()
        else:
            click.secho(f"feedrate: error: {option_error(exc)}", fg="red", err=True)
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        # The workers are stopped by now; a second Ctrl-C during exit's own clean-up (atexit
        # handlers) would only print a traceback.
        for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None:
                signal.signal(signum, signal.SIG_IGN)
        last = int(interrupts.last_signal() or signal.SIGINT)
        words = {int(signal.SIGINT): "interrupted", int(signal.SIGTERM): "terminated"}
        word = words.get(last, "hung up")
        if not ranks.quiet():
            click.secho(f"feedrate: {word}", fg="red", err=True)
        sys.exit(128 + int(last))
    except FeedrateError as exc:
        # One unwrapped line: scripts grep it, people read it. A bad TARGET is the same on
        # every rank of one node: rank 0 says it (a rank's own trouble, such as joining the
        # job, and another node's files, are said by the rank).
        if not (isinstance(exc, TargetError) and other_rank() and ranks.one_node()):
            who = f"rank {os.environ.get('RANK')}: " if other_rank() else ""
            click.secho(f"feedrate: error: {who}{in_options(exc)}", fg="red", err=True)
        sys.exit(exc.exit_code)
    finally:
        sys.argv = kept
    sys.exit(code if isinstance(code, int) else 0)
