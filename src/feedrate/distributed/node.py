"""Each rank's share of its node: the local ranks share its CPUs, memory (pinned memory
included, which is taken from it), /dev/shm, open files and the tasks its cgroup or user may
start, so a rank deciding for itself decides within ``1 / local_world`` of each. Ranks pinned
each to its own CPUs (``taskset``, ``numactl``, a launcher's binding) already see only theirs:
the node's CPUs are then those of all its ranks together (``Ranks.node_cpus``), and a rank's
share is never more than its own."""

from __future__ import annotations

from dataclasses import replace

from feedrate.cpus import usable_cpus
from feedrate.machine.facts import MachineFacts


def _part(value: int | None, ranks: int) -> int | None:
    return None if value is None else value // ranks


def share(facts: MachineFacts, local_world: int, node_cpus: int | None = None) -> MachineFacts:
    """``facts`` (this rank's) as one of ``local_world`` ranks sees them: CPUs (at least one),
    memory, /dev/shm, open files and the tasks left to start divided between the ranks of the
    node. ``node_cpus``: the
    CPUs the node's ranks may run on together (default: this rank's), within the quota."""
    if local_world <= 1:
        return facts
    node = of_node(facts, node_cpus).cpus_usable
    return replace(
        facts,
        cpus_usable=max(1, min(facts.cpus_usable, node // local_world)),
        memory_total_bytes=_part(facts.memory_total_bytes, local_world),
        memory_available_bytes=_part(facts.memory_available_bytes, local_world),
        memory_limit_bytes=_part(facts.memory_limit_bytes, local_world),
        shm_free_bytes=_part(facts.shm_free_bytes, local_world),
        open_files_soft=_part(facts.open_files_soft, local_world),
        tasks_free=_part(facts.tasks_free, local_world),
    )


def of_node(facts: MachineFacts, node_cpus: int | None) -> MachineFacts:
    """``facts`` (this rank's) with the CPUs of its whole node: those its ranks may run on
    together (``node_cpus``), within the quota; unchanged unless they are pinned apart."""
    if node_cpus is None or not pinned_apart(facts, node_cpus):
        return facts
    return replace(
        facts, cpus_affinity=node_cpus, cpus_usable=usable_cpus(node_cpus, facts.cpu_quota)
    )


def pinned_apart(facts: MachineFacts, node_cpus: int | None) -> bool:
    """The node's ranks may run on more CPUs together (``node_cpus``) than this rank may
    (``facts``): each is pinned to its own."""
    return node_cpus is not None and node_cpus > facts.cpus_affinity
