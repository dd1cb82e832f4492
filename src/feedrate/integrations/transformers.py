"""transformers ``Trainer``: its DataLoaders are built from ``TrainingArguments``
(``dataloader_num_workers``, ``dataloader_prefetch_factor``, ``dataloader_persistent_workers``,
``dataloader_pin_memory``), so that is where the answer goes, and the Trainer builds the tuned
loader itself, with its own sampler, collator, worker seeding and accelerate wrapping.

``tune_trainer(trainer)`` before ``trainer.train()`` is the plain path. ``train()`` builds its
training loader before any callback hears of the run, so ``FeedrateTrainerCallback`` (at
``on_train_begin``) sets the arguments for the loaders built after it and, for this run,
replaces the DataLoader inside accelerate's wrapper (its ``base_dataloader``, which the wrapper
iterates each epoch); where the loader is not accelerate's it says the settings wait for the
next loader. transformers is imported when this module is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
from collections.abc import Mapping
from typing import Any

from feedrate.integrations import framework_of, loader_from
from feedrate.integrations.accelerate import broadcast_from_main, swap_in
from feedrate.integrations.shared import (
    evidence,
    in_words,
    local_ranks,
    settings,
    share_cpus,
    tune_shared,
)
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import allow_many_workers, quiet_worker_count_warning
from feedrate.loader.words import TRAINING_ARGUMENTS
from feedrate.results.tune import TuneResult

__all__ = ["ARGUMENT_NAMES", "FeedrateTrainerCallback", "apply_to_args", "tune_trainer"]

#: ``TrainingArguments``' names for the DataLoader settings feedrate applies.
ARGUMENT_NAMES: Mapping[str, str] = TRAINING_ARGUMENTS

DEFAULT_BUDGET_S = 30.0

_TrainerCallback: Any = importlib.import_module("transformers").TrainerCallback


def apply_to_args(args: Any, config: LoaderConfig) -> Any:
    """``args`` (``TrainingArguments``) with ``config``'s settings. Set in place where the
    arguments allow it (transformers 4.x and 5.x); versions that froze them get a copy, which
    is returned: assign it to ``trainer.args``."""
    values = {ARGUMENT_NAMES[k]: v for k, v in settings(config).items()}
    if config.in_order is not None and hasattr(args, "dataloader_in_order"):
        values["dataloader_in_order"] = config.in_order
    try:
        for name, value in values.items():
            setattr(args, name, value)
    except (dataclasses.FrozenInstanceError, AttributeError):
        return dataclasses.replace(args, **values)
    return args


def _message(result: TuneResult, why: str = "") -> str:
    said = f"feedrate: {in_words(result.best.config, ARGUMENT_NAMES)} ({evidence(result)}{why})"
    threads = result.best.config.threads
    if threads > 1:
        said += (
            f"; and {threads} threads in each worker, which TrainingArguments cannot set: "
            f"train_dataset=feedrate.threaded(train_dataset, {threads})"
        )
    return said


def _tune(
    loader: Any, args: Any, main: bool, tune_kwargs: Mapping[str, Any]
) -> tuple[TuneResult, Any, str]:
    """The shared tune of ``loader``, ``args`` carrying its answer, and the line saying it."""
    base = loader_from(loader) or loader  # a prepared loader is opened, a plain one kept
    world = int(getattr(args, "world_size", 1))
    kwargs = {"budget_s": DEFAULT_BUDGET_S, **tune_kwargs}
    why = share_cpus(kwargs, local_ranks(world) if world > 1 else 1)
    result = tune_shared(
        base, kwargs, main=main, broadcast=broadcast_from_main if world > 1 else None
    )
    return result, apply_to_args(args, result.best.config), _message(result, why)


def tune_trainer(trainer: Any, **tune_kwargs: Any) -> TuneResult:
    """Tune the DataLoader ``trainer.get_train_dataloader()`` builds and set the answer in
    ``trainer.args``, so ``trainer.train()`` trains on it. ``tune_kwargs`` go to
    ``feedrate.tune`` (``budget_s`` defaults to 30 s). The answer is printed once, in
    ``TrainingArguments``' words: ``dataloader_num_workers=8, dataloader_prefetch_factor=4,
    ...``. On several processes all measure at once, each its own shard, and all take the same
    answer (each rank within its share of the node)."""
    main = trainer.is_world_process_zero()
    loader = trainer.get_train_dataloader()
    result, trainer.args, said = _tune(loader, trainer.args, main, tune_kwargs)
    quiet_builds(trainer)
    if main:
        print(said, flush=True)
    return result


def quiet_builds(trainer: Any) -> None:
    """The loaders ``trainer`` builds from now on (with the tuned ``dataloader_num_workers``)
    do not warn of more workers than CPUs: a count past them was measured, and torch's rule of
    thumb printed its warning twice over a ``train()`` after ``tune_trainer`` (QA). Once per
    trainer; bound as methods, so a copy of the trainer builds its own loaders."""
    for name, quiet in _QUIET.items():
        own = getattr(trainer, name, None)
        if own is not None and not getattr(own, "__feedrate_quiet__", False):
            setattr(trainer, name, types.MethodType(quiet, trainer))


def _quiet(name: str) -> Any:
    def built(self: Any, *args: Any, **kwargs: Any) -> Any:
        with quiet_worker_count_warning():  # DataLoader.__init__ warns too
            loader = getattr(type(self), name)(self, *args, **kwargs)
        # accelerate's wrapper iterates the DataLoader it holds, which is what warns.
        each: Any
        for each in (loader, getattr(loader, "base_dataloader", None)):
            with contextlib.suppress(AttributeError):  # not a DataLoader: as it is
                allow_many_workers(each)
        return loader

    built.__name__ = built.__qualname__ = name
    built.__feedrate_quiet__ = True  # type: ignore[attr-defined]
    return built


_QUIET = {
    n: _quiet(n) for n in ("get_train_dataloader", "get_eval_dataloader", "get_test_dataloader")
}


class FeedrateTrainerCallback(_TrainerCallback):  # type: ignore[misc]
    """``Trainer(callbacks=[FeedrateTrainerCallback()])``: at ``on_train_begin`` it tunes the
    training loader and sets the answer in the ``TrainingArguments``, for every loader built
    after (the next ``train()``, evaluation loaders). The loader of that ``train()`` call was
    built before, with the old settings: inside accelerate's wrapper (as the Trainer builds it)
    its DataLoader is replaced by the tuned one, so this run trains on the answer too; a loader
    that is not accelerate's keeps its settings, and the line printed says so
    (``tune_trainer(trainer)`` before ``trainer.train()`` then trains on them now).

    ``result`` and ``message`` hold what it found.
    """

    def __init__(self, budget_s: float = DEFAULT_BUDGET_S, **tune_kwargs: Any) -> None:
        self.tune_kwargs: dict[str, Any] = {"budget_s": budget_s, **tune_kwargs}
        self.result: TuneResult | None = None
        self.message: str | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        if self.result is not None or loader is None:
            return
        main = bool(getattr(state, "is_world_process_zero", True))
        self.result, applied, said = _tune(loader, args, main, self.tune_kwargs)
        if applied is not args:
            raise RuntimeError(
                "these TrainingArguments are frozen: use tune_trainer(trainer) before train()"
            )
        if framework_of(loader) == "accelerate":
            swap_in(loader, self.result)  # the loader of this train(), from its first epoch
            self.message = said
        else:
            self.message = said + (
                ". This train() built its DataLoader before on_train_begin, and it is not "
                "accelerate's, whose inner loader could be replaced: the settings apply to the "
                "DataLoaders built from now on; to train on them now, call "
                "feedrate.integrations.transformers.tune_trainer(trainer) before trainer.train()"
            )
        if main:
            print(self.message, flush=True)
