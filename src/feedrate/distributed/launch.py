"""Start the ranks of a job on this machine, as torchrun's standalone mode would, for
``feedrate tune TARGET --nproc-per-node N``: each rank a process running the same command, with
the environment ``torch.distributed``'s ``env://`` initialization reads (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), and ``OMP_NUM_THREADS=1`` where unset, as torchrun sets it for several ranks.

The ranks share this terminal (a Ctrl-C reaches all of them); SIGTERM or SIGHUP sent to this
process is passed on to them, a SIGINT too where it did not come from the terminal (after
``INTERRUPT_FORWARD_S``), and on Linux they are sent SIGTERM when this process
dies of a signal it cannot handle (SIGKILL: ``kill -9``, the OOM killer). When one rank ends
with an error, the others are given ``GRACE_S`` to end on their own (they learn of it at their
next collective), then terminated; none is left running when this returns.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from feedrate.measuring import interrupts

#: Seconds the other ranks get to end by themselves after one failed.
GRACE_S = 15.0

#: Seconds the ranks get to end on a Ctrl-C (it reached them too) before SIGTERM.
INTERRUPT_GRACE_S = 10.0

#: Seconds after a SIGINT not from the terminal before it is passed on to the ranks still
#: running: one sent to this process alone (``kill -INT``, a job scheduler) reached only it,
#: one sent to its process group (``kill -INT -PGID``) reached them too, and they end within
#: about this.
INTERRUPT_FORWARD_S = 2.0

#: Seconds between SIGTERM and SIGKILL for a rank that does not end.
KILL_AFTER_S = 5.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for rank 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, ranks: int, port: int) -> dict[str, str]:
    """The environment of rank ``rank`` of ``ranks`` on this one node."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(ranks),
        LOCAL_WORLD_SIZE=str(ranks),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


def run_ranks(command: Sequence[str], ranks: int, *, grace_s: float = GRACE_S) -> int:
    """Run ``command`` as ``ranks`` ranks on this machine and wait for all of them. Returns the
    exit status of the first rank that failed (by the time it failed), else 0."""
    port = free_port()
    orphan = _ended_with(os.getpid())
    procs = [
        subprocess.Popen(list(command), env=rank_env(r, ranks, port), preexec_fn=orphan)
        for r in range(ranks)
    ]
    failed_code: int | None = None
    deadline: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            if failed_code is None:
                failed_code = next((p.returncode for p in procs if p.returncode), None)
                if failed_code is not None:
                    deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        # A Ctrl-C on the terminal reached them too (a second and third are the user's own);
        # a signal sent to this process alone (kill, a closed terminal's SIGHUP) is passed on,
        # so they end as soon: a SIGINT after ``INTERRUPT_FORWARD_S``, to those still running
        # (one that had it already takes a second during its clean-up as said).
        signum = interrupts.last_signal() or signal.SIGINT
        if signum != signal.SIGINT or not _terminal_foreground():
            if signum == signal.SIGINT:
                _wait_all(procs, INTERRUPT_FORWARD_S)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)
        _wait_all(procs, INTERRUPT_GRACE_S)
        raise
    finally:
        stop(procs)
    if failed_code is None:
        failed_code = next((p.returncode for p in procs if p.returncode), 0)
    return _status(failed_code)


#: prctl(2)'s option that has the kernel signal a process when its parent dies.
_PR_SET_PDEATHSIG = 1


def _ended_with(launcher: int) -> Callable[[], None] | None:
    """For a rank (``preexec_fn``): SIGTERM when ``launcher`` dies, where the kernel offers it
    (Linux). The rank then stops its workers as on any SIGTERM; before, a launcher killed with
    SIGKILL left its ranks tuning, and printing into the terminal, for a minute or more."""
    if not sys.platform.startswith("linux"):
        return None

    def die_with_launcher() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != launcher:  # it died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_launcher


def _terminal_foreground() -> bool:
    """This process is in its terminal's foreground process group, the ranks with it: a SIGINT
    is then a Ctrl-C, which reached them all."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """End every rank still running: SIGTERM (feedrate stops its workers on it), then SIGKILL."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.send_signal(signal.SIGTERM)
    end = time.monotonic() + KILL_AFTER_S
    for p in running:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _status(code: int) -> int:
    """A rank killed by signal N reads as a shell would say it, 128 + N."""
    return 128 - code if code < 0 else code
