"""What limits a pipeline, from where its CPU time went: the ``bottleneck`` finding.

A pure rule over measured trials. Without a consumer: ``search.bottleneck``'s kinds (workers
CPU-bound, latency-bound, main-process-bound, ...), with time spent moving large batches between
processes told apart as IPC-bound, and workers that cost more than they save told apart by a
run without workers. With a consumer (``Pace``): consumer-bound, data-bound (and what limits the
loader), or the loader and the training step competing for CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from feedrate.results.findings import Finding, FindingDoc
from feedrate.results.trial import Trial
from feedrate.search.bottleneck import (
    LABELS,
    Bottleneck,
    busy_words,
    classify,
    faster,
    ipc_bytes_per_s,
)
from feedrate.search.space import STALL_MARGIN
from feedrate.units import size

#: With a consumer, the loader alone must be this much faster than the consumer alone for a
#: data stall to be blamed on running them together rather than on the loader's pace.
CONTENTION_MARGIN = 1.25

_HELPS: dict[Bottleneck, str] = {
    "no-workers": "keep num_workers=0; for more speed, cheaper per-batch work or bigger batches",
    "main-process": "cheapen collation (a collate_fn that builds one tensor), smaller batches "
    "through shared memory, or fewer, larger samples",
    "cpu": "more CPUs, cheaper per-sample work (decode at lower resolution, move augmentation "
    "to the GPU), or fewer threads per worker",
    "latency": "more workers (or threads inside workers), or caching the remote data locally",
    "unknown": "measure with a consumer (--rate, --step-time or --step) to see the data stall",
    "ipc": "fewer bytes per batch (uint8 instead of float32; crop, decode or normalize on the "
    "accelerator), or fewer, larger tensors per batch",
    "consumer": "speed up the training step; the loader has headroom",
    "contention": "leave CPUs to the training step (fewer workers, cheaper samples) or run the "
    "step on the accelerator",
    "uneven": "a deeper queue (prefetch_factor=4) or one more worker",
}


def _evidence(
    t: Trial, cpus: int, kind: str, batch_size: int | None, no_workers: Trial | None = None
) -> str:
    queued = t.worker_demand_mean - t.worker_cpu_mean
    text = (
        f"main process {t.main_cpu:.0%} of a core, workers {t.workers_cpu:.0%} in total "
        f"({t.worker_cpu_mean:.0%} each, {queued:.0%} more queued for a CPU) at "
        f"{t.config.label()} on {cpus} usable CPU{'s' if cpus != 1 else ''}"
    )
    busy, others = busy_words(t, cpus)
    if kind == "cpu" and others:  # the CPUs full beyond its own load
        text += f"; {busy}"
    rate = ipc_bytes_per_s(t, batch_size)
    if kind == "ipc" and rate is not None and t.batch_bytes:
        text += f"; {size(rate)}/s of batches ({size(t.batch_bytes)} each) through shared memory"
    if t.config.num_workers and no_workers is not None and faster(no_workers, t):
        text += (
            f"; with no workers it makes {no_workers.median:,.0f} samples/s against "
            f"{t.median:,.0f}: handing batches between processes costs more than it saves"
        )
    return text


@dataclass(frozen=True)
class Pace:
    """A run with a consumer: ``together`` (loader and consumer), the same settings with the
    loader alone, the consumer alone (samples/s), and whether the consumer uses host CPU (a
    real training step on the CPU does; a simulated accelerator does not). Either "alone" may
    be unknown."""

    together: Trial
    loader_alone: Trial | None = None
    consumer_alone: float | None = None
    uses_cpu: bool = False

    @property
    def stall(self) -> float:
        return self.together.stall_fraction or 0.0

    def loader_keeps_up(self) -> bool:
        """The loader alone is clearly faster than the consumer alone."""
        alone = self.loader_alone
        if alone is None or not alone.measured or not self.consumer_alone:
            return False
        return alone.median >= self.consumer_alone * CONTENTION_MARGIN

    def subject(self) -> Trial:
        """The run that shows the loader's own limits: alone when measured, else together."""
        alone = self.loader_alone
        return alone if alone is not None and alone.measured else self.together

    def evidence(self) -> str:
        parts = [
            f"together {self.together.median:,.0f} samples/s at {self.together.config.label()}"
        ]
        if self.loader_alone is not None and self.loader_alone.measured:
            parts.append(f"the loader alone makes {self.loader_alone.median:,.0f} samples/s")
        if self.consumer_alone:
            parts.append(f"the consumer alone takes {self.consumer_alone:,.0f} samples/s")
        return "; ".join(parts)


def bottleneck_kind(
    best: Trial,
    cpus: int,
    batch_size: int | None = None,
    pace: Pace | None = None,
    no_workers: Trial | None = None,
) -> Bottleneck:
    """The pipeline's class: ``classify``'s kinds, or with a consumer "consumer" (it waits for
    data at most ``STALL_MARGIN`` of the time), "contention" (the loader alone keeps up, but not
    next to a training step on the CPU), "uneven" (it keeps up alone but not together, the step
    using no CPU), else the kind of what limits the loader."""
    if pace is None:
        return classify(best, cpus, batch_size, no_workers)
    if pace.stall <= STALL_MARGIN:
        return "consumer"
    if pace.loader_keeps_up():
        return "contention" if pace.uses_cpu else "uneven"
    return classify(pace.subject(), cpus, batch_size)


