"""Starting the user's command so that every Python process it starts is observed, and giving
it the terminal and the signals as if it had been started alone.

The command runs as a child process in a process group of its own, with ``PYTHONPATH``
leading to a folder whose ``sitecustomize.py`` starts ``agent`` and then chains to any
``sitecustomize`` the interpreter had (the folder leaves ``sys.path`` again at once). Its
stdin, stdout and stderr are feedrate's own. On a terminal its group becomes the foreground
one, so Ctrl-C, Ctrl-Z and terminal reads reach it as they would without feedrate; SIGINT,
SIGTERM and SIGHUP sent to feedrate are passed on to its group (once: the same signal again
within ``REPEAT_S`` is one delivery made twice). After an interrupt, what is left of the group is
stopped (SIGTERM, then SIGKILL), so no process outlives the run.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from types import FrameType

from feedrate.errors import UserError
from feedrate.running.agent import ENV_AUTOTUNE, ENV_DIR, ENV_T0

USAGE = (
    "feedrate run train.py [ARGS], feedrate run -m package.module [ARGS], "
    "or feedrate run -- COMMAND [ARGS]"
)
_FEEDRATE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITECUSTOMIZE = f'''"""Written by feedrate run: starts its observer in this process, after this
Python's own sitecustomize, if it has one."""
import os as _os
import sys as _sys


