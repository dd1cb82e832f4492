"""``feedrate.autotune`` in every rank of a job: the job's figures reduced from every rank's
(``search.job_trial``), tuners that take the same decisions at the same batches from them
(``OnlineTuner(counted=True)``), the lanes handing over at a batch every rank knows, and real
two-rank jobs under torchrun: each rank keeps its shard's order, both switch together, and a
rank that fails ends the job with an error naming it and no process left."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

import feedrate
from feedrate.autotuning import meeting
from feedrate.autotuning.lanes import Feed, Stream
from feedrate.autotuning.ranked import Job
from feedrate.autotuning.start import Start
from feedrate.distributed.channel import Channel, RankError, failure
from feedrate.distributed.group import Ranks
from feedrate.loader.config import LoaderConfig
from feedrate.results.trial import Trial
from feedrate.search.actions import Settle, Try
from feedrate.search.job_trial import job_figures, job_stall, job_trial, rank_figures
from feedrate.search.online_trial import TRIAL_S, TrialTiming
from feedrate.search.space import Space
from feedrate.search.tuner import OnlineTuner
from feedrate.search.watch import RETUNE_WINDOWS, WATCH_BATCHES

from jobs import left_behind, pythonpath, run_job
from pipelines import SleepDataset

ONE = LoaderConfig(num_workers=1, prefetch_factor=2, persistent_workers=True)


def trial(rate: float, stall: float | None) -> Trial:
    return Trial(ONE, "test", samples_per_s=rate, stall_fraction=stall)


# --- the job's figures ---------------------------------------------------------------------


def test_the_job_runs_at_its_slowest_rank_and_stalls_as_its_worst() -> None:
    job = job_trial([trial(900.0, 0.05), trial(600.0, 0.02), trial(800.0, 0.30)])
    assert job.samples_per_s == 600.0  # the slowest rank's figures
    assert job.stall_fraction == 0.30  # the largest wait any rank saw
    assert job.rank_rates == [900.0, 600.0, 800.0]
    with pytest.raises(ValueError, match="no rank"):
        job_trial([])


def test_the_job_s_other_ranks_are_not_other_processes() -> None:
    fast = replace(trial(900.0, 0.0), main_cpu=0.3, workers_cpu=0.5, system_busy_cpus=1.9)
    slow = replace(trial(600.0, 0.0), main_cpu=0.2, workers_cpu=0.6, system_busy_cpus=1.8)
    fast = replace(fast, shm_peak_bytes=4096, startup_s=2.5)
    slow = replace(slow, shm_peak_bytes=1024, startup_s=0.5)
    job = job_trial([fast, slow])
    assert job.startup_s == 2.5  # a lane's start holds every rank as long as the slowest's
    # What the faster rank used (0.8 CPUs) is the job's own load, not another process's; the
    # rest of the node's busy CPUs is split between its 2 ranks, which share them.
    assert job.system_busy_cpus == pytest.approx(0.8 + (1.9 - 0.8 - 0.8) / 2)
    assert job.shm_peak_bytes == 4096  # the largest any rank held in flight
    # On two nodes of one rank each, the slow rank's node is its own: nothing of the fast
    # rank's load is in its figure, only what its node's other processes used.
    apart = job_trial([fast, slow], node_of=[0, 1])
    assert apart.system_busy_cpus == pytest.approx(1.8)  # 0.8 its own + 1.0 others'
    docs = [rank_figures(t, spent_s=1.0, batch_s=0.01, taken=4) for t in (fast, slow)]
    fig = job_figures(docs, node_of=[0, 1])
    assert fig.trial is not None and fig.trial.system_busy_cpus == pytest.approx(1.8)


def test_job_figures_reduce_every_rank_s_document() -> None:
    docs = [
        rank_figures(trial(500.0, 0.1), spent_s=3.0, batch_s=0.01, taken=20),
        rank_figures(trial(400.0, 0.2), spent_s=4.5, batch_s=0.02, taken=23),
    ]
    fig = job_figures(docs)
    assert fig.trial is not None and fig.trial.samples_per_s == 400.0
    assert (fig.spent_s, fig.batch_s, fig.switch_at) == (4.5, 0.02, 23)
    # A rank that measured too little: no trial to conclude, on every rank alike.
    short = job_figures([docs[0], rank_figures(None, spent_s=1.0, batch_s=None, taken=None)])
    assert short.trial is None and short.switch_at is None and short.batch_s == 0.01
    assert job_stall([0.01, 0.4, 0.2]) == 0.4


def test_a_trial_ends_on_its_batch_count_whatever_the_clock() -> None:
    t = TrialTiming.planned(replace(ONE, num_workers=4), "x", warmup=6, epoch_length=None)
    assert t.warmup == 8  # whole rounds
    t.start(0.0)
    for i in range(t.warmup + t.need - 1):
        t.add(4, 0.0, 0.0, float(i))
    assert not t.full()
    t.add(4, 0.0, 0.0, 1e-9)
    assert t.full()  # however little time passed
    longer = TrialTiming.planned(ONE, "x", warmup=0, epoch_length=None, least=40)
    assert longer.need == 40


# --- tuners that agree ------------------------------------------------------------------------


def space() -> Space:
    return Space(cpus=4, baseline=ONE, max_workers=4, consumer=True)


def tuner() -> OnlineTuner:
    return OnlineTuner(
        space(),
        ONE,
        "test",
        settled=False,
        settled_stall=None,
        warmup=lambda cfg: cfg.num_workers + 2 * cfg.num_workers,
        counted=True,
    )


def test_ranks_fed_the_job_s_figures_decide_the_same_at_the_same_batch() -> None:
    # Two ranks on different clocks and different local waits: their decision points are the
    # same batches, and fed the same job figures their tuners move the same way.
    ranks = [tuner(), tuner()]
    pace = [(0.004, 0.010), (0.0001, 0.012)]  # (wait, step) s per batch on each rank
    now = [0.0, 100.0]
    decided: list[list[tuple[int, str]]] = [[], []]
    for t in ranks:
        t.new_epoch(10_000)
        t.lane_started(0.0)
    for _ in range(400):
        for r, t in enumerate(ranks):
            now[r] += sum(pace[r])
            t.observe(8, *pace[r], now[r])
        done = [t.trial_done(now[r]) for r, t in enumerate(ranks)]
        assert done[0] == done[1]  # the same batch on every rank
        if not done[0]:
            continue
        docs = []
        for r, t in enumerate(ranks):
            assert t.trial is not None
            docs.append(
                rank_figures(
                    t.trial.result(None, None),
                    spent_s=t.round_spent_s(now[r]),
                    batch_s=t.trial.seconds_per_batch(),
                    taken=None,
                )
            )
        fig = job_figures(docs)
        assert fig.trial is not None
        for r, t in enumerate(ranks):
            action = t.conclude_job(fig.trial, fig.spent_s, fig.batch_s)
            assert isinstance(action, Try | Settle)
            decided[r].append((t.batch, action.config.label()))
            if isinstance(action, Try):
                t.moved(action.config, action.why, drain=True)
                t.switched(now[r])
        if ranks[0].report.settled:
            break
    assert decided[0] == decided[1] and len(decided[0]) >= 2
    assert ranks[0].config == ranks[1].config
    # TRIAL_S at the job's pace: later trials measured at least that many batches.
    assert ranks[0].trial is None or ranks[0].trial.need >= TRIAL_S / 0.014


def test_a_settled_rank_waits_for_the_job_s_stall_to_tune_again() -> None:
    t = OnlineTuner(
        space(), ONE, "cached", settled=True, settled_stall=0.0, warmup=lambda c: 0, counted=True
    )
    now = 0.0
    # The first window over, read by the clock alone, turns on the run-queue reads (on every
    # rank: the same job figure); the windows read with them decide.
    for window in range(1 + RETUNE_WINDOWS):
        for _ in range(WATCH_BATCHES - 1):
            t.observe(8, 0.5, 0.5, now)  # a stall of 50% here, but not decided locally
            assert t.watch_due is None
        t.observe(8, 0.5, 0.5, now)
        assert t.watch_due == pytest.approx(0.5)
        assert t.report.retunes == 0  # the rank waits for the job's figure
        assert t.wants_queued == (window > 0)
        t.watched(0.6, now)  # the job's stall (the worst rank's)
    assert t.report.retunes == 1 and t.trial is not None


def test_the_start_travels_as_plain_data() -> None:
    start = Start(ONE, "your settings", False, None, space(), "key")
    doc = json.loads(json.dumps(start.to_dict()))
    assert Start.from_dict(doc) == start


def test_a_frozen_lane_yields_its_tail_and_a_thawed_one_gives_it_back() -> None:
    stream = Stream(iter([[i] for i in range(10)]), 10)
    feed = Feed()
    feed.set(stream)
    it = iter(feed)
    assert [next(it), next(it)] == [[0], [1]]
    # A decision says the next lane starts at batch 5: this lane is given 2..4.
    feed.tail = [stream.take() for _ in range(3)]  # type: ignore[misc]
    feed.frozen = True
    assert list(it) == [[2], [3], [4]] and stream.taken == 5
    other = Feed()
    other.set(stream)
    assert [next(iter(other))] == [[5]]


class FakeChannel:
    """What the other ranks answer, given in advance (rank 0 is this one)."""

    def __init__(self, others: list[Any]) -> None:
        self.ranks = Ranks(0, 1 + len(others), 0, 1 + len(others), 0, 1, (0,) * (1 + len(others)))
        self.others = others

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj, *self.others]


def test_a_closed_channel_refuses_calls_rather_than_use_the_job_s_group() -> None:
    channel = Channel(Ranks(0, 2, 0, 2, 0, 1, (0, 0)), object(), 5.0, "feedrate.autotune")
    channel.close()  # outside a job: nothing to destroy, and twice is once
    channel.close()
    with pytest.raises(RankError, match=r"rank 0.s channel for feedrate\.autotune is closed"):
        channel.all_gather({"stall": 0.1})


def test_a_failed_hello_closes_the_first_group(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    destroyed: list[object] = []
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "new_group", lambda **kw: made.append(object()) or made[-1])
    monkeypatch.setattr(dist, "destroy_process_group", destroyed.append)

    def lost(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(dist, "all_gather_object", lost)
    with pytest.raises(RankError, match="rank 0 could not hear from every rank"):
        Channel.open("feedrate.autotune", 5.0, join_s=1.0)
    assert len(made) == 1 and destroyed == made  # the hello's group, and no other left open


class ClosingChannel(FakeChannel):
    def __init__(self, others: list[Any]) -> None:
        super().__init__(others)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_a_loader_whose_ranks_fail_to_meet_closes_its_channel_and_meets_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[ClosingChannel] = []

    def open_job() -> Job:
        opened.append(ClosingChannel([failure(1, MemoryError("out of memory"))]))
        return Job(opened[-1])  # type: ignore[arg-type]

    monkeypatch.setattr(meeting.group, "active", lambda: True)
    monkeypatch.setattr(meeting.Job, "open", staticmethod(open_job))
    auto = feedrate.autotune(DataLoader(SleepDataset(16, sleep_s=0.0), batch_size=4), cache=False)
    for _ in range(2):
        with pytest.raises(RankError, match="rank 1 failed: MemoryError: out of memory"):
            next(iter(auto))
        assert auto._job is None and opened[-1].closed == 1
    assert len(opened) == 2  # the second iteration met the ranks again, on a channel of its own


def test_a_rank_s_failure_reaches_the_others_naming_it() -> None:
    job = Job(FakeChannel([failure(1, OSError("no space left in /dev/shm"))]))  # type: ignore[arg-type]
    with pytest.raises(RankError, match=r"rank 1 failed: OSError: no space left in /dev/shm"):
        job.gather({"stall": 0.1})
    with pytest.raises(RankError, match="rank 1 failed"):  # the job is out of step from here
        job.gather({"stall": 0.1})
    fine = Job(FakeChannel([{"error": None}, {"error": "too many open files"}]))  # type: ignore[arg-type]
    assert fine.started(None) == "rank 2: too many open files"
    uneven = Job(FakeChannel([{"length": 31}]))  # type: ignore[arg-type]
    with pytest.raises(RankError, match="rank 0: 30, rank 1: 31"):
        uneven.same_length(30)


# --- two ranks under torchrun -------------------------------------------------------------

N, BATCH = 240, 4

SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
import feedrate
from pipelines import SleepDataset

mode, out = sys.argv[1], sys.argv[2]  # a marker the test finds these processes by: sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
ds = SleepDataset({n}, sleep_s=0.003)
sampler = DistributedSampler(ds, shuffle=True, seed=3)
loader = DataLoader(ds, batch_size={batch}, sampler=sampler)
auto = feedrate.autotune(loader, cache=False, budget_s=20, max_workers=3)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
if mode in ("nostart", "firstfail") and rank == 1:  # its first trial lane's workers do not
    import threading  # start (firstfail: the lane it starts with, at the first epoch)
    from feedrate.autotuning import lanes
    def failing(obj, failed=[]):
        beside = threading.current_thread().name == "feedrate-lane-start"
        if beside == (mode == "nostart") and not failed:
            failed.append(obj)
            raise OSError("no space left in /dev/shm")
        return iter(obj)
    lanes.iter = failing
log = []
for epoch in range(2):
    auto.set_epoch(epoch)
    for i, batch in enumerate(auto):
        if mode.startswith("fail") and rank == 1 and epoch == 0 and i == 6:
            raise RuntimeError("boom on purpose")
        if mode == "fail-ddp":  # training's own all-reduce, as DDP's backward makes it
            model(batch[:, :1].float()).sum().backward()
        elif mode != "fail":
            dist.all_reduce(torch.ones(1))  # training's own collective: lockstep
        time.sleep(0.002)
        lane = auto._lane.config.label()  # the lane that yielded this batch
        log.append([epoch, i, batch[:, 0].long().tolist(), lane, auto.config.label()])
for i, batch in enumerate(auto):  # both ranks break at the same batch, then go on together
    if i == 3:
        break
again = sum(1 for batch in auto if dist.all_reduce(torch.ones(1)) is None)
assert again == len(auto), again
with open(os.path.join(out, f"rank{{rank}}.json"), "w") as f:
    report = auto.report()
    errors = [t.error for t in report.trials if t.error]
    json.dump({{"log": log, "trials": len(report.trials), "errors": errors}}, f)
job = auto._job
auto.close()
assert auto._job is None and job.channel._group is None, "the channel to the others is closed"
after = sum(1 for batch in auto if dist.all_reduce(torch.ones(1)) is None)  # they meet anew
assert after == len(auto) and auto._job is not None, after
auto.close()
dist.destroy_process_group()
"""


