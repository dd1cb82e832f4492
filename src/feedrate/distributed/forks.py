"""Forks that do not deadlock beside ``torch.distributed``'s threads, on the Pythons that need it.

On CPython before 3.8.20, 3.9.20, 3.10.15 and 3.11.10 (gh-112275), a child of ``os.fork()``
hangs for good inside the fork itself, before any of its Python code runs, if at that instant
another thread held the interpreter's lock on its list of thread states. A thread holds it
without the GIL only while it makes a Python thread state for itself: ``torch.distributed``'s
C++ threads do that each time they release the last reference to a tensor that Python let go
of (gloo's worker threads, after every collective, as they free the collective's tensors; seen
with gdb; NCCL's threads free tensors too, not observed here without a GPU). A DataLoader worker
forked within those microseconds never starts,
and the loader waits for its batches for ever. In a job where the ranks talk after every step
(training's all-reduce, autotune's own calls just before a lane starts its workers), that was
about one lane start in 500 on a busy machine; and 10 forks in 21,000 beside a loop of
all-reduces (``benchmarks/fork_guard.py``).

``guard_forks`` makes each fork of this process, while ``torch.distributed`` is initialized,
first wait until no thread that Python does not know (a C++ thread: holding that lock, it is
running or waiting for a CPU, never asleep; nothing under the lock sleeps) is running, for
``FORK_WAIT_S`` at most. Threads Python runs are left out: they take that lock only while
holding the GIL, which the forking thread holds, and the last look keeps the GIL until the fork
(``read_holding_gil``). It makes the hang rarer, not impossible: a C++ thread woken by
something other than Python (a packet for an asynchronous collective) between the last look
and the fork can still take the lock. Where the fix is in Python, or ``/proc`` cannot be read,
nothing is installed.
"""

from __future__ import annotations

import _thread
import ctypes
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: The longest a fork waits for busy C++ threads (s): a thread that spins (a communication
#: library's progress thread in the middle of a transfer) costs each fork this much at most.
#: A thread in the window leaves it in microseconds once it has a CPU.
FORK_WAIT_S = 0.1

#: How often a waiting fork looks again (s); the sleep also lets such a thread have the GIL.
POLL_S = 0.0005

#: The first release of each affected line that carries the fix (gh-112275).
FIXED = {(3, 8): 20, (3, 9): 20, (3, 10): 15, (3, 11): 10}

_installed = False


def affected(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    """Whether this Python's child of a fork can inherit that lock held (gh-112275)."""
    line = (version[0], version[1])
    if line >= (3, 12):
        return False
    fixed = FIXED.get(line)
    return fixed is None or version[2] < fixed


def guard_forks() -> bool:
    """Install the wait before every fork of this process (once; a no-op where the Python is
    fixed or ``/proc/self/task`` cannot be read). Whether it is installed."""
    global _installed
    if _installed:
        return True
    if not affected() or not hasattr(os, "register_at_fork") or not _readable():
        return False
    _libc()  # loaded now, not inside a fork
    os.register_at_fork(before=_before_fork)
    _installed = True
    return True


def _readable() -> bool:
    try:
        return bool(os.listdir("/proc/self/task"))
    except OSError:
        return False


def _before_fork() -> None:
    # A fork hook must never fail the fork: any trouble reading /proc, and it goes ahead.
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not (dist.is_available() and dist.is_initialized()):
            return
        known = python_threads()
        wait_quiet(lambda: busy_threads(known), FORK_WAIT_S)
    except KeyboardInterrupt:
        _thread.interrupt_main()  # a hook's exception is only printed: Ctrl-C comes again
    except Exception:
        return


def python_threads() -> set[int]:
    """The native ids of the threads Python runs (started by ``threading``, or the main one).
    A C++ thread that once ran Python code asking for its thread is there too, as a dummy
    thread, for good: it is not left out. Read without ``threading``'s lock, which a fork from
    a signal handler could find held by the thread it interrupted."""
    active = getattr(threading, "_active", None)
    threads = list(active.values()) if isinstance(active, dict) else threading.enumerate()
    dummy = getattr(threading, "_DummyThread", ())
    return {t.native_id for t in threads if t.native_id is not None and not isinstance(t, dummy)}


def wait_quiet(
    busy: Callable[[], set[int]],
    limit_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> set[int]:
    """Wait until ``busy()`` is empty, ``limit_s`` at most: the threads still busy at the end
    (empty when it went quiet in time)."""
    deadline = clock() + limit_s
    while True:
        now_busy = busy()
        if not now_busy or clock() >= deadline:
            return now_busy
        sleep(POLL_S)


def busy_threads(
    known: set[int],
    task_dir: str = "/proc/self/task",
    read: Callable[[str], bytes | None] | None = None,
) -> set[int]:
    """This process's threads, outside ``known``, that are running or waiting for a CPU (or in
    an uninterruptible wait): every state but asleep, stopped, idle or gone. Their states are
    read with ``read`` (default ``read_holding_gil``), so that once this finds none busy no
    other Python thread has run since: one that had (its blocking I/O returning) could let go
    of a tensor whose last reference a C++ thread then frees, making a thread state."""
    read = read or read_holding_gil
    out = set()
    for name in os.listdir(task_dir):
        tid = int(name)
        if tid in known:
            continue
        stat = read(f"{task_dir}/{name}/stat")
        if stat is None:
            continue  # ended meanwhile
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]  # after "tid (comm) "
        if state not in (b"S", b"T", b"t", b"I", b"Z", b"X", b""):
            out.add(tid)
    return out


def read_holding_gil(path: str) -> bytes | None:
    """The first 512 bytes of ``path``, read by libc through ``ctypes.PyDLL``, which keeps the
    GIL (Python's own file reads let it go); None where it cannot be read."""
    libc = _libc()
    if libc is None:
        try:
            with open(path, "rb") as fh:
                return fh.read(512)
        except OSError:
            return None
    fd = libc.open(path.encode(), os.O_RDONLY)
    if fd < 0:
        return None
    try:
        buf = ctypes.create_string_buffer(512)
        n = libc.read(fd, buf, 512)
        return buf.raw[:n] if n > 0 else None
    finally:
        libc.close(fd)


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.PyDLL(None)  # this process's libc; PyDLL: calls keep the GIL
        libc.open.argtypes, libc.open.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
        libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        libc.read.restype = ctypes.c_ssize_t
        libc.close.argtypes, libc.close.restype = [ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc
