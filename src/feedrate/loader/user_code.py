"""The user's code run while loading a TARGET, and what it raises told in one line: the
exception's type and first line, and where in the user's own files it was raised (not in
feedrate, importlib's bootstrap, the standard library or installed packages, unless nothing
else is left)."""

from __future__ import annotations

import os
import shlex
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from feedrate.errors import TargetError

_T = TypeVar("_T")
_MAX_FRAMES = 4  # the deepest user frames shown in one-line error messages
_MAX_MESSAGE = 160  # characters of the user's exception message shown
_FEEDRATE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
_STDLIB_DIRS = {os.path.realpath(sysconfig.get_path(k)) + os.sep for k in ("stdlib", "platstdlib")}

#: Advice for what a TARGET's own code raises because feedrate runs it (by words of the error).
_ADVICE = {
    "initialize the default process group twice": (
        "feedrate joined the job's process group before importing it (under torchrun or "
        "--nproc-per-node): guard the call, if not torch.distributed.is_initialized(): "
        "torch.distributed.init_process_group(...), or move it under "
        'if __name__ == "__main__":'
    ),
}


def run_user(target: object, action: str, fn: Callable[[], _T]) -> _T:
    """Run the user's code; turn what it raises into a one-line TargetError (cause kept), which
    names ``target`` (what was being loaded: a TARGET) and ``action``.

    TargetError passes through; KeyboardInterrupt propagates; SystemExit becomes a TargetError.
    """
    try:
        return fn()
    except TargetError:
        raise
    except SystemExit as exc:
        where = where_in_user_code(exc)
        given = getattr(target, "args", ())
        advice = (
            ""
            if "import" not in action
            else f" with the arguments it was given (args: {clip(shlex.join(given))})"
            if given
            else ": give the script its own arguments (args), or guard its script code with "
            'if __name__ == "__main__"'
        )
        code = clip(repr(exc.code))
        said = f"{target}: {action} called sys.exit({code}){where}{advice}"
        raise TargetError(said, params=("args",) if advice else ()) from exc
    except Exception as exc:
        said = f"{summary(exc)}{where_in_user_code(exc)}"
        advice = next((f": {a}" for words, a in _ADVICE.items() if words in str(exc)), "")
        raise TargetError(f"{target}: {action} raised {said}{advice}") from exc


def summary(exc: BaseException) -> str:
    """``Type: first line of the message``, truncated to _MAX_MESSAGE characters."""
    try:
        text = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    except Exception:  # a user's __str__ can fail too
        text = ""
    first = clip(text)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def clip(text: str) -> str:
    """The first line of ``text``, at most _MAX_MESSAGE characters; '...' marks what was cut."""
    lines = [line.strip() for line in text.strip().splitlines()]
    first = lines[0] if lines else ""
    if len(first) > _MAX_MESSAGE:
        return first[: _MAX_MESSAGE - 3] + "..."
    return first + " ..." if len(lines) > 1 else first


def where_in_user_code(exc: BaseException) -> str:
    """`` (at file:line in func; ...)`` for the deepest user frames, or '' when there are none."""
    places = [f"{display_path(f.filename)}:{f.lineno} in {f.name}" for f in user_frames(exc)]
    if isinstance(exc, SyntaxError) and exc.filename:
        places.append(f"{display_path(exc.filename)}:{exc.lineno}")
    return f" (at {'; '.join(places[-_MAX_FRAMES:])})" if places else ""


def user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """Frames outside importlib's bootstrap and feedrate; of those, the ones outside the standard
    library and installed packages when there are any (else all, so a failure in an installed
    package still has a location)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if origin(f.filename) != "ours"]
    own = [f for f in frames if origin(f.filename) == "user"]
    return own or frames


def origin(filename: str) -> Literal["ours", "library", "user"]:
    """'ours' for importlib's frozen bootstrap and feedrate, 'library' for the standard library
    and installed packages, else 'user'."""
    real = os.path.realpath(filename)
    if filename.startswith("<") or real.startswith(_FEEDRATE_DIR):
        return "ours"
    parts = Path(real).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return "library"
    return "library" if any(real.startswith(d) for d in _STDLIB_DIRS) else "user"


def display_path(filename: str) -> str:
    """Relative to the working directory when under it, else as recorded."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith(os.pardir) else relative
