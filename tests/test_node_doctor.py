"""The node's doctor: the rules over every rank's facts (``checks.ranks``), each fired by facts
built to need it and quiet on a healthy node; the facts a rank reads off its loader
(``distributed.facts``); and ``feedrate.doctor`` in a real two-rank torchrun job (gloo)."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from feedrate.checks.catalog import CATALOG
from feedrate.checks.ranks import DOCS, node_findings
from feedrate.distributed.channel import RankError, failure
from feedrate.distributed.facts import rank_facts, sharded
from feedrate.distributed.group import Ranks
from feedrate.loader.config import LoaderConfig
from feedrate.loader.libraries import splits_by_rank
from feedrate.render.doctor import doctor_report
from feedrate.results.doctor import Report
from feedrate.results.findings import Finding
from feedrate.results.ranks import RankFacts
from feedrate.workflows import doctor_node
from feedrate.workflows.doctor_node import NODE_CHECKS, meet, on_the_node

from builders import GiB, MiB
from builders import rank_facts as healthy_rank
from jobs import pythonpath, run_job
from pipelines import ShardedStream, SleepDataset

#: A node of 8 usable CPUs, 64 GiB and 16 GiB of /dev/shm, with a GPU.
NODE = {
    "cpus_usable": 8,
    "memory_total_bytes": 64 * GiB,
    "memory_limit_bytes": None,
    "shm_free_bytes": 16 * GiB,
    "accelerator": "cuda",
}


rank = healthy_rank  # but for ``changes``


def job(n: int, **changes: object) -> list[RankFacts]:
    return [rank(r, **changes) for r in range(n)]


def ids(ranks: list[RankFacts], machine: dict[str, object] = NODE) -> list[str]:
    return [f.id for f in node_findings(ranks, dict(machine))]


def only(ranks: list[RankFacts], finding_id: str, machine: dict[str, object] = NODE) -> Finding:
    found = [f for f in node_findings(ranks, dict(machine)) if f.id == finding_id]
    assert len(found) == 1, [f.id for f in node_findings(ranks, dict(machine))]
    return found[0]


def test_a_healthy_node_is_quiet() -> None:
    assert ids(job(4)) == []


def test_one_rank_has_no_node_findings() -> None:
    assert ids([rank(0, num_workers=64, sharded=False, torch_threads=64)]) == []


def test_every_rule_is_in_the_catalog_and_the_doctor_s_checks() -> None:
    assert {d.id for d in DOCS} <= set(CATALOG)
    assert {d.id for d in DOCS} == NODE_CHECKS


def test_workers_past_the_node_s_cpus() -> None:
    assert ids(job(4, num_workers=2)) == []  # 8 workers on 8 CPUs
    f = only(job(4, num_workers=4), "node-worker-oversubscription")
    assert f.severity == "warning"
    assert "4 ranks × 4 workers = 16 worker processes" in f.message
    assert "on 8 usable CPUs" in f.message
    assert f.fix.startswith("num_workers=2 per rank")
    mixed = [rank(0, num_workers=8), rank(1, num_workers=2)]
    assert "2 ranks with 8 + 2 workers = 10" in only(mixed, "node-worker-oversubscription").message


def test_ranks_pinned_each_to_its_own_cpus_count_them_all() -> None:
    # Each of 4 ranks sees only its own 2 CPUs (taskset, numactl): the node has their 8.
    alone = {**NODE, "cpus_usable": 2}
    pinned = [rank(r, num_workers=2, cpu_ids=[2 * r, 2 * r + 1]) for r in range(4)]
    assert ids(pinned, alone) == []
    more = [replace(r, num_workers=3) for r in pinned]
    f = only(more, "node-worker-oversubscription", alone)
    assert "on 8 usable CPUs" in f.message and f.fix.startswith("num_workers=2 per rank")
    same = [rank(r, num_workers=2, cpu_ids=[0, 1]) for r in range(4)]  # all on the same 2
    assert "on 2 usable CPUs" in only(same, "node-worker-oversubscription", alone).message
    told = {**alone, "cpus_affinity": 8}  # machine={"cpus_usable": 2} on 8 CPUs, unpinned
    unpinned = [rank(r, num_workers=2, cpu_ids=list(range(8))) for r in range(4)]
    assert "on 2 usable CPUs" in only(unpinned, "node-worker-oversubscription", told).message
    quota = {**alone, "cpu_quota": 4.0}  # the container's quota binds them together
    assert "on 4 usable CPUs" in only(pinned, "node-worker-oversubscription", quota).message


def test_the_threads_of_threaded_workers_are_named() -> None:
    f = only(job(2, num_workers=8, threads=16), "node-worker-oversubscription")
    assert "each fetching on 16 threads" in f.message


def test_fewer_cpus_than_ranks_asks_for_no_workers() -> None:
    f = only(job(4, num_workers=1), "node-worker-oversubscription", {**NODE, "cpus_usable": 2})
    assert f.fix.startswith("num_workers=0 per rank")


def test_intra_op_threads_past_the_node_s_cpus() -> None:
    assert ids(job(4, torch_threads=2)) == []  # 8 threads on 8 CPUs
    f = only(job(4, torch_threads=8, omp_num_threads=None), "node-thread-oversubscription")
    assert "4 ranks × 8 intra-op threads" in f.message and "OMP_NUM_THREADS unset" in f.message
    assert "= 32 on 8 usable CPUs" in f.message
    assert f.fix.startswith("OMP_NUM_THREADS=2 for every rank")
    set_high = only(job(2, torch_threads=6, omp_num_threads="6"), "node-thread-oversubscription")
    assert "OMP_NUM_THREADS=6" in set_high.message
    # 16 ranks at one thread each on 8 CPUs: no thread to take away, the ranks are too many.
    many = only(job(16, torch_threads=1, omp_num_threads="1"), "node-thread-oversubscription")
    assert many.fix.startswith("at most 8 ranks on this node") and "OMP" not in many.fix


def test_memory_summed_over_the_node_s_ranks() -> None:
    assert ids(job(4, memory_bytes=8 * GiB)) == []  # 32 of 64 GiB: half
    warn = only(job(4, memory_bytes=10 * GiB), "node-memory")
    assert warn.severity == "warning" and "40.0 GiB of its 64.0 GiB (62%)" in warn.message
    err = only(job(4, memory_bytes=20 * GiB), "node-memory")
    assert err.severity == "error" and "OOM" in err.message
    # The container's limit, not the host's memory, is the node's.
    limited = {**NODE, "memory_limit_bytes": 16 * GiB}
    assert only(job(4, memory_bytes=3 * GiB), "node-memory", limited).severity == "warning"
    assert ids(job(4, memory_bytes=None)) == []  # not measured: nothing said


def test_pinned_memory_summed_over_the_node_s_ranks() -> None:
    assert ids(job(4, pinned_bytes=GiB)) == []  # 4 of 6.4 GiB (10%)
    f = only(job(4, pinned_bytes=2 * GiB), "node-pinned-memory")
    assert "4 ranks with pin_memory=True lock about 8.0 GiB" in f.message
    assert f.fix.startswith("DataLoader(..., prefetch_factor=1)")
    # Without an accelerator nothing is pinned (pin-memory-no-accelerator says so per rank).
    assert ids(job(4, pinned_bytes=2 * GiB), {**NODE, "accelerator": "none"}) == []


def test_shm_summed_over_the_node_s_ranks() -> None:
    # 4 ranks × 2 GiB = 8 GiB, 12 GiB with headroom: fits 16 GiB.
    assert ids(job(4, shm_in_flight_bytes=2 * GiB, batch_bytes=512 * MiB)) == []
    warn = only(job(4, shm_in_flight_bytes=3 * GiB, batch_bytes=768 * MiB), "node-shm-too-small")
    assert warn.severity == "warning" and "keep 12.0 GiB of batches in flight" in warn.message
    err = only(job(4, shm_in_flight_bytes=5 * GiB, batch_bytes=GiB), "node-shm-too-small")
    assert err.severity == "error" and "will fail" in err.message
    # 16 GiB / (1.5 × 1 GiB × 4 ranks): 2 batches in flight per rank.
    assert err.fix.startswith("num_workers × prefetch_factor ≤ 2 per rank")


def test_every_rank_reading_every_sample() -> None:
    assert ids(job(2, sharded=None)) == []  # an IterableDataset: not known
    f = only(job(2, sharded=False, sampler="RandomSampler"), "no-distributed-sampler")
    assert f.severity == "error"
    assert f.message.startswith("ranks 0, 1 of 2 read every sample")
    assert "sees every sample 2 times an epoch" in f.message and "DistributedSampler(" in f.fix
    same = only(job(2, sharded=False, sampler="SequentialSampler"), "no-distributed-sampler")
    assert "train on the same batches" in same.message
    # Datasets of different lengths are each rank's own part already.
    parts = [rank(0, sharded=False, dataset_len=500), rank(1, sharded=False, dataset_len=499)]
    assert ids(parts) == []


def test_dispatch_batches_leaves_the_loading_to_rank_zero() -> None:
    assert ids(job(4)) == []
    f = only(job(4, dispatch_batches=True, num_workers=4), "dispatch-batches")
    assert "rank 0's loader with 4 workers loads the batches of all 4 ranks" in f.message
    assert "dispatch_batches=False" in f.fix
    # Only rank 0's loader loads: its workers alone count against the CPUs.
    assert "node-worker-oversubscription" not in ids(job(4, dispatch_batches=True, num_workers=4))
    assert "node-worker-oversubscription" in ids(job(4, num_workers=4))


def test_nodes_are_judged_apart_and_alike_ones_named_together() -> None:
    two_nodes = [rank(r, node=r // 2, local=r % 2, num_workers=4) for r in range(4)]
    assert ids(two_nodes) == []  # 8 workers on each node's 8 CPUs
    busy = [rank(r, node=r // 2, local=r % 2, num_workers=8) for r in range(4)]
    f = only(busy, "node-worker-oversubscription")
    assert f.message.startswith("on nodes 0, 1: 2 ranks × 8 workers = 16")
    one = [rank(r, node=r // 2, local=r % 2, num_workers=8 if r < 2 else 1) for r in range(4)]
    assert only(one, "node-worker-oversubscription").message.startswith("on node 0: ")


def test_rank_facts_round_trip_through_json() -> None:
    facts = rank(1, sharded=None)
    assert RankFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts


# -- what a rank reads off its loader --------------------------------------------------------

RANKS = Ranks(rank=1, world=2, local_rank=1, local_world=2, node=0, nodes=1, node_of=(0, 0))


def test_rank_facts_read_the_loader_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    loader = DataLoader(SleepDataset(32, 0.0), batch_size=4, num_workers=2, pin_memory=True)
    facts = rank_facts(loader, RANKS, batch_bytes=1000, memory_bytes=5)
    assert (facts.rank, facts.node, facts.local_rank) == (1, 0, 1)
    assert (facts.num_workers, facts.prefetch_factor, facts.pin_memory) == (2, 2, True)
    assert facts.omp_num_threads == "3" and facts.torch_threads == torch.get_num_threads()
    assert facts.shm_in_flight_bytes == 1000 * 2 * 2
    assert facts.pinned_bytes == 1000 * (2 * 2 + 1)
    assert facts.memory_bytes == 5 and facts.dataset_len == 32
    assert facts.sharded is False and facts.sampler == "SequentialSampler"
    assert facts.dispatch_batches is False
    unmeasured = rank_facts(DataLoader(SleepDataset(8, 0.0)), RANKS)
    assert unmeasured.shm_in_flight_bytes is None and unmeasured.pinned_bytes is None


class SplitsByRank(SequentialSampler):  # type: ignore[type-arg]
    """A user's sampler that splits by rank, named as DistributedSampler names it."""

    def __init__(self, data: SleepDataset) -> None:
        super().__init__(data)
        self.rank, self.num_replicas = 0, 2


