"""``autotune`` in every rank of a distributed job: the ranks switch settings together.

Every rank runs its own ``AutoLoader`` and ``OnlineTuner`` on its own shard, and the tuners
stay identical: they start from rank 0's starting point (settings and search space, sent once
when the ranks first iterate), their trials end on batch counts alone (``counted``), and at
each decision every rank makes one collective call (``Job.conclude``: every rank's figures for
the trial, in rank order) and feeds the same reduced figures (``search.job_trial``) to its own
tuner, which therefore takes the same decision at the same batch on every rank. Ranks that step
in lockstep (training's own all-reduce) reach that call together, so none waits for another
outside it. A switch starts the next lane at the same batch on every rank (the first past
every batch any rank's lane already took), and a lane that cannot start on one rank is given up
on all (``Job.started``, a second call only when moving; the first lane, right after the ranks
met, makes the same call, and every rank falls back alike: ``Job.all_started``).
Once settled, a watch stretch of a known number of batches ends with one call (``Job.watch``);
between them, no call at all.

Every call waits ``TIMEOUT_S`` at most, and a rank's own failure is sent instead of its figures,
so the others stop with a ``RankError`` naming it. A rank that stops iterating mid-epoch (an
error in its loop, a break, Ctrl-C) says so on its way out (``Job.stop``, bounded by
``STOP_S``): the others learn it at their next call; ranks that all stop at the same batch
carry on together.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from feedrate.autotuning.lanes import Lane, Stream
from feedrate.distributed import group
from feedrate.distributed.channel import (
    Channel,
    Pending,
    RankError,
    described,
    failed,
    failure,
)
from feedrate.results.evidence import ThreadCheck
from feedrate.results.processes import ProbeReport
from feedrate.search.actions import Action
from feedrate.search.job_trial import JobFigures, job_figures, job_stall, rank_figures
from feedrate.search.space import Proposal
from feedrate.search.tuner import OnlineTuner

#: How long a rank waits for the others at one of autotune's calls (s): they come at the same
#: batch, so this covers a rank's lag (a step, a lane's start, the thread-safety check).
TIMEOUT_S = 120.0

#: How long a rank that stops iterating waits for the others to hear it (s) before it goes on.
STOP_S = 3.0

#: Batches a trial must have measured on every rank to be concluded at an epoch's end.
LEAST_MEASURED = 4


class Job:
    """autotune's calls between the ranks of a job, on its own ``channel``."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.rank = channel.ranks.rank
        #: Why the ranks are out of step (a rank stopped alone); the next call fails with it.
        self.broken: str | None = None
        #: A stop still being heard (its gather under way, where this rank stopped).
        self._stopping: tuple[Pending, str] | None = None

    @classmethod
    def open(cls) -> Job:
        """Collective: every rank calls it when it first iterates."""
        return cls(Channel.open("feedrate.autotune", TIMEOUT_S))

    @property
    def main(self) -> bool:
        return self.channel.ranks.main

    def gather(self, mine: Any) -> list[Any]:
        """Every rank's ``mine``, in rank order; ``RankError`` naming the first rank that
        failed or stopped."""
        self._heard()
        if self.broken is not None:
            raise RankError(self.broken)
        docs = self.channel.all_gather(mine)
        for doc in docs:
            why = failed(doc)
            if why is not None:
                self.broken = f"{why} (rank {self.rank} stops too, in feedrate.autotune)"
                raise RankError(self.broken)
        return docs

    def failing(self, exc: BaseException) -> None:
        """This rank's part of a call failed with ``exc``: the others are told instead (they
        raise ``RankError`` naming it); the caller raises ``exc``."""
        if self.broken is None:
            self.broken = f"rank {self.rank} failed: {exc}"
            with contextlib.suppress(RankError):  # a rank gone already: the launcher ends them
                self.channel.all_gather(failure(self.rank, exc))

    def first(self, mine: Any) -> Any:
        """Rank 0's ``mine`` on every rank (an all-gather, so that it matches any other call a
        rank makes at that point, a stop included)."""
        return self.gather(mine if self.main else None)[0]

    def conclude(
        self, tuner: OnlineTuner, processes: ProbeReport | None, now: float, taken: int | None
    ) -> tuple[Action | None, JobFigures]:
        """The trial in progress, concluded from every rank's figures (``taken``: the batches
        this rank's lanes took from the epoch's stream). The action is None when some rank
        measured too little (at an epoch's end): the trial goes on."""
        trial = tuner.trial
        assert trial is not None
        try:
            enough = trial.measured >= LEAST_MEASURED
            mine = rank_figures(
                trial.result(tuner.rate, processes) if enough else None,
                spent_s=tuner.round_spent_s(now),
                batch_s=trial.seconds_per_batch(),
                taken=taken,
            )
        except Exception as exc:
            self.failing(exc)
            raise
        figures = job_figures(self.gather(mine), self.channel.ranks.node_of)
        if figures.trial is None:
            return None, figures
        return tuner.conclude_job(figures.trial, figures.spent_s, figures.batch_s), figures

    def thread_check(self, run: Callable[[], ThreadCheck]) -> ThreadCheck:
        """Rank 0's verdict of the thread-safety check (``run``), on every rank."""
        try:
            mine = run().to_dict() if self.main else None
        except Exception as exc:
            self.failing(exc)
            raise
        return ThreadCheck.from_dict(self.first(mine))

    def started(self, error: str | None) -> str | None:
        """Whether the next lane started on every rank (``error``: why it did not here): the
        first rank's failure, named, or None."""
        docs = self.gather({"error": error})
        return next((f"rank {r}: {d['error']}" for r, d in enumerate(docs) if d["error"]), None)

    def all_started(
        self, lane: Lane, stream: Stream | None, error: Exception | None
    ) -> Exception | None:
        """Whether the first lane started on every rank (``error``: why not here; it was
        started keeping what it took): None, or the first rank's failure, named alike on every
        rank. A lane that started here while another's did not gives its batches back."""
        failed_on = self.started(None if error is None else str(error))
        feed = lane.feed
        if error is None and stream is not None and feed is not None and feed.kept is not None:
            if failed_on is None:
                lane.stays()
            else:
                lane.give_back(stream)
        elif feed is not None:
            feed.kept = None  # a failed start put its batches back itself
        return None if failed_on is None else RankError(failed_on)

    def switch(
        self,
        tuner: OnlineTuner,
        lane: Lane,
        stream: Stream,
        proposal: Proposal,
        at: int | None,
        make: Callable[[], Lane],
    ) -> Lane | None:
        """The next lane (``make()``), starting on every rank at batch ``at`` of the epoch
        while the lane in use is given the batches before it and drained (``take_over`` then
        says whether it started on every rank), or None: the epoch has no batch left for it
        (it runs from the next epoch)."""
        length = stream.length
        if at is None or (length is not None and at >= length):
            tuner.moved(*proposal, drain=False)
            return None
        tail = [stream.take() for _ in range(at - stream.taken)]
        lane.freeze([b for b in tail if b is not None])
        nxt = make()
        nxt.begin(stream, keep=True)
        tuner.moved(*proposal, drain=True)
        return nxt

    def take_over(self, nxt: Lane, stream: Stream) -> str | None:
        """Once the lane in use drained (batch ``at``, so at the same batch on every rank):
        whether ``nxt`` started on every rank. None, or the first rank's failure, named; then
        none takes over (the batches ``nxt`` took are back in ``stream``; close it)."""
        error = nxt.start_error()
        try:
            failed_on = self.started(error)
        except BaseException:
            nxt.close()
            raise
        if failed_on is None:
            nxt.stays()
        elif error is None:
            nxt.give_back(stream)
        return failed_on

    def watch(self, tuner: OnlineTuner, now: float) -> None:
        """A watch stretch ended on every rank: the job's stall goes to the tuner."""
        stall = tuner.watch_due
        assert stall is not None
        docs = self.gather({"stall": stall})
        tuner.watched(job_stall([float(d["stall"]) for d in docs]), now)

    def same_length(self, length: int | None) -> None:
        """``RankError`` unless every rank's epoch has the same number of batches (where
        known): trials end on batch counts, which every rank must reach."""
        lengths = self.gather({"length": length})
        known = {d["length"] for d in lengths if d["length"] is not None}
        if len(known) > 1:
            each = ", ".join(f"rank {r}: {d['length']}" for r, d in enumerate(lengths))
            self.broken = (
                f"the ranks' epochs differ in length ({each} batches): give every rank "
                "the same number of batches (DistributedSampler does)"
            )
            raise RankError(self.broken)

    def stop(self, where: str, exc: BaseException) -> None:
        """This rank stops iterating ``where`` (``exc``: how; GeneratorExit for a break or an
        error in the loop's body): the others are told, if they are listening within
        ``STOP_S``. Ranks that all stop at the same point stay in step; otherwise the job's
        calls fail from here on."""
        self._heard()
        if self.broken is not None or not (dist.is_available() and dist.is_initialized()):
            return
        loop = isinstance(exc, GeneratorExit)
        how = "a break or an error in the loop" if loop else described(exc)
        doc = failure(self.rank, RuntimeError(f"stopped iterating {where} ({how})"))
        doc["stopped"] = where
        try:  # run by gloo's threads: this rank goes on (to end, most often) after STOP_S
            self._stopping = (self.channel.gather_started(doc), where)
        except RankError:
            return
        self._heard(STOP_S)

    def _heard(self, within: float = TIMEOUT_S) -> None:
        """The answer to this rank's stop, waited for ``within`` s (by the next call, the rest
        of ``TIMEOUT_S``): ranks that all stopped at the same point stay in step; otherwise the
        job's calls fail from here."""
        if self._stopping is None:
            return
        pending, where = self._stopping
        try:
            if not pending.wait(within) and within < TIMEOUT_S:
                return  # still under way: the next call hears it first
        except RankError:
            pass
        self._stopping = None
        if pending.result is None:
            self.broken = f"rank {self.rank} stopped iterating {where}; the others did not answer"
            return
        going = [
            r
            for r, d in enumerate(pending.result)
            if not (isinstance(d, dict) and d.get("stopped") == where)
        ]
        if going:
            self.broken = (
                f"rank {self.rank} stopped iterating {where} while rank {going[0]} went on"
            )

    def close(self) -> None:
        """The channel closed (twice is once): a stop still being sent is given ``STOP_S``.
        Still sent after that (the others are in the job's own calls, a DDP all-reduce that
        waits for this rank), its group is left to the process: gloo's threads run the
        collective, and destroying the group under it would end the process with an abort."""
        if self._stopping is not None:
            pending, self._stopping = self._stopping[0], None
            with contextlib.suppress(RankError):
                if not pending.wait(STOP_S):
                    self.channel.drop()
                    return
        self.channel.close()


def local_ranks() -> int:
    """The ranks sharing this node as the launcher says (torchrun's ``LOCAL_WORLD_SIZE``) in a
    job already distributed, else 1; corrected when the ranks first iterate."""
    if not group.active():
        return 1
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
