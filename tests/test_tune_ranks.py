"""``tune`` over the ranks of a distributed job: the figures read as the slowest rank's, each
rank's share of the node, each rank on its own shard, and real jobs (``--nproc-per-node``, two
nodes on one machine) where every rank must take the same decision and no process may be
left when a rank fails."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from feedrate.cli.ranks import without_nproc
from feedrate.distributed.group import ranks_of
from feedrate.distributed.launch import INTERRUPT_FORWARD_S, INTERRUPT_GRACE_S, free_port
from feedrate.distributed.node import of_node, share
from feedrate.errors import UserError
from feedrate.loader.config import LoaderConfig
from feedrate.loader.shards import sharded
from feedrate.machine.facts import collect
from feedrate.results.findings import Finding, over_ranks
from feedrate.results.measurement import Measurement
from feedrate.results.spread import Spread
from feedrate.search.ranks import slowest

from builders import measured as built
from faults import default_signals
from jobs import left_behind, pythonpath, run_job
from pipelines import SleepDataset, TinyDataset, UnshardedStream

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


def measured(rate: float, main_cpu: float, busy: float) -> Measurement:
    return built(
        rate, config=LoaderConfig(2), main_cpu=main_cpu, node_busy=busy, shm=int(rate), batch=8
    )


def test_the_job_is_read_as_its_slowest_rank() -> None:
    fast, slow = measured(1000.0, 0.3, 1.6), measured(600.0, 0.5, 1.7)
    m = slowest([fast, slow])
    assert m.spread.median == 600.0 and m.rank_rates == [1000.0, 600.0]
    # The other rank's CPU (0.3 + 2 × 0.2) is the job's own, not other processes' load; what
    # other processes used is split between the node's 2 ranks, which share its CPUs.
    others = m.processes.system_busy_cpus - 0.5 - 0.4
    assert others == pytest.approx((1.7 - 0.7 - 0.9) / 2)
    assert m.processes.shm_peak_bytes == 1000  # the largest any rank saw
    assert "rank 1 was the slowest of 2" in m.notes


def noisy(windows: list[float]) -> Measurement:
    m = measured(sum(windows) / len(windows), 0.3, 1.6)
    return replace(m, spread=Spread.of_rates(windows))


def test_ranks_within_each_others_noise_are_one_pace_and_pooled() -> None:
    # Many workers: bursty windows, and rank 1 lower by chance. The lower figure alone would
    # read the job 10% slow and hold the configuration back against a quieter one.
    a, b = noisy([5200.0, 4000.0, 6100.0, 4700.0]), noisy([4300.0, 5400.0, 3900.0, 4800.0])
    m = slowest([a, b])
    assert m.rank_rates == [a.spread.median, b.spread.median]
    assert m.spread.median == statistics.median([*a.spread.windows, *b.spread.windows])
    assert m.samples_per_s == pytest.approx((a.samples_per_s + b.samples_per_s) / 2)
    assert any("agreed within their noise" in n for n in m.notes)
    # The same gap with tight windows is a slower rank: it sets the job's pace alone.
    c, d = noisy([5000.0, 5010.0, 4990.0]), noisy([4550.0, 4540.0, 4560.0])
    assert slowest([c, d]).spread.median == 4550.0


def test_each_rank_decides_within_its_share_of_the_node() -> None:
    node = collect()
    half = share(node, 2)
    assert half.cpus_usable == max(1, node.cpus_usable // 2)
    if node.memory_available_bytes is not None:
        assert half.memory_available_bytes == node.memory_available_bytes // 2
    if node.shm_free_bytes is not None:
        assert half.shm_free_bytes == node.shm_free_bytes // 2
    assert share(replace(node, tasks_free=1001), 2).tasks_free == 500  # one pids.max per node
    assert share(node, 1) is node


def test_nodes_are_numbered_and_ranks_counted_per_node() -> None:
    r = ranks_of(3, ["a", "a", "b", "b"])
    assert (r.node, r.nodes, r.local_rank, r.local_world, r.world) == (1, 2, 1, 2, 4)
    assert r.on_node(0) == [0, 1] and not r.main


def test_ranks_pinned_each_to_its_own_cpus_share_all_of_the_node_s() -> None:
    masks = [[0], [1], [0, 1, 2]]  # ranks 0 and 1 pinned on node "a"; rank 2 alone on "b"
    assert ranks_of(0, ["a", "a", "b"], masks).node_cpus == 2
    assert ranks_of(2, ["a", "a", "b"], masks).node_cpus == 3
    assert ranks_of(0, ["a", "a"], [[0], None]).node_cpus is None  # a mask unread
    own = replace(collect(), cpus_affinity=1, cpus_usable=1, cpu_quota=None)
    assert share(own, 2, node_cpus=2).cpus_usable == 1  # its own CPU, not half of it
    four = replace(own, cpus_affinity=4, cpus_usable=4)
    assert share(four, 2, node_cpus=4).cpus_usable == 2
    assert share(replace(four, cpu_quota=2.0, cpus_usable=2), 2, node_cpus=4).cpus_usable == 1
    assert of_node(own, 2).cpus_usable == 2 and of_node(own, None) is own
    told = replace(own, cpus_affinity=16, cpus_usable=2)  # machine={"cpus_usable": 2}, unpinned
    assert share(told, 2, node_cpus=16).cpus_usable == 1


def test_shards_split_the_epoch_between_the_ranks() -> None:
    loader = DataLoader(TinyDataset(40), batch_size=4, shuffle=True)
    seen = []
    for rank in range(2):
        shard = sharded(loader, rank, 2)
        assert isinstance(shard.sampler, DistributedSampler) and shard.batch_size == 4
        seen += [int(i) for batch in shard for i in batch[:, 0].tolist()]
    assert sorted(seen) == list(range(40))
    already = DataLoader(TinyDataset(8), sampler=DistributedSampler(TinyDataset(8), 2, 0))
    assert sharded(already, 0, 2) is already


def test_a_rank_of_a_launched_job_without_its_process_group_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each rank of a torchrun job that never called init_process_group tuned alone, as if the
    # whole machine were its own: the oversubscription a coordinated tune exists to prevent.
    import feedrate

    loader = DataLoader(TinyDataset(64), batch_size=8)
    with pytest.raises(UserError, match=r"coordinate=True needs torch\.distributed"):
        feedrate.tune(loader, coordinate=True, use_cache=False)
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=r"rank 1 of 2 .*init_process_group\(\) in every rank"):
        feedrate.tune(loader, use_cache=False)
    alone = feedrate.tune(loader, coordinate=False, use_cache=False, budget_s=5, trial_seconds=0.2)
    assert alone.ranks is None


def test_a_stream_is_not_sharded_behind_its_back() -> None:
    with pytest.raises(UserError, match="IterableDataset splits its stream itself"):
        sharded(DataLoader(UnshardedStream(8), batch_size=2), 0, 2)


def test_the_ranks_findings_are_each_said_once_naming_the_ranks_that_found_them() -> None:
    def f(fid: str, severity: str, message: str) -> Finding:
        return Finding(fid, severity, message, "fix it")  # type: ignore[arg-type]

    per_rank = [
        [f("fd-limit", "warning", "rank 0's limit"), f("shared-rng", "warning", "would share")],
        [f("shared-rng", "error", "4 workers share it"), f("fd-limit", "warning", "rank 1's")],
        [f("copy-on-read", "warning", "grows")],
    ]
    merged = {m.id: m for m in over_ranks(per_rank)}
    assert len(merged) == 3
    # The most severe of a finding's versions, saying which ranks found it.
    assert merged["shared-rng"].severity == "error"
    assert merged["shared-rng"].message == (
        "on ranks 0 and 1 of 3 (each rank checked its own loader): 4 workers share it"
    )
    assert merged["copy-on-read"].message.startswith("on rank 2 of 3 ")
    assert next(iter(merged)) == "shared-rng"  # errors first
    # Found on every rank alike: said once, as rank 0 said it.
    alike = [[f("fd-limit", "warning", "low")], [f("fd-limit", "warning", "low")]]
    assert over_ranks(alike) == [f("fd-limit", "warning", "low")]


def test_the_ranks_run_the_command_without_its_nproc_option() -> None:
    argv = ["tune", "x.py:l", "--nproc-per-node", "2", "--fresh", "--nproc-per-node=3"]
    assert without_nproc(argv) == ["tune", "x.py:l", "--fresh"]
    script_own = ["tune", "x.py:l", "--nproc-per-node", "2", "--", "--nproc-per-node", "8"]
    assert without_nproc(script_own) == ["tune", "x.py:l", "--", "--nproc-per-node", "8"]


TARGET = """
import os
import random
import signal
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from pipelines import SleepDataset, TinyDataset

