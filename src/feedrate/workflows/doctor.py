"""``doctor``: what is wrong or risky in a DataLoader pipeline on this machine, with the evidence
and the fix. ``tune_checks``: the same dataset and resource checks, run inside ``tune``.

Orchestration only: what it looks for and its steps are in ``doctor_steps``, the experiments
that run the pipeline in ``measuring`` (the throughput comparison in ``doctor_trials``), the
rules in ``checks``, the ranks' node step in ``doctor_node``; the result is plain data.

The doctor does not search: it briefly measures your settings and a few alternatives (no
workers, one per usable CPU, twice as many when workers wait), and claims a better count only
when the gain beats the noise, measured again side by side. Every step is bounded in time; one
that fails is a ``check-failed`` finding and the others go on, but once the pipeline itself
failed the steps that would run it again are skipped, and the report says so. A run predicted
to overflow /dev/shm is not started; one that dies of it anyway is named ``shm-too-small``.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from torch.utils.data import DataLoader

import feedrate
from feedrate.checks import dataset as checks_dataset
from feedrate.checks.machine import (
    cpu_quota_finding,
    limit_findings,
    pin_memory_finding,
    pin_memory_unused_finding,
    refusal,
    shm_failed_finding,
    shm_finding,
)
from feedrate.checks.tune import check_failed_finding, failed_trials_finding
from feedrate.checks.workers import (
    busy_machine_finding,
    data_stall_finding,
    startup_cause,
    startup_finding,
    workers_past_shards_finding,
)
from feedrate.errors import PipelineError
from feedrate.loader.batches import batch_size_of, epoch_samples
from feedrate.loader.libraries import class_name, epoch_per_worker, worker_limit
from feedrate.loader.rebuild import config_of, is_iterable_style
from feedrate.machine.facts import MachineFacts
from feedrate.measuring import random_state
from feedrate.measuring import workers as worker_runs
from feedrate.measuring.consumer import Consumer, make_consumer
from feedrate.measuring.dataset_objects import large_containers
from feedrate.measuring.diagnosis import shm_exhausted
from feedrate.measuring.measure import LoaderSource, refuse_empty
from feedrate.measuring.memory_run import memory_run_config, sample_run
from feedrate.measuring.shm import main_process_batch
from feedrate.results.doctor import CheckRun, CheckStatus, Report
from feedrate.results.evidence import Container
from feedrate.results.findings import Finding, by_severity, for_loader
from feedrate.results.trial import Trial
from feedrate.units import check_seconds
from feedrate.workflows.doctor_node import node_step
from feedrate.workflows.doctor_steps import (
    BRIEF_SECONDS,
    MEMORY_SECONDS,
    STEPS,
    TUNE_CHECKS,
    TUNE_MEMORY_SECONDS,
    Evidence,
    Loaders,
    facts_for,
    library_skip,
    start_method,
)
from feedrate.workflows.doctor_steps import CHECKS as CHECKS  # re-exported: doctor's contract
from feedrate.workflows.doctor_steps import wanted_checks as wanted_checks
from feedrate.workflows.doctor_trials import TRIAL_SECONDS, Comparison

_AFTER_FAILURE = "the pipeline failed in an earlier step"


def doctor(
    source: LoaderSource,
    *,
    rate: float | None = None,
    step_time: float | None = None,
    step: Callable[[Any], object] | None = None,
    step_name: str | None = None,
    checks: Collection[str] | None = None,
    trial_seconds: float = TRIAL_SECONDS,
    timeout_s: float = 30.0,
    machine: MachineFacts | Mapping[str, Any] | None = None,
    target: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Examine ``source`` (a DataLoader or a zero-argument callable returning one) as configured,
    and report what is wrong or risky (``Report.findings``, errors first), with the evidence
    and a fix for each. With ``rate`` (samples/s), ``step_time`` (s per batch) or ``step`` (a
    callable taking a batch) the loader is judged against that consumer.

    ``checks``: finding ids to look for (default all, see ``CHECKS``). ``timeout_s``: a step
    that sees no batch for this long stops as hung. ``machine``: the facts to judge by (default
    this machine's); a mapping overrides only the fields it names, e.g.
    ``{"shm_free_bytes": 64 * 2**20}`` to ask how the pipeline would fare in a default Docker
    container. Never raises for a failing pipeline: the failure is in ``Report.pipeline_error``
    and a ``check-failed`` finding. Raises ``UserError`` for bad arguments. No worker outlives
    the call, nor a draw from the random state the loader's batches draw on.
    """
    loaders = Loaders(source)  # a factory TARGET: a fresh loader for each run
    check_seconds(trial_seconds, "trial_seconds")
    check_seconds(timeout_s, "timeout_s")
    wanted = wanted_checks(checks)
    consumer = make_consumer(rate=rate, step_time=step_time, step=step, step_name=step_name)
    facts = facts_for(machine)  # a bad fact fails here, before the other ranks are met
    # Worker counts within a rank's share of its node; the loader's random state kept.
    with node_step(wanted, trial_seconds + timeout_s) as node, random_state.kept(loaders.first):
        mine, on_node = node.share(facts), node.machine(facts)
        doc = _Doctor(loaders.first, on_node, consumer, wanted, timeout_s, progress, rank=mine)
        doc.compared.set_up(trial_seconds, loaders.source, node.local_ranks)
        doc.loaders = loaders  # a factory's: a fresh loader for each run
        for name in STEPS:
            doc.step(name)
        return node.judged(doc.report(target), loaders.first, mine.cpus_usable)


