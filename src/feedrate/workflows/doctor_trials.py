"""Your settings against a few informative alternatives, measured briefly: the doctor's evidence
for the bottleneck and for too few or too many workers.

Not a search (that is ``tune``): besides your settings, no workers, one worker per usable CPU,
and twice the most tried when those workers mostly wait. A better worker count is measured
again, side by side with yours, before it is claimed. With a consumer, your settings also run
without it (the loader alone), and the consumer is timed alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from torch.utils.data import DataLoader

from feedrate.checks.bottleneck import Pace, bottleneck_finding, bottleneck_kind
from feedrate.checks.machine import shm_finding, task_limit_finding
from feedrate.checks.workers import consumer_worker_finding, worker_count_finding
from feedrate.errors import PipelineError, PipelineTimeoutError, WorkerKilledError
from feedrate.loader.batches import batch_size_of
from feedrate.loader.config import LoaderConfig
from feedrate.loader.rebuild import config_of
from feedrate.machine.facts import MachineFacts
from feedrate.measuring.consumer import Consumer
from feedrate.measuring.device import device
from feedrate.measuring.measure import LoaderSource, measure
from feedrate.measuring.memory_run import consumer_rate
from feedrate.measuring.shm import main_process_batch
from feedrate.results.findings import Finding
from feedrate.results.trial import Trial
from feedrate.search.bottleneck import bottleneck, classify
from feedrate.search.budgets import space_for
from feedrate.search.propose import choose
from feedrate.search.ranks import alike_ranks_busy
from feedrate.search.space import Space, beats, covers, fastest, predict_over_budget, with_workers

#: Seconds of steady state per configuration measured.
TRIAL_SECONDS = 1.5
#: The most workers tried when workers mostly wait (this diagnoses; it does not tune).
LATENCY_CAP = 64
#: Measures one configuration for the comparison: (settings, why, consumer) → its ``Trial``;
#: raises ``PipelineError`` when the pipeline fails. The default runs ``measure``; tests pass
#: a fake, so the comparison's choices are tested on known figures, not on the machine's speed.
MeasureTrial = Callable[[LoaderConfig, str, Consumer | None], Trial]


class Bottlenecks(TypedDict):
    """``Report``'s bottleneck fields: the kind at your settings, and the kind the bottleneck
    finding names where it was read at another configuration and differs (its ``config`` as
    a dict, its ``kind``), else None."""

    bottleneck: str
    alternative_bottleneck: dict[str, Any] | None


def refuse_overflow(
    loader: DataLoader[Any], config: LoaderConfig, facts: MachineFacts, *, timeout_s: float = 30.0
) -> None:
    """Before ``config`` is first started on ``loader`` (tune's baseline): raise
    ``PipelineError`` naming ``task-limit`` and its fixes when its workers need more processes
    and threads than are left, or ``shm-too-small`` when its batches in flight are predicted
    not to fit in /dev/shm (``shm_finding`` at error), sized by one batch made in the main
    process, so no worker starts. Nothing to do without workers."""
    tasks = task_limit_finding(config, facts.to_dict(), at="error")
    if tasks is not None:
        raise PipelineError(
            f"{config.label()} not started, task-limit: {tasks.message}; fix: {tasks.fix}"
        )
    if config.num_workers == 0 or facts.shm_free_bytes is None:
        return
    batch = main_process_batch(loader, timeout_s=timeout_s)
    found = shm_finding(config, facts.to_dict(), batch.bytes)
    if found is not None and found.severity == "error":  # a warning still fits: it runs
        raise PipelineError(
            f"{config.label()} not started, shm-too-small: {found.message}; fix: {found.fix}"
        )


class Comparison:
    """Measure ``loader``'s own settings (``baseline``), then with ``run(alternatives=True)`` the
    alternatives (``trials``) and choose the ``best`` as ``tune`` would among them.
    ``measure_trial``: how one configuration is measured (default: ``measure`` on ``loader``).
    ``measured``: your settings and the best, measured already (by ``tune``), to judge as they
    are."""

    def __init__(
        self,
        loader: DataLoader[Any],
        facts: MachineFacts,
        consumer: Consumer | None,
        *,
        seconds: float = TRIAL_SECONDS,
        timeout_s: float = 30.0,
        measure_trial: MeasureTrial | None = None,
        measured: tuple[Trial, Trial] | None = None,
    ) -> None:
        self.loader, self.facts, self.consumer = loader, facts, consumer
        #: What each trial measures: the loader, or the factory that builds a fresh one.
        self.source: LoaderSource = loader
        self.seconds, self.timeout_s = seconds, timeout_s
        self.measure_trial = measure_trial or self._measured
        self.config = config_of(loader)
        self.baseline: Trial | None = None if measured is None else measured[0]
        self.trials: list[Trial] = []
        self.best: Trial | None = None if measured is None else measured[1]
        self.loader_alone: Trial | None = None
        self.consumer_alone: float | None = None
        #: The node's ranks measuring alike at once (the doctor in every rank of a job).
        self.ranks = 1

    def set_up(self, seconds: float, source: LoaderSource, ranks: int) -> None:
        """A trial's ``seconds``, the ``source`` each trial measures (a factory's: a fresh
        loader each), and the ``ranks`` of the node measuring alike at the same time: each
        trial's busy CPUs are then read within this rank's share (``alike_ranks_busy``)."""
        self.seconds, self.source, self.ranks = seconds, source, ranks

    def run(self, *, alternatives: bool = True, batch: Any = None) -> None:
        """Your settings (a ``PipelineError`` there is raised); then, with ``alternatives``, the
        few that tell, and with a consumer the loader and the consumer alone (the consumer on
        ``batch``, when it is a real step)."""
        self.baseline = self._trial(self.config, "your settings", self.consumer, fatal=True)
        if not alternatives:
            return
        if self.consumer is not None:
            self.loader_alone = self._trial(self.config, "your settings, no consumer", None)
        for cfg, why in self._alternatives():
            self._try(cfg, why)
        extra = self._latency_probe()
        if extra is not None:
            self._try(*extra)
        self._choose()
        self._confirm()
        if self.consumer is not None:
            self.consumer_alone = consumer_rate(
                self.consumer, batch, batch_size_of(self.loader), device=device()
            )

    @property
    def all_trials(self) -> list[Trial]:
        """Your settings first, then the alternatives in the order measured."""
        return [t for t in [self.baseline, *self.trials] if t is not None]

    def measured(self) -> list[Trial]:
        return [t for t in self.all_trials if t.measured]

    def _measured(self, cfg: LoaderConfig, why: str, consumer: Consumer | None) -> Trial:
        m = measure(
            self.source,
            cfg,
            seconds=self.seconds,
            windows_count=3,
            timeout_s=self.timeout_s,
            consumer=consumer,
            machine=self.facts,
        )
        return Trial.of(m, why)

    def _trial(
        self, cfg: LoaderConfig, why: str, consumer: Consumer | None, *, fatal: bool = False
    ) -> Trial:
        try:
            return alike_ranks_busy(self.measure_trial(cfg, why, consumer), self.ranks)
        except (WorkerKilledError, PipelineTimeoutError) as exc:
            if fatal:
                raise
            return Trial(cfg, why, error=str(exc))  # this many workers may be what kills it

    def _try(self, cfg: LoaderConfig, why: str) -> None:
        space = self._space()
        skip = predict_over_budget(space, self.measured(), cfg)
        trial = Trial(cfg, why, skipped=skip) if skip else self._trial(cfg, why, self.consumer)
        self.trials.append(trial)

    def _space(self) -> Space:
        return space_for(self.facts, self.config, consumer=self.consumer is not None)

    def _with(self, workers: int) -> LoaderConfig:
        """``workers`` persistent workers, your other settings, one thread each."""
        return with_workers(self.config, workers, threads=1)

    def _alternatives(self) -> list[tuple[LoaderConfig, str]]:
        cpus, mine = self.facts.cpus_usable, self.config.num_workers
        out = []
        if mine != 0:
            out.append((self._with(0), "no workers"))
        if mine != cpus:
            out.append((self._with(cpus), f"one worker per usable CPU ({cpus})"))
        return out

    def _latency_probe(self) -> tuple[LoaderConfig, str] | None:
        """Twice the most workers tried, when those mostly wait and the fastest so far is not
        faster beyond the noise: one waiting worker overlaps nothing, so it can tie no workers
        (a rank's share of one CPU tries just one), and that is no sign that more would not
        pay."""
        measured = self.measured()
        top = max(measured, key=lambda t: t.config.num_workers, default=None)
        fast = fastest(measured)
        if top is None or fast is None or top.config.num_workers == 0 or beats(fast, top):
            return None
        if bottleneck(top, self.facts.cpus_usable) != "latency":
            return None
        if self.consumer is not None and covers(top):
            return None
        most = top.config.num_workers
        more = min(2 * most, LATENCY_CAP)
        why = f"workers at {most} mostly wait ({top.worker_cpu_mean:.0%} CPU each)"
        return (self._with(more), why) if more > most else None

    def _choose(self) -> None:
        space = self._space()
        self.best = choose(space, self.measured())

    def _confirm(self) -> None:
        """Before claiming a better worker count, measure it and yours again, interleaved."""
        if self.worker_count_finding() is None or self.best is None or self.baseline is None:
            return
        for t in (self.best, self.baseline):
            again = self._trial(t.config, "measured again, side by side", self.consumer)
            if t.stall_fraction is not None and again.stall_fraction is not None:
                t.stall_fraction = (t.stall_fraction + again.stall_fraction) / 2
            t.pool(again)
        self._choose()

    def worker_count_finding(self) -> Finding | None:
        """Too few or too many workers, against the best measured (with a consumer: the fewest
        that keep it fed)."""
        if self.baseline is None or self.best is None:
            return None
        if self.consumer is not None:
            return consumer_worker_finding(self.baseline, self.best)
        most = max(t.config.num_workers for t in self.measured())
        growing = self.best.config.num_workers == most and (
            bottleneck(self.best, self.facts.cpus_usable) == "latency"
        )
        return worker_count_finding(self.baseline, self.best, growing)

    def subject(self) -> tuple[Trial | None, Pace | None, Trial | None]:
        """The run the bottleneck is read from, the consumer's pace, and a faster run without
        workers to compare with. Without a consumer: the best configuration (the pipeline at its
        best); when that has no workers, your settings (or the fastest with workers) against it,
        which tells why workers do not pay. With a consumer: your settings, with each side
        measured alone."""
        if self.consumer is not None:
            if self.baseline is None or not self.baseline.measured:
                return None, None, None
            uses_cpu = self.consumer.kind == "step"
            pace = Pace(self.baseline, self.loader_alone, self.consumer_alone, uses_cpu)
            return self.baseline, pace, None
        best = self.best
        if best is None or best.config.num_workers > 0:
            return best, None, None
        with_workers = [t for t in self.measured() if t.config.num_workers > 0]
        mine = [t for t in with_workers if t is self.baseline]
        other = mine[0] if mine else fastest(with_workers)
        if other is None:
            return best, None, None
        if beats(best, other):
            return other, None, best
        # No workers is only within the noise: what the workers show, unless they show an
        # idle wait that more workers would fill (then workers would have been faster).
        kind = classify(other, self.facts.cpus_usable, batch_size_of(self.loader))
        return (best if kind in ("latency", "unknown") else other), None, None

    def bottleneck_finding(self) -> Finding | None:
        subject, pace, no_workers = self.subject()
        if subject is None or not subject.measured:
            return None
        consumer = self.consumer is not None
        cpus, batch_size = self.facts.cpus_usable, batch_size_of(self.loader)
        return bottleneck_finding(
            subject, cpus, consumer, batch_size=batch_size, pace=pace, no_workers=no_workers
        )

    def bottleneck_kind(self) -> str:
        subject, pace, no_workers = self.subject()
        if subject is None or not subject.measured:
            return ""
        cpus, batch_size = self.facts.cpus_usable, batch_size_of(self.loader)
        return bottleneck_kind(subject, cpus, batch_size, pace, no_workers)

    def bottlenecks(self) -> Bottlenecks:
        """The kind at your settings, for the report's header, and, where the finding's kind
        (``bottleneck_kind``) was read at another configuration and differs, that one, to be
        shown beside it. Where the best is yours, or with a consumer (judged at yours), the
        finding's kind is yours, read with the alternatives as evidence."""
        subject, _, _ = self.subject()
        found, base = self.bottleneck_kind(), self.baseline
        if base is None or not base.measured or subject is None or subject.config == base.config:
            return {"bottleneck": found, "alternative_bottleneck": None}
        best = self.best is not None and self.best.config == base.config
        mine = found if best else self._kind_alone(base)
        elsewhere = {"config": subject.config.to_dict(), "kind": found}
        return {"bottleneck": mine, "alternative_bottleneck": None if found == mine else elsewhere}

    def _kind_alone(self, base: Trial) -> str:
        """``classify`` of your settings where a faster configuration was measured. Without
        workers and its main process computing, that is main-process-bound: "no-workers"
        (fastest without workers) would claim what the faster one disproves."""
        kind = classify(base, self.facts.cpus_usable, batch_size_of(self.loader))
        return "main-process" if kind == "no-workers" else kind
