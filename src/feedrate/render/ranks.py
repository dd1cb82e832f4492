"""What a tune or a measurement over the ranks of a distributed job adds to the answer: the
job's rate, each node's, and what the per-rank figures mean."""

from __future__ import annotations

from feedrate.render.text import rate
from feedrate.results.measurement import Measurement
from feedrate.results.tune import TuneResult


def ranks_rows(result: TuneResult) -> list[tuple[str, str]]:
    """Rows for the recommendation table; none outside a distributed job."""
    shape = result.ranks
    if shape is None:
        return []
    world, local, nodes = shape["world_size"], shape["local_world_size"], shape["nodes"]
    where = f"{nodes} nodes" if nodes > 1 else "1 node"
    rows = [
        (
            "ranks",
            f"{world} ranks on {where}, {local} per node, all loading at once in every trial; "
            "the settings are per rank, the figures above the slowest rank's",
        ),
        (
            "job",
            f"{rate(result.job_rate)} distinct samples/s (one rank's rate, not × {world}: every "
            "rank reads every sample, no-distributed-sampler)"
            if result.every_rank_reads_all
            else f"{rate(result.job_rate)} samples/s (the slowest rank's rate × {world} ranks: "
            "training steps in lockstep)",
        ),
    ]
    if nodes > 1:
        for n, r in enumerate(result.node_rates()):
            rows.append((f"node {n}", f"{rate(r)} samples/s"))
    if shape.get("shard_made"):
        rows.append(
            (
                "shards",
                "each rank read a DistributedSampler's shard made for the measurement (--shard): "
                "the figures hold when you train with one (your trainer's, or "
                "sampler=DistributedSampler(dataset)); without, every rank reads every sample",
            )
        )
    return rows


def measured_ranks_rows(m: Measurement) -> list[tuple[str, str]]:
    """Rows for a measurement's summary; none outside a distributed job. The job's rate is the
    ranks' sum only where they read distinct samples (``Measurement.sharded``)."""
    if not m.rank_rates or len(m.rank_rates) < 2:
        return []
    n, each = len(m.rank_rates), ", ".join(rate(r) for r in m.rank_rates)
    lockstep = (
        f"a rank's rate × {n}: training steps in lockstep, so the slowest rank's, or theirs "
        "pooled where they agree within noise"
    )
    if m.sharded is False:
        said = (
            f"each reading every sample, with no DistributedSampler ({each} samples/s); the "
            f"job: {rate(m.job_rate)} distinct samples/s (one rank's rate, not × {n}: the other "
            "ranks load the same samples again; see no-distributed-sampler, or measure with "
            "--shard for training with a DistributedSampler)"
        )
    elif m.sharded:
        said = (
            f"each on its shard ({each} samples/s); the job: {rate(m.job_rate)} samples/s "
            f"({lockstep})"
        )
    else:
        said = (
            f"each on its own loader ({each} samples/s); the job: {rate(m.job_rate)} samples/s "
            f"where each rank reads its own part of the data ({lockstep}), but one rank's, "
            f"{rate(m.samples_per_s)}, where every rank reads every sample: not known from "
            "outside the loader (an IterableDataset may split by rank in __iter__)"
        )
    return [("ranks", f"{n} ranks loading at once, {said}")]
