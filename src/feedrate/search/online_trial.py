"""One online trial of ``autotune`` in progress: per batch the samples delivered, the wait in
``next()`` and the loop's step after, and its rate and spread when it is done. Workers started
together deliver in rounds (one batch each, then a gap as long as one worker's batch), so a
trial is judged on whole rounds: a run of batches inside a burst would read the queue's drain
rate (hundreds of thousands of samples/s), not the pipeline's. Pure and clock-free: ``now``
comes in with every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from feedrate.loader.config import LoaderConfig
from feedrate.results.processes import ProbeReport
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial, probe_fields

#: A trial measures at least this many batches and seconds, after its warm-up batches.
TRIAL_BATCHES = 12
TRIAL_S = 0.5

#: A trial whose loop waits more than this share of the time ends after half as many batches,
#: when it delivers under ``BEHIND`` of the fastest trial so far (its ``rival``, where there is
#: one): it is known to be slower. One that may lead is measured in full: after a switch a pool
#: of workers takes a few hundred ms to reach its pace (skewed CPU cost, 8 workers on 2 CPUs:
#: within 3% of 2 workers over a quarter second, 20-40% ahead over half a second).
STARVED = 0.5
BEHIND = 0.8

#: Windows an online trial's rate is measured in (for its spread).
TRIAL_WINDOWS = 4


#: A trial measures at least this many whole rounds of its workers' deliveries.
MIN_ROUNDS = 2

#: An epoch too short for a trial's warm-up and whole rounds is timed whole, and a trial of
#: such epochs (alone, not a rank of a job) times this many: one epoch is one figure, with no
#: spread to say how far it can be trusted.
WHOLE_EPOCHS = 2


def window_rates(
    samples: list[int],
    waits: list[float],
    steps: list[float],
    windows: int = TRIAL_WINDOWS,
    round_batches: int = 1,
) -> list[float]:
    """Samples/s delivered to the loop in up to ``windows`` equal runs of consecutive batches
    (at least 3 batches each, or, with ``round_batches`` over 1, whole rounds of that many; a
    remainder left out): a run's samples over its waits and steps (s). The spread of an online
    trial is taken over these."""
    rounds = len(steps) // round_batches
    if round_batches > 1 and rounds:
        k = min(windows, rounds)
        size = rounds // k * round_batches
    else:
        k = max(1, min(windows, len(steps) // 3))
        size = max(1, len(steps) // k)
    rates = []
    for i in range(0, size * k, size):
        span = sum(waits[i : i + size]) + sum(steps[i : i + size])
        rates.append(sum(samples[i : i + size]) / span if span > 0 else 0.0)
    return rates


def at_epoch_end(config: LoaderConfig) -> int:
    """Batches in whole rounds a trial of ``config`` begun at a switch (its lane started while
    the one before drained) must have measured to be concluded at an epoch's end (no time is
    asked of it there, as mid-epoch), at least 4: one round more than the queue. The queue may
    hold that many batches ready when the window opens, and they arrive in a burst with no
    round's gap among them (16 workers concluded on one such round read 45,000 samples/s at no
    CPU)."""
    rnd = max(1, config.num_workers)
    return max(4, config.queue_depth + rnd)


@dataclass
class TrialTiming:
    """The trial in progress: per batch the samples, the wait in ``next()`` and the step after
    (s). Its first ``warmup`` batches (made while the lane started) are not measured: the
    window opens after them (``opened``, at ``began``). It is judged on whole rounds of
    ``round_batches`` (its worker count) and measures at least ``need`` batches; with
    ``whole_epoch`` (an epoch too short for a warm-up and whole rounds) it measures whole
    epochs from their ``iter()``, the wait for the workers included, each one window
    (``epochs``, continued by ``next_epoch``)."""

    config: LoaderConfig
    reason: str
    warmup: int
    round_batches: int = 1
    need: int = TRIAL_BATCHES
    whole_epoch: bool = False
    bounded: bool = True  # planned for an epoch of known length
    began: float = 0.0
    started: bool = False
    opened: bool = False
    samples: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)  # of each wait, on a CPU (the hand-off)
    batch_bytes: int | None = None  # of the first batch: the search reads it (copies)
    rival: float | None = None  # samples/s of the fastest trial so far, where there is one
    from_switch: bool = False  # began at a switch within an epoch (a lane started meanwhile)
    startup_s: float = 0.0  # its lane's workers took this long to start
    #: Timed whole: per measured epoch, the batch it began at (of the measured ones) and the
    #: seconds its ``iter()`` took before the lane ran (workers resumed or started), which
    #: every epoch pays, as a static measurement counts.
    marks: list[int] = field(default_factory=list)
    leads: list[float] = field(default_factory=list)

    @classmethod
    def planned(
        cls,
        config: LoaderConfig,
        reason: str,
        warmup: int,
        epoch_length: int | None,
        least: int = 0,
        fresh_lane: bool = False,
        epochs: int = WHOLE_EPOCHS,
    ) -> TrialTiming:
        """A trial of ``config``: whole rounds of its workers, at least ``MIN_ROUNDS`` of them,
        ``TRIAL_BATCHES`` and ``least`` (batches); in epochs of ``epoch_length`` batches (None:
        unknown) too short for its warm-up and one whole round, ``epochs`` whole epochs
        instead. A warm-up is rounded up to whole rounds: a window opened inside the first round
        would count its burst. An epoch timed whole on a ``fresh_lane`` of persistent workers is
        their start-up, which training pays once: it is all warm-up (nothing measured), and the
        lane's next epochs are the trial."""
        rnd = max(1, config.num_workers)
        if warmup and rnd > 1:
            warmup = -(-warmup // rnd) * rnd  # whole rounds, so the window opens on a round's end
        need = max(TRIAL_BATCHES, MIN_ROUNDS * rnd, least)
        if epoch_length is not None:
            fits = (epoch_length - warmup) // rnd * rnd
            if fits < rnd:
                once = fresh_lane and config.persistent_workers and config.num_workers > 0
                first = epoch_length if once else 0
                need = epoch_length * max(1, epochs)
                return cls(config, reason, first, 1, need, whole_epoch=True)
            need = min(need, fits)
        return cls(config, reason, warmup, rnd, need, bounded=epoch_length is not None)

    @property
    def measured(self) -> int:
        return max(0, len(self.steps) - self.warmup)

    @property
    def aligned(self) -> int:
        """Measured batches in whole rounds."""
        return self.measured - self.measured % self.round_batches

    def start(self, now: float, lead_s: float | None = None) -> None:
        """Its lane runs from ``now``: with ``lead_s``, from an epoch's start, its ``iter()``
        having taken that long (else from a switch within the epoch). With no warm-up the window
        opens now; timed whole, it counts only from an epoch's start."""
        self.started = True
        self.from_switch = lead_s is None
        if self.warmup == 0:
            self._open(now)
            if self.whole_epoch and lead_s is not None:
                self.marks, self.leads = [0], [lead_s]

    def goes_on(self, config: LoaderConfig) -> bool:
        """Timed whole, begun, with epochs still to time on the same lane of ``config``."""
        return (
            self.whole_epoch
            and bool(self.marks)  # set when its window opened at an epoch's start
            and 0 < self.measured < self.need
            and config == self.config
        )

    def next_epoch(self, lead_s: float) -> None:
        """The next epoch of a trial timed whole begins, its ``iter()`` having taken
        ``lead_s``."""
        self.marks.append(self.measured)
        self.leads.append(lead_s)

    def add(self, samples: int, wait: float, step: float, now: float, busy: float = 0.0) -> None:
        self.samples.append(samples)
        self.waits.append(wait)
        self.steps.append(step)
        self.busy.append(busy)
        if len(self.steps) == self.warmup:
            self._open(now)

    def _open(self, now: float) -> None:
        self.began, self.opened = now, True

    def done(self, now: float) -> bool:
        """Enough measured, on a whole round; a loop starved most of the time is judged on
        half as much, but never on fewer than ``MIN_ROUNDS`` rounds (the verdict is plain, and
        every batch of it costs training time; the first round after a switch is the slowest),
        and, with a ``rival``, only while it delivers under ``BEHIND`` of it: a loop that does
        nothing is starved by every configuration, and one that may lead is measured whole."""
        m = self.measured
        if self.whole_epoch:
            return m >= self.need
        if m % self.round_batches:
            return False
        if m >= self.need and now - self.began >= TRIAL_S:
            return True
        least = max(self.need // 2, min(self.need, MIN_ROUNDS * self.round_batches))
        if m < least or now - self.began < TRIAL_S / 2:
            return False
        waited = sum(self.waits[self.warmup :])
        span = waited + sum(self.steps[self.warmup :])
        if waited <= STARVED * span:
            return False
        if self.rival is None or span <= 0:
            return True
        return sum(self.samples[self.warmup :]) / span < BEHIND * self.rival

    def epoch_done(self) -> bool:
        """At an epoch's end: enough to conclude on. Timed whole: all its epochs. A window
        opened within the stream (after a warm-up, or at a switch) may begin with the queue
        full of batches made before it, and at the epoch's end nothing is in the making to
        balance them (the last round of a 256-batch epoch at 64 workers, after 192 batches of
        warm-up, read 10,500 samples/s at no CPU): ``at_epoch_end`` batches, else it starts
        over with the next epoch. One opened at the epoch's start, whose queue began empty: a
        whole round (where the epoch's length is unknown, 4 batches do)."""
        if self.whole_epoch:
            return self.measured >= self.need
        if not self.bounded:
            return self.measured >= 4
        if self.from_switch or self.warmup:
            return self.aligned >= at_epoch_end(self.config)
        return self.aligned >= max(4, self.round_batches)  # its queue began empty

    def full(self) -> bool:
        """Enough measured by batch count alone (``need``, on a whole round): the end of a
        trial every rank of a job reaches at the same batch, whatever its clock says."""
        m = self.measured
        return m >= self.need and (self.whole_epoch or m % self.round_batches == 0)

    def seconds_per_batch(self) -> float | None:
        """The loop's seconds per measured batch (its wait and step), None before any."""
        n = self.measured
        if n == 0:
            return None
        return (sum(self.waits[self.warmup :]) + sum(self.steps[self.warmup :])) / n

    def result(self, rate: float | None, processes: ProbeReport | None) -> Trial:
        """The measured batches, in whole rounds, as a Trial: the rate delivered to the loop,
        the figure it is compared by (its spread over ``window_rates``), the stall, and what
        ``processes`` saw. With the consumer's ``rate`` the stall is the larger of the one
        measured and ``1 - delivered / rate``: a loop slower than ``rate`` never shows whether
        the loader could keep up."""
        end = self.warmup + (self.aligned or self.measured)
        w, s = self.waits[self.warmup : end], self.steps[self.warmup : end]
        n = self.samples[self.warmup : end]
        lead = sum(self.leads)  # epochs timed whole: from their iter(), as measure does
        total = sum(w) + sum(s) + lead
        busy = sum(self.busy[self.warmup : end])  # the loop's thread on a CPU in next()
        delivered = sum(n) / total if total > 0 else 0.0
        stall = (sum(w) + lead) / total if total > 0 else None
        if rate is not None and stall is not None:
            stall = max(stall, 1.0 - delivered / rate)
        return Trial(
            config=self.config,
            reason=self.reason,
            samples_per_s=delivered,
            spread=Spread.of_rates(
                self._epoch_rates(n, w, s)  # an epoch's runs would be bursts
                if self.whole_epoch
                else window_rates(n, w, s, round_batches=self.round_batches),
                "mad",
                span=True,  # judged on what it delivered: see Spread
            ),
            stall_fraction=stall,
            wait_cpu=min(1.0, busy / sum(w)) if sum(w) > 0 else None,
            receive_cpu=busy / total if total > 0 else None,
            startup_s=self.startup_s,
            batch_bytes=self.batch_bytes,
            **(probe_fields(processes) if processes is not None else {}),
        )

    def _epoch_rates(self, n: list[int], w: list[float], s: list[float]) -> list[float]:
        """Timed whole: each epoch's samples over its time, its ``iter()`` included."""
        marks = self.marks or [0]
        leads = self.leads or [0.0]
        rates = []
        for i, (a, lead) in enumerate(zip(marks, leads, strict=False)):
            b = marks[i + 1] if i + 1 < len(marks) else len(s)
            span = sum(w[a:b]) + sum(s[a:b]) + lead
            if b > a and span > 0:
                rates.append(sum(n[a:b]) / span)
        return rates