class SharedRngOnRankOne(SleepDataset):
    def __init__(self, n, sleep_s):
        super().__init__(n, sleep_s)
        if os.environ.get("RANK") == "1":  # a generator made before the workers: rank 1 only
            self.rng = random.Random(0)

    def __getitem__(self, i):
        if hasattr(self, "rng"):
            self.rng.random()
        return super().__getitem__(i)

class FailsOnRankOne(TinyDataset):
    def __getitem__(self, i):
        if os.environ.get("RANK") == "1" and i % 2:
            raise ValueError("rank one's storage is gone")
        return super().__getitem__(i)

def loader():
    return DataLoader(SleepDataset(256, 0.004), batch_size=8)

def failing():
    return DataLoader(FailsOnRankOne(64), batch_size=4)

def slow():
    return DataLoader(SleepDataset(4096, 0.02), batch_size=8)

def rng_on_one():
    return DataLoader(SharedRngOnRankOne(256, 0.004), batch_size=8)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "FEEDRATE_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": pythonpath(TESTS, SRC),
    }


def _two_ranks(tmp_path: Path, *args: str) -> tuple[int, str]:
    """``feedrate ARGS --nproc-per-node 2`` on ``TARGET``'s loaders in ``tmp_path``, within
    300 s: its exit code and all it said."""
    (tmp_path / "job.py").write_text(TARGET, encoding="utf-8")
    run = [sys.executable, "-m", "feedrate", *args, "--nproc-per-node", "2"]
    done = run_job(run, timeout_s=300, env=_env(tmp_path), cwd=tmp_path)
    return done.returncode, done.output


