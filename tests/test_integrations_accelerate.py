"""accelerate's prepared loaders: the DataLoader inside is tuned and put in its place, a
two-epoch loop trains on it, and dispatch_batches is named for what it costs."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch.utils.data import DataLoader

import feedrate
from feedrate.integrations import loader_from
from feedrate.loader.batches import batch_size_of
from feedrate.render.run import loader_block
from feedrate.results.run import LoaderRun
from feedrate.running.observer import Watch

accelerate = pytest.importorskip(
    "accelerate", reason="accelerate is not installed (feedrate[accelerate])"
)

from feedrate.integrations.accelerate import dispatch_note, tune_prepared  # noqa: E402

from jobs import pythonpath, run_job  # noqa: E402
from pipelines import SleepDataset  # noqa: E402

N, BATCH, SLEEP_S = 64, 8, 0.005
TUNE = {"budget_s": 8.0, "max_workers": 2}


pytestmark = pytest.mark.usefixtures("end_persistent_workers")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path / "cache"))


def prepared(**config: Any) -> tuple[Any, Any, Any]:
    acc = accelerate.Accelerator(
        cpu=True, dataloader_config=accelerate.DataLoaderConfiguration(**config)
    )
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SleepDataset(N, SLEEP_S), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    return acc, (model, optimizer), loader


def test_the_prepared_loader_trains_two_epochs_on_the_tuned_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    acc, (model, optimizer), loader = prepared()
    inner = loader_from(loader)
    assert inner is not None and type(inner) is DataLoader and inner.num_workers == 0
    result = tune_prepared(acc, loader, **TUNE)
    assert result.best.config.num_workers > 0
    assert result.batch_size == BATCH  # the batch sampler's: accelerate's DataLoader has none
    tuned = loader.base_dataloader
    assert tuned is not inner and tuned.dataset is inner.dataset
    out = [line for line in capsys.readouterr().out.splitlines() if "feedrate" in line]
    assert out == [
        f"feedrate: DataLoader(num_workers={result.best.config.num_workers}, "
        f"prefetch_factor={result.best.config.prefetch_factor}, "
        f"persistent_workers={result.best.config.persistent_workers}, "
        f"pin_memory={result.best.config.pin_memory}) ({out[0].split(' (', 1)[1]}"
    ]
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen: list[int] = []
        for batch in loader:
            assert feedrate.config_of(loader.base_dataloader) == result.best.config
            seen += batch[:, 0].long().tolist()  # SleepDataset's sample i is full of i
            loss = model(batch).pow(2).mean()
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        assert sorted(seen) == list(range(N))  # every sample once an epoch


def test_dispatch_batches_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    acc, _, loader = prepared(dispatch_batches=True)
    assert type(loader).__name__ == "DataLoaderDispatcher"
    note = dispatch_note(loader, 4)
    assert note is not None and "(4 here)" in note and "deliver 4×" in note
    assert dispatch_note(prepared()[2], 4) is None
    tune_prepared(acc, loader, **TUNE)
    out = capsys.readouterr().out
    assert (
        "feedrate: dispatch_batches=True: the main process loads the batches of every process"
        in out
    )


def test_only_prepared_loaders_are_taken() -> None:
    acc = accelerate.Accelerator(cpu=True)
    with pytest.raises(feedrate.UserError, match=r"Accelerator\.prepare"):
        tune_prepared(acc, DataLoader(SleepDataset(8, 0.0)))


SCRIPT = """
import sys
import accelerate, feedrate
from torch.utils.data import DataLoader
from pipelines import SleepDataset
from feedrate.integrations.accelerate import tune_prepared

acc = accelerate.Accelerator(cpu=True)
loader = acc.prepare(DataLoader(SleepDataset(64, 0.005), batch_size=8, shuffle=True))
result = tune_prepared(acc, loader, budget_s=8, max_workers=2)
for epoch in range(2):
    loader.set_epoch(epoch)
    seen = [i for batch in loader for i in batch[:, 0].long().tolist()]
    # One write per line: the two ranks share the pipe, and a newline written apart lets the
    # other rank's line in between.
    print(f"rank {acc.process_index} epoch {epoch}: {seen}\\n", end="", flush=True)
