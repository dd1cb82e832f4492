"""What ``feedrate run`` observed, as plain data (schema ``feedrate.run/1``, documented in
docs/run.md): every DataLoader a script iterated, in every process it started, with the time
the loop waited in ``next()`` against the time between batches (the step), and what to do.

Times are in seconds, memory in bytes. ``stall`` is the share of a loader's loop time spent
waiting in ``next()`` (start-up included): ``wait_s / (wait_s + step_s)``. Time between two
epochs (after the loader ran out, before it is iterated again) belongs to no loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from feedrate.loader.config import LoaderConfig
from feedrate.results.findings import Finding

RUN_SCHEMA = "feedrate.run/1"
Role = Literal["train", "eval"]


@dataclass
class Window:
    """One stretch of the timeline: from ``t_s`` (seconds since the run started) for
    ``span_s``, the loop waited ``wait_s`` in ``next()`` and stepped ``step_s``, taking
    ``batches``."""

    t_s: float
    span_s: float
    wait_s: float
    step_s: float
    batches: int

    @property
    def stall(self) -> float | None:
        busy = self.wait_s + self.step_s
        return self.wait_s / busy if busy > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["stall"] = self.stall
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Window:
        return cls(d["t_s"], d["span_s"], d["wait_s"], d["step_s"], int(d["batches"]))


@dataclass
class WorkerUse:
    """The loader's worker processes, read every few seconds while it was iterated: CPU per
    wall second of iteration, summed over workers (1.0 = one core busy), and likewise the seconds
    they spent runnable but queued for a CPU (Linux schedstat; None elsewhere), the largest USS and
    PSS summed over the workers of one reading, and how many distinct worker processes ran
    (non-persistent workers are new processes each epoch)."""

    cpu_util: float | None = None
    runq_util: float | None = None
    uss_bytes: int | None = None
    pss_bytes: int | None = None
    processes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerUse:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class AutotuneChange:
    """What ``--autotune`` did to a loader: the settings before and after, whether it settled,
    where it started from, the stall of the loader's own settings (when autotune tried them)
    and of the loop over the last half of its batches (once tuned), and its trials
    (autotune's own report, schema ``feedrate.autotune/1``). ``error`` says why it could not
    wrap the loader (the loader was then observed as it was)."""

    before: LoaderConfig
    after: LoaderConfig | None = None
    settled: bool = False
    started_from: str = ""
    stall_before: float | None = None
    stall_after: float | None = None
    report: dict[str, Any] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict(),
            "after": None if self.after is None else self.after.to_dict(),
            "settled": self.settled,
            "started_from": self.started_from,
            "stall_before": self.stall_before,
            "stall_after": self.stall_after,
            "report": self.report,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AutotuneChange:
        after = d.get("after")
        return cls(
            before=LoaderConfig.from_dict(d["before"]),
            after=None if after is None else LoaderConfig.from_dict(after),
            settled=bool(d.get("settled", False)),
            started_from=str(d.get("started_from", "")),
            stall_before=d.get("stall_before"),
            stall_after=d.get("stall_after"),
            report=d.get("report"),
            error=d.get("error"),
        )


@dataclass
class LoaderRun:
    """One DataLoader as the script used it. ``created_at`` is ``file:line`` of the user's code
    that built it; ``name`` the module-level name it was found under at exit (``file.py:NAME``
    for ``feedrate tune``), if any. ``main_cpu_in_next`` is the main thread's CPU per second
    of waiting in ``next()`` (1.0: the wait was all computing, in this process);
    ``main_queued_in_next`` its share of that wait queued for a CPU while the main process made
    the batch itself (without workers: computing held up by other processes, not sleeping).
    ``grad_off_batches`` were taken with autograd off (``torch.no_grad``, inference mode).
    ``system_busy_cpus``: the whole machine's busy CPUs while its workers were read (others'
    processes too). ``stream_kept``: of an IterableDataset, why its worker count must stay
    (its stream is not seen split by worker: probed at its first epoch), with
    ``stream_copies`` where 2 workers were seen to yield the same samples.
    ``role``, ``bottleneck``, ``findings`` and ``next_step`` are decided from the rest."""

    created_at: str
    config: LoaderConfig
    pid: int
    rank: int | None = None
    name: str | None = None
    loader_type: str = "DataLoader"
    dataset_type: str = ""
    batch_size: int | None = None
    epoch_batches: int | None = None
    epochs: int = 0
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    startup_s: float | None = None
    epoch_restart_s: list[float] = field(default_factory=list)
    main_cpu_in_next: float | None = None
    main_queued_in_next: float | None = None
    #: The trainer whose code built it ("transformers", "accelerate", "lightning"), if any.
    built_by: str | None = None
    #: feedrate's answer already (``result.loader()``: an integration tuned it in the script).
    handed_over: bool = False
    grad_off_batches: int = 0
    batch_bytes: int | None = None
    workers: WorkerUse = field(default_factory=WorkerUse)
    shm_peak_bytes: int | None = None
    system_busy_cpus: float | None = None
    timeline: list[Window] = field(default_factory=list)
    autotune: AutotuneChange | None = None
    stream_kept: str | None = None
    stream_copies: bool = False
    role: Role = "train"
    bottleneck: str | None = None
    findings: list[Finding] = field(default_factory=list)
    next_step: list[str] = field(default_factory=list)

    @property
    def loop_s(self) -> float:
        return self.wait_s + self.step_s

    @property
    def stall(self) -> float | None:
        """The share of the loop's time spent waiting for data, or None before any batch."""
        return self.wait_s / self.loop_s if self.loop_s > 0 and self.batches else None

    @property
    def tuned(self) -> bool:
        """``--autotune`` tuned it (and reported what it chose)."""
        t = self.autotune
        return t is not None and t.after is not None and t.error is None

    @property
    def settled_config(self) -> LoaderConfig:
        """The settings that tell what the loader runs now: once tuned, autotune's."""
        t = self.autotune
        return t.after if self.tuned and t is not None and t.after is not None else self.config

    @property
    def settled_stall(self) -> float | None:
        """The stall that tells what the loader needs now: once tuned, the stall over the
        last half of the batches; else the whole loop's."""
        t = self.autotune
        if self.tuned and t is not None and t.stall_after is not None:
            return t.stall_after
        return self.stall

    @property
    def label(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        return f"{self.name or self.created_at} ({where})"

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in _NESTED}
        out["config"] = self.config.to_dict()
        out["stall"] = self.stall
        out["workers"] = self.workers.to_dict()
        out["timeline"] = [w.to_dict() for w in self.timeline]
        out["autotune"] = None if self.autotune is None else self.autotune.to_dict()
        out["findings"] = [f.to_dict() for f in self.findings]
        out["epoch_restart_s"] = list(self.epoch_restart_s)
        out["next_step"] = list(self.next_step)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoaderRun:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k not in _NESTED}
        tuned = d.get("autotune")
        return cls(
            **known,
            config=LoaderConfig.from_dict(d["config"]),
            workers=WorkerUse.from_dict(d.get("workers") or {}),
            timeline=[Window.from_dict(w) for w in d.get("timeline", [])],
            autotune=None if tuned is None else AutotuneChange.from_dict(tuned),
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
        )


