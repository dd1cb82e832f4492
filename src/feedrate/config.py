"""DataLoader settings as plain data, and rebuilding a user's loader with other settings.

``rebuild(loader, config)`` keeps everything that defines *what* the loader yields (dataset,
batching, sampling, collation, worker seeding, ...) and changes only *how* it is produced.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from feedrate.errors import UserError
from feedrate.fetching import Threaded, threads_of, unthreaded

#: DataLoader's own default when workers are used and ``prefetch_factor`` is not given.
DEFAULT_PREFETCH_FACTOR = 2

#: DataLoader warns when num_workers exceeds the CPU count; feedrate goes there on purpose for
#: latency-bound pipelines and says so in its own notes instead.
_WORKER_COUNT_WARNING = r".*DataLoader will create \d+ worker processes in total"


@contextlib.contextmanager
def quiet_worker_count_warning() -> Iterator[None]:
    """Silence DataLoader's "more workers than CPUs" warning inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_WORKER_COUNT_WARNING)
        yield


def allow_many_workers(loader: DataLoader[Any]) -> DataLoader[Any]:
    """``loader``, which no longer warns that it has more workers than DataLoader suggests
    ("Our suggested max number of worker in current system is …"). That warning is a rule of
    thumb; a latency-bound pipeline measured faster with more workers than CPUs (as ``tune``
    reports) can drop it. Only this loader is affected; returns it for chaining."""
    loader.check_worker_number_rationality = _workers_accepted  # type: ignore[method-assign]
    return loader


def _workers_accepted() -> None:
    return None


_LOADER_PARAMS = frozenset(inspect.signature(DataLoader.__init__).parameters)


@dataclass(frozen=True)
class LoaderConfig:
    """The settings feedrate chooses, stored as DataLoader applies them: with workers an unset
    ``prefetch_factor`` becomes DataLoader's default (2); without workers ``prefetch_factor`` and
    ``persistent_workers`` mean nothing and are dropped. So equal settings compare equal.

    ``in_order=False`` lets DataLoader hand out batches as workers finish them (it changes the
    order of batches, so feedrate only tries it when allowed to); None keeps the loader's own.

    ``threads`` is not a DataLoader argument: above 1 the dataset is wrapped in
    ``feedrate.threaded(dataset, threads)``, so each worker (or the main process, without
    workers) fetches a batch's samples on that many threads."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    in_order: bool | None = None
    threads: int = 1

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise UserError(f"threads must be 1 or more, got {self.threads}")
        if self.num_workers < 0:
            raise UserError(f"num_workers must be 0 or more, got {self.num_workers}")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise UserError(f"prefetch_factor must be 1 or more, got {self.prefetch_factor}")
        if self.num_workers == 0:
            object.__setattr__(self, "prefetch_factor", None)
            object.__setattr__(self, "persistent_workers", False)
            object.__setattr__(self, "in_order", None)
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", DEFAULT_PREFETCH_FACTOR)

    def normalized(self) -> LoaderConfig:
        """The settings as DataLoader applies them: the same object, since construction
        normalizes (kept for callers that want to say so)."""
        return self

    @property
    def queue_depth(self) -> int:
        """Batches the workers may have prepared ahead of the consumer (0 without workers)."""
        norm = self.normalized()
        return norm.num_workers * (norm.prefetch_factor or 0)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DataLoader(...)``, with the worker-only ones left out at 0."""
        norm = self.normalized()
        out: dict[str, Any] = {"num_workers": norm.num_workers, "pin_memory": norm.pin_memory}
        if norm.num_workers > 0:
            out["prefetch_factor"] = norm.prefetch_factor
            out["persistent_workers"] = norm.persistent_workers
            if norm.in_order is not None and "in_order" in _LOADER_PARAMS:
                out["in_order"] = norm.in_order
        return out

    def to_dict(self) -> dict[str, Any]:
        """The settings as DataLoader keyword arguments (``in_order`` only when it is set)."""
        out = asdict(self)
        if out["in_order"] is None:
            del out["in_order"]
        if out["threads"] == 1:
            del out["threads"]  # plain DataLoader settings stay plain
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderConfig:
        return cls(
            num_workers=int(data.get("num_workers", 0)),
            pin_memory=bool(data.get("pin_memory", False)),
            prefetch_factor=data.get("prefetch_factor"),
            persistent_workers=bool(data.get("persistent_workers", False)),
            in_order=data.get("in_order"),
            threads=int(data.get("threads", 1)),
        )

    def label(self) -> str:
        """A short human label, e.g. ``w=4 pf=2 persistent``."""
        norm = self.normalized()
        parts = [f"w={norm.num_workers}"]
        if norm.num_workers:
            parts.append(f"pf={norm.prefetch_factor}")
            if norm.persistent_workers:
                parts.append("persistent")
            if norm.in_order is False:
                parts.append("unordered")
        if norm.pin_memory:
            parts.append("pin")
        if norm.threads > 1:
            parts.append(f"threads={norm.threads}")
        return " ".join(parts)


