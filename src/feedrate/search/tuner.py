"""The online tuner behind ``autotune``: observations in, an action out.

Pure and clock-free: the caller reads its clock and passes ``now`` (seconds from any origin)
with every observation, so the same decisions can be taken from gathered figures and tested
with a fake clock. With ``counted`` (the ranks of a job, each with its own tuner) trials end
and watch windows close on batch counts alone, and the decisions are fed the job's figures
(``conclude_job``, ``watched``), so every rank takes each decision at the same batch with the
same outcome. The tuner owns the trial in progress (per batch: the samples, the wait in
``next()`` and the step after; when it is done, with the early stop of a starved loop), its
conclusion into the next step (``next_trial`` over ``propose_online``: configurations
predicted over a budget skipped, the round's ``budget_s``, settling with ``choose``), the watch
windows once settled with the re-tune trigger, and the events that say why.

What needs the machine comes back as an action (``search.actions``): ``CheckThreads`` (run the
dataset on threads, hand the verdict to ``threads_checked``), ``Try`` and ``Settle`` (move to a
configuration; ``moved``, ``move_failed`` and ``switched`` say how it went; a ``Settle`` is
also what to remember for the next run).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from feedrate.loader.config import LoaderConfig
from feedrate.results.autotune import AutotuneReport, Event
from feedrate.results.evidence import ThreadCheck
from feedrate.results.processes import ProbeReport
from feedrate.results.trial import Trial
from feedrate.search import watch
from feedrate.search.actions import Action, CheckThreads, Settle, Try
from feedrate.search.online_trial import TRIAL_S, WHOLE_EPOCHS, TrialTiming
from feedrate.search.plan import after_thread_check, next_trial
from feedrate.search.propose import choose, keep, propose_online, repeat_costs, unresolved
from feedrate.search.space import Proposal, Space, eligible, fastest
from feedrate.search.watch import RETUNE_STALL, RETUNE_WINDOWS, WATCH_BATCHES, WATCH_S, Watch

BUDGET_S = 60.0  # the default ``budget_s``: training seconds a round may spend on trials


def online(cfg: LoaderConfig) -> LoaderConfig:
    """A configuration as autotune runs it: lanes keep their workers between epochs."""
    return replace(cfg, persistent_workers=cfg.num_workers > 0)


class OnlineTuner:
    """The decisions of ``autotune`` for one loop, from ``start`` (``started_from`` says why)
    in ``space``; ``settled``: it only watches, against ``settled_stall`` (None: the first
    watch window measures it). ``warmup(config)``: batches a lane of ``config`` makes before
    its figures count; ``rate``: the consumer's samples/s, where known; ``budget_s``: seconds
    of trials one round may spend; ``counted``: one rank of a job (see the module)."""

    def __init__(
        self,
        space: Space,
        start: LoaderConfig,
        started_from: str,
        *,
        settled: bool,
        settled_stall: float | None,
        warmup: Callable[[LoaderConfig], int],
        rate: float | None = None,
        budget_s: float = BUDGET_S,
        counted: bool = False,
    ) -> None:
        self.space = replace(space, baseline=start)
        self.counted = counted
        self._least = 0  # batches a trial measures at least: TRIAL_S at the job's last pace
        self._batch_s: float | None = None  # seconds per batch in the last trial (the job's)
        self._spent = False  # the round's budget was spent at the last conclusion (counted)
        self._epoch_length: int | None = None
        self.rate, self.budget_s = rate, budget_s
        self.report = AutotuneReport(start, settled=settled, started_from=started_from)
        self.trials: list[Trial] = []
        #: The trial in progress, and the one planned for the lane that takes over after a
        #: drain (its batches are the next trial's, the drained ones are not).
        self.trial = None if settled else self._timing(start, f"start: {started_from}", 0)
        self.pending: TrialTiming | None = None
        # The stall the settled configuration leaves (the loop's own pace may keep it above
        # zero); the reference the watch windows compare against.
        self.settled_stall = settled_stall if settled else 0.0
        self.thread_check: ThreadCheck | None = None
        self._again: Trial | None = None  # the trial the one in progress measures again
        self._warmup_of = warmup
        self._warmup_cap = 1 << 30
        self._watch = self._new_watch()
        #: The stall of the watch stretch just completed, for the caller to reduce over the
        #: job's ranks and hand to ``watched`` (counted); None between stretches.
        self.watch_due: float | None = None
        self._over = 0  # watch windows in a row over the settled stall
        self._round_began: float | None = None  # when this round of tuning began
        self.kept: LoaderConfig | None = None  # a drained lane's, its workers up (the caller's)
        self.epoch = 0
        self.batch = 0  # batches seen in this epoch

    @property
    def config(self) -> LoaderConfig:
        """The settings in use (or moved to, while a lane drains)."""
        return self.report.config

    @property
    def wants_batch_bytes(self) -> bool:
        """The next observation should carry the batch's bytes (a trial's first batch)."""
        return self.pending is None and self.trial is not None and self.trial.batch_bytes is None

    def new_epoch(self, length: int | None) -> None:
        """An epoch of ``length`` batches (None: unknown) begins. A trial's warm-up (one batch
        per worker and the queue) is never cut short to fit it: an epoch with no room for the
        warm-up and whole rounds after it is timed whole instead (``TrialTiming.planned``), as
        a window after a cut warm-up would count the queue's burst."""
        self.epoch += 1
        self.batch = 0
        self._warmup_cap = 1 << 30 if length is None else max(1, length)
        self._epoch_length = length

    def lane_started(self, now: float, fresh: bool = False, lead_s: float = 0.0) -> None:
        """A lane of ``config`` starts with the epoch (``iter()`` took ``lead_s``; ``fresh``: new
        workers). A trial timed whole goes on; any other starts over, with a warm-up unless it
        had measured in rounds on this lane (alone): the queue is empty here (``epoch_done``)."""
        trial, cfg = self.trial, self.config
        if trial is None:
            return
        if not fresh and trial.goes_on(cfg):
            trial.next_epoch(lead_s)
            return
        warm = not (fresh or self.counted or trial.whole_epoch) and trial.measured > 0
        warmup = 0 if warm else self._warmup(cfg)
        self.trial = self._timing(cfg, trial.reason, warmup, fresh)
        self.trial.startup_s = lead_s if fresh else trial.startup_s  # what its start cost
        self.trial.start(now, lead_s)

    def observe(
        self,
        samples: int,
        wait: float,
        step: float,
        now: float,
        batch_bytes: int | None = None,
        busy: float = 0.0,
    ) -> None:
        """One batch of ``samples`` reached the loop after ``wait`` s in ``next()`` (``busy`` of
        them on a CPU); the loop's step took ``step`` s and ended at ``now``."""
        self.batch += 1
        if self.pending is not None:
            return  # a replaced lane drains: not the next trial's figures
        trial = self.trial
        if trial is not None:
            if trial.batch_bytes is None:
                trial.batch_bytes = batch_bytes
            trial.add(samples, wait, step, now, busy)
            return
        stall = self._watch.add(wait, step)
        if stall is None:
            return
        if self.counted:
            self.watch_due = stall
            return
        self.watched(stall, now)

    @property
    def wants_queued(self) -> bool:
        """Whether the loop's run-queue and CPU times are read beside the clock: in a trial,
        and while watching from a stretch read without them over the margin to one under (they
        only take time from a wait: under the margin without them, it is under with them)."""
        return self.trial is not None or self.pending is not None or not self._watch.lean

    def watched(self, stall: float, now: float) -> None:
        """A watch stretch ended at ``now`` with ``stall`` (counted: the job's, reduced over its
        ranks): the reference, a window over it, or the trigger to tune again."""
        self.watch_due = None
        if self.settled_stall is None:
            self.settled_stall = stall  # the reference: settled earlier, on this loop
            self._watch.lean = True
        elif stall > max(RETUNE_STALL, self.settled_stall + RETUNE_STALL):
            if self._watch.lean:  # read without the run-queue time: a stretch with it decides
                self._watch.lean = False
                return
            self._over += 1
            if self._over >= RETUNE_WINDOWS:
                self._retune(stall, now)
        else:
            self._over, self._watch.lean = 0, True

    def trial_done(self, now: float) -> bool:
        """The trial in progress has measured enough to be concluded (counted: a trial of this
        epoch's lane, by its batch count alone)."""
        trial = self.trial
        if self.pending is not None or trial is None:
            return False
        if self.counted:
            return trial.started and trial.full()
        return trial.done(now)

    def round_spent_s(self, now: float) -> float:
        """Seconds since this round of tuning began, on this process's clock (at ``now``)."""
        began = self._round_began
        if began is None:
            began = self.trial.began if self.trial is not None else now
        return now - began

    def conclude(self, now: float, processes: ProbeReport | None) -> Action:
        """Close the trial in progress (``processes``: what the probe saw over its window) and
        decide the next step."""
        trial = self.trial
        assert trial is not None, "conclude() needs a trial in progress"
        if self._round_began is None:
            self._round_began = trial.began
        self._record(trial.result(self.rate, processes))
        self.trial, self._batch_s = None, trial.seconds_per_batch()
        return self._next(self._spent_at(now))

    def conclude_job(self, trial: Trial, spent_s: float, batch_s: float | None) -> Action:
        """Close the trial in progress with the job's figures (``trial``: every rank's, reduced;
        ``spent_s``: the round's seconds; ``batch_s``: the loop's seconds per batch) and decide
        the next step: the same inputs on every rank, the same action. Later trials measure
        at least ``TRIAL_S`` at that pace."""
        assert self.trial is not None, "conclude_job() needs a trial in progress"
        if self._round_began is None:
            self._round_began = self.trial.began
        self._record(trial)
        self.trial = None
        self._batch_s = batch_s
        if batch_s:
            self._least = math.ceil(TRIAL_S / batch_s)
        self._spent = spent_s >= self.budget_s
        return self._next(self._spent)

    def threads_checked(self, check: ThreadCheck, now: float) -> Action:
        """The verdict of the check ``CheckThreads`` asked for; a failure takes threads out of
        the search (an event says why). The next step."""
        self.thread_check = check
        self.space = after_thread_check(self.space, check)
        if not check.ok:
            self._event("no threads", check.reason())
        return self._next(self._spent if self.counted else self._spent_at(now))

    def moved(self, config: LoaderConfig, why: str, *, drain: bool) -> None:
        """The caller moved to ``config`` (a ``Try``'s or a ``Settle``'s): with ``drain`` a
        lane of it is starting and takes over once the lane in use drains (``switched``);
        else it runs from the next epoch."""
        self.report.config = config
        trial = None if self.report.settled else self._timing(config, why, self._warmup(config))
        if drain:
            self.pending = trial
        else:
            self.trial = trial

    def keep(self, alive: list[LoaderConfig], going: LoaderConfig) -> LoaderConfig | None:
        """Which drained lane of ``alive`` keeps its workers while ``going`` is tried
        (``propose.keep``): a return to it then starts none. None once settled: no return
        comes, and idle workers would hold memory for nothing."""
        return None if self.report.settled else keep(self.space, self.trials, alive, going)

    def again_here(self, action: Try, now: float) -> None:
        """``action`` measures the running configuration again, from ``now``, on its lane."""
        self.moved(action.config, action.why, drain=True)
        self.switched(now)

    def move_failed(
        self, failed: Proposal, error: str, now: float, running: LoaderConfig, what: str = "stay on"
    ) -> None:
        """A lane of ``failed`` could not start (memory, /dev/shm, open files): recorded; that
        of ``running`` goes on with the epoch's next batches, measured again from ``now``
        after a warm-up (its queue starts empty)."""
        (config, why), self._again, self.pending = failed, None, None
        self.report.config = cfg = running
        self.trials.append(Trial(config, why, error=f"did not start: {error}"))
        self._event(f"{what} {cfg.label()}", f"{config.label()}: {error}")
        self.trial = self._timing(cfg, "measured again", self._warmup(cfg))
        self.trial.start(now)

    def start_failed(self, error: str, now: float, running: LoaderConfig, first: bool) -> None:
        """The lane of the configuration in use could not start with the epoch: as
        ``move_failed``, ``running``'s lane takes the epoch. At the ``first`` (``running``: the
        loader's own settings) the search goes on from there, a cached start included."""
        why = self.trial.reason if self.trial is not None else self.report.started_from
        if first:
            self.report.settled = False
            self.space = replace(self.space, baseline=running)
        self.move_failed((self.config, why), error, now, running, "run")

    def started_again(self, config: LoaderConfig, pids: list[int]) -> None:
        """Workers of ``config`` never started (hung in their fork): all were started again."""
        shown = ", ".join(str(p) for p in pids)
        self._event(f"start {config.label()} again", f"worker process(es) {shown} hung in the fork")

    def switched(self, now: float, start_s: float = 0.0) -> None:
        """The drained lane ended at ``now``; the one ``moved(drain=True)`` started took over
        (its workers' start took ``start_s``, beside the drain)."""
        self.trial, self.pending = self.pending, None
        if self.trial is not None:
            self.trial.startup_s = start_s
            self.trial.start(now)
        self._watch = self._new_watch()

    def stopped(self) -> None:
        """The loop stopped (an error, a break, ``close()``): interrupted mid-trial, the next
        epoch measures again."""
        self.pending = None
        if not self.report.settled:
            self.trial = self._timing(self.config, "measured again after a stop", 0)

    def _record(self, trial: Trial) -> None:
        """A concluded trial joins the others; a repeat (``_again``) is pooled with its first."""
        again, self._again = self._again, None
        if again is not None and again.config == trial.config and trial.measured:
            again.pool(trial)
        else:
            self.trials.append(trial)

    def _spent_at(self, now: float) -> bool:
        began = self._round_began
        return began is not None and now - began >= self.budget_s

    def _new_watch(self) -> Watch:
        # The reference stretch is read whole, after the lane's warm-up (a burst of batches).
        lean = self.settled_stall is not None
        skip = 0 if lean else self._warmup(self.config)
        if not self.counted:
            return Watch(lean=lean, skip=skip)
        # Batches only, as many as WATCH_S takes at the job's last pace.
        pace = math.ceil(WATCH_S / self._batch_s) if self._batch_s else 0
        return Watch(need=max(WATCH_BATCHES, pace), counted=True, lean=lean, skip=skip)

    def _next(self, spent: bool) -> Action:
        step = next_trial(
            self.space, self.trials, propose_online, spent=spent, thread_check=self.thread_check
        )
        self.trials += step.skipped
        if step.action == "check_threads" and step.config is not None:
            return CheckThreads(step.config.threads)
        if step.action == "try" and step.config is not None:
            self._event(f"try {step.config.label()}", step.why)
            return Try(step.config, step.why)
        if step.action == "budget_spent":
            self._event("stop trying", f"budget_s={self.budget_s:g} s of trials spent")
        elif not spent and (again := self._unresolved()) is not None:
            # Near-tied leaders: measured again, in turn, until the gap is resolved.
            behind, why = again
            self._again = behind
            self._event(f"try {behind.config.label()}", why)
            return Try(behind.config, why)
        return self._settle()

    def _unresolved(self) -> tuple[Trial, str] | None:
        """Near-tied leaders to measure again (``unresolved``), where the epoch's length is
        known only while finding out may save more over an epoch at the last trial's pace than
        the repeat's start of workers (none running or ``kept``) costs (``repeat_costs``)."""
        again, n, pace = unresolved(self.space, self.trials), self._epoch_length, self._batch_s
        if again is None or n is None or pace is None:
            return again
        up = (self.config, self.kept or self.config)
        cost, worth = repeat_costs(self.space, self.trials, again[0], up, n * pace)
        if cost <= worth:
            return again
        self._event(
            f"not measured again: {again[0].config.label()}",
            f"its workers' start holds the loop {cost:.1f} s; a gap within the noise is worth "
            f"{worth:.1f} s an epoch",
        )
        return None

    def _settle(self) -> Settle:
        best = choose(self.space, self.trials) or self.trials[-1]
        self.report.settled = True
        self._round_began = None
        self.settled_stall = best.stall_fraction or 0.0
        if self.counted:  # a stretch as long as the pace just measured needs
            self._watch = self._new_watch()
        self._event(f"settled on {best.config.label()}", watch.settled_why(best, self.rate))
        return Settle(best.config, self.settled_stall)

    def _retune(self, stall: float, now: float) -> None:
        cfg = self.config
        self._over = 0
        self._round_began = None
        self.watch_due = None
        self.report.retunes += 1
        self.report.settled = False
        self.trials, self._again = [], None  # the old steps no longer describe the loop
        self.space = replace(self.space, baseline=online(cfg))
        self._event("tune again", f"the data stall came back ({stall:.0%} of the time waiting)")
        self.trial = self._timing(cfg, "measured again: the stall came back", 0)
        self.trial.start(now)

    def _timing(self, cfg: LoaderConfig, why: str, warmup: int, fresh: bool = False) -> TrialTiming:
        least = self._least if self.counted else 0
        # Every rank of a job decides at each epoch's end: no epoch goes unmeasured there.
        fresh, epochs = (False, 1) if self.counted else (fresh, WHOLE_EPOCHS)
        timing = TrialTiming.planned(cfg, why, warmup, self._epoch_length, least, fresh, epochs)
        timing.rival = getattr(fastest(eligible(self.space, self.trials)), "median", None)
        return timing

    def _warmup(self, cfg: LoaderConfig) -> int:
        return min(self._warmup_of(cfg) if cfg.num_workers else 0, self._warmup_cap)

    def _event(self, what: str, why: str) -> None:
        self.report.events.append(Event(self.epoch, self.batch, what, why))
