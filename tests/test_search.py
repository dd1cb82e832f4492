"""The guided search on synthetic pipelines: models of how samples/s and CPU use respond to the
number of workers. Each model has a known optimum; the search must find it without measuring
everything, whatever side of the CPU count it lies on."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.search import advice
from feedrate.search.bottleneck import bottleneck
from feedrate.search.budgets import space_for
from feedrate.search.online_steps import receiving
from feedrate.search.propose import choose, keep, propose, propose_online, unresolved
from feedrate.search.rounds import fewest_alike, rounds
from feedrate.search.scaling import (
    STREAM_START_OVER_CPUS,
    STREAM_START_PER_CPU,
    map_start,
    stream_start,
)
from feedrate.search.space import STALL_MARGIN, Space, beats, covers, predict_over_budget


@dataclass(frozen=True)
class Figures:
    rate: float
    main_cpu: float
    worker_cpu: float  # each
    noise: float = 0.02
    worker_uss: int = 20 * 2**20
    wait_cpu: float | None = None  # online: share of the loop's wait on a CPU


Model = Callable[[LoaderConfig], Figures]


def make_trial(cfg: LoaderConfig, why: str, f: Figures, consumer: float | None) -> Trial:
    r = f.rate
    stall = None if consumer is None else max(0.0, 1 - r / consumer)
    achieved = r if consumer is None else min(r, consumer)
    return Trial(
        config=cfg,
        reason=why,
        samples_per_s=achieved,
        spread=Spread([achieved], achieved, achieved * (1 - f.noise), achieved * (1 + f.noise), 0),
        main_cpu=f.main_cpu,
        workers_cpu=f.worker_cpu * cfg.num_workers,
        main_uss_bytes=100 * 2**20,
        workers_uss_bytes=f.worker_uss * cfg.num_workers,
        worker_uss_max_bytes=f.worker_uss if cfg.num_workers else None,
        batch_bytes=2**20,
        stall_fraction=stall,
        wait_cpu=f.wait_cpu,
        receive_cpu=None if f.wait_cpu is None or stall is None else f.wait_cpu * stall,
    )


def run(space: Space, model: Model, consumer: float | None = None) -> tuple[Trial, list[Trial]]:
    trials = [make_trial(space.baseline, "yours", model(space.baseline), consumer)]
    for _ in range(60):
        proposal = propose(space, trials)
        if proposal is None:
            break
        cfg, why = proposal
        skip = predict_over_budget(space, trials, cfg)
        trials.append(
            Trial(cfg, why, skipped=skip) if skip else make_trial(cfg, why, model(cfg), consumer)
        )
    else:
        raise AssertionError("search did not stop")
    best = choose(space, trials)
    assert best is not None
    return best, trials


def tiny(cfg: LoaderConfig) -> Figures:
    """Microsecond samples: IPC dominates, no workers is 3x faster."""
    if cfg.num_workers == 0:
        return Figures(300_000, 1.0, 0.0)
    return Figures(100_000, 0.95, 0.3)


def cpu_bound(cpus: int) -> Model:
    def model(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        if w == 0:
            return Figures(480, 1.0, 0.0)
        useful = min(w, cpus - 0.3)
        penalty = 0.97 ** max(0, w - cpus)  # oversubscription costs a little
        return Figures(500 * useful * penalty, 0.3, min(1.0, (cpus - 0.3) / w))

    return model


def latency_bound(per_worker: float = 100.0, ceiling: float = 5_000.0) -> Model:
    def model(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        if w == 0:
            return Figures(per_worker * 0.95, 0.05, 0.0)
        bonus = 1.15 if (cfg.prefetch_factor or 2) > 2 else 1.0
        # Threads overlap waits inside a worker as workers do, at a little CPU each.
        rate = min(w * cfg.threads * per_worker * bonus, ceiling)
        return Figures(rate, min(0.9, w * 0.01), 0.03 * cfg.threads**0.5)

    return model


def online_cfg(workers: int) -> LoaderConfig:
    """``workers`` workers as autotune runs them (persistent, pf=2)."""
    return LoaderConfig(
        workers, prefetch_factor=2 if workers else None, persistent_workers=workers > 0
    )


def space(cpus: int = 2, **kw: object) -> Space:
    defaults: dict[str, object] = {"baseline": LoaderConfig(0), "max_workers": 64}
    defaults.update(kw)
    return Space(cpus=cpus, **defaults)  # type: ignore[arg-type]


def test_tiny_samples_optimum_at_zero_workers() -> None:
    best, trials = run(space(cpus=4, baseline=LoaderConfig(4)), tiny)
    assert best.config.num_workers == 0
    assert len(trials) <= 6


def test_cpu_bound_ladder_past_the_cpus_goes_on_while_within_the_noise() -> None:
    # Skewed per-sample cost on 2 CPUs (feedrate tune, 2026-12-05): 2 and 3 workers within 1%
    # of each other, 3 behind by its median; 4 and 6 were each 5-10% above both when measured
    # side by side (compare.py's quick grid: 8 workers best, 3 at 0.87 of it), never tried;
    # later runs stopped at 6, where the grid's best was 8 or 16 (tune at 0.91-0.96 of it).
    def skewed(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        rate = {0: 1560.0, 1: 1400.0, 2: 2560.0, 3: 2490.0, 4: 2690.0}.get(w, 2830.0)
        return Figures(rate, 0.1, 0.95, noise=0.25)

    s = space(cpus=2, baseline=LoaderConfig(0))
    best, trials = run(s, skewed)
    tried = [t.config.num_workers for t in trials]
    assert {4, 6, 8} <= set(tried), tried  # up to POOL_CPUS per CPU, as autotune goes
    # The answer within the noise (2) is over 3% behind the fastest: both are measured again
    # before it stands (``unresolved``; tune then takes a lead above 3% as real).
    again = unresolved(s, trials)
    assert again is not None and best.config.num_workers == 2, (again, tried)


def test_tune_s_ladder_goes_on_to_8_per_cpu_where_a_deeper_pool_pays() -> None:
    # Skewed cost on 2 CPUs (compare-quick-1207g): 16 workers 7-16% above 8 in 4 of 5 rounds,
    # where tune's ladder ended at 8 (0.87 of the grid's best).
    def skewed(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        rate = {0: 1500.0, 1: 1250.0, 2: 2250.0, 3: 2250.0}.get(w, 2400.0 if w < 16 else 2650.0)
        return Figures(rate, 0.1, 0.95)

    best, trials = run(space(cpus=2, baseline=LoaderConfig(0)), skewed)
    assert best.config.num_workers == 16, [t.config.num_workers for t in trials]


@pytest.mark.parametrize("cpus", [2, 4, 8])
def test_cpu_bound_optimum_near_cpu_count(cpus: int) -> None:
    best, trials = run(space(cpus=cpus), cpu_bound(cpus))
    assert cpus - 1 <= best.config.num_workers <= cpus + 1
    # Did not wander far past: one rung of the ladder past cpus + 1 at most, where that one
    # was within the noise (3% slower) of the best.
    assert max(t.config.num_workers for t in trials) <= 2 * cpus


def test_latency_bound_optimum_far_past_cpu_count() -> None:
    best, trials = run(space(cpus=2), latency_bound())
    assert best.config.num_workers >= 40  # the ceiling is reached at 50 workers
    counts = sorted({t.config.num_workers for t in trials})
    assert len(counts) <= 10  # doubling and bisecting, not a grid


def test_search_stops_when_gains_fall_within_noise() -> None:
    # One step to the count the scaling predicts (16 times the workers at most); it bent, so
    # the search bisects below it instead of going further.
    best, trials = run(space(cpus=2), latency_bound(per_worker=100, ceiling=450))
    assert max(t.config.num_workers for t in trials) <= 32
    assert 4 <= best.config.num_workers <= 8


def test_deeper_prefetch_kept_only_when_it_measures_better() -> None:
    best, _ = run(space(cpus=2, max_workers=8), latency_bound(ceiling=10_000))
    assert best.config.prefetch_factor == 4
    best, trials = run(space(cpus=4), cpu_bound(4))
    assert any(t.config.prefetch_factor == 4 for t in trials)
    assert best.config.prefetch_factor == 2  # no gain: the cheaper queue wins


def test_memory_budget_bounds_the_step_without_starting_more() -> None:
    model = latency_bound()
    big = lambda cfg: Figures(**{**model(cfg).__dict__, "worker_uss": 500 * 2**20})  # noqa: E731
    best, trials = run(space(cpus=2, memory_budget=4 * 2**30), big)
    assert all(t.config.num_workers * 500 * 2**20 <= 4 * 2**30 for t in trials if t.measured)
    assert any("memory budget" in t.reason for t in trials)
    assert best.config.num_workers <= 8  # 4 GiB / 500 MiB: the workers' memory


def test_a_proposal_over_the_memory_budget_is_skipped_not_measured() -> None:
    # A deeper queue at the most workers that fit: its batches would not; skipped unmeasured.
    s = space(cpus=2, shm_budget=40 * 2**20)
    trials = [make_trial(LoaderConfig(8), "x", latency_bound()(LoaderConfig(8)), None)]
    assert predict_over_budget(s, trials, LoaderConfig(8, prefetch_factor=2)) is None
    reason = predict_over_budget(s, trials, LoaderConfig(8, prefetch_factor=4))
    assert reason is not None and "over the budget" in reason


def test_shm_budget_predicted_from_batch_bytes() -> None:
    s = space(cpus=2, shm_budget=10 * 2**20)
    trials = [make_trial(LoaderConfig(2), "x", latency_bound()(LoaderConfig(2)), None)]
    reason = predict_over_budget(s, trials, LoaderConfig(8, prefetch_factor=2))
    assert reason is not None and "/dev/shm" in reason


def test_consumer_mode_picks_fewest_workers_that_cover() -> None:
    s = space(cpus=2, consumer=True)
    best, _ = run(s, latency_bound(per_worker=100), consumer=1000.0)
    # 100 samples/s per worker: 10 workers feed 1000 samples/s (stall 0 ≤ margin), 9 do not.
    assert best.config.num_workers == 10
    assert best.stall_fraction is not None and best.stall_fraction <= STALL_MARGIN


def test_consumer_mode_zero_workers_when_main_process_keeps_up() -> None:
    best, trials = run(space(cpus=2, consumer=True), tiny, consumer=1000.0)
    assert best.config.num_workers == 0
    assert len(trials) == 1


def test_consumer_mode_gives_up_when_cpu_bound_and_not_gaining() -> None:
    best, trials = run(space(cpus=2, consumer=True), cpu_bound(2), consumer=100_000.0)
    assert max(t.config.num_workers for t in trials) <= 4
    assert best.stall_fraction is not None and best.stall_fraction > STALL_MARGIN


def test_consumer_mode_unfed_picks_cheapest_within_noise_of_least_stall() -> None:
    # Nothing keeps a consumer of 1000 samples/s fed; 4 workers stall a hair less than none,
    # well within the noise: paying for 4 workers buys nothing, so the answer is 0.
    noisy = 0.05
    none = make_trial(LoaderConfig(0), "a", Figures(640, 1.0, 0.0, noise=noisy), 1000.0)
    four = make_trial(LoaderConfig(4), "b", Figures(660, 0.5, 0.3, noise=noisy), 1000.0)
    far = make_trial(LoaderConfig(8), "c", Figures(500, 0.5, 0.3, noise=noisy), 1000.0)
    assert (four.stall_fraction or 0) < (none.stall_fraction or 0)
    assert choose(space(consumer=True), [four, far, none]) is none
    much = make_trial(LoaderConfig(4), "d", Figures(900, 0.5, 0.3, noise=noisy), 1000.0)
    assert choose(space(consumer=True), [none, much, far]) is much


def test_choose_prefers_cheapest_within_noise() -> None:
    f = Figures(1000, 0.1, 0.1, noise=0.05)
    a = make_trial(LoaderConfig(8), "a", f, None)
    b = make_trial(LoaderConfig(4), "b", Figures(980, 0.1, 0.1, noise=0.05), None)
    assert not beats(a, b)
    assert choose(space(), [a, b]) is b


def test_a_trial_over_the_memory_limit_is_not_recommended() -> None:
    # The budget is the workers': 2 × 20 MiB. The main process's 100 MiB is there whatever
    # the setting (and already out of the memory the default budget is read from).
    none = make_trial(LoaderConfig(0), "yours", Figures(500, 0.9, 0), None)
    two = make_trial(LoaderConfig(2), "w", Figures(1000, 0.1, 0.9), None)
    four = make_trial(LoaderConfig(4), "w", Figures(1100, 0.1, 0.9), None)
    assert choose(space(memory_budget=30 * 2**20), [none, two]) is none
    assert choose(space(memory_budget=40 * 2**20), [none, two]) is two
    # A main process larger than the budget does not rule out every setting with workers.
    assert choose(space(memory_budget=50 * 2**20), [none, two]) is two
    # None within it: the one that held least, not the fastest.
    assert choose(space(memory_budget=2**20), [four, two]) is two


def test_a_cgroup_s_whole_limit_counts_the_main_process_too() -> None:
    # 16 GiB pod, 12 GiB available: the limit binds, and the main process lies within it; on a
    # machine whose available memory binds, the main process is already out of it.
    base = replace(collect(), memory_available_bytes=12 * 2**30)
    pod = space_for(replace(base, memory_limit_bytes=8 * 2**30), LoaderConfig(0), consumer=False)
    host = space_for(replace(base, memory_limit_bytes=None), LoaderConfig(0), consumer=False)
    told = space_for(base, LoaderConfig(0), consumer=False, memory_limit=2**30)
    assert pod.memory_counts_main and not host.memory_counts_main
    assert not told.memory_counts_main  # --memory-limit: the workers' memory, as it says
    big_main = make_trial(LoaderConfig(2), "w", Figures(1000, 0.1, 0.9), None)
    big_main.main_uss_bytes = 5 * 2**30  # a dataset held in the main process
    assert choose(pod, [big_main]) is big_main  # the only one: the one that held least
    none = make_trial(LoaderConfig(0), "yours", Figures(500, 0.9, 0), None)
    none.main_uss_bytes = 5 * 2**30
    assert choose(pod, [big_main, none]) is none  # 5 GiB + workers over the pod's 4 GiB
    assert choose(replace(pod, memory_counts_main=False), [big_main, none]) is big_main
    reason = predict_over_budget(pod, [big_main], LoaderConfig(4))
    assert reason is not None and "workers' and the main process's memory" in reason


def repeated(workers: int, rate: float, noise: float, repeats: int = 3, **kw: object) -> Trial:
    cfg = online_cfg(workers) if workers else LoaderConfig(0)
    t = make_trial(replace(cfg, **kw), "t", Figures(rate, 0.1, 0.5, noise=noise), None)
    t.repeats = repeats
    return t


def test_verdicts_say_why_each_trial_lost_by_the_rule_that_chose() -> None:
    # QA, feedrate tune on a CPU-heavy datasets pipeline: w=2 read "within noise of the
    # fastest" though w=3 was recommended. Measured 3 times each, side by side, w=3 outpaced
    # it by 3.8%: choose counts that (``outpaced``), the verdicts counted the noise alone.
    yours, two, three = repeated(0, 4335, 0.116), repeated(2, 5482, 0.054), repeated(3, 5689, 0.039)
    four, deep = repeated(4, 3005, 0.011, 1), repeated(3, 3305, 0.225, 2, prefetch_factor=4)
    trials = [yours, two, three, four, deep]
    assert choose(space(), trials) is three
    advice.verdicts(space(), trials, three)
    assert three.verdict == "recommended"
    assert two.verdict == (
        "within the noise, but outpaced by w=3 pf=2 persistent side by side (4% slower over 3 "
        "runs each)"
    )
    assert [t.verdict for t in (yours, four, deep)] == ["24% slower", "47% slower", "42% slower"]
    # And your own settings, cheaper, within the noise of a faster w=2 that outpaced them.
    yours, two = repeated(0, 7314, 0.010), repeated(2, 7885, 0.076)
    one = repeated(1, 3632, 0.028, 1)
    assert choose(space(), [yours, two, one]) is two
    advice.verdicts(space(), [yours, two, one], two)
    assert yours.verdict.startswith("within the noise, but outpaced by w=2 pf=2 persistent")
    assert (two.verdict, one.verdict) == ("recommended", "54% slower")


def test_tune_measures_a_cheaper_leader_again_while_the_next_lies_within_its_noise() -> None:
    # tokenize on 2 CPUs (compare-quick-1207i): 2 workers at 1.07 of 8 in one round, 0.73-0.94
    # in the other four. One trial of each orders them either way: where the cheaper leads,
    # tune (``either``) measures both until resolved, the one with fewer repeats first.
    s = space()
    two, eight = repeated(2, 2100, 0.1, 3), repeated(8, 2000, 0.1, 2)
    assert choose(s, [two, eight]) is two
    assert unresolved(s, [two, eight]) is None  # autotune's repeats cost training time
    again = unresolved(s, [two, eight], either=True)
    assert again is not None and again[0] is eight, again
    assert again[1].endswith(
        "w=8 pf=2 persistent lies within the noise of w=2 pf=2 persistent, the fastest"
    )
    two.repeats, eight.repeats = 1, 2
    again = unresolved(s, [two, eight], either=True)
    assert again is not None and again[0] is two, again
    # Both measured RESOLVED_REPEATS times, or the rest beyond the noise: the answer stands.
    assert unresolved(s, [repeated(2, 2100, 0.1), repeated(8, 2000, 0.1)], either=True) is None
    two, eight = repeated(2, 2100, 0.01, 1), repeated(8, 1500, 0.01, 1)
    assert unresolved(s, [two, eight], either=True) is None


def test_verdicts_of_trials_the_answer_could_not_be() -> None:
    # Faster, or as fast for less, but not for the answer: threads not allowed, over the memory
    # budget, or set aside for its pin_memory twin; none reads "within noise of the fastest".
    threads = repeated(1, 2000, 0.02, threads=8)
    big = repeated(2, 1500, 0.02)
    big.workers_uss_bytes = 2**30
    pinned, unpinned = repeated(3, 1010, 0.02, pin_memory=True), repeated(3, 1000, 0.02)
    four = repeated(4, 1000, 0.02)
    trials = [threads, big, pinned, unpinned, four]
    s = space(memory_budget=512 * 2**20)
    assert choose(s, trials) is unpinned  # which pinning's verdict sets aside for its twin:
    assert choose(s, [t for t in trials if t is not unpinned]) is pinned
    advice.verdicts(s, trials, pinned, unpinned)
    assert threads.verdict == "threads need --threads (a thread-safe __getitem__)"
    assert big.verdict == "over the memory budget of 512.0 MiB"
    assert unpinned.verdict == "set aside for its pin_memory=True twin"
    assert (pinned.verdict, four.verdict) == ("recommended", "within noise of the fastest")


def test_verdicts_with_a_consumer_none_keeps_fed_say_the_rule_that_chose() -> None:
    two, three = repeated(2, 950, 0.02), repeated(3, 1000, 0.02)
    two.stall_fraction, three.stall_fraction = 0.30, 0.26
    assert choose(space(consumer=True), [two, three]) is three
    advice.verdicts(space(consumer=True), [two, three], three)
    assert two.verdict.startswith("consumer waits 30% of the time; within the noise, but outpaced")


def test_bottleneck_classes() -> None:
    assert bottleneck(make_trial(LoaderConfig(0), "", Figures(1, 1.0, 0), None), 2) == "no-workers"
    assert (
        bottleneck(make_trial(LoaderConfig(4), "", Figures(1, 0.95, 0.1), None), 2)
        == "main-process"
    )
    assert bottleneck(make_trial(LoaderConfig(2), "", Figures(1, 0.1, 0.9), None), 2) == "cpu"
    assert bottleneck(make_trial(LoaderConfig(8), "", Figures(1, 0.1, 0.05), None), 2) == "latency"
    contended = make_trial(LoaderConfig(2), "", Figures(1, 0.1, 0.6), None)
    contended.system_busy_cpus = 1.95
    assert bottleneck(contended, 2) == "cpu"
    # No workers, the main process asleep while it fetches (1 s a sample from storage): it
    # waits; the work per batch being too small to hand over is no reading of it.
    assert bottleneck(make_trial(LoaderConfig(0), "", Figures(1, 0.01, 0), None), 2) == "latency"
    # ... nor with a consumer: the share of its fetching time on a CPU counts, not its step's.
    fed = make_trial(LoaderConfig(0), "", Figures(50, 0.4, 0), 100.0)
    assert fed.stall_fraction == 0.5 and bottleneck(fed, 2) == "no-workers"
    # No workers on a busy machine: the main thread computed 40% of the time and sat queued
    # for a CPU 50%: its work held up, not asleep (it read as latency-bound).
    held_up = make_trial(LoaderConfig(0), "", Figures(1, 0.4, 0), None)
    assert bottleneck(held_up, 2) == "latency"
    held_up.main_runq = 0.5
    assert bottleneck(held_up, 2) == "no-workers"


def test_an_answer_with_no_workers_measured_is_no_verdict_on_them() -> None:
    waits = make_trial(LoaderConfig(0), "yours", Figures(1.0, 0.01, 0), None)
    cut = Trial(LoaderConfig(2, prefetch_factor=2), "next", skipped="over the budget")
    why = advice.reason(space(), waits, waits, None, [waits, cut])
    assert why.startswith("Only num_workers=0 was measured within the budget (1.0 samples/s)")
    assert "no verdict on workers" in why and "cost more" not in why
    tried = make_trial(LoaderConfig(2), "w", Figures(0.9, 0.01, 0.01), None)
    why = advice.reason(space(), waits, waits, None, [waits, tried])
    assert why.startswith("No workers measured fastest, although fetching mostly waits"), why


def test_every_trial_records_why() -> None:
    _, trials = run(space(cpus=2), latency_bound())
    assert all(t.reason for t in trials)


def test_open_file_budget_predicted() -> None:
    s = space(cpus=2, fd_budget=800)
    trials = [make_trial(LoaderConfig(2), "x", latency_bound()(LoaderConfig(2)), None)]
    assert predict_over_budget(s, trials, LoaderConfig(16)) is None
    reason = predict_over_budget(s, trials, LoaderConfig(128))
    assert reason is not None and "open files" in reason


def test_tasks_budget_predicted_and_bounds_the_step() -> None:
    s = space(cpus=2, max_workers=512, tasks_budget=100)  # 25 workers of 4 tasks
    trials = [make_trial(LoaderConfig(2), "x", latency_bound()(LoaderConfig(2)), None)]
    assert predict_over_budget(s, trials, LoaderConfig(25)) is None
    reason = predict_over_budget(s, trials, LoaderConfig(26))
    assert reason is not None and "processes and threads" in reason
    assert predict_over_budget(s, trials, LoaderConfig(2, threads=64)) is not None
    best, trials = run(s, latency_bound(ceiling=50_000))
    assert all(t.config.num_workers <= 25 for t in trials)
    assert best.config.num_workers == 25  # x16 from 2 would be 32, over the budget
    assert any("processes and threads" in t.reason for t in trials)


def failing_from(limit: int, model: Model) -> Model:
    """``model``, whose configurations of ``limit`` workers or more cannot start."""

    def failing(cfg: LoaderConfig) -> Figures:
        if cfg.num_workers >= limit:
            raise OSError(11, "Resource temporarily unavailable")
        return model(cfg)

    return failing


def run_failing(space: Space, model: Model, consumer: float | None = None) -> list[Trial]:
    trials = [make_trial(space.baseline, "yours", model(space.baseline), consumer)]
    while (proposal := propose(space, trials)) is not None and len(trials) < 60:
        try:
            trials.append(make_trial(*proposal, model(proposal[0]), consumer))
        except OSError as exc:
            trials.append(Trial(*proposal, error=f"did not start: {exc}"))
    return trials


@pytest.mark.parametrize(("limit", "consumer"), [(120, None), (30, 20_000.0)])
def test_a_start_that_failed_bounds_the_climb_half_way_to_it(
    limit: int, consumer: float | None
) -> None:
    # A limit no budget saw (a process limit): the climb does not end at the last count that
    # started; it bisects towards the one that failed, and never goes past a failure.
    s = space(cpus=2, max_workers=512, consumer=consumer is not None)
    trials = run_failing(s, failing_from(limit, latency_bound(ceiling=50_000)), consumer)
    failed = [t.config.num_workers for t in trials if t.error]
    assert failed and all(f >= limit for f in failed)
    assert all(a > b for a, b in itertools.pairwise(failed))  # each lower than the last
    best = choose(s, trials)
    assert best is not None and best.config.num_workers >= 0.8 * limit
    assert any("the midpoint to the" in t.reason for t in trials)


def test_consumer_mode_steps_to_the_memory_budget_not_past_it() -> None:
    # The count the pace asks for is over the memory budget: the most that fit, not a stop.
    model = latency_bound(ceiling=50_000)
    big = lambda cfg: Figures(**{**model(cfg).__dict__, "worker_uss": 100 * 2**20})  # noqa: E731
    s = space(cpus=2, max_workers=512, memory_budget=4 * 2**30, consumer=True)
    best, trials = run(s, big, consumer=8000.0)
    assert best.config.num_workers == 40  # 4 GiB / 100 MiB: the workers' (not the main's)
    assert not any(t.skipped for t in trials)
    assert "up to 40: the memory budget" in best.reason


def test_starved_workers_are_cpu_bound_not_latency_bound() -> None:
    # Each worker got 30% of a core but queued for one 60% of the time: CPU-starved, not waiting.
    starved = make_trial(LoaderConfig(4), "", Figures(1, 0.05, 0.3), None)
    starved.workers_runq = 4 * 0.6
    assert bottleneck(starved, 2) == "cpu"
    sleeping = make_trial(LoaderConfig(4), "", Figures(1, 0.05, 0.3), None)
    sleeping.workers_runq = 4 * 0.02
    assert bottleneck(sleeping, 2) == "latency"


def test_latency_bound_search_steps_to_the_ceiling_the_scaling_predicts() -> None:
    # Linear from 0 to 2 workers: x16 (the most one step takes); linear again, and the CPU
    # time at 32 workers (0.32 main + 0.96 workers) projects 85% of 2 CPUs at 42 workers.
    _, trials = run(space(cpus=2), latency_bound())
    counts = [t.config.num_workers for t in trials if t.config.prefetch_factor in (None, 2)]
    assert counts[:4] == [0, 2, 32, 42]
    assert "85% of the 2 usable CPUs" in trials[counts.index(42)].reason
    assert 4 not in counts and 8 not in counts and 16 not in counts


def test_a_step_to_the_worker_cap_names_what_set_it() -> None:
    # QA: a webdataset of 3 shards read "up to 3: max_workers=3", an option nobody gave.
    facts = collect()
    shards = space_for(facts, LoaderConfig(0), consumer=False, parts=3)
    _, trials = run(shards, latency_bound())
    capped = next(t for t in trials if t.config.num_workers == 3)
    assert "the 3 shards the dataset hands out whole" in capped.reason
    assert "max_workers" not in capped.reason
    told = space_for(facts, LoaderConfig(0), consumer=False, max_workers=3)
    assert told.cap == "max_workers=3"
    short = space_for(facts, LoaderConfig(0), consumer=False, epoch_batches=6)
    assert short.cap == "an epoch's 6 batches, one a worker at most"


def test_consumer_mode_stops_doubling_when_the_stall_stops_falling() -> None:
    # The loader tops out at 500 samples/s; the consumer wants 1000: no count can feed it.
    best, trials = run(space(cpus=2, consumer=True), latency_bound(ceiling=500), consumer=1000.0)
    # Steps of x4 while the workers scale linearly overshoot the ceiling by one step at most.
    assert max(t.config.num_workers for t in trials) <= 32
    assert best.stall_fraction is not None and best.stall_fraction >= 0.45


def test_threads_measured_once_but_not_recommended_without_leave() -> None:
    best, trials = run(space(cpus=2, max_threads=16), latency_bound())
    threaded = [t for t in trials if t.config.threads > 1]
    assert len(threaded) == 1 and threaded[0].config.threads == 16
    assert best.config.threads == 1 and best.config.num_workers >= 40


def test_threads_recommended_with_leave_and_few_workers() -> None:
    best, trials = run(space(cpus=2, max_threads=16, allow_threads=True), latency_bound())
    assert best.config.threads == 16 and best.config.num_workers <= 4
    # Once a few threaded workers beat every process count, the processes stop growing.
    assert max(t.config.num_workers for t in trials if t.config.threads == 1) <= 16


def test_threads_never_tried_on_a_cpu_bound_pipeline() -> None:
    _, trials = run(space(cpus=2, max_threads=16, allow_threads=True), cpu_bound(2))
    assert all(t.config.threads == 1 for t in trials)


def test_threads_not_tried_where_they_cannot_apply() -> None:
    _, trials = run(space(cpus=2, max_threads=1, allow_threads=True), latency_bound())
    assert all(t.config.threads == 1 for t in trials)


def test_consumer_mode_fed_by_one_threaded_worker() -> None:
    s = space(cpus=2, consumer=True, max_threads=16, allow_threads=True)
    best, trials = run(s, latency_bound(per_worker=100), consumer=1000.0)
    # One worker on 16 threads gives 1,600 samples/s: fed, with fewer workers than 10.
    assert best.config.num_workers == 1 and best.config.threads == 16
    assert max(t.config.num_workers for t in trials) <= 2


def test_consumer_mode_keeps_doubling_while_the_rate_grows_with_an_instant_step() -> None:
    # A step that takes no time stalls ~100% whatever the loader does: the stall cannot guide,
    # the delivered rate does.
    best, _ = run(space(cpus=2, consumer=True), latency_bound(), consumer=1e9)
    assert best.config.num_workers >= 32


def online(
    s: Space, model: Model, consumer: float, start: LoaderConfig, batch_bytes: int = 2**20 - 1
) -> list[Trial]:
    def measured(cfg: LoaderConfig, why: str) -> Trial:
        t = make_trial(cfg, why, model(cfg), consumer)
        t.batch_bytes = batch_bytes
        return t

    trials = [measured(start, "start")]
    for _ in range(20):
        proposal = propose_online(s, trials)
        if proposal is None:
            return trials
        trials.append(measured(*proposal))
    raise AssertionError("the online search did not settle")


def test_online_goes_down_while_fed_and_settles_on_the_fewest_that_feed() -> None:
    # 100 samples/s per worker, a loop that takes 250: 3 workers feed it. Starting from 8.
    s = space(cpus=2, consumer=True, baseline=LoaderConfig(8, prefetch_factor=2))
    start = LoaderConfig(8, prefetch_factor=2, persistent_workers=True)
    trials = online(s, latency_bound(per_worker=100), 250.0, start, batch_bytes=2**20)
    best = choose(s, trials)
    assert best is not None and best.config.num_workers == 3
    assert trials[1].config.num_workers == 4  # no anchors: halving from where it started


def test_online_from_a_non_persistent_start_still_searches() -> None:
    s = space(cpus=2, consumer=True, baseline=LoaderConfig(2, persistent_workers=True))
    model = latency_bound(per_worker=100)
    start = make_trial(
        LoaderConfig(2, persistent_workers=True), "start", model(LoaderConfig(2)), 1000.0
    )
    proposal = propose_online(s, [start])
    # They mostly wait: aimed at the consumer's pace, 1,000 / 100 per worker, 10% to spare.
    assert proposal is not None and proposal[0].num_workers == 11


def test_online_aims_at_the_pace_while_workers_wait_then_bisects() -> None:
    # 100 samples/s per worker, a loop that takes 3,000: 30 workers feed it. Each starved trial
    # costs training time, so while the workers mostly wait it aims at the loop's pace at once
    # (x16 at most), then bisects down to the fewest that feed it.
    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    s = space(cpus=2, consumer=True, baseline=start, max_workers=256)
    trials = online(s, latency_bound(per_worker=100), 3000.0, start)
    assert [t.config.num_workers for t in trials[:2]] == [2, 32]
    assert sum(not covers(t) for t in trials) <= 4  # few starved trials
    best = choose(s, trials)
    assert best is not None and best.config.num_workers == 29  # the fewest within the margin
    assert len(trials) <= 8


def test_aim_is_bounded_by_the_cpu_time_it_projects() -> None:
    # Waiting workers that still use 0.1 CPU each: 4 of them use 0.4 of 2 CPUs, so at most
    # x4.25 (1.7 CPUs) however far the consumer's pace is.
    def heavy(cfg: LoaderConfig) -> Figures:
        return Figures(100.0 * cfg.num_workers, 0.0, 0.1)

    start = LoaderConfig(4, prefetch_factor=2, persistent_workers=True)
    s = space(cpus=2, consumer=True, baseline=start)
    first = make_trial(start, "start", heavy(start), 1e9)
    assert bottleneck(first, 2) == "latency"
    proposal = propose_online(s, [first])
    assert proposal is not None and proposal[0].num_workers == 17


def uneven_cpu(cfg: LoaderConfig) -> Figures:
    """Skewed per-sample CPU cost on 2 CPUs, in order: the CPUs are full from 2 workers, and a
    deeper pool past the slow samples gains a few percent (statically: 8 workers ~7% above 2)."""
    w = cfg.num_workers
    gain = {0: 0.6, 1: 0.55, 2: 1.0, 4: 1.03, 8: 1.07, 16: 1.06}.get(w, 1.06)
    return Figures(2500 * gain, 0.1, min(1.0, 1.8 / max(1, w)) if w else 0.0)


@pytest.mark.parametrize("batch_bytes", [4096, 2**20])
def test_online_doubles_cpu_bound_workers_up_to_four_per_cpu_while_no_slower(
    batch_bytes: int,
) -> None:
    # A loop that does nothing waits at every count, so the stall cannot guide, and the gains
    # past the CPU count lie within one short trial's noise (5% here): while the workers keep
    # the CPUs busy and each count is no slower than the one before, double them up to 4 per
    # CPU (then the repeats tell which paid). Not for big batches: more workers only add copies.
    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    s = space(cpus=2, consumer=True, baseline=start)
    noisy = lambda cfg: replace(uneven_cpu(cfg), noise=0.05)  # noqa: E731
    trials = online(s, noisy, 1e9, start, batch_bytes=batch_bytes)
    counts = [t.config.num_workers for t in trials]
    if batch_bytes < 2**20:
        assert counts[:3] == [2, 4, 8] and max(counts) == 8
        assert "more batches in flight" in trials[2].reason
    else:
        assert 8 not in counts


def test_online_does_not_try_zero_workers_when_the_work_would_stall_the_loop() -> None:
    # One worker busy decoding (0.9 of a core) feeds a loop that takes 400 samples/s: without
    # workers the loop would do that work between its steps and wait about half the time.
    def decode(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        return Figures(250, 1.0, 0.0) if w == 0 else Figures(500 * min(w, 1.7), 0.2, 0.9)

    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    trials = online(space(cpus=2, consumer=True, baseline=start), decode, 400.0, start)
    assert [t.config.num_workers for t in trials] == [2, 1]
    # Tiny samples whose worker barely computes: no workers is worth a trial.
    tiny_trials = online(space(cpus=2, consumer=True, baseline=start), tiny, 1000.0, start)
    assert tiny_trials[-1].config.num_workers == 0


def test_online_tries_no_workers_once_more_workers_stop_helping() -> None:
    # Tiny samples and a loop that takes no time: no configuration feeds it; workers do not
    # beat each other and no workers is fastest.
    s = space(cpus=2, consumer=True, baseline=LoaderConfig(2, prefetch_factor=2))
    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    trials = online(s, tiny, 1e9, start, batch_bytes=2**20)
    best = choose(s, trials)
    assert best is not None and best.config.num_workers == 0


def test_online_tries_no_workers_when_idle_workers_did_not_scale() -> None:
    # Tiny batches, a loop that waits 28% of the time: the workers sit mostly idle (it looks
    # like waiting on I/O) yet 4 of them deliver no more than 2 — the copies between processes
    # limit, so no workers is worth a trial. Where more idle workers did help (remote reads),
    # no-workers is never tried.
    def ipc(cfg: LoaderConfig) -> Figures:
        rate = 150_000.0 if cfg.num_workers == 0 else 76_000.0
        return Figures(rate, 0.26, 0.25, wait_cpu=0.8)  # the loop's wait mostly receiving

    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    s = space(cpus=2, consumer=True, baseline=start)
    trials = online(s, ipc, 105_000.0, start)
    assert [t.config.num_workers for t in trials] == [2, 4, 0]
    remote = online(s, latency_bound(per_worker=100, ceiling=1300), 1700.0, start)
    assert all(t.config.num_workers > 0 for t in remote)


def test_online_does_not_try_no_workers_where_the_workers_cpu_would_stall_the_loop() -> None:
    # Skewed CPU work, nearly fed (autotune's trials): 2 and 3 workers deliver alike, the loop
    # waits 10%, the workers are half idle for want of a faster loop. Their 0.9 of a core,
    # moved into the loop, would stall it about half the time (no workers measured 0.49).
    s = space(cpus=2, consumer=True, baseline=online_cfg(2))
    trials = []
    for w, rate, stall, main, on_cpu, work in (
        (2, 1214.0, 0.104, 0.10, 0.62, 0.94),
        (3, 1200.0, 0.095, 0.12, 0.78, 0.90),
    ):
        t = make_trial(online_cfg(w), "x", Figures(rate, main, work / w, wait_cpu=on_cpu), None)
        t.stall_fraction, t.batch_bytes, t.receive_cpu = stall, 4096, on_cpu * stall
        trials.append(t)
    proposal = propose_online(s, trials)
    assert proposal is None or proposal[0].num_workers > 0, proposal


def test_online_one_trial_busy_receiving_is_enough_to_try_no_workers() -> None:
    # Tabular rows in benchmarks/autotune.py (2026-12-04): 2 workers read as receiving (the
    # loop on a CPU 81% of its wait, 0.16 of a core against the workers' 0.36), 3 workers, as
    # fast within the noise, just under (0.14 against 0.50). Judged on the fastest alone,
    # autotune settled on 2 workers, 11% behind none. The hand-off's cost belongs to the
    # pipeline's batches, not to one count of workers: one trial that shows it is enough.
    s = space(cpus=2, baseline=online_cfg(2))
    s = Space(**{**s.__dict__, "consumer": True})
    trials = []
    for w, rate, stall, main, on_cpu, receive, work in (
        (2, 75_462.0, 0.201, 0.24, 0.81, 0.16, 0.36),
        (3, 77_260.0, 0.180, 0.20, 0.80, 0.14, 0.50),
    ):
        t = make_trial(online_cfg(w), "x", Figures(rate, main, work / w, wait_cpu=on_cpu), None)
        t.stall_fraction, t.batch_bytes, t.receive_cpu = stall, 18_432, receive
        trials.append(t)
    assert [receiving(t) for t in trials] == [True, False]
    proposal = propose_online(s, trials)
    assert proposal is not None and proposal[0].num_workers == 0, proposal


def handing_over(
    workers: int,
    rate: float,
    workers_cpu: float,
    runq: float,
    batch_bytes: int,
    main_cpu: float = 0.26,
    online: bool = True,
) -> Trial:
    """A trial of ``workers`` for a loop of 1,145 samples/s, its workers ``workers_cpu`` busy
    and ``runq`` queued for a CPU, handing over batches of ``batch_bytes``; ``online``: as
    autotune measures it (the loop's wait read), else as tune does."""
    t = make_trial(online_cfg(workers), "x", Figures(rate, main_cpu, workers_cpu / workers), 1145.0)
    t.workers_runq, t.batch_bytes = runq, batch_bytes
    t.wait_cpu = 0.4 if online else None
    return t


@pytest.mark.parametrize(
    ("case", "batch_size", "trial", "want"),
    [
        # The benchmarks' large tensors (autotune, 2026-12-05): 2 workers, CPU-bound, handed
        # over 1.1 GB of 12 MiB batches per second of their CPU. No workers (799 samples/s)
        # came only after 4 and 5 workers (477, 488) were tried.
        ("large", 4, handing_over(2, 490.0, 1.36, 0.36, 12_582_912), 0),
        # The images pipeline, decoding: 96 MB per CPU-second. More workers, as before.
        ("images", 32, handing_over(2, 361.0, 0.74, 0.80, 6_291_712), 4),
        # Workers mostly waiting on big downloads hand over much for little CPU: more workers,
        # also where the loop's own thread keeps the main process busy.
        ("downloads", 4, handing_over(2, 490.0, 0.10, 0.0, 12_582_912), 6),
        ("downloads, busy loop", 4, handing_over(2, 490.0, 0.10, 0.0, 12_582_912, 0.9), 4),
        # A batch sampler of its own: the bytes per second are not known, as before.
        ("no batch size", None, handing_over(2, 490.0, 1.36, 0.36, 12_582_912), 4),
    ],
)
def test_online_tries_no_workers_first_where_the_workers_are_busy_handing_batches_over(
    case: str, batch_size: int | None, trial: Trial, want: int
) -> None:
    s = space(cpus=2, consumer=True, baseline=online_cfg(2), batch_size=batch_size)
    proposal = propose_online(s, [trial])
    assert proposal is not None and proposal[0].num_workers == want, (case, proposal)
    if want == 0:
        assert "hand-off" in proposal[1] and "1,08" in proposal[1], proposal[1]


def test_online_a_stream_busy_handing_over_tries_more_workers_before_none() -> None:
    # A stream's trial is a whole epoch: none is tried only once more workers stopped helping.
    s = space(cpus=2, consumer=True, baseline=online_cfg(2), batch_size=4, busy_worker_cpu=0.7)
    proposal = propose_online(s, [handing_over(2, 490.0, 1.36, 0.36, 12_582_912)])
    assert proposal is not None and proposal[0].num_workers == 4, proposal


def test_online_large_batches_settle_without_workers_after_one_trial_with_them() -> None:
    # Workers at any count deliver 490 samples/s, busy handing over 12 MiB batches; none
    # deliver 799: after the start (2 workers), no workers, and nothing more.
    def measured(cfg: LoaderConfig) -> Trial:
        if cfg.num_workers == 0:
            t = make_trial(cfg, "x", Figures(799.0, 1.27, 0.0), 1145.0)
            t.batch_bytes = 12_582_912
            return t
        return handing_over(cfg.num_workers, 490.0, 1.36, 0.36, 12_582_912)

    s = space(cpus=2, consumer=True, baseline=online_cfg(2), batch_size=4)
    trials = [measured(online_cfg(2))]
    while (proposal := propose_online(s, trials)) is not None and len(trials) < 10:
        trials.append(measured(proposal[0]))
    assert [t.config.num_workers for t in trials] == [2, 0]
    best = choose(s, trials)
    assert best is not None and best.config.num_workers == 0


@pytest.mark.parametrize("online", [True, False])
def test_online_no_more_cpu_bound_workers_past_one_per_cpu_once_none_was_faster(
    online: bool,
) -> None:
    # The large tensors (benchmarks/first_epoch.py, 2026-12-05): 2 workers, then 4 (more
    # delivered), then none, faster than both; 8 were tried next. Past a worker per CPU,
    # CPU-bound workers slower than none only queue. With 4 workers on 8 CPUs more may still
    # scale past none; and tune's search (offline) is as before.
    def trials_on(cpus: int) -> tuple[Space, list[Trial]]:
        s = space(cpus=cpus, consumer=True, baseline=online_cfg(2))
        two = handing_over(2, 440.0, 1.36, 0.40, 4096, online=online)
        four = handing_over(4, 500.0, 1.40, 0.60 * 4, 4096, online=online)
        two.stall_fraction, four.stall_fraction = 0.30, 0.25
        none = make_trial(online_cfg(0), "x", Figures(799.0, 1.27, 0.0), 1145.0)
        return s, [two, four, none]

    s, trials = trials_on(2)
    assert bottleneck(trials[1], 2) == "cpu"
    proposal = propose_online(s, trials)
    assert (proposal is None) is online, proposal
    s, trials = trials_on(8)
    proposal = propose_online(s, trials)
    assert proposal is not None and proposal[0].num_workers == 8, proposal


def test_online_after_a_retune_cpu_bound_workers_slower_than_none_get_no_deeper_pool() -> None:
    # A re-tune from none (small CPU-bound batches, 2 CPUs): 1 and 2 workers both well behind
    # it, 2 no slower than 1. A deeper pool (4) was proposed past them.
    s = space(cpus=2, consumer=True, baseline=online_cfg(0))
    none = make_trial(online_cfg(0), "x", Figures(900.0, 1.0, 0.0), 1145.0)
    one = handing_over(1, 500.0, 0.95, 0.10, 4096)
    two = handing_over(2, 510.0, 1.60, 0.40, 4096)
    assert bottleneck(two, 2) == "cpu"
    proposal = propose_online(s, [none, one, two])
    assert proposal is None, proposal


@pytest.mark.parametrize("batch_size", [4, None])
def test_online_after_a_retune_one_worker_busy_handing_over_is_not_followed_by_more(
    batch_size: int | None,
) -> None:
    # A re-tune of the large tensors, settled without workers (a noisy stretch raised their
    # stall): one worker, CPU-bound handing over 12 MiB batches, trails none. More would only
    # add hand-offs (1, 2, 4 and 8 were tried). Without the batch size, as before: more.
    s = space(cpus=2, consumer=True, baseline=online_cfg(0), batch_size=batch_size)
    none = make_trial(online_cfg(0), "x", Figures(799.0, 1.27, 0.0), 1145.0)
    one = handing_over(1, 300.0, 0.95, 0.10, 12_582_912)
    none.batch_bytes, one.wait_cpu = 12_582_912, 0.4
    proposal = propose_online(s, [none, one])
    if batch_size is None:
        assert proposal is not None and proposal[0].num_workers == 2, proposal
    else:
        assert proposal is None, proposal


@pytest.mark.parametrize("online", [True, False])
def test_online_a_lower_stall_with_less_delivered_is_no_reason_for_more_workers(
    online: bool,
) -> None:
    # The benchmarks' large tensors (autotune, 2026-12-05), with no batch size to tell the
    # hand-off by: 2 workers 490 samples/s at a 15% stall, 4 workers 477 at 11.7%. The stall
    # fell because the loop's step grew (it frees the batches the workers handed over), not
    # because more was delivered: 5 workers were tried next. Now no workers are. tune's
    # search (offline), whose trials cost no training time, is as before.
    s = space(cpus=2, consumer=True, baseline=online_cfg(2))
    two, four = (
        handing_over(2, 490.0, 1.36, 0.36, 12_582_912, online=online),
        handing_over(4, 477.0, 1.35, 0.54, 12_582_912, online=online),
    )
    two.stall_fraction, four.stall_fraction = 0.150, 0.117
    proposal = propose_online(s, [two, four])
    assert proposal is not None and (proposal[0].num_workers == 0) is online, proposal
    # With as much delivered as the stall cut says, more workers are still tried.
    four = handing_over(4, 490.0 * 0.883 / 0.850, 1.35, 0.54, 12_582_912, online=online)
    four.stall_fraction = 0.117
    proposal = propose_online(s, [two, four])
    assert proposal is not None and proposal[0].num_workers > 4, proposal


def test_online_does_not_try_no_workers_where_one_worker_makes_a_sliver_of_the_rate() -> None:
    # A re-tune forgets the counts that scaled: a remote pipeline measured again at 24 workers,
    # then 45 no faster, the loop still waiting 41%. Alone, the main process would do one
    # worker's work (54 samples/s) against 1,300: no workers is not worth a trial. At 2 and 4
    # workers of the same kind of pipeline (no faster at 4) it still is.
    s = space(cpus=2, baseline=LoaderConfig(24, prefetch_factor=2, persistent_workers=True))
    s = Space(**{**s.__dict__, "consumer": True})

    def trials_of(*rates: tuple[int, float]) -> list[Trial]:
        return [
            make_trial(
                LoaderConfig(w, prefetch_factor=2, persistent_workers=True),
                "x",
                Figures(rate, 0.19, 0.51 / w),
                consumer=2200.0,
            )
            for w, rate in rates
        ]

    assert propose_online(s, trials_of((24, 1297.0), (45, 1235.0))) is None
    s = Space(**{**s.__dict__, "baseline": LoaderConfig(2, prefetch_factor=2)})
    few = propose_online(s, trials_of((2, 1297.0), (4, 1235.0)))
    assert few is not None and few[0].num_workers == 0


@pytest.mark.parametrize(("wait_cpu", "more"), [(0.7, False), (0.2, True)])
def test_online_one_worker_far_behind_none_stops_where_the_main_process_is_receiving(
    wait_cpu: float, more: bool
) -> None:
    # After a re-tune at no workers (tabular rows, 62,500 samples/s), one worker delivers half
    # as much. With the loop on a CPU 70% of its wait (receiving batches) more workers only
    # add hand-offs: none stays (2, 4 and 7 were each measured behind it). Where the loop
    # mostly idled (a worker waiting on storage), more may still scale from one.
    s = space(cpus=2, baseline=online_cfg(0))
    s = Space(**{**s.__dict__, "consumer": True})
    trials = [
        make_trial(online_cfg(w), "x", Figures(rate, 0.1, 0.2), consumer=100_000.0)
        for w, rate in ((0, 62_500.0), (1, 31_600.0))
    ]
    trials[1].wait_cpu = wait_cpu
    trials[1].receive_cpu = wait_cpu * (trials[1].stall_fraction or 0.0)
    proposal = propose_online(s, trials)
    assert (proposal is not None and proposal[0].num_workers > 1) is more, proposal


@pytest.mark.parametrize(("wait_cpu", "more"), [(0.70, False), (0.74, False), (0.10, True)])
def test_online_latency_bound_workers_stop_where_the_loop_waits_on_its_own_receiving(
    wait_cpu: float, more: bool
) -> None:
    # remote under benchmarks/autotune.py's consumer (2026-12-05): 30 workers left a 15% stall,
    # the loop's thread on a CPU 70% of that wait (receiving batches), and 39 workers then
    # delivered no more (the static grid: 32 and 64 alike). Only the idle part, 4.5%, is the
    # workers' to cut: no more workers. Where the loop idled, they are aimed at its pace.
    s = space(cpus=2, baseline=online_cfg(30), consumer=True)
    t = remote_trial(30, 2178)
    t.stall_fraction, t.wait_cpu = 0.15, wait_cpu
    proposal = propose_online(s, [t])
    assert (proposal is not None and proposal[0].num_workers > 30) is more, proposal


@pytest.mark.parametrize(
    ("workers", "main_cpu", "wait_cpu", "stall", "workers_cpu", "busy"),
    [  # autotune's trials on a busy 2-CPU machine
        (4, 0.23, 0.67, 0.25, 0.45, True),  # tabular rows: the process under MAIN_HANDOFF
        (2, 0.22, 0.68, 0.24, 0.50, True),  # the same, the least CPU against the workers'
        (2, 0.18, 0.80, 0.17, 0.28, True),  # dict records
        (6, 0.07, 0.51, 0.10, 0.70, False),  # skewed CPU work, fed: the wait is the hand-off
        (2, 0.08, 0.80, 0.07, 0.54, False),  # a tokenizer, the same
        (32, 0.16, 0.52, 0.23, 0.46, False),  # remote reads at many workers
        (2, 0.04, 0.013, 0.93, 0.05, False),  # remote reads at few: the loop idles
        (0, 0.28, 0.98, 0.25, 0.0, False),  # no workers: nothing to receive
    ],
)
def test_a_main_process_is_receiving_where_the_hand_off_is_a_real_share_of_the_cpu(
    workers: int, main_cpu: float, wait_cpu: float, stall: float, workers_cpu: float, busy: bool
) -> None:
    t = Trial(
        online_cfg(workers),
        "x",
        samples_per_s=1000.0,
        main_cpu=main_cpu,
        workers_cpu=workers_cpu,
        stall_fraction=stall,
        wait_cpu=wait_cpu,
        receive_cpu=wait_cpu * stall,
    )
    assert receiving(t) is busy


def test_online_tries_no_workers_after_busy_workers_making_big_batches() -> None:
    # 12 MiB batches: the workers are busy, much of it copying into shared memory, and more
    # of them do not help; without them there is no copy at all. With small batches, busy
    # workers are doing the work itself: no-workers is not tried.
    def big(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        return Figures(800.0 if w == 0 else 400.0, 0.25, 1.65 / max(1, w))

    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    s = space(cpus=2, consumer=True, baseline=start)
    trials = online(s, big, 1000.0, start, batch_bytes=12 * 2**20)
    assert trials[-1].config.num_workers == 0
    assert all(t.config.num_workers for t in online(s, big, 1000.0, start, batch_bytes=2**16))


def test_a_projected_cpu_ceiling_is_a_target_not_a_wall() -> None:
    # Workers that read (1 ms) then compute (0.5 ms): at 2 workers the CPU time projects the
    # CPUs busy at 4, yet the rate keeps growing to 5.5 workers' worth (the reads leave gaps).
    # Stopping at the projection would leave a quarter on the table.
    def model(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        if w == 0:
            return Figures(600.0, 0.9, 0.0)
        return Figures(600.0 * min(w, 5.5), 0.1, 0.34)

    best, trials = run(space(cpus=2), model)
    assert best.config.num_workers >= 6, [(t.config.num_workers, t.median) for t in trials]
    assert any("while the gain beats the noise" in t.reason for t in trials)


@pytest.mark.parametrize(
    ("main_cpu", "wait_cpu", "tries_zero"),
    [(0.45, None, True), (0.1, None, False), (0.1, 0.65, True), (0.1, 0.38, False)],
)
def test_online_a_main_process_busy_receiving_batches_tries_no_workers(
    main_cpu: float, wait_cpu: float | None, tries_zero: bool
) -> None:
    # A loop that never gets enough: 2, 4 and 8 workers, the workers mostly waiting and more
    # of them a little faster. With the main process busy receiving the batches (tabular rows,
    # dict records) the hand-off is the cost and no workers may be fastest; with it idle
    # (waits on storage) no workers would wait on every read. Busy receiving: a main process
    # on a CPU 0.45 of the time, or a loop on a CPU for 65% of its wait in next() (tabular on
    # a busy machine, where the process read 0.30 in all); 38% is not.
    s = space(cpus=2, baseline=LoaderConfig(2, prefetch_factor=2, persistent_workers=True))
    s = Space(**{**s.__dict__, "consumer": True})
    trials = [
        make_trial(
            LoaderConfig(w, prefetch_factor=2, persistent_workers=True),
            "x",
            Figures(rate, main_cpu, 0.1),
            consumer=1e9,
        )
        for w, rate in ((2, 100_000.0), (4, 130_000.0), (8, 131_000.0))
    ]
    for t in trials:
        t.wait_cpu = wait_cpu
        t.receive_cpu = None if wait_cpu is None else wait_cpu * (t.stall_fraction or 0.0)
    proposal = propose_online(s, trials)
    assert (proposal is not None and proposal[0].num_workers == 0) is tries_zero


def test_no_more_workers_than_an_epoch_has_batches_unless_asked() -> None:
    from feedrate.search.budgets import DEFAULT_MAX_WORKERS, worker_cap

    assert worker_cap(None, 128) == 128  # the 129th worker would make nothing in an epoch
    assert worker_cap(None, None) == DEFAULT_MAX_WORKERS
    assert worker_cap(None, 10_000) == DEFAULT_MAX_WORKERS
    assert worker_cap(300, 128) == 300  # asked for: the user's cap is theirs


def test_one_cpu_latency_bound_steps_up_though_one_worker_only_ties_none() -> None:
    # A rank's share of a node can be one CPU: one waiting worker fetches one sample at a time,
    # as the main process does without workers, so w=1 ties w=0; the workers mostly wait, so
    # the search must go on up, not stop at the tie.
    base = latency_bound(per_worker=100, ceiling=3_000)

    def model(cfg: LoaderConfig) -> Figures:
        f = base(cfg)
        return Figures(100.0, 0.05, 0.0) if cfg.num_workers == 0 else f

    best, trials = run(space(cpus=1), model)
    assert [t.config.num_workers for t in trials][:2] == [0, 1]
    assert best.config.num_workers >= 16


def test_waiting_workers_that_fill_the_cpus_by_their_number_still_step_up() -> None:
    # A rank's one-CPU share: each worker waits (2-3% CPU, a little more with more of them).
    # The step to the count the CPU time projects lands where their number keeps the CPU over
    # 85% busy (26 workers), yet more requests in flight pay up to 34 (5,100 samples/s): the
    # search must not read 26 as CPU-bound and stop there, a quarter short.
    def model(cfg: LoaderConfig) -> Figures:
        w = cfg.num_workers
        if w == 0:
            return Figures(150.0, 0.05, 0.0)
        rate = min(150.0 * w, 5_100.0)
        return Figures(rate, 0.02 + rate * 0.00002, min(0.02 * (1 + w / 40), 0.86 / w))

    best, trials = run(space(cpus=1), model)
    steps = [(t.config.num_workers, round(t.median)) for t in trials]
    assert best.median >= 0.97 * 5_100, steps


def test_workers_queued_behind_each_other_on_cpus_they_fill_are_cpu_bound() -> None:
    # Skewed CPU cost, 32 workers on 2 CPUs: each runnable a third of the time (held up behind
    # a full queue and slow batches), so not "mostly waiting" by its own share, yet together
    # 1.4 CPUs of work and 10.8 of queueing on a machine 1.9 busy, mostly with them.
    queued = make_trial(LoaderConfig(32), "", Figures(1, 0.1, 1.4 / 32), None)
    queued.workers_runq, queued.system_busy_cpus = 10.8, 1.92
    assert bottleneck(queued, 2) == "cpu"
    # Waiting workers on CPUs that other processes fill: their queueing is the others' doing.
    others = make_trial(LoaderConfig(32), "", Figures(1, 0.1, 0.4 / 32), None)
    others.workers_runq, others.system_busy_cpus = 0.8, 1.95
    assert bottleneck(others, 2) == "latency"


def online_trial(workers: int, rate: float, stall: float, noise: float) -> Trial:
    t = make_trial(
        LoaderConfig(workers, prefetch_factor=2, persistent_workers=True),
        "x",
        Figures(rate, 0.1, 1.7 / workers, noise=noise),
        None,
    )
    t.stall_fraction, t.batch_bytes = stall, 4096
    return t


def test_online_stops_adding_workers_that_slow_the_loop_itself() -> None:
    # A loop that does nothing, skewed CPU cost on 2 CPUs: from 8 to 16 workers the stall fell
    # (81% to 70%) only because the loop's own thread queued for a CPU behind them (its step),
    # while less was delivered, within the noise: no more workers, nor a deeper pool.
    start = LoaderConfig(2, prefetch_factor=2, persistent_workers=True)
    s = space(cpus=2, consumer=True, baseline=start)
    trials = [
        online_trial(2, 2001, 0.87, 0.2),
        online_trial(4, 2346, 0.81, 0.15),
        online_trial(8, 2803, 0.72, 0.15),
        online_trial(16, 2194, 0.67, 0.25),
    ]
    proposal = propose_online(s, trials)
    assert proposal is None or proposal[0].num_workers < 16
    # A stall cut with the loop's step unchanged (more delivered in proportion): more...
    fed_faster = [trials[0], online_trial(4, 2001 * 0.19 / 0.13, 0.81, 0.15)]
    proposal = propose_online(s, fed_faster)
    assert proposal is not None and proposal[0].num_workers == 8
    # ... but CPU-bound workers no further than the deepest pool worth trying, 4 per CPU.
    deeper = [*fed_faster, online_trial(8, 2001 * 0.19 / 0.13 * 0.28 / 0.19, 0.72, 0.15)]
    assert propose_online(s, deeper) is None


@pytest.mark.parametrize(
    ("share", "max_workers", "want"),
    [
        (1.0, 64, None),  # CPU-bound: one per usable CPU, the usual start
        (0.5, 64, 3),  # 0.85 * 2 / 0.5 = 3.4: one more than the CPUs
        (0.33, 64, 5),  # the benchmarks' sharded stream: 1 ms read + 0.5 ms parse an item
        (0.01, 64, STREAM_START_PER_CPU * 2),  # waits on reads: capped per CPU
        (0.0, 64, STREAM_START_PER_CPU * 2),
        (0.01, 3, 3),  # max_workers holds
        (0.01, 2, None),
        (None, 64, None),  # nothing measured
    ],
)
def test_a_stream_starts_where_its_probe_workers_would_fill_the_cpus(
    share: float | None, max_workers: int, want: int | None
) -> None:
    got = stream_start(2, share, max_workers)
    if want is None:
        assert got is None
        return
    assert got is not None and got.workers == want
    assert "projected, not measured" in got.what


@pytest.mark.parametrize(
    ("cpus", "share", "want"),
    [
        (2, 0.04, 2 + STREAM_START_OVER_CPUS),  # remote: 42 projected, over-the-CPUs bound
        (2, 0.10, 17),  # 0.85 * 2 / 0.1, past 4 per CPU
        (2, 0.5, 3),
        (2, 0.9, None),  # CPU-bound: one per usable CPU
        (64, 0.01, 64 + STREAM_START_OVER_CPUS),
    ],
)
def test_a_map_style_start_from_its_first_batch_has_no_per_cpu_bound(
    cpus: int, share: float, want: int | None
) -> None:
    # Its first trial is a stretch of batches, not an epoch: 4 per CPU kept remote at 8
    # workers on 2 CPUs, a third of its rate, for its first 40 batches.
    got = map_start(cpus, share, 512)
    if want is None:
        assert got is None
        return
    assert got is not None and got.workers == want and "batch made in this process" in got.what


def remote_trial(workers: int, rate: float) -> Trial:
    """``remote`` under autotune's consumer (2,902 samples/s): none feeds it."""
    t = make_trial(online_cfg(workers), "x", Figures(rate, 0.1, 0.02, noise=0.03), None)
    t.stall_fraction = 1 - rate / 2902
    return t


@pytest.mark.parametrize(
    ("tried", "alive", "going", "budget_mib", "want"),
    [
        ([(30, 2178)], [30], 39, 4096, 30),  # a step up: the lane left waits for a return
        ([(30, 2178)], [30], 39, 1300, None),  # 30 + 39 workers of 20 MiB over the budget
        ([(34, 2315), (47, 2360)], [47, 34], 60, 4096, 34),  # the best so far, not the last
        ([(34, 2000), (47, 2400)], [47, 34], 60, 4096, 47),
        ([(39, 2160), (30, 2178)], [39], 30, 4096, 39),  # a return: the rival, measured again
        ([(0, 900), (2, 800)], [0], 4, 4096, None),  # no workers to keep
    ],
)
def test_online_the_lane_a_return_may_want_keeps_its_workers_within_the_budget(
    tried: list[tuple[int, float]],
    alive: list[int],
    going: int,
    budget_mib: int,
    want: int | None,
) -> None:
    s = space(cpus=2, baseline=online_cfg(8), memory_budget=budget_mib * 2**20, consumer=True)
    seen = [remote_trial(w, r) for w, r in tried]
    got = keep(s, seen, [online_cfg(w) for w in alive], online_cfg(going))
    assert got == (None if want is None else online_cfg(want))


def test_online_no_lane_is_kept_before_a_worker_s_memory_is_known() -> None:
    s = space(cpus=2, baseline=online_cfg(8), memory_budget=2**40, consumer=True)
    t = remote_trial(30, 2178)
    t.worker_uss_max_bytes = None
    assert keep(s, [t], [online_cfg(30)], online_cfg(39)) is None


def test_a_stream_start_on_a_big_machine_stays_near_its_cpus() -> None:
    # 4 per CPU would be 256 workers on 64 CPUs, projected from 2 workers' first items.
    got = stream_start(64, 0.01, 512)
    assert got is not None and got.workers == 64 + STREAM_START_OVER_CPUS


@pytest.mark.parametrize(
    ("busy_worker_cpu", "workers_cpu", "want"),
    [
        (None, 0.85, 2),  # not a measured stream: half as many may do
        (0.37, 0.85, 3),  # 2.3 busy: 3, not 2 (which left the loop waiting 24% of an epoch)
        (0.37, 1.30, None),  # 3.5 of 4 busy: fewer would not feed it, and costs an epoch
        (0.10, 0.20, 3),  # 2 busy of 4: 3
        (0.37, 0.0, 2),  # the workers' CPU was not read: half, as for any loader
    ],
)
def test_online_a_stream_tries_the_workers_its_fed_trial_kept_busy(
    busy_worker_cpu: float | None, workers_cpu: float, want: int | None
) -> None:
    # The benchmarks' sharded stream (2026-12-05): started at 4 workers (fed, 4% stall, the
    # workers 0.85 CPUs), halving tried 2 for a whole epoch at 24% stall before settling on 3.
    # Its probe put a busy worker at 0.37 CPUs: 4 workers kept 2.3 busy.
    s = space(cpus=2, baseline=online_cfg(4))
    s = Space(**{**s.__dict__, "consumer": True, "busy_worker_cpu": busy_worker_cpu})
    t = make_trial(online_cfg(4), "x", Figures(1556.0, 0.04, workers_cpu / 4), None)
    t.stall_fraction = 0.04
    proposal = propose_online(s, [t])
    if want is None:
        assert proposal is None, proposal
    else:
        assert proposal is not None and proposal[0].num_workers == want, proposal


EPOCH_BATCHES, BATCH, BATCH_S = 128, 16, 0.18
"""The ``remote`` benchmark's epoch: 128 batches of 16 samples, each batch 0.18 s in a worker."""


def epoch_in_rounds(cfg: LoaderConfig) -> Figures:
    """Workers that wait (2.5% of a CPU each): an epoch lasts its rounds of one batch per worker,
    the rate is held under 5,000 samples/s by the CPUs, and each worker slows every batch by
    0.1% (processes competing for the CPUs)."""
    w = cfg.num_workers
    if w == 0:
        return Figures(BATCH / BATCH_S, 0.05, 0.0)
    rate = min(5_000.0, EPOCH_BATCHES * BATCH / (rounds(w, EPOCH_BATCHES) * BATCH_S)) * 0.999**w
    return Figures(rate, 0.2, 0.025)


def test_a_pipeline_of_short_epochs_gets_the_fewest_workers_of_the_fastest_round() -> None:
    # 64 workers make the epoch in 2 rounds; 54 (where the CPU time projects the ceiling) take 3
    # and anything from 65 to 127 takes 2 with more processes: the answer is 64, reached
    # without measuring a count between two rounds.
    short = space(max_workers=EPOCH_BATCHES, epoch_batches=EPOCH_BATCHES)
    best, trials = run(short, epoch_in_rounds)
    assert best.config.num_workers == 64
    counts = {t.config.num_workers for t in trials}
    assert all(fewest_alike(c, EPOCH_BATCHES) == c for c in counts)
    step = next(t for t in trials if t.config.num_workers == 64)
    assert "64, the fewest that make an epoch's 128 batches in 2 rounds" in step.reason


def test_a_consumer_is_fed_by_the_fewest_workers_of_the_round_that_feeds_it() -> None:
    # 3,000 samples/s: 4 rounds (32 to 42 workers) deliver 2,750, 3 rounds (43 to 63) 4,000.
    # The answer is 43, and no count between two rounds' fewest is tried on the way.
    short = space(max_workers=EPOCH_BATCHES, epoch_batches=EPOCH_BATCHES, consumer=True)
    best, trials = run(short, epoch_in_rounds, consumer=3_000.0)
    assert best.config.num_workers == 43
    counts = {t.config.num_workers for t in trials}
    assert all(fewest_alike(c, EPOCH_BATCHES) == c for c in counts), sorted(counts)


def test_cpu_bound_steps_are_not_moved_onto_rounds() -> None:
    # 256 batches an epoch: 5 workers make it in 52 rounds, as 4 make it in 64; for workers that
    # share the CPUs the rounds do not set the epoch's length, and the doubling stays a doubling.
    long = space(cpus=2, consumer=True, epoch_batches=256)
    _, trials = run(long, cpu_bound(2), consumer=5_000.0)
    counts = [t.config.num_workers for t in trials]
    assert 4 in counts and 5 not in counts, counts


def test_fewer_online_halves_to_the_fewest_of_the_round() -> None:
    # 43 workers feed the step; half is 21, which makes 128 batches in 7 rounds, as 19 do.
    short = space(cpus=2, consumer=True, epoch_batches=EPOCH_BATCHES)
    fed = make_trial(online_cfg(43), "x", epoch_in_rounds(online_cfg(43)), 1_000.0)
    proposal = propose_online(short, [fed])
    assert proposal is not None and proposal[0].num_workers == 19, proposal


def test_batches_out_of_order_have_no_rounds() -> None:
    # Out of order, DataLoader skips a worker that holds its prefetch: no fixed turn.
    facts = collect()
    unordered = LoaderConfig(2, prefetch_factor=2, in_order=False)
    assert space_for(facts, unordered, consumer=False, epoch_batches=128).epoch_batches is None
    assert space_for(facts, LoaderConfig(0), consumer=False, epoch_batches=128).epoch_batches == 128
