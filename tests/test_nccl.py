"""A job whose training group is NCCL: feedrate's collectives run on gloo groups of its own
beside it (``distributed.channel``), so ``tune`` and ``autotune`` coordinate two ranks whatever
backend the training uses. Needs CUDA and NCCL: CI has neither, and ``benchmarks/gpu.sh`` runs it
on a machine that has them.

With one GPU both ranks sit on it. NCCL refuses two ranks of one communicator on one device, but
it makes the communicator only at the first NCCL collective: the script calls one only where
each rank has a GPU of its own, and feedrate itself never does."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from jobs import left_behind, pythonpath, run_job

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()),
    reason="no CUDA device with NCCL here: the NCCL job runs on a machine with one",
)

SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
import feedrate
from pipelines import SleepDataset

out = sys.argv[1]  # sys.argv[2]: a marker the test finds these processes by
gpus = torch.cuda.device_count()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % gpus)
dist.init_process_group("nccl")
rank = dist.get_rank()
ds = SleepDataset(256, sleep_s=0.003)
loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, shuffle=True, seed=1))
result = feedrate.tune(loader, budget_s=10, trial_seconds=0.3, max_workers=4, use_cache=False)
auto = feedrate.autotune(loader, cache=False, budget_s=10, max_workers=3)
seen = []
for epoch in range(2):
    auto.set_epoch(epoch)
    for batch in auto:
        if gpus >= 2:  # each rank on a GPU of its own: training's NCCL collective, lockstep
            dist.all_reduce(torch.ones(1, device="cuda"))
        seen.extend(batch[:, 0].long().tolist())
auto.close()
doc = {"tune": result.best.config.label(), "ranks": result.ranks,
       "autotune": auto.config.label(), "seen": seen, "backend": dist.get_backend()}
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(doc, f)
dist.destroy_process_group()
"""


@pytest.mark.timeout(240)  # the job's own limit first: on a hang, its stacks are printed
def test_tune_and_autotune_coordinate_two_ranks_beside_an_nccl_group(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT, encoding="utf-8")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path / "cache")}
    env["PYTHONPATH"] = pythonpath(tests)
    marker = f"feedrate-nccl-{os.getpid()}-{time.monotonic_ns()}"
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = [*run, "train.py", str(tmp_path), marker]
    done = run_job(args, timeout_s=180, env=env, cwd=tmp_path, marker=marker, merge=True)
    assert done.returncode == 0, done.output[-3000:]
    assert left_behind(marker) == []
    docs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {d["backend"] for d in docs} == {"nccl"}
    assert docs[0]["tune"] == docs[1]["tune"]  # one decision, every rank
    assert docs[0]["ranks"]["world_size"] == 2
    assert docs[0]["autotune"] == docs[1]["autotune"]
    # Each rank read its own shard, every sample once per epoch over the two ranks.
    both = docs[0]["seen"] + docs[1]["seen"]
    assert sorted(both) == sorted(list(range(256)) * 2)