def test_which_loaders_read_only_their_part() -> None:
    ds = SleepDataset(16, 0.0)
    assert sharded(DataLoader(ds, sampler=DistributedSampler(ds, num_replicas=2, rank=0)))
    assert sharded(DataLoader(ds, shuffle=True)) is False
    assert sharded(DataLoader(ds)) is False
    assert sharded(DataLoader(ds, sampler=SplitsByRank(ds))) is True
    assert sharded(DataLoader(ShardedStream(16))) is None  # may split in __iter__
    batches = BatchSampler(DistributedSampler(ds, num_replicas=2, rank=1), 4, False)
    assert sharded(DataLoader(ds, batch_sampler=batches)) is True


def test_accelerate_s_dispatcher_is_known_by_its_class_name() -> None:
    base = DataLoader(SleepDataset(16, 0.0), num_workers=2)

    class DataLoaderDispatcher(DataLoader):  # type: ignore[type-arg]
        __module__ = "accelerate.data_loader"

    class Lookalike(DataLoader):  # type: ignore[type-arg]
        pass

    Lookalike.__name__ = "DataLoaderDispatcher"  # the user's own, not accelerate's
    dispatcher = DataLoaderDispatcher(base.dataset, num_workers=2)
    facts = rank_facts(dispatcher, RANKS)
    assert facts.dispatch_batches and facts.sharded is True
    assert not rank_facts(Lookalike(base.dataset), RANKS).dispatch_batches


