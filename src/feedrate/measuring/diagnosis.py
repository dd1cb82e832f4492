"""What a pipeline's failure means, in words a user can act on: ``explain`` maps what DataLoader
raised (the user's exception, a killed worker) to a ``PipelineError`` naming the cause, where
it happened (the sample index or the batch being collated, the worker, the user's frames) and,
for failures known from their words, the fix (``hint``)."""

from __future__ import annotations

import re
import signal
import sysconfig
import time
import traceback
from types import TracebackType

from feedrate.errors import PipelineError, WorkerKilledError
from feedrate.measuring.inner import worker_handles

#: The notes ``failures.IndexReportingDataset`` and ``IndexReportingCollate`` add to an
#: exception (they survive the trip from a worker inside DataLoader's re-raised message).
NOTE = "feedrate: while loading sample index "
COLLATE_NOTE = "feedrate: while collating the batch of sample indices "
#: DataLoader's words when a worker died.
WORKER_DIED = re.compile(r"DataLoader worker \(pid.*(exited unexpectedly|killed by signal)")


#: What to do when /dev/shm runs out (workers hand every batch over through it).
SHM_ADVICE = (
    "/dev/shm is too small for the batches in flight (num_workers × prefetch_factor of them): "
    "give it more room (docker run --shm-size=2g, or --ipc=host; on Kubernetes an emptyDir with "
    "medium: Memory mounted at /dev/shm), or use fewer workers or a shallower queue (lower "
    "num_workers or prefetch_factor); the file_system sharing strategy does not help, its files "
    "live in /dev/shm too"
)
#: What DataLoader and torch say when /dev/shm runs out: a worker cannot allocate (or write)
#: the shared file of a batch, or touches a page tmpfs cannot back (a bus error).
SHM_EXHAUSTED = re.compile(
    r"unable to allocate shared memory|unable to (write to|open shared memory object|mmap)"
    r"[^\n]*</torch_|No space left on device \(28\)|killed by signal: Bus error|\bSIGBUS\b"
)


def shm_exhausted(text: str) -> bool:
    """Whether a failure's words say /dev/shm ran out (see ``SHM_EXHAUSTED``)."""
    return SHM_EXHAUSTED.search(text) is not None


_SIGNAL_CAUSES = {
    signal.SIGBUS: f"a bus error: {SHM_ADVICE}",
    signal.SIGKILL: "most likely the out-of-memory killer; lower num_workers or the memory each "
    "worker holds",
    signal.SIGSEGV: "a crash in native code inside the worker, often a library that is not "
    "fork-safe (initialize it in worker_init_fn) or a corrupt input",
    signal.SIGTERM: "terminated from outside (a job scheduler or a person)",
}


def _worker_deaths(iterator: object) -> list[tuple[int, int | None, int]]:
    """(worker_id, pid, exit code) of each worker that has exited abnormally."""
    out = []
    for worker_id, proc in enumerate(worker_handles(iterator)):
        code = getattr(proc, "exitcode", None)
        if code is not None and code != 0:
            out.append((worker_id, getattr(proc, "pid", None), code))
    return out


_KILLED_BY = re.compile(r"pid (\d+)\) is killed by signal: ([^.]+)")


def _deaths_from_text(text: str) -> list[tuple[int, int | None, int]]:
    """DataLoader's own words, for when the exit status cannot be read (already reaped)."""
    found = _KILLED_BY.search(text)
    if not found:
        return []
    by_description = {signal.strsignal(s): s for s in signal.Signals}
    sig = by_description.get(found.group(2).strip())
    return [] if sig is None else [(-1, int(found.group(1)), -int(sig))]


def _await_deaths(iterator: object, timeout_s: float) -> list[tuple[int, int | None, int]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deaths = _worker_deaths(iterator)
        if deaths:
            return deaths
        time.sleep(0.02)
    return []


def _killed_message(deaths: list[tuple[int, int | None, int]], fallback: str) -> str:
    if not deaths:
        return f"a DataLoader worker died: {fallback}"
    worker_id, pid, code = deaths[0]
    who = (
        f"DataLoader worker {worker_id} (pid {pid})"
        if worker_id >= 0
        else f"DataLoader worker (pid {pid})"
    )
    if code < 0:
        sig = signal.Signals(-code)
        cause = _SIGNAL_CAUSES.get(sig, "see the worker's own output above")
        what = f"was killed by {sig.name}: {cause}"
    else:
        what = f"exited with status {code}"
    n = len(deaths) - 1
    more = f" ({n} more worker{'s' if n > 1 else ''} died too)" if n else ""
    return f"{who} {what}{more}"


_CAUGHT = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _user_frames_from_text(text: str) -> list[str]:
    frames = [f"{f}:{line} in {fn}" for f, line, fn in _FRAME.findall(text)]
    return [f for f in frames if _is_user_file(f.split(":")[0])][-3:]


def _user_frames(tb: TracebackType | None) -> list[str]:
    frames = traceback.extract_tb(tb)
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames if _is_user_file(f.filename)][
        -3:
    ]