def tune_checks(
    loader: DataLoader[Any],
    facts: MachineFacts,
    baseline: Trial,
    best: Trial,
    *,
    timeout_s: float = 30.0,
) -> list[Finding]:
    """The doctor's dataset and resource checks for a finished ``tune`` (``TUNE_CHECKS``): a look
    inside 2 workers, an IterableDataset's duplicates, and the memory run only when the dataset
    holds large Python containers. Well under 5 s on a working pipeline."""
    doc = _Doctor(
        loader,
        facts,
        None,
        set(TUNE_CHECKS),
        timeout_s,
        None,
        measured=(baseline, best),
        memory_seconds=TUNE_MEMORY_SECONDS,
    )
    for name in ("workers", "duplicates"):
        doc.step(name)
    if doc.containers:
        doc.step("memory")
    return doc.findings()


class _Doctor:
    """One examination: runs the steps, guards each, then applies the rules."""

    def __init__(
        self,
        loader: DataLoader[Any],
        facts: MachineFacts,
        consumer: Consumer | None,
        wanted: set[str],
        timeout_s: float,
        progress: Callable[[str], None] | None,
        *,
        seconds: float = TRIAL_SECONDS,
        measured: tuple[Trial, Trial] | None = None,
        memory_seconds: float = MEMORY_SECONDS,
        rank: MachineFacts | None = None,
    ) -> None:
        """``measured``: your settings and the answer, already measured (tune's), judged
        instead of measuring them again (the dataset traps then at the larger worker count).
        ``rank``: a rank's share of its node (``facts``), worker counts tried and advised in."""
        self.loader, self.facts, self.consumer = loader, facts, consumer
        self.rank = rank or facts
        self.wanted, self.timeout_s, self.progress = wanted, timeout_s, progress
        self.config = config_of(loader)
        self.memory_seconds = memory_seconds
        self.started = time.monotonic()
        self.runs: list[CheckRun] = []
        self.seen = Evidence()
        self.compared = Comparison(
            loader, self.rank, consumer, seconds=seconds, timeout_s=timeout_s, measured=measured
        )
        self.pipeline_error: str | None = None
        #: The worker count the dataset traps are judged at (tune: its answer, if more).
        self.workers = max(
            self.config.num_workers, measured[1].config.num_workers if measured else 0
        )
        self.containers = self._static_scan()
        self.loaders = Loaders(loader)  # doctor() sets a factory's: a fresh loader per run

    def _static_scan(self) -> list[Container]:
        if "copy-on-read" not in self.wanted:
            return []
        try:
            return large_containers(self.loader.dataset)
        except Exception:  # an exotic object graph must not stop the doctor
            return []

    # -- steps -------------------------------------------------------------------------------

    def step(self, name: str) -> None:
        """Run step ``name`` unless nothing wanted needs it, it does not apply, or the pipeline
        already failed; record how it went."""
        skip = self._skip_reason(name)
        if skip is not None:
            self.runs.append(CheckRun(name, "skipped", detail=skip))
            return
        if self.progress is not None:
            self.progress(name)
        began = time.monotonic()
        status: CheckStatus
        run = getattr(self, f"_{name}")  # _batch, _workers, _duplicates, _memory, _performance
        try:
            refuse_empty(self.loader)  # else the checks before the first batch pass vacuously
            run()
            status, detail = "ok", ""
        except PipelineError as exc:
            self.pipeline_error = self.pipeline_error or str(exc)
            status, detail = "failed", str(exc)
        except Exception as exc:  # a bug in a check must not cost the other findings
            status, detail = "failed", f"{type(exc).__name__}: {exc} (a feedrate bug: report it)"
        self.runs.append(CheckRun(name, status, time.monotonic() - began, detail))

    def _skip_reason(self, name: str) -> str | None:
        if not any(name in CHECKS[i] for i in self.wanted):
            return "not asked for"
        if name == "duplicates" and not is_iterable_style(self.loader):
            return "not an IterableDataset"
        served = {i for i in self.wanted if name in CHECKS[i]}
        if name == "memory" and served == {"copy-on-read"} and not self.containers:
            return "no large Python containers on the dataset"
        if self.pipeline_error is not None:
            return _AFTER_FAILURE
        held = library_skip(name, self.loader.dataset, fresh=self.loaders.factory is not None)
        if held is not None:
            return held
        return self._overflow(name)

    def _overflow(self, name: str) -> str | None:
        """Why the run of step ``name`` is not started: over the processes and threads left, or
        predicted to overflow /dev/shm from the batch made in the main process (the one rule,
        ``checks.machine.refusal``); None when it may."""
        config = {"memory": memory_run_config(self.loader), "performance": self.config}.get(name)
        return None if config is None else refusal(config, self.rank.to_dict(), self._bytes())

    def _bytes(self) -> int | None:
        """A batch's bytes, from the best evidence gathered."""
        run, baseline, batch = self.seen.run, self.compared.baseline, self.seen.batch
        return (
            (baseline.batch_bytes if baseline else None)
            or (run.batch_bytes if run else None)
            or (batch.bytes if batch else None)
        )

    def _batch(self) -> None:
        self.seen.batch = main_process_batch(self.loaders.fresh(), timeout_s=self.timeout_s)

    def _workers(self) -> None:
        loader = self.loaders.fresh()
        self.seen.views = worker_runs.inspect_workers(loader, timeout_s=self.timeout_s)
        if (
            start_method(self.loader, self.facts) in ("spawn", "forkserver")
            and "startup-cost" in self.wanted
        ):
            try:
                self.seen.pickled_bytes = len(pickle.dumps(self.loader.dataset))
            except Exception:
                self.seen.pickled_bytes = None

    def _duplicates(self) -> None:
        loader = self.loaders.fresh()
        self.seen.digests = worker_runs.stream_digests(loader, timeout_s=self.timeout_s)

    def _memory(self) -> None:
        """Long enough to see memory grow where the dataset holds large Python containers;
        otherwise just long enough for a batch and the workers' threads while loading."""
        keep = self.consumer is not None and self.consumer.kind == "step"
        seconds = self.memory_seconds if self.containers else BRIEF_SECONDS
        self.seen.run = sample_run(
            self.loaders.fresh(), seconds=seconds, timeout_s=self.timeout_s, keep_batch=keep
        )

    def _performance(self) -> None:
        """Your settings; then, when a bottleneck or worker-count finding is wanted, the few
        alternatives that tell (and, with a consumer, the loader and the consumer alone)."""
        wanted = self.wanted & {"bottleneck", "too-few-workers", "too-many-workers"}
        wide = bool(wanted) and self.seen.copies(self.workers) is None  # else rates of copies
        batch = self.seen.run.first_batch if self.seen.run is not None else None
        self.compared.run(alternatives=wide, batch=batch)

    # -- judging -----------------------------------------------------------------------------

    def _resources(self) -> list[Finding | None]:
        """/dev/shm, open files and tasks within the rank's share, as runs are refused."""
        m, mine = self.facts.to_dict(), self.rank.to_dict()
        run, best, batch = self.seen.run, self.compared.best, self.seen.batch
        batch_bytes = self._bytes()
        tensors = (run.tensors_per_batch if run else None) or (batch.tensors if batch else None)
        configs = [(self.config, False)]
        if best is not None and best.config.num_workers > self.config.num_workers:
            configs.append((best.config, True))
        shm = [shm_finding(c, mine, batch_bytes, s) for c, s in configs]
        limits = [limit_findings(c, mine, tensors) for c, _ in configs]  # open files, tasks
        return [
            cpu_quota_finding(m),
            pin_memory_finding(Trial(self.config, "your settings"), m),
            pin_memory_unused_finding(self.config, m, batch_bytes),
            next((f for f in shm if f is not None), None),
            *(next((f for f in kind if f is not None), None) for kind in zip(*limits, strict=True)),
        ]

    def _dataset(self) -> list[Finding | None]:
        seen, mine, data, w = self.seen, self.workers, self.loader.dataset, self.config.num_workers
        return [
            checks_dataset.thread_finding(seen.views, seen.run, mine, self.rank.cpus_usable),
            checks_dataset.shared_rng_finding(seen.views, mine),
            seen.copies(mine),
            checks_dataset.copy_on_read_finding(self.containers, seen.run),
            checks_dataset.epoch_per_worker_finding(epoch_per_worker(data), w),
            workers_past_shards_finding(worker_limit(data), w),
        ]

    def _performance_findings(self) -> list[Finding | None]:
        base = self.compared.baseline
        if base is None or not base.measured:
            return []
        view = self.seen.views[0] if self.seen.views else None
        cause = startup_cause(
            start_method(self.loader, self.facts),
            view.init_s if view else None,
            view.age_s if view else None,
            self.seen.pickled_bytes,
        )
        workers = self.compared.worker_count_finding()
        dup = self.seen.copies(self.workers)  # more workers of a stream repeat it: no such advice
        workers = None if dup and workers and workers.id == "too-few-workers" else workers
        bottleneck = None if dup else self.compared.bottleneck_finding()  # rates of repeats
        stall = None
        if self.consumer is not None and bottleneck is not None and workers is None:
            stall = data_stall_finding(base, bottleneck.fix)  # else too-few says it
        return [
            startup_finding(base, epoch_samples(self.loader, [base]), cause),
            workers,
            bottleneck,
            stall,
            busy_machine_finding(self.compared.measured(), self.facts.cpus_usable),
            failed_trials_finding(self.compared.trials),  # never "no problems" over a failure
        ]

    def _failures(self) -> list[Finding]:
        """A ``check-failed`` for each step that failed; ``shm-too-small`` first when a run died
        of /dev/shm running out."""
        out = []
        skipped = [STEPS[r.name] for r in self.runs if r.detail == _AFTER_FAILURE]
        for r in self.runs:
            if r.status != "failed":
                continue
            if shm_exhausted(r.detail) and "shm-too-small" in self.wanted:
                config = memory_run_config(self.loader) if r.name == "memory" else self.config
                m, what = self.facts.to_dict(), STEPS[r.name]
                out.append(shm_failed_finding(config, m, self._bytes(), what, r.detail))
            later = skipped if self.pipeline_error == r.detail else None
            out.append(check_failed_finding(STEPS[r.name], r.detail, later))
        return out

    def findings(self) -> list[Finding]:
        failures = self._failures()
        died = {f.id for f in failures}  # a run that died of it says more than a prediction
        found = [*self._resources(), *self._dataset(), *self._performance_findings()]
        wanted = [f for f in found if f is not None and f.id in self.wanted and f.id not in died]
        return for_loader(by_severity([*failures, *wanted]), class_name(self.loader))

    def report(self, target: str | None) -> Report:
        evidence: dict[str, Any] = {
            "containers": [c.to_dict() for c in self.containers],
            "workers": [v.to_dict() for v in self.seen.views],
            "stream": None if self.seen.digests is None else self.seen.digests.to_dict(),
            "memory_run": None if self.seen.run is None else self.seen.run.to_dict(),
            "pickled_dataset_bytes": self.seen.pickled_bytes,
            "main_batch_bytes": None if self.seen.batch is None else self.seen.batch.bytes,
        }
        return Report(
            machine=self.facts.to_dict(),
            config=self.config,
            findings=self.findings(),
            checks=self.runs,
            seconds=time.monotonic() - self.started,
            **self.compared.bottlenecks(),  # yours, and the finding's where read elsewhere
            trials=self.compared.all_trials,
            loader_alone=self.compared.loader_alone,
            consumer_alone_samples_per_s=self.compared.consumer_alone,
            evidence=evidence,
            target=target,
            batch_size=batch_size_of(self.loader),
            consumer=None if self.consumer is None else self.consumer.to_dict(),
            pipeline_error=self.pipeline_error,
            feedrate_version=feedrate.__version__,
        )