def test_nproc_per_node_tunes_and_checks_the_node_and_only_rank_zero_speaks(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.json"
    options = ["--shard", "--budget-s", "10", "--max-workers", "8", "--json", str(out)]
    code, said = _two_ranks(tmp_path, "tune", "job.py:rng_on_one", *options)
    assert code == 0, said[-3000:]
    assert said.count("feedrate tune job.py:rng_on_one") == 1  # one table: rank 0's
    doc = json.loads(out.read_text())
    assert doc["ranks"]["world_size"] == 2 and doc["ranks"]["local_world_size"] == 2
    measured_trials = [t for t in doc["trials"] if t["spread"] is not None]
    assert measured_trials and all(len(t["rank_rates"]) == 2 for t in measured_trials)
    assert doc["job_samples_per_s"] == pytest.approx(2 * doc["best_samples_per_s"])
    # Each rank's share of the 2 CPUs decided it, and the file says the node's whole machine.
    assert doc["machine"]["cpus_usable"] == collect().cpus_usable
    found = {f["id"]: f for f in doc["findings"]}
    assert "no-distributed-sampler" not in found  # --shard: you said your trainer adds one
    # The answer is for your loader, not for the shard each trial read: no sampler of ours.
    assert "sampler=" not in doc["code"] and doc["code"].startswith("DataLoader(dataset,")
    # ... and says what its figures hold for: training with a DistributedSampler.
    assert doc["ranks"]["shard_made"] is True
    assert "DistributedSampler's shard made for the measurement" in " ".join(said.split())
    # Every rank ran the dataset checks on its own loader: rank 1's trap is found, as its own.
    assert found["shared-rng"]["message"].startswith("on rank 1 of 2")
    assert not left_behind(str(tmp_path))


def test_nproc_per_node_measures_every_rank_at_once_and_rank_zero_speaks(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    options = ["--shard", "-w", "2", "--seconds", "1", "--json", str(out)]
    code, said = _two_ranks(tmp_path, "measure", "job.py:loader", *options)
    assert code == 0, said[-3000:]
    assert said.count("steady state") == 1 and "2 ranks loading at once" in said  # rank 0's
    doc = json.loads(out.read_text())
    assert len(doc["rank_rates"]) == 2 and doc["config"]["num_workers"] == 2
    # The job's figure is the slowest rank's median window, or (ranks within each other's noise)
    # the median of all their windows pooled, which lies between the ranks' own medians.
    low, high = min(doc["rank_rates"]), max(doc["rank_rates"])
    assert low * 0.999 <= doc["spread"]["median"] <= high * 1.001
    code, said = _two_ranks(tmp_path, "measure", "job.py:failing", *options)
    assert code == 3, said[-3000:]
    assert "rank 1 failed" in said and "rank one's storage is gone" in said
    assert not left_behind(str(tmp_path))


def test_every_rank_reading_every_sample_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    options = ["--budget-s", "6", "--max-workers", "2", "--json", str(out)]
    code, said = _two_ranks(tmp_path, "tune", "job.py:loader", *options)
    assert code == 0, said[-3000:]
    doc = json.loads(out.read_text())
    found = {f["id"]: f for f in doc["findings"]}
    assert "no-distributed-sampler" in found
    # The job's figure counts each sample once: one rank's rate, not the two added (QA).
    assert doc["job_samples_per_s"] == pytest.approx(doc["best_samples_per_s"])
    assert "not × 2: every rank reads every sample" in said


def test_a_failing_rank_ends_the_job_naming_it_with_no_process_left(tmp_path: Path) -> None:
    # The target by its full path: every process of the job has tmp_path in its command line.
    code, said = _two_ranks(tmp_path, "tune", f"{tmp_path}/job.py:failing", "--budget-s", "8")
    assert code == 3, said[-3000:]
    assert "rank 1 failed" in said and "rank one's storage is gone" in said
    assert not left_behind(str(tmp_path))


JOB = """
import json, sys
import torch.distributed as dist
import feedrate
from torch.utils.data import DataLoader, DistributedSampler
from pipelines import SleepDataset

dist.init_process_group("gloo")
data = SleepDataset(192, 0.004)
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
result = feedrate.tune(loader, budget_s=8, max_workers=4, use_cache=False)
with open(f"{sys.argv[1]}.{dist.get_rank()}.json", "w") as f:
    json.dump({"best": result.best.config.to_dict(), "ranks": result.ranks,
               "nodes": result.node_rates(), "trials": len(result.trials)}, f)
dist.destroy_process_group()
"""


def test_two_nodes_take_one_decision_and_report_each_node(tmp_path: Path, short_tmp: str) -> None:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    endpoint = f"127.0.0.1:{free_port()}"
    launchers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                "--rdzv-id=feedrate-test",
                "job.py",
                str(tmp_path / "result"),
            ],
            env={**_env(tmp_path), "TMPDIR": short_tmp},  # torchrun's torchelastic_* folders
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in launchers]
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in launchers), "\n".join(o[-2000:] for o in outputs)
    results = [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]  # the same decision on every rank
    assert results[0]["ranks"]["nodes"] == 2 and len(results[0]["nodes"]) == 2


