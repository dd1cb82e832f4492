"""Reading a user's DataLoader and rebuilding it with other settings.

``rebuild(loader, config)`` keeps everything that defines *what* the loader yields (dataset,
batching, sampling, collation, worker seeding, ...) and changes only *how* it is produced.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.loader.config import LoaderConfig
from feedrate.loader.init_args import init_arguments, parameters, recording
from feedrate.loader.threaded import Threaded, threads_of, unthreaded

#: DataLoader warns when num_workers exceeds the CPU count; feedrate goes there on purpose for
#: latency-bound pipelines and says so in its own notes instead.
_WORKER_COUNT_WARNING = r".*DataLoader will create \d+ worker processes in total"


#: Inside ``for_the_user()``: a loader feedrate builds is handed to the user's code to train on
#: (``TuneResult.loader()``), not built for a measurement of its own.
_FOR_THE_USER: contextvars.ContextVar[bool] = contextvars.ContextVar("for_the_user", default=False)


@contextlib.contextmanager
def for_the_user() -> Iterator[None]:
    """Loaders built inside the block are handed to the user's code (``feedrate run`` watches
    them as the user's own, where it leaves feedrate's trial loaders alone)."""
    token = _FOR_THE_USER.set(True)
    try:
        yield
    finally:
        _FOR_THE_USER.reset(token)


def built_for_the_user() -> bool:
    """Within ``for_the_user()``."""
    return _FOR_THE_USER.get()


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


def supports(parameter: str) -> bool:
    """Whether this torch's DataLoader takes ``parameter`` (``in_order`` came in torch 2.6)."""
    return parameter in _LOADER_PARAMS


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


def _batching(loader: DataLoader[Any], batch_sampler: Any, sampler: Any) -> dict[str, Any]:
    if batch_sampler is not None:
        return {"batch_sampler": batch_sampler}
    if sampler is not None:
        return {"batch_size": loader.batch_size, "sampler": sampler, "drop_last": loader.drop_last}
    return _batching_kwargs(loader)


def rebuild(
    loader: DataLoader[Any],
    config: LoaderConfig,
    *,
    dataset: Any | None = None,
    batch_sampler: Any | None = None,
    sampler: Any | None = None,
) -> DataLoader[Any]:
    """A new DataLoader yielding what ``loader`` yields, produced with ``config``'s settings.

    Kept from ``loader``: dataset (unless ``dataset`` replaces it), batch_size, sampler or
    batch_sampler, collate_fn, drop_last, worker_init_fn, generator, timeout,
    multiprocessing_context, and, where this torch has them, in_order and pin_memory_device.
    The loader's own class is built again, from the arguments it was built with (see
    ``init_args``); where those cannot be known, ``UserError`` says so. The dataset is
    wrapped in (or freed from) ``feedrate.threaded`` as ``config.threads`` says. A
    ``batch_sampler`` given replaces the loader's batching (``autotune`` feeds its own); a
    ``sampler`` replaces its sampler (a shard of the dataset per rank), batch size kept.
    """
    data = unthreaded(loader.dataset if dataset is None else dataset)
    kwargs: dict[str, Any] = {
        "dataset": Threaded(data, config.threads) if config.threads > 1 else data,
        **_batching(loader, batch_sampler, sampler),
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "timeout": loader.timeout,
        **{k: v for k, v in config.kwargs().items() if k in _LOADER_PARAMS},
    }
    if config.num_workers > 0:
        # DataLoader refuses a multiprocessing context without workers.
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    for optional in ("in_order", "pin_memory_device"):
        if optional in _LOADER_PARAMS and hasattr(loader, optional) and optional not in kwargs:
            kwargs[optional] = getattr(loader, optional)
    with quiet_worker_count_warning():
        if type(loader) is DataLoader:
            return DataLoader(**kwargs)
        new = _rebuild_subclass(loader, kwargs, config)
    libraries.carry_state(loader, new)  # litdata's epoch goes on where the loader's stood
    return new


#: Constructor arguments that say how indices become batches: the rebuilt loader's own
#: batching replaces all of them (DataLoader refuses batch_sampler beside the others).
_BATCHING = frozenset({"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})


def _rebuild_subclass(
    loader: DataLoader[Any], kwargs: dict[str, Any], config: LoaderConfig
) -> DataLoader[Any]:
    """The user's own class built again: its recorded (or recoverable) arguments, with
    DataLoader's replaced by ``kwargs``. Refused, never silently replaced by a plain
    DataLoader, when its arguments cannot be known or it does not take the new settings."""
    cls = type(loader)
    name = cls.__qualname__
    own, missing = init_arguments(loader)
    if missing:
        raise UserError(
            f"cannot rebuild {name} with other settings: its __init__ takes "
            f"{', '.join(map(repr, missing))}, which feedrate can neither see among the "
            "arguments it was built with nor find as attributes of the loader. Give feedrate "
            "a function that builds the loader (TARGET file.py:make_loader, or "
            "feedrate.tune(make_loader)) so it can record them"
        )
    params = parameters(cls)
    names = {p.name for p in params}
    open_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    call = {k: v for k, v in own.items() if k not in _BATCHING}
    for k, v in own.items():  # the dataset under a name of the subclass's own (``data``)
        if v is loader.dataset and k != "dataset":
            call[k] = kwargs["dataset"]
    call.update({k: v for k, v in kwargs.items() if k in names or open_kw})
    try:
        new = cls(**call)
    except TypeError as exc:
        raise UserError(f"cannot rebuild {name} with other settings: {exc}") from exc
    wrong = [
        f"{k}={getattr(new, k, None)!r} (wanted {v!r})"
        for k, v in config.kwargs().items()
        if k in _LOADER_PARAMS and getattr(new, k, v) != v
    ]
    if new.dataset is not kwargs["dataset"]:
        wrong.append("another dataset")
    if "batch_sampler" in kwargs and new.batch_sampler is not kwargs["batch_sampler"]:
        wrong.append("its own batch_sampler")
    if wrong:
        raise UserError(
            f"cannot rebuild {name} with other settings: built again it has "
            f"{', '.join(wrong)}, so its __init__ does not pass these to DataLoader"
        )
    return new


def loader_of(source: DataLoader[Any] | Callable[[], DataLoader[Any]]) -> DataLoader[Any]:
    """``source`` itself, or what the zero-argument function ``source`` builds (recording the
    arguments of the DataLoader subclasses it makes, so ``rebuild`` can make them again).
    Raises ``UserError`` when it is not a DataLoader."""
    if callable(source) and not isinstance(source, DataLoader):
        with recording():
            source = source()
    if not isinstance(source, DataLoader):
        raise UserError(f"expected a torch.utils.data.DataLoader, got {type(source).__name__}")
    return source