def test_outside_a_distributed_job_the_report_is_untouched() -> None:
    report = Report(machine={}, config=LoaderConfig(), findings=[], checks=[], seconds=0.0)
    before = report.to_dict()
    assert (
        on_the_node(
            report, DataLoader(SleepDataset(8, 0.0)), set(NODE_CHECKS), meet(set(NODE_CHECKS), 1.0)
        )
        is report
    )
    assert report.to_dict() == before and report.ranks is None


# -- a real job ------------------------------------------------------------------------------

JOB = """
import os, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
import feedrate
from pipelines import SleepDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
loader = DataLoader(SleepDataset(64, 0.001), batch_size=8, shuffle=True, num_workers=2)
# 2 ranks x 2 workers on 2 usable CPUs, whatever this machine has.
report = feedrate.doctor(loader, trial_seconds=0.3, machine={"cpus_usable": 2})
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w", encoding="utf-8") as f:
    f.write(report.to_json())
if rank == 0:
    print("said:", " ".join(f.id for f in report.findings), flush=True)
dist.destroy_process_group()
"""


def two_ranks(tmp_path: Path, script: str) -> tuple[Any, list[Report]]:
    """``script`` run by ``torchrun --nproc-per-node 2``, and the report each rank wrote."""
    (tmp_path / "job.py").write_text(script, encoding="utf-8")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path), "PYTHONPATH": pythonpath(tests)}
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    done = run_job([*run, "2", "job.py", str(tmp_path)], timeout_s=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    reports = [
        Report.from_json((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1)
    ]
    return done, reports


def test_two_ranks_get_the_same_node_findings(tmp_path: Path) -> None:
    done, reports = two_ranks(tmp_path, JOB)
    node = [[f for f in rep.findings if f.id in NODE_CHECKS] for rep in reports]
    assert node[0] == node[1]
    found = {f.id: f for f in node[0]}
    assert "no-distributed-sampler" in found, [f.id for f in reports[0].findings]
    assert found["no-distributed-sampler"].message.startswith("ranks 0, 1 of 2")
    assert "2 ranks × 2 workers = 4" in found["node-worker-oversubscription"].message
    for rep in reports:
        assert rep.ranks is not None and rep.ranks["world_size"] == 2
        assert [r["rank"] for r in rep.ranks["per_rank"]] == [0, 1]
        # Worker counts judged within the rank's share (1 of the node's 2 CPUs), as tune does:
        # the report's machine stays the node's, for the node's findings.
        assert rep.ranks["cpus_per_rank"] == 1 and rep.machine["cpus_usable"] == 2
        assert "one worker per usable CPU (1)" in [t.reason for t in rep.trials]
        assert next(c for c in rep.checks if c.name == "node").status == "ok"
    assert [line for line in done.stdout.splitlines() if line.strip()] == [
        "said: " + " ".join(f.id for f in reports[0].findings)
    ]  # rank 0 spoke; nothing else in either rank printed


BROKEN = """
import os, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
import feedrate
from pipelines import FailingDataset, SleepDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
data = FailingDataset(64, bad_index=3) if rank == 1 else SleepDataset(64, 0.001)
loader = DataLoader(data, batch_size=8)
report = feedrate.doctor(loader, trial_seconds=0.3)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w", encoding="utf-8") as f:
    f.write(report.to_json())
dist.destroy_process_group()
"""


def test_a_rank_whose_pipeline_raises_is_named_in_every_rank_s_report(tmp_path: Path) -> None:
    _, (first, second) = two_ranks(tmp_path, BROKEN)
    assert second.pipeline_error is not None and "corrupt record 3" in second.pipeline_error
    assert first.pipeline_error == f"rank 1: {second.pipeline_error}"
    failed = [f.message for f in first.findings if f.id == "check-failed"]
    assert any(m.startswith("the examination on rank 1 failed: ") for m in failed), failed
    assert not any("examination on rank" in f.message for f in second.findings)


LOST = """
import os, sys, time
import torch.distributed as dist
from torch.utils.data import DataLoader
import feedrate
from feedrate.workflows import doctor_node
from pipelines import SleepDataset

doctor_node.JOIN_S = 5.0  # how long the ranks wait for one that does not come
dist.init_process_group("gloo")
rank, how = dist.get_rank(), sys.argv[2]
if rank == 1 and how == "absent":
    time.sleep(25)  # alive, but never calls the doctor
    os._exit(0)


def step(batch):
    if rank == 1:
        os._exit(0)  # dies in the middle of its own checks, after meeting the others


loader = DataLoader(SleepDataset(64, 0.001), batch_size=8, num_workers=1)
began = time.monotonic()
report = feedrate.doctor(loader, trial_seconds=0.3, step=step)
node = next(c for c in report.checks if c.name == "node")
print(f"{node.status} after {time.monotonic() - began:.0f} s: {node.detail}", flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("how", ["absent", "dies"])
def test_a_rank_that_is_absent_or_dies_fails_the_node_step_soon(tmp_path: Path, how: str) -> None:
    """Not after the others' long wait for a slow rank (``SKEW_STEPS`` steps, ~10 min here):
    a rank that never comes within the join's wait, one that dies as soon as it is gone."""
    (tmp_path / "lost.py").write_text(LOST, encoding="utf-8")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path), "PYTHONPATH": pythonpath(tests)}
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    done = run_job([*run, "2", "lost.py", str(tmp_path), how], timeout_s=240, env=env, cwd=tmp_path)
    said = [line for line in done.stdout.splitlines() if " after " in line]
    assert len(said) == 1 and said[0].startswith("failed after "), (done.stdout + done.stderr)[
        -3000:
    ]
    assert int(said[0].split()[2]) < 120, said[0]  # the slow rank's wait is 600 s and more
    assert "rank 0 could not" in said[0]


