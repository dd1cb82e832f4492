"""Each rank's share of its node: the local ranks share its CPUs, memory (pinned memory
included, which is taken from it), /dev/shm and open files, so a rank deciding for itself
decides within ``1 / local_world`` of each."""

from __future__ import annotations

from dataclasses import replace

from feedrate.machine.facts import MachineFacts


def _part(value: int | None, ranks: int) -> int | None:
    return None if value is None else value // ranks


def share(facts: MachineFacts, local_world: int) -> MachineFacts:
    """``facts`` as one of ``local_world`` ranks sees them: CPUs (at least one), memory,
    /dev/shm and open files divided between the ranks of the node."""
    if local_world <= 1:
        return facts
    return replace(
        facts,
        cpus_usable=max(1, facts.cpus_usable // local_world),
        memory_total_bytes=_part(facts.memory_total_bytes, local_world),
        memory_available_bytes=_part(facts.memory_available_bytes, local_world),
        memory_limit_bytes=_part(facts.memory_limit_bytes, local_world),
        shm_free_bytes=_part(facts.shm_free_bytes, local_world),
        open_files_soft=_part(facts.open_files_soft, local_world),
    )
