"""The online tuner (``search.tuner``) and the search step it shares with tune
(``search.plan.next_trial``), driven with made-up observations and a fake clock: when a trial is
done, the starved early stop, settling on the cheapest configuration that keeps the loop fed,
the budget stopping a round, a configuration predicted over budget skipped, the thread-safety
check asked for as an action, and the re-tune decision. Nothing here depends on the machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from feedrate.loader.config import LoaderConfig
from feedrate.results.evidence import ThreadCheck
from feedrate.results.processes import ProbeReport, ProcessFigures
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial, probe_fields
from feedrate.search.actions import CheckThreads, Settle, Try
from feedrate.search.online_trial import (
    BEHIND,
    TRIAL_BATCHES,
    TRIAL_S,
    TrialTiming,
    at_epoch_end,
    window_rates,
)
from feedrate.search.plan import next_trial
from feedrate.search.propose import propose_online
from feedrate.search.space import RESOLVED_REPEATS, Proposal, Space
from feedrate.search.tuner import OnlineTuner, online
from feedrate.search.watch import RETUNE_STALL, WATCH_BATCHES

MiB = 2**20


def processes(cfg: LoaderConfig, worker_cpu: float = 0.1) -> ProbeReport:
    """What a probe would report: workers that mostly wait (``worker_cpu`` of a core each)."""
    workers = [
        ProcessFigures("worker", worker_id=i, cpu_util=worker_cpu, uss_bytes=100 * MiB)
        for i in range(cfg.num_workers)
    ]
    main = ProcessFigures("main", cpu_util=0.2, uss_bytes=200 * MiB)
    return ProbeReport(wall_s=1.0, main=main, workers=workers, system_busy_cpus=0.5)


class Loop:
    """A training loop as ``AutoLoader`` feeds the tuner, on a fake clock: each worker makes a
    batch every ``batch_s`` (no workers: the loop makes it, all of it waited for), the loop's
    step takes ``step_s``; a switch of lanes is instant."""

    def __init__(
        self,
        tuner: OnlineTuner,
        *,
        batch_s: float,
        step_s: float,
        check: ThreadCheck | None = None,
    ) -> None:
        self.tuner, self.batch_s, self.step_s, self.check = tuner, batch_s, step_s, check
        self.now = 0.0
        self.actions: list[object] = []

    def wait(self, cfg: LoaderConfig) -> float:
        w = cfg.num_workers * cfg.threads
        return self.batch_s if w == 0 else max(0.0, self.batch_s / w - self.step_s)

    def epoch(self, batches: int) -> None:
        tuner = self.tuner
        tuner.new_epoch(batches)
        tuner.lane_started(self.now)
        for _ in range(batches):
            cfg = tuner.trial.config if tuner.trial is not None else tuner.config
            wait = self.wait(cfg)
            self.now += wait + self.step_s
            size = 4096 if tuner.wants_batch_bytes else None
            tuner.observe(16, wait, self.step_s, self.now, size)
            if tuner.trial_done(self.now):
                self.conclude(cfg, drain=True)
        if tuner.trial is not None and tuner.trial.epoch_done():  # as AutoLoader's epoch end
            self.conclude(tuner.trial.config, drain=False)

    def conclude(self, cfg: LoaderConfig, *, drain: bool) -> None:
        action = self.tuner.conclude(self.now, processes(cfg))
        self.actions.append(action)
        while isinstance(action, CheckThreads):
            assert self.check is not None, "the tuner asked for a thread check"
            action = self.tuner.threads_checked(self.check, self.now)
            self.actions.append(action)
        move = (action.config, action.why) if isinstance(action, Try) else None
        if isinstance(action, Settle) and action.config != self.tuner.config:
            move = action.config, "settled"
        if move is not None:
            self.tuner.moved(*move, drain=drain)
            if drain:  # the next lane takes over at once
                self.tuner.switched(self.now)


def tuner_from(
    workers: int, *, settled: bool = False, stall: float | None = None, **space_kw: object
) -> OnlineTuner:
    start = online(LoaderConfig(workers))
    space = Space(cpus=4, baseline=start, max_workers=32, consumer=True, **space_kw)  # type: ignore[arg-type]
    return OnlineTuner(
        space,
        start,
        "test",
        settled=settled,
        settled_stall=stall,
        warmup=lambda cfg: cfg.num_workers + 2,
    )


def timing(wait: float, step: float, batches: int) -> TrialTiming:
    st = TrialTiming(LoaderConfig(2), "test", warmup=0)
    for i in range(batches):
        st.add(16, wait, step, (i + 1) * (wait + step))
    return st


def test_a_trial_is_done_after_enough_batches_and_seconds() -> None:
    assert timing(0.01, 0.09, TRIAL_BATCHES).done(TRIAL_S)
    assert not timing(0.01, 0.09, TRIAL_BATCHES - 1).done(TRIAL_S)  # too few batches
    assert not timing(0.01, 0.09, TRIAL_BATCHES).done(TRIAL_S * 0.9)  # too short


def test_a_trial_says_what_share_of_the_loop_s_wait_it_spent_on_a_cpu() -> None:
    # The hand-off's cost in the main process: the loop on a CPU while it waits in next(),
    # over the measured batches only (the warm-up's receive a queue made before the window),
    # as a share of the wait and per second of the trial.
    tuner = tuner_from(2)
    tuner.new_epoch(None)
    tuner.lane_started(0.0)
    trial = tuner.trial
    assert trial is not None and trial.warmup == 4
    for i in range(4 + 16):
        tuner.observe(16, 0.010, 0.030, (i + 1) * 0.04, busy=0.001 if i < 4 else 0.006)
    result = trial.result(None, None)
    assert result.wait_cpu == pytest.approx(0.6)
    assert result.receive_cpu == pytest.approx(0.15)  # of the loop's time: against the workers'
    # A loop slower than the rate asked for reads a larger stall; not a larger hand-off.
    assert trial.result(1e9, None).receive_cpu == pytest.approx(0.15)


def test_a_starved_trial_is_judged_on_half_as_many_batches() -> None:
    half, t_half = TRIAL_BATCHES // 2, TRIAL_S / 2
    assert timing(0.09, 0.01, half).done(t_half)  # waits 90%: plain already
    assert not timing(0.01, 0.09, half).done(t_half)  # fed: measured in full
    assert not timing(0.09, 0.01, half - 1).done(t_half)
    assert timing(0.01, 0.09, TRIAL_BATCHES).done(TRIAL_S)


def test_a_starved_trial_that_may_lead_is_measured_in_full() -> None:
    # A loop that does nothing is starved by every configuration: a starved trial ends early
    # only once it is known to be slower (under BEHIND of the fastest so far, its rival).
    half, t_half = TRIAL_BATCHES // 2, TRIAL_S / 2
    rate = 16 / 0.1  # timing()'s: 16 samples per 0.1 s
    ahead = timing(0.09, 0.01, half)
    ahead.rival = rate
    assert not ahead.done(t_half)  # as fast as the best so far: measured in full
    behind = timing(0.09, 0.01, half)
    behind.rival = rate / (BEHIND * 0.9)
    assert behind.done(t_half)  # plainly slower: half is enough


def test_each_trial_after_the_first_has_the_fastest_so_far_as_its_rival() -> None:
    tuner = tuner_from(2)
    assert tuner.trial is not None and tuner.trial.rival is None  # nothing measured yet
    tuner.new_epoch(None)
    tuner.lane_started(0.0)
    now = 0.0
    while not tuner.trial_done(now):  # a loop that does nothing: starved
        now += 0.05
        tuner.observe(16, 0.05, 0.0, now, 4096)
    action = tuner.conclude(now, processes(tuner.config))
    assert isinstance(action, Try)
    tuner.moved(action.config, action.why, drain=False)
    assert tuner.trial is not None
    assert tuner.trial.rival == pytest.approx(tuner.trials[0].median)


def test_warm_up_batches_are_not_measured_and_open_the_window() -> None:
    st = TrialTiming(LoaderConfig(2), "test", warmup=3)
    st.start(10.0)
    assert not st.opened
    for i in range(3):
        st.add(16, 1.0, 0.0, 11.0 + i)  # slow start-up batches
    assert st.opened and st.began == 13.0 and st.measured == 0
    for i in range(6):
        st.add(16, 0.0, 0.1, 13.1 + 0.1 * i)
    trial = st.result(None, None)
    assert trial.stall_fraction == 0.0 and trial.samples_per_s == pytest.approx(160.0)


def test_window_rates_are_the_samples_over_the_time_of_each_run_of_batches() -> None:
    samples, waits, steps = [10] * 13, [0.0] * 13, [0.1] * 6 + [0.2] * 7
    # 13 batches: 4 runs of 3, the last batch left out.
    assert window_rates(samples, waits, steps) == pytest.approx([100, 100, 50, 50])
    assert window_rates([10] * 5, [0.05] * 5, [0.05] * 5) == pytest.approx([100])
    assert window_rates([], [], []) == [0.0]


def test_an_online_trial_maps_the_probe_as_tune_does() -> None:
    # One mapping from the probe's figures to a Trial's, shared with Trial.of.
    report = processes(LoaderConfig(3), worker_cpu=0.4)
    report.workers[0].pss_bytes, report.shm_peak_bytes = 70 * MiB, 5 * MiB
    trial = timing(0.0, 0.1, 12).result(None, report)
    for name, value in probe_fields(report).items():
        assert getattr(trial, name) == value, name
    assert trial.workers_cpu == pytest.approx(1.2) and trial.worker_uss_max_bytes == 100 * MiB
    assert trial.spread is not None and trial.spread.estimator == "mad"


def test_a_rate_above_what_the_loop_took_counts_as_a_stall() -> None:
    trial = timing(0.0, 0.1, 12).result(1600.0, None)  # delivered 160 samples/s of 1600
    assert trial.stall_fraction == pytest.approx(0.9)


def test_settles_on_the_cheapest_configuration_that_keeps_the_loop_fed() -> None:
    # A worker makes a batch every 100 ms, the step takes 50 ms: 2 workers feed it, 1 does not.
    tuner = tuner_from(4)
    loop = Loop(tuner, batch_s=0.1, step_s=0.05)
    for _ in range(4):
        loop.epoch(50)
    report = tuner.report
    assert report.settled and tuner.config.num_workers == 2
    assert [t.config.num_workers for t in tuner.trials] == [4, 2, 1]
    two, one = online(LoaderConfig(2)).label(), online(LoaderConfig(1)).label()
    assert [e.what for e in report.events] == [f"try {two}", f"try {one}", f"settled on {two}"]
    assert "keeps the step fed" in report.events[-1].why
    assert tuner.settled_stall == 0.0


def test_tunes_again_when_steps_get_faster() -> None:
    tuner = tuner_from(4)
    loop = Loop(tuner, batch_s=0.1, step_s=0.05)
    for _ in range(4):
        loop.epoch(50)  # slow steps: few workers suffice
    assert tuner.report.settled
    before = tuner.config.num_workers
    loop.step_s = 0.005  # "compiled": the loop now waits on data
    for _ in range(40):
        loop.epoch(50)
    report = tuner.report
    assert report.retunes >= 1
    assert any(e.what == "tune again" for e in report.events)
    assert tuner.config.num_workers >= before
    assert report.settled and tuner.config.num_workers > before  # it found more workers


def test_one_noisy_watch_window_does_not_tune_again() -> None:
    tuner = tuner_from(2, settled=True, stall=0.0)
    tuner.new_epoch(None)
    now = 0.0
    for window in range(6):
        wait = 0.05 if window % 2 == 0 else 0.0  # every other window stalls 50%
        for _ in range(WATCH_BATCHES):
            now += wait + 0.05
            tuner.observe(16, wait, 0.05, now)
    assert tuner.report.retunes == 0 and tuner.report.settled


def test_a_loop_that_cannot_be_fed_is_not_re_tuned_from_the_cache() -> None:
    # Settled with a stall the loop's own pace leaves (cached): the same stall is no stall come
    # back; without a cached one, the first window is the reference.
    for stall in (0.9, None):
        tuner = tuner_from(2, settled=True, stall=stall)
        tuner.new_epoch(None)
        now = 0.0
        for _ in range(10 * WATCH_BATCHES):
            now += 0.1
            tuner.observe(16, 0.09, 0.01, now)
        assert tuner.report.retunes == 0
        assert tuner.settled_stall is not None and tuner.settled_stall > RETUNE_STALL


def test_the_budget_stops_a_round() -> None:
    start = online(LoaderConfig(1))
    space = Space(cpus=4, baseline=start, max_workers=32, consumer=True)
    tuner = OnlineTuner(
        space, start, "test", settled=False, settled_stall=None, warmup=lambda c: 1, budget_s=0.01
    )
    loop = Loop(tuner, batch_s=0.2, step_s=0.01)  # starved: more workers would be next
    loop.epoch(50)
    assert tuner.report.settled and len(tuner.trials) == 1
    assert [e.what for e in tuner.report.events][:1] == ["stop trying"]
    assert "budget_s=0.01" in tuner.report.events[0].why
    assert isinstance(loop.actions[0], Settle)


def test_more_workers_stop_at_the_memory_budget_not_short_of_it() -> None:
    # 100 MiB a worker (the main process, there with any setting, not counted): 7 workers fit
    # 750 MiB, 8 would not. Starved at 4, the step up goes to the 7 that fit (it used to aim
    # past them, skip, and stop at 4).
    tuner = tuner_from(4, memory_budget=750 * MiB)
    loop = Loop(tuner, batch_s=0.4, step_s=0.01)  # starved at 4: more workers would help
    loop.epoch(60)
    tried = [t.config.num_workers for t in tuner.trials]
    assert 7 in tried and max(tried) == 7, tried
    assert not any(t.skipped for t in tuner.trials)
    seven = next(t for t in tuner.trials if t.config.num_workers == 7)
    assert "up to 7: the memory budget" in seven.reason


def test_threads_are_tried_only_after_the_check_the_tuner_asks_for() -> None:
    for ok in (True, False):
        check = ThreadCheck(ok=ok, error=None if ok else "boom")
        tuner = tuner_from(2, max_threads=8, allow_threads=True)
        loop = Loop(tuner, batch_s=0.4, step_s=0.01, check=check)  # workers mostly wait
        loop.epoch(60)
        asks = [a for a in loop.actions if isinstance(a, CheckThreads)]
        assert [a.threads for a in asks] == [8]  # once, before the first threaded trial
        after = loop.actions[loop.actions.index(asks[0]) + 1]
        threaded = isinstance(after, Try) and after.config.threads == 8
        assert threaded == ok
        if not ok:
            assert any(e.what == "no threads" and "boom" in e.why for e in tuner.report.events)
            assert all(t.config.threads == 1 for t in tuner.trials)


def test_a_lane_that_fails_to_start_is_recorded_and_the_one_in_use_measured_again() -> None:
    tuner = tuner_from(2)
    running = tuner.config
    tuner.new_epoch(None)
    tuner.lane_started(0.0)
    tuner.moved(online(LoaderConfig(8)), "more", drain=True)  # its lane starts beside the drain
    tuner.move_failed((LoaderConfig(8), "more"), "no space left in /dev/shm", 1.0, running)
    assert tuner.trials[-1].error == "did not start: no space left in /dev/shm"
    assert tuner.config == running and tuner.pending is None
    assert tuner.report.events[-1].what == f"stay on {running.label()}"
    trial = tuner.trial
    assert trial is not None and trial.config == running
    assert trial.warmup == 2 + 2 and not trial.opened  # the lane went on after its drain: its
    # queue starts empty, and its first batches are not measured


@pytest.mark.parametrize("settled", [False, True])
def test_a_start_that_fails_tunes_from_the_loader_s_own_settings(settled: bool) -> None:
    # The start (34 workers, or a count cached elsewhere: settled) did not start; the loader's
    # own settings run instead, and the search goes on from them, not from the start.
    tuner = tuner_from(34, settled=settled, stall=0.0 if settled else None)
    own = online(LoaderConfig(0))
    tuner.start_failed("Resource temporarily unavailable", 0.5, own, first=True)
    assert tuner.config == own and not tuner.report.settled
    assert tuner.space.baseline == own
    assert tuner.trials[-1].config == online(LoaderConfig(34))
    assert tuner.trials[-1].error == "did not start: Resource temporarily unavailable"
    assert tuner.report.events[-1].what == f"run {own.label()}"
    assert tuner.trial is not None and tuner.trial.config == own


# --- the step tune and autotune share ------------------------------------------------------


def scripted(*proposals: Proposal) -> Callable[[Space, list[Trial]], Proposal | None]:
    """A search that proposes ``proposals`` in turn (those with threads only while the space
    has them), each once."""

    def propose(space: Space, trials: list[Trial]) -> Proposal | None:
        tried = {t.config for t in trials}
        for cfg, why in proposals:
            if cfg not in tried and cfg.threads <= space.max_threads:
                return cfg, why
        return None

    return propose


def measured(cfg: LoaderConfig) -> Trial:
    return Trial(
        cfg,
        "test",
        samples_per_s=100.0,
        spread=Spread.of_rates([100.0] * 4),
        main_uss_bytes=200 * MiB,
        worker_uss_max_bytes=100 * MiB,
    )


SPACE = Space(cpus=2, baseline=LoaderConfig(0), max_workers=16, memory_budget=600 * MiB)


def test_next_trial_skips_what_is_predicted_over_budget_then_tries() -> None:
    propose = scripted((LoaderConfig(8), "eight"), (LoaderConfig(2), "two"))
    step = next_trial(SPACE, [measured(LoaderConfig(0))], propose, spent=False)
    assert (step.action, step.config, step.why) == ("try", LoaderConfig(2), "two")
    assert [(t.config, bool(t.skipped)) for t in step.skipped] == [(LoaderConfig(8), True)]


def test_next_trial_stops_when_the_budget_is_spent_or_nothing_is_left() -> None:
    propose = scripted((LoaderConfig(2), "two"))
    trials = [measured(LoaderConfig(0))]
    step = next_trial(SPACE, trials, propose, spent=True)
    assert (step.action, step.config) == ("budget_spent", LoaderConfig(2))
    trials.append(measured(LoaderConfig(2)))
    assert next_trial(SPACE, trials, propose, spent=False).action == "done"


def test_next_trial_keeps_threads_for_the_report_unless_allowed() -> None:
    threaded = LoaderConfig(2, threads=8)
    propose = scripted((threaded, "threads"))
    trials = [measured(LoaderConfig(0))]
    space = replace(SPACE, max_threads=8)
    assert next_trial(space, trials, propose, spent=False).action == "report_only"
    allowed = replace(space, allow_threads=True)
    assert next_trial(allowed, trials, propose, spent=False).action == "check_threads"
    passed = next_trial(allowed, trials, propose, spent=False, thread_check=ThreadCheck(ok=True))
    assert (passed.action, passed.config) == ("try", threaded)
    failed = next_trial(allowed, trials, propose, spent=False, thread_check=ThreadCheck(ok=False))
    assert failed.action == "done"  # the failed check took threads out of the space


def test_the_online_search_steps_through_next_trial() -> None:
    # autotune's proposals go through the same step: a starved trial proposes more workers.
    space = Space(cpus=4, baseline=online(LoaderConfig(2)), max_workers=32, consumer=True)
    trial = replace(measured(online(LoaderConfig(2))), stall_fraction=0.8, workers_cpu=0.2)
    step = next_trial(space, [trial], propose_online, spent=False)
    assert step.action == "try" and step.config is not None and step.config.num_workers > 2


# --- bursts: workers deliver in rounds ----------------------------------------------------------


def feed_rounds(st: TrialTiming, workers: int, batch_s: float, samples: int = 4) -> int:
    """Feed a do-nothing loop's batches from ``workers`` started together: each round's first
    batch waits a worker's whole batch time, the rest of the round is ready. Returns the
    batches fed when the trial was done."""
    now, fed = 0.0, 0
    st.start(now)
    while not st.done(now):
        wait = batch_s if fed % workers == 0 else 0.0
        now += wait
        st.add(samples, wait, 0.0, now)
        fed += 1
        assert fed < 10_000, "the trial never ended"
    return fed


@pytest.mark.parametrize("workers", [8, 64, 128])
def test_an_online_trial_is_judged_on_whole_rounds_not_on_a_burst(workers: int) -> None:
    # The true rate: workers × 4 samples per 0.1 s. Twelve batches inside one burst would
    # read hundreds of thousands of samples/s; whole rounds read the pipeline's rate.
    st = TrialTiming.planned(LoaderConfig(workers), "test", 0, None)
    fed = feed_rounds(st, workers, 0.1)
    assert fed % workers == 0 and fed >= 2 * workers
    trial = st.result(None, None)
    assert trial.samples_per_s == pytest.approx(workers * 4 / 0.1)
    assert trial.median == pytest.approx(workers * 4 / 0.1)


def test_an_epoch_too_short_for_whole_rounds_is_measured_whole() -> None:
    # 20 batches an epoch, 16 workers and a warm-up of 5: no whole round fits after it, so
    # the trial takes whole epochs from their start, the wait for the first round included:
    # two of them alone, one as a rank of a job (every rank decides at each epoch's end).
    assert TrialTiming.planned(LoaderConfig(16), "test", 5, 20).need == 2 * 20
    st = TrialTiming.planned(LoaderConfig(16), "test", 5, 20, epochs=1)
    assert st.whole_epoch and st.warmup == 0 and st.need == 20
    fed = feed_rounds(st, 16, 0.1)
    assert fed == 20
    assert st.result(None, None).samples_per_s == pytest.approx(20 * 4 / 0.2)


def test_window_rates_in_whole_rounds() -> None:
    waits = [1.0 if i % 4 == 0 else 0.0 for i in range(18)]  # rounds of 4, two batches over
    rates = window_rates([2] * 18, waits, [0.0] * 18, windows=4, round_batches=4)
    assert rates == pytest.approx([8.0] * 4)


def test_a_warm_up_shorter_than_a_round_is_rounded_up_to_one() -> None:
    # 94 workers, a warm-up of 32 (a quarter of a 128-batch epoch): a window opened after 32
    # batches would count the rest of the first round's burst. Rounded up to one round, the
    # epoch has no room for another: the trial takes the whole epoch instead.
    st = TrialTiming.planned(LoaderConfig(94), "test", 32, 128)
    assert st.whole_epoch and st.warmup == 0
    longer = TrialTiming.planned(LoaderConfig(16), "test", 5, 1000)
    assert longer.warmup == 16 and longer.round_batches == 16


def whole_epochs(st: TrialTiming, epoch_s: list[float], batches: int = 20) -> None:
    """Time ``st`` over epochs of ``batches`` batches of 4 samples taking ``epoch_s`` each,
    all of it in the first batch's wait (a burst after it), no ``iter()`` time."""
    now = 0.0
    for i, took in enumerate(epoch_s):
        if i == 0:
            st.start(now, lead_s=0.0)
        else:
            assert st.goes_on(st.config)
            st.next_epoch(0.0)
        for b in range(batches):
            wait = took if b == 0 else 0.0
            now += wait
            st.add(4, wait, 0.0, now)


