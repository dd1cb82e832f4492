"""``tune``: measure the user's settings, search guided by what each trial shows, recommend.

Orchestration only: measuring is ``measure``, deciding is ``search``/``advice``/``checks``,
rendering is elsewhere. The result is plain data (``TuneResult``).
"""

from __future__ import annotations

import math
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
from feedrate.errors import PipelineError, PipelineTimeoutError, UserError, WorkerKilledError
from feedrate.loader.batches import epoch_samples, thread_cap
from feedrate.loader.code import code_line
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of, is_iterable_style, supports
from feedrate.machine import cache
from feedrate.machine.facts import MachineFacts, collect
from feedrate.measuring import device as devices
from feedrate.measuring import interrupts, thread_safety
from feedrate.measuring.consumer import Consumer, make_consumer
from feedrate.measuring.measure import measure
from feedrate.results.evidence import ThreadCheck
from feedrate.results.findings import Finding, by_severity
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.search import advice
from feedrate.search.budgets import space_for
from feedrate.search.propose import choose, propose
from feedrate.search.space import Proposal, Space, predict_over_budget

#: The fewest seconds a search can do anything useful in: the baseline and two anchors.
MIN_BUDGET_S = 5.0


#: Rivals within this share of the leader are measured again before the answer is given.
CONFIRM_WITHIN = 0.15


@dataclass(frozen=True)
class Progress:
    """Sent before each trial (``trial`` is None) and after it (``trial`` set)."""

    index: int
    config: LoaderConfig
    reason: str
    elapsed_s: float
    budget_s: float
    trial: Trial | None = None