def test_outside_a_job_nothing_changes() -> None:
    import feedrate

    loader = DataLoader(SleepDataset(64, 0.001), batch_size=8)
    result = feedrate.tune(loader, budget_s=5, max_workers=2, use_cache=False)
    assert result.ranks is None and result.node_rates() == []
    assert result.job_rate == result.best_rate
    assert not torch.distributed.is_initialized()


def test_a_mistake_in_the_command_is_said_once(tmp_path: Path, short_tmp: str) -> None:
    (tmp_path / "job.py").write_text(TARGET, encoding="utf-8")
    run = [sys.executable, "-m", "feedrate", "tune", "job.py:nope", "--nproc-per-node", "2"]
    done = subprocess.run(
        run,
        env={**_env(tmp_path), "TMPDIR": short_tmp},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("has no name 'nope'") == 1, done.stderr  # rank 0's, not each rank's


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["tune", "gone.py:loader"], "no such file: gone.py"),
        (["doctor", "job.py"], "bad TARGET 'job.py' (no ':NAME')"),
        (["doctor", "job.py:loader", "--step", "gone.py:step"], "no such file: gone.py"),
    ],
)
def test_a_target_that_is_not_there_is_said_before_any_rank_starts(
    tmp_path: Path, command: list[str], said: str
) -> None:
    (tmp_path / "job.py").write_text(TARGET, encoding="utf-8")
    run = [sys.executable, "-m", "feedrate", *command, "--nproc-per-node", "2"]
    done = subprocess.run(
        run, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "starting 2 ranks" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("signum", "code", "word", "group"),
    [
        (signal.SIGINT, 130, "interrupted", True),  # Ctrl-C: the terminal's whole group
        (signal.SIGTERM, 143, "terminated", False),  # kill PID: the launcher alone
        (signal.SIGINT, 130, "interrupted", False),  # kill -INT PID, a job scheduler
    ],
)
def test_ctrl_c_ends_every_rank_with_one_line(
    tmp_path: Path, short_tmp: str, signum: int, code: int, word: str, group: bool
) -> None:
    p = _started_job(tmp_path, short_tmp)
    assert p.stdout is not None
    seen = []
    for line in p.stdout:  # the first trial done: both ranks are measuring the next
        seen.append(line)
        if "(your settings)" in line:
            break
    sent = time.monotonic()
    (os.killpg if group else os.kill)(p.pid, signum)
    rest, _ = p.communicate(timeout=120)
    took = time.monotonic() - sent
    said = "".join(seen) + rest
    assert p.returncode == code, said[-2000:]
    assert said.count(f"feedrate: {word}") == 1
    assert not left_behind(str(tmp_path))
    # Passed on to the ranks, not waited on for INTERRUPT_GRACE_S (10 s) and then SIGTERM sent
    # (which the word above tells apart: "terminated").
    assert took < INTERRUPT_FORWARD_S + INTERRUPT_GRACE_S, took


