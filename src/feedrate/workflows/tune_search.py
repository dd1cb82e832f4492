"""``TuneSearch``: one budgeted search of ``tune``, measuring each configuration the search
proposes (``search.plan.next_trial`` decides what comes next, the same step autotune takes),
then the pin_memory trial, the side-by-side confirmation and the result.

Orchestration only: measuring is ``measure``, deciding is ``search``/``advice``/``checks``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import DataLoader

import feedrate
from feedrate.checks import transfer as checks_transfer
from feedrate.checks.bottleneck import bottleneck_kind, pace_of
from feedrate.checks.threads import thread_findings
from feedrate.checks.tune import tune_findings
from feedrate.errors import PipelineError, PipelineTimeoutError, WorkerKilledError
from feedrate.loader import libraries
from feedrate.loader.batches import batch_size_of, epoch_samples
from feedrate.loader.code import code_line
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import MachineFacts
from feedrate.measuring import interrupts, thread_safety
from feedrate.measuring.consumer import Consumer
from feedrate.measuring.measure import LoaderSource, measure
from feedrate.results.evidence import ThreadCheck
from feedrate.results.findings import Finding, for_loader
from feedrate.results.measurement import Measurement
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.search import advice
from feedrate.search.plan import after_thread_check, next_trial, report_due
from feedrate.search.propose import choose, propose
from feedrate.search.space import Proposal, Space
from feedrate.search.steps import threads_report
from feedrate.units import counted
from feedrate.workflows import tune_confirm
from feedrate.workflows.doctor_trials import refuse_overflow

#: The least wall time a trial is given (s), however little of the budget is left.
MIN_TRIAL_WALL_S = 1.0

#: The watchdog fires up to a quarter past its timeout: a budget's timeout is cut by that much.
WATCHDOG_LATE = 1.25


@dataclass(frozen=True)
class TrialLimits:
    """What one trial may take (s): ``seconds`` of steady state, a deadline ``wall_s`` after its
    ``iter()``, start-up included, and ``timeout_s`` without a batch before it counts as hung;
    ``by_budget`` when the budget left, not the timeout asked for, set that."""

    seconds: float
    wall_s: float
    timeout_s: float
    by_budget: bool


def trial_limits(left_s: float, trial_seconds: float, timeout_s: float) -> TrialLimits:
    """A trial's limits from ``left_s``, what is left of the budget: at most half of it in steady
    state (start-up, warm-up and restarts need the rest), all of it as the trial's deadline,
    and a hang detected within it; never under ``MIN_TRIAL_WALL_S``."""
    left = max(left_s, MIN_TRIAL_WALL_S)
    hang = left / WATCHDOG_LATE
    return TrialLimits(min(trial_seconds, left / 2), left, min(timeout_s, hang), hang < timeout_s)


@dataclass(frozen=True)
class Progress:
    """Sent before each trial (``trial`` is None) and after it (``trial`` set)."""

    index: int
    config: LoaderConfig
    reason: str
    elapsed_s: float
    budget_s: float
    trial: Trial | None = None


class TuneSearch:
    """One search: holds the trials and the ``clock`` (s); ``search()`` returns the result.
    ``source``: what each trial measures (default ``loader``); a factory gives each trial a
    fresh loader, for datasets that one run leaves unusable for the next."""

    def __init__(
        self,
        loader: DataLoader[Any],
        space: Space,
        consumer: Consumer | None,
        trial_seconds: float,
        budget_s: float,
        facts: MachineFacts,
        target: str | None,
        progress: Callable[[Progress], None] | None,
        dev: torch.device | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 60.0,
        source: LoaderSource | None = None,
    ) -> None:
        self.loader, self.space, self.consumer = loader, space, consumer
        self.source: LoaderSource = loader if source is None else source
        self.dev, self.timeout_s = dev, timeout_s
        self.trial_seconds, self.budget_s = trial_seconds, budget_s
        self.facts, self.target, self.progress = facts, target, progress
        self.clock = clock
        self.trials: list[Trial] = []
        self.start = clock()
        self.last_trial_s = 0.0
        self.longest_trial_s = 0.0
        self.partial_reason: str | None = None
        self.thread_check: ThreadCheck | None = None
        self.timed_whole: set[LoaderConfig] = set()  # their rates include every restart
        #: The next measurement's ``steady`` hook (``measure``), set around a coordinated trial.
        self.steady: Callable[[], bool] | None = None

    def elapsed(self) -> float:
        return self.clock() - self.start

    def search(self) -> TuneResult:
        # Your settings are not started when their batches in flight would overflow /dev/shm.
        refuse_overflow(self.loader, self.space.baseline, self.facts)
        baseline = self.trial(self.space.baseline, "your settings", fatal=True)
        report_only: Proposal | None = None
        while self.partial_reason is None:
            step = next_trial(
                self.space,
                self.trials,
                propose,
                spent=not self.room(),
                thread_check=self.thread_check,
            )
            self.trials += step.skipped
            if step.action == "done" or step.config is None:
                break
            if step.action == "report_only":
                report_only = step.config, step.why  # the search's last step, only for the report
                break
            if step.action == "budget_spent":
                self.partial_reason = (
                    f"the budget of {self.budget_s:g} s had no room for another trial as long "
                    f"as the last ({self.last_trial_s:.0f} s) after "
                    f"{counted(len(self.trials), 'trial')}; the search had more to try (next: "
                    f"{step.config.label()})"
                )
                report_only = threads_report(self.space, self.trials)  # its time was kept
                break
            if step.action == "check_threads":
                self._threads_safe(step.config.threads)  # a failure takes threads out
                continue
            self.trial(step.config, step.why)
        self._pin_trial()
        self.confirm(baseline)
        if report_only is not None:
            self._report_threads(*report_only)
        return self.finish(baseline)

    def _report_threads(self, config: LoaderConfig, why: str) -> None:
        """After the answer is settled and confirmed: one threaded configuration, measured for
        the report only (threads were not allowed), if the check passes. ``room`` kept its time
        back from the search once workers were seen waiting; the trial's limits still hold it
        within the budget."""
        if self.budget_s - self.elapsed() < max(MIN_TRIAL_WALL_S, 2 * self._first_batch_s()):
            return
        if self._threads_safe(config.threads):
            self.trial(config, why)

    def _pin_trial(self) -> None:
        """With an accelerator, the answer so far with pin_memory the other way (the loop copies
        each batch to the device, non_blocking from pinned memory), within the pinned budget."""
        if self.dev is None or self.partial_reason is not None:
            return
        best = choose(self.space, self.trials)
        if best is None:
            return
        flipped = replace(best.config, pin_memory=not best.config.pin_memory)
        if any(t.config == flipped for t in self.trials):
            return
        why = f"pin_memory={flipped.pin_memory}: copies to {self.dev} " + (
            "from pinned memory, non_blocking" if flipped.pin_memory else "from pageable memory"
        )
        skip = checks_transfer.pinned_over_budget(flipped, best.batch_bytes, self.facts.to_dict())
        if skip is not None:
            self.trials.append(Trial(flipped, why, skipped=skip))
        elif self.room():
            self.trial(flipped, why)

    def _threads_safe(self, threads: int) -> bool:
        """Run the thread-safety check once, before the first threaded trial; a failure takes
        threads out of the search (a finding says why)."""
        if self.thread_check is None:
            self.thread_check = thread_safety.check(self.loader.dataset, threads)
            self.space = after_thread_check(self.space, self.thread_check)
        return self.thread_check.ok

    def room(self) -> bool:
        """The budget leaves room for one more trial (as long as the last), with the time of
        the threaded trial the report will want kept back (as long as the longest so far)."""
        kept = self.longest_trial_s if report_due(self.space, self.trials) else 0.0
        return self.elapsed() + self.last_trial_s + kept <= self.budget_s

    def confirm(self, baseline: Trial) -> None:
        """The trials the answer rests on, measured again side by side (``tune_confirm``)."""
        if self.space.consumer or self.partial_reason is not None:
            return
        tune_confirm.again_where_contended(self, baseline)
        tune_confirm.confirm(self, baseline)
        tune_confirm.resolve(self)

    def trial(
        self, config: LoaderConfig, why: str, *, fatal: bool = False, record: bool = True
    ) -> Trial:
        interrupts.check()
        index = len(self.trials)
        self._report(Progress(index, config, why, self.elapsed(), self.budget_s))
        began = self.clock()
        limits = trial_limits(self.budget_s - self.elapsed(), self.trial_seconds, self.timeout_s)
        try:
            m = self.measure_trial(config, limits)
            trial = Trial.of(m, why)
            if m.window.method == "whole-epochs":
                self.timed_whole.add(config)
        except PipelineTimeoutError as exc:
            trial = self._timed_out(exc, config, why, limits, fatal=fatal)
        except WorkerKilledError as exc:
            if fatal:
                raise
            trial = Trial(config, why, error=str(exc))
        except PipelineError as exc:
            if fatal:
                raise
            trial = Trial(config, why, error=str(exc))
            self.partial_reason = f"the pipeline failed with {config.label()}: {exc}"
        self.last_trial_s = self.clock() - began
        self.longest_trial_s = max(self.longest_trial_s, self.last_trial_s)
        if record:
            self.trials.append(trial)
        self._report(Progress(index, config, why, self.elapsed(), self.budget_s, trial))
        return trial

    def _timed_out(
        self,
        exc: PipelineTimeoutError,
        config: LoaderConfig,
        why: str,
        limits: TrialLimits,
        *,
        fatal: bool,
    ) -> Trial:
        """No batch came in time. Where the budget left set the wait, the message says so, and
        the budget has run out: the search ends there (partial). Your settings' trial raises."""
        if not limits.by_budget:
            if fatal:
                raise exc
            return Trial(config, why, error=str(exc))
        error = (
            f"{exc}; tune waits at most what is left of its budget ({limits.timeout_s:.1f} s "
            f"of budget_s={self.budget_s:g}, or --budget-s)"
        )
        if fatal:
            raise PipelineTimeoutError(error) from exc
        self.partial_reason = f"the budget ran out while measuring {config.label()}"
        first = self._first_batch_s()
        if limits.timeout_s < first:  # no sign of a hang
            return Trial(
                config,
                why,
                skipped=f"the budget ran out before its first batch: what was left let "
                f"tune wait {limits.timeout_s:.1f} s, and a first batch took {first:.1f} s",
            )
        return Trial(config, why, error=error)

    def _first_batch_s(self) -> float:
        """The longest wait for a first batch measured so far (s)."""
        return max((t.startup_s for t in self.trials if t.measured), default=0.0)

    def measure_trial(self, config: LoaderConfig, limits: TrialLimits) -> Measurement:
        """Measure ``config`` within ``limits`` (a seam: tests give made-up measurements)."""
        return measure(
            self.source,  # a factory builds each trial a fresh loader
            config,
            seconds=limits.seconds,
            wall_s=limits.wall_s,
            timeout_s=limits.timeout_s,
            windows_count=4,
            consumer=self.consumer,
            machine=self.facts,
            target=self.target,
            device=self.dev,
            steady=self.steady,
        )

    def restart_counted(self, trial: Trial, config: LoaderConfig) -> float:
        """Seconds every epoch of ``config`` waits for its workers, left out of ``trial``'s rate:
        none with persistent workers, without workers, or when whole epochs were timed (their
        rate includes it); else the mean epoch restart measured, or the start-up."""
        if not config.num_workers or config.persistent_workers or trial.config in self.timed_whole:
            return 0.0
        restarts = trial.epoch_restart_s
        return sum(restarts) / len(restarts) if restarts else trial.startup_s

    def _report(self, event: Progress) -> None:
        if self.progress is not None:
            self.progress(event)

    def finish(self, baseline: Trial) -> TuneResult:
        best = choose(self.space, self.trials) or baseline
        consumer = bool(self.space.consumer)
        loser = None if self.dev is None else checks_transfer.pin_loser(best, self.trials, consumer)
        if loser is not None:  # pinned only where its measurement both ways says so
            best = choose(self.space, [t for t in self.trials if t is not loser]) or baseline
        chosen = best  # as measured: pinning's verdict reads its twin
        samples = epoch_samples(self.loader, [best, *self.trials])
        persistent = advice.judge_persistent(best, samples)
        advice.verdicts(self.space, self.trials, best, loser)
        final = advice.apply_persistent(best, persistent)
        best_restart_s = self.restart_counted(best, final)
        if final != best.config:
            # persistent_workers changes only each epoch's start, not the steady-state rate.
            best = replace(
                best,
                config=final,
                reason=f"{best.reason}; persistent_workers set from the measured start-up cost",
            )
        described = self.consumer.describe() if self.consumer else None
        return TuneResult(
            machine=self.facts.to_dict(),
            baseline=baseline,
            best=best,
            trials=self.trials,
            findings=for_loader(
                tune_findings(
                    self.space,
                    self.facts.to_dict(),
                    baseline,
                    best,
                    self.trials,
                    samples,
                    batch_size_of(self.loader),
                )
                + thread_findings(self.space, self.thread_check, self.trials, best)
                + self._transfer_findings(chosen),
                libraries.class_name(self.loader),
            ),
            search_seconds=self.elapsed(),
            reason=advice.reason(self.space, best, baseline, described, self.trials),
            code=code_line(self.loader, final)
            + (
                ""
                if self.dev is None
                else "\n" + checks_transfer.copy_line(str(self.dev), bool(final.pin_memory))
            ),
            target=self.target,
            batch_size=batch_size_of(self.loader),
            consumer=self.consumer.to_dict() if self.consumer else None,
            bottleneck=bottleneck_kind(  # the kind the bottleneck finding names
                best,
                self.space.cpus,
                batch_size_of(self.loader),
                pace_of(best, self.space.consumer),
            ),
            persistent=persistent,
            partial=self.partial_reason is not None,
            partial_reason=self.partial_reason,
            feedrate_version=feedrate.__version__,
            samples_per_epoch=samples,
            baseline_restart_s=self.restart_counted(baseline, baseline.config),
            best_restart_s=best_restart_s,
        )

    def _transfer_findings(self, best: Trial) -> list[Finding]:
        """With an accelerator: what pinning measured end to end, and the memory it locks."""
        if self.dev is None:
            return []
        found = []
        verdict = checks_transfer.pin_verdict(best, self.trials, bool(self.space.consumer))
        if verdict is not None:
            _, pays, why = verdict
            found.append(
                Finding(
                    "pin-memory-measured",
                    "info",
                    f"on {self.dev}: {why}",
                    checks_transfer.copy_line(str(self.dev), pays),
                )
            )
        pinned_f = checks_transfer.pinned_finding(best.config, best, self.facts.to_dict())
        if pinned_f is not None:
            found.append(pinned_f)
        return found
