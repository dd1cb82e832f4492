"""Per-process CPU and memory figures of a measurement, as plain data (``processes`` measures
them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessFigures:
    """CPU and memory of one process or thread over the measured windows.

    ``cpu_util`` is CPU seconds per wall second (1.0 = one core busy) over ``measured_s``, the
    window time during which the process could be read (a worker that exits with its epoch is
    not read at that window's end, so that window counts neither its CPU nor its time). Memory
    is in bytes, the largest value read during the windows (every 0.25 s): USS (memory only
    this process holds) and PSS (its fair share of shared pages; None where the OS does not
    report it)."""

    role: str
    pid: int | None = None
    worker_id: int | None = None
    cpu_s: float = 0.0
    measured_s: float = 0.0
    cpu_util: float = 0.0
    runq_s: float | None = None
    runq_util: float | None = None
    uss_bytes: int | None = None
    pss_bytes: int | None = None
    rss_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessFigures:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class ProbeReport:
    """What the probe saw: main process (less the pin-memory and probe threads), the pin-memory
    thread when there is one, every worker, the peak /dev/shm use above its level at start, and
    how many CPUs the whole machine kept busy (other processes included: contention shows)."""

    wall_s: float = 0.0
    main: ProcessFigures = field(default_factory=lambda: ProcessFigures("main"))
    pin_memory_thread: ProcessFigures | None = None
    workers: list[ProcessFigures] = field(default_factory=list)
    probe_cpu_s: float = 0.0
    shm_peak_bytes: int | None = None
    system_busy_cpus: float | None = None

    @property
    def own_cpu(self) -> float:
        """CPUs the main process and its workers kept busy (1.0 = one core)."""
        return self.main.cpu_util + sum(w.cpu_util for w in self.workers)

    def to_dict(self) -> dict[str, Any]:
        pin = self.pin_memory_thread
        return {
            "wall_s": self.wall_s,
            "main": self.main.to_dict(),
            "pin_memory_thread": None if pin is None else pin.to_dict(),
            "workers": [w.to_dict() for w in self.workers],
            "probe_cpu_s": self.probe_cpu_s,
            "shm_peak_bytes": self.shm_peak_bytes,
            "system_busy_cpus": self.system_busy_cpus,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeReport:
        pin = data.get("pin_memory_thread")
        return cls(
            wall_s=float(data.get("wall_s", 0.0)),
            main=ProcessFigures.from_dict(data.get("main", {"role": "main"})),
            pin_memory_thread=None if pin is None else ProcessFigures.from_dict(pin),
            workers=[ProcessFigures.from_dict(w) for w in data.get("workers", [])],
            probe_cpu_s=float(data.get("probe_cpu_s", 0.0)),
            shm_peak_bytes=data.get("shm_peak_bytes"),
            system_busy_cpus=data.get("system_busy_cpus"),
        )
