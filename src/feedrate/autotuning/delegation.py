"""What ``AutoLoader`` passes on to the loader it wraps and the library under it: the epoch
(to samplers and to datasets with a ``set_epoch`` of their own), the resumption state
(``state_dict``/``load_state_dict`` of a streaming loader, resumed by the lane that runs
next), and, for webdataset's
``WebLoader``, the stages after its DataLoader, run on the tuned batches.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from torch.utils.data import DataLoader

from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.loader.config import LoaderConfig

_S = TypeVar("_S", bound="Surface")


@dataclass
class Raised:
    """The error of one batch (the dataset's, the ``collate_fn``'s, a worker's), yielded by an
    epoch for ``Batches`` to raise in the loop."""

    exc: Exception


class Batches:
    """An ``AutoLoader``'s iterator over one epoch: its batches, and a ``Raised`` raised in the
    loop with the epoch going on after it, as DataLoader's iterator does (a generator that
    raises is over: a loop that skipped a sample's error lost the rest of the epoch). What it
    iterates is decided at its first ``next()`` (``begin``), not at ``iter()``: a framework
    that makes the next epoch's iterator before it lets go of the last one's (Lightning's
    fetchers) has let go by then."""

    def __init__(self, begin: Callable[[Batches], Iterator[Any]]) -> None:
        self._begin: Callable[[Batches], Iterator[Any]] | None = begin
        self._items: Iterator[Any] | None = None

    @property
    def tuning(self) -> bool:
        """It iterates a tuned epoch that has not ended."""
        items = self._items
        return inspect.isgenerator(items) and inspect.getgeneratorstate(items) != "GEN_CLOSED"

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        if self._items is None:
            begin, self._begin = self._begin, None
            assert begin is not None
            self._items = begin(self)
        item = next(self._items)
        if isinstance(item, Raised):
            exc, item = item.exc, None
            raise exc
        return item


class Surface:
    """What a training loop reads off the DataLoader an ``AutoLoader`` wraps (``_user``),
    passed on to it or to the lane in use (``_lane``); DataLoader's settings are those in use
    (``config``)."""

    _user: DataLoader[Any]
    _lane: Any
    _resume: dict[str, Any] | None

    def close(self, *, channel: bool = True) -> None:
        raise NotImplementedError  # the AutoLoader's

    @property
    def config(self) -> LoaderConfig:
        raise NotImplementedError  # the AutoLoader's

    @property
    def num_workers(self) -> int:
        return self.config.num_workers

    @property
    def prefetch_factor(self) -> int | None:
        return self.config.normalized().prefetch_factor

    @property
    def persistent_workers(self) -> bool:
        return self.config.persistent_workers

    @property
    def pin_memory(self) -> bool:
        return self.config.pin_memory

    @property
    def batch_sampler(self) -> Any:
        return self._user.batch_sampler

    @property
    def collate_fn(self) -> Any:
        return self._user.collate_fn

    @property
    def drop_last(self) -> bool:
        return self._user.drop_last

    @property
    def generator(self) -> Any:
        return self._user.generator

    @property
    def timeout(self) -> float:
        return self._user.timeout

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def wrapped(self) -> DataLoader[Any]:
        """The DataLoader it tunes: the user's, never iterated itself."""
        return self._user

    @property
    def lane_iterator(self) -> Any:
        """The iterator of the lane in use, whose ``_workers`` are the workers now (or None)."""
        return getattr(self._lane, "it", None)

    @property
    def dataset(self) -> Any:
        return self._user.dataset

    @property
    def batch_size(self) -> int | None:
        return self._user.batch_size

    @property
    def sampler(self) -> Any:
        return self._user.sampler

    def __len__(self) -> int:
        return len(self._user)

    def set_epoch(self, epoch: int) -> None:
        """Passed to the sampler (e.g. ``DistributedSampler``) or a batch sampler's sampler,
        and to a dataset with a ``set_epoch`` of its library's (Hugging Face, litdata)."""
        set_epoch(self._user, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's resumption state (litdata's or MosaicML's
        ``StreamingDataLoader``), from the settings in use; ``UserError`` where it has none."""
        return state_dict(None if self._lane is None else self._lane.loader, self._user)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (what ``state_dict`` gave): the next epoch's loader takes it."""
        can_load_state(self._user)
        self._resume = state


def set_epoch(loader: DataLoader[Any], epoch: int) -> None:
    """``epoch`` to the first of the sampler (e.g. ``DistributedSampler``), the batch
    sampler's sampler and the batch sampler that takes it, and to the dataset where its
    library reshuffles by epoch (Hugging Face's iterable datasets, litdata's)."""
    owners: list[Any] = [
        loader.sampler,
        getattr(loader.batch_sampler, "sampler", None),
        loader.batch_sampler,
    ]
    for owner in owners:
        method = getattr(owner, "set_epoch", None)
        if callable(method):
            method(epoch)
            break
    libraries.set_dataset_epoch(loader.dataset, epoch)


def state_dict(active: DataLoader[Any] | None, user: DataLoader[Any]) -> dict[str, Any]:
    """The resumption state of the loader that yielded the epoch's batches (the lane in use:
    it counted them), else of the user's loader. Raises ``UserError`` when the loader has no
    ``state_dict`` (a plain DataLoader keeps no position)."""
    for loader in (active, user):
        method = getattr(loader, "state_dict", None)
        if loader is not None and callable(method):
            state = method()
            return dict(state) if state is not None else {}
    raise UserError(
        f"{type(user).__name__} has no state_dict(): only loaders that can resume mid-epoch "
        "(litdata's or MosaicML's StreamingDataLoader) have one"
    )


def can_load_state(user: DataLoader[Any]) -> None:
    """``UserError`` unless ``user`` can resume from a state (``load_state_dict``)."""
    if not callable(getattr(user, "load_state_dict", None)):
        raise UserError(f"{type(user).__name__} has no load_state_dict()")


def resume(loader: DataLoader[Any], state: dict[str, Any] | None) -> None:
    """Give ``state`` (from ``load_state_dict``, None: nothing to resume) to the loader that
    runs next: a lane, with its own worker count (litdata restripes a state saved with
    another; MosaicML's state lives in its dataset)."""
    if state is not None:
        loader.load_state_dict(state)  # type: ignore[attr-defined]


def around(webloader: Any, epoch: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
    """Iterate ``webloader``'s stages after its DataLoader (and its ``with_epoch``/``repeat``)
    on what ``epoch()`` yields instead of on its DataLoader. The user's pipeline is copied,
    never changed."""
    pipe = libraries.restaged(webloader, epoch)  # a callable first stage: called each epoch
    return lambda: iter(pipe)
