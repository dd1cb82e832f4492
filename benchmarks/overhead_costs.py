"""Where ``measure()``'s overhead goes, measured inside the run rather than end to end.

On a noisy shared host, two runs seconds apart differ by more than the effect looked for, so
ratios of whole runs resolve a few percent only with many rounds. The costs here are timed in the
same run as the span they burden, so a slow host slows both alike and the share stays put:

* probe reads at window boundaries that fall inside the timed span (``TimedProbe``, in every
  feedrate run; the memory reads, ``memory_full_info``, timed apart);
* per-batch bookkeeping: ``measure`` against the bare loop over a loader whose batches cost
  almost nothing, the probe left out (``per_batch_cost``);
* the index-reporting wrapper: DataLoader's own fetcher over the wrapped and the plain dataset
  (``wrapper_cost``);
* the /dev/shm polling thread: its CPU time as the probe reports it.
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from unittest import mock

import psutil
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from feedrate.config import LoaderConfig
from feedrate.failures import IndexReportingDataset
from feedrate.measuring import count_samples
from feedrate.probe import ProbeReport, ProcessProbe

# The modules themselves: the package re-exports a function named ``measure``.
MEASURE = importlib.import_module("feedrate.measuring")
PROBE = importlib.import_module("feedrate.probe")
_memory = PROBE._memory


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
        mock.patch.object(MEASURE, "ProcessProbe", TimedProbe),
        mock.patch.object(PROBE, "_memory", _timed_memory),
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


class NullProbe:
    """Stands in for ``ProcessProbe``: no thread, no reads."""

    def __enter__(self) -> NullProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def attach(self, iterator: object) -> None:
        return None

    def window_open(self, wall: float) -> None:
        return None

    def window_close(self, wall: float) -> None:
        return None

    def report(self) -> ProbeReport:
        return ProbeReport()


@contextlib.contextmanager
def without_probe() -> Iterator[None]:
    with mock.patch.object(MEASURE, "ProcessProbe", NullProbe):
        yield


class _SameBatch(Dataset[Any]):
    """``n`` items, each the same ready-made batch: the cheapest loader that yields real batches."""

    def __init__(self, batch: Any, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.batch


def _first(items: list[Any]) -> Any:
    return items[0]


def per_batch_cost(batch: Any, n: int = 20_000, repeats: int = 7) -> dict[str, float]:
    """Seconds per batch that ``measure``'s own loop adds (sample counting, batch bytes, window
    bookkeeping, the watchdog kick): ``measure`` (one window, no wrapper, the probe replaced by a
    no-op as it is accounted apart) against the bare loop over a loader that yields ``batch``
    ``n`` times at almost no cost. Min over interleaved repeats, the least disturbed estimate."""
    loader = DataLoader(_SameBatch(batch, n), batch_size=1, collate_fn=_first)
    bare, fr = [], []
    for _ in range(repeats):
        seconds, _samples = bare_loop(iter(loader), 1, n, 1)
        bare.append(seconds / (n - 1))
        with without_probe():
            m = MEASURE.measure(
                loader, LoaderConfig(), batches=n - 1, windows_count=1, report_index=False
            )
        fr.append(m.window.seconds / m.window.batches)
    return {"bare_s": min(bare), "measure_s": min(fr), "added_s": min(fr) - min(bare)}


# --- the index-reporting wrapper ----------------------------------------------------------------


def wrapper_cost(loader: DataLoader[Any], batches: int = 100, repeats: int = 7) -> dict[str, float]:
    """Seconds per sample the wrapper adds to DataLoader's fetch: the same index batches fetched
    and collated through the plain and the wrapped dataset, alternating batch by batch so drift
    cancels; the median over ``repeats`` of the difference."""
    torch.manual_seed(0)
    sampler: Iterable[list[int]] = loader.batch_sampler or []
    indices = [idx for _, idx in zip(range(batches), sampler, strict=False)]
    n = sum(len(i) for i in indices)
    plain = _fetcher(loader, loader.dataset)
    wrapped = _fetcher(loader, IndexReportingDataset(loader.dataset))
    base, added = [], []
    for _ in range(repeats):
        t_plain = t_wrapped = 0.0
        for k, idx in enumerate(indices):
            first, second = (plain, wrapped) if k % 2 == 0 else (wrapped, plain)
            t_first, t_second = _fetch_time(first, idx), _fetch_time(second, idx)
            t_plain += t_first if first is plain else t_second
            t_wrapped += t_second if first is plain else t_first
        base.append(t_plain / n)
        added.append((t_wrapped - t_plain) / n)
    return {"plain_s": statistics.median(base), "added_s": statistics.median(added)}


def _fetcher(loader: DataLoader[Any], dataset: Any) -> _MapDatasetFetcher:
    return _MapDatasetFetcher(dataset, True, loader.collate_fn, loader.drop_last)


def _fetch_time(fetcher: _MapDatasetFetcher, indices: list[int]) -> float:
    t0 = time.perf_counter()
    fetcher.fetch(indices)  # type: ignore[no-untyped-call]
    return time.perf_counter() - t0
