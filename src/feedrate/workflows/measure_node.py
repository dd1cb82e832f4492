"""``feedrate measure`` in every rank of a distributed job: one configuration measured with
every rank loading at once, each on its own shard, read as the job's figure.

As a coordinated tune's trials (``tune_node``): the ranks meet on a ``Channel``, each measures
the same configuration, its windows opening once every rank is warm (``Channel.gate``), and
the figures are gathered and read as the slowest rank's (``search.ranks.slowest``: training
steps in lockstep). Every rank returns the same measurement; a rank whose pipeline fails sends
the failure, which every rank raises naming it; a rank that stops answering fails the others
within the channel's timeout. Outside a job it is ``measure`` itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

from feedrate.distributed import group
from feedrate.distributed.channel import Channel, RankError, failure
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.measuring.measure import LoaderSource, measure
from feedrate.measuring.timing import DEFAULT_SECONDS
from feedrate.results.measurement import Measurement
from feedrate.workflows import tune_node


def measure_job(
    source: LoaderSource,
    config: LoaderConfig | None = None,
    *,
    shard: bool = False,
    coordinate: bool | None = None,
    timeout_s: float | None = 60.0,
    seconds: float | None = None,
    **kwargs: Any,
) -> Measurement:
    """``measure(source, config, ...)`` on every rank at once (collective: every rank calls it
    at the same point), each on its own shard (its ``DistributedSampler``, or one made for the
    measurement with ``shard``); the slowest rank's figures, with every rank's rate
    (``rank_rates``). ``coordinate=False``, or no job: this process alone."""
    if coordinate is False or not group.active():
        return measure(source, config, timeout_s=timeout_s, seconds=seconds, **kwargs)
    # The longest a rank may wait for the last: its start-up and steady state, twice over.
    longest = 120.0 + 3 * (timeout_s or 60.0) + 4 * (seconds or DEFAULT_SECONDS)
    channel = Channel.open("feedrate.measure", longest)
    try:
        ranks, gate = channel.ranks, channel.gate()
        try:
            if shard:
                source = tune_node.shard_source(source, ranks)
            mine: Any = measure(
                source, config, timeout_s=timeout_s, seconds=seconds, steady=gate, **kwargs
            ).to_dict()
        except PipelineError as exc:  # the others raise it too, naming this rank
            mine = {**failure(ranks.rank, exc), "kind": type(exc).__name__}
        except Exception as exc:  # not the pipeline's (a bad argument): tell them, then stop
            gate.arrive()
            with contextlib.suppress(RankError):
                channel.all_gather(failure(ranks.rank, exc))
            raise
        finally:
            gate.arrive()  # a rank that failed before its windows: the others go on
        result = tune_node.gathered(channel, mine)
    finally:
        channel.close()
    return result
