"""The host-to-device leg: which accelerator there is, copying a batch to it, timing it honestly,
and the bandwidth of pageable against pinned host memory (as CUDA's ``bandwidthTest`` does).

Measuring only; what the figures mean for ``pin_memory`` and ``non_blocking`` is decided in
``checks_transfer`` (pure functions over these figures, tested without an accelerator).

Timing on CUDA uses events recorded on the current stream and waits for the end event, so a copy
or a step that the host only queued is not timed as free; on MPS (no events) it synchronizes the
device around the work. Without an accelerator nothing here runs: ``device()`` is None and the
callers say so and skip.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from feedrate.errors import UserError
from feedrate.results.transfer import SCHEMA, SizeFigures, TransferResult

#: Default sizes: from a small batch of labels to a large batch of images.
DEFAULT_SIZES = (64 * 2**10, 2**20, 16 * 2**20, 128 * 2**20)


NO_ACCELERATOR = (
    "no accelerator (CUDA or MPS) is visible to torch on this machine: there is no host-to-device "
    "copy to measure, and pin_memory only costs locked RAM here"
)


def device() -> torch.device | None:
    """The accelerator torch would train on here, or None."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return None


def parse_device(name: str | None) -> torch.device | None:
    """``device``: None or "auto" for the accelerator (None without one), "cpu" for none."""
    if name is None or name == "auto":
        return device()
    if name == "cpu":
        return None
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise UserError(
            f"device {name!r} is not a torch device ({exc})", params=("device",)
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name}: {NO_ACCELERATOR}", params=("device",))
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise UserError(
            f"device {name}: only {torch.cuda.device_count()} CUDA devices here", params=("device",)
        )
    if dev.type == "mps" and device() != torch.device("mps"):
        raise UserError(f"device {name}: {NO_ACCELERATOR}", params=("device",))
    if dev.type not in ("cuda", "mps"):
        raise UserError(
            f"device {name}: feedrate copies batches to cuda or mps devices only",
            params=("device",),
        )
    return dev


def to_device(batch: Any, dev: torch.device, non_blocking: bool) -> Any:
    """``batch`` with every tensor moved to ``dev``, through sequences, mappings and named
    tuples, as a training loop's ``batch.to(device, non_blocking=...)`` would."""
    if isinstance(batch, torch.Tensor):
        return batch.to(dev, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, dev, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(v, dev, non_blocking) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, dev, non_blocking) for v in batch)
    return batch


def synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def _event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


class Timer:
    """Device time of the work between ``start()`` and ``stop()`` (seconds): CUDA events on
    the current stream, waited for; elsewhere, ``clock`` (the host's) around a device
    synchronize."""

    def __init__(self, dev: torch.device, clock: Callable[[], float] = time.perf_counter) -> None:
        self.dev, self.clock = dev, clock
        self._cuda = dev.type == "cuda"
        self._began = 0.0
        if self._cuda:
            self._start, self._end = _event(), _event()

    def start(self) -> None:
        if self._cuda:
            self._start.record()
        else:
            synchronize(self.dev)
            self._began = self.clock()

    def stop(self) -> float:
        if self._cuda:
            self._end.record()
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end)) / 1000.0
        synchronize(self.dev)
        return self.clock() - self._began


