"""Who this process is in a distributed job: its rank, the job's size, and its node.

A job is distributed when ``torch.distributed`` is initialized with more than one rank
(``active``). torchrun's ``GROUP_RANK`` says which node a rank is on; without it, ranks are
grouped by host name (``node_key``). Outside a distributed job feedrate behaves as in one
process.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from feedrate.distributed.launcher import launched as launched
from feedrate.errors import UserError


@dataclass(frozen=True)
class Ranks:
    """This process among the job's ranks. ``node`` numbers the nodes 0..``nodes``-1, and
    ``node_of[r]`` is rank ``r``'s; ``local_world`` ranks share this node. ``node_cpus``: the
    CPUs this node's ranks may run on together (their affinity masks' union), None when a rank
    could not read its own."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int
    nodes: int
    node_of: tuple[int, ...]
    node_cpus: int | None = None

    @property
    def main(self) -> bool:
        """Rank 0: the one that speaks, writes files and decides."""
        return self.rank == 0

    def on_node(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def to_dict(self) -> dict[str, object]:
        return {
            "world_size": self.world,
            "local_world_size": self.local_world,
            "nodes": self.nodes,
            "node_of_rank": list(self.node_of),
            "node_cpus": self.node_cpus,
        }


def active() -> bool:
    """``torch.distributed`` is initialized with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def join(timeout_s: float) -> bool:
    """Initialize the default process group from the launcher's environment (gloo) when a
    launcher started this process and nobody did yet, as a command-line run under torchrun
    needs. Returns whether this call initialized it (the caller then destroys it)."""
    if not launched() or not dist.is_available() or dist.is_initialized():
        return False
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as exc:
        raise UserError(
            f"could not join the job's ranks (RANK={os.environ.get('RANK')}, "
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')}, MASTER_ADDR="
            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}): {exc}"
        ) from exc
    return True


def leave() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def node_key() -> str:
    """What this rank shares with the other ranks of its node: torchrun's node rank
    (``GROUP_RANK``), else the host name."""
    group_rank = os.environ.get("GROUP_RANK")
    return f"node{group_rank}" if group_rank is not None else socket.gethostname()


def ranks_of(rank: int, keys: list[str], cpus: list[list[int] | None] | None = None) -> Ranks:
    """``Ranks`` from every rank's node key (and, in ``cpus``, its affinity mask), nodes
    numbered in order of their first rank."""
    order: dict[str, int] = {}
    for k in keys:
        order.setdefault(k, len(order))
    node_of = tuple(order[k] for k in keys)
    mine = node_of[rank]
    local = [r for r, n in enumerate(node_of) if n == mine]
    masks = [cpus[r] for r in local] if cpus is not None else [None]
    return Ranks(
        rank=rank,
        world=len(keys),
        local_rank=local.index(rank),
        local_world=len(local),
        node=mine,
        nodes=len(order),
        node_of=node_of,
        node_cpus=len(set().union(*masks)) if all(masks) else None,
    )
