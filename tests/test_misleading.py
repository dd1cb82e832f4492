"""Answers that must not mislead: when every configuration with workers failed, when a budget
kept configurations out, when an epoch is empty for a reason the loader shows, and the words
of what threads would give. Pure rules on synthetic trials, and two small real pipelines."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import feedrate
from feedrate.checks.tune import failed_trials_finding, skipped_finding
from feedrate.errors import PipelineError
from feedrate.loader.config import LoaderConfig
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.search.advice import reason
from feedrate.search.propose import propose
from feedrate.search.space import Space

from faults import CrashInWorkers, Squares, fault, one_shot_sampler


def measured(
    workers: int, rate: float = 1000.0, each: float = 0.9, config: LoaderConfig | None = None
) -> Trial:
    return Trial(
        config or LoaderConfig(workers, persistent_workers=workers > 0),
        "test",
        samples_per_s=rate,
        spread=Spread.of_rates([rate * 0.99, rate, rate * 1.01]),
        main_cpu=0.1 if workers else 0.95,  # without workers it makes the batches itself
        workers_cpu=each * workers,
    )


def failed(workers: int, error: str = "worker 0 was killed by signal SIGSEGV") -> Trial:
    return Trial(LoaderConfig(workers, persistent_workers=True), "test", error=error)


def test_workers_that_all_crashed_are_not_called_slower() -> None:
    base = measured(0)
    trials = [base, failed(2), failed(4)]
    finding = failed_trials_finding(trials)
    assert finding is not None and finding.id == "trials-failed"
    assert "2 of 3 configurations failed" in finding.message and "SIGSEGV" in finding.message
    assert "no configuration with workers ran" in finding.message
    why = reason(Space(2, LoaderConfig(0), 128), base, base, None, trials)
    assert "every configuration with workers failed" in why and "cost more" not in why


def test_workers_measured_slower_keep_their_verdict() -> None:
    base = measured(0, 2000.0)
    trials = [base, measured(2, 900.0), failed(4)]
    why = reason(Space(2, LoaderConfig(0), 128), base, base, None, trials)
    assert "cost more" in why
    finding = failed_trials_finding(trials)
    assert finding is not None and "no configuration with workers" not in finding.message


@pytest.mark.parametrize(
    ("case", "skip", "fix", "not_fix"),
    [
        (
            fault("fd-limit-blocks"),
            "predicted 900 open files over the budget of 51",
            "ulimit -n",
            "memory-limit",
        ),
        (
            fault("shm-blocks"),
            "predicted /dev/shm use 90 MiB over the budget of 32 MiB",
            "--shm-size",
            "ulimit",
        ),
        (
            fault("memory-blocks"),
            "predicted workers' memory 9.00 GiB over the budget of 4.00 GiB",
            "--memory-limit",
            "ulimit",
        ),
    ],
)
def test_a_budget_limit_names_the_budget_that_kept_them_out(
    case: str, skip: str, fix: str, not_fix: str
) -> None:
    trials = [measured(0), Trial(LoaderConfig(64), "test", skipped=skip)]
    finding = skipped_finding(trials)
    assert finding is not None and fix in finding.fix and not_fix not in finding.fix


def test_what_threads_would_give_is_said_in_the_right_multiple() -> None:
    # Latency-bound workers (1% CPU each): the report-only threaded trial of 1 worker on 8
    # threads keeps 8x the requests of 1 worker process, not "twice".
    space = Space(1, LoaderConfig(0), 1, max_threads=8)
    trials = [measured(0, 100.0), measured(1, 200.0, each=0.01)]
    for _ in range(10):
        proposal = propose(space, trials)
        assert proposal is not None
        if proposal[0].threads > 1:
            break
        trials.append(measured(proposal[0].num_workers, 150.0, each=0.01, config=proposal[0]))
    config, why = proposal
    requests = config.num_workers * config.threads
    best = max((t for t in trials if t.config.num_workers), key=lambda t: t.median)
    assert f"{requests / best.config.num_workers:g}×" in why and "twice" not in why


@pytest.mark.parametrize("case", [fault("one-shot-sampler")])
def test_a_one_shot_sampler_is_named_not_called_empty(case: str) -> None:
    loader = DataLoader(list(range(64)), batch_size=4, sampler=one_shot_sampler(64))
    with pytest.raises(PipelineError, match="can be iterated only once"):
        feedrate.measure(loader, batches=32, windows_count=2)


@pytest.mark.parametrize("case", [fault("drop-last-drops-everything")])
def test_drop_last_dropping_the_only_batch_is_named(case: str) -> None:
    loader = DataLoader(Squares(10), batch_size=16, drop_last=True)
    with pytest.raises(PipelineError, match="drop_last=True drops the only batch"):
        feedrate.measure(loader, batches=4, windows_count=2)


@pytest.mark.parametrize("case", [fault("segfault-in-every-worker")])
def test_tune_says_when_every_worker_trial_crashed(case: str) -> None:
    loader = DataLoader(CrashInWorkers(64), batch_size=8)
    result = feedrate.tune(loader, budget_s=30, trial_seconds=0.3, use_cache=False, max_workers=2)
    ids = {f.id for f in result.findings}
    assert result.best.config.num_workers == 0
    assert "trials-failed" in ids, [f.id for f in result.findings]
    assert "every configuration with workers failed" in result.reason


def test_an_answer_that_rests_on_a_loaded_trial_says_so() -> None:
    # Issue 17.5: tune measured w=2 while others took a CPU and answered w=0 with a confident
    # reason; the answer must say it rests on a contended measurement.
    space = Space(2, LoaderConfig(0), 128)
    best, two = measured(0, 300.0), measured(2, 150.0, each=0.4)
    two.system_busy_cpus = 2.0  # 0.1 + 0.8 ours: others kept 1.1 CPUs busy
    best.system_busy_cpus = best.main_cpu
    assert "quiet machine" not in reason(space, best, best, None, [best])
    why = reason(space, best, best, None, [best, two])
    assert "Other processes kept 1.1 of the 2 CPUs busy while w=2 pf=2 persistent was" in why
    assert "on a quiet machine the answer may differ" in why


def test_a_trial_no_slower_than_the_answer_is_not_called_slower() -> None:
    # From a real demo run: the answer (w=2, 1,190) was the cheapest within the noise of the
    # fastest (w=3 pf=4, 1,238); w=3 pf=2 (1,194) was beaten by the fastest but not slower than
    # the answer, and read "-0% slower".
    from feedrate.search.advice import verdicts

    space = Space(2, LoaderConfig(0), 128)
    best, middle, top = measured(2, 1190.0), measured(3, 1194.0), measured(4, 1238.0)
    best.spread = Spread.of_rates([1150.0, 1190.0, 1230.0])  # noisy: within reach of the top
    verdicts(space, [best, middle, top], best)
    assert "slower" not in middle.verdict and "recommended" in middle.verdict
