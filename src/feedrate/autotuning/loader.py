"""``feedrate.autotune(loader)``: a loader that tunes its own settings while training runs.

The training loop is the consumer: the time between two of its ``next()`` calls is its step,
the time ``next()`` waits is the data stall. ``AutoLoader`` tries configurations on consecutive
stretches of the epoch, keeps the cheapest one that removes the stall, then only watches: two
clock readings per batch. When the stall comes back (steps got faster after warm-up or
compilation), it tunes again from where it is. The decisions are ``search.tuner``'s (pure, fed
the clock readings); this module runs the lanes, reads the clock and probes the processes.

Correctness first, for a map-style dataset with automatic batching: autotune owns the epoch's
index stream. At each epoch it iterates the user's batch sampler once, as DataLoader would,
taking index batches as they are asked for (never the whole epoch ahead), and hands consecutive
runs of them to one DataLoader per configuration (a "lane") through a batch sampler it
controls. A lane being replaced is given no further indices and drained in order while the next
lane starts on the following indices, so every batch of the epoch is yielded exactly once, in
the sampler's order, while worker start-up overlaps the drain.

An ``IterableDataset`` (or a loader without automatic batching) yields its own stream, which
cannot be split between loaders: there, settings change only between epochs, each epoch being
one trial.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.autotuning import delegation
from feedrate.autotuning.lanes import Lane, Stream
from feedrate.autotuning.start import save, starting_point
from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.loader.batches import batch_nbytes, epoch_length, sample_counter
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import is_iterable_style
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import thread_safety
from feedrate.measuring.measure import warmup_batches
from feedrate.measuring.processes import ProcessProbe
from feedrate.results.autotune import AutotuneReport
from feedrate.results.processes import ProbeReport
from feedrate.search.online_trial import TrialTiming
from feedrate.search.space import Proposal
from feedrate.search.tuner import BUDGET_S, CheckThreads, OnlineTuner, Settle


class AutoLoader:
    """Iterate it as the DataLoader it wraps (see ``autotune``). It runs the lanes, reads the
    ``clock`` (s) around each ``next()``, watches the processes of each trial with a probe, and
    hands what it saw to the ``OnlineTuner``, which decides."""

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
    ) -> None:
        self._user = loader
        self._clock = clock
        self._split = not is_iterable_style(loader) and loader.batch_sampler is not None
        self._count = sample_counter(loader)
        start = starting_point(
            loader,
            machine or collect(),
            max_workers=max_workers,
            allow_threads=allow_threads,
            use_cache=use_cache,
            split=self._split,
        )
        self._cache_key = start.cache_key
        self._tuner = OnlineTuner(
            start.space,
            start.config,
            start.started_from,
            settled=start.settled,
            settled_stall=start.stall,
            warmup=warmup_batches,
            rate=rate,
            budget_s=budget_s,
        )
        self._lane: Lane | None = None
        self._next: Lane | None = None  # started on the indices after the lane draining
        self._probe: ProcessProbe | None = None
        self._probed: TrialTiming | None = None  # the trial the probe watches
        self._window = False  # the probe's window is open
        self._seed = 0
        #: A WebLoader's stages after its DataLoader, run on the tuned epochs (see autotune).
        self._pipeline: Callable[[], Iterator[Any]] | None = None
        self._resume: dict[str, Any] | None = None  # a state for the next lane (load_state_dict)

    # --- what a training loop uses -------------------------------------------------------------

    @property
    def dataset(self) -> Any:
        return self._user.dataset

    @property
    def batch_size(self) -> int | None:
        return self._user.batch_size

    @property
    def sampler(self) -> Any:
        return self._user.sampler

    @property
    def config(self) -> LoaderConfig:
        """The settings in use now."""
        return self._tuner.config

    def __len__(self) -> int:
        return len(self._user)

    def set_epoch(self, epoch: int) -> None:
        """Passed to the sampler (e.g. ``DistributedSampler``) or a batch sampler's sampler,
        and to a dataset with a ``set_epoch`` of its library's (Hugging Face, litdata)."""
        delegation.set_epoch(self._user, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's resumption state (litdata's or MosaicML's
        ``StreamingDataLoader``), from the settings in use; ``UserError`` where it has none."""
        return delegation.state_dict(None if self._lane is None else self._lane.loader, self._user)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (what ``state_dict`` gave): the next epoch's loader takes it."""
        delegation.can_load_state(self._user)
        self._resume = state

    def report(self) -> AutotuneReport:
        """What was tried and why, and the settings in use."""
        report = self._tuner.report
        report.trials = list(self._tuner.trials)
        return report

    def close(self) -> None:
        """End the worker processes now (they also end when this object is collected)."""
        self._stop_probe()
        for lane in (self._lane, self._next):
            if lane is not None:
                lane.close()
        self._lane = self._next = None
        self._tuner.stopped()

    def __enter__(self) -> AutoLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from (self._epoch() if self._pipeline is None else self._pipeline())
        except BaseException:
            self.close()  # an error or Ctrl-C in the loop (or ours): no worker left behind
            raise

    # --- one epoch -----------------------------------------------------------------------------

    def _epoch(self) -> Iterator[Any]:
        yield from self._split_epoch() if self._split else self._whole_epoch()
        if self._lane is not None:  # the library's epoch count goes on in the next lane
            libraries.carry_state(self._lane.loader, self._user)

    def _split_epoch(self) -> Iterator[Any]:
        # As DataLoader does for each iterator: iter(batch sampler), then a base seed drawn from
        # the loader's generator (a persistent loader draws it only for its first iterator),
        # then the sampler's own draw as its batches are taken.
        sampler_it = iter(self._user.batch_sampler)  # type: ignore[arg-type]
        user = self._user
        if self._tuner.epoch == 0 or not (user.persistent_workers and user.num_workers > 0):
            gen = user.generator
            self._seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
        stream = Stream(sampler_it, epoch_length(self._user))
        self._tuner.new_epoch(stream.length)
        lane = self._start_lane(stream)
        while True:
            began = self._clock()
            try:
                batch = next(lane.it)
            except StopIteration:
                if self._next is None:
                    break  # the epoch is done
                lane = self._take_next(lane)
                continue
            got = self._clock()
            yield batch
            back = self._clock()
            self._observe(lane, batch, got - began, back - got, back)
            if (
                self._next is None
                and lane.feed is not None
                and stream.left()
                and self._tuner.trial_done(back)
            ):
                self._next = self._switch_later(lane, stream)
        self._epoch_end()

    def _whole_epoch(self) -> Iterator[Any]:
        self._tuner.new_epoch(None)
        lane = self._start_lane(None)
        while True:
            began = self._clock()
            try:
                batch = next(lane.it)
            except StopIteration:
                break
            got = self._clock()
            yield batch
            back = self._clock()
            self._observe(lane, batch, got - began, back - got, back)
        self._epoch_end()

    def _start_lane(self, stream: Stream | None) -> Lane:
        cfg = self._tuner.config
        if self._lane is None or self._lane.config != cfg:
            if self._lane is not None:
                self._lane.close()
            self._lane = Lane(self._user, cfg, self._split, self._seed if self._split else None)
        delegation.resume(self._lane.loader, self._resume)
        self._resume = None
        self._lane.start(stream)
        now = self._clock()
        self._tuner.lane_started(now)  # a trial starts (again) with the epoch
        self._follow(self._lane, now)
        return self._lane

    def _observe(self, lane: Lane, batch: Any, wait: float, step: float, now: float) -> None:
        size = batch_nbytes(batch) if self._tuner.wants_batch_bytes else None
        self._tuner.observe(self._count(batch), wait, step, now, size)
        self._follow(lane, now)

    def _epoch_end(self) -> None:
        trial = self._tuner.trial
        if trial is not None and trial.measured >= 4:
            proposal = self._decide()
            if proposal is not None:
                self._tuner.moved(*proposal, drain=False)  # it runs from the next epoch

    # --- trials ----------------------------------------------------------------------------------

    def _decide(self) -> Proposal | None:
        """Conclude the trial in progress: the configuration to move to, or None to stay.
        Runs the thread-safety check the tuner asks for, and keeps what it settles on."""
        now = self._clock()
        action = self._tuner.conclude(now, self._close_probe(now))
        while isinstance(action, CheckThreads):
            check = thread_safety.check(self._user.dataset, action.threads)
            action = self._tuner.threads_checked(check, self._clock())
        if isinstance(action, Settle):
            save(self._cache_key, action.config, action.stall)
            return None if action.config == self._tuner.config else (action.config, "settled")
        return action.config, action.why

    def _switch_later(self, lane: Lane, stream: Stream) -> Lane | None:
        """At the end of a trial: the next lane, already started on the indices after the
        ones this lane took (it is drained first), or None to stay on this one."""
        proposal = self._decide()
        if proposal is None:
            return None
        nxt = Lane(self._user, proposal[0], True, self._seed + len(self._tuner.trials))
        lane.freeze()  # from here on the stream's batches are the next lane's
        try:
            nxt.start(stream)
        except Exception as exc:  # workers that cannot start (memory, /dev/shm, files)
            nxt.close()
            lane.thaw()
            now = self._clock()
            self._tuner.move_failed(*proposal, str(exc), now)
            self._follow(lane, now)
            return None
        self._tuner.moved(*proposal, drain=True)
        return nxt

    def _take_next(self, lane: Lane) -> Lane:
        """The drained lane ends; the next one, which started meanwhile, takes over."""
        nxt = self._next
        assert nxt is not None
        lane.close()
        self._lane, self._next = nxt, None
        now = self._clock()
        self._tuner.switched(now)
        self._follow(nxt, now)
        return nxt

    # --- the probe of a trial ----------------------------------------------------------------

    def _follow(self, lane: Lane, now: float) -> None:
        """Keep a probe on the tuner's trial in progress: a trial that started gets a probe on
        ``lane``'s processes, whose window opens when the trial's does."""
        trial = self._tuner.trial
        if trial is not None and not trial.started:
            trial = None  # planned for the next epoch's lane
        if trial is not self._probed:
            self._stop_probe()
            if trial is not None:
                self._probe = ProcessProbe().__enter__()
                self._probe.attach(lane.it)
                self._probed, self._window = trial, False
        if trial is not None and trial.opened and not self._window and self._probe is not None:
            self._probe.window_open(now)
            self._window = True

    def _close_probe(self, now: float) -> ProbeReport | None:
        """What the probe saw over the trial's window, closed at ``now``; the probe ends."""
        probe = self._probe
        if probe is None or self._probed is not self._tuner.trial:
            return None
        probe.window_close(now)
        report = probe.report()
        self._stop_probe()
        return report

    def _stop_probe(self) -> None:
        if self._probe is not None:
            self._probe.__exit__()
        self._probe, self._probed, self._window = None, None, False