def _feedrate_run():
    here = _os.path.dirname(_os.path.abspath(__file__))
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    ours = _sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (this Python's own)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        _sys.modules["sitecustomize"] = ours
    try:
        from feedrate.running import agent
    except ImportError:
        _sys.path.append({_FEEDRATE_PARENT!r})
        try:
            from feedrate.running import agent
        except ImportError:
            return
    agent.start()


try:
    _feedrate_run()
finally:
    del _feedrate_run
'''
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: After an interrupt, the command's remaining processes get this long to exit on SIGTERM.
GRACE_S = 5.0
#: The same signal again within this many seconds is one delivery made twice, not passed on
#: again: ``timeout`` signals its child and then its own process group (feedrate in it), and
#: the second copy reached DataLoader workers already exiting on the first (a traceback each).
REPEAT_S = 0.5


def command_of(args: Sequence[str], module: bool = False) -> list[str]:
    """The command line to run: a script with this Python, ``-m module`` with this Python,
    or a command as given. Raises ``UserError`` for no command, a script or command that does
    not exist, or a module that cannot be found."""
    if not args:
        raise UserError(f"no script or command given: {USAGE}")
    first = args[0]
    if module:
        if not module_found(first):
            raise UserError(f"no module named {first!r} (from {os.getcwd()} and sys.path)")
        return [sys.executable, "-m", *args]
    if first.endswith(".py") or (os.path.isfile(first) and not os.access(first, os.X_OK)):
        if not os.path.isfile(first):
            raise UserError(f"no such script: {first}")
        return [sys.executable, *args]
    found = found_command(first)
    folder = os.path.isfile(os.path.join(first, "__main__.py"))  # python runs its __main__
    if folder and (found is None or os.sep in first):  # a command of that name comes first
        return [sys.executable, *args]
    if found is None:
        raise UserError(f"no such script or command: {first}")
    return [found, *args[1:]]


def found_command(name: str) -> str | None:
    """``name`` as the shell would run it: a path, or found on ``PATH``, else beside this
    Python (a virtual environment's ``torchrun`` when the environment is not activated)."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def module_found(name: str) -> bool:
    """Whether ``python -m name`` would find ``name`` from the current folder, without
    importing anything (a package's ``__init__`` is not run)."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    spec: ModuleSpec | None = PathFinder.find_spec(parts[0], [os.getcwd(), *sys.path])
    for i in range(1, len(parts)):
        where = None if spec is None else spec.submodule_search_locations
        if where is None:
            return False
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(where))
    return spec is not None or parts[0] in sys.builtin_module_names


def prepare(folder: str, *, autotune: bool) -> dict[str, str]:
    """Write the ``sitecustomize`` into ``folder/site`` and return the environment for the
    command: reports go to ``folder/reports``."""
    site, reports = os.path.join(folder, "site"), os.path.join(folder, "reports")
    os.makedirs(site)
    os.makedirs(reports)
    with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as fh:
        fh.write(SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    env[ENV_DIR] = reports
    env[ENV_T0] = repr(time.time())
    env.pop(ENV_AUTOTUNE, None)
    if autotune:
        env[ENV_AUTOTUNE] = "1"
    return env


@dataclass
class Outcome:
    """How the command ended: its exit status as a shell reports it (128 + N for signal N),
    the signal that ended it or that feedrate passed on, if any, the wall time (s), and
    whether it was interrupted (Ctrl-C, SIGTERM, SIGHUP)."""

    exit_code: int
    signal: int | None
    wall_s: float
    interrupted: bool = False


def run(argv: list[str], env: dict[str, str]) -> Outcome:
    """Run ``argv`` to its end (see the module's docstring)."""
    tty = _foreground_tty()
    began = time.perf_counter()
    taken: list[int] = []
    started: list[int] = []  # the command's pid (and process group), once it exists
    passed: dict[int, float] = {}  # signal → when it was last passed on (or taken, before)

    def forward(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if now - passed.get(signum, -math.inf) < REPEAT_S:
            return  # the same delivery, made twice
        passed[signum] = now
        taken.append(signum)
        if started:
            _signal_group(started[0], signum)

    with _handlers(forward):
        try:
            proc = subprocess.Popen(argv, env=env, preexec_fn=_child_setup(tty))
        except OSError as exc:
            raise UserError(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc
        started.append(proc.pid)
        with contextlib.suppress(OSError):
            os.setpgid(proc.pid, proc.pid)  # as the child itself does: no race with a signal
        for early in list(taken):  # arrived while it was starting
            _signal_group(proc.pid, early)
        try:
            code = _wait(proc, tty)
        finally:
            if tty is not None:
                _take_terminal(tty)
    handled = bool(taken) and code == 0  # the script caught the signal and ended as usual
    interrupted = (bool(taken) and not handled) or -code in FORWARDED
    if taken or code < 0:  # a crash (SIGSEGV, SIGKILL) too leaves its workers behind
        _stop_group(proc.pid)
    ended_by = taken[0] if taken and not handled else (-code if code < 0 else None)
    exit_code = 128 - code if code < 0 else code
    if taken and exit_code != 0:
        exit_code = 128 + taken[0]  # stopped by the signal passed on: say so, as a shell would
    return Outcome(exit_code, ended_by, time.perf_counter() - began, interrupted)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signum)


def _wait(proc: subprocess.Popen[bytes], tty: int | None) -> int:
    """The command's exit status (negative: the signal that ended it). Ctrl-Z on the terminal
    stops the command's group: feedrate then stops too, as a shell expects of its job, and on
    ``fg`` hands the terminal back and continues the command."""
    while True:
        try:
            _, status = os.waitpid(proc.pid, os.WUNTRACED)
        except ChildProcessError:
            return proc.wait()
        if not os.WIFSTOPPED(status):
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode
        if tty is not None:
            _take_terminal(tty)
            os.kill(os.getpid(), signal.SIGSTOP)  # until the shell's fg continues us
            _give_terminal(tty, proc.pid)
            _signal_group(proc.pid, signal.SIGCONT)


def _foreground_tty() -> int | None:
    """stdin's terminal, when feedrate runs in its foreground process group."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _child_setup(tty: int | None) -> Callable[[], None]:
    def setup() -> None:
        os.setpgid(0, 0)
        if tty is not None:
            _take_terminal(tty)

    return setup


def _take_terminal(tty: int) -> None:
    """Make this process's group the terminal's foreground group (as a shell does)."""
    _give_terminal(tty, os.getpgrp())


def _give_terminal(tty: int, pgid: int) -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


@contextlib.contextmanager
def _handlers(handler: object) -> Iterator[None]:
    previous = {s: signal.signal(s, handler) for s in FORWARDED}  # type: ignore[arg-type]
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def _stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """Stop what is left of the command's process group: SIGTERM, then SIGKILL."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + (grace_s if signum == signal.SIGTERM else 2.0)
        try:
            os.killpg(pgid, signum)
        except OSError:
            return  # nobody left
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except OSError:
                return
            time.sleep(0.05)
