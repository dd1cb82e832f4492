"""What the doctor looks for and the steps that gather its evidence: every finding id with the
steps it needs (``CHECKS``), the steps in the order they run (``STEPS``), the subset ``tune``
adds to its own findings (``TUNE_CHECKS``), and how long the memory run samples."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from feedrate.checks.dataset import duplicates_finding
from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.loader.rebuild import loader_of
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring.measure import LoaderSource
from feedrate.measuring.shm import MainBatch
from feedrate.results.evidence import SampleRun, StreamDigests, WorkerView
from feedrate.results.findings import Finding

#: Every finding id the doctor reports, each with the steps that gather its evidence ("static"
#: needs none beyond the machine facts and the loader's settings).
CHECKS: dict[str, tuple[str, ...]] = {
    # duplicates: a stream every worker repeats has no worker-count verdict (rates of copies).
    "bottleneck": ("performance", "memory", "duplicates"),  # memory: a batch for a --step
    "too-few-workers": ("performance", "duplicates"),
    "too-many-workers": ("performance", "duplicates"),
    "startup-cost": ("performance", "workers"),
    "shm-too-small": ("batch",),  # and any run that dies of it
    "fd-limit": ("batch",),
    "task-limit": ("static",),
    "pin-memory-unused": ("static", "batch"),
    "pin-memory-no-accelerator": ("static",),
    "cpu-quota": ("static",),
    "copy-on-read": ("memory",),
    "iterable-duplicates": ("duplicates",),
    "shared-rng": ("workers",),
    "thread-oversubscription": ("workers", "memory"),
    "busy-machine": ("performance",),
    "data-stall": ("performance", "memory"),
    "trials-failed": ("performance",),
    "epoch-per-worker": ("static",),
    "workers-past-shards": ("static",),
    # In every rank of a distributed job: each rank's facts, gathered (``doctor_node``).
    "node-worker-oversubscription": ("node",),
    "node-thread-oversubscription": ("node",),
    "node-memory": ("node", "performance"),
    "node-pinned-memory": ("node", "batch"),
    "node-shm-too-small": ("node", "batch"),
    "no-distributed-sampler": ("node",),
    "dispatch-batches": ("node",),
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
    "epoch-per-worker",
    "workers-past-shards",
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
        from feedrate.checks.catalog import CATALOG

        others = [i for i in unknown if i in CATALOG]  # tune's or run's findings, not the doctor's
        what = (
            f"{', '.join(map(repr, others))} is found by tune or run, not by the doctor"
            if others
            else f"unknown check {', '.join(map(repr, unknown))}"
        )
        raise UserError(f"{what}: choose from {', '.join(CHECKS)}")
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

    def copies(self, workers: int) -> Finding | None:
        """``iterable-duplicates`` where 2 workers were seen to yield the same samples: then
        more workers would each yield them again, and their rates would count the copies."""
        return None if self.digests is None else duplicates_finding(self.digests, workers)


class Loaders:
    """The user's loader, and a fresh one for each run where ``source`` is a factory (a
    TARGET naming a function): a dataset iterated once in this process (MosaicML's
    ``StreamingDataset``, which holds file locks and shared memory) must not be forked into
    the next run's workers. ``first`` is built at once; ``fresh()`` hands it out first, then a
    new loader each call. ``source`` is what ``measure`` takes, to build its own per trial."""

    def __init__(self, source: LoaderSource) -> None:
        self.first = loader_of(source)
        self.factory = None if isinstance(source, DataLoader) else source
        self.source: LoaderSource = self.first if self.factory is None else self.factory
        self._handed = False

    def fresh(self) -> DataLoader[Any]:
        if self.factory is None or not self._handed:
            self._handed = True
            return self.first
        return loader_of(self.factory)


def start_method(loader: DataLoader[Any], facts: MachineFacts) -> str | None:
    """How ``loader``'s workers start: its own multiprocessing context, else the machine's."""
    ctx = loader.multiprocessing_context
    if ctx is None:
        return facts.start_method
    return ctx if isinstance(ctx, str) else ctx.get_start_method()


def library_skip(step: str, dataset: object, *, fresh: bool) -> str | None:
    """Why a step is not run on ``dataset``, from what its library is known to do: no
    duplicates run where the library splits the stream by worker; no batch made in this
    process from a dataset that this would break for the workers forked after it, and no
    performance run (your settings and the alternatives: in this process and with workers,
    whose trials hung after one without), unless each run gets a fresh loader (``fresh``:
    the TARGET is a factory)."""
    split = libraries.splits_by_worker(dataset)
    if step == "duplicates" and split is not None:
        return f"not needed: {split}"
    unsafe = libraries.unsafe_to_iterate_here(dataset)
    if step in ("batch", "performance") and unsafe is not None and not fresh:
        return f"not run: {unsafe} (a TARGET naming a function gets a fresh loader per run)"
    return None