def tune(
    source: DataLoader[Any] | Callable[[], DataLoader[Any]],
    *,
    rate: float | None = None,
    step_time: float | None = None,
    step: Callable[[Any], object] | None = None,
    step_name: str | None = None,
    budget_s: float = 60.0,
    max_workers: int | None = None,
    memory_limit: int | None = None,
    allow_reorder: bool = False,
    allow_threads: bool = False,
    fresh: bool = False,
    use_cache: bool = True,
    trial_seconds: float = 2.0,
    target: str | None = None,
    progress: Callable[[Progress], None] | None = None,
    machine: MachineFacts | None = None,
    device: str | None = "auto",
) -> TuneResult:
    """Find the best DataLoader settings for ``source`` on this machine.

    Without a consumer the answer is the fastest configuration (the cheapest among those within
    the noise of the fastest); with ``rate`` (samples/s), ``step_time`` (s per batch) or ``step``
    (a callable taking a batch) it is the fewest workers that keep that consumer fed. The search
    stops when gains fall within the noise or ``budget_s`` is spent (the result then says it is
    partial). ``memory_limit`` bounds the predicted memory (bytes, default half of what is
    available). Results are cached per machine and pipeline unless ``fresh``.

    Where workers mostly wait, threads inside workers (``feedrate.threaded``) are measured too,
    after a thread-safety check; they are recommended only with ``allow_threads`` (they need a
    thread-safe ``__getitem__``), otherwise a finding says what they measured.

    Where an accelerator exists (``device``: "auto", a torch device name, or "cpu" for none),
    every trial copies each batch to it, and ``pin_memory`` is tried both ways on the answer.
    """
    loader = source() if callable(source) and not isinstance(source, DataLoader) else source
    if not isinstance(loader, DataLoader):
        raise UserError(f"expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
    _check_budget(budget_s, trial_seconds, max_workers, memory_limit)
    dev = devices.parse_device(device)
    consumer = make_consumer(rate=rate, step_time=step_time, step=step, step_name=step_name)
    facts = machine or collect()
    space = space_for(
        facts,
        config_of(loader),
        consumer=consumer is not None,
        max_workers=max_workers,
        memory_limit=memory_limit,
        allow_reorder=allow_reorder and not is_iterable_style(loader) and supports("in_order"),
    )
    space = replace(
        space,
        max_threads=thread_cap(loader),
        allow_threads=allow_threads or space.baseline.threads > 1,
    )
    options: dict[str, Any] = {
        "consumer": consumer.to_dict() if consumer else None,
        "max_workers": max_workers,
        "memory_limit": memory_limit,
        "allow_reorder": allow_reorder,
        "allow_threads": allow_threads,
    }
    if dev is not None:
        options["device"] = str(dev)
    cache_key = cache.key(facts, loader, options)
    if use_cache and not fresh:
        hit = _from_cache(cache_key, source)
        if hit is not None:
            return hit
    run = _Run(loader, space, consumer, trial_seconds, budget_s, facts, target, progress, dev)
    with interrupts.stoppable():
        result = run.search()
    result.findings = by_severity([*result.findings, *_doctor_checks(loader, facts, result)])
    result._source = source
    if use_cache and not result.partial:
        cache.save(cache_key, result.to_dict())
    return result


def _check_budget(
    budget_s: float, trial_s: float, max_workers: int | None, mem: int | None
) -> None:
    if not math.isfinite(budget_s):
        raise UserError(
            f"budget_s must be a number of seconds, got {budget_s:g}", params=("budget_s",)
        )
    if budget_s < MIN_BUDGET_S:
        raise UserError(
            f"budget_s={budget_s:g} is too short to measure anything: a search needs at least "
            f"{MIN_BUDGET_S:g} s (your settings and two alternatives); the default is 60",
            params=("budget_s",),
        )
    if not trial_s > 0:
        raise UserError(
            f"trial_seconds must be positive, got {trial_s:g}", params=("trial_seconds",)
        )
    if max_workers is not None and max_workers < 0:
        raise UserError(
            f"max_workers must be 0 or more, got {max_workers}", params=("max_workers",)
        )
    if mem is not None and mem <= 0:
        raise UserError("memory_limit must be positive", params=("memory_limit",))


def _doctor_checks(
    loader: DataLoader[Any], facts: MachineFacts, result: TuneResult
) -> list[Finding]:
    """The doctor's dataset and resource checks (shared generators, duplicate streams, copies
    of Python objects, threads, /dev/shm, open files), a few seconds at most."""
    from feedrate.workflows.doctor import tune_checks

    return tune_checks(loader, facts, result.baseline, result.best)


def _from_cache(cache_key: str, source: Any) -> TuneResult | None:
    document = cache.load(cache_key)
    if document is None:
        return None
    try:
        result = TuneResult.from_dict(document)
    except (KeyError, TypeError, ValueError):
        return None  # an unreadable entry (older format): tune again
    result.from_cache = True
    result._source = source
    return result


class _Run:
    """One search: holds the trials and the clock; ``search()`` returns the result."""

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
    ) -> None:
        self.loader, self.space, self.consumer = loader, space, consumer
        self.dev = dev
        self.trial_seconds, self.budget_s = trial_seconds, budget_s
        self.facts, self.target, self.progress = facts, target, progress
        self.trials: list[Trial] = []
        self.start = time.monotonic()
        self.last_trial_s = 0.0
        self.partial_reason: str | None = None
        self.thread_check: ThreadCheck | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def search(self) -> TuneResult:
        baseline = self.trial(self.space.baseline, "your settings", fatal=True)
        report_only: Proposal | None = None
        while self.partial_reason is None:
            proposal = propose(self.space, self.trials)
            if proposal is None:
                break
            config, why = proposal
            skip = predict_over_budget(self.space, self.trials, config)
            if skip is not None:
                self.trials.append(Trial(config, why, skipped=skip))
                continue
            if config.threads > 1 and not self.space.allow_threads:
                report_only = proposal  # the search's last step, only for the report
                break
            if self.elapsed() + self.last_trial_s > self.budget_s:
                self.partial_reason = (
                    f"the budget of {self.budget_s:g} s was spent after {len(self.trials)} "
                    f"trials; the search had more to try (next: {config.label()})"
                )
                break
            if config.threads > 1 and not self._threads_safe(config.threads):
                continue  # the check took threads out of the space
            self.trial(config, why)
        self._pin_trial()
        self.confirm(baseline)
        if report_only is not None:
            self._report_threads(*report_only)
        return self.finish(baseline)

    def _report_threads(self, config: LoaderConfig, why: str) -> None:
        """After the answer is settled and confirmed: one threaded configuration, measured for
        the report only (threads were not allowed), if the budget leaves room and the check
        passes. The answer is complete without it, so a spent budget just skips it."""
        if self.elapsed() + self.last_trial_s > self.budget_s:
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
        elif self.elapsed() + self.last_trial_s <= self.budget_s:
            self.trial(flipped, why)

    def _threads_safe(self, threads: int) -> bool:
        """Run the thread-safety check once, before the first threaded trial; a failure takes
        threads out of the search (a finding says why)."""
        if self.thread_check is None:
            self.thread_check = thread_safety.check(self.loader.dataset, threads)
            if not self.thread_check.ok:
                self.space = replace(self.space, max_threads=1, allow_threads=False)
        return self.thread_check.ok

    def confirm(self, baseline: Trial) -> None:
        """Measure the leader again, with its closest rival and your settings, interleaved, and
        pool the windows: one lucky window should not pick the answer, and the speed-up over
        your settings should compare measurements taken side by side. When pooling changes the
        leader, the new one is measured again too (at most twice more), within the budget."""
        if self.space.consumer or self.partial_reason is not None:
            return
        again: set[int] = set()
        for round_ in range(3):
            best = choose(self.space, self.trials)
            if best is None or id(best) in again:
                return
            group = [best]
            if round_ == 0:
                rivals = sorted(
                    (t for t in self.trials if t.measured and t is not best and t is not baseline),
                    key=lambda t: -t.median,
                )
                group += [t for t in rivals[:1] if t.median >= best.median * (1 - CONFIRM_WITHIN)]
                group.append(baseline)
            for t in group:
                if id(t) in again:
                    continue
                if self.elapsed() + self.last_trial_s > self.budget_s:
                    return
                t.pool(self.trial(t.config, "measured again, side by side", record=False))
                again.add(id(t))

    def trial(
        self, config: LoaderConfig, why: str, *, fatal: bool = False, record: bool = True
    ) -> Trial:
        interrupts.check()
        index = len(self.trials)
        self._report(Progress(index, config, why, self.elapsed(), self.budget_s))
        began = time.monotonic()
        try:
            m = measure(
                self.loader,
                config,
                seconds=self.trial_seconds,
                windows_count=4,
                consumer=self.consumer,
                machine=self.facts,
                target=self.target,
                device=self.dev,
            )
            trial = Trial.of(m, why)
        except (WorkerKilledError, PipelineTimeoutError) as exc:
            if fatal:
                raise
            trial = Trial(config, why, error=str(exc))
        except PipelineError as exc:
            if fatal:
                raise
            trial = Trial(config, why, error=str(exc))
            self.partial_reason = f"the pipeline failed with {config.label()}: {exc}"
        self.last_trial_s = time.monotonic() - began
        if record:
            self.trials.append(trial)
        self._report(Progress(index, config, why, self.elapsed(), self.budget_s, trial))
        return trial

    def _report(self, event: Progress) -> None:
        if self.progress is not None:
            self.progress(event)

    def finish(self, baseline: Trial) -> TuneResult:
        best = choose(self.space, self.trials) or baseline
        samples = epoch_samples(self.loader)
        persistent = advice.judge_persistent(best, samples)
        advice.verdicts(self.space, self.trials, best)
        final = advice.apply_persistent(best, persistent)
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
            findings=tune_findings(
                self.space,
                self.facts.to_dict(),
                baseline,
                best,
                self.trials,
                samples,
                self.loader.batch_size,
            )
            + thread_findings(self.space, self.thread_check, self.trials, best)
            + self._transfer_findings(best),
            search_seconds=self.elapsed(),
            reason=advice.reason(self.space, best, baseline, described, self.trials),
            code=code_line(self.loader, final)
            + (
                ""
                if self.dev is None
                else "\n" + checks_transfer.copy_line(str(self.dev), bool(final.pin_memory))
            ),
            target=self.target,
            batch_size=self.loader.batch_size,
            consumer=self.consumer.to_dict() if self.consumer else None,
            bottleneck=bottleneck_kind(  # the kind the bottleneck finding names
                best,
                self.space.cpus,
                self.loader.batch_size,
                pace_of(best, self.space.consumer),
            ),
            persistent=persistent,
            partial=self.partial_reason is not None,
            partial_reason=self.partial_reason,
            feedrate_version=feedrate.__version__,
        )

    def _transfer_findings(self, best: Trial) -> list[Finding]:
        """With an accelerator: what pinning measured end to end, and the memory it locks."""
        if self.dev is None:
            return []
        found = []
        flipped = replace(best.config, pin_memory=not best.config.pin_memory)
        other = next((t for t in self.trials if t.measured and t.config == flipped), None)
        if other is not None:
            pinned, pageable = (best, other) if best.config.pin_memory else (other, best)
            pays, why = checks_transfer.pin_pays(pageable, pinned)
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
