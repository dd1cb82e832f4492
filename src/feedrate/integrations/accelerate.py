"""accelerate: the loaders ``Accelerator.prepare`` returns (``DataLoaderShard``,
``DataLoaderDispatcher``) wrap a DataLoader, their ``base_dataloader``, which they iterate each
epoch. ``tune_prepared(accelerator, loader)`` tunes that DataLoader and puts the tuned one in its
place, so the prepared loader keeps its device placement, sharding, RNG synchronisation and
state, and loads with the new settings from its next epoch.

With ``dispatch_batches`` (accelerate's default for an ``IterableDataset`` on several
processes), the main process loads the batches of every process and sends each its share:
``dispatch_note`` says what that means for the settings. accelerate is imported only when a
function here needs it.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from torch.utils.data import DataLoader

from feedrate.errors import UserError
from feedrate.integrations import framework_of, loader_from
from feedrate.integrations.shared import (
    evidence,
    in_words,
    local_ranks,
    share_cpus,
    tune_shared,
)
from feedrate.results.tune import TuneResult

__all__ = ["broadcast_from_main", "dispatch_note", "is_dispatching", "swap_in", "tune_prepared"]


def broadcast_from_main(obj: Any) -> Any:
    """The main process's ``obj`` on every process (accelerate's ``broadcast_object_list``)."""
    utils = importlib.import_module("accelerate.utils")
    box = [obj]
    utils.broadcast_object_list(box, from_process=0)
    return box[0]


def is_dispatching(prepared: object) -> bool:
    """Whether ``prepared`` is accelerate's ``DataLoaderDispatcher``: the main process loads
    for all processes."""
    return framework_of(prepared) == "accelerate" and type(prepared).__name__ == (
        "DataLoaderDispatcher"
    )


def dispatch_note(prepared: object, num_processes: int) -> str | None:
    """What ``dispatch_batches`` means for ``prepared``'s settings, or None when each process
    loads its own batches."""
    if not is_dispatching(prepared):
        return None
    share = "its share of each batch" if getattr(prepared, "split_batches", False) else ("a batch")
    return (
        f"dispatch_batches=True: the main process loads the batches of every process "
        f"({num_processes} here) and sends each {share}, so its DataLoader must deliver "
        f"{num_processes}× what one process's step takes; tune it with rate= that total, or "
        "prepare the loader with DataLoaderConfiguration(dispatch_batches=False) so every "
        "process loads its own shard"
    )


def swap_in(prepared: Any, result: TuneResult) -> DataLoader[Any]:
    """Put a DataLoader with ``result``'s settings in the place of ``prepared``'s
    ``base_dataloader`` (rebuilt from it) and return it. The prepared loader iterates it from
    its next epoch on.

    A worker seeding function that was given the worker count (transformers' ``seed_worker``,
    a ``functools.partial`` with ``num_workers=``, which offsets each rank's worker seeds by it)
    is given the new count, so the ranks' workers keep distinct seeds."""
    base = prepared.base_dataloader
    tuned: DataLoader[Any] = result.loader(base)
    seeding = tuned.worker_init_fn
    if isinstance(seeding, functools.partial) and "num_workers" in seeding.keywords:
        counted = {**seeding.keywords, "num_workers": tuned.num_workers}
        tuned.worker_init_fn = functools.partial(seeding.func, *seeding.args, **counted)
    prepared.base_dataloader = tuned
    return tuned


def tune_prepared(accelerator: Any, prepared: Any, **tune_kwargs: Any) -> TuneResult:
    """Tune the DataLoader inside ``prepared`` (a loader ``accelerator.prepare`` returned) and
    put the tuned one in its place. ``tune_kwargs`` go to ``feedrate.tune``.

    On several processes every one measures at once, its own shard (the node tuned as a
    unit), and every process applies the same answer; the answer and, with
    ``dispatch_batches``, what that costs the main process are printed once
    (``accelerator.print``). Returns the ``TuneResult`` on every process.
    """
    if framework_of(prepared) != "accelerate":
        raise UserError(
            f"tune_prepared() takes a loader returned by Accelerator.prepare, got "
            f"{type(prepared).__name__}: tune a plain DataLoader with feedrate.tune"
        )
    base = loader_from(prepared)
    assert base is not None  # an accelerate object: loader_from opens it or raises
    several = accelerator.num_processes > 1
    kwargs = dict(tune_kwargs)
    why = share_cpus(kwargs, local_ranks(accelerator.num_processes) if several else 1)
    result = tune_shared(
        base,
        kwargs,
        main=accelerator.is_main_process,
        broadcast=broadcast_from_main if several else None,
    )
    swap_in(prepared, result)
    said = f"DataLoader({in_words(result.best.config)}) ({evidence(result)}{why})"
    accelerator.print(f"feedrate: {said}")
    note = dispatch_note(prepared, accelerator.num_processes)
    if note is not None:
        accelerator.print(f"feedrate: {note}")
    return result
