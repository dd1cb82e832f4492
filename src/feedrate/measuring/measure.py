"""Measure one DataLoader configuration honestly: start-up apart from steady state, warm-up and
prefetched work discarded, repeated windows for the spread, per-process CPU and memory, /dev/shm.

This module orchestrates; the timing logic is in ``windows``, the process figures in
``processes``, failure handling in ``failures``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

import feedrate
from feedrate.errors import PipelineError, UserError
from feedrate.loader import started
from feedrate.loader import threaded as fetching
from feedrate.loader.batches import (
    batch_nbytes,
    batch_size_of,
    epoch_length,
    length_hint,
    sample_counter,
)
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import (
    config_of,
    is_iterable_style,
    loader_of,
    quiet_worker_count_warning,
    rebuild,
)
from feedrate.loader.threaded import unthreaded
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import interrupts, random_state, rates, runqueue, windows
from feedrate.measuring.consumer import Consumer
from feedrate.measuring.device import DeviceStep, parse_device
from feedrate.measuring.diagnosis import explain
from feedrate.measuring.failures import (
    IndexReportingCollate,
    IndexReportingDataset,
    Watchdog,
    quiesce,
    share_temp_folder,
    shut_down,
    stop_workers,
)
from feedrate.measuring.processes import ProcessProbe
from feedrate.results.measurement import Measurement, WindowSummary
from feedrate.results.processes import ProbeReport
from feedrate.results.spread import Spread
from feedrate.units import check_seconds, counted

LoaderSource = DataLoader[Any] | Callable[[], DataLoader[Any]]


def warmup_batches(config: LoaderConfig) -> int:
    """Batches to discard at the start of every epoch: one from every worker, plus the queue the
    workers fill meanwhile, so work prefetched before the window is not credited to it."""
    norm = config.normalized()
    return 1 if norm.num_workers == 0 else norm.num_workers + config.queue_depth


def measure(
    source: LoaderSource,
    config: LoaderConfig | None = None,
    *,
    batches: int | None = None,
    seconds: float | None = None,
    windows_count: int = 5,
    timeout_s: float | None = 60.0,
    wall_s: float | None = None,
    clock: windows.Clock = time.perf_counter,
    machine: MachineFacts | None = None,
    target: str | None = None,
    report_index: bool = True,
    consumer: Consumer | None = None,
    device: torch.device | str | None = "auto",
    steady: Callable[[], bool] | None = None,
) -> Measurement:
    """Measure ``source`` (a DataLoader or a zero-argument callable returning one) rebuilt with
    ``config`` (default: its own settings).

    Measures ``batches`` steady-state batches or ``seconds`` of steady state (default 10 s), in
    ``windows_count`` windows. A time budget bounds the wall time too, start-up and epoch
    restarts included: the run stops ``max(2 × seconds, seconds + start-up)`` after ``iter()``
    (``windows.WindowPlan.deadline_s``), or ``wall_s`` after it if sooner, once it has measured
    a batch; a note says so when that cut the steady state short. With a ``consumer`` each
    batch is handed to it, as a training loop would, and the result's ``stall_fraction`` is the
    share of time spent waiting for data.
    With an accelerator ``device`` ("auto": the one torch sees, if any), each batch is first
    copied to it (``non_blocking`` when the settings pin memory) and the loop waits for the copy
    and the step on the device (CUDA events), so ``pin_memory`` is judged end to end;
    ``transfer`` holds the device times.
    ``steady`` (asked at each batch once warm-up is done, until True) holds the windows back,
    e.g. until every rank of a job is warm (``distributed.channel.Gate``); the steady state
    then gets its seconds from that moment (``windows``).

    Raises ``PipelineError`` when the pipeline fails (its exception, a killed worker, no batch
    for ``timeout_s``) and ``UserError`` for bad arguments. Workers are always gone when this
    returns or raises, Ctrl-C included. The random state the loader draws on (its generators,
    torch's, Python's and numpy's) is left as it was (``random_state``).
    """
    check_seconds(timeout_s, "timeout_s")
    user_loader = loader_of(source)
    config = (config or config_of(user_loader)).normalized()
    plan = _plan(config, batches, seconds, windows_count, wall_s)
    dataset = None
    if report_index and not is_iterable_style(user_loader):
        dataset = IndexReportingDataset(unthreaded(user_loader.dataset))
    loader = rebuild(user_loader, config, dataset=dataset)
    starts = started.Starts(loader)  # forked workers seen to start
    if dataset is not None:  # a collate_fn that raises names the batch's sample indices
        loader.collate_fn = IndexReportingCollate(loader.collate_fn)
    facts = machine or collect()
    consume: Callable[[Any, int], None] | None = consumer
    on_device = None
    dev = parse_device(device) if isinstance(device, str) else device
    if dev is not None:
        on_device = DeviceStep(dev, bool(config.pin_memory), consumer)
        consume = on_device
    try:
        with interrupts.stoppable(), random_state.kept(user_loader):
            timeline, report, nbytes = _run(
                loader, starts, plan, clock, timeout_s, consume, steady, on_device
            )
    finally:
        fetching.close(loader.dataset)  # the fetch threads of num_workers=0, if any
    rate = rates.summarize(timeline.windows)
    return Measurement(
        config=config,
        samples_per_s=rate.samples_per_s,
        batches_per_s=rate.batches_per_s,
        spread=Spread.of_rates(rate.windows),
        startup_s=timeline.startup_s,
        epoch_restart_s=timeline.epoch_restart_s,
        epoch_samples=timeline.epoch_samples,
        window=_summary(timeline),
        processes=report,
        machine=facts.to_dict(),
        batch_size=batch_size_of(user_loader),
        target=target,
        notes=_notes(config, facts, timeline, report, plan, epoch_length(loader))
        + started.notes(starts),
        feedrate_version=feedrate.__version__,
        batch_bytes=nbytes,
        stall_fraction=None if consume is None else rates.stall_fraction(timeline.windows),
        consumer=None if consumer is None else consumer.to_dict(),
        transfer=None if on_device is None else on_device.figures(),
    )


def _plan(
    config: LoaderConfig,
    batches: int | None,
    seconds: float | None,
    count: int,
    wall_s: float | None = None,
) -> windows.WindowPlan:
    if batches is not None and seconds is not None:
        raise UserError("give batches or seconds, not both", params=("batches", "seconds"))
    if batches is not None and batches < count:
        raise UserError(
            f"batches must be at least {count} (one per window), got {batches}",
            params=("batches",),
        )
    check_seconds(seconds, "seconds")
    check_seconds(wall_s, "wall_s")
    return windows.WindowPlan(
        windows=count,
        batches=batches,
        seconds=None if batches is not None else (seconds or windows.DEFAULT_SECONDS),
        warmup_batches=warmup_batches(config),
        wall_s=wall_s,
        round_batches=max(1, config.normalized().num_workers),
    )


def _run(
    loader: DataLoader[Any],
    starts: started.Starts,
    plan: windows.WindowPlan,
    clock: windows.Clock,
    timeout_s: float | None,
    consumer: Callable[[Any, int], None] | None,
    steady: Callable[[], bool] | None = None,
    on_device: DeviceStep | None = None,
) -> tuple[windows.Timeline, ProbeReport, int | None]:
    current: dict[str, Any] = {"it": None, "batches": 0, "nbytes": None, "opened": False}
    counter = sample_counter(loader)

    def count(batch: Any) -> int:
        if current["nbytes"] is None:
            current["nbytes"] = batch_nbytes(batch)
        return counter(batch)

    def iterate() -> Iterator[Any]:
        with interrupts.deferred(), quiet_worker_count_warning():
            it = iter(loader)
            current["it"] = it  # set before a Ctrl-C held back meanwhile is raised
        return it

    def end(it: Iterator[Any]) -> None:  # a worker hung in its fork: all end, tried again
        stop_workers(it)
        loader._iterator = None  # persistent workers: the next iter() forks afresh
        dog.kick()  # the tries share the hang timeout (started.bound)

    def make_iter() -> Iterator[Any]:
        share_temp_folder()  # for workers stop_workers may have to terminate
        it: Iterator[Any] = started.iterate(iterate, starts, end, started.bound(timeout_s))
        probe.attach(it)
        return it

    def describe() -> str:
        return f"after {current['batches']} batches, config {plan_label}"

    def window_open() -> None:
        probe.window_open(clock())
        if on_device is not None and not current["opened"]:
            on_device.restart()  # the device's times count from the steady state on
        current["opened"] = True

    def on_batch() -> None:
        interrupts.check()
        current["batches"] += 1
        dog.kick()

    plan_label = config_of(loader).label()
    with ProcessProbe() as probe, Watchdog(timeout_s, describe) as dog:
        hooks = windows.Hooks(
            window_open=window_open,
            window_close=lambda: probe.window_close(clock()),
            batch=on_batch,
            steady=steady or (lambda: True),
        )
        try:
            timeline = windows.run(
                make_iter,
                plan,
                count,
                clock=clock,
                hooks=hooks,
                epoch_length=epoch_length(loader),
                consume=consumer,
                length_hint=length_hint(loader),
                # the loop's run-queue time is no data stall, unless it makes the batches
                queued=runqueue.of_loop(clock, loader.num_workers),
            )
        except windows.EmptyLoaderError as exc:
            raise PipelineError(why_empty(loader)) from exc
        except BaseException as exc:
            quiesce(current["it"], dog)
            error = explain(exc, current["it"])  # before stop_workers, which adds SIGTERMs
            stop_workers(current["it"])
            if error is not None:
                raise error from exc
            raise
        finally:
            dog.disarm()
            _close(loader, current["it"])
        return timeline, probe.report(), current["nbytes"]


def refuse_empty(loader: DataLoader[Any]) -> None:
    """``PipelineError`` (``why_empty``) where the loader's length says an epoch yields no
    batch (a data path that matched no file), before anything runs on it."""
    if epoch_length(loader) == 0:  # None: a stream, or a sampler with no length
        raise PipelineError(why_empty(loader))


def why_empty(loader: DataLoader[Any]) -> str:
    """Why an epoch yielded no batch, as far as the loader shows: a sampler that can be
    iterated only once (a generator: an earlier pass used it up), ``drop_last`` dropping the
    only, incomplete batch, or an empty dataset or sampler."""
    for name in ("sampler", "batch_sampler"):
        owner = getattr(loader, name, None)
        inner = getattr(owner, "sampler", owner)
        for obj in (owner, inner):
            if obj is not None and iter_once(obj):
                return (
                    f"the loader yielded no batch: its {name} is {type(obj).__name__}, which can "
                    "be iterated only once (an earlier pass used it up); give DataLoader a "
                    "Sampler or a list of indices, which every epoch iterates afresh"
                )
    size = loader.batch_size
    try:
        n = len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if loader.drop_last and size and n is not None and 0 < n < size:
        return (
            f"the loader yielded no batch: drop_last=True drops the only batch, which is "
            f"incomplete ({n} samples, batch_size={size}); use drop_last=False or a smaller "
            "batch_size"
        )
    return "the loader yielded no batch: its dataset or sampler is empty"


def iter_once(obj: object) -> bool:
    """An iterator (``iter(obj) is obj``): a second pass over it yields nothing."""
    return hasattr(obj, "__next__") and callable(getattr(obj, "__iter__", None))


def _close(loader: DataLoader[Any], it: object) -> None:
    """Shut the workers down now rather than whenever the garbage collector gets to them (the
    iterator inside a generator ``__iter__`` and the persistent one too)."""
    shut_down(it, loader)


def _summary(t: windows.Timeline) -> WindowSummary:
    wins = rates.steady(t.windows)  # the totals of the windows the rate is taken from
    return WindowSummary(
        batches=sum(w.batches for w in wins),
        samples=sum(w.samples for w in wins),
        seconds=sum(w.seconds for w in wins),
        epochs=t.epochs,
        method=t.method,
        warmup_batches=t.warmup_batches,
        warmup_s=t.warmup_s,
    )


def _notes(
    config: LoaderConfig,
    facts: MachineFacts,
    t: windows.Timeline,
    report: ProbeReport,
    plan: windows.WindowPlan,
    epoch: int | None = None,
) -> list[str]:
    notes = []
    if epoch is not None and config.num_workers > epoch:
        notes.append(
            f"num_workers={config.num_workers} is more than the {epoch} batches of an epoch: "
            f"{config.num_workers - epoch} workers get no batch to make (each makes whole "
            "batches), yet every one starts and takes memory"
        )
    ours = report.own_cpu
    ours += report.probe_cpu_s / report.wall_s if report.wall_s > 0 else 0.0
    if report.system_busy_cpus is not None and report.system_busy_cpus - ours > 0.25:
        notes.append(
            f"other processes kept {report.system_busy_cpus - ours:.1f} of the "
            f"{facts.cpus_usable} CPUs busy during the measurement: rates are lower, and "
            "vary more, than on a quiet machine"
        )
    over = over_cpus_note(config.num_workers, facts.cpus_usable)
    if over is not None:
        notes.append(over)
    if t.method == "whole-epochs":
        notes.append(
            "epochs are short against the warm-up (one batch per worker plus the prefetch "
            "queue), so after a first epoch whole epochs were timed, each restart included"
        )
    if t.stopped_by_deadline:
        notes.append(deadline_note(t, plan))
    if t.unaligned:
        notes.append(
            f"the windows opened after {t.steady_wait_s:.1f} s of waiting for the other ranks "
            "to be warm, without them: they overlap another rank's start-up"
        )
    if not t.windows:
        notes.append("no steady-state batch was measured")
    return notes


def over_cpus_note(workers: int, cpus: int) -> str | None:
    """The note on more workers than this process's usable CPUs, or None. A job's ranks are
    judged together instead, the workers of all its ranks against the node's CPUs
    (``node-worker-oversubscription``), which ``measure_node`` puts in its place."""
    if workers <= cpus:
        return None
    return (
        f"num_workers={workers} is above the {counted(cpus, 'usable CPU')}: "
        "this pays off only when workers mostly wait (latency-bound pipelines)"
    )


def deadline_note(t: windows.Timeline, plan: windows.WindowPlan) -> str:
    """Why the steady state is shorter than asked: the deadline, and what ate into it."""
    measured = sum(w.seconds for w in rates.steady(t.windows))  # as the totals reported
    asked = f"of the {plan.seconds:g} s asked for" if plan.seconds is not None else "in all"
    spent = f"start-up ({t.startup_s:.2f} s) counts"
    if t.epoch_restart_s:
        each = sum(t.epoch_restart_s) / len(t.epoch_restart_s)
        n = len(t.epoch_restart_s)
        spent = f"start-up ({t.startup_s:.2f} s) and {n} epoch restarts ({each:.2f} s each) count"
    said = f"the run stopped at its deadline, {t.deadline_s or 0:.1f} s after iter(): {spent}"
    if plan.seconds is not None and measured >= plan.seconds:  # whole epochs, restarts in
        return f"{said} against the time"
    return f"{said} against the time, so {measured:.2f} s {asked} were measured in steady state"
