"""``feedrate measure`` in every rank of a distributed job: one configuration measured with
every rank loading at once, read as the job's figure and judged as the node's.

As a coordinated tune's trials (``tune_node``): the ranks meet on a ``Channel``, each measures
the same configuration, its windows opening once every rank is warm (``Channel.gate``), and
the figures are gathered and read as the slowest rank's (``search.ranks.slowest``: training
steps in lockstep). Every rank returns the same measurement; a rank whose pipeline fails sends
the failure, which every rank raises naming it; a rank that stops answering fails the others
within the channel's timeout. Outside a job it is ``measure`` itself.

Then, as tune and the doctor do, every rank's facts with the settings measured are gathered and
the findings of the ranks together (``checks.ranks``) become the measurement's notes: a loader
without a ``DistributedSampler`` has every rank read every sample (``no-distributed-sampler``),
so the job's rate is one rank's, not their sum; and the workers of all the node's ranks are
judged against its CPUs, not one rank's against the CPUs as if it were alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from feedrate.checks.ranks import node_findings
from feedrate.distributed import group
from feedrate.distributed.channel import Channel, RankError, failed, failure
from feedrate.distributed.facts import rank_facts
from feedrate.distributed.group import Ranks
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import loader_of
from feedrate.measuring.measure import LoaderSource, measure, over_cpus_note
from feedrate.measuring.timing import DEFAULT_SECONDS
from feedrate.results.findings import Finding
from feedrate.results.measurement import Measurement
from feedrate.results.ranks import RankFacts
from feedrate.results.trial import Trial
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
    at the same point), each on its own loader: its shard where it has a
    ``DistributedSampler`` (or one made for the measurement with ``shard``), else the whole
    dataset. The slowest rank's figures, with every rank's rate (``rank_rates``), whether the
    ranks read distinct samples (``sharded``) and the node's findings as notes (``judged``).
    ``coordinate=False``, or no job: this process alone."""
    if coordinate is False or not group.active():
        return measure(source, config, timeout_s=timeout_s, seconds=seconds, **kwargs)
    # The longest a rank may wait for the last: its start-up and steady state, twice over.
    longest = 120.0 + 3 * (timeout_s or 60.0) + 4 * (seconds or DEFAULT_SECONDS)
    channel = Channel.open("feedrate.measure", longest)
    try:
        ranks, gate = channel.ranks, channel.gate()
        own: Measurement | None = None
        try:
            if shard:
                source = tune_node.shard_source(source, ranks)
            own = measure(
                source, config, timeout_s=timeout_s, seconds=seconds, steady=gate, **kwargs
            )
            mine: Any = own.to_dict()
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
        assert own is not None  # a rank that failed, this one included: gathered raised
        docs = channel.all_gather(facts_here(source, ranks, own))
        facts = [RankFacts.from_dict(d) for d in docs if failed(d) is None]
    finally:
        channel.close()
    return judged(result, facts, ranks.world)


def facts_here(source: LoaderSource, ranks: Ranks, own: Measurement) -> dict[str, Any]:
    """This rank's facts (``distributed.facts``) with the settings it measured and the sizes
    its measurement saw, as a document; or the failure to read them as one."""
    try:
        return rank_facts(
            loader_of(source),
            ranks,
            batch_bytes=own.batch_bytes,
            memory_bytes=Trial.of(own, "measured").memory_bytes or None,
            config=own.config,
        ).to_dict()
    except Exception as exc:  # the measurement stands without this rank's facts
        return failure(ranks.rank, exc)


def judged(m: Measurement, facts: list[RankFacts], world: int) -> Measurement:
    """``m``, the job's figures, with the findings of the ranks together (``node_findings``,
    judged against the slowest rank's machine, the same on every rank) first among its notes.
    The node's judgement of the workers of all its ranks against its CPUs takes the place of
    one process's note on them. ``sharded``: False where ``no-distributed-sampler`` says every
    rank read every sample; True where every rank's facts say each read only its part."""
    if len(facts) < 2:  # no rank's facts, or one: nothing to judge the node on
        return m
    found = node_findings(facts, m.machine)
    alone = over_cpus_note(m.config.num_workers, int(m.machine.get("cpus_usable") or 0))
    notes = [finding_note(f) for f in found] + [n for n in m.notes if n != alone]
    sharded: bool | None = None
    if any(f.id == "no-distributed-sampler" for f in found):
        sharded = False
    elif len(facts) == world and all(r.sharded for r in facts if r.loads):
        sharded = True
    return replace(m, notes=notes, sharded=sharded)


def finding_note(f: Finding) -> str:
    """A finding as a measurement's note: its id (``feedrate explain ID``), the evidence and
    the fix."""
    return f"{f.id}: {f.message}; fix: {f.fix}"
