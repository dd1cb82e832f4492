"""The arguments a DataLoader subclass was built with, so feedrate can build the user's own
class again with other settings (as Lightning does for the loaders it re-creates).

While ``recording()`` is in force (feedrate holds it while it imports a TARGET or calls a
factory), every DataLoader built keeps the positional and keyword arguments its class was
called with. For a loader built outside it, ``init_arguments`` recovers what it can from
attributes named like the constructor's parameters (``self.device = device``)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

#: Where a loader built under ``recording()`` keeps its constructor's arguments.
SAVED = "__feedrate_init_args__"
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


_depth = 0  # recording() blocks in force


def _recording_new(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
    instance = object.__new__(cls)
    if _depth:
        # Set on the instance before __init__ runs; DataLoader's own __setattr__ allows it.
        object.__setattr__(instance, SAVED, (args, kwargs))
    return instance


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Within: each DataLoader (any subclass without its own ``__new__``) records the
    arguments it was called with. Nests.

    The ``__new__`` that records is put on DataLoader at the first use and stays (recording
    nothing outside the block): CPython cannot take an added ``__new__`` away again without
    ``object.__new__`` then refusing the constructor's arguments. Where DataLoader already has
    a ``__new__`` of another tool's, nothing is recorded."""
    global _depth
    own = DataLoader.__dict__.get("__new__")
    if own is None:
        DataLoader.__new__ = _recording_new  # type: ignore[assignment]
    elif getattr(own, "__func__", own) is not _recording_new:
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def parameters(cls: type[Any]) -> list[inspect.Parameter]:
    """The parameters of ``cls.__init__`` after ``self``."""
    return list(inspect.signature(cls.__init__).parameters.values())[1:]


def init_arguments(loader: DataLoader[Any]) -> tuple[dict[str, Any], list[str]]:
    """The arguments ``type(loader)`` was called with, by parameter name (``**kwargs``
    flattened in), and the required parameters that could be found neither recorded nor as an
    attribute of the loader."""
    cls = type(loader)
    params = parameters(cls)
    saved = loader.__dict__.get(SAVED)
    if saved is not None:
        args, kwargs = saved
        bound = inspect.signature(cls.__init__).bind_partial(loader, *args, **kwargs)
        out: dict[str, Any] = {}
        for p in params:
            if p.name not in bound.arguments:
                continue
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                out.update(bound.arguments[p.name])
            elif p.kind is not inspect.Parameter.VAR_POSITIONAL:
                out[p.name] = bound.arguments[p.name]
        return out, []
    found, missing = {}, []
    for p in params:
        if p.kind in _VARIADIC:
            continue
        if p.name in loader.__dict__:
            found[p.name] = loader.__dict__[p.name]
        elif p.default is inspect.Parameter.empty:
            missing.append(p.name)
    return found, missing
