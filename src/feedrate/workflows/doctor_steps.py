"""What the doctor looks for and the steps that gather its evidence: every finding id with the
steps it needs (``CHECKS``), the steps in the order they run (``STEPS``), the subset ``tune``
adds to its own findings (``TUNE_CHECKS``), and how long the memory run samples."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from feedrate.errors import UserError
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring.shm import MainBatch
from feedrate.results.evidence import SampleRun, StreamDigests, WorkerView

#: Every finding id the doctor reports, each with the steps that gather its evidence ("static"
#: needs none beyond the machine facts and the loader's settings).
CHECKS: dict[str, tuple[str, ...]] = {
    "bottleneck": ("performance", "memory"),  # memory: a batch to time a --step on
    "too-few-workers": ("performance",),
    "too-many-workers": ("performance",),
    "startup-cost": ("performance", "workers"),
    "shm-too-small": ("batch",),  # and any run that dies of it
    "fd-limit": ("batch",),
    "pin-memory-unused": ("static", "batch"),
    "pin-memory-no-accelerator": ("static",),
    "cpu-quota": ("static",),
    "copy-on-read": ("memory",),
    "iterable-duplicates": ("duplicates",),
    "shared-rng": ("workers",),
    "thread-oversubscription": ("workers", "memory"),
    "busy-machine": ("performance",),
    "data-stall": ("performance", "memory"),
}
#: The steps in the order they run (cheap and independent of the pipeline's speed first; the
#: batch before any run of the user's batches through /dev/shm, so that those predicted to
#: overflow it are not started), each with what it does, as findings name it.
STEPS = {
    "workers": "look inside 2 workers (after worker_init_fn)",
    "duplicates": "IterableDataset run in 2 workers",
    "batch": "one batch made in the main process (no workers)",
    "memory": "memory run (your loader with 2 workers)",
    "performance": "throughput measurement",
}
#: What ``tune`` adds to its own findings (its search covers the rest).
TUNE_CHECKS = (
    "shm-too-small",
    "fd-limit",
    "pin-memory-unused",
    "copy-on-read",
    "iterable-duplicates",
    "shared-rng",
    "thread-oversubscription",
)
#: Seconds of the memory run where the dataset holds large Python containers (to see worker
#: memory grow), and otherwise (a batch, and the workers' threads while loading).
MEMORY_SECONDS = 2.5
BRIEF_SECONDS = 0.5
#: Seconds of the memory run inside ``tune`` (where the dataset holds large containers).
TUNE_MEMORY_SECONDS = 2.0


def wanted_checks(ids: Collection[str] | None) -> set[str]:
    """The finding ids to look for (all for None); ``UserError`` naming any unknown one."""
    if ids is None:
        return set(CHECKS)
    unknown = sorted(set(ids) - set(CHECKS))
    if unknown:
        raise UserError(
            f"unknown check {', '.join(map(repr, unknown))}: choose from {', '.join(CHECKS)}"
        )
    return set(ids)


def facts_for(machine: MachineFacts | Mapping[str, Any] | None) -> MachineFacts:
    """The facts to judge by: this machine's, ``machine`` itself, or this machine's with the
    fields a mapping names overridden (``{"shm_free_bytes": 64 * 2**20}``)."""
    if isinstance(machine, MachineFacts):
        return machine
    facts = collect()
    if not machine:
        return facts
    unknown = sorted(set(machine) - set(facts.to_dict()))
    if unknown:
        raise UserError(f"unknown machine fact {', '.join(map(repr, unknown))}")
    return MachineFacts.from_dict({**facts.to_dict(), **machine})


@dataclass
class Evidence:
    """What the steps gathered; each stays None (or empty) when its step did not run."""

    views: list[WorkerView] = field(default_factory=list)
    digests: StreamDigests | None = None
    run: SampleRun | None = None
    pickled_bytes: int | None = None
    batch: MainBatch | None = None
