"""Where ``autotune`` starts: the settings an earlier run left in the cache (its own, or those of
a plain ``tune`` of the same loader on this machine), else yours when they use workers, else one
worker per usable CPU (more for a stream whose workers mostly wait); and whether an
IterableDataset may be given workers at all.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from torch.utils.data import DataLoader

from feedrate.checks import streams
from feedrate.checks.machine import shm_finding, shm_fitting
from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.loader.batches import batch_size_of, epoch_length, thread_cap
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, is_iterable_style
from feedrate.machine import cache
from feedrate.machine.facts import MachineFacts
from feedrate.measuring import device as devices
from feedrate.measuring.measure import warmup_batches
from feedrate.measuring.shm import RETIME_BELOW_S, MainBatch, main_process_batch
from feedrate.measuring.workers import stream_digests
from feedrate.search.budgets import space_for
from feedrate.search.rounds import fewest_alike, the_fewest
from feedrate.search.scaling import map_start, stream_start
from feedrate.search.space import Space, most_workers
from feedrate.search.tuner import OnlineTuner, online

#: A map-style loader starts above one worker per CPU only when its first batch was on a CPU at
#: most this share of the time: one batch is a small sample (a busy machine, first calls), and
#: a CPU-bound one read as 0.4-0.9 on this project's 2 CPUs beside two busy loops; a loader
#: waiting on storage or a network reads a few percent.
WAITING_SHARE = 0.15

#: How ``started_from`` reads when the settings came from the cache.
FROM_CACHE = "the cached settings of an earlier run"


@dataclass(frozen=True)
class Start:
    """Where autotune starts: ``config`` (``started_from`` says why) in ``space``; ``settled``
    when it only watches (cached settings, or an IterableDataset kept without workers), with
    the ``stall`` the cached settings left this loop where known; ``cache_key``: where it keeps
    what it settles on (None: no cache)."""

    config: LoaderConfig
    started_from: str
    settled: bool
    stall: float | None
    space: Space
    cache_key: str | None

    def to_dict(self) -> dict[str, Any]:
        """Plain data, to send to the other ranks of a job."""
        space = {**asdict(self.space), "baseline": self.space.baseline.to_dict()}
        return {**asdict(self), "config": self.config.to_dict(), "space": space}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Start:
        space = {**doc["space"], "baseline": LoaderConfig.from_dict(doc["space"]["baseline"])}
        return cls(
            **{**doc, "config": LoaderConfig.from_dict(doc["config"]), "space": Space(**space)}
        )


def accelerator() -> str | None:
    """The device a plain ``tune(loader)`` copies batches to on this machine (its
    ``device="auto"``), named as its cache key names it; None without an accelerator."""
    dev = devices.parse_device("auto")
    return None if dev is None else str(dev)


def starting_point(
    loader: DataLoader[Any],
    facts: MachineFacts,
    *,
    max_workers: int | None,
    allow_threads: bool,
    use_cache: bool,
    split: bool,
) -> Start:
    """Where autotune starts on ``loader`` (``split``: its index stream is split between
    lanes, so threads inside workers may help), within tune's budgets: memory (and a cgroup
    limit), /dev/shm, open files, ``max_workers``."""
    own = cache.key(
        facts,
        loader,
        cache.autotune_options(max_workers=max_workers, allow_threads=allow_threads),
    )
    space = space_for(
        facts,
        config_of(loader),
        consumer=True,
        max_workers=max_workers,
        epoch_batches=epoch_length(loader),
        parts=libraries.worker_limit(loader.dataset),
    )
    space = replace(
        space, max_threads=thread_cap(loader) if split else 1, allow_threads=allow_threads
    )
    keys = []
    if use_cache:  # the device is resolved only then: on a GPU, that initializes CUDA
        keys = [own, cache.key(facts, loader, cache.tune_options(device=accelerator()))]
    # An IterableDataset that does not split its stream by worker yields all of it once per
    # worker: its worker count changes only when 2 workers were seen to yield different
    # samples (a few seconds, once) or its library is known to split it.
    unsplit, share, _ = unsplit_stream(loader) if is_iterable_style(loader) else (None, None, False)
    space = replace(space, busy_worker_cpu=share, batch_size=batch_size_of(loader))
    first = functools.cache(functools.partial(first_batch, loader))  # made once, if at all
    config, started_from, stall = _start_config(loader, facts, space, keys, first)
    config, started_from = within_shm(facts, config, started_from, first)
    if unsplit is not None:
        kept = f"your settings: an IterableDataset keeps its worker count: {unsplit}"
        config, started_from = config_of(loader), kept
    settled = unsplit is not None or started_from == FROM_CACHE
    return Start(config, started_from, settled, stall, space, own if use_cache else None)


def check_arguments(*, max_workers: int | None, rate: float | None, budget_s: float) -> None:
    """``autotune``'s arguments, or a UserError naming the one that is wrong."""
    if max_workers is not None and max_workers < 0:
        raise UserError(f"max_workers must be 0 or more, got {max_workers}")
    if rate is not None and not (isinstance(rate, int | float) and 0 < rate < float("inf")):
        raise UserError(f"rate must be a positive number of samples/s, got {rate!r}")
    if not (isinstance(budget_s, int | float) and budget_s > 0):
        raise UserError(f"budget_s must be a positive number of seconds, got {budget_s!r}")


