"""The user's loader run with 2 workers for a few seconds, watching each worker: its memory
(USS) early and late, its OS threads while loading, and the first batch (tensors, bytes); and
the consumer timed alone. Evidence for copy-on-read, thread oversubscription, /dev/shm and
open-file needs, and the consumer's own pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader

from feedrate.loader.batches import batch_nbytes, count_samples, count_tensors
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import is_iterable_style, rebuild
from feedrate.measuring.consumer import Consumer
from feedrate.measuring.device import synchronize, to_device
from feedrate.measuring.failures import IndexReportingDataset
from feedrate.measuring.inner import worker_handles
from feedrate.measuring.workers import WORKERS, Workers
from feedrate.results.evidence import SampleRun, WorkerMemory

#: Seconds between two readings of worker memory (reading smaps is not free).
MEMORY_INTERVAL_S = 0.25


def _memory(procs: list[psutil.Process]) -> list[tuple[int, int] | None]:
    out: list[tuple[int, int] | None] = []
    for proc in procs:
        try:
            out.append((int(proc.memory_full_info().uss), int(proc.num_threads())))
        except (psutil.Error, AttributeError):
            out.append(None)
    return out


class _MemoryLog:
    """Worker memory read at most every ``MEMORY_INTERVAL_S``: the first reading and the last."""

    def __init__(self, it: Any, clock: Callable[[], float]) -> None:
        self.clock, self.it = clock, it
        self.procs: list[psutil.Process] = []
        self.early: list[tuple[int, int] | None] | None = None
        self.late: list[tuple[int, int] | None] = []
        self.threads: list[int] = []
        self.t_early = self.t_late = 0.0
        self.due = 0.0

    def _find(self) -> None:
        """The workers, found at the first reading: a generator ``__iter__`` starts them at
        its first ``next()``."""
        for proc in worker_handles(self.it):
            try:
                self.procs.append(psutil.Process(proc.pid))
            except psutil.Error:
                continue
        self.threads = [0] * len(self.procs)

    def read(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now < self.due:
            return
        if self.early is None:
            self._find()
        self.due = now + MEMORY_INTERVAL_S
        reading = _memory(self.procs)
        for i, r in enumerate(reading):
            if r is not None:
                self.threads[i] = max(self.threads[i], r[1])
        if self.early is None:
            self.early, self.t_early = reading, now
        elif all(r is not None for r in reading):
            self.late, self.t_late = reading, now

    def workers(self) -> list[WorkerMemory]:
        out = []
        for i, proc in enumerate(self.procs):
            first = self.early[i] if self.early else None
            last = self.late[i] if self.late else None
            if first is not None and last is not None:
                out.append(WorkerMemory(i, proc.pid, first[0], last[0], self.threads[i]))
        return out


def memory_run_config(loader: DataLoader[Any]) -> LoaderConfig:
    """The settings ``sample_run`` runs ``loader`` with: 2 workers, its own prefetch depth."""
    own_pf = loader.prefetch_factor if loader.num_workers else None
    return LoaderConfig(WORKERS, False, own_pf, False, None)


def sample_run(
    loader: DataLoader[Any],
    *,
    seconds: float = 2.5,
    timeout_s: float = 30.0,
    keep_batch: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> SampleRun:
    """Run ``loader`` with 2 workers (its own batching, sampler and prefetch depth; workers not
    kept between epochs) for about ``seconds`` from the first batch or one epoch, whichever
    ends first. Memory is first read as soon as every worker has delivered a batch."""
    config = memory_run_config(loader)
    dataset = None if is_iterable_style(loader) else IndexReportingDataset(loader.dataset)
    run = rebuild(loader, config, dataset=dataset)
    run.timeout = timeout_s
    batches, first, began = 0, None, 0.0
    with Workers(run, timeout_s) as it:
        log = _MemoryLog(it, clock)
        for batch in it:
            batches += 1
            if first is None:
                first, began = batch, clock()
            if batches >= WORKERS:
                log.read()
            if clock() - began > seconds:
                break
        log.read(force=True)
    epoch = None if is_iterable_style(loader) else _length(run)
    return SampleRun(
        batches=batches,
        epoch_batches=epoch,
        seconds=clock() - began if first is not None else 0.0,
        memory_seconds=max(0.0, log.t_late - log.t_early),
        workers=log.workers(),
        tensors_per_batch=None if first is None else count_tensors(first),
        batch_bytes=None if first is None else batch_nbytes(first),
        first_batch=first if keep_batch else None,
    )


def _length(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:  # a sampler without a length
        return None


def consumer_rate(
    consumer: Consumer,
    batch: Any,
    batch_size: int | None,
    *,
    seconds: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
    device: torch.device | None = None,
) -> float | None:
    """Samples/s the consumer takes alone: known for a rate or a step time, timed on ``batch``
    (at least 3 calls, about ``seconds``) for a real step. None when it cannot be known.

    A real step gets the batch as the measured loop gives it: on ``device`` when there is one
    (copied once, the device waited for after each call). Its first call is not timed:
    it builds the model, allocates, loads kernels (seconds on a GPU), as the loop's warm-up."""
    samples = count_samples(batch, batch_size or 1) if batch is not None else batch_size
    if consumer.kind == "rate":
        return consumer.samples_per_s
    if consumer.kind == "step-time":
        return samples / consumer.step_s if samples and consumer.step_s else None
    if batch is None or not samples:
        return None
    if device is not None:
        batch = to_device(batch, device, False)
    consumer(batch, samples)  # warm-up
    if device is not None:
        synchronize(device)
    calls, began = 0, clock()
    while calls < 3 or (clock() - began < seconds and calls < 1000):
        consumer(batch, samples)
        if device is not None:  # as the measured loop does: a step that only queues work
            synchronize(device)  # is not free, and the calls stay within ``seconds``
        calls += 1
    elapsed = clock() - began
    return samples * calls / elapsed if elapsed > 0 else None
