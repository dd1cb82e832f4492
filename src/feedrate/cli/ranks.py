"""``--nproc-per-node N`` and running under torchrun, for ``measure``, ``tune`` and ``doctor``.

Under a launcher (torchrun, or ``--nproc-per-node``, which starts the ranks itself through
``distributed.launch``), each rank joins the job's process group (gloo) and runs the command;
rank 0 alone prints and writes files, the others stay quiet.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from feedrate.cli import output
from feedrate.distributed.launcher import other_rank
from feedrate.errors import UserError
from feedrate.units import counted

F = TypeVar("F", bound=Callable[..., Any])

#: The command line as given (``main`` records it): each rank runs it again.
ARGV: list[str] = []

#: This process started the ranks of a job (``--nproc-per-node``).
STARTED = False

#: Seconds a rank waits for the others to join the job.
JOIN_S = 120.0

_FILES = ("json_path", "plot_path", "html_path")


def quiet() -> bool:
    """This process started the ranks, or is a rank other than 0: rank 0 says what happened."""
    return STARTED or other_rank()


def one_node() -> bool:
    """Every rank of the job runs on this node (``LOCAL_WORLD_SIZE`` is ``WORLD_SIZE``)."""
    return os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")


def without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--nproc-per-node N`` (or ``--nproc-per-node=N``); what follows
    ``--`` is the script's own, kept as it is."""
    out: list[str] = []
    skip = False
    for n, a in enumerate(argv):
        if skip:
            skip = False
        elif a == "--":
            return out + list(argv[n:])
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            out.append(a)
    return out


def rank_options(*, shard: bool) -> Callable[[F], F]:
    """The options (``--nproc-per-node``, and ``--shard`` where the command takes it) and the
    running of the command as one rank of a job."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def command(*args: Any, nproc_per_node: int | None, **kwargs: Any) -> Any:
            if nproc_per_node is not None and nproc_per_node > 1:
                _found(kwargs)  # a TARGET that is not there: said once, before any rank starts
                return _start(nproc_per_node)
            return _as_rank(fn, *args, **kwargs)

        opts = click.option(
            "--nproc-per-node",
            type=click.IntRange(min=1),
            help="Run as N ranks per node: start N rank processes on this machine, each with "
            "its own loader, all loading at once (no torchrun needed). Under torchrun, leave it "
            "out.",
        )(command)
        if shard:
            opts = click.option(
                "--shard",
                is_flag=True,
                help="With several ranks and a loader without a DistributedSampler: give each "
                "rank its own shard for the measurement (a DistributedSampler).",
            )(opts)
        return opts  # type: ignore[return-value]

    return wrap


def _found(kwargs: dict[str, Any]) -> None:
    """The command's TARGET, and its ``--step``, have the form of one and their files exist
    (``TargetError`` else); nothing is imported here, that is each rank's."""
    from feedrate.loader.target import found_target

    for name in ("target", "step_spec"):
        if isinstance(kwargs.get(name), str):
            found_target(kwargs[name])


def _start(ranks: int) -> None:
    from feedrate.distributed import group, launch
    from feedrate.machine.facts import collect

    if group.launched():
        raise UserError(
            "--nproc-per-node starts the ranks itself: under torchrun, leave it out (torchrun's "
            "--nproc-per-node says how many)"
        )
    global STARTED
    STARTED = True
    output.err.print(f"feedrate: starting {ranks} ranks on this machine", highlight=False)
    cpus = collect().cpus_usable
    if ranks > cpus:  # the figures are of a node with less than a CPU per rank
        output.err.print(
            f"feedrate: warning: {ranks} ranks on {counted(cpus, 'usable CPU')}: each rank's main "
            "process gets less than a CPU, and the answer is for a node like this one; tune on a "
            "machine like the node you will train on",
            highlight=False,
        )
    code = launch.run_ranks([sys.executable, "-m", "feedrate", *without_nproc(ARGV)], ranks)
    if code:
        raise click.exceptions.Exit(code)


def _as_rank(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from feedrate.distributed import group

    joined = group.join(JOIN_S)
    try:
        if group.active() and not _rank_zero():
            for name in _FILES:  # rank 0 writes the files
                if name in kwargs:
                    kwargs[name] = None
            output.out.quiet = output.err.quiet = True
        return fn(*args, **kwargs)
    finally:
        if joined:
            group.leave()


def _rank_zero() -> bool:
    import torch.distributed as dist

    return dist.get_rank() == 0