def tuner_for(start: Start, *, rate: float | None, budget_s: float, counted: bool) -> OnlineTuner:
    """The online tuner from ``start`` (``counted``: one rank of a job, see ``OnlineTuner``)."""
    return OnlineTuner(
        start.space,
        start.config,
        start.started_from,
        settled=start.settled,
        settled_stall=start.stall,
        warmup=warmup_batches,
        rate=rate,
        budget_s=budget_s,
        counted=counted,
    )


def within_shm(
    facts: MachineFacts,
    config: LoaderConfig,
    started_from: str,
    first: Callable[[], MainBatch | None],
) -> tuple[LoaderConfig, str]:
    """``config``, or the nearest configuration whose batches in flight fit /dev/shm when
    ``config``'s are predicted to overflow it (``shm_finding``, sized by the ``first`` batch,
    made in the main process, so no worker starts first; None where that would break the
    dataset), with ``started_from`` saying why."""
    if config.num_workers == 0 or facts.shm_free_bytes is None:
        return config, started_from
    made = first()
    if made is None:
        return config, started_from
    machine = facts.to_dict()
    batch = made.bytes
    found = shm_finding(config, machine, batch)
    if found is None:
        return config, started_from
    fitting = online(shm_fitting(config, machine, batch))
    why = f"{started_from}, lowered from {config.label()} (shm-too-small: {found.message})"
    return fitting, why


def save(cache_key: str | None, config: LoaderConfig, stall: float) -> None:
    """The settings, and the stall they left this loop (the reference the next run watches
    against: a loop that cannot be fed must not look like a stall come back)."""
    if cache_key is not None:
        doc = {"schema": "feedrate.autotune/1", "config": config.to_dict(), "stall": stall}
        cache.save(cache_key, doc)


def _start_config(
    loader: DataLoader[Any],
    facts: MachineFacts,
    space: Space,
    keys: list[str],
    first: Callable[[], MainBatch | None],
) -> tuple[LoaderConfig, str, float | None]:
    """The cached settings under ``keys`` (autotune's own first; within max_workers, the tasks
    budget and allow_threads), else yours when they use workers, else one worker per usable CPU with
    your other settings, or more for a loader that mostly waits: a stream whose probe workers
    did (``space.busy_worker_cpu``: its first epoch runs whole on the count it starts at), or
    a map-style loader whose ``first`` batch, made in this process, did (its first trial at
    one worker per CPU would take seconds of an epoch at a fraction of the speed)."""
    for key in keys:
        doc = cache.load(key)
        config = _cached_config(doc)
        fits = config is not None and config.num_workers <= most_workers(space, config.threads)
        if config is not None and fits and (config.threads == 1 or space.allow_threads):
            stall = doc.get("stall") if doc and key == keys[0] else None
            return online(config), FROM_CACHE, stall if isinstance(stall, float) else None
    own = config_of(loader)
    if own.num_workers > 0:
        most = max(1, most_workers(space, own.threads))
        if own.num_workers <= most:
            return online(own), "your settings", None
        limit = "task-limit" if most < space.max_workers else "max_workers, shards or batches"
        why = f"your settings, lowered from {own.num_workers} workers to {most} ({limit})"
        return online(replace(own, num_workers=most)), why, None
    most = most_workers(space)
    w = min(facts.cpus_usable, most)
    why = f"{w} workers, one per usable CPU"
    waiting = stream_start(facts.cpus_usable, space.busy_worker_cpu, most)
    if waiting is None and w > 0 and not is_iterable_style(loader):
        share = waiting_share(first())
        waiting = map_start(facts.cpus_usable, share, most)
    if waiting is not None:
        w, why = waiting.workers, waiting.what
        fewest = fewest_alike(w, space.epoch_batches)
        if fewest < w and space.epoch_batches:  # as many rounds of the epoch, fewer processes
            w, why = fewest, f"{why}; {the_fewest(fewest, space.epoch_batches)}"
    start = replace(own, num_workers=w, prefetch_factor=2 if w else None)
    return online(start), why, None


