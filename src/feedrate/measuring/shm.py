"""One batch made in the main process (no workers), before anything risky runs: its bytes and
tensors are what the /dev/shm and open-file predictions need (``checks.machine.shm_finding``),
and making it starts no worker, so nothing goes through /dev/shm. Its share of time on a CPU
tells a pipeline that mostly waits (on storage, a network) from one that computes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from feedrate.loader.batches import batch_nbytes, count_tensors
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, is_iterable_style, rebuild
from feedrate.measuring import random_state
from feedrate.measuring.diagnosis import explain
from feedrate.measuring.failures import IndexReportingDataset, Watchdog
from feedrate.measuring.runqueue import Mark, Marks, busy

#: A first batch made faster than this (s) says too little of where its time goes to be read
#: (first calls, page faults); a loader that fast needs few workers whatever it waits on.
MIN_TIMED_S = 0.02

#: Where the first batch took less than this (s), autotune reads the share from a second one:
#: the first carries the first calls (a sampler's first permutation, torch's first dispatch of
#: each op in the collate), a few ms of CPU that read as 10-15% of a 20 ms batch that sleeps
#: and sent a waiting loader's start to one worker per CPU one run in three. Past it, those
#: few ms are under 2% of the batch, and a second batch would cost that much more.
RETIME_BELOW_S = 0.25


@dataclass(frozen=True)
class MainBatch:
    """The first batch of the loader's own batching, made without workers: its ``bytes`` (the
    tensors' storage) and ``tensors``; ``batch`` kept only when asked for. ``cpu_share``: the
    share of the time making it took (its wait for a CPU on a busy machine left out) that this
    thread spent on one; None when it took less than ``MIN_TIMED_S``."""

    bytes: int | None
    tensors: int | None
    batch: Any = None
    cpu_share: float | None = None


def main_process_batch(
    loader: DataLoader[Any],
    *,
    timeout_s: float = 30.0,
    keep_batch: bool = False,
    retime_below_s: float = 0.0,
) -> MainBatch:
    """Make ``loader``'s first batch in this process (``num_workers=0``, its other settings).
    Where that took less than ``retime_below_s``, ``cpu_share`` is read from the second batch
    (when there is one, made in ``MIN_TIMED_S`` or more), with the first calls behind it.
    Raises ``PipelineError`` when the dataset or collate_fn fails, ``PipelineTimeoutError``
    when no batch comes within ``timeout_s``. An empty loader gives ``MainBatch(None, None)``."""
    if _one_shot(loader):
        return MainBatch(None, None)
    config = LoaderConfig(0, False, None, False, config_of(loader).in_order)
    dataset = None if is_iterable_style(loader) else IndexReportingDataset(loader.dataset)
    run = rebuild(loader, config, dataset=dataset)
    it: Any = None
    with (
        random_state.kept(loader),
        Watchdog(timeout_s, lambda: "one batch made in the main process"),
    ):
        try:
            it = iter(run)
            mark = Marks(time.perf_counter)
            asked = mark()
            batch = next(it, None)
            got = mark()
            if batch is not None and got[0] - asked[0] < retime_below_s:
                again = mark()
                if next(it, None) is not None:
                    done = mark()
                    if _on_cpus(again, done) >= MIN_TIMED_S:  # else the first says more
                        asked, got = again, done
        except Exception as exc:
            error = explain(exc, it)
            if error is None:
                raise
            raise error from exc
    if batch is None:
        return MainBatch(None, None)
    wall = _on_cpus(asked, got)
    share = min(1.0, busy(asked, got) / wall) if wall >= MIN_TIMED_S else None
    kept = batch if keep_batch else None
    return MainBatch(batch_nbytes(batch), count_tensors(batch), kept, share)


def _on_cpus(asked: Mark, got: Mark) -> float:
    """The seconds from ``asked`` to ``got`` on the CPUs the thread got: not queued."""
    return got[0] - asked[0] - (got[1] - asked[1])


def _one_shot(loader: DataLoader[Any]) -> bool:
    """The loader's index stream (or IterableDataset) is an iterator, used up once iterated:
    taking a batch from it would take that batch from the user's own run."""
    sources: list[object] = [loader.batch_sampler, loader.sampler]
    if is_iterable_style(loader):
        sources.append(loader.dataset)
    return any(s is not None and isinstance(s, Iterator) for s in sources)
