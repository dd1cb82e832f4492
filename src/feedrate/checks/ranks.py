"""Rules that only exist with several ranks: what the ranks of one node take together (worker
processes and intra-op threads against its CPUs, memory, pinned memory and /dev/shm against its
own), and what the job's loaders do between them (every rank reading every sample; accelerate's
``dispatch_batches`` leaving the loading to rank 0). Pure functions over ``RankFacts``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from feedrate.checks.transfer import PINNED_SHARE, pinned_budget
from feedrate.cpus import usable_cpus
from feedrate.results.findings import Finding, FindingDoc, by_severity
from feedrate.results.ranks import RankFacts
from feedrate.search.space import SHM_HEADROOM
from feedrate.units import counted, size

#: The node's ranks' processes above this share of its memory are a warning: training itself
#: (the model, the optimizer's state, the framework) needs the rest.
NODE_MEMORY_SHARE = 0.5

NodeRule = Callable[[list[RankFacts], dict[str, Any]], Finding | None]


def node_findings(ranks: list[RankFacts], machine: dict[str, Any]) -> list[Finding]:
    """The findings of a job's ranks together (every rank's facts, in any order), judged
    against ``machine``, one whole node (``MachineFacts.to_dict()``; a job's nodes taken alike).
    Empty for fewer than 2 ranks. A rule firing on several nodes alike is one finding."""
    if len(ranks) < 2:
        return []
    job = [no_distributed_sampler_finding(ranks), dispatch_batches_finding(ranks)]
    nodes = sorted({r.node for r in ranks})
    seen: dict[Finding, list[int]] = {}
    for node in nodes:
        local = sorted((r for r in ranks if r.node == node), key=lambda r: r.rank)
        for rule in NODE_RULES:
            found = rule(local, machine)
            if found is not None:
                seen.setdefault(found, []).append(node)
    per_node = [_on_nodes(f, where, len(nodes)) for f, where in seen.items()]
    return by_severity([f for f in job if f is not None] + per_node)


def _on_nodes(finding: Finding, where: list[int], nodes: int) -> Finding:
    if nodes < 2:
        return finding
    label = f"node {where[0]}" if len(where) == 1 else f"nodes {', '.join(map(str, where))}"
    return Finding(finding.id, finding.severity, f"on {label}: {finding.message}", finding.fix)


def _times(values: list[int], unit: str) -> str:
    """``2 ranks × 4 workers``, or ``2 ranks with 4 + 2 workers`` where they differ."""
    if len(set(values)) == 1:
        return f"{len(values)} ranks × {values[0]} {unit}"
    return f"{len(values)} ranks with {' + '.join(map(str, values))} {unit}"


def _ranks(ranks: list[RankFacts]) -> str:
    numbers = [str(r.rank) for r in ranks]
    return f"rank {numbers[0]}" if len(numbers) == 1 else f"ranks {', '.join(numbers)}"


def node_cpus(ranks: list[RankFacts], machine: dict[str, Any]) -> int | None:
    """The node's usable CPUs: its ranks' affinity masks together where each sees fewer."""
    own = machine.get("cpus_affinity") or machine.get("cpus_usable") or 0
    union = len(set().union(*(r.cpu_ids or () for r in ranks)))
    if not all(r.cpu_ids for r in ranks) or union <= own:  # not pinned apart: machine's
        return machine.get("cpus_usable")
    return usable_cpus(union, machine.get("cpu_quota"))


def worker_oversubscription_finding(
    ranks: list[RankFacts], machine: dict[str, Any]
) -> Finding | None:
    """The worker processes of the node's ranks together are more than its usable CPUs."""
    cpus = node_cpus(ranks, machine)
    loading = [r for r in ranks if r.loads]
    workers = sum(r.num_workers for r in loading)
    if not cpus or not loading or workers <= cpus:
        return None
    threads = max(r.threads for r in loading)
    on_threads = f", each fetching on {threads} threads" if threads > 1 else ""
    each = cpus // len(loading)
    fix = f"num_workers={each} per rank ({counted(cpus, 'usable CPU')} ÷ {len(loading)} ranks)"
    if each == 0:
        fix = f"num_workers=0 per rank (fewer usable CPUs, {cpus}, than loading ranks)"
    return Finding(
        "node-worker-oversubscription",
        "warning",
        f"{_times([r.num_workers for r in loading], 'workers')} = {workers} worker processes"
        f"{on_threads} (beside {len(ranks)} main processes) on {counted(cpus, 'usable CPU')}: "
        "the node's ranks compete for its CPUs, so each rank's loader gets less than it would "
        "alone and every step waits for the slowest rank (unless the workers mostly wait on I/O)",
        f"{fix}, or let feedrate tune measure with every rank loading at once (under torchrun)",
    )


def _omp(ranks: list[RankFacts]) -> str:
    values = ", ".join(sorted({r.omp_num_threads or "unset" for r in ranks}))
    return "OMP_NUM_THREADS unset" if values == "unset" else f"OMP_NUM_THREADS={values}"


def thread_oversubscription_finding(
    ranks: list[RankFacts], machine: dict[str, Any]
) -> Finding | None:
    """The intra-op threads of the node's ranks together are more than its usable CPUs."""
    cpus = node_cpus(ranks, machine)
    threads = [r.torch_threads for r in ranks]
    if not cpus or sum(threads) <= cpus:
        return None
    each = max(1, cpus // len(ranks))
    fewest = all(t <= each for t in threads)  # one thread each already: too many ranks
    return Finding(
        "node-thread-oversubscription",
        "warning",
        f"{_times(threads, 'intra-op threads')} (torch.get_num_threads(); {_omp(ranks)}) = "
        f"{sum(threads)} on {counted(cpus, 'usable CPU')}: the ranks' CPU work (collation and "
        "pinning in the main process, CPU compute) runs on more threads than the node has CPUs, "
        "and its threads wait on each other",
        f"at most {cpus} ranks on this node (one CPU each), or a node with a CPU per rank"
        if fewest
        else f"OMP_NUM_THREADS={each} for every rank (torchrun sets 1 only where it is unset), "
        f"or torch.set_num_threads({each}) at the start of each rank",
    )


def memory_finding(ranks: list[RankFacts], machine: dict[str, Any]) -> Finding | None:
    """The node's ranks' processes (main and workers, as measured) against its memory."""
    node = machine.get("memory_limit_bytes") or machine.get("memory_total_bytes")
    measured = [r for r in ranks if r.memory_bytes is not None]
    total = sum(r.memory_bytes or 0 for r in measured)
    if not node or not measured or total <= node * NODE_MEMORY_SHARE:
        return None
    over = total > node
    each = " + ".join(size(r.memory_bytes or 0) for r in measured)
    return Finding(
        "node-memory",
        "error" if over else "warning",
        f"the {len(measured)} ranks' processes on this node (main processes and workers, as "
        f"measured: {each}) take {size(total)} of its {size(node)} ({total / node:.0%}): "
        + (
            "more than the node has, expect the OOM killer"
            if over
            else f"over {NODE_MEMORY_SHARE:.0%}, little is left for training itself"
        ),
        "fewer workers per rank, or a dataset that keeps its index in numpy arrays or "
        "memory-mapped files rather than Python objects (each worker copies those: see "
        "copy-on-read)",
    )


def pinned_memory_finding(ranks: list[RankFacts], machine: dict[str, Any]) -> Finding | None:
    """The pinned memory in flight of the node's ranks together, over the pinned budget."""
    if machine.get("accelerator", "none") == "none":
        return None  # nothing is pinned (pin-memory-no-accelerator says so per rank)
    pinned = [r for r in ranks if r.loads and r.pinned_bytes]
    total = sum(r.pinned_bytes or 0 for r in pinned)
    budget = pinned_budget(machine)
    if not pinned or budget is None or total <= budget:
        return None
    lowest = min(r.prefetch_factor or 2 for r in pinned)
    return Finding(
        "node-pinned-memory",
        "warning",
        f"{len(pinned)} ranks with pin_memory=True lock about {size(total)} of RAM in flight "
        f"({' + '.join(size(r.pinned_bytes or 0) for r in pinned)}), over {PINNED_SHARE:.0%} "
        f"of the node's memory ({size(budget)}): the OS cannot swap or reclaim it",
        f"DataLoader(..., prefetch_factor={max(1, lowest // 2)}) or fewer workers per rank",
    )


def shm_finding(ranks: list[RankFacts], machine: dict[str, Any]) -> Finding | None:
    """The batches the node's ranks keep in flight through /dev/shm together, against it."""
    free = machine.get("shm_free_bytes")
    flying = [r for r in ranks if r.loads and r.shm_in_flight_bytes]
    total = sum(r.shm_in_flight_bytes or 0 for r in flying)
    if free is None or not flying or total * SHM_HEADROOM <= free:
        return None
    over = total > free
    batch = max(r.batch_bytes or 0 for r in flying)
    fits = int(free / (SHM_HEADROOM * batch * len(flying))) if batch else 0
    gib = max(1, math.ceil(total * SHM_HEADROOM / 2**30))
    each = " + ".join(size(r.shm_in_flight_bytes or 0) for r in flying)
    return Finding(
        "node-shm-too-small",
        "error" if over else "warning",
        f"/dev/shm has {size(free)} free but the node's {len(flying)} ranks keep "
        f"{size(total)} of batches in flight through it ({each}: num_workers × "
        f"prefetch_factor batches of up to {size(batch)} each), {size(total * SHM_HEADROOM)} "
        "with headroom: their workers "
        + ("will fail" if over else "risk failing")
        + " to hand batches over ('unable to allocate shared memory', or a bus error, SIGBUS)",
        f"num_workers × prefetch_factor ≤ {fits} per rank, or a larger /dev/shm "
        f"(docker run --shm-size={gib}g or --ipc=host)",
    )


def no_distributed_sampler_finding(ranks: list[RankFacts]) -> Finding | None:
    """Ranks whose map-style loader draws from the whole dataset (no DistributedSampler) while
    their datasets look the same (equal lengths): every rank reads every sample."""
    whole = [r for r in ranks if r.loads and r.sharded is False]
    lengths = {r.dataset_len for r in whole if r.dataset_len is not None}
    if not whole or len(lengths) > 1:
        return None
    names = sorted({r.sampler for r in whole if r.sampler})
    world = len(ranks)
    same = "the ranks train on the same batches"
    again = f"the model sees every sample {world} times an epoch"
    effect = {"SequentialSampler": same, "RandomSampler": again}
    said = "; ".join(effect[n] for n in names if n in effect) or f"{same}, or {again}"
    return Finding(
        "no-distributed-sampler",
        "error",
        f"{_ranks(whole)} of {world} read every sample: a map-style loader on "
        f"{', '.join(names) or 'its sampler'} and no DistributedSampler, so each epoch every "
        f"rank loads the whole dataset ({world}× the loading the job needs) and {said}",
        "DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=True), ...) without "
        "shuffle=True, and sampler.set_epoch(epoch) before each epoch (Lightning, accelerate "
        "and the transformers Trainer add it when they build or prepare the loader); ignore "
        "this where each rank's dataset is already its own part",
    )


def dispatch_batches_finding(ranks: list[RankFacts]) -> Finding | None:
    """accelerate's ``dispatch_batches``: rank 0's loader loads for every rank."""
    if not any(r.dispatch_batches for r in ranks):
        return None
    world = len(ranks)
    main = next((r for r in ranks if r.rank == 0), None)
    workers = f" with {main.num_workers} workers" if main is not None else ""
    return Finding(
        "dispatch-batches",
        "warning",
        f"accelerate's dispatch_batches: rank 0's loader{workers} loads the batches of all "
        f"{world} ranks and sends each its part, so it must deliver {world}× a rank's step "
        "while the other ranks' loaders (and their share of the CPUs) stay idle",
        "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False)) so "
        "every rank loads its own shard, or tune rank 0's loader for the whole job: "
        f"feedrate tune --rate {world}× a rank's samples/s",
    )


NODE_RULES: tuple[NodeRule, ...] = (
    worker_oversubscription_finding,
    thread_oversubscription_finding,
    memory_finding,
    pinned_memory_finding,
    shm_finding,
)


_FROM = "From `doctor` in every rank of a distributed job, which gathers every rank's facts: "

#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
    FindingDoc(
        id="node-worker-oversubscription",
        title="The node's ranks start more workers than it has CPUs",
        means=(
            "Every rank on a node starts its own `num_workers` workers: together they are more "
            "worker processes than the node's usable CPUs. A loader tuned in one process gets "
            "a fraction of the CPUs it was tuned with, and the job's steps wait for the slowest "
            "rank. Pipelines whose workers mostly wait on I/O can use more workers than CPUs."
        ),
        evidence=(
            _FROM + "the sum of the node's ranks' `num_workers` (and the threads each fetches "
            "on, `feedrate.threaded`) against the node's usable CPUs: those the ranks' affinity "
            "masks hold together (ranks pinned each to its own CPUs count all of them), within "
            "the container's quota; under `dispatch_batches` only rank 0's loader counts."
        ),
        fix=(
            "`num_workers` = usable CPUs ÷ ranks per node (the message gives it), or let "
            "`feedrate tune` measure under torchrun, every rank loading at once."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="node-thread-oversubscription",
        title="The node's ranks run more intra-op threads than it has CPUs",
        means=(
            "Each rank's torch runs `torch.get_num_threads()` intra-op threads (from "
            "`OMP_NUM_THREADS`, else one per CPU); on one node together they are more than its "
            "usable CPUs, so the ranks' CPU work (collation, pinning, CPU compute) waits on "
            "itself."
        ),
        evidence=(
            _FROM + "each rank's `torch.get_num_threads()` and `OMP_NUM_THREADS`, summed over "
            "the node's ranks, against its usable CPUs (as for node-worker-oversubscription)."
        ),
        fix=(
            "`OMP_NUM_THREADS` = usable CPUs ÷ ranks per node for every rank (torchrun sets 1 "
            "only where it is unset), or `torch.set_num_threads(n)` at the start of each rank; "
            "where each runs one already, no more ranks than the node's CPUs."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="node-memory",
        title="The node's ranks together take most of its memory",
        means=(
            "The main processes and workers of the node's ranks, as the doctor measured them, "
            "together take more than half of the node's memory (or more than it has): the "
            "model, the optimizer and the framework need the rest."
        ),
        evidence=(
            _FROM + "each rank's main process and workers (PSS, else USS) from its doctor's "
            "throughput measurement, summed over the node's ranks, against the node's memory "
            "(its cgroup limit, else its total)."
        ),
        fix=(
            "Fewer workers per rank, or a dataset that keeps its index in numpy arrays or "
            "memory-mapped files rather than Python objects (see `copy-on-read`)."
        ),
        severity="error above the node's memory; warning above half of it",
    ),
    FindingDoc(
        id="node-pinned-memory",
        title="The node's ranks together pin too much memory",
        means=(
            "With `pin_memory=True` each rank locks its batches in flight in RAM; together the "
            "node's ranks lock more than 10% of its memory, which the OS cannot swap or reclaim."
        ),
        evidence=(
            _FROM + "each rank's batch bytes × (`num_workers` × `prefetch_factor` + 1), "
            "summed over the node's ranks, against 10% of the node's memory; only with an "
            "accelerator."
        ),
        fix="A lower `prefetch_factor` or fewer workers per rank.",
        severity="warning",
    ),
    FindingDoc(
        id="node-shm-too-small",
        title="/dev/shm is too small for the node's ranks together",
        means=(
            "The node's ranks share one `/dev/shm`: the batches their workers keep in flight "
            "together do not fit in it (or not with 1.5× headroom), even where each rank's alone "
            "would. A worker that cannot write its batch dies of a bus error (SIGBUS) or with "
            '"unable to allocate shared memory".'
        ),
        evidence=(
            _FROM + "each rank's batch bytes (one batch made in its main process) × "
            "`num_workers` × `prefetch_factor`, summed over the node's ranks, against the free "
            "size of `/dev/shm`."
        ),
        fix=(
            "Keep `num_workers` × `prefetch_factor` per rank at most the number the message "
            "gives, or enlarge `/dev/shm` (`docker run --shm-size=Ng` or `--ipc=host`)."
        ),
        severity=(
            "error when the batches in flight do not fit; warning when they fit without the "
            "1.5× headroom"
        ),
    ),
    FindingDoc(
        id="no-distributed-sampler",
        title="Every rank reads every sample",
        means=(
            "Under DDP a map-style loader without a `DistributedSampler` (on torch's own "
            "`SequentialSampler` or `RandomSampler`) draws from the whole dataset in every "
            "rank: the ranks train on the same batches, or the model sees every sample once "
            "per rank each epoch, and the job loads N× the data it needs."
        ),
        evidence=(
            _FROM + "each rank's sampler (its loader's and its batch sampler's), and whether "
            "its dataset is known to split by rank (MosaicML's and litdata's streaming "
            "datasets, a Hugging Face dataset split by `split_dataset_by_node`, webdataset's "
            "`split_by_node`, accelerate's sharded loaders). Not reported where the ranks' "
            "datasets differ in length (each is its own part), nor for an IterableDataset "
            "(it may split by rank in `__iter__`)."
        ),
        fix=(
            "`DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=True), ...)` "
            "(without `shuffle=True`) and `sampler.set_epoch(epoch)` before each epoch; "
            "Lightning, accelerate and the transformers Trainer add it when they build or "
            "prepare the loader."
        ),
        severity="error",
    ),
    FindingDoc(
        id="dispatch-batches",
        title="accelerate's dispatch_batches leaves the loading to rank 0",
        means=(
            "accelerate's `DataLoaderDispatcher` (`dispatch_batches=True`, its default for an "
            "IterableDataset) loads every rank's batches in rank 0 and sends each its part: "
            "rank 0's loader must deliver N× a rank's step while the other ranks' loaders and "
            "their share of the CPUs stay idle."
        ),
        evidence=(
            _FROM + "each rank's loader class (accelerate's `DataLoaderDispatcher`, recognised "
            "by name without importing accelerate)."
        ),
        fix=(
            "`Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))` so "
            "every rank loads its own shard, or tune rank 0's loader for the job's total rate "
            "(`feedrate tune --rate`, N× a rank's samples/s)."
        ),
        severity="warning",
    ),
)