def test_each_epoch_timed_whole_is_one_figure_not_its_bursts() -> None:
    st = TrialTiming.planned(LoaderConfig(16), "test", 5, 20)
    whole_epochs(st, [0.2, 0.4])
    assert not st.goes_on(st.config) and st.epoch_done()
    trial = st.result(None, None)
    assert trial.spread is not None
    assert trial.spread.windows == [pytest.approx(80 / 0.2), pytest.approx(80 / 0.4)]
    assert trial.noise > 0.1  # two epochs apart say how far the figure can be trusted
    assert trial.samples_per_s == pytest.approx(160 / 0.6)


def test_a_trial_timed_whole_goes_on_over_the_next_epoch_of_its_lane() -> None:
    # 20-batch epochs, 16 workers: the trial is timed whole over two epochs of the same lane;
    # it is not concluded at the first epoch's end, and the second's iter() is counted.
    tuner = tuner_from(16)
    tuner.new_epoch(20)
    tuner.lane_started(0.0, False, 0.0)
    first = tuner.trial
    assert first is not None and first.whole_epoch
    for i in range(20):
        tuner.observe(4, 0.1 if i == 0 else 0.0, 0.0, 0.1)
    assert not first.epoch_done()
    tuner.new_epoch(20)
    tuner.lane_started(0.1, False, 0.3)
    assert tuner.trial is first and first.leads == [0.0, 0.3]
    for i in range(20):
        tuner.observe(4, 0.1 if i == 0 else 0.0, 0.0, 0.5)
    assert first.epoch_done()
    tuner.conclude(0.5, None)
    trial = tuner.trials[-1]
    assert trial.spread is not None
    assert sorted(trial.spread.windows) == [pytest.approx(80 / 0.4), pytest.approx(80 / 0.1)]