def autotune(
    loader: DataLoader[Any] | Any,
    *,
    rate: float | None = None,
    budget_s: float = BUDGET_S,
    max_workers: int | None = None,
    allow_threads: bool = False,
    cache: bool = True,
    machine: MachineFacts | None = None,
) -> AutoLoader:
    """Wrap ``loader`` so it tunes its own settings while the training loop iterates it.

    Use it where the loader was: ``for batch in feedrate.autotune(loader): ...``. It yields the
    same batches in the same order (map-style datasets), tries a few configurations on stretches
    of the first epoch, keeps the cheapest that removes the data stall of *this* loop, remembers
    it in the cache shared with ``tune`` (the next run starts there), and tunes again if the
    stall comes back. ``allow_threads`` lets it fetch on threads inside workers (a thread-safe
    ``__getitem__`` is needed). ``.config`` is the settings in use, ``.report()`` what it tried.

    ``rate``: the samples/s your loop will take at its fastest, when you know it (e.g. after
    compilation): a configuration then counts as feeding the loop only if it also delivered
    that rate (a loop slower than ``rate`` cannot show a loader faster than itself, so the
    report says when that limited the answer). ``budget_s``: training seconds one round of
    tuning may spend on trials; once spent, it settles on the best configuration so far.

    ``loader`` may be webdataset's ``WebLoader``: its DataLoader is tuned and the stages after
    it run on the tuned batches. ``state_dict``/``load_state_dict`` are those of a streaming
    loader (litdata's, MosaicML's); ``set_epoch`` reaches a library dataset's own too.
    """
    webloader = libraries.webloader_parts(loader)
    inner = loader if webloader is None else webloader[0]
    if not isinstance(inner, DataLoader):
        raise UserError(
            f"autotune() takes a torch.utils.data.DataLoader, got {type(loader).__name__}"
        )
    if max_workers is not None and max_workers < 0:
        raise UserError(f"max_workers must be 0 or more, got {max_workers}")
    if rate is not None and not (isinstance(rate, int | float) and 0 < rate < float("inf")):
        raise UserError(f"rate must be a positive number of samples/s, got {rate!r}")
    if not (isinstance(budget_s, int | float) and budget_s > 0):
        raise UserError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    auto = AutoLoader(
        inner,
        max_workers=max_workers,
        allow_threads=allow_threads,
        use_cache=cache,
        machine=machine,
        rate=None if rate is None else float(rate),
        budget_s=float(budget_s),
    )
    if webloader is not None:  # wds.WebLoader: tune its DataLoader, keep the stages after it
        auto._pipeline = delegation.around(loader, auto._epoch)
    return auto
