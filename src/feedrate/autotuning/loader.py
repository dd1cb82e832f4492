"""``feedrate.autotune(loader)``: a loader that tunes its own settings while training runs.

The training loop is the consumer: the time between two of its ``next()`` calls is its step,
the time ``next()`` waits is the data stall. ``AutoLoader`` tries configurations on consecutive
stretches of the epoch, keeps the cheapest one that removes the stall (``propose_online``
decides), then only watches: two clock readings per batch. When the stall comes back (steps got
faster after warm-up or compilation), it tunes again from where it is.

Correctness first, for a map-style dataset with automatic batching: the tuner owns the epoch's
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

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.autotuning.lanes import Lane, Stream
from feedrate.checks import dataset as checks_dataset
from feedrate.errors import UserError
from feedrate.loader.batches import batch_nbytes, epoch_length, sample_counter, thread_cap
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import (
    config_of,
    is_iterable_style,
)
from feedrate.machine import cache
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import thread_safety
from feedrate.measuring.measure import warmup_batches
from feedrate.measuring.processes import ProcessProbe
from feedrate.measuring.workers import stream_digests
from feedrate.results.autotune import AutotuneReport, Event
from feedrate.results.evidence import ThreadCheck
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.search.budgets import space_for
from feedrate.search.propose import choose, propose_online
from feedrate.search.space import STALL_MARGIN, covers, predict_over_budget

#: A trial measures at least this many batches and seconds, after its warm-up batches.
TRIAL_BATCHES = 12


TRIAL_S = 0.5


#: A trial whose loop waits more than this share of the time ends after half as many batches.
STARVED = 0.5


#: While watching: the stall over a stretch of at least this many batches and seconds, above
#: ``RETUNE_STALL``, starts tuning again.
WATCH_BATCHES = 64


WATCH_S = 2.0


RETUNE_STALL = 2 * STALL_MARGIN


#: Windows in a row whose stall must exceed the settled one by ``RETUNE_STALL`` to tune again
#: (one noisy window must not cost a round of trials).
RETUNE_WINDOWS = 2


#: The default ``budget_s``: training seconds one round of tuning may spend on trials.
BUDGET_S = 60.0


#: Cache options of autotune's own entries (tune's entries are read too).
_OPTIONS = {"autotune": 1}


@dataclass
class _Stretch:
    """The timing of one trial: per batch, samples, the wait in next() and the step after;
    the first ``warmup`` batches (made while the lane started) are not measured."""

    config: LoaderConfig
    reason: str
    warmup: int
    began: float = 0.0
    samples: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    probe: ProcessProbe | None = None
    batch_bytes: int | None = None  # of the first batch: the search reads it (copies)

    @property
    def measured(self) -> int:
        return max(0, len(self.steps) - self.warmup)

    def done(self, now: float) -> bool:
        """Enough measured; a loop starved most of the time is judged on half as much (the
        verdict is plain, and every batch of it costs training time)."""
        if self.measured >= TRIAL_BATCHES and now - self.began >= TRIAL_S:
            return True
        if self.measured < TRIAL_BATCHES // 2 or now - self.began < TRIAL_S / 2:
            return False
        waited = sum(self.waits[self.warmup :])
        return waited > STARVED * (waited + sum(self.steps[self.warmup :]))

    def start(self, lane: Lane, now: float) -> None:
        """Watch ``lane``'s processes; with no warm-up the window opens now."""
        self.probe = ProcessProbe().__enter__()
        self.probe.attach(lane.it)
        if self.warmup == 0:
            self.open(now)

    def open(self, now: float) -> None:
        self.began = now
        if self.probe is not None:
            self.probe.window_open(now)

    def add(self, samples: int, wait: float, step: float, now: float) -> None:
        self.samples.append(samples)
        self.waits.append(wait)
        self.steps.append(step)
        if len(self.steps) == self.warmup:
            self.open(now)

    def stop(self) -> None:
        if self.probe is not None:
            self.probe.__exit__()

    def trial(self, rate: float | None = None) -> Trial:
        """The measured batches as a Trial: rate delivered to the loop, in up to 4 windows,
        the stall, and where the CPU time and memory went. With the consumer's ``rate``, the
        stall is the larger of the one measured and ``1 - delivered / rate``: a loop slower
        than ``rate`` never shows whether the loader could keep up with it."""
        if self.probe is not None:
            self.probe.window_close(time.perf_counter())
        w, s = self.waits[self.warmup :], self.steps[self.warmup :]
        n = self.samples[self.warmup :]
        k = max(1, min(4, len(s) // 3))
        size = max(1, len(s) // k)
        rates = []
        for i in range(0, size * k, size):
            span = sum(w[i : i + size]) + sum(s[i : i + size])
            rates.append(sum(n[i : i + size]) / span if span > 0 else 0.0)
        total = sum(w) + sum(s)
        trial = Trial(
            config=self.config,
            reason=self.reason,
            samples_per_s=sum(n) / total if total > 0 else 0.0,
            spread=Spread.of_rates(rates, "mad"),
            stall_fraction=sum(w) / total if total > 0 else None,
            batch_bytes=self.batch_bytes,
        )
        if rate is not None and trial.stall_fraction is not None:
            trial.stall_fraction = max(trial.stall_fraction, 1.0 - trial.samples_per_s / rate)
        if self.probe is not None:
            _add_figures(trial, self.probe)
        self.stop()
        return trial


def _add_figures(trial: Trial, probe: ProcessProbe) -> None:
    rep = probe.report()
    workers = rep.workers
    trial.main_cpu = rep.main.cpu_util
    trial.workers_cpu = sum(f.cpu_util for f in workers)
    runq = [f.runq_util for f in workers if f.runq_util is not None]
    trial.workers_runq = sum(runq) if runq else None
    uss = [f.uss_bytes for f in workers if f.uss_bytes is not None]
    trial.main_uss_bytes = rep.main.uss_bytes
    trial.workers_uss_bytes = sum(uss) if uss else None
    trial.worker_uss_max_bytes = max(uss) if uss else None
    trial.system_busy_cpus = rep.system_busy_cpus


class AutoLoader:
    """Iterate it as the DataLoader it wraps (see ``autotune``)."""

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
    ) -> None:
        self._user = loader
        self._rate, self._budget_s = rate, budget_s
        self._facts = machine or collect()
        self._split = not is_iterable_style(loader) and loader.batch_sampler is not None
        self._count = sample_counter(loader)
        key = cache_key(self._facts, loader, max_workers, allow_threads)
        self._cache_key = key if use_cache else None
        # tune's budgets: memory (and a cgroup limit), /dev/shm, open files, max_workers.
        space = space_for(self._facts, config_of(loader), consumer=True, max_workers=max_workers)
        self._space = replace(
            space,
            max_threads=thread_cap(loader) if self._split else 1,
            allow_threads=allow_threads,
        )
        start, started_from, cached_stall = self._start_config(use_cache)
        # An IterableDataset that does not split its stream by worker yields all of it once per
        # worker: one that runs without workers gets them only when 2 workers were seen to
        # yield different items (a few seconds, once).
        unsplit = _unsplit_stream(loader) if is_iterable_style(loader) else None
        fixed = unsplit is not None
        if unsplit is not None:
            start, started_from = config_of(loader), f"your settings: {unsplit}"
        self._space = replace(self._space, baseline=start)
        cached = fixed or started_from.startswith("the cached")
        self._report = AutotuneReport(start, settled=cached, started_from=started_from)
        self._thread_check: ThreadCheck | None = None
        self._trials: list[Trial] = []
        self._lane: Lane | None = None
        self._next: Lane | None = None
        # From the cache it only watches (and tunes again if the loop waits); else it measures.
        self._stretch: _Stretch | None = (
            None if cached else _Stretch(start, f"start: {started_from}", 0)
        )
        self._pending: _Stretch | None = None
        # The stall the settled configuration leaves (the loop's own pace may keep it above zero);
        # from the cache without one, the first watch window measures it.
        self._settled_stall: float | None = cached_stall if cached else 0.0
        self._watch = (0.0, 0.0, 0)
        self._over = 0  # watch windows in a row over the settled stall
        self._round_began: float | None = None  # when this round of tuning began
        self._epoch = 0
        self._warmup_cap = 1 << 30
        self._seed = 0
        self._batch = 0  # batches yielded in this epoch

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
        return self._report.config

    def __len__(self) -> int:
        return len(self._user)

    def set_epoch(self, epoch: int) -> None:
        """Passed to the sampler (e.g. ``DistributedSampler``) or a batch sampler's sampler."""
        owners: list[Any] = [
            self._user.sampler,
            getattr(self._user.batch_sampler, "sampler", None),
            self._user.batch_sampler,
        ]
        for owner in owners:
            set_epoch = getattr(owner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
                return

    def report(self) -> AutotuneReport:
        """What was tried and why, and the settings in use."""
        self._report.trials = list(self._trials)
        return self._report

    def close(self) -> None:
        """End the worker processes now (they also end when this object is collected)."""
        for st in (self._stretch, self._pending):
            if st is not None:
                st.stop()
        for lane in (self._lane, self._next):
            if lane is not None:
                lane.close()
        self._lane = self._next = None
        self._pending = None
        if not self._report.settled:  # interrupted mid-trial: the next epoch measures again
            self._stretch = _Stretch(self._report.config, "measured again after a stop", 0)

    def __enter__(self) -> AutoLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        self._epoch += 1
        self._batch = 0
        try:
            yield from (self._split_epoch() if self._split else self._whole_epoch())
        except BaseException:
            self.close()  # an error or Ctrl-C in the loop (or ours): no worker left behind
            raise

    # --- one epoch -----------------------------------------------------------------------------

    def _split_epoch(self) -> Iterator[Any]:
        # As DataLoader does for each iterator: iter(batch sampler), then a base seed drawn from
        # the loader's generator (a persistent loader draws it only for its first iterator),
        # then the sampler's own draw as its batches are taken.
        sampler_it = iter(self._user.batch_sampler)  # type: ignore[arg-type]
        user = self._user
        if self._epoch == 1 or not (user.persistent_workers and user.num_workers > 0):
            gen = user.generator
            self._seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
        stream = Stream(sampler_it, epoch_length(self._user))
        self._warmup_cap = 1 << 30 if stream.length is None else max(1, stream.length // 4)
        lane = self._start_lane(stream)
        while True:
            began = time.perf_counter()
            try:
                batch = next(lane.it)
            except StopIteration:
                if self._next is None:
                    break  # the epoch is done
                lane = self._take_next(lane)
                continue
            got = time.perf_counter()
            yield batch
            back = time.perf_counter()
            if self._pending is None:
                self._record(batch, got - began, back - got, back)
            else:
                self._batch += 1  # draining a replaced lane: not the next trial's figures
            st = self._stretch
            if (
                st is not None
                and self._next is None
                and st.done(back)
                and lane.feed is not None
                and stream.left()
            ):
                self._next = self._switch_later(lane, stream)
        self._epoch_end()

    def _whole_epoch(self) -> Iterator[Any]:
        lane = self._start_lane(None)
        while True:
            began = time.perf_counter()
            try:
                batch = next(lane.it)
            except StopIteration:
                break
            got = time.perf_counter()
            yield batch
            back = time.perf_counter()
            self._record(batch, got - began, back - got, back)
        self._epoch_end()

    def _start_lane(self, stream: Stream | None) -> Lane:
        cfg = self._report.config
        if self._lane is None or self._lane.config != cfg:
            if self._lane is not None:
                self._lane.close()
            self._lane = Lane(self._user, cfg, self._split, self._seed if self._split else None)
        self._lane.start(stream)
        if self._stretch is not None:  # a trial starts (again) with the epoch
            self._stretch.stop()
            self._stretch = _Stretch(cfg, self._stretch.reason, self._warmup(cfg))
            self._stretch.start(self._lane, time.perf_counter())
        return self._lane

    def _epoch_end(self) -> None:
        st = self._stretch
        if st is not None and st.measured >= 4:
            proposal = self._conclude()
            if proposal is not None:
                self._apply(*proposal)

    # --- tuning ----------------------------------------------------------------------------------

    def _record(self, batch: Any, wait: float, step: float, now: float) -> None:
        self._batch += 1
        st = self._stretch
        if st is not None:
            if st.batch_bytes is None:
                st.batch_bytes = batch_nbytes(batch)
            st.add(self._count(batch), wait, step, now)
            return
        waited, stepped, n = self._watch
        waited, stepped, n = waited + wait, stepped + step, n + 1
        if n >= WATCH_BATCHES and waited + stepped >= WATCH_S:
            stall = waited / (waited + stepped)
            if self._settled_stall is None:
                self._settled_stall = stall  # the reference: settled earlier, on this loop
            elif stall > max(RETUNE_STALL, self._settled_stall + RETUNE_STALL):
                self._over += 1
                if self._over >= RETUNE_WINDOWS:
                    self._retune(stall, now)
            else:
                self._over = 0
            waited, stepped, n = 0.0, 0.0, 0
        self._watch = (waited, stepped, n)

    def _retune(self, stall: float, now: float) -> None:
        cfg = self._report.config
        self._over = 0
        self._round_began = None
        self._report.retunes += 1
        self._report.settled = False
        self._trials = []  # the old steps no longer describe the loop
        self._space = replace(self._space, baseline=_online(cfg))
        self._event("tune again", f"the data stall came back ({stall:.0%} of the time waiting)")
        self._stretch = _Stretch(cfg, "measured again: the stall came back", 0)
        if self._lane is not None and self._lane.it is not None:
            self._stretch.start(self._lane, now)

    def _conclude(self) -> tuple[LoaderConfig, str] | None:
        """Close the current trial; the next configuration, or None to stay (settled)."""
        st = self._stretch
        assert st is not None
        now = time.perf_counter()
        if self._round_began is None:
            self._round_began = st.began
        self._trials.append(st.trial(self._rate))
        self._stretch = None
        spent = now - self._round_began >= self._budget_s
        if spent:
            self._event("stop trying", f"budget_s={self._budget_s:g} s of trials spent")
        while not spent and (proposal := propose_online(self._space, self._trials)):
            if proposal[0].threads > 1 and not self._threads_safe(proposal[0].threads):
                continue
            skip = predict_over_budget(self._space, self._trials, proposal[0])
            if skip is None:
                self._event(f"try {proposal[0].label()}", proposal[1])
                return proposal
            self._trials.append(Trial(proposal[0], proposal[1], skipped=skip))
        best = choose(self._space, self._trials) or self._trials[-1]
        self._report.settled = True
        self._round_began = None
        self._settled_stall = best.stall_fraction or 0.0
        self._event(f"settled on {best.config.label()}", _why(best, self._rate))
        self._save(best.config, self._settled_stall)
        if best.config != self._report.config:
            return best.config, "settled"
        return None

    def _threads_safe(self, threads: int) -> bool:
        """The thread-safety check of tune, once, before the first threaded trial; a failure
        takes threads out of the search (the report's events say why)."""
        if self._thread_check is None:
            self._thread_check = thread_safety.check(self._user.dataset, threads)
            if not self._thread_check.ok:
                self._space = replace(self._space, max_threads=1, allow_threads=False)
                self._event("no threads", self._thread_check.reason())
        return self._thread_check.ok

    def _apply(self, cfg: LoaderConfig, why: str) -> None:
        self._report.config = cfg
        if not self._report.settled:
            self._stretch = _Stretch(cfg, why, self._warmup(cfg))

    def _switch_later(self, lane: Lane, stream: Stream) -> Lane | None:
        """At the end of a trial: the next lane, already started on the indices after the
        ones this lane took (it is drained first), or None to stay on this one."""
        proposal = self._conclude()
        if proposal is None:
            return None
        nxt = Lane(self._user, proposal[0], True, self._seed + len(self._trials))
        lane.freeze()  # from here on the stream's batches are the next lane's
        try:
            nxt.start(stream)
        except Exception as exc:  # workers that cannot start (memory, /dev/shm, files)
            nxt.close()
            lane.thaw()
            self._trials.append(Trial(proposal[0], proposal[1], error=f"did not start: {exc}"))
            self._event(f"stay on {lane.config.label()}", f"{proposal[0].label()}: {exc}")
            self._stretch = _Stretch(lane.config, "measured again", 0)
            self._stretch.start(lane, time.perf_counter())
            return None
        self._apply(*proposal)
        self._pending, self._stretch = self._stretch, None
        return nxt

    def _take_next(self, lane: Lane) -> Lane:
        """The drained lane ends; the next one, which started meanwhile, takes over."""
        nxt = self._next
        assert nxt is not None
        lane.close()
        self._lane, self._next = nxt, None
        if self._stretch is not None:
            self._stretch.stop()
        self._stretch, self._pending = self._pending, None
        if self._stretch is not None:
            self._stretch.start(nxt, time.perf_counter())
        self._watch = (0.0, 0.0, 0)
        return nxt

    def _warmup(self, cfg: LoaderConfig) -> int:
        return min(warmup_batches(cfg) if cfg.num_workers else 0, self._warmup_cap)

    def _event(self, what: str, why: str) -> None:
        self._report.events.append(Event(self._epoch, self._batch, what, why))

    # --- the cache ---------------------------------------------------------------------------

    def _start_config(self, use_cache: bool) -> tuple[LoaderConfig, str, float | None]:
        """The cached settings (within max_workers and allow_threads), else yours when they
        use workers, else one worker per usable CPU with your other settings."""
        space = self._space
        if use_cache:
            tune_key = cache.key(self._facts, self._user, _tune_options())
            for key in (self._cache_key, tune_key):
                doc = cache.load(key) if key else None
                config = _cached_config(doc)
                fits = config is not None and config.num_workers <= space.max_workers
                if config is not None and fits and (config.threads == 1 or space.allow_threads):
                    stall = doc.get("stall") if doc and key == self._cache_key else None
                    return (
                        _online(config),
                        "the cached settings of an earlier run",
                        stall if isinstance(stall, float) else None,
                    )
        own = config_of(self._user)
        if own.num_workers > 0:
            capped = replace(own, num_workers=min(own.num_workers, max(1, space.max_workers)))
            return _online(capped), "your settings", None
        w = min(self._facts.cpus_usable, space.max_workers)
        start = replace(own, num_workers=w, prefetch_factor=2 if w else None)
        return _online(start), f"{w} workers, one per usable CPU", None

    def _save(self, config: LoaderConfig, stall: float) -> None:
        """The settings, and the stall they left this loop (the reference the next run
        watches against: a loop that cannot be fed must not look like a stall come back)."""
        if self._cache_key is not None:
            doc = {"schema": "feedrate.autotune/1", "config": config.to_dict(), "stall": stall}
            cache.save(self._cache_key, doc)


def cache_key(
    facts: MachineFacts, loader: DataLoader[Any], max_workers: int | None, allow_threads: bool
) -> str:
    """Where autotune keeps the settings it settled on for this loader on this machine."""
    options = {**_OPTIONS, "max_workers": max_workers, "allow_threads": allow_threads}
    return cache.key(facts, loader, options)


def _online(cfg: LoaderConfig) -> LoaderConfig:
    """A configuration as autotune runs it: lanes keep their workers between epochs."""
    return replace(cfg, persistent_workers=cfg.num_workers > 0)


def _tune_options() -> dict[str, Any]:
    """The options of a plain ``tune(loader)``, whose cached answer autotune may start from."""
    return {
        "consumer": None,
        "max_workers": None,
        "memory_limit": None,
        "allow_reorder": False,
        "allow_threads": False,
    }


def _cached_config(doc: dict[str, Any] | None) -> LoaderConfig | None:
    if not doc:
        return None
    with contextlib.suppress(KeyError, TypeError, ValueError, UserError):
        if doc.get("schema") == "feedrate.autotune/1":
            return LoaderConfig.from_dict(doc["config"])
        return LoaderConfig.from_dict(doc["best"]["config"])
    return None


def _unsplit_stream(loader: DataLoader[Any]) -> str | None:
    """Why an IterableDataset loader must keep running without workers, or None (it already
    uses workers, or 2 workers were seen to split its stream)."""
    if config_of(loader).num_workers > 0:
        return None  # yours: it already runs in workers
    try:
        digests = stream_digests(loader, limit=32, seconds=2.0)
    except Exception as exc:  # the check itself failed: stay safe
        return f"an IterableDataset without workers is left without them (the check failed: {exc})"
    if checks_dataset.stream_splits(digests):
        return None
    return (
        "an IterableDataset without workers is left without them: 2 workers did not yield "
        "different items, so each worker would yield the whole stream (split it by "
        "get_worker_info() to let autotune use workers)"
    )


def _why(best: Trial, rate: float | None) -> str:
    stall = best.stall_fraction or 0.0
    pace = "the step" if rate is None else f"the step at rate={rate:,.0f} samples/s"
    if covers(best):
        return f"{best.config.label()} keeps {pace} fed ({stall:.0%} stall)"
    why = f"no configuration tried keeps {pace} fed; {best.config.label()} stalls {stall:.0%}"
    if rate is not None and best.samples_per_s < rate and (best.stall_fraction or 0) > 0:
        why += (
            f" (the loop took {best.samples_per_s:,.0f} samples/s: a loader faster than its "
            "loop cannot be measured)"
        )
    return why


def autotune(
    loader: DataLoader[Any],
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
    """
    if not isinstance(loader, DataLoader):
        raise UserError(
            f"autotune() takes a torch.utils.data.DataLoader, got {type(loader).__name__}"
        )
    if max_workers is not None and max_workers < 0:
        raise UserError(f"max_workers must be 0 or more, got {max_workers}")
    if rate is not None and not (isinstance(rate, int | float) and 0 < rate < float("inf")):
        raise UserError(f"rate must be a positive number of samples/s, got {rate!r}")
    if not (isinstance(budget_s, int | float) and budget_s > 0):
        raise UserError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    return AutoLoader(
        loader,
        max_workers=max_workers,
        allow_threads=allow_threads,
        use_cache=cache,
        machine=machine,
        rate=None if rate is None else float(rate),
        budget_s=float(budget_s),
    )