def test_a_trial_timed_whole_that_began_within_an_epoch_starts_with_the_next() -> None:
    # A lane that took over after a drain, within the epoch: its batches are not an epoch
    # from its iter(), so the trial counts from the next epoch's start.
    tuner = tuner_from(16)
    tuner.new_epoch(20)
    tuner.moved(online(LoaderConfig(16)), "test", drain=True)
    tuner.switched(1.0)
    part = tuner.trial
    assert part is not None and part.whole_epoch and not part.marks
    for _ in range(12):
        tuner.observe(4, 0.0, 0.0, 1.0)
    assert not part.epoch_done()
    tuner.new_epoch(20)
    tuner.lane_started(1.1, False, 0.2)
    assert tuner.trial is not part and tuner.trial is not None
    assert tuner.trial.marks == [0] and tuner.trial.leads == [0.2]


def test_a_new_persistent_lane_on_a_short_epoch_is_timed_on_its_next_epoch() -> None:
    # 20 batches an epoch, timed whole. On a lane whose persistent workers were just started,
    # the epoch carries their start-up, which training pays once: it measures nothing, and the
    # next epoch of the same lane (not fresh) is the trial. Workers that restart every epoch
    # pay it every epoch: their trial is the fresh epoch itself.
    kept = LoaderConfig(16, prefetch_factor=2, persistent_workers=True)
    first = TrialTiming.planned(kept, "test", 5, 20, fresh_lane=True)
    assert first.whole_epoch and first.warmup == 20
    for _ in range(20):
        first.add(4, 0.5, 0.0, 1.0)  # the start-up: slow batches
    assert first.measured == 0  # nothing of it counts
    later = TrialTiming.planned(kept, "test", 5, 20)
    assert later.whole_epoch and later.warmup == 0 and later.need == 2 * 20
    restarted = TrialTiming.planned(LoaderConfig(16), "test", 5, 20, fresh_lane=True)
    assert restarted.whole_epoch and restarted.warmup == 0