def test_ranks_end_when_their_launcher_is_killed(tmp_path: Path, short_tmp: str) -> None:
    """SIGKILL gives the launcher no time to stop its ranks: the kernel tells them."""
    p = _started_job(tmp_path, short_tmp, "slow")  # a tune of minutes
    try:
        assert p.stdout is not None
        said = [p.stdout.readline() for _ in range(2)]  # the ranks are running
        assert len(left_behind(str(tmp_path))) >= 3, said
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 30
    while (left := left_behind(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.2)
    for q in left:
        q.kill()
    p.stdout.close()
    assert not left, [q.pid for q in left]


def _started_job(tmp_path: Path, short_tmp: str, name: str = "loader") -> subprocess.Popen[str]:
    """``feedrate tune --nproc-per-node 2`` on ``TARGET``'s loader ``name``, started: its
    target by its full path, so that every process of the job has ``tmp_path`` in its command
    line."""
    (tmp_path / "job.py").write_text(TARGET, encoding="utf-8")
    run = [sys.executable, "-m", "feedrate", "tune", f"{tmp_path}/job.py:{name}"]
    run += ["--nproc-per-node", "2", "--budget-s", "120", "--fresh"]
    return subprocess.Popen(
        run,
        env={**_env(tmp_path), "TMPDIR": short_tmp},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job is
        preexec_fn=default_signals,  # and Ctrl-C not ignored, even in a run started with `&`
    )


def test_a_rank_gone_before_the_timeout_is_not_called_a_timeout() -> None:
    from feedrate.distributed.channel import Channel
    from feedrate.distributed.group import Ranks

    closed = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:52380")
    pair = Channel(Ranks(0, 2, 0, 2, 0, 1, (0, 0)), None, 340.0, "feedrate.tune")
    said = str(pair._lost("hear from every rank", closed, time.monotonic() - 4))
    assert said.startswith("rank 0 could not hear from every rank during feedrate.tune: rank 1 ")
    assert "closed its connection after 4 s" in said and "within" not in said
    four = Channel(Ranks(2, 4, 2, 4, 0, 1, (0,) * 4), None, 5.0, "feedrate.tune")
    late = str(four._lost("hear from every rank", closed, time.monotonic() - 5))
    assert "within 5 s: another rank failed" in late
