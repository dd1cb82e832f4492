"""``feedrate run``: a training script run as it is, its DataLoaders observed, the data stall
reported at the end (on stderr: stdout stays the script's own).

Exit status: the command's own (128 + N when a signal N ended it, so 130 after Ctrl-C); 2 when
there is nothing to run (no script, a missing file or command, ``-m`` of a missing module).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click

from feedrate.cli.options import file_option
from feedrate.cli.output import check_outputs, err, write_json
from feedrate.distributed.launcher import launched, other_rank
from feedrate.errors import UserError

_HELP = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


@click.command("run", context_settings=_HELP)
@click.option(
    "-m",
    "module",
    is_flag=True,
    help="SCRIPT_OR_COMMAND is a module, run as python -m does (feedrate run -m pkg.train).",
)
@click.option(
    "--autotune",
    is_flag=True,
    help="Tune every training loader while the script runs (feedrate.autotune: the same "
    "batches in the same order; the cache is used and filled).",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    help="Run the script as N ranks on this machine, as torchrun --standalone "
    "--nproc-per-node N would, and report every rank.",
)
@file_option("--json", "json_path", "Also write the report as JSON (schema feedrate.run/1).")
@file_option("--html", "html_path", "Also write an HTML report with the stall timeline.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] SCRIPT [ARGS]...")
@click.pass_context
def run_command(
    ctx: click.Context,
    module: bool,
    autotune: bool,
    nproc_per_node: int | None,
    json_path: Path | None,
    html_path: Path | None,
    command: tuple[str, ...],
) -> None:
    """Run a training script (train.py ARGS, -m package.module ARGS, or -- COMMAND ARGS such
    as torchrun) as it is, and report how long its loop waits for data in every DataLoader
    of every process it starts, what limits it, and what to change."""
    from feedrate.render.run import check_plotting, run_report, write_html
    from feedrate.running import launch
    from feedrate.running.gather import gather

    check_outputs(None, json=json_path, html=html_path)
    if html_path is not None:
        check_plotting()
    argv = launch.command_of(command, module)
    shown = ["-m", *command] if module else list(command)
    if nproc_per_node is not None and nproc_per_node > 1:
        if launched():
            raise UserError(
                "--nproc-per-node starts the ranks itself: under torchrun, leave it out "
                "(or run feedrate run --nproc-per-node N SCRIPT without torchrun)"
            )
        if argv[0] != sys.executable:
            raise UserError(
                f"--nproc-per-node runs a Python script (or -m module) as N ranks: give the "
                f"script itself (feedrate run --nproc-per-node N train.py), not a command "
                f"({command[0]}); for a launcher of your own, feedrate run -- torchrun ..."
            )
        ranks = ["--standalone", f"--nproc-per-node={nproc_per_node}"]
        argv = [sys.executable, "-m", "torch.distributed.run", *ranks, *argv[1:]]
        shown = ["torchrun", *ranks, *shown]
    with tempfile.TemporaryDirectory(prefix="feedrate-run-") as folder:
        env = launch.prepare(folder, autotune=autotune)
        outcome = launch.run(argv, env)
        report = gather(os.path.join(folder, "reports"), shown, outcome, autotune=autotune)
    if other_rank():  # torchrun -m feedrate run: rank 0 speaks, for its own rank
        ctx.exit(outcome.exit_code)
    err.print(run_report(report))
    if launched():  # rank 0 of a job: its own rank's report
        err.print(
            "feedrate: this is rank 0's report only (feedrate run under torchrun follows its "
            "own rank): feedrate run --nproc-per-node N SCRIPT, or feedrate run -- torchrun "
            "... SCRIPT, reports every rank",
            highlight=False,
        )
    if json_path is not None:
        write_json(json_path, report.to_dict())
    if html_path is not None:
        write_html(report, html_path)
        err.print(f"wrote {html_path}")
    ctx.exit(outcome.exit_code)
