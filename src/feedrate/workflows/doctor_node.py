"""The node's doctor: ``doctor`` called in every rank of a distributed job adds, to each rank's
own findings, those that only exist with several ranks (``checks.ranks``).

The ranks first meet on a ``Channel`` (``meet``); each examines its own loader as in one
process; then they gather every rank's facts (its loader's settings and threads, and what its
doctor measured: a batch's bytes, its processes' memory), and every rank judges the same
gathered facts, so every rank's report holds the same node findings. A rank whose facts fail
sends the failure instead; a rank that does not come (it does not call the doctor) fails the
others within ``JOIN_S``, and one that dies after meeting fails them at once (its
connections close): either way a ``check-failed`` finding, never a hang. Outside a distributed
job (or when nothing asked for depends on the ranks) the report is returned untouched.

Each rank judges worker counts within its share of the node (``distributed.node.share``, as
``tune`` decides them): the alternatives it measures and the count it advises are per rank,
so that every rank taking the advice does not oversubscribe the node ``local_world`` times.
What the node's findings sum over the ranks (memory, /dev/shm, threads, workers) is judged
against the whole node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader

from feedrate.checks.ranks import node_findings
from feedrate.checks.tune import check_failed_finding
from feedrate.distributed import group
from feedrate.distributed.channel import JOIN_S, Channel, RankError, failed, failure
from feedrate.distributed.facts import rank_facts
from feedrate.distributed.group import Ranks
from feedrate.distributed.node import of_node, share
from feedrate.machine.facts import MachineFacts
from feedrate.results.doctor import CheckRun, CheckStatus, Report
from feedrate.results.findings import Finding, by_severity
from feedrate.results.ranks import RankFacts
from feedrate.results.trial import Trial
from feedrate.workflows.doctor_steps import CHECKS

#: The finding ids judged from every rank's facts together.
NODE_CHECKS = frozenset(i for i, steps in CHECKS.items() if "node" in steps)
#: The finding ids that advise a worker count, judged within the rank's share of the node.
SHARE_CHECKS = frozenset({"too-few-workers", "too-many-workers", "bottleneck"})
#: The key of a rank's document that carries its pipeline's error (the doctor's own, if any).
RAISED = "pipeline_error"
#: What the node step does, as findings name it.
NODE_STEP = "node's checks (every rank's facts, gathered)"
#: Seconds the gathering waits once every rank has come (the facts are read, not measured).
GATHER_S = 60.0
#: How many of a doctor's longest steps (a trial and a timeout) one rank may finish after
#: another: the ranks meet, examine their loaders at their own pace, then wait for each other.
SKEW_STEPS = 20


class Node:
    """What ``node_step`` yields: the machine as a rank judges it, and the judging of its report
    on the node. Outside a job both leave the facts and the report as they are."""

    def __init__(self, met: Channel | RankError | None, wanted: set[str]) -> None:
        self.met, self.wanted = met, wanted
        self.ranks = met.ranks if isinstance(met, Channel) else None

    def machine(self, facts: MachineFacts) -> MachineFacts:
        """The node's facts, as this rank's ``facts`` tell them (all its ranks' CPUs where they
        are pinned apart): what the report shows and the node's findings are judged against."""
        return facts if self.ranks is None else of_node(facts, self.ranks.node_cpus)

    @property
    def local_ranks(self) -> int:
        """The ranks on this node (1 outside a job)."""
        return 1 if self.ranks is None else self.ranks.local_world

    def share(self, facts: MachineFacts) -> MachineFacts:
        """This rank's share of the node: the facts worker counts are tried and advised in."""
        if self.ranks is None:
            return facts
        return share(facts, self.ranks.local_world, self.ranks.node_cpus)

    def judged(self, report: Report, loader: DataLoader[Any], rank_cpus: int) -> Report:
        """``report`` judged on the node (``on_the_node``); its ``ranks`` say ``rank_cpus``, the
        CPUs this rank's worker counts were judged within."""
        report = on_the_node(report, loader, self.wanted, self.met)
        if report.ranks is not None:
            report.ranks["cpus_per_rank"] = rank_cpus
        return report


@contextlib.contextmanager
def node_step(wanted: set[str], step_s: float) -> Iterator[Node]:
    """The ranks met (``meet``) around a rank's own checks; the ``Node`` it yields tells the
    rank's share and judges the report on the node. Should the checks raise (Ctrl-C, a bug),
    the channel is closed: the others learn it at once."""
    met = meet(wanted, step_s)
    try:
        yield Node(met, wanted)
    except BaseException:
        if isinstance(met, Channel):
            met.close()
        raise