def test_libraries_that_split_by_rank_are_known() -> None:
    datasets = pytest.importorskip("datasets")
    wds = pytest.importorskip("webdataset")
    from datasets.distributed import split_dataset_by_node

    table = datasets.Dataset.from_dict({"x": list(range(8))})
    stream = table.to_iterable_dataset(num_shards=2)
    assert splits_by_rank(split_dataset_by_node(stream, rank=0, world_size=2)) is not None
    assert splits_by_rank(stream) is None
    urls = ["a.tar", "b.tar"]
    split = wds.WebDataset(
        urls, shardshuffle=False, empty_check=False, nodesplitter=wds.split_by_node
    )
    assert splits_by_rank(split) is not None
    assert splits_by_rank(wds.WebDataset(urls, shardshuffle=False, empty_check=False)) is None
    mosaic = type("StreamingDataset", (), {"__module__": "streaming.base.dataset"})
    assert splits_by_rank(type("Mine", (mosaic,), {"__module__": "train"})()) is not None
    assert splits_by_rank(type("StreamingDataset", (), {"__module__": "train"})()) is None
    assert sharded(DataLoader(split_dataset_by_node(stream, rank=1, world_size=2))) is True


def test_accelerate_s_own_loaders() -> None:
    data_loader = pytest.importorskip("accelerate.data_loader")
    ds = SleepDataset(16, 0.0)
    batches = BatchSampler(SequentialSampler(ds), 4, False)
    shard = data_loader.BatchSamplerShard(batches, num_processes=2, process_index=1)
    prepared = data_loader.DataLoaderShard(ds, batch_sampler=shard, num_workers=2)
    facts = rank_facts(prepared, RANKS)
    assert facts.sharded is True and not facts.dispatch_batches and facts.num_workers == 2
    assert sharded(data_loader.DataLoaderShard(ds, batch_size=4)) is False  # one process's
    dispatcher = data_loader.DataLoaderDispatcher(ds, batch_size=4, num_workers=2)
    assert rank_facts(dispatcher, RANKS).dispatch_batches