def first_batch(loader: DataLoader[Any]) -> MainBatch | None:
    """The loader's first batch made in this process (``main_process_batch``; its CPU share
    read from the second where the first was short), or None for a dataset that this would
    break (``libraries.unsafe_to_iterate_here``: the workers after it)."""
    if libraries.unsafe_to_iterate_here(loader.dataset) is not None:
        return None
    return main_process_batch(loader, retime_below_s=RETIME_BELOW_S)


def waiting_share(made: MainBatch | None) -> float | None:
    """The share of its time the first batch spent on a CPU, where at most ``WAITING_SHARE``;
    None above it, or where no batch was made or timed."""
    share = None if made is None else made.cpu_share
    return share if share is not None and share <= WAITING_SHARE else None


def _cached_config(doc: dict[str, Any] | None) -> LoaderConfig | None:
    if not doc:
        return None
    with contextlib.suppress(KeyError, TypeError, ValueError, UserError):
        if doc.get("schema") == "feedrate.autotune/1":
            return LoaderConfig.from_dict(doc["config"])
        return LoaderConfig.from_dict(doc["best"]["config"])
    return None


def unsplit_stream(
    loader: DataLoader[Any], who: str = "autotune", timeout_s: float = 30.0, raises: bool = False
) -> tuple[str | None, float | None, bool]:
    """Why an IterableDataset loader must keep its own worker count, or None (its library is
    known to split the stream by worker, or 2 workers were seen to yield different samples,
    by identity or by content seeded alike: never on too little to tell). With workers of
    its own, each added worker would yield the whole stream once more. Beside it, the share
    of their time the 2 workers making items were on a CPU, where they were seen to split;
    and whether the 2 workers were seen to yield the same samples (not too few to tell).
    ``raises``: a probe that fails raises, for a caller with no count to keep safe."""
    if libraries.splits_by_worker(loader.dataset) is not None:
        return None, None, False  # known to split (and probing would use up a MosaicML epoch)
    if libraries.worker_limit(loader.dataset) == 1:  # a probe's 2nd worker would stop at once
        return (
            (
                "its library gives each worker whole shards and it has 1, so a second worker would "
                f"have nothing to read (make more shards to let {who} choose the workers: "
                "to_iterable_dataset(num_shards=N), more shard files)"
            ),
            None,
            False,
        )
    try:
        digests = stream_digests(loader, limit=32, seconds=2.0, timeout_s=timeout_s)
    except Exception as exc:  # the check itself failed: stay safe
        if raises:
            raise
        return f"the check of its stream failed ({exc})", None, False
    seen = streams.stream_verdict(digests)
    if seen.verdict == "split":
        return None, digests.cpu_share, False
    why = {
        "duplicates": f"2 workers did not yield different items (the same samples, by {seen.by})",
        "unknown": "2 workers did not yield different items that could be told apart (too few "
        "distinct ones)",
    }[seen.verdict]
    return (
        (
            f"{why}, so each worker may yield the whole stream (split it by get_worker_info() to "
            f"let {who} choose the workers)"
        ),
        None,
        seen.verdict == "duplicates",
    )