label = feedrate.config_of(loader.base_dataloader).label()
told = f"{result.best.config.label()} after {result.search_seconds!r} s"  # one search, not two
print(f"rank {acc.process_index} on {label}, told {told}\\n", end="", flush=True)
"""


def test_two_processes_train_on_the_main_process_s_answer(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT, encoding="utf-8")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path), "PYTHONPATH": pythonpath(tests)}
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"]
    done = run_job(run, timeout_s=100, env=env, cwd=tmp_path)
    out = done.output
    assert done.returncode == 0, out[-2000:]
    assert len([line for line in out.splitlines() if line.startswith("feedrate:")]) == 1
    settled = re.findall(r"rank (\d) on (.+), told (.+) after (.+) s", out)
    assert len(settled) == 2 and len({s[1:] for s in settled}) == 1
    assert settled[0][1] == settled[0][2]  # trained on what the main process found
    for epoch in "01":
        shards = re.findall(rf"rank \d epoch {epoch}: \[(.*)\]", out)
        ids = [int(i) for shard in shards for i in shard.split(", ")]
        assert sorted(ids) == list(range(N))  # the two shards make the epoch, once each


ORDER_SCRIPT = """
import accelerate, torch
from torch.utils.data import DataLoader
from pipelines import SleepDataset

acc = accelerate.Accelerator(cpu=True)
accelerate.utils.set_seed(0)  # the seed of the sampler's generator: the same run to run
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(SleepDataset(64, 0.002), batch_size=4, shuffle=True)
model, optimizer, loader = acc.prepare(model, optimizer, loader)
for epoch in range(2):
    seen = []
    for batch in loader:
        seen += batch[:, 0].long().tolist()
        acc.backward(model(batch).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    print(f"rank {acc.process_index} epoch {epoch}: {seen}\\n", end="", flush=True)
"""


def test_autotune_under_torchrun_keeps_the_shuffled_order_of_every_rank(tmp_path: Path) -> None:
    # On several processes accelerate shuffles with a generator of its own, the RandomSampler's
    # inside its BatchSamplerShard (the base DataLoader's own sampler is a SequentialSampler):
    # the first batch autotune makes in the main process to choose where to start drew on it,
    # and every epoch of --autotune was shuffled otherwise than the plain run's.
    (tmp_path / "train.py").write_text(ORDER_SCRIPT, encoding="utf-8")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path / "cache")}
    env |= {"PYTHONPATH": pythonpath(tests), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"]
    orders = []
    for flags in ([], ["--autotune"]):
        run = [sys.executable, "-m", "feedrate", "run", *flags, "--", *torchrun]
        done = run_job(run, timeout_s=150, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.output[-3000:]
        orders.append(sorted(re.findall(r"rank \d epoch \d: \[.*\]", done.output)))
    plain, tuned = orders
    assert len(plain) == 4 and len(set(plain)) == 4  # 2 ranks × 2 epochs, each shuffled
    assert tuned == plain


def test_feedrate_run_gives_a_prepared_loader_s_batch_size() -> None:
    _, _, loader = prepared()
    assert loader.batch_size is None  # accelerate builds it from a batch_sampler
    assert Watch(loader, "train.py:9", None, 0.0).batch_size == BATCH
    assert Watch(loader.base_dataloader, "train.py:9", None, 0.0).batch_size == BATCH
    # Each of two processes splitting every batch of 8 (split_batches) gets 4.
    split = accelerate.data_loader.BatchSamplerShard(
        loader.batch_sampler, num_processes=2, process_index=0, split_batches=True
    )
    assert batch_size_of(DataLoader(loader.dataset, batch_sampler=split)) == BATCH // 2


def test_feedrate_run_leaves_an_unknown_batch_size_out() -> None:
    console = Console(width=200, record=True, file=io.StringIO())
    for size in (None, BATCH):
        console.print(
            loader_block(LoaderRun("train.py:9", feedrate.LoaderConfig(), 1, batch_size=size))
        )
    text = console.export_text()
    assert "batch_size None" not in text and text.count(f"batch_size {BATCH} ·") == 1
