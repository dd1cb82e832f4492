"""What the commands print and write: JSON files, tune's result and live progress, a saved
result shown again, and the TARGET loaded as ``python -m`` would find it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from feedrate.errors import UserError
from feedrate.render.text import noise_of, rate


def _width(stream: Any) -> int | None:
    """Rich's width (None: the terminal's, or $COLUMNS), else 120 columns: into a file or a
    pipe rich sets 80, and the trials table came out a word per line."""
    isatty = getattr(stream, "isatty", None)
    if os.environ.get("COLUMNS") or (isatty is not None and isatty()):
        return None
    return LOG_WIDTH


#: The width of output written to a file or a pipe (a log, CI).
LOG_WIDTH = 120

out = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))
#: What the doctor's spinner says of each of its steps.
STEP_NAMES = {
    "workers": "looking inside 2 workers",
    "batch": "making one batch in the main process",
    "duplicates": "comparing what 2 workers yield",
    "memory": "watching worker memory",
    "performance": "measuring your settings and a few alternatives",
}


def doctor_progress(status: Any) -> Callable[[str], None]:
    """What the doctor is doing: on its spinner, and where stderr is no terminal (a log, a CI
    job, where the spinner shows nothing), a line per step, so a slow step is no silent one."""

    def step(name: str) -> None:
        said = f"doctor: {STEP_NAMES.get(name, name)} …"
        status.update(said)
        if not err.is_terminal:
            err.print(said, highlight=False)

    return step


#: ``--json -``: the document goes to stdout, and the tables to stderr.
STDOUT = Path("-")


def human(json_path: Path | None) -> Console:
    """Where the tables go: stdout, unless the JSON document goes there."""
    return err if json_path == STDOUT else out


def check_outputs(target: str | None, **paths: Path | None) -> None:
    """Before anything is measured (a run can take minutes): every output file can be written,
    is not the TARGET's own file nor any existing Python file (a PNG over ``train.py`` would
    destroy the user's work), and no two outputs share a file. ``paths`` maps option names
    (``plot``) to the paths given."""
    location = target.rpartition(":")[0] if target else ""
    own = Path(location).resolve() if location.endswith(".py") else None
    seen: dict[Path, str] = {}
    for name, path in paths.items():
        if path is None or (name == "json" and path == STDOUT):
            continue
        flag = f"--{name}"
        if path == STDOUT:
            raise UserError(f"{flag} -: this output is a file; give it a name")
        resolved = path.resolve()
        if resolved == own:
            raise UserError(
                f"{flag} {path} is the TARGET's own file: feedrate will not overwrite it"
            )
        if path.suffix == ".py" and path.exists():
            raise UserError(
                f"{flag} {path} is an existing Python file: feedrate will not overwrite it"
            )
        if resolved.is_dir():  # '' too: the current folder (an unset shell variable)
            raise UserError(f"{flag} '{path}' is a folder: give the name of a file to write")
        folder = resolved.parent
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            raise UserError(f"{flag} {path}: the folder {folder} {what}")
        device = resolved.exists() and not resolved.is_file()  # /dev/stdout, a pipe
        if not (os.access(resolved, os.W_OK) if device else _can_write_in(folder)):
            raise UserError(f"{flag} {path}: the folder {folder} is not writable")
        if resolved in seen:
            raise UserError(f"{flag} and --{seen[resolved]} name the same file, {path}")
        seen[resolved] = name


def _can_write_in(folder: Path) -> bool:
    """A file can be made in ``folder``, tried (``os.access`` says yes to root everywhere,
    ``/proc`` included, and the run then failed at its end)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".feedrate-check-")
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


def write_json(path: Path, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=2) + "\n"
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from exc
    err.print(f"wrote {path}")


def show_tune(
    result: Any, json_path: Path | None, plot_path: Path | None, html_path: Path | None
) -> None:
    from feedrate.render import console as render

    human(json_path).print(render.tune_result(result))
    if json_path is not None:
        write_json(json_path, result.to_dict())
    if plot_path is not None:
        from feedrate.render.plot import plot_png

        err.print(f"wrote {plot_png(result, plot_path)}")
    if html_path is not None:
        from feedrate.render.html import write_html

        write_html(result, html_path)
        err.print(f"wrote {html_path}")


