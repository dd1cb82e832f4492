"""Findings about threads inside workers (``feedrate.threaded``): blocked by the safety check,
measured better but not allowed, or chosen. Pure functions of the trials and the check."""

from __future__ import annotations

from feedrate.results.evidence import ThreadCheck
from feedrate.results.findings import Finding, FindingDoc
from feedrate.results.trial import Trial
from feedrate.search.space import Space, beats, fastest, threaded
from feedrate.units import size as human_bytes


def _memory(t: Trial) -> str:
    return human_bytes(t.workers_uss_bytes or 0) if t.config.num_workers else "no workers"


def _as_fast_for_less(top: Trial, best: Trial) -> bool:
    """Within the noise of ``best`` on at most half its worker memory."""
    mine, theirs = top.workers_uss_bytes or 0, best.workers_uss_bytes or 0
    return not beats(best, top) and 0 < mine <= theirs / 2


def thread_findings(
    space: Space, check: ThreadCheck | None, trials: list[Trial], best: Trial
) -> list[Finding]:
    found: list[Finding] = []
    if check is not None and not check.ok:
        found.append(
            Finding(
                "threads-unsafe",
                "warning",
                "Threads inside workers could overlap this pipeline's waits for less memory "
                f"than more worker processes, but {check.reason()}, so none were measured or "
                "recommended.",
                "Open such handles per thread (threading.local()) or per worker "
                "(worker_init_fn), and draw random numbers from torch/numpy's global "
                "generators, then tune again with --threads",
            )
        )
    top = fastest(threaded(trials))
    if top is None:
        return found
    t, w = top.config.threads, top.config.num_workers
    safety = f"; thread check: {check.describe()}" if check is not None else ""
    if best.config.threads > 1:
        found.append(
            Finding(
                "threads-chosen",
                "info",
                f"The recommendation fetches each batch's samples on {best.config.threads} "
                f"threads per worker (worker memory {_memory(best)}){safety}.",
                "Keep __getitem__ safe to call from several threads at once (no shared open "
                "file, database handle or random generator on the dataset)",
            )
        )
    elif not space.allow_threads and (beats(top, best) or _as_fast_for_less(top, best)):
        # Faster beyond the noise, or only as fast (a ratio under 1 can be a tie) on less memory.
        gain = "faster than" if beats(top, best) else "as fast as (within the noise)"
        found.append(
            Finding(
                "threads-would-help",
                "warning",
                f"Fetching on threads measured {gain} the recommendation: {top.median:,.0f} "
                f"samples/s with {top.config.label()}, {top.median / best.median:.2f}× its "
                f"{best.median:,.0f}, with worker memory {_memory(top)} against "
                f"{_memory(best)}{safety}. Threads were not recommended because they need a "
                "thread-safe __getitem__.",
                f"feedrate tune TARGET --threads   # or in code: DataLoader(feedrate.threaded("
                f"dataset, {t}), num_workers={w}, ...)",
            )
        )
    return found


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
    FindingDoc(
        id="threads-chosen",
        title="The recommendation fetches on threads",
        means=(
            "The recommendation fetches each batch's samples on threads inside each worker "
            "(`feedrate.threaded`): they overlap the pipeline's waits with fewer processes and "
            "less memory."
        ),
        evidence=(
            "From `tune --threads`: the threaded configuration measured best, its worker memory, "
            "and the thread-safety check's result (samples fetched on threads matched the same "
            "samples fetched one by one, or, for a dataset that never returns the same sample "
            "twice, no unsafe objects were found)."
        ),
        fix=(
            "Keep `__getitem__` safe to call from several threads at once: no shared open file, "
            "database handle or random generator on the dataset."
        ),
        severity="info",
    ),
    FindingDoc(
        id="threads-unsafe",
        title="Threads could help, but are not safe here",
        means=(
            "Threads inside workers could overlap this pipeline's waits, but the thread-safety "
            "check failed, so no threaded configuration was measured or recommended."
        ),
        evidence=(
            "From `tune`, where the workers mostly wait: objects on the dataset that threads must "
            "not share (an open file, an h5py, LMDB or sqlite3 handle, a random generator the "
            "dataset holds), a fetch on threads that raised, or a sample that came out different "
            "on threads than fetched one by one (up to 32 samples, for a deterministic dataset)."
        ),
        fix=(
            "Open such handles per thread (`threading.local()`) or per worker (`worker_init_fn`), "
            "draw random numbers from torch's or numpy's global generators, then tune again with "
            "`--threads`."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="threads-would-help",
        title="Threads measured faster, or as fast on less memory, but were not allowed",
        means=(
            "A configuration with threads inside workers measured faster than the recommendation, "
            "or as fast on at most half its worker memory, but threads need a thread-safe "
            "`__getitem__`, so `tune` recommends them only with `--threads`."
        ),
        evidence=(
            "From `tune` without `--threads`: the threaded configuration measured after the "
            "search, its samples/s and worker memory (USS) against the recommendation's, and the "
            "thread-safety check's result."
        ),
        fix=(
            "`feedrate tune TARGET --threads`, or in code `DataLoader(feedrate.threaded(dataset, "
            "T), num_workers=W, ...)` with the T and W the message gives."
        ),
        severity="warning",
    ),
)
