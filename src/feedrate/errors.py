"""Errors feedrate raises. Each carries a message meant for the user, written to be read alone."""

from __future__ import annotations


class FeedrateError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with when this reaches it."""

    exit_code = 1


class UserError(FeedrateError):
    """The user's input is wrong (a bad target, a bad argument): exit status 2, no traceback.

    The message speaks the library's language (``budget_s``, ``rate``); ``params`` names the
    arguments it is about, so the command line can say ``--budget-s`` and ``--rate`` instead."""

    exit_code = 2

    def __init__(self, message: str, *, params: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.params = params


class TargetError(UserError):
    """A TARGET could not be loaded: missing file or name, wrong type, or the user's code raised."""


class PipelineError(FeedrateError):
    """The user's pipeline failed while measured: its own exception, a killed worker, a hang."""

    exit_code = 3


class WorkerKilledError(PipelineError):
    """A DataLoader worker process died from a signal or exited unexpectedly."""


class PipelineTimeoutError(PipelineError):
    """No batch arrived within the allowed time: the pipeline appears to hang."""


class WorkersNotStartedError(PipelineError):
    """DataLoader worker processes were forked and never reached ``worker_init_fn``."""
