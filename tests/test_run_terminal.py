"""``feedrate run`` on a real terminal (a pseudo-terminal): the script's process group gets the
terminal, so Ctrl-C typed reaches it once, as without feedrate, and Ctrl-Z stops the job until
it is continued."""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest

pty = pytest.importorskip("pty", reason="no pseudo-terminals on this platform")

TRAIN = Path(__file__).resolve().parent / "run_scripts" / "train.py"


class Terminal:
    """``feedrate run ARGS`` with a pseudo-terminal as its controlling terminal."""

    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become feedrate
            os.execv(sys.executable, [sys.executable, "-m", "feedrate", "run", *args])
        self.poll = select.poll()
        self.poll.register(self.fd, select.POLLIN)
        self.seen = b""

    def read_until(self, word: bytes, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while word not in self.seen and time.monotonic() < deadline:
            ready = self.poll.poll(200)  # not select(): it refuses descriptors past 1023
            if ready:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:  # the terminal closed: everyone left
                    break
        return word in self.seen

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait(self, flags: int = 0) -> int:
        _, status = os.waitpid(self.pid, flags)
        return status

    def close(self) -> None:
        os.close(self.fd)


def test_ctrl_c_typed_on_the_terminal_reaches_the_script_once() -> None:
    term = Terminal(str(TRAIN), "--hang", "--batches", "3")
    try:
        assert term.read_until(b"hanging")
        term.type(b"\x03")
        assert term.read_until(b"feedrate run")
        assert os.waitstatus_to_exitcode(term.wait()) == 130
        text = term.seen.decode(errors="replace")
        assert text.count("KeyboardInterrupt") == 1  # one SIGINT, not one from feedrate too
        assert "During handling of the above exception" not in text
    finally:
        term.close()


def test_ctrl_z_stops_the_job_and_it_continues() -> None:
    term = Terminal(str(TRAIN), "--step-s", "0.3", "--batches", "6", "--print-batches")
    try:
        assert term.read_until(b"batch [")
        term.type(b"\x1a")
        assert os.WIFSTOPPED(term.wait(os.WUNTRACED))  # the shell sees its job stopped
        term.read_until(b"<never printed>", timeout_s=0.3)  # what was on its way
        printed = term.seen.count(b"batch [")
        term.read_until(b"<never printed>", timeout_s=1.0)  # 3 steps, were it running
        assert term.seen.count(b"batch [") == printed  # the script is stopped too
        os.kill(term.pid, signal.SIGCONT)  # what `fg` does
        assert term.read_until(b"feedrate run")
        assert os.waitstatus_to_exitcode(term.wait()) == 0
        assert term.seen.count(b"batch [") == 6
    finally:
        term.close()