_NESTED = frozenset({"config", "workers", "timeline", "autotune", "findings"})


@dataclass
class ProcessRun:
    """One Python process of the command that iterated a DataLoader: its pid, parent, command
    line, rank (``RANK``, else ``LOCAL_RANK``, from torchrun's environment), its loaders, and
    the machine facts it saw (``feedrate env``'s)."""

    pid: int
    ppid: int | None = None
    argv: list[str] = field(default_factory=list)
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    loaders: list[LoaderRun] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["loaders"] = [ld.to_dict() for ld in self.loaders]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProcessRun:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "loaders"}
        return cls(**known, loaders=[LoaderRun.from_dict(ld) for ld in d.get("loaders", [])])


@dataclass
class RunReport:
    """The whole run: the command, its exit status (as a shell reports it: 128 + N for a
    signal N), its wall time, whether feedrate passed on an interrupt, every process that
    iterated a loader, and the loaders of all of them (training loaders first)."""

    command: list[str]
    exit_code: int
    wall_s: float
    interrupted: bool = False
    autotune: bool = False
    processes: list[ProcessRun] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""
    feedrate_version: str = ""

    @property
    def loaders(self) -> list[LoaderRun]:
        found = [ld for p in self.processes for ld in p.loaders]
        return sorted(found, key=lambda ld: (ld.role != "train", ld.rank or 0, ld.pid))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "feedrate_version": self.feedrate_version,
            "command": list(self.command),
            "exit_code": self.exit_code,
            "wall_s": self.wall_s,
            "interrupted": self.interrupted,
            "autotune": self.autotune,
            "verdict": self.verdict,
            "machine": self.machine,
            "processes": [
                {k: v for k, v in p.to_dict().items() if k not in ("loaders", "machine")}
                for p in self.processes
            ],
            "loaders": [ld.to_dict() for ld in self.loaders],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunReport:
        if d.get("schema") != RUN_SCHEMA:
            raise ValueError(f"not a {RUN_SCHEMA} document (schema: {d.get('schema')!r})")
        procs = {p["pid"]: ProcessRun.from_dict({**p, "loaders": []}) for p in d["processes"]}
        for raw in d["loaders"]:
            ld = LoaderRun.from_dict(raw)
            procs.setdefault(ld.pid, ProcessRun(ld.pid, rank=ld.rank)).loaders.append(ld)
        return cls(
            command=list(d["command"]),
            exit_code=int(d["exit_code"]),
            wall_s=float(d["wall_s"]),
            interrupted=bool(d.get("interrupted", False)),
            autotune=bool(d.get("autotune", False)),
            processes=list(procs.values()),
            machine=d.get("machine", {}),
            verdict=d.get("verdict", ""),
            feedrate_version=d.get("feedrate_version", ""),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")
