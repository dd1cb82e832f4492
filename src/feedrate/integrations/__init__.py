"""Trainer integrations: adapters, not forks. Each finds the user's DataLoader where its
framework keeps it, runs the same ``tune``/``autotune``, and applies the answer where the
framework reads it:

- ``feedrate.integrations.lightning``: ``FeedrateCallback`` for ``lightning.pytorch.Trainer``;
- ``feedrate.integrations.transformers``: ``tune_trainer(trainer)`` before ``trainer.train()``;
- ``feedrate.integrations.accelerate``: ``tune_prepared(accelerator, loader)``.

Each framework is an optional extra. This module imports none of them: ``loader_from`` reads
the classes an object is made of by name, so a plain DataLoader never imports a framework.
"""

from __future__ import annotations

from typing import Any, Literal

from torch.utils.data import DataLoader

from feedrate.errors import UserError

__all__ = ["Framework", "framework_of", "loader_from"]

Framework = Literal["lightning", "transformers", "accelerate"]

#: The top-level packages each framework's classes are defined in.
_PACKAGES: dict[str, Framework] = {
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "transformers": "transformers",
    "accelerate": "accelerate",
}


def _classes(obj: object) -> list[tuple[str, str]]:
    """(top-level package, class name) of every class ``obj`` is made of. ``type()``, not
    ``obj.__class__``: accelerate's prepared loaders claim to be their inner loader's class."""
    return [(c.__module__.partition(".")[0], c.__name__) for c in type(obj).__mro__]


def framework_of(obj: object) -> Framework | None:
    """The framework whose class ``obj`` is (or subclasses), without importing any."""
    for package, _ in _classes(obj):
        if package in _PACKAGES:
            return _PACKAGES[package]
    return None


def _is(obj: object, name: str) -> bool:
    return any(package in _PACKAGES and cls == name for package, cls in _classes(obj))


def loader_from(obj: object) -> DataLoader[Any] | None:
    """The training DataLoader a framework object holds, or None when ``obj`` is not one:

    - a ``LightningDataModule``: its ``train_dataloader()``, after ``prepare_data()`` and
      ``setup("fit")`` as ``Trainer.fit`` calls them; a ``LightningModule``: its own
      ``train_dataloader()``;
    - a transformers ``Trainer``: what ``get_train_dataloader()`` builds, unwrapped;
    - a loader returned by ``accelerate.Accelerator.prepare`` (``DataLoaderShard``,
      ``DataLoaderDispatcher``): the DataLoader it iterates, its ``base_dataloader``.

    A plain DataLoader is not a framework object: None. Raises ``UserError`` when ``obj`` is
    one but holds no single DataLoader (a hook returning a list, a dict, or nothing).
    """
    framework = framework_of(obj)
    if framework is None:
        return None
    if framework == "accelerate":
        return _inner(obj, getattr(obj, "base_dataloader", None), "its base_dataloader")
    if framework == "transformers":
        build = getattr(obj, "get_train_dataloader", None)
        if not callable(build):
            return None
        return _inner(obj, build(), "get_train_dataloader()")
    if _is(obj, "LightningDataModule"):
        obj.prepare_data()  # type: ignore[attr-defined]
        obj.setup("fit")  # type: ignore[attr-defined]
        return _inner(obj, obj.train_dataloader(), "train_dataloader()")  # type: ignore[attr-defined]
    if _is(obj, "LightningModule"):
        return _inner(obj, obj.train_dataloader(), "train_dataloader()")  # type: ignore[attr-defined]
    return None


def _inner(owner: object, value: object, where: str) -> DataLoader[Any]:
    """``value`` as a plain DataLoader: accelerate's wrappers are opened, anything else is
    refused with the reason."""
    if framework_of(value) == "accelerate":
        value = getattr(value, "base_dataloader", None)
    if isinstance(value, DataLoader):
        return value
    got = "nothing" if value is None else f"a {type(value).__name__}"
    raise UserError(
        f"{type(owner).__name__}'s {where} gave {got}, not one torch.utils.data.DataLoader: "
        "feedrate tunes one training DataLoader at a time"
    )
