"""``tune``: measure the user's settings, search guided by what each trial shows, recommend.

Orchestration only: the search itself is ``TuneSearch`` (``workflows.tune_search``), measuring
is ``measure``, deciding is ``search``/``advice``/``checks``, rendering is elsewhere. The result
is plain data (``TuneResult``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader

from feedrate.autotuning.start import unsplit_stream
from feedrate.checks import transfer as checks_transfer
from feedrate.distributed.node import of_node, share
from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.loader.batches import epoch_length, thread_cap
from feedrate.loader.code import code_line
from feedrate.loader.rebuild import (
    built_per_run,
    config_of,
    is_iterable_style,
    loader_of,
    supports,
)
from feedrate.loader.shards import distributed_sampler
from feedrate.machine import cache
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import device as devices
from feedrate.measuring import interrupts, random_state
from feedrate.measuring.consumer import make_consumer
from feedrate.results.findings import Finding, by_severity
from feedrate.results.tune import TuneResult
from feedrate.search.budgets import space_for
from feedrate.search.space import Space, most_workers
from feedrate.units import check_seconds
from feedrate.workflows import tune_node
from feedrate.workflows.tune_search import Progress, TuneSearch

#: The fewest seconds a search can do anything useful in: the baseline and two anchors.
MIN_BUDGET_S = 5.0

#: The dataset checks after the search stop a step as hung after this long at most (s), the
#: doctor's own default.
DOCTOR_TIMEOUT_S = 30.0


def tune(
    source: DataLoader[Any] | Callable[[], DataLoader[Any]],
    *,
    rate: float | None = None,
    step_time: float | None = None,
    step: Callable[[Any], object] | None = None,
    step_name: str | None = None,
    budget_s: float = 60.0,
    max_workers: int | None = None,
    memory_limit: int | None = None,
    allow_reorder: bool = False,
    allow_threads: bool = False,
    fresh: bool = False,
    use_cache: bool = True,
    trial_seconds: float = 2.0,
    timeout_s: float = 60.0,
    target: str | None = None,
    progress: Callable[[Progress], None] | None = None,
    machine: MachineFacts | None = None,
    device: str | None = "auto",
    coordinate: bool | None = None,
    shard: bool = False,
) -> TuneResult:
    """Find the best DataLoader settings for ``source`` on this machine.

    Without a consumer the answer is the fastest configuration (the cheapest among those within
    the noise of the fastest); with ``rate`` (samples/s), ``step_time`` (s per batch) or ``step``
    (a callable taking a batch) it is the fewest workers that keep that consumer fed. The search
    stops when gains fall within the noise or ``budget_s`` is spent (the result then says it is
    partial). ``memory_limit`` bounds the workers' predicted memory (bytes, default half of
    what is available). Results are cached per machine and pipeline unless ``fresh``.

    ``budget_s`` bounds the wall time, workers' start-up included: each trial gets at most
    ``trial_seconds`` of steady state and half of what is left of the budget, and ends within
    what is left; no trial starts that the last one's length says would not fit. A trial that
    receives no batch for ``timeout_s`` (or for what is left of the budget, if less) is stopped
    as hung; your settings' trial hanging raises ``PipelineTimeoutError``. The dataset checks
    after the search add a few seconds.

    Where workers mostly wait, threads inside workers (``feedrate.threaded``) are measured too,
    after a thread-safety check; they are recommended only with ``allow_threads`` (they need a
    thread-safe ``__getitem__``), otherwise a finding says what they measured.

    Where an accelerator exists (``device``: "auto", a torch device name, or "cpu" for none),
    every trial copies each batch to it, and ``pin_memory`` is tried both ways on the answer.

    In a distributed job (``torch.distributed`` initialized with several ranks; ``coordinate``
    None or True), call it in every rank at the same point: every trial is measured with all
    ranks loading at once, each on its own shard (its ``DistributedSampler``, or one made for
    the measurement with ``shard``), within its share of the node's CPUs, memory and
    /dev/shm; the figure is the slowest rank's, rank 0 decides, every rank runs the dataset
    checks on its own loader, and every rank returns the same result
    (``feedrate.workflows.tune_node``). ``coordinate=False`` tunes this process alone.

    The random state your loader draws on (its generators, torch's, Python's and numpy's) is
    left as it was: tuned in the training process, your loader's batches are those it would
    have given (``result.loader()``'s, see there).
    """
    _check_budget(budget_s, trial_seconds, max_workers, memory_limit, timeout_s)
    built_per_run(source)  # before sharding makes a function of it
    channel = tune_node.channel(coordinate, budget_s, timeout_s)
    user = source  # what the answer is for: with ``shard``, trials read a shard made for them
    if channel is not None and shard:
        source = tune_node.shard_source(source, channel.ranks)
    loader = loader_of(source)
    dev = devices.parse_device(device)
    consumer = make_consumer(rate=rate, step_time=step_time, step=step, step_name=step_name)
    node_facts = machine or collect()
    facts = node_facts
    if channel is not None:
        facts = share(node_facts, channel.ranks.local_world, channel.ranks.node_cpus)
        node_facts = of_node(node_facts, channel.ranks.node_cpus)
    unsplit, copies = _unsplit(loader, channel)
    own, shards = config_of(loader), libraries.worker_limit(loader.dataset)
    space = space_for(
        facts,
        own,
        consumer=consumer is not None,
        max_workers=max_workers,
        memory_limit=memory_limit,
        allow_reorder=allow_reorder and not is_iterable_style(loader) and supports("in_order"),
        epoch_batches=epoch_length(loader),
        parts=min(own.num_workers, shards or own.num_workers) if unsplit else shards,
    )
    space = replace(
        space,
        max_threads=thread_cap(loader),
        kept_workers=unsplit,
        copies_past=1 if copies else None,
        allow_threads=allow_threads or space.baseline.threads > 1,
    )
    options = cache.tune_options(
        device=None if dev is None else str(dev),
        consumer=consumer.to_dict() if consumer else None,
        max_workers=max_workers,
        memory_limit=memory_limit,
        allow_reorder=allow_reorder,
        allow_threads=allow_threads,
        ranks=None if channel is None else channel.ranks.to_dict(),
    )
    cache_key = cache.key(facts, loader, options)
    # Over the ranks of a job: each trial measured by all of them (``tune_node.NodeSearch``).
    search_kwargs: dict[str, Any] = {}
    if channel is not None:
        search_kwargs = {"channel": channel, "node": node_facts}
    run = (TuneSearch if channel is None else tune_node.NodeSearch)(
        loader,
        space,
        consumer,
        trial_seconds,
        budget_s,
        facts,
        target,
        progress,
        dev,
        timeout_s=timeout_s,
        source=source if callable(source) and not isinstance(source, DataLoader) else loader,
        **search_kwargs,
    )

    def checks(result: TuneResult) -> list[Finding]:
        return _doctor_checks(loader, facts, result, min(timeout_s, DOCTOR_TIMEOUT_S))

    def searched() -> TuneResult:
        if use_cache and not fresh:
            hit = _from_cache(cache_key, source, run.space)
            if hit is not None:
                hit.target = target  # the same pipeline (settings included) under this name
                return hit
        with interrupts.stoppable():
            result = run.search()
        found = checks(result) if channel is None else tune_node.checked(channel, checks, result)
        every = checks_transfer.without_guesses([*result.findings, *found])
        result.findings = by_severity(every)
        if use_cache and not result.partial:
            cache.save(cache_key, result.to_dict())
        return result

    with random_state.kept(loader):  # trials, checks and a consumer's timed step draw on it
        result = (
            searched() if channel is None else tune_node.coordinated(channel, searched, run, checks)
        )
    result._source = user
    if user is not source:  # the code line of the user's loader, not of the shard's
        yours = loader_of(user)
        result.code = code_line(yours, result.best.config)
        if result.ranks is not None and distributed_sampler(yours) is None:
            result.ranks["shard_made"] = True  # the answer says what its figures hold for
    return result


def _unsplit(loader: DataLoader[Any], channel: Any) -> tuple[str | None, bool]:
    """Why an IterableDataset's loader keeps its worker count (``unsplit_stream``: each added
    worker may yield the whole stream once more, so its samples/s would count copies), or None;
    and whether 2 workers were seen to yield the same samples. In a job, every rank's probe is
    gathered and the first reason holds for all."""
    mine: tuple[str | None, bool] = (None, False)
    if is_iterable_style(loader):
        why, _, same = unsplit_stream(loader, "tune")
        mine = (why, same)
    if channel is None:
        return mine
    return next((seen for seen in channel.all_gather(mine) if seen[0]), (None, False))


def _check_budget(
    budget_s: float, trial_s: float, max_workers: int | None, mem: int | None, timeout_s: float
) -> None:
    if not math.isfinite(budget_s):
        raise UserError(
            f"budget_s must be a number of seconds, got {budget_s:g}", params=("budget_s",)
        )
    if budget_s < MIN_BUDGET_S:
        raise UserError(
            f"budget_s={budget_s:g} is too short to measure anything: a search needs at least "
            f"{MIN_BUDGET_S:g} s (your settings and two alternatives); the default is 60",
            params=("budget_s",),
        )
    check_seconds(trial_s, "trial_seconds")
    if max_workers is not None and max_workers < 0:
        raise UserError(
            f"max_workers must be 0 or more, got {max_workers}", params=("max_workers",)
        )
    if mem is not None and mem <= 0:
        raise UserError("memory_limit must be positive", params=("memory_limit",))
    check_seconds(timeout_s, "timeout_s")


def _doctor_checks(
    loader: DataLoader[Any], facts: MachineFacts, result: TuneResult, timeout_s: float
) -> list[Finding]:
    """The doctor's dataset and resource checks (shared generators, duplicate streams, copies
    of Python objects, threads, /dev/shm, open files), a few seconds at most."""
    from feedrate.workflows.doctor import tune_checks

    return tune_checks(loader, facts, result.baseline, result.best, timeout_s=timeout_s)


def _from_cache(cache_key: str, source: Any, space: Space) -> TuneResult | None:
    """The cached result, unless unreadable or its answer has more workers than ``space``
    allows now (``most_workers``: a limit of processes and threads that the run cached did not
    have): then None, and tune searches again."""
    document = cache.load(cache_key)
    if document is None:
        return None
    try:
        result = TuneResult.from_dict(document)
    except (KeyError, TypeError, ValueError):
        return None  # an unreadable entry (older format): tune again
    best = result.best.config
    if best.num_workers > most_workers(space, best.threads):
        return None
    result.from_cache = True
    result._source = source
    return result