def meet(wanted: set[str], step_s: float) -> Channel | RankError | None:
    """Collective in a distributed job, before any rank examines its loader: the ranks' channel
    for the node step, or why they did not all come (a rank that does not call the doctor
    fails the others within ``JOIN_S``, not at the end of their examination). None outside a
    job, or when no finding that depends on the ranks (``NODE_CHECKS``, ``SHARE_CHECKS``) is
    wanted. Once met, a rank waits for the last to finish its own checks at most
    ``SKEW_STEPS`` × ``step_s`` + ``GATHER_S`` (s); a rank that dies meanwhile closes its
    connections, which fails the others' wait at once."""
    if not group.active() or not wanted & (NODE_CHECKS | SHARE_CHECKS):
        return None
    try:
        return Channel.open("feedrate.doctor", GATHER_S + SKEW_STEPS * step_s, join_s=JOIN_S)
    except RankError as exc:
        return exc


def on_the_node(
    report: Report, loader: DataLoader[Any], wanted: set[str], met: Channel | RankError | None
) -> Report:
    """``report`` (this rank's doctor's, of ``loader``) with the node's findings among its
    ``wanted`` ones, a ``node`` check, and ``ranks`` (the job's shape and each rank's facts).
    ``met``: what ``meet`` gave before the checks; collective (every rank calls it after its
    own checks) when that is a channel, which it closes."""
    if met is None:
        return report
    began = time.monotonic()
    if isinstance(met, RankError):
        return _failed(report, str(met), began)
    channel = met
    mine = {**_mine(report, loader, channel), RAISED: report.pipeline_error}
    try:
        docs = channel.all_gather(mine)
    except RankError as exc:
        return _failed(report, str(exc), began)
    finally:
        channel.close()
    errors = [d.pop(RAISED, None) if isinstance(d, dict) else None for d in docs]
    lost = [why for why in map(failed, docs) if why is not None]
    facts = [RankFacts.from_dict(d) for d in docs if failed(d) is None]
    found = [f for f in node_findings(facts, report.machine) if f.id in wanted]
    if lost:
        found.append(check_failed_finding(NODE_STEP, "; ".join(lost)))
    # Another rank's pipeline raised: every rank's report says which, and fails as that rank's.
    raised = [(r, e) for r, e in enumerate(errors) if e and r != channel.ranks.rank]
    for r, error in raised:
        found.append(check_failed_finding(f"examination on rank {r}", error))
    if raised and report.pipeline_error is None:
        report.pipeline_error = f"rank {raised[0][0]}: {raised[0][1]}"
    report.findings = by_severity([*_among_ranks(report.findings, channel.ranks), *found])
    status: CheckStatus = "failed" if lost else "ok"
    report.checks.append(CheckRun("node", status, time.monotonic() - began, "; ".join(lost)))
    report.ranks = {**channel.ranks.to_dict(), "per_rank": [f.to_dict() for f in facts]}
    return report


def _among_ranks(findings: list[Finding], ranks: Ranks) -> list[Finding]:
    """A busy machine, said as what it was: the node's other ranks ran their own doctor beside
    this one, and each trial's busy CPUs are read within this rank's share of the node
    (``alike_ranks_busy``): the "other processes" are this rank's part of those outside the
    job, the other ranks' own examinations not among them."""
    others = ranks.local_world - 1
    if others < 1:
        return findings
    said = (
        f" (this rank's part of the processes outside the job; this job's {others} other "
        f"rank{'s' if others > 1 else ''} on this node, examining their loaders at the same "
        "time, taken as loading alike and not counted)"
    )
    return [replace(f, message=f.message + said) if f.id == "busy-machine" else f for f in findings]


def _mine(report: Report, loader: DataLoader[Any], channel: Channel) -> dict[str, Any]:
    """This rank's facts as a document, or its failure as one."""
    try:
        return rank_facts(
            loader,
            channel.ranks,
            batch_bytes=batch_bytes(report),
            memory_bytes=memory_bytes(_yours(report)),
        ).to_dict()
    except Exception as exc:  # a bug here must not leave the other ranks waiting
        return failure(channel.ranks.rank, exc)


def _failed(report: Report, why: str, began: float) -> Report:
    report.findings = by_severity([*report.findings, check_failed_finding(NODE_STEP, why)])
    report.checks.append(CheckRun("node", "failed", time.monotonic() - began, why))
    return report


def _yours(report: Report) -> Trial | None:
    """The doctor's measurement of the loader's own settings, if it ran."""
    return next((t for t in report.trials if t.reason == "your settings" and t.measured), None)


def batch_bytes(report: Report) -> int | None:
    """A batch's bytes from the best evidence the doctor gathered (the measured run, the memory
    run, the batch made in the main process)."""
    yours, evidence = _yours(report), report.evidence
    run = evidence.get("memory_run") or {}
    return (
        (yours.batch_bytes if yours else None)
        or run.get("batch_bytes")
        or evidence.get("main_batch_bytes")
    )


def memory_bytes(trial: Trial | None) -> int | None:
    """The main process and its workers in ``trial`` (PSS, which shares shared pages out
    between the processes, else USS); None when the main process was not read."""
    if trial is None:
        return None
    main = trial.main_pss_bytes or trial.main_uss_bytes
    workers = trial.workers_pss_bytes or trial.workers_uss_bytes or 0
    return None if main is None else main + workers