def test_a_warm_up_is_not_cut_to_fit_a_short_epoch() -> None:
    # 42 workers, pf=2: a warm-up of 126 batches in a 128-batch epoch. Cut to a quarter of the
    # epoch (32, a round: 42), the window after it would count the queue's burst; the trial is
    # timed whole instead.
    tuner = tuner_from(2)
    tuner._warmup_of = lambda c: 3 * c.num_workers
    tuner.new_epoch(128)
    cfg = LoaderConfig(42, prefetch_factor=2, persistent_workers=True)
    assert tuner._warmup(cfg) == 126
    assert tuner._timing(cfg, "test", tuner._warmup(cfg)).whole_epoch


def test_an_epoch_timed_whole_counts_its_iter() -> None:
    # Persistent workers resume each epoch inside iter() (0.5 s with many of them here): an
    # epoch timed whole counts it, as every epoch pays it and as a static measurement does.
    cfg = LoaderConfig(16, persistent_workers=True)
    st = TrialTiming.planned(cfg, "test", 5, 20, epochs=1)
    st.start(0.0, lead_s=0.5)
    now = 0.0
    for i in range(20):
        wait = 0.1 if i % 16 == 0 else 0.0
        now += wait
        st.add(4, wait, 0.0, now)
    trial = st.result(None, None)
    assert trial.samples_per_s == pytest.approx(20 * 4 / (0.2 + 0.5))
    assert trial.stall_fraction == pytest.approx(1.0)