@dataclass
class DeviceStep:
    """A consumer that copies each batch to ``dev`` (``non_blocking`` when the settings pin
    memory, as a training loop should) and then hands it to ``inner(batch, samples)`` (a real
    step, or a sleep that stands for one), waiting for the device before it returns: the time
    the loop spends is what the measurement sees. Device time of the copy and of the step add
    up in ``copy_s`` and ``step_s`` (CUDA events; elsewhere ``clock``, the host's)."""

    dev: torch.device
    non_blocking: bool
    inner: Callable[[Any, int], object] | None = None
    copy_s: float = 0.0
    step_s: float = 0.0
    batches: int = 0
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    _timers: tuple[Timer, Timer] | None = field(default=None, repr=False)
    _events: tuple[Any, Any, Any] | None = field(default=None, repr=False)

    def __call__(self, batch: Any, samples: int) -> None:
        if self.dev.type != "cuda":  # no events: the device is synchronized around each part
            if self._timers is None:
                self._timers = (Timer(self.dev, self.clock), Timer(self.dev, self.clock))
            copy, step = self._timers
            copy.start()
            on_device = to_device(batch, self.dev, self.non_blocking)
            self.copy_s += copy.stop()
            if self.inner is not None:
                step.start()
                self.inner(on_device, samples)
                self.step_s += step.stop()
            self.batches += 1
            return
        # CUDA: events before the copy, between copy and step and after the step, one wait at
        # the end, so a non_blocking copy still lets the host queue the step behind it.
        if self._events is None:
            self._events = tuple(_event() for _ in range(3))  # type: ignore[assignment]
        assert self._events is not None
        begin, mid, end = self._events
        begin.record()
        on_device = to_device(batch, self.dev, self.non_blocking)
        mid.record()
        if self.inner is not None:
            self.inner(on_device, samples)
        end.record()
        end.synchronize()
        self.copy_s += float(begin.elapsed_time(mid)) / 1000.0
        self.step_s += float(mid.elapsed_time(end)) / 1000.0
        self.batches += 1

    def restart(self) -> None:
        """Forget what was counted so far: the warm-up's calls (a real step's first builds the
        model and loads kernels) are not the steady state's copy and step times."""
        self.copy_s = self.step_s = 0.0
        self.batches = 0

    def figures(self) -> dict[str, Any]:
        n = max(1, self.batches)
        return {
            "device": str(self.dev),
            "non_blocking": self.non_blocking,
            "batches": self.batches,
            "copy_s_per_batch": self.copy_s / n,
            "step_s_per_batch": self.step_s / n if self.inner is not None else None,
        }


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return dev.type


def bandwidth(
    dev: torch.device,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 10,
    progress: Callable[[int, int], None] | None = None,
) -> TransferResult:
    """Median of ``repeats`` timed copies per size and direction (after one untimed copy)."""
    began = time.perf_counter()
    rows = []
    for i, nbytes in enumerate(sizes):
        if progress is not None:
            progress(i, len(sizes))
        rows.append(_one_size(dev, nbytes, repeats))
    return TransferResult(
        SCHEMA, str(dev), device_name(dev), repeats, rows, time.perf_counter() - began
    )


def _one_size(dev: torch.device, nbytes: int, repeats: int) -> SizeFigures:
    n = max(1, nbytes)
    pageable = torch.empty(n, dtype=torch.uint8).fill_(1)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    on_dev = torch.empty(n, dtype=torch.uint8, device=dev)
    timer = Timer(dev)

    def copy_time(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> float:
        dst.copy_(src, non_blocking=non_blocking)  # untimed: first-use costs
        synchronize(dev)
        times = []
        for _ in range(repeats):
            timer.start()
            dst.copy_(src, non_blocking=non_blocking)
            times.append(timer.stop())
        return statistics.median(times)

    def gbps(seconds: float) -> float:
        return n / seconds / 1e9 if seconds > 0 else float("inf")

    h2d_pageable = gbps(copy_time(on_dev, pageable, False))
    h2d_pinned = gbps(copy_time(on_dev, pinned, True))
    d2h_pageable = gbps(copy_time(pageable, on_dev, False))
    d2h_pinned = gbps(copy_time(pinned, on_dev, True))
    pin_times, reuse_times = [], []
    for _ in range(max(1, repeats // 2)):
        fresh = torch.empty(n, dtype=torch.uint8).fill_(2)
        t0 = time.perf_counter()
        fresh.pin_memory()
        pin_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pinned.copy_(fresh)
        reuse_times.append(time.perf_counter() - t0)
    return SizeFigures(
        n,
        h2d_pageable,
        h2d_pinned,
        d2h_pageable,
        d2h_pinned,
        statistics.median(pin_times),
        statistics.median(reuse_times),
    )
