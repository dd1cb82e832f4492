"""``feedrate measure`` over the ranks of a distributed job, judged as the node's, as tune and
the doctor judge it: a loader without a DistributedSampler has every rank read every sample
(no shards, the job's distinct samples/s is one rank's, and ``no-distributed-sampler`` says
so), and the workers of all the node's ranks are counted against its CPUs."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.measuring.measure import over_cpus_note
from feedrate.render.ranks import measured_ranks_rows
from feedrate.results.measurement import Measurement
from feedrate.results.ranks import RankFacts
from feedrate.workflows.measure_node import judged

from builders import measured, rank_facts
from jobs import left_behind, pythonpath, run_job

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


def job_measured(workers: int, cpus: int) -> Measurement:
    """The slowest rank's figures of a 2-rank job (``search.ranks.slowest``), 500 samples/s,
    with the note one process gives on its workers against its CPUs."""
    return measured(
        500.0,
        config=LoaderConfig(workers),
        workers=0,  # no figures per worker
        batch=8,
        machine={"cpus_usable": cpus, "cpus_affinity": cpus},
        notes=[n for n in [over_cpus_note(workers, cpus)] if n] + ["rank 1 was the slowest of 2"],
        rank_rates=[520.0, 500.0],
    )


def facts(rank: int, workers: int, sharded: bool | None, sampler: str) -> RankFacts:
    return rank_facts(
        rank,
        num_workers=workers,
        sharded=sharded,
        sampler=sampler,
        pin_memory=False,
        dataset_len=256,
    )


def test_ranks_without_a_distributed_sampler_are_judged_as_reading_every_sample() -> None:
    m = job_measured(workers=3, cpus=2)
    whole = judged(m, [facts(r, 3, False, "SequentialSampler") for r in (0, 1)], world=2)
    assert whole.sharded is False
    assert whole.job_rate == 500.0  # one rank's: the other reads the same samples again
    ids = [n.split(":")[0] for n in whole.notes]
    assert ids[:2] == ["no-distributed-sampler", "node-worker-oversubscription"]
    # Both ranks' workers against the node's CPUs, in place of one process's note on them.
    assert "2 ranks × 3 workers = 6 worker processes" in whole.notes[1]
    assert not any(n.startswith("num_workers=3 is above") for n in whole.notes)
    assert "rank 1 was the slowest of 2" in whole.notes
    row = " ".join(text for _, text in measured_ranks_rows(whole))
    assert "every sample" in row and "on its shard" not in row
    assert "500 distinct samples/s" in row

    shards = judged(m, [facts(r, 3, True, "DistributedSampler") for r in (0, 1)], world=2)
    assert shards.sharded is True and shards.job_rate == 1000.0
    assert not any(n.startswith("no-distributed-sampler") for n in shards.notes)
    row = " ".join(text for _, text in measured_ranks_rows(shards))
    assert "each on its shard" in row and "the job: 1,000 samples/s" in row

    # A rank's facts lost: whether the ranks read apart is not known, and not claimed.
    one = judged(m, [facts(0, 3, True, "DistributedSampler")], world=2)
    assert one.sharded is None and one.notes == m.notes
    unknown = replace(m, sharded=None)
    row = " ".join(text for _, text in measured_ranks_rows(unknown))
    assert "on its shard" not in row and "not known" in row


def test_a_node_with_cpus_for_every_rank_s_workers_gets_no_note_on_them() -> None:
    m = judged(job_measured(2, 4), [facts(r, 2, True, "DistributedSampler") for r in (0, 1)], 2)
    assert not any("worker" in n for n in m.notes)


TARGET = """
from torch.utils.data import DataLoader, DistributedSampler
from pipelines import SleepDataset

def whole():
    return DataLoader(SleepDataset(256, 0.004), batch_size=8)

def sharded():
    data = SleepDataset(256, 0.004)
    return DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
"""


def _measured_on_two_ranks(tmp_path: Path, name: str, workers: int) -> tuple[str, dict]:
    """``feedrate measure job.py:NAME -w WORKERS --nproc-per-node 2``, a second of steady
    state: all it said (its whitespace made single spaces: the table wraps) and its JSON."""
    (tmp_path / "job.py").write_text(TARGET, encoding="utf-8")
    out = tmp_path / f"{name}.json"
    run = [sys.executable, "-m", "feedrate", "measure", f"job.py:{name}", "-w", str(workers)]
    run += ["--seconds", "1", "--json", str(out), "--nproc-per-node", "2"]
    env = {
        **os.environ,
        "FEEDRATE_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": pythonpath(TESTS, SRC),
    }
    done = run_job(run, timeout_s=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.output[-3000:]
    return " ".join(done.output.split()), json.loads(out.read_text())


def test_measuring_ranks_that_read_every_sample_claims_no_shards(tmp_path: Path) -> None:
    # One more worker than the CPUs this test may use: one process alone would be told about
    # its workers against the CPUs, but two ranks' workers are what the node runs.
    workers = collect().cpus_usable + 1
    said, doc = _measured_on_two_ranks(tmp_path, "whole", workers)
    assert "2 ranks loading at once, each reading every sample" in said
    assert "on its shard" not in said
    assert "no-distributed-sampler: ranks 0, 1 of 2 read every sample" in said
    assert f"2 ranks × {workers} workers = {2 * workers} worker processes" in said
    assert f"num_workers={workers} is above the" not in said
    assert doc["sharded"] is False and len(doc["rank_rates"]) == 2
    assert doc["job_samples_per_s"] == pytest.approx(doc["samples_per_s"])
    assert not left_behind(str(tmp_path))


def test_measuring_ranks_on_their_shards_says_so(tmp_path: Path) -> None:
    said, doc = _measured_on_two_ranks(tmp_path, "sharded", 1)
    assert "2 ranks loading at once, each on its shard" in said
    assert "no-distributed-sampler" not in said
    assert doc["sharded"] is True
    assert doc["job_samples_per_s"] == pytest.approx(2 * doc["samples_per_s"])
