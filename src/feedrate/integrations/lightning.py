"""Lightning: ``Trainer(callbacks=[FeedrateCallback()])`` tunes the training DataLoader before
the first epoch and trains on the answer.

The seam is the one Lightning itself reads: the ``train_dataloader`` hook of the datamodule (or
of the LightningModule) that the fit loop calls to build its loader. At ``setup("fit")`` the
callback puts a wrapper in front of that hook, so the loader the hook returns is tuned (or, with
``online=True``, wrapped in ``feedrate.autotune``) and Lightning then processes the tuned loader
as its own: distributed sampler, worker seeding, epochs. Loaders passed straight to
``trainer.fit(model, loader)`` are replaced where the fit loop keeps them. ``teardown`` undoes
both.

Under DDP, every rank tunes at once, the node as a unit (``feedrate.tune`` in a distributed job:
all ranks load their shards in every trial, rank 0 decides); every rank applies the answer to
its own loader. Lightning is imported when this module is; ``pytorch_lightning``
is used instead when only that one is installed or already in use.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

from feedrate.autotuning.api import autotune
from feedrate.autotuning.loader import AutoLoader
from feedrate.errors import UserError
from feedrate.integrations.shared import evidence, in_words, share_cpus, tune_shared
from feedrate.loader.config import LoaderConfig
from feedrate.results.tune import TuneResult

__all__ = ["FeedrateCallback"]

#: The training loader's hook, on a LightningDataModule or a LightningModule.
HOOK = "train_dataloader"

#: ``feedrate.autotune``'s keyword arguments besides ``budget_s``; the others are ``tune``'s.
_AUTOTUNE_KWARGS = frozenset(inspect.signature(autotune).parameters) - {"loader", "budget_s"}


def _package() -> Any:
    """``lightning.pytorch``, or ``pytorch_lightning`` where that is the one in use."""
    if "pytorch_lightning" in sys.modules and "lightning.pytorch" not in sys.modules:
        return importlib.import_module("pytorch_lightning")
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        try:
            return importlib.import_module("pytorch_lightning")
        except ImportError:
            raise ImportError(
                "feedrate.integrations.lightning needs Lightning: pip install 'feedrate[lightning]'"
            ) from None


_pl = _package()
_Callback: Any = _pl.Callback
_info = importlib.import_module(f"{_pl.__name__}.utilities.rank_zero").rank_zero_info


class FeedrateCallback(_Callback):  # type: ignore[misc]
    """Tune the training DataLoader before the first epoch and train on the answer.

    ``budget_s`` bounds the search (s; ``tune``'s own rules, at least 5); a pipeline tuned
    before on this machine answers at once from feedrate's cache. ``tune_kwargs`` go to
    ``feedrate.tune`` (``rate``, ``max_workers``, ``memory_limit``, ``allow_threads``,
    ``fresh``, ...). ``online=True`` trains on ``feedrate.autotune(loader)`` instead, which
    tunes while the first epoch runs (``budget_s`` is then its trial budget).

    After fit: ``result`` (the ``TuneResult``), ``config`` (the settings trained on),
    ``message`` (the line logged once, on rank 0), ``autoloaders`` (with ``online``).
    """

    def __init__(self, budget_s: float = 30.0, online: bool = False, **tune_kwargs: Any) -> None:
        super().__init__()
        if online and set(tune_kwargs) - _AUTOTUNE_KWARGS:
            wrong = ", ".join(sorted(set(tune_kwargs) - _AUTOTUNE_KWARGS))
            raise UserError(f"online=True uses feedrate.autotune, which does not take {wrong}")
        self.budget_s = budget_s
        self.online = online
        self.tune_kwargs = tune_kwargs
        self.result: TuneResult | None = None
        self.config: LoaderConfig | None = None
        self.message: str | None = None
        self.autoloaders: list[AutoLoader] = []
        self._undo: list[Any] = []

    # --- Lightning's hooks ---------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self.result = self.config = self.message = None  # a new fit, maybe of other data
        self.autoloaders = []
        source = getattr(getattr(trainer, "fit_loop", None), "_data_source", None)
        owner = getattr(source, "instance", None) if source is not None else pl_module
        if isinstance(owner, (_pl.LightningDataModule, _pl.LightningModule)):
            self._wrap_hook(trainer, owner)
        elif isinstance(owner, DataLoader) and source is not None:
            # ``trainer.fit(model, loader)``: the fit loop holds the loader itself.
            source.instance = self._apply(trainer, owner)
            self._undo.append(lambda: setattr(source, "instance", owner))
        else:
            self._say(
                trainer,
                f"feedrate: the training loaders are a {type(owner).__name__}, not one "
                "DataLoader: left as they are",
            )

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.online and self.autoloaders:
            auto = self.autoloaders[-1]
            report = auto.report()
            self.config = report.config
            verb = "settled on" if report.settled else "had not settled, last on"
            tried = f"{len(report.trials)} trial{'' if len(report.trials) == 1 else 's'}"
            self._say(trainer, f"feedrate: autotune {verb} {in_words(report.config)} ({tried})")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        for auto in self.autoloaders:
            auto.close()
        while self._undo:
            self._undo.pop()()

    # --- the seam ------------------------------------------------------------------------------

    def _wrap_hook(self, trainer: Any, owner: Any) -> None:
        original = getattr(owner, HOOK)
        had_own = HOOK in vars(owner)

        @functools.wraps(original)
        def train_dataloader() -> Any:
            built = original()
            if not isinstance(built, DataLoader):
                self._say(
                    trainer,
                    f"feedrate: {HOOK}() gave {type(built).__name__}, not one DataLoader: "
                    "left as it is",
                )
                return built
            return self._apply(trainer, built)

        setattr(owner, HOOK, train_dataloader)
        self._undo.append(
            (lambda: setattr(owner, HOOK, original)) if had_own else (lambda: delattr(owner, HOOK))
        )

    def _apply(self, trainer: Any, loader: DataLoader[Any]) -> Any:
        """The loader to train on instead of ``loader``: tuned (once; a reload gets the same
        settings) or autotuning."""
        if self.online:
            return self._autotune(trainer, loader)
        if self.result is None:
            kwargs: dict[str, Any] = {"budget_s": self.budget_s, **self.tune_kwargs}
            why = share_cpus(kwargs, trainer.num_devices if trainer.world_size > 1 else 1)
            self.result = self._tune(trainer, loader, kwargs)
            self.config = self.result.best.config
            self._say(
                trainer,
                f"feedrate: {HOOK} tuned to {in_words(self.config)} ({evidence(self.result)}{why})",
            )
        return self.result.loader(loader)

    def _tune(self, trainer: Any, loader: DataLoader[Any], kwargs: dict[str, Any]) -> TuneResult:
        distributed = trainer.world_size > 1
        return tune_shared(
            loader,
            kwargs,
            main=trainer.is_global_zero,
            broadcast=(lambda obj: trainer.strategy.broadcast(obj, src=0)) if distributed else None,
        )

    def _autotune(self, trainer: Any, loader: DataLoader[Any]) -> AutoLoader:
        if trainer.world_size > 1 and not isinstance(loader.sampler, DistributedSampler):
            # Lightning gives a DistributedSampler to DataLoaders only: every rank would read
            # the whole dataset through an AutoLoader.
            raise UserError(
                "FeedrateCallback(online=True) under a distributed strategy needs the "
                "DataLoader to have its own DistributedSampler (and "
                "Trainer(use_distributed_sampler=False)); or use online=False, where the ranks "
                "tune together and every rank trains on the answer"
            )
        for old in self.autoloaders:
            old.close()  # a reloaded loader replaces the one before
        auto = autotune(loader, budget_s=self.budget_s, **self.tune_kwargs)
        if not self.autoloaders:
            # Under DDP the ranks agree on the start when they first meet, in the first epoch.
            start = (
                "from where the ranks agree to start in the first epoch"
                if trainer.world_size > 1
                else f"from {in_words(auto.config)}"
            )
            self._say(trainer, f"feedrate: {HOOK} autotunes while training, {start}")
        self.autoloaders.append(auto)
        return auto

    def _say(self, trainer: Any, line: str) -> None:
        self.message = line
        if trainer.is_global_zero:
            _info(line)
