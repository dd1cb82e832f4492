"""Reading a user's DataLoader and rebuilding it with other settings.

``rebuild(loader, config)`` keeps everything that defines *what* the loader yields (dataset,
batching, sampling, collation, worker seeding, ...) and changes only *how* it is produced.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

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
    It does not warn of more workers than DataLoader suggests (``allow_many_workers``): its
    worker count is chosen, and a loader that checks at its first batch, not at ``iter()``
    (litdata's), printed the warning in every trial of ``tune``.
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
            return allow_many_workers(DataLoader(**kwargs))
        new = _rebuild_subclass(loader, kwargs, config)
    libraries.carry_state(loader, new)  # litdata's epoch goes on where the loader's stood
    return allow_many_workers(new)


#: Constructor arguments that say how indices become batches: the rebuilt loader's own
#: batching replaces all of them (DataLoader refuses batch_sampler beside the others).
_BATCHING = frozenset({"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})

#: A keyword that reached a constructor twice: the subclass passed it to DataLoader itself.
_TWICE = re.compile(r"got multiple values for (?:keyword )?argument '(\w+)'")
#: Compared with the rebuilt loader's by ``_check`` in its own way.
_CHECKED_APART = frozenset({"dataset", "batch_sampler"})
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
#: Values compared by equality, and shown as written; anything else is one object.
_PLAIN = (int, float, str, bytes, type(None))


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
    # Keywords only **kwargs takes, which the subclass may also set itself (``batch_size=bs``).
    passed_on = {k for k in call if k not in names and k not in own}
    new = _build(loader, call, set(passed_on))
    _check(loader, new, kwargs, config, passed_on - call.keys())
    return new


def _build(loader: DataLoader[Any], call: dict[str, Any], passed_on: set[str]) -> DataLoader[Any]:
    """``type(loader)(**call)``, ``call`` left as built. A keyword in ``passed_on`` that
    DataLoader gets twice is one the subclass sets itself: it is left out, and the value
    wanted goes to the subclass's parameter that sets it where it differs from the loader's
    (``workers`` for num_workers). Where a batch_sampler given (autotune's) meets a batch size
    the subclass sets, that size goes back to 1, the one DataLoader takes beside it."""
    cls = type(loader)
    sized = "batch_sampler" not in call  # no batch size to bring back to 1
    while True:
        try:
            return cls(**call)
        except TypeError as exc:
            twice = _TWICE.search(str(exc))
            if twice is None or twice.group(1) not in passed_on:
                raise _refused(cls, exc) from exc
            key = twice.group(1)
            passed_on.discard(key)
            _carry(loader, call, key, call.pop(key))
        except ValueError as exc:  # DataLoader refusing a mix of its arguments
            if sized or "batch_sampler option is mutually exclusive" not in str(exc):
                raise _refused(cls, exc) from exc
            sized = True
            _carry(loader, call, "batch_size", 1)


def _carry(loader: DataLoader[Any], call: dict[str, Any], key: str, wanted: Any) -> None:
    """Give ``wanted`` for DataLoader's ``key`` to the one parameter of the loader's class
    that holds the loader's own value of it, when the two differ. Refused, naming the
    parameters, where none or several could be it."""
    now = getattr(loader, key, None)
    if key == "dataset" or _same(wanted, now):
        return  # a dataset of the subclass's own is named after the build
    cls = type(loader)
    holders = [
        p.name
        for p in parameters(cls)
        if p.kind in _BY_NAME
        and p.name not in _LOADER_PARAMS
        and _same(call.get(p.name, p.default), now)
    ]
    if len(holders) != 1:
        which = f"which of {', '.join(holders)} it is" if holders else "none holds it"
        raise UserError(
            f"cannot rebuild {cls.__qualname__} with {key}={wanted!r}: its __init__ sets "
            f"{key}={now!r} itself, from one of its own parameters ({_signature(cls)}), and "
            f"feedrate cannot tell {which}. Have it pass {key} on to DataLoader (through "
            "**kwargs), or take it under the name DataLoader gives it"
        )
    call[holders[0]] = wanted


def _same(a: Any, b: Any) -> bool:
    """The same value: equal plain values of one type (not 0 and False), else one object."""
    return a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b)


def _check(
    loader: DataLoader[Any],
    new: DataLoader[Any],
    kwargs: dict[str, Any],
    config: LoaderConfig,
    set_itself: set[str],
) -> None:
    """Refuse ``new`` unless it took ``config``'s settings, the dataset, the batching, and
    the values of ``kwargs`` for the keywords it ``set_itself``, left out of its call."""
    cls = type(loader)
    name = cls.__qualname__
    if new.dataset is not kwargs["dataset"]:
        raise UserError(
            f"cannot rebuild {name} with other settings: its __init__ builds its dataset "
            f"itself (a {type(new.dataset).__qualname__}) instead of passing on the one it is "
            "given, so feedrate cannot hand it the dataset to load (the loader's own, or that "
            "dataset wrapped for threads or shards). Have its __init__ take the dataset and "
            "pass it to DataLoader, or point TARGET at a function that builds the dataset and "
            "then the loader over it (file.py:make_loader)"
        )
    wanted = {**{k: kwargs[k] for k in set_itself}, **config.kwargs()}
    wrong = [
        f"{k}={_shown(getattr(new, k, None))} (wanted {_shown(v)})"
        for k, v in wanted.items()
        if k in _LOADER_PARAMS and k not in _CHECKED_APART and not _taken(new, k, v)
    ]
    if "batch_sampler" in kwargs and new.batch_sampler is not kwargs["batch_sampler"]:
        wrong.append("its own batch_sampler")
    if wrong:
        raise UserError(
            f"cannot rebuild {name} with other settings: built again it has "
            f"{', '.join(wrong)}, so its __init__ ({_signature(cls)}) does not pass these on "
            "to DataLoader. Have it pass them on (through **kwargs)"
        )


def _taken(new: DataLoader[Any], key: str, wanted: Any) -> bool:
    got = getattr(new, key, wanted)
    return got is wanted or bool(got == wanted)


def _shown(value: Any) -> str:
    """A plain value as written, an object by its class (its repr is an address)."""
    return repr(value) if isinstance(value, _PLAIN) else f"a {type(value).__qualname__}"


def _signature(cls: type[Any]) -> str:
    """The parameters' names, as in ``ds, bs, *, workers, **kw``."""
    return str(
        inspect.Signature([p.replace(annotation=p.empty, default=p.empty) for p in parameters(cls)])
    )[1:-1]


def _refused(cls: type[Any], exc: Exception) -> UserError:
    return UserError(f"cannot rebuild {cls.__qualname__} with other settings: {exc}")


def loader_of(source: DataLoader[Any] | Callable[[], DataLoader[Any]]) -> DataLoader[Any]:
    """``source`` itself, or what the zero-argument function ``source`` builds (recording the
    arguments of the DataLoader subclasses it makes, so ``rebuild`` can make them again); the
    DataLoader inside webdataset's ``WebLoader`` (the command line's targets take it too).
    Raises ``UserError`` when it is not a DataLoader."""
    source = built(source)
    parts = libraries.webloader_parts(source)
    if parts is not None:  # tuned alone: the stages after it run in the training process
        libraries.mark_wrapped(parts[0], type(source).__name__)
        source = parts[0]
    if not isinstance(source, DataLoader):
        raise UserError(f"expected a torch.utils.data.DataLoader, got {type(source).__name__}")
    return source


def built(source: Any) -> Any:
    """``source`` itself, or what the zero-argument function ``source`` builds, recording the
    arguments of the DataLoader subclasses it makes (``rebuild`` makes them again)."""
    if _factory(source):
        with recording():
            return source()
    return source


def rebuilt(source: DataLoader[Any] | Callable[[], DataLoader[Any]], config: LoaderConfig) -> Any:
    """What the user iterates, rebuilt with ``config``: ``source`` (or what the function
    ``source`` builds) rebuilt; a ``WebLoader`` copied with its DataLoader rebuilt and the
    stages after it kept."""
    made = built(source)
    return libraries.restaged(made, rebuild(loader_of(made), config))


def _factory(source: object) -> TypeGuard[Callable[[], Any]]:
    """``source`` is a function that builds a loader, not one (a ``WebLoader`` is callable, as
    webdataset's pipelines are)."""
    web = libraries.webloader_parts(source) is not None
    return callable(source) and not isinstance(source, DataLoader) and not web


def built_per_run(source: object) -> None:
    """Raise ``UserError`` where the loader must be built afresh for each run but ``source``
    is the loader itself, not a function that builds it: its dataset, iterated in this
    process, breaks the workers forked after it (MosaicML's ``StreamingDataset``: its trials
    with workers hung, or failed, after the first batch made here). ``tune`` measures both."""
    if _factory(source):
        return
    unsafe = libraries.unsafe_to_iterate_here(loader_of(source).dataset)  # type: ignore[arg-type]
    if unsafe is None:
        return
    raise UserError(
        f"{unsafe}, and measuring runs it both in this process and in workers: give a function "
        "that builds the loader afresh for each run (feedrate.tune(make_loader), or a TARGET "
        "naming it, file.py:make_loader), not the loader itself"
    )