def show_saved(path: Path, document: Any, plot_path: Path | None, html_path: Path | None) -> None:
    """A result saved by ``--json`` (``document``, read from ``path``), shown again as the
    command that made it showed it, on stdout (``feedrate run`` prints on stderr only because
    stdout is the script's). ``--plot`` and ``--html`` draw what has a picture: tune's trials
    and a run's stall timeline; for any other result they are refused before anything prints."""
    from feedrate.render import console as render
    from feedrate.render.doctor import doctor_report
    from feedrate.results.doctor import Report
    from feedrate.results.documents import read
    from feedrate.results.run import RunReport
    from feedrate.results.transfer import TransferResult
    from feedrate.results.tune import TuneResult

    try:
        result = read(document)
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from exc
    if isinstance(result, TuneResult):
        show_tune(result, None, plot_path, html_path)
    elif isinstance(result, RunReport):
        show_run(result, plot_path, html_path)
    elif plot_path or html_path:
        raise UserError(
            f"--plot and --html draw tune results and runs only; {path} holds a "
            f"{document['schema']} result, which has no picture"
        )
    elif isinstance(result, Report):
        out.print(doctor_report(result))
    elif isinstance(result, TransferResult):
        out.print(render.transfer_result(result))
    else:
        out.print(render.measurement(result))


def show_run(report: Any, plot_path: Path | None, html_path: Path | None) -> None:
    """A saved ``feedrate run`` report: the console report as the run printed it at its end,
    then its stall timeline as a PNG (``plot_path``) and as the run's HTML page (``html_path``),
    matplotlib checked for before anything prints."""
    from feedrate.render.run import check_plotting, run_report, timeline_png, write_html

    if plot_path is not None or html_path is not None:
        check_plotting()
    out.print(run_report(report))
    if plot_path is not None:
        plot_path.write_bytes(timeline_png(report))
        err.print(f"wrote {plot_path}")
    if html_path is not None:
        write_html(report, html_path)
        err.print(f"wrote {html_path}")


class TuneProgress:
    """Live progress on stderr: the trial running, the budget left, a line per finished trial."""

    def __init__(self, budget_s: float) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.budget_s = budget_s
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[left]}"),
            console=err,
            transient=True,
        )
        self.task = self.bar.add_task("loading", total=budget_s, left="")

    def __enter__(self) -> TuneProgress:
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
            what = f"{rate(t.median)} samples/s {noise_of(t)}"
        self.bar.console.print(
            f"  {t.config.label():32s} {what}  [dim]({t.reason})[/dim]", highlight=False
        )


def load(target: str, script_args: tuple[str, ...] = (), argv: list[str] | None = None) -> Any:
    """The TARGET's DataLoader, or, where NAME is a function, a factory that builds a fresh one
    for each run (``load_source``); the script sees ``script_args`` as its arguments, those
    after ``--`` in ``argv`` (the command line): a word before it is refused, not passed on.
    They stay its ``sys.argv`` for the rest of the command: workers started by spawn or
    forkserver import the script again, with the argv of the process that starts them."""
    from feedrate.loader.target import load_source, parse_target

    line = argv or []
    after = line[line.index("--") + 1 :] if "--" in line else []
    stray = script_args[: len(script_args) - len(after)] if after else script_args
    if stray:  # a word before --: click hands it over with the script's
        raise UserError(
            f"unexpected argument {stray[0]!r}: a script's own arguments go after -- "
            f"(TARGET -- {shlex.join(script_args)})"
        )
    # As `python -m` does: a package.module target is looked up from the current directory too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    spec = parse_target(target, script_args)
    loaded = load_source(spec)
    sys.argv = [spec.location, *spec.args]
    return loaded


def shown_target(target: str, script_args: tuple[str, ...]) -> str:
    """The TARGET as reports show it: with the script's arguments, as they were given."""
    return f"{target} -- {shlex.join(script_args)}" if script_args else target
