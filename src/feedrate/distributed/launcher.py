"""Whether a distributed launcher (torchrun, ``torch.distributed.run``, feedrate's own
``--nproc-per-node``) started this process as one of several ranks: read from the environment
it sets, without importing torch (``feedrate run`` starts without it)."""

from __future__ import annotations

import os

#: The variables torchrun (and ``torch.distributed.run``) sets in every rank it starts.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched() -> bool:
    """This process was started by a distributed launcher (torchrun) as one of several ranks."""
    if not all(v in os.environ for v in LAUNCHER_VARS):
        return False
    try:
        return int(os.environ["WORLD_SIZE"]) > 1
    except ValueError:
        return False


def other_rank() -> bool:
    """This process is a rank of a launched job other than rank 0."""
    return launched() and os.environ.get("RANK") != "0"