def run_online(
    tuner: OnlineTuner,
    rate: Callable[[LoaderConfig], float],
    *,
    limit: int = 40,
    epoch: int | None = None,
    start_s: float = 0.0,
    keeps: bool = False,
) -> Settle:
    """Drive ``tuner`` through its trials in a loop it never feeds (a do-nothing loop), the
    pipeline making ``rate(config)`` samples/s in 16-sample batches, each window of a trial
    20% off that pace one way or the other (a noisy machine); the Settle it ends on. Each
    trial runs from an ``epoch``'s start (batches; None: unknown), a lane of new workers
    taking ``start_s`` to start; with ``keeps``, the lane left before is kept."""
    now, running, left = 0.0, None, None
    action: object = None
    for _ in range(limit):
        tuner.new_epoch(epoch)
        fresh = tuner.config != running
        left, running = (running if fresh else left), tuner.config
        tuner.kept = left if keeps else None
        tuner.lane_started(now, fresh, start_s if fresh else 0.0)
        trial = tuner.trial
        assert trial is not None
        cfg, n = trial.config, 0
        while not tuner.trial_done(now):
            jitter = 0.8 if (n // max(1, cfg.num_workers)) % 2 else 1.2
            wait = 16 / (rate(cfg) * jitter)
            now += wait
            tuner.observe(16, wait, 0.0, now)
            n += 1
        action = tuner.conclude(now, processes(cfg))
        if isinstance(action, Settle):
            return action
        assert isinstance(action, Try)
        tuner.moved(action.config, action.why, drain=False)
    raise AssertionError(f"no settling in {limit} trials: {action}")


def workers_rate(workers: int, at_8: float) -> float:
    """25 samples/s a worker up to 4, ``at_8`` times that from 8 workers on."""
    return 25.0 * max(1, min(workers, 4)) * (at_8 if workers >= 8 else 1.0)


def test_near_tied_leaders_are_measured_again_in_turn_until_the_gap_is_resolved() -> None:
    # A loop no configuration feeds: 8 workers make 10% more than 4, which one noisy trial
    # each cannot tell apart (the cheapest within the noise would be 4). They are measured
    # again, in turn, until each has RESOLVED_REPEATS; 8's lead, past NOISE_FLOOR, then stands.
    start = online(LoaderConfig(4))
    space = Space(cpus=4, baseline=start, max_workers=8, consumer=True)
    tuner = OnlineTuner(space, start, "test", settled=False, settled_stall=None, warmup=lambda c: 1)
    settle = run_online(tuner, lambda c: workers_rate(c.num_workers, 1.1))
    assert settle.config.num_workers == 8, tuner.report.events
    again = [e for e in tuner.report.events if "measured again" in e.why]
    assert again, tuner.report.events
    by_workers = {t.config.num_workers: t for t in tuner.trials if t.config.prefetch_factor == 2}
    assert by_workers[8].repeats >= RESOLVED_REPEATS and by_workers[4].repeats >= RESOLVED_REPEATS


def test_near_ties_within_the_floor_are_not_measured_again() -> None:
    # 8 workers make 1% more than 4: within NOISE_FLOOR, the cheaper stands at once.
    start = online(LoaderConfig(4))
    space = Space(cpus=4, baseline=start, max_workers=8, consumer=True)
    tuner = OnlineTuner(space, start, "test", settled=False, settled_stall=None, warmup=lambda c: 1)
    settle = run_online(tuner, lambda c: workers_rate(c.num_workers, 1.01))
    assert settle.config.num_workers == 4
    assert not [e for e in tuner.report.events if "measured again" in e.why]


@pytest.mark.parametrize(
    ("epoch", "keeps", "repeats"), [(200, False, False), (20_000, False, True), (200, True, True)]
)
def test_near_ties_are_measured_again_where_finding_out_pays_for_the_workers_start(
    epoch: int, keeps: bool, repeats: bool
) -> None:
    # As above (8 workers 10% ahead of 4, noisy), but a lane of new workers holds the loop
    # 20 s while it starts. In epochs of 200 batches (about 30 s) a gap within the noise is
    # worth a few seconds an epoch: the answer stands without a repeat, and the report says
    # why. In epochs of 20,000 (about 50 min) finding out pays: measured again, 8 stands.
    # Where the lane of 4 was kept when 8 took over, its repeat starts no worker: measured
    # again in the short epochs too.
    start = online(LoaderConfig(4))
    space = Space(cpus=4, baseline=start, max_workers=8, consumer=True)
    tuner = OnlineTuner(space, start, "test", settled=False, settled_stall=None, warmup=lambda c: 1)
    settle = run_online(
        tuner, lambda c: workers_rate(c.num_workers, 1.1), epoch=epoch, start_s=20.0, keeps=keeps
    )
    again = [e for e in tuner.report.events if "measured again" in e.why]
    skipped = [e for e in tuner.report.events if e.what.startswith("not measured again")]
    if repeats:
        assert again and not skipped and settle.config.num_workers == 8, tuner.report.events
    else:
        assert not again and len(skipped) == 1, tuner.report.events
        assert "start holds the loop 20.0 s" in skipped[0].why
        assert all(t.repeats == 1 for t in tuner.trials)


def test_a_trial_at_the_epochs_end_needs_a_round_more_than_the_queue() -> None:
    # 32 workers (pf=2: a queue of 64) took over late in a 256-batch epoch. The queue may be
    # full of ready batches when the window opens: up to two rounds of them arrive in a burst
    # with no round's gap (hundreds of thousands of samples/s, next to no CPU). Concluded at
    # the epoch's end only with a round more than that; else it goes on over the next epoch.
    cfg = LoaderConfig(32, prefetch_factor=2)
    assert at_epoch_end(cfg) == 96
    st = TrialTiming.planned(cfg, "test", 96, 256)
    assert not st.whole_epoch and st.round_batches == 32
    st.start(0.0)
    for i in range(96 + 64):
        st.add(16, 0.0001, 0.0, i * 0.0001)  # two rounds, all from the queue
    assert st.measured == 64 and not st.epoch_done()
    for i in range(32):
        st.add(16, 0.2 if i == 0 else 0.0001, 0.0, 1.0)
    assert st.epoch_done()  # a round made in the window, its gap included
    # From an epoch's start, after its warm-up, the same: the warm-up refilled the queue (64
    # workers, 192 batches of warm-up in a 256-batch epoch: its last round read 10,500
    # samples/s at no CPU). Opened at the epoch's start itself, the queue began empty: a
    # whole round does.
    warmed = TrialTiming.planned(cfg, "test", 96, 256)
    warmed.start(0.0, lead_s=0.01)
    for i in range(96 + 32):
        warmed.add(16, 0.0001, 0.0, i * 0.0001)
    assert warmed.measured == 32 and not warmed.epoch_done()
    fresh = TrialTiming.planned(cfg, "test", 0, 256)
    fresh.start(0.0, lead_s=0.01)
    for i in range(32):
        fresh.add(16, 0.2 if i == 0 else 0.0001, 0.0, 1.0)
    assert fresh.epoch_done()
    # Where the epoch's length is unknown (an iterable's), a few batches still do.
    open_ended = TrialTiming.planned(cfg, "test", 96, None)
    open_ended.start(0.0)
    for i in range(96 + 4):
        open_ended.add(16, 0.0001, 0.0, i * 0.0001)
    assert open_ended.epoch_done()


def test_a_trial_short_at_an_epochs_end_starts_over_from_the_next_epochs_start() -> None:
    # 64 workers in 256-batch epochs, a warm-up of 192: the one round measured by the epoch's
    # end came from the queue. Not concluded there, the trial starts over with the next epoch
    # from its start (the lane's workers are warm, its queue empty) rather than after another
    # warm-up, which would reach the epoch's end as short as before, every epoch.
    start = online(LoaderConfig(64))
    space = Space(cpus=4, baseline=start, max_workers=128, consumer=True)
    tuner = OnlineTuner(
        space, start, "test", settled=False, settled_stall=None, warmup=lambda c: 192
    )
    tuner.new_epoch(256)
    tuner.lane_started(0.0, True, 3.0)  # its 64 workers took 3 s to start
    first = tuner.trial
    assert first is not None and not first.whole_epoch and first.warmup == 192
    now = 0.0
    for i in range(256):
        wait = 0.0001 if i >= 192 else 0.01  # the last round all ready: a burst
        now += wait
        tuner.observe(4, wait, 0.0, now)
    assert first.measured == 64 and not first.epoch_done()
    tuner.new_epoch(256)
    tuner.lane_started(now, False, 0.0)
    again = tuner.trial
    assert again is not None and again is not first and again.warmup == 0 and again.opened
    while not tuner.trial_done(now):
        wait = 0.64 if tuner.batch % 64 == 0 else 0.0001  # rounds of 64, one batch-time each
        now += wait
        tuner.observe(4, wait, 0.0, now)
    tuner.conclude(now, None)
    # The pipeline's pace (64 batches of 4 a 0.64 s round: 400 samples/s), not the burst's;
    # and what its start cost, which a repeat would pay again, though measured from a later epoch.
    assert tuner.trials[-1].samples_per_s == pytest.approx(400, rel=0.02)
    assert tuner.trials[-1].startup_s == 3.0


def test_no_lane_is_kept_once_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kept lane waits, idle, for a return to its configuration; once settled none comes, and
    # its workers would hold memory for nothing, whatever the trials would keep.
    import feedrate.search.tuner as tuner_module

    monkeypatch.setattr(tuner_module, "keep", lambda space, trials, alive, going: alive[0])
    kept, going = online(LoaderConfig(8)), online(LoaderConfig(16))
    tuning, settled = tuner_from(8), tuner_from(8, settled=True, stall=0.0)
    assert tuning.keep([kept], going) == kept
    assert settled.keep([kept], going) is None


def test_watching_reads_the_run_queue_only_to_confirm_a_stall_come_back() -> None:
    # Once settled, the clock alone is read: the run-queue time only moves a wait's seconds to
    # the step, so a stretch under the margin without it is under with it. A stretch over the
    # margin read without it counts for nothing but turns the reads on; the stretches read
    # with them decide (two in a row over: tune again), and one under turns them off again.
    tuner = tuner_from(2, settled=True, stall=0.0)
    tuner.new_epoch(None)
    now, seen = 0.0, []

    def stretch(wait: float) -> None:
        nonlocal now
        for _ in range(WATCH_BATCHES):
            now += wait + 0.05
            tuner.observe(16, wait, 0.05, now)
        seen.append((tuner.wants_queued, tuner.report.retunes))

    for wait in (0.0, 0.05, 0.0, 0.05, 0.05, 0.05):
        stretch(wait)
    assert seen == [(False, 0), (True, 0), (False, 0), (True, 0), (True, 0), (True, 1)]


def test_watching_reads_the_run_queue_for_the_reference_stretch() -> None:
    tuner = tuner_from(2, settled=True, stall=None)  # cached without a stall: one is measured
    tuner.new_epoch(None)
    assert tuner.wants_queued
    now = 0.0
    for _ in range(2 + 2 + WATCH_BATCHES):  # the lane's warm-up left out, then a stretch
        now += 0.1
        tuner.observe(16, 0.05, 0.05, now)
    assert tuner.settled_stall == pytest.approx(0.5) and not tuner.wants_queued


def test_the_reference_stretch_leaves_out_the_lane_s_warm_up() -> None:
    # A cached setting without its stall (tune's): the first stretch measures it. A lane's
    # prefetched batches come at once (its warm-up: 36 batches with 12 workers, pf=2), which
    # would read as a lower stall than the loop's, and every later stretch as a stall back.
    tuner = tuner_from(2, settled=True, stall=None)  # a warm-up of 2 + 2 batches
    tuner.new_epoch(None)
    now = 0.0
    for wait in [0.0] * 4 + [0.05] * WATCH_BATCHES:
        now += wait + 0.05
        tuner.observe(16, wait, 0.05, now)
    assert tuner.settled_stall == pytest.approx(0.5)


def test_no_workers_after_one_count_says_what_was_seen() -> None:
    # A stream's first trial (a whole epoch) at 4 workers, its main process busy receiving:
    # "more workers stopped helping" named a series that was never tried.
    from feedrate.search.online_steps import zero

    space = Space(cpus=2, baseline=online(LoaderConfig(4)), max_workers=16, consumer=True)
    base = measured(online(LoaderConfig(4)))
    four = replace(base, stall_fraction=0.5, main_cpu=0.6, workers_cpu=0.4)
    proposal = zero(space, [four])
    assert proposal is not None and proposal[0].num_workers == 0
    assert proposal[1] == "w=4 pf=2 persistent leaves the loop waiting: no workers at all?"
    two = replace(four, config=online(LoaderConfig(2)), spread=Spread.of_rates([90.0] * 4))
    said = zero(space, [two, four])
    assert said is not None and said[1].startswith("more workers stopped helping")