def config_of(loader: DataLoader[Any]) -> LoaderConfig:
    """The settings a loader was built with."""
    workers = loader.num_workers
    return LoaderConfig(
        num_workers=workers,
        pin_memory=loader.pin_memory,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers if workers else False,
        in_order=False if getattr(loader, "in_order", True) is False else None,
        threads=threads_of(loader.dataset),
    )


def is_iterable_style(loader: DataLoader[Any]) -> bool:
    return isinstance(loader.dataset, IterableDataset)


def _batching_kwargs(loader: DataLoader[Any]) -> dict[str, Any]:
    """How the loader turns indices into batches, in the form DataLoader accepts back."""
    if is_iterable_style(loader):
        # DataLoader makes its own sampler for an IterableDataset and refuses one passed in.
        return {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    if loader.batch_size is not None:
        return {
            "batch_size": loader.batch_size,
            "sampler": loader.sampler,
            "drop_last": loader.drop_last,
        }
    if loader.batch_sampler is not None:
        # A custom batch sampler excludes batch_size, sampler, shuffle and drop_last.
        return {"batch_sampler": loader.batch_sampler}
    return {"batch_size": None, "sampler": loader.sampler}


def rebuild(
    loader: DataLoader[Any],
    config: LoaderConfig,
    *,
    dataset: Any | None = None,
    batch_sampler: Any | None = None,
) -> DataLoader[Any]:
    """A new DataLoader yielding what ``loader`` yields, produced with ``config``'s settings.

    Kept from ``loader``: dataset (unless ``dataset`` replaces it), batch_size, sampler or
    batch_sampler, collate_fn, drop_last, worker_init_fn, generator, timeout,
    multiprocessing_context, and, where this torch has them, in_order and pin_memory_device.
    The loader's class is kept too when it accepts DataLoader's arguments. The dataset is
    wrapped in (or freed from) ``feedrate.threaded`` as ``config.threads`` says. A
    ``batch_sampler`` given replaces the loader's batching (``autotune`` feeds its own).
    """
    data = unthreaded(loader.dataset if dataset is None else dataset)
    kwargs: dict[str, Any] = {
        "dataset": Threaded(data, config.threads) if config.threads > 1 else data,
        **(_batching_kwargs(loader) if batch_sampler is None else {"batch_sampler": batch_sampler}),
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "timeout": loader.timeout,
        **config.kwargs(),
    }
    if config.num_workers > 0:
        # DataLoader refuses a multiprocessing context without workers.
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    for optional in ("in_order", "pin_memory_device"):
        if optional in _LOADER_PARAMS and hasattr(loader, optional) and optional not in kwargs:
            kwargs[optional] = getattr(loader, optional)
    cls = type(loader)
    with quiet_worker_count_warning():
        try:
            return cls(**kwargs)
        except TypeError:
            if cls is DataLoader:
                raise
            # A subclass with its own constructor: fall back to a plain DataLoader.
            return DataLoader(**kwargs)
