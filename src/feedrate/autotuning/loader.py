"""``feedrate.autotune(loader)``: a loader that tunes its own settings while training runs.

The training loop is the consumer: the time between two of its ``next()`` calls is its step,
the time ``next()`` waits is the data stall. ``AutoLoader`` tries configurations on stretches
of the epoch, keeps the cheapest that removes the stall, then only watches (two readings of
the clock a batch, ``OnlineTuner.wants_queued``), and tunes again when the stall comes back.
The decisions are ``search.tuner``'s (pure); this module runs lanes, clock and probes.

Correctness first, for a map-style dataset with automatic batching: autotune owns the epoch's
index stream. At each epoch it iterates the user's batch sampler once, as DataLoader would,
taking index batches as they are asked for, and hands runs of them to one DataLoader per
configuration (a "lane") through a batch sampler it controls. A lane being replaced is given
no further indices and drained in order while the next lane starts on the following indices:
every batch of the epoch is yielded once, in the sampler's order, worker start-up beside it.

An ``IterableDataset`` (or a loader without automatic batching) yields its own stream, which
cannot be split between loaders: there, settings change only between epochs, each epoch being
one trial. In a distributed job every rank iterates its own ``AutoLoader`` and they switch
together, at the same batches, from the figures of every rank (``autotuning.ranked``).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Generator, Iterator
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.autotuning import delegation
from feedrate.autotuning.lanes import Kept, Lane, Stream
from feedrate.autotuning.meeting import Meeting
from feedrate.autotuning.probing import TrialProbe
from feedrate.autotuning.ranked import Job, local_ranks
from feedrate.autotuning.start import save
from feedrate.distributed.channel import RankError
from feedrate.loader import libraries
from feedrate.loader.batches import batch_nbytes, epoch_length, sample_counter
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, is_iterable_style
from feedrate.machine.facts import MachineFacts
from feedrate.measuring import thread_safety
from feedrate.measuring.runqueue import Mark, Marks, Queued, busy, wait_and_step
from feedrate.results.autotune import AutotuneReport
from feedrate.search.actions import CheckThreads, Settle
from feedrate.search.space import Proposal
from feedrate.search.tuner import BUDGET_S, online


class AutoLoader(delegation.Surface, Meeting):
    """Iterate it as the DataLoader it wraps (see ``autotune``). It runs the lanes, reads the
    ``clock`` (s) around each ``next()``, watches the processes of each trial with a probe, and
    hands what it saw to the ``OnlineTuner``, which decides (the wait without the loop's
    run-queue time, ``queued``: ``measuring.runqueue``). ``coordinate``: in a distributed
    job, tune with the other ranks (None: when ``torch.distributed`` runs more than one rank
    at the first iteration; False: this process alone)."""

    def __init__(
        self,
        loader: DataLoader[Any],
        *,
        max_workers: int | None,
        allow_threads: bool,
        use_cache: bool,
        machine: MachineFacts | None,
        rate: float | None = None,
        budget_s: float = BUDGET_S,
        clock: Callable[[], float] = time.perf_counter,
        queued: Queued | None = None,
        coordinate: bool | None = None,
    ) -> None:
        self._user, self._clock, self._mark = loader, clock, Marks(clock, queued)
        self._split = not is_iterable_style(loader) and loader.batch_sampler is not None
        self._count = sample_counter(loader)
        self._machine, self._rate, self._budget_s = machine, rate, budget_s
        self._max_workers, self._threads = max_workers, allow_threads
        self._use_cache, self._coordinate = use_cache, coordinate
        self._job: Job | None = None  # the other ranks, from the first iteration
        self._joined = False
        self._switch_at: int | None = None  # the batch the ranks' next lane starts at
        self._tuner = self._tuner_of(self._starting(local_ranks()), counted=False)
        self._lane: Lane | None = None
        self._next: Lane | None = None  # started on the indices after the lane draining
        self._kept = Kept()  # a drained lane whose workers wait for a return
        self._moving: Proposal | None = None  # what the next lane is for
        self._probe, self._seed = TrialProbe(), 0
        #: A WebLoader's stages after its DataLoader, run on the tuned epochs (see autotune).
        self._pipeline: Callable[[], Iterator[Any]] | None = None
        self._resume: dict[str, Any] | None = None  # a state for the next lane (load_state_dict)
        self._plain: Any = loader  # what a second iterator iterates (the WebLoader, if any)
        self._epoch_in_use: Callable[[], delegation.Batches | None] = lambda: None
        self._loop_epoch: int | None = None  # an epoch's batches, where the loop leaves early
        self._left_at: int | None = None  # (the batch it left the last one at)
        weakref.finalize(self, self._probe.stop)  # unclosed, its thread would keep the workers

    # --- what a training loop uses (and delegation.Surface's) --------------------------------

    @property
    def config(self) -> LoaderConfig:
        """The settings in use now: the lane's that yields the batches (before the first and
        after ``close()``, those the next epoch starts with)."""
        return self._tuner.config if self._lane is None else self._lane.config

    def report(self) -> AutotuneReport:
        """What was tried and why, and the settings in use."""
        report = self._tuner.report
        report.trials = list(self._tuner.trials)
        return report

    def close(self, *, channel: bool = True) -> None:
        """End the worker processes now and, with other ranks, the channel to them (both end
        too when this object is collected). Iterating again meets the other ranks anew."""
        if channel and self._job is not None:
            self._job.close()
            self._job, self._joined = None, False
        self._probe.stop()
        for held in (self._lane, self._next, self._kept):  # each holds workers
            if held is not None:
                held.close()
        self._lane = self._next = self._moving = None
        self._tuner.stopped()

    def __iter__(self) -> Iterator[Any]:
        return delegation.Batches(self._begin)

    def _begin(self, batches: delegation.Batches) -> Iterator[Any]:
        live = self._epoch_in_use()
        if live is not None and live is not batches and live.tuning:  # a look mid-epoch, zip
            return iter(self._plain)  # with itself: an epoch of its own, from the loader untuned
        self._epoch_in_use = weakref.ref(batches)
        return self._iterate()

    def _iterate(self) -> Generator[Any, None, None]:
        try:
            yield from (self._epoch() if self._pipeline is None else self._pipeline())
        except BaseException as exc:
            if isinstance(exc, GeneratorExit):  # a break, or an error in the loop's body
                self._left()
            else:  # ours, or the stages' after a WebLoader's DataLoader: no worker left
                self.close(channel=False)
            if self._job is not None and not isinstance(exc, RankError):
                where = f"at batch {self._tuner.batch} of epoch {self._tuner.epoch}"
                self._job.stop(where, exc)  # the other ranks must not wait for this one
            if not self._joined:
                self.close()  # it failed while meeting: its channel goes, the next try meets anew
            raise

    def _left(self) -> None:
        """The loop left the epoch early: the lane in use keeps its workers, as DataLoader's
        persistent ones stay (a loop of fixed steps an epoch started them all again each epoch,
        and no trial ended). Alone, the epoch ends there (a trial may conclude); left twice at
        one batch, that is the loop's epoch, trials planned in it. A switch's lane ends."""
        if self._job is None:
            taken = self._tuner.batch
            self._loop_epoch, self._left_at = (taken if taken == self._left_at else None), taken
        if self._next is not None:
            self._next.close()
            self._tuner.stopped()
        elif self._job is None:
            self._epoch_end()
        self._probe.stop()
        self._next = self._moving = None

    def _length(self, length: int | None) -> int | None:
        """The epoch's length in batches as the loop takes it (``_left``), else ``length``."""
        loop = self._loop_epoch
        return length if loop is None else loop if length is None else min(length, loop)

    # --- one epoch -----------------------------------------------------------------------------

    def _epoch(self) -> Iterator[Any]:
        if not self._joined:
            self._join()
        yield from self._split_epoch() if self._split else self._whole_epoch()
        self._loop_epoch = self._left_at = None  # the loop took the whole epoch
        if self._lane is not None:  # the library's epoch count goes on in the next lane
            libraries.carry_state(self._lane.loader, self._user)

    def _split_epoch(self) -> Iterator[Any]:
        # As DataLoader does: iter(batch sampler), then a base seed from the loader's generator
        # (a persistent loader's first iterator only), then the sampler's draw as batches go.
        sampler_it = iter(self._user.batch_sampler)  # type: ignore[arg-type]
        user = self._user
        if self._tuner.epoch == 0 or not (user.persistent_workers and user.num_workers > 0):
            gen = user.generator
            self._seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
        stream = Stream(sampler_it, epoch_length(self._user))
        self._tuner.new_epoch(self._length(stream.length))
        lane = self._start_lane(stream)
        began = self._mark()
        while True:
            try:
                batch = next(lane.it)
            except StopIteration:
                if self._next is None:
                    break  # the epoch is done
                lane = self._take_next(lane, stream)
                began = self._mark()
                continue
            except Exception as exc:  # that batch's: raised in the loop, the epoch goes on
                batch = delegation.Raised(exc)
            got = self._mark()
            yield batch
            back = self._mark()
            self._observe(lane, batch, began, got, back)
            began = back  # this loader's own work until the next batch: the loop waits for it
            if (
                self._next is None
                and lane.feed is not None
                and (self._job is not None or stream.left())  # ranks: decided on batch counts
                and self._tuner.trial_done(back[0])
            ):
                self._next = self._switch_later(lane, stream)
                began = self._mark()  # a switch is no trial's
        self._epoch_end()

    def _whole_epoch(self) -> Iterator[Any]:
        self._tuner.new_epoch(self._length(None))
        lane = self._start_lane(None)
        began = self._mark()
        while True:
            try:
                batch = next(lane.it)
            except StopIteration:
                break
            except Exception as exc:  # as in _split_epoch
                batch = delegation.Raised(exc)
            got = self._mark()
            yield batch
            back = self._mark()
            self._observe(lane, batch, began, got, back)
            began = back
        self._epoch_end()

    def _start_lane(self, stream: Stream | None) -> Lane:
        cfg, lane = self._tuner.config, self._lane
        left = None if lane is None else lane.config  # what the last epoch ran
        if lane is None or lane.config != cfg:
            back, self._lane = self._kept.take(cfg), None
            self._kept.choose(lane, cfg, self._keep_rule)  # the lane left may be kept
            lane = self._lane = back
        fresh = lane is None
        lane = lane or self._new_lane(cfg)
        called = self._clock()
        # A job's first lane (the ranks just met) starts on all or none; later a rank may come
        # late to an epoch (rank 0's checkpoint): one that cannot start stops the job, all told.
        together = fresh and self._job is not None and left is None
        error: Exception | None = None
        try:
            self._begin_epoch(lane, stream, keep=together)
        except Exception as exc:
            if not fresh or (self._job is not None and not together):
                raise
            error = exc
        if together:  # all fall back if one rank's did not start
            error = self._job.all_started(lane, stream, error)  # type: ignore[union-attr]
        if error is not None:
            lane = self._fall_back(lane, stream, error, left)
        now = self._clock()
        self._tuner.lane_started(now, fresh, now - called)  # a trial starts again with the epoch
        self._follow(lane, now)
        return lane

    def _new_lane(self, cfg: LoaderConfig) -> Lane:
        seed = self._seed if self._split else None
        self._lane = Lane(self._user, cfg, self._split, seed, self._clock)
        return self._lane

    def _begin_epoch(self, lane: Lane, stream: Stream | None, keep: bool = False) -> None:
        delegation.resume(lane.loader, self._resume)  # kept until a lane started
        try:
            lane.start(stream, keep=keep)
        finally:
            self._hangs(lane)
        self._resume = None

    def _fall_back(
        self, lane: Lane, stream: Stream | None, error: Exception, left: LoaderConfig | None
    ) -> Lane:
        """A new lane's workers did not start (in a job, a first one on any rank): the last
        epoch's configuration (``left``; else the loader's own) takes the epoch."""
        back = left or online(config_of(self._user))
        lane.close()
        if back == lane.config:
            raise error
        first = left is None and not self._tuner.trials
        self._tuner.start_failed(str(error), self._clock(), back, first)
        lane = self._lane = self._kept.take(back) or self._new_lane(back)
        self._begin_epoch(lane, stream)
        return lane

    def _observe(self, lane: Lane, batch: Any, asked: Mark, got: Mark, back: Mark) -> None:
        """A batch asked for at ``asked``, got at ``got``; the loop asked again at ``back``. An
        error in its place (``Raised``) counts as a batch of no samples: a job's ranks count
        batches alike."""
        failed = isinstance(batch, delegation.Raised)
        size = batch_nbytes(batch) if self._tuner.wants_batch_bytes and not failed else None
        samples = 0 if failed else self._count(batch)
        wait, step = wait_and_step(asked, got, back, lane.config.num_workers > 0)
        self._tuner.observe(samples, wait, step, now := back[0], size, busy(asked, got))
        self._mark.exact = self._tuner.wants_queued
        if self._job is not None and self._tuner.watch_due is not None:
            self._job.watch(self._tuner, now)  # a watch stretch ends on every rank here
        self._follow(lane, now)

    def _epoch_end(self) -> None:
        trial = self._tuner.trial
        # Ranks' trials start at the same batch; if each measured enough, the call says.
        ranked = self._job is not None and trial is not None and trial.started
        if ranked or (self._job is None and trial is not None and trial.epoch_done()):
            proposal = self._decide()
            if proposal is not None:
                self._tuner.moved(*proposal, drain=False)  # it runs from the next epoch

    # --- trials ----------------------------------------------------------------------------------

    def _decide(self, taken: int | None = None) -> Proposal | None:
        """Conclude the trial in progress: the configuration to move to, or None to stay; runs
        the thread-safety check asked for, keeps what it settles on. With other ranks, from
        every rank's figures (``taken``: batches this rank's lanes took from the stream)."""
        now = self._clock()
        processes = self._probe.close(self._tuner.trial, now)
        if self._job is not None:
            action, figures = self._job.conclude(self._tuner, processes, now, taken)
            self._switch_at = figures.switch_at
        else:  # a repeat of the kept lane's configuration would start no worker
            self._tuner.kept = None if self._kept.lane is None else self._kept.lane.config
            action = self._tuner.conclude(now, processes)
        while isinstance(action, CheckThreads):
            run = partial(thread_safety.check, self._user.dataset, action.threads)
            checked = run() if self._job is None else self._job.thread_check(run)
            action = self._tuner.threads_checked(checked, self._clock())
        if action is None:
            return None  # not every rank measured enough: the trial goes on
        if isinstance(action, Settle):
            save(self._cache_key, action.config, action.stall)
            self._kept.only(action.config)  # no return to come (and none kept from here on)
            return None if action.config == self._tuner.config else (action.config, "settled")
        if action.config == self._tuner.config and self._lane is not None:  # on its lane
            self._tuner.again_here(action, now := self._clock())  # no new workers
            self._follow(self._lane, now)
            return None
        return action.config, action.why

    def _switch_later(self, lane: Lane, stream: Stream) -> Lane | None:
        """At a trial's end: the next lane (on the indices after this one's, drained first)."""
        if (proposal := self._decide(stream.taken)) is None:
            return None
        seed = self._seed + len(self._tuner.trials)
        make = partial(Lane, self._user, proposal[0], True, seed, self._clock)
        if self._job is not None:  # at the same batch on every rank
            nxt = self._job.switch(self._tuner, lane, stream, proposal, self._switch_at, make)
            if nxt is None:
                self._follow(lane, self._clock())
            else:
                self._moving = proposal
            return nxt
        nxt = self._kept.take(proposal[0]) or make()  # a return to a kept lane starts no worker
        self._kept.choose(None, proposal[0], self._keep_rule, draining=lane.config)
        lane.freeze()  # from here on the stream's batches are the next lane's
        nxt.begin(stream)  # its workers start while this lane drains
        self._tuner.moved(*proposal, drain=True)
        self._moving = proposal
        return nxt

    def _take_next(self, lane: Lane, stream: Stream) -> Lane:
        """The drained lane ends; the next one, started meanwhile, takes over, or where its
        workers did not start (on any rank of a job), the drained one goes on with the epoch."""
        nxt, proposal = self._next, self._moving
        assert nxt is not None and proposal is not None
        error = nxt.start_error() if self._job is None else self._job.take_over(nxt, stream)
        self._hangs(nxt)
        self._next = self._moving = None
        if error is not None:
            nxt.close()
            lane.restart(stream)
            self._tuner.move_failed(proposal, error, now := self._clock(), lane.config)
            self._follow(lane, now)
            return lane
        self._lane = nxt
        self._kept.choose(lane, nxt.config, self._keep_rule)  # or it ends
        self._tuner.switched(now := self._clock(), nxt.start_s)
        self._follow(nxt, now)
        return nxt

    def _keep_rule(self, alive: list[LoaderConfig], going: LoaderConfig) -> LoaderConfig | None:
        """``OnlineTuner.keep``; none in a job (every rank's workers share the node)."""
        return None if self._job is not None else self._tuner.keep(alive, going)

    def _hangs(self, lane: Lane) -> None:
        """Workers of ``lane`` that hung in their fork (started again) go in the report."""
        if lane.starts.hung:
            self._tuner.started_again(lane.config, lane.starts.hung)
            lane.starts.hung = []

    def _follow(self, lane: Lane, now: float) -> None:
        self._probe.follow(self._tuner.trial, lane.it, now)
