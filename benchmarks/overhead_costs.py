"""Where ``measure()``'s overhead goes, measured inside the run rather than end to end.

On a noisy shared host, two runs seconds apart differ by more than the effect looked for, so
ratios of whole runs resolve a few percent only with many rounds. The costs here are timed in the
same run as the span they burden, so a slow host slows both alike and the share stays put:

* probe reads at window boundaries that fall inside the timed span (``TimedProbe``, in every
  feedrate run; the memory reads, ``memory_full_info``, timed apart);
* per-batch bookkeeping: ``windows.run`` with measure's per-batch hook (counter and watchdog
  kick) against the bare loop's, over the same in-memory batches (``per_batch_cost``);
* the index-reporting wrapper: DataLoader's own fetcher over the wrapped and the plain dataset
  (``wrapper_cost``);
* the /dev/shm polling thread: its CPU time as the probe reports it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from unittest import mock

import psutil
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.fetch import _MapDatasetFetcher

import feedrate.measure
import feedrate.probe
from feedrate import windows
from feedrate.failures import IndexReportingDataset, Watchdog
from feedrate.measure import count_samples
from feedrate.probe import ProcessProbe

_memory = feedrate.probe._memory


class TimedProbe(ProcessProbe):
    """``ProcessProbe`` that logs ``(hook, seconds, of which memory reads)`` per boundary read,
    in call order. Two clock reads per boundary are all it adds."""

    log: list[tuple[str, float, float]] = []  # noqa: RUF012 (measure() builds its own probe)
    _memory_s = 0.0

    def window_open(self, wall: float) -> None:
        self._timed("open", super().window_open, wall)

    def window_close(self, wall: float) -> None:
        self._timed("close", super().window_close, wall)

    def _timed(self, kind: str, read: Callable[[float], None], wall: float) -> None:
        TimedProbe._memory_s = 0.0
        t0 = time.perf_counter()
        read(wall)
        TimedProbe.log.append((kind, time.perf_counter() - t0, TimedProbe._memory_s))


def _timed_memory(proc: psutil.Process, fig: Any) -> None:
    t0 = time.perf_counter()
    _memory(proc, fig)
    TimedProbe._memory_s += time.perf_counter() - t0


@contextlib.contextmanager
def timed_probe() -> Iterator[list[tuple[str, float, float]]]:
    """Within the block, ``measure()`` uses ``TimedProbe``; yields its log."""
    TimedProbe.log = []
    with (
        mock.patch.object(feedrate.measure, "ProcessProbe", TimedProbe),
        mock.patch.object(feedrate.probe, "_memory", _timed_memory),
    ):
        yield TimedProbe.log


def timed_reads(log: Sequence[tuple[str, float, float]], timed: Sequence[bool]) -> dict[str, float]:
    """Seconds of probe reads inside the timed span, given which hook calls fall in it (from the
    replayed schedule, in the same order)."""
    if len(log) != len(timed):
        raise RuntimeError(f"{len(log)} probe reads but the schedule has {len(timed)}")
    inside = [entry for entry, t in zip(log, timed, strict=True) if t]
    closes = [s for kind, s, _ in inside if kind == "close"]
    return {
        "reads_s": sum(s for _, s, _ in inside),
        "memory_s": sum(m for _, _, m in inside),
        "close_median_s": sorted(closes)[len(closes) // 2] if closes else 0.0,
    }


# --- per-batch bookkeeping ----------------------------------------------------------------------


def bare_loop(batches: Iterable[Any], warmup: int, last: int, default: int) -> tuple[float, int]:
    """The bare loop: discard ``warmup`` batches, count the samples of the next ones up to batch
    ``last``; returns (seconds from the last warm-up batch to batch ``last``, samples)."""
    samples, start, end = 0, 0.0, 0.0
    for i, batch in enumerate(batches, 1):
        now = time.perf_counter()
        if i == warmup:
            start = now
        elif i > warmup:
            samples += count_samples(batch, default)
            if i == last:
                end = now
                break
    return end - start, samples


def _bare_loop(batches: Sequence[Any], default: int) -> float:
    t0 = time.perf_counter()
    bare_loop(batches, 1, len(batches), default)
    return time.perf_counter() - t0


def _measure_loop(batches: Sequence[Any], default: int) -> float:
    """``windows.run`` with the per-batch hook ``measure`` installs (a counter and a watchdog
    kick); window hooks are left out, the probe reads are accounted for apart."""
    current = {"batches": 0}
    plan = windows.WindowPlan(5, len(batches) - 1, None, 1)
    with Watchdog(60.0, lambda: "") as dog:

        def on_batch() -> None:
            current["batches"] += 1
            dog.kick()

        t0 = time.perf_counter()
        windows.run(
            lambda: iter(batches),
            plan,
            lambda b: count_samples(b, default),
            clock=time.perf_counter,
            hooks=windows.Hooks(batch=on_batch),
            epoch_length=len(batches),
        )
        return time.perf_counter() - t0


def per_batch_cost(batch: Any, default: int, n: int = 20_000, repeats: int = 7) -> dict[str, float]:
    """Seconds per batch that ``measure``'s loop adds over the bare loop (min over interleaved
    repeats, the least disturbed estimate), and each loop's own cost."""
    batches = [batch] * n
    bare, fr = [], []
    for _ in range(repeats):
        bare.append(_bare_loop(batches, default) / n)
        fr.append(_measure_loop(batches, default) / n)
    return {"bare_s": min(bare), "measure_s": min(fr), "added_s": min(fr) - min(bare)}


# --- the index-reporting wrapper ----------------------------------------------------------------


def wrapper_cost(loader: DataLoader[Any], batches: int = 20, repeats: int = 5) -> dict[str, float]:
    """Seconds per sample the wrapper adds to DataLoader's fetch (same indices, same collate;
    min over interleaved repeats). ``batches`` batches of the loader's sampler per repeat."""
    torch.manual_seed(0)
    indices = [idx for _, idx in zip(range(batches), loader.batch_sampler, strict=False)]
    n = sum(len(i) for i in indices)
    plain, wrapped = [], []
    for _ in range(repeats):
        plain.append(_fetch_time(loader, loader.dataset, indices) / n)
        wrapped.append(_fetch_time(loader, IndexReportingDataset(loader.dataset), indices) / n)
    return {"plain_s": min(plain), "wrapped_s": min(wrapped), "added_s": min(wrapped) - min(plain)}


def _fetch_time(loader: DataLoader[Any], dataset: Any, indices: Sequence[list[int]]) -> float:
    fetcher = _MapDatasetFetcher(dataset, True, loader.collate_fn, loader.drop_last)
    t0 = time.perf_counter()
    for idx in indices:
        fetcher.fetch(idx)
    return time.perf_counter() - t0