def pace_of(best: Trial, consumer: bool, pace: Pace | None = None) -> Pace | None:
    """With a consumer and no separate runs of the loader and the consumer alone, ``best`` is
    taken as the run together."""
    if consumer and pace is None and best.stall_fraction is not None:
        return Pace(best)
    return pace


def bottleneck_finding(
    best: Trial,
    cpus: int,
    consumer: bool,
    *,
    batch_size: int | None = None,
    pace: Pace | None = None,
    no_workers: Trial | None = None,
    workers_tried: bool = True,
) -> Finding:
    """What limits the pipeline, from where the CPU time of ``best`` went; ``no_workers`` (the
    pipeline measured without workers) shows when workers cost more than they save. With a
    consumer, from comparing the loader alone, the consumer alone and both together (``pace``;
    without one, ``best`` is taken as the run together). Where no configuration with workers
    was measured (``workers_tried`` False), a busy main process is not "fastest without
    workers": nothing was compared."""
    pace = pace_of(best, consumer, pace)
    kind = bottleneck_kind(best, cpus, batch_size, pace, no_workers)
    if kind == "no-workers" and not workers_tried:
        kind = "main-process"
    if pace is None:
        evidence = _evidence(best, cpus, kind, batch_size, no_workers)
        message = f"{LABELS[kind]}: {evidence}"
        helps = _HELPS[kind]
        if kind == "main-process" and best.config.num_workers == 0:  # the dataset's own work
            helps = "move the work into worker processes: DataLoader(..., num_workers=N)"
        return Finding("bottleneck", "info", message, helps)
    stall, seen = pace.stall, pace.evidence()
    if kind == "consumer":
        message = (
            f"consumer-bound: the consumer waits for data only {stall:.0%} of the time ({seen}):"
            " the model, not the loader, sets the pace"
        )
        return Finding("bottleneck", "info", message, _HELPS["consumer"])
    if kind in ("contention", "uneven"):
        why = (
            f"the loader and the training step compete for the {cpus} usable "
            f"CPU{'s' if cpus != 1 else ''}"
            if kind == "contention"
            else "batches arrive too unevenly for the prefetch queue to absorb"
        )
        message = f"{LABELS[kind]}: the consumer waits for data {stall:.0%} of the time "
        message += f"although the loader alone keeps up ({seen}): {why}"
        return Finding("bottleneck", "info", message, _HELPS[kind])
    subject = pace.subject()
    helps = _HELPS[kind]
    if kind == "no-workers" or (kind == "main-process" and subject.config.num_workers == 0):
        helps = "move the work into worker processes: DataLoader(..., num_workers=N)"
    message = (
        f"data-bound: the consumer waits for data {stall:.0%} of the time ({seen}); "
        f"{LABELS[kind]}: {_evidence(subject, cpus, kind, batch_size)}"
    )
    return Finding("bottleneck", "info", message, helps)


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
    FindingDoc(
        id="bottleneck",
        title="What limits the pipeline",
        means=(
            "What limits this pipeline's rate, as one kind of one vocabulary: `no-workers`, "
            "`main-process`, `cpu`, `latency`, `ipc`, `consumer`, `contention`, `uneven` or "
            "`unknown`. It is not a problem in itself: it says which lever can help and which "
            "cannot."
        ),
        evidence=(
            "From `tune` (the recommended configuration) and `doctor` (your settings and the "
            "alternatives it measured): where the CPU time went over the measured windows, that is "
            "the main process's share of a core, the workers' CPU in total and each, and the time "
            "they spent queued for a CPU (Linux schedstat), against the usable CPUs; the bytes per "
            "second of batches crossing shared memory; a run without workers, where one was "
            "measured. With a consumer: the loader alone, the consumer alone and the two together, "
            "and the share of time the consumer waited for data."
        ),
        fix=(
            "The finding's own fix line, by kind: `no-workers` keep `num_workers=0` (cheaper "
            "per-batch work or bigger batches for more speed); `main-process` a `collate_fn` that "
            "builds one tensor, smaller batches through shared memory, or fewer, larger samples; "
            "`cpu` more CPUs, cheaper per-sample work, or fewer threads per worker; `latency` more "
            "workers or threads inside workers, or a local cache of the remote data; `ipc` fewer "
            "bytes per batch (`uint8` instead of `float32`, crop, decode or normalize on the "
            "accelerator); `consumer` a faster training step, the loader has headroom; "
            "`contention` leave CPUs to the training step or run it on the accelerator; `uneven` a "
            "deeper queue (`prefetch_factor=4`) or one more worker; `unknown` measure with a "
            "consumer (`--rate`, `--step-time` or `--step`)."
        ),
        severity="info",
    ),
)
