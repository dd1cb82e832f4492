"""Ctrl-C that always stops a long run.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives. Inside code
that may not raise, the exception is printed as "Exception ignored" and lost: a handler
``os.fork`` runs in the parent after starting a DataLoader worker (logging's lock release), an
object's ``__del__`` (an iterator shutting its workers down). A tune interrupted at such a moment
used to go on measuring. So while ``stoppable()`` is in force the signal is also remembered, and
the measuring loops call ``check()`` at every batch and trial: a lost interrupt is raised again
there, and the usual clean-up (workers stopped, partial results kept) follows.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_seen = False
_last: int | None = None  # the last signal taken, kept after stoppable() ends


_taken = 0  # signals taken while stoppable() is in force

#: The signals ``stoppable()`` may take over.
_STOPPING = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The first signal raises; a second, while that one's clean-up stops the workers, is only
    remembered (raising again there would cut the clean-up short and print a traceback); a
    third raises again, for a user who insists."""
    global _seen, _last, _taken
    _seen, _last = True, signum
    _taken += 1
    if _taken == 2:
        return
    raise KeyboardInterrupt


def _remember(signum: int, frame: FrameType | None) -> None:
    global _seen, _last
    _seen, _last = True, signum


def last_signal() -> int | None:
    """The signal that last stopped a run under ``stoppable()`` (SIGINT, SIGTERM or SIGHUP),
    if any: a command line exits 128 + its number (130, 143, 129)."""
    return _last


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a signal arrived under ``stoppable()`` (raised once, and
    maybe lost where it landed)."""
    if _seen:
        raise KeyboardInterrupt


@contextmanager
def stoppable(*, sigterm: bool = False) -> Iterator[None]:
    """Within: SIGINT (and SIGTERM, and SIGHUP where it is left to its default, if asked)
    raises ``KeyboardInterrupt`` and is remembered for ``check()``: a closed terminal stops a
    run as Ctrl-C does, its workers stopped. SIGINT is taken over only where Python's own
    handler is in place (a program with its own is left alone); outside the main thread
    nothing changes. Nests."""
    global _seen, _taken
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt)
    if sigterm:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _interrupt)
        hup = getattr(signal, "SIGHUP", None)  # not on Windows
        if hup is not None and signal.getsignal(hup) is signal.SIG_DFL:
            previous[hup] = signal.signal(hup, _interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if previous:  # the outermost: what it remembered ends with it
            _seen, _taken = False, 0


@contextmanager
def deferred() -> Iterator[None]:
    """Within (under ``stoppable()``): a signal is only remembered, and raised on the way out.
    For code that must not be cut in half: DataLoader's iterator constructor forks the workers,
    and an iterator interrupted halfway can be neither used nor shut down (its workers are
    unreachable until exit, and its ``__del__`` fails noisily)."""
    ours = [s for s in _STOPPING if signal.getsignal(s) is _interrupt]
    if threading.current_thread() is not threading.main_thread() or not ours:
        yield
        return
    for signum in ours:
        signal.signal(signum, _remember)
    try:
        yield
    finally:
        for signum in ours:
            signal.signal(signum, _interrupt)
    check()
