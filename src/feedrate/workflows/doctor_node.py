"""The node's doctor: ``doctor`` called in every rank of a distributed job adds, to each rank's
own findings, those that only exist with several ranks (``checks.ranks``).

Each rank examines its own loader as in one process; then the ranks meet on a ``Channel``,
gather every rank's facts (its loader's settings and threads, and what its doctor measured: a
batch's bytes, its processes' memory), and every rank judges the same gathered facts, so every
rank's report holds the same node findings. A rank whose facts fail sends the failure
instead, and a rank that does not come (it does not call the doctor, or it died) fails the
others' node step within the wait: either way a ``check-failed`` finding, never a hang. Outside
a distributed job (or when no node finding is asked for) the report is returned untouched.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader

from feedrate.checks.ranks import node_findings
from feedrate.checks.tune import check_failed_finding
from feedrate.distributed import group
from feedrate.distributed.channel import JOIN_S, Channel, RankError, failed, failure
from feedrate.distributed.facts import rank_facts
from feedrate.distributed.group import Ranks
from feedrate.results.doctor import CheckRun, CheckStatus, Report
from feedrate.results.findings import Finding, by_severity
from feedrate.results.ranks import RankFacts
from feedrate.results.trial import Trial
from feedrate.workflows.doctor_steps import CHECKS

#: The finding ids judged from every rank's facts together.
NODE_CHECKS = frozenset(i for i, steps in CHECKS.items() if "node" in steps)
#: What the node step does, as findings name it.
NODE_STEP = "node's checks (every rank's facts, gathered)"
#: Seconds the gathering waits once every rank has come (the facts are read, not measured).
GATHER_S = 60.0
#: How many of a doctor's longest steps (a trial and a timeout) one rank may finish after
#: another: the ranks examine their loaders at their own pace, then wait for each other.
SKEW_STEPS = 20


def on_the_node(report: Report, loader: DataLoader[Any], wanted: set[str], step_s: float) -> Report:
    """``report`` (this rank's doctor's, of ``loader``) with the node's findings among its
    ``wanted`` ones, a ``node`` check, and ``ranks`` (the job's shape and each rank's facts).
    Collective in a distributed job: every rank calls it after its own checks; the first rank
    waits for the last at most ``SKEW_STEPS`` × ``step_s`` (s) beyond ``JOIN_S``."""
    if not group.active() or not wanted & NODE_CHECKS:
        return report
    began = time.monotonic()
    try:
        channel = Channel.open("feedrate.doctor", GATHER_S, join_s=JOIN_S + SKEW_STEPS * step_s)
    except RankError as exc:
        return _failed(report, str(exc), began)
    try:
        docs = channel.all_gather(_mine(report, loader, channel))
    except RankError as exc:
        return _failed(report, str(exc), began)
    finally:
        channel.close()
    lost = [why for why in map(failed, docs) if why is not None]
    facts = [RankFacts.from_dict(d) for d in docs if failed(d) is None]
    found = [f for f in node_findings(facts, report.machine) if f.id in wanted]
    if lost:
        found.append(check_failed_finding(NODE_STEP, "; ".join(lost)))
    report.findings = by_severity([*_among_ranks(report.findings, channel.ranks), *found])
    status: CheckStatus = "failed" if lost else "ok"
    report.checks.append(CheckRun("node", status, time.monotonic() - began, "; ".join(lost)))
    report.ranks = {**channel.ranks.to_dict(), "per_rank": [f.to_dict() for f in facts]}
    return report


def _among_ranks(findings: list[Finding], ranks: Ranks) -> list[Finding]:
    """A busy machine, said as what it was: the node's other ranks ran their own doctor beside
    this one, and their processes count among the "other processes"."""
    others = ranks.local_world - 1
    if others < 1:
        return findings
    said = (
        f" (this job's {others} other rank{'s' if others > 1 else ''} on this node examined "
        "their loaders at the same time and count among them)"
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
