"""``tune`` in every rank of a distributed job: the node is the unit of tuning.

Rank 0 runs the search (``NodeSearch``); before each trial it sends the configuration and
the trial's limits, every rank measures it at the same time on its own shard (so the
contention between the node's ranks is real), and the figures come back to rank 0, which
reads them as the slowest rank's (``search.ranks.slowest``: training steps in lockstep). The
other ranks only measure what they are sent (``follow``) and end with rank 0's result, so every
rank returns the same answer. After the search every rank runs the dataset checks on its own
loader at the same time (``checked``): a trap on one rank's shard is found, and said as that
rank's. A rank whose pipeline fails sends the failure in place of its
figures; a rank that stops answering fails the others within the channel's timeout.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from feedrate.checks.ranks import node_findings
from feedrate.checks.tune import check_failed_finding
from feedrate.distributed import group
from feedrate.distributed.channel import FAILED, Channel, RankError, failed, failure
from feedrate.distributed.facts import rank_facts
from feedrate.distributed.group import Ranks
from feedrate.errors import PipelineError, PipelineTimeoutError, UserError, WorkerKilledError
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import loader_of
from feedrate.loader.shards import sharded
from feedrate.machine.facts import MachineFacts
from feedrate.results.findings import Finding, by_severity, over_ranks
from feedrate.results.measurement import Measurement
from feedrate.results.ranks import RankFacts
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.search.ranks import slowest
from feedrate.workflows.tune_search import TrialLimits, TuneSearch

#: The pipeline errors a rank can send back, by name, raised again on rank 0 as themselves.
PIPELINE_ERRORS: dict[str, type[PipelineError]] = {
    e.__name__: e for e in (PipelineError, PipelineTimeoutError, WorkerKilledError)
}


class NodeSearch(TuneSearch):
    """The search on rank 0, each trial measured by every rank at once (see module doc)."""

    def __init__(self, *args: Any, channel: Channel, node: MachineFacts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channel, self.node = channel, node

    def finish(self, baseline: Trial) -> TuneResult:
        """The result, saying it was tuned over the job's ranks: their shape, the node's whole
        machine (the search decided within one rank's share of it), and the findings that
        only exist with several ranks, on your settings (``checks.ranks``)."""
        result = super().finish(baseline)
        ranks = self.channel.ranks
        result.ranks = ranks.to_dict()
        result.machine = self.node.to_dict()
        found = node_findings(self.node_facts(result.baseline), result.machine)
        if result.best.config.num_workers * ranks.local_world > (self.node.cpus_usable or 0):
            # More workers than CPUs measured to pay here (they mostly wait): not a warning.
            found = [f for f in found if f.id != "node-worker-oversubscription"]
        result.findings = by_severity([*result.findings, *found])
        return result

    def measure_trial(self, config: LoaderConfig, limits: TrialLimits) -> Measurement:
        self.channel.broadcast(
            {"do": "measure", "config": config.to_dict(), "limits": limits.__dict__}
        )
        return gathered(self.channel, measured_here(self, self.channel, config, limits))

    def node_facts(self, baseline: Trial) -> list[RankFacts]:
        """Every rank's facts with your settings (``distributed.facts``), with the sizes your
        settings' trial measured, for the node's checks. A rank whose facts fail is left out."""
        sizes = {"batch_bytes": baseline.batch_bytes, "memory_bytes": baseline.memory_bytes}
        self.channel.broadcast({"do": "facts", **sizes})
        docs = self.channel.all_gather(facts_here(self, self.channel.ranks, sizes))
        return [RankFacts.from_dict(d) for d in docs if failed(d) is None]


def measured_here(
    search: TuneSearch, channel: Channel, config: LoaderConfig, limits: TrialLimits
) -> Any:
    """This rank's measurement as a document, or the failure of its pipeline as one. Its
    windows open once every rank is warm (``Channel.gate``): each rank then times the others'
    steady state, not their workers' start-up, as in training, where they start once."""
    gate = search.steady = channel.gate()
    try:
        return TuneSearch.measure_trial(search, config, limits).to_dict()
    except PipelineError as exc:
        doc = failure(channel.ranks.rank, exc)
        doc["kind"] = type(exc).__name__
        return doc
    finally:
        search.steady = None
        gate.arrive()  # a rank that failed before it asked: the others are not held back


def facts_here(search: TuneSearch, ranks: Ranks, sizes: dict[str, Any]) -> dict[str, Any]:
    try:
        return rank_facts(search.loader, ranks, **sizes).to_dict()
    except Exception as exc:  # the node's checks go on without this rank's facts
        return failure(ranks.rank, exc)


def gathered(channel: Channel, mine: Any) -> Measurement:
    """Every rank's figures for one trial, read as the slowest rank's. A rank's pipeline
    failure fails the trial as that error, naming the rank."""
    docs = channel.all_gather(mine)
    for doc in docs:
        why = failed(doc)
        if why is not None:
            kind = PIPELINE_ERRORS.get(str(doc.get("kind")))
            if kind is None:
                raise RankError(why)
            raise kind(why)
    return slowest([Measurement.from_dict(d) for d in docs], channel.ranks.node_of)


def lead(channel: Channel, run: Callable[[], TuneResult]) -> TuneResult:
    """Rank 0: ``run()`` (the search, or the cache), then its result to every rank; on any
    failure, the others are told to stop before it is raised here."""
    try:
        result = run()
    except Exception as exc:  # an interrupt reaches every rank itself: no message then
        with contextlib.suppress(RankError):  # a rank gone already: the launcher ends the rest
            channel.broadcast({"do": "stop", **failure(0, exc)})
        raise
    channel.broadcast({"do": "done", "result": result.to_dict()})
    return result


def follow(channel: Channel, search: TuneSearch, checks: Checks) -> TuneResult:
    """A rank other than 0: measure each configuration rank 0 sends, and run the checks on its
    own loader when told, until its result comes (returned) or it says it stopped
    (``RankError`` naming why)."""
    while True:
        message = channel.broadcast()
        if not isinstance(message, dict):
            raise RankError(f"rank {channel.ranks.rank} got no instruction from rank 0")
        if message.get("do") == "measure":
            config = LoaderConfig.from_dict(message["config"])
            limits = TrialLimits(**message["limits"])
            try:
                mine = measured_here(search, channel, config, limits)
            except Exception as exc:  # not the pipeline's: tell rank 0, then stop here
                channel.all_gather(failure(channel.ranks.rank, exc))
                raise
            channel.all_gather(mine)
        elif message.get("do") == "checks":
            result = TuneResult.from_dict(message["result"])
            channel.all_gather(checks_here(checks, result, channel.ranks.rank))
        elif message.get("do") == "facts":
            sizes = {k: message.get(k) for k in ("batch_bytes", "memory_bytes")}
            channel.all_gather(facts_here(search, channel.ranks, sizes))
        elif message.get("do") == "done":
            return TuneResult.from_dict(message["result"])
        else:
            why = message.get(FAILED)  # rank 0's error: may be about this rank itself
            raise RankError("rank 0 stopped the tune" + (f": {why}" if why else ""))


#: The dataset checks of one rank's loader for a searched result (``workflows.tune``'s).
Checks = Callable[[TuneResult], list[Finding]]


def checked(channel: Channel, checks: Checks, result: TuneResult) -> list[Finding]:
    """Rank 0, after the search: ``checks`` run by every rank on its own loader at once, their
    findings merged (``results.findings.over_ranks``). A rank whose checks failed adds a
    ``check-failed`` finding naming it."""
    channel.broadcast({"do": "checks", "result": result.to_dict()})
    docs = channel.all_gather(checks_here(checks, result, 0))
    lost = [why for why in map(failed, docs) if why is not None]
    per_rank = [[Finding.from_dict(f) for f in d] for d in docs if failed(d) is None]
    found = over_ranks(per_rank)
    if lost:
        found.append(check_failed_finding("dataset checks on the job's ranks", "; ".join(lost)))
    return found


def checks_here(checks: Checks, result: TuneResult, rank: int) -> Any:
    """This rank's findings as documents, or the failure of its checks as one."""
    try:
        return [f.to_dict() for f in checks(result)]
    except Exception as exc:  # a bug here must not leave rank 0 waiting
        return failure(rank, exc)


def channel(coordinate: bool | None, budget_s: float, timeout_s: float) -> Channel | None:
    """The ranks' channel for one coordinated tune, or None to tune this process alone (not a
    distributed job, or ``coordinate=False``). Collective. Its timeout covers the longest
    silence a rank can see: a whole budget of trials, then the checks after the search."""
    if coordinate is False:
        return None
    if not group.active():
        if group.launched():  # each rank would tune alone, as if the machine were its own
            raise UserError(
                f"this process is rank {os.environ.get('RANK')} of "
                f"{os.environ.get('WORLD_SIZE')} (started by a launcher) but torch.distributed "
                "is not initialized: call torch.distributed.init_process_group() in every rank "
                "before feedrate.tune() to tune with every rank loading at once, or pass "
                "coordinate=False to tune this rank alone"
            )
        if coordinate:
            raise UserError(
                "coordinate=True needs torch.distributed initialized with more than one rank"
            )
        return None
    return Channel.open("feedrate.tune", budget_s + 3 * timeout_s + 120.0)


def shard_source(source: Any, ranks: Ranks) -> Callable[[], DataLoader[Any]]:
    """What each trial measures, read from this rank's shard (``loader.shards.sharded``)."""
    first = sharded(loader_of(source), ranks.rank, ranks.world)  # refused here, before a trial

    def build() -> DataLoader[Any]:
        if callable(source) and not isinstance(source, DataLoader):
            return sharded(loader_of(source), ranks.rank, ranks.world)
        return first

    return build


def coordinated(
    channel: Channel, searched: Callable[[], TuneResult], run: TuneSearch, checks: Checks
) -> TuneResult:
    """Rank 0 leads ``searched()``; the others follow ``run``'s trials and ``checks``. Every
    rank returns rank 0's result; the channel is closed either way."""
    try:
        if channel.ranks.main:
            return lead(channel, searched)
        return follow(channel, run, checks)
    finally:
        channel.close()
