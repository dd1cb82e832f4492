"""``Forwarding``: the base of feedrate's dataset wrappers. Attribute reads and writes go to the
user's dataset, so a ``worker_init_fn`` that configures ``get_worker_info().dataset`` (sharding,
reseeding) configures the real one, and the wrapper pickles for spawned workers."""

from __future__ import annotations

from typing import Any


class Forwarding:
    """Wraps ``inner``; keyword arguments become the wrapper's own attributes."""

    def __init__(self, inner: Any, **own: Any) -> None:
        object.__setattr__(self, "_feedrate_inner", inner)
        for name, value in own.items():
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Spawned workers unpickle this: rebuild it without going through __setattr__.
        own = {k: v for k, v in self.__dict__.items() if k != "_feedrate_inner"}
        return (_rebuild, (type(self), self._feedrate_inner, own))

    def __getattr__(self, name: str) -> Any:
        if name == "_feedrate_inner":
            raise AttributeError(name)
        return getattr(self._feedrate_inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._feedrate_inner, name, value)


def _rebuild(cls: type[Forwarding], inner: Any, own: dict[str, Any]) -> Forwarding:
    return cls(inner, **own)
