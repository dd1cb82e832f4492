"""DataLoader settings as plain data (``LoaderConfig``): what feedrate chooses, compared, stored
and printed. No torch here: the decision code reads and makes these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from feedrate.errors import UserError

#: DataLoader's own default when workers are used and ``prefetch_factor`` is not given.
DEFAULT_PREFETCH_FACTOR = 2


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
            if norm.in_order is not None:
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