def torchrun(tmp_path: Path, mode: str, timeout_s: float = 100) -> tuple[int, str, float]:
    """Run the script as 2 ranks; its exit status, output and seconds. Under the suite's own
    per-test timeout; on a hang every process prints its stacks and is killed (``jobs``), and
    no process of it may be left either way."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(n=N, batch=BATCH), encoding="utf-8")
    tests = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "FEEDRATE_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": pythonpath(tests),
    }
    marker = f"feedrate-ddp-{mode}-{os.getpid()}-{time.monotonic_ns()}"
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = [*run, str(script), mode, str(tmp_path), marker]
    done = run_job(args, timeout_s=timeout_s, env=env, cwd=tmp_path, marker=marker, merge=True)
    left = left_behind(marker)
    assert left == [], f"processes left behind: {left}"
    return done.returncode, done.stdout, done.seconds


@pytest.mark.parametrize("mode", ["order", "nostart", "firstfail"])
def test_two_ranks_keep_their_shard_order_and_switch_together(tmp_path: Path, mode: str) -> None:
    # "nostart": rank 1's first trial lane cannot start its workers; neither rank's takes over,
    # and both go on, on the lanes they drained, with every batch. "firstfail": the lane rank 1
    # starts with cannot start; both ranks start the epoch on the loader's own settings instead
    # (rank 0's lane, which started, gives back the batches it took).
    code, out, _ = torchrun(tmp_path, mode)
    assert code == 0, out[-3000:]
    docs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    logs = [d["log"] for d in docs]
    if mode in ("nostart", "firstfail"):
        for d in docs:
            assert d["errors"][0] == "did not start: rank 1: no space left in /dev/shm", d
    if mode == "firstfail":
        assert all(log[0][3] == "w=0" for log in logs), [log[0] for log in logs]
    ds = SleepDataset(N, sleep_s=0.0)
    for r, log in enumerate(logs):
        for epoch in range(2):
            sampler: DistributedSampler[int] = DistributedSampler(
                ds, num_replicas=2, rank=r, shuffle=True, seed=3
            )
            sampler.set_epoch(epoch)
            want = list(sampler)
            got = [i for e, _, ids, _, _ in log if e == epoch for i in ids]
            assert got == want  # its shard's order, every index once an epoch
    # The same settings at the same batches on both ranks: those of the lane that yielded
    # each batch, and those decided (which change at the decision, while a lane drains).
    assert [(e, i, lane, cfg) for e, i, _, lane, cfg in logs[0]] == [
        (e, i, lane, cfg) for e, i, _, lane, cfg in logs[1]
    ]
    if mode == "nostart":  # the move was decided while a lane drained, and did not take over
        # (a later one may or may not, within the two epochs, on a busy machine)
        assert len({cfg for *_, cfg in logs[0]}) >= 2, "no move was decided: nothing tested"
    elif mode == "order":
        assert len({lane for *_, lane, _ in logs[0]}) >= 2, "no switch was made: nothing tested"


@pytest.mark.parametrize("mode", ["fail", "fail-lockstep", "fail-ddp"])
def test_a_rank_that_raises_ends_the_job_naming_it(tmp_path: Path, mode: str) -> None:
    # "fail": rank 0 runs ahead to autotune's next call, where it learns rank 1 stopped.
    # "fail-lockstep", "fail-ddp": rank 0 waits in training's all-reduce (DDP's backward's),
    # which fails as rank 1 ends (autotune's word to the others is bounded: it does not keep
    # rank 1 from ending).
    code, out, took = torchrun(tmp_path, mode)
    assert code != 0
    assert "[rank1]: RuntimeError: boom on purpose" in out, out[-3000:]
    if mode == "fail":
        said = "RankError: rank 1 failed: RuntimeError: stopped iterating at batch 6 of epoch 1"
        assert said in out, out[-3000:]
    assert took < 60  # no timeout was waited out
    # Its word to the others still under way, rank 1 ended with its own error, not an abort
    # (a thread that waited inside torch for it, woken as the interpreter ended, was one).
    assert "terminate called" not in out and "SIGABRT" not in out, out[-3000:]
    assert "exitcode  : 1" in out or mode == "fail", out[-3000:]
