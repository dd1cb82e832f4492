"""Where ``measure()``'s overhead goes, measured inside the run rather than end to end.

On a noisy shared host, two runs seconds apart differ by more than the effect looked for, so
ratios of whole runs resolve a few percent only with many rounds. The costs here are timed in the
same run as the span they burden, so a slow host slows both alike and the share stays put:

* the probe's calls on the measuring thread (attach, window open and close) that fall inside the
  timed span (``TimedProbe``, in every feedrate run);
* the probe's poller thread (/dev/shm polling and, every 0.25 s, ``memory_full_info`` of every
  process): its CPU time as the probe reports it, and the time its memory reads take;
* per-batch bookkeeping: ``measure`` against the bare loop over a loader whose batches cost
  almost nothing, the probe left out (``per_batch_cost``);
* the index-reporting wrapper: DataLoader's own fetcher over the wrapped and the plain dataset
  (``wrapper_cost``);
* the poller thread's effect on a loop that runs on the measuring thread alone, GIL included:
  alternating one-second slices with and without a probe (``poller_interference``).
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from unittest import mock

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from feedrate.loader.batches import count_samples
from feedrate.loader.config import LoaderConfig
from feedrate.measuring.failures import IndexReportingDataset
from feedrate.measuring.processes import ProcessProbe
from feedrate.results.processes import ProbeReport

# The modules themselves, to patch the probe ``measure`` uses.
MEASURE = importlib.import_module("feedrate.measuring.measure")
PROBE = importlib.import_module("feedrate.measuring.processes")


class TimedProbe(ProcessProbe):
    """``ProcessProbe`` that logs ``(call, seconds)`` for every call the measuring thread makes
    (attach, window open, window close), in call order, and sums the seconds its poller thread
    spends reading memory during windows. A few clock reads per call are all it adds."""

    log: list[tuple[str, float]] = []  # noqa: RUF012 (measure() builds its own probe)
    memory_s = 0.0

    def attach(self, iterator: object) -> None:
        self._timed("attach", super().attach, iterator)

    def window_open(self, wall: float) -> None:
        self._timed("open", super().window_open, wall)

    def window_close(self, wall: float) -> None:
        self._timed("close", super().window_close, wall)

    def _read_memory(self) -> None:
        in_window = self._in_window
        t0 = time.perf_counter()
        super()._read_memory()
        if in_window:
            TimedProbe.memory_s += time.perf_counter() - t0

    def _timed(self, kind: str, call: Callable[[Any], None], arg: Any) -> None:
        t0 = time.perf_counter()
        call(arg)
        TimedProbe.log.append((kind, time.perf_counter() - t0))


@contextlib.contextmanager
def timed_probe() -> Iterator[list[tuple[str, float]]]:
    """Within the block, ``measure()`` uses ``TimedProbe``; yields its log."""
    TimedProbe.log, TimedProbe.memory_s = [], 0.0
    with mock.patch.object(MEASURE, "ProcessProbe", TimedProbe):
        yield TimedProbe.log


def timed_reads(
    log: Sequence[tuple[str, float]], reads: Sequence[tuple[str, bool]]
) -> dict[str, float]:
    """Seconds the measuring thread spent in probe calls inside the timed span, given which calls
    fall in it (from the replayed schedule, in the same order)."""
    if [kind for kind, _ in log] != [kind for kind, _ in reads]:
        raise RuntimeError(f"probe calls {[k for k, _ in log]} differ from the schedule {reads}")
    inside = [(kind, s) for (kind, s), (_, t) in zip(log, reads, strict=True) if t]
    closes = sorted(s for kind, s in log if kind == "close")
    return {
        "reads_s": sum(s for _, s in inside),
        "close_median_s": closes[len(closes) // 2] if closes else 0.0,
    }


# --- per-batch bookkeeping ----------------------------------------------------------------------


def bare_loop(
    batches: Iterable[Any], skip: int, count: int, default: int, *, start: float = 0.0
) -> tuple[float, int]:
    """The bare loop: discard ``skip`` batches, count the samples of the next ``count``; returns
    (seconds from the last discarded batch, or from ``start`` when ``skip`` is 0, to the last
    counted one; samples). With ``count`` 0 it runs through the epoch untimed."""
    if count == 0:
        for _ in batches:
            pass
        return 0.0, 0
    last, samples, end = skip + count, 0, 0.0
    for i, batch in enumerate(batches, 1):
        now = time.perf_counter()
        if i == skip:
            start = now
        elif i > skip:
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
        seconds, _samples = bare_loop(iter(loader), 1, n - 1, 1)
        bare.append(seconds / (n - 1))
        with without_probe():
            m = MEASURE.measure(
                loader, LoaderConfig(), batches=n - 1, windows_count=1, report_index=False
            )
        fr.append(m.window.seconds / m.window.batches)
    return {"bare_s": min(bare), "measure_s": min(fr), "added_s": min(fr) - min(bare)}


# --- the poller thread's effect on the measuring thread ------------------------------------------


def _forever(loader: DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def _slice_rate(it: Iterator[Any], batches: int, default: int) -> float:
    seconds, samples = bare_loop(it, 0, batches, default, start=time.perf_counter())
    return samples / seconds


def _slice_with_probe(it: Iterator[Any], batches: int, default: int) -> float:
    with ProcessProbe() as probe:
        probe.attach(it)
        probe.window_open(time.perf_counter())
        rate = _slice_rate(it, batches, default)
        probe.window_close(time.perf_counter())
    return rate


def poller_interference(
    loader: DataLoader[Any], batches: int = 1000, pairs: int = 12
) -> dict[str, Any]:
    """How much the probe's poller thread (shm polls, memory reads, the GIL it takes) slows a
    loop that runs on the measuring thread alone (``num_workers=0``): slices of ``batches``
    batches (about 1 s for the tabular example) with a probe in a window around them, against
    slices without, alternating (ABBA) so that drift cancels. The median ratio and its range."""
    default, it = loader.batch_size or 1, _forever(loader)
    ratios = []
    for k in range(pairs):
        if k % 2 == 0:
            bare, probed = (
                _slice_rate(it, batches, default),
                _slice_with_probe(it, batches, default),
            )
        else:
            probed, bare = (
                _slice_with_probe(it, batches, default),
                _slice_rate(it, batches, default),
            )
        ratios.append(probed / bare)
    return {"ratio_median": statistics.median(ratios), "ratios": ratios, "batches": batches}


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
