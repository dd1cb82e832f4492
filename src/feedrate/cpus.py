"""The CPUs a pipeline can keep busy: one rule for the machine's facts (``machine.facts``) and
for the decisions judged over them (``checks.ranks``, ``distributed.node``)."""

from __future__ import annotations

import math


def usable_cpus(affinity: int, quota: float | None) -> int:
    """CPUs a pipeline can keep busy: the smaller of the affinity count and the cgroup quota.

    The quota is floored because a fractional CPU cannot host a whole busy worker without being
    throttled; a quota below 1 (e.g. 0.5) still yields 1, as does a nonsensical affinity.
    ``quota=None`` means no quota.
    """
    if quota is None:
        return max(1, affinity)
    return max(1, min(affinity, math.floor(quota)))
