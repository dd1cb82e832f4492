"""The doctor's evidence as plain data: what workers looked like, what they yielded from a
stream, their memory over a run, the dataset's large containers, the thread-safety check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class WorkerView:
    """What one worker looked like right after ``worker_init_fn``. ``age_s``: seconds from the
    worker process's creation (start-up, unpickling the dataset, ``worker_init_fn``);
    ``draws``: path → (generator kind, one draw as text)."""

    worker_id: int
    pid: int
    age_s: float
    init_s: float | None
    torch_threads: int
    cv2_threads: int | None
    env: dict[str, str]
    os_threads: int
    draws: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: The thread pools of the native libraries loaded (OpenBLAS, MKL, OpenMP), as
    #: threadpoolctl reads them, where one sample started their threads: library → threads
    #: it runs a call on.
    pools: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["draws"] = {k: list(v) for k, v in self.draws.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerView:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["draws"] = {k: (v[0], v[1]) for k, v in data.get("draws", {}).items()}
        return cls(**known)


@dataclass
class StreamDigests:
    """What each of 2 workers yielded from an IterableDataset: item digests in order, per
    worker id; ``seconds`` from the first item to the last; ``complete`` unless the time limit
    stopped it (each worker ran out or reached the item limit)."""

    per_worker: dict[int, list[str]]
    seconds: float
    complete: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_worker": {str(k): v for k, v in self.per_worker.items()},
            "seconds": self.seconds,
            "complete": self.complete,
        }


@dataclass
class WorkerMemory:
    """One worker's USS (bytes) at the first and the last reading, and its most OS threads."""

    worker_id: int
    pid: int
    uss_early: int
    uss_late: int
    os_threads: int

    @property
    def growth(self) -> int:
        return self.uss_late - self.uss_early


@dataclass
class SampleRun:
    """The loader run with 2 workers for a while: ``batches`` received (``epoch_batches`` in an
    epoch, when known) over ``seconds``; memory per worker between the first reading (after
    warm-up) and the last, ``memory_seconds`` apart; the first batch's tensors and bytes."""

    batches: int
    epoch_batches: int | None
    seconds: float
    memory_seconds: float
    workers: list[WorkerMemory]
    tensors_per_batch: int | None
    batch_bytes: int | None
    first_batch: Any = field(default=None, repr=False, compare=False)

    @property
    def epoch_fraction(self) -> float | None:
        if not self.epoch_batches:
            return None
        return min(1.0, self.batches / self.epoch_batches)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("first_batch", "workers")}
        out["workers"] = [{**asdict(w), "growth": w.growth} for w in self.workers]
        out["epoch_fraction"] = self.epoch_fraction
        return out


@dataclass(frozen=True)
class Container:
    """A large Python container on the dataset: where (``path``, e.g. ``samples`` or
    ``index['train']``), its type, its item count, and estimates of the Python objects it holds
    and their bytes (from a sample of its items)."""

    path: str
    type_name: str
    items: int
    objects: int
    bytes: int
    item_type: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Container:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass
class ThreadCheck:
    """The verdict: ``ok`` (threads may be recommended), the ``hazards`` found (path, what),
    how many samples were ``compared``, whether the dataset was ``deterministic``, and the
    ``error`` a threaded fetch raised, if any."""

    ok: bool
    hazards: list[tuple[str, str]] = field(default_factory=list)
    compared: int = 0
    deterministic: bool | None = None
    mismatch: Any = None
    error: str | None = None

    def reason(self) -> str:
        """Why threads are blocked (empty when they are not)."""
        if self.hazards:
            where = "; ".join(f"{path} is {what}" for path, what in self.hazards[:3])
            return f"the dataset holds objects threads must not share ({where})"
        if self.error is not None:
            return f"fetching on threads failed: {self.error}"
        if self.mismatch is not None:
            return (
                f"sample index {self.mismatch} came out different when fetched on threads than "
                "when fetched one by one"
            )
        return ""

    def describe(self) -> str:
        if not self.ok:
            return self.reason()
        if self.deterministic:
            return (
                f"{self.compared} samples fetched on threads matched the same samples fetched "
                "one by one"
            )
        return (
            f"no unsafe objects found; the {self.compared} samples were not compared, as the "
            "dataset does not return the same sample twice (random augmentation)"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hazards"] = [list(h) for h in self.hazards]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreadCheck:
        return cls(
            ok=bool(data["ok"]),
            hazards=[(str(p), str(w)) for p, w in data.get("hazards", [])],
            compared=int(data.get("compared", 0)),
            deterministic=data.get("deterministic"),
            mismatch=data.get("mismatch"),
            error=data.get("error"),
        )