_STDLIB = sysconfig.get_paths()["stdlib"]


def _is_user_file(filename: str) -> bool:
    markers = ("/torch/", "/feedrate/", "<frozen")
    return not filename.startswith(_STDLIB) and not any(m in filename for m in markers)


def _original_line(exc: BaseException) -> str:
    """The original exception's own message: DataLoader re-raises a worker's exception with the
    whole worker traceback as its message; the line after it names the exception."""
    text = str(exc)
    name = type(exc).__name__
    lines = [ln for ln in text.splitlines() if ln.startswith(f"{name}:") or ln == name]
    if lines:
        return lines[-1]
    first = text.splitlines()[0] if text else ""
    return f"{name}: {first}" if first else name


def _where_noted(exc: BaseException) -> str:
    """Where the failure happened, from feedrate's notes (they survive the trip from a worker
    inside DataLoader's re-raised message): " at sample index 5", " while collating ..."."""
    notes: list[str] = [*getattr(exc, "__notes__", []), *str(exc).splitlines()]
    for n in reversed(notes):
        if n.startswith(COLLATE_NOTE):
            return " " + n.removeprefix("feedrate: ")
        if n.startswith(NOTE):
            return f" at sample index {n[len(NOTE) :]}"
    return ""


#: Failures whose cause is known from their words, with what to do about each.
_HINTS = (
    (SHM_EXHAUSTED, SHM_ADVICE),
    (
        re.compile(r"Too many open files|\[Errno 24\]"),
        "the open-file limit is too low for the workers and the batches in flight: raise it "
        "(ulimit -n 65536) or share tensors through files "
        "(torch.multiprocessing.set_sharing_strategy('file_system'))",
    ),
    (
        re.compile(
            r"Can't pickle|cannot pickle|Can't get attribute|PicklingError|"
            r"pickle.*local object|not picklable"
        ),
        "under spawn or forkserver every worker gets a pickled copy of the dataset: define the "
        "dataset (and collate_fn, worker_init_fn) at module level in an importable file, and "
        "open files, connections and clients lazily in the worker (in __getitem__ or "
        "worker_init_fn), not in __init__",
    ),
)


def hint(text: str) -> str | None:
    """What to do about a failure known from its words, or None."""
    return next((advice for pattern, advice in _HINTS if pattern.search(text)), None)


def explain(exc: BaseException, iterator: object) -> PipelineError | None:
    """A ``PipelineError`` describing ``exc`` raised while iterating, or None when ``exc`` is not
    a pipeline failure (e.g. a KeyboardInterrupt, or already a feedrate error)."""
    if isinstance(exc, PipelineError) or not isinstance(exc, Exception):
        return None
    text = str(exc)
    deaths = _worker_deaths(iterator)
    if not deaths and isinstance(exc, EOFError | ConnectionError):
        # The pipe broke because a worker is dying; its exit status shows a moment later.
        deaths = _await_deaths(iterator, timeout_s=2.0)
    # A worker's death surfaces as DataLoader's RuntimeError, or as whatever broke first in the
    # main process (a connection reset while receiving the dead worker's tensor).
    if WORKER_DIED.search(text) or (deaths and not _CAUGHT.search(text)):
        deaths = [d for d in deaths if d[2] != -signal.SIGTERM] or deaths or _deaths_from_text(text)
        return WorkerKilledError(_killed_message(deaths, text.splitlines()[0] if text else ""))
    caught = _CAUGHT.search(text)
    where = f" in worker {caught.group(2)}" if caught else " in the main process"
    frames = _user_frames_from_text(text) if caught else _user_frames(exc.__traceback__)
    at_frames = f" (at {'; '.join(frames)})" if frames else ""
    advice = hint(text)
    fix = f": {advice}" if advice else ""
    return PipelineError(
        f"the pipeline raised {_original_line(exc)}{_where_noted(exc)}{where}{at_frames}{fix}"
    )