class FakeChannel:
    """A channel to one other rank, whose answer (a document) is given."""

    def __init__(self, theirs: object) -> None:
        self.ranks = Ranks(0, 2, 0, 2, 0, 1, (0, 0))
        self.theirs, self.closed = theirs, False

    def all_gather(self, mine: object) -> list[object]:
        return [mine, self.theirs]

    def close(self) -> None:
        self.closed = True


def _in_a_job(monkeypatch: pytest.MonkeyPatch, opened: object) -> None:
    def open_channel(*args: object, **kwargs: object) -> object:
        if isinstance(opened, BaseException):
            raise opened
        return opened

    monkeypatch.setattr(doctor_node.group, "active", lambda: True)
    monkeypatch.setattr(doctor_node.Channel, "open", open_channel)


def _report() -> Report:
    return Report(machine=dict(NODE), config=LoaderConfig(), findings=[], checks=[], seconds=0.0)


@pytest.mark.parametrize(
    ("world", "local", "title", "machine"),
    [
        (4, 4, "(over 4 ranks on this node)", "8 usable CPUs (2 per rank: 4 ranks here"),
        (8, 4, "(over 8 ranks, 4 per node)", "8 usable CPUs (2 per rank: 4 ranks here"),
        (2, 1, "(over 2 ranks, 1 per node)", "8 usable CPUs, /dev/shm"),  # no share to say
    ],
)
def test_the_report_says_the_job_and_the_rank_s_share(
    world: int, local: int, title: str, machine: str
) -> None:
    report = _report()
    report.target = "train.py:loader"
    report.ranks = {"world_size": world, "local_world_size": local, "cpus_per_rank": 8 // local}
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(doctor_report(report))
    text = console.export_text()
    assert f"feedrate doctor train.py:loader {title}" in text
    assert machine in text


def test_a_rank_that_fails_is_named_and_the_others_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    channel = FakeChannel(failure(1, RuntimeError("its loader broke")))
    _in_a_job(monkeypatch, channel)
    report = on_the_node(
        _report(), DataLoader(SleepDataset(8, 0.0)), set(NODE_CHECKS), meet(set(NODE_CHECKS), 1.0)
    )
    failed = report.finding("check-failed")
    assert failed is not None and "rank 1 failed: RuntimeError: its loader broke" in failed.message
    assert report.checks[-1].name == "node" and report.checks[-1].status == "failed"
    assert report.ranks is not None and [r["rank"] for r in report.ranks["per_rank"]] == [0]
    assert channel.closed


def test_ranks_that_do_not_meet_make_a_finding_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    _in_a_job(monkeypatch, RankError("rank 0 could not reach every rank within 5 s"))
    report = on_the_node(
        _report(), DataLoader(SleepDataset(8, 0.0)), set(NODE_CHECKS), meet(set(NODE_CHECKS), 1.0)
    )
    failed = report.finding("check-failed")
    assert failed is not None and "could not reach every rank" in failed.message
    assert report.ranks is None


def test_the_gathered_facts_judge_every_rank_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = rank(1, sharded=False, sampler="SequentialSampler", dataset_len=8).to_dict()
    _in_a_job(monkeypatch, FakeChannel(theirs))
    loader = DataLoader(SleepDataset(8, 0.0))
    report = on_the_node(_report(), loader, set(NODE_CHECKS), meet(set(NODE_CHECKS), 1.0))
    assert [f.id for f in report.findings] == ["no-distributed-sampler"]
    asked = on_the_node(
        _report(), loader, {"node-memory"}, meet({"node-memory"}, 1.0)
    )  # only what was asked for
    assert asked.findings == [] and asked.checks[-1].status == "ok"
