"""Findings about threads inside workers (``feedrate.threaded``): blocked by the safety check,
measured better but not allowed, or chosen. Pure functions of the trials and the check."""

from __future__ import annotations

from feedrate.results.evidence import ThreadCheck
from feedrate.results.findings import Finding
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
        found.append(
            Finding(
                "threads-would-help",
                "warning",
                f"Fetching on threads measured {top.median:,.0f} samples/s with "
                f"{top.config.label()}, {top.median / best.median:.2f}× the recommendation "
                f"({best.median:,.0f} samples/s), with worker memory {_memory(top)} against "
                f"{_memory(best)}{safety}. Threads were not recommended because they need a "
                "thread-safe __getitem__.",
                f"feedrate tune TARGET --threads   # or in code: DataLoader(feedrate.threaded("
                f"dataset, {t}), num_workers={w}, ...)",
            )
        )
    return found
