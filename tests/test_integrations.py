"""``feedrate.integrations.loader_from``: the training DataLoader inside each framework's
object, found without importing a framework for anything else; and the words every
integration prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import feedrate
from feedrate.integrations import framework_of, loader_from, shared
from feedrate.integrations.shared import in_words, local_ranks, share_cpus, workers_per_rank

from pipelines import TinyDataset

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def test_importing_the_integrations_imports_no_framework() -> None:
    code = (
        "import sys, feedrate.integrations as i\n"
        "from torch.utils.data import DataLoader\n"
        "assert i.loader_from(DataLoader([1, 2])) is None and i.loader_from(3) is None\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *FRAMEWORKS], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_plain_loader_or_anything_else_is_no_framework_object() -> None:
    assert loader_from(DataLoader(TinyDataset(8))) is None
    assert loader_from(object()) is None and framework_of(DataLoader([1])) is None


def test_the_settings_in_a_framework_s_words() -> None:
    config = feedrate.LoaderConfig(num_workers=8, prefetch_factor=4, persistent_workers=True)
    assert in_words(config, {"num_workers": "w", "pin_memory": "pin"}) == "w=8, pin=False"
    assert in_words(feedrate.LoaderConfig()) == (
        "num_workers=0, prefetch_factor=None, persistent_workers=False, pin_memory=False"
    )


def test_ranks_on_one_node_share_its_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    assert workers_per_rank(16, 1) is None and workers_per_rank(None, 4) is None
    assert workers_per_rank(16, 4) == 4 and workers_per_rank(2, 8) == 1
    facts = feedrate.machine_facts()
    alone: dict[str, Any] = {"machine": facts}
    assert share_cpus(alone, 1) == "" and "max_workers" not in alone
    told: dict[str, Any] = {"machine": facts, "max_workers": 3}
    assert share_cpus(told, 4) == "" and told["max_workers"] == 3
    shared: dict[str, Any] = {"machine": facts}
    said = share_cpus(shared, 2)
    assert shared["max_workers"] == max(1, facts.cpus_usable // 2)
    assert f"2 ranks share {facts.cpus_usable} CPUs, so each may have at most" in said
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_ranks(8) == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert local_ranks(8) == 8


def test_when_the_main_process_fails_the_others_hear_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[Any] = []

    def broadcast(obj: Any) -> Any:
        sent.append(obj)
        return sent[0]

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise feedrate.PipelineError("sample 3 raised ValueError")

    monkeypatch.setattr(shared, "tune", fails)
    loader = DataLoader(TinyDataset(8))
    with pytest.raises(feedrate.PipelineError):
        shared.tune_shared(loader, {}, main=True, broadcast=broadcast)
    with pytest.raises(RuntimeError, match=r"it failed \(PipelineError: sample 3 raised"):
        shared.tune_shared(loader, {}, main=False, broadcast=broadcast)  # rank 1, waiting


def test_lightning_objects_give_their_training_loader() -> None:
    pl = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed")

    class Data(pl.LightningDataModule):  # type: ignore[misc]
        def setup(self, stage: str) -> None:
            self.stage = stage
            self.loader = DataLoader(TinyDataset(16), batch_size=4)

        def train_dataloader(self) -> DataLoader[Any]:
            return self.loader  # only there after setup, as under Trainer.fit

    class Model(pl.LightningModule):  # type: ignore[misc]
        def train_dataloader(self) -> Any:
            return [DataLoader(TinyDataset(4)), DataLoader(TinyDataset(4))]

    data = Data()
    assert framework_of(data) == "lightning"
    assert loader_from(data) is data.loader and data.stage == "fit"
    with pytest.raises(feedrate.UserError, match="gave a list, not one"):
        loader_from(Model())


def test_a_transformers_trainer_gives_the_loader_it_builds(tmp_path: Path) -> None:
    hf = pytest.importorskip("transformers", reason="transformers is not installed")
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.layer(x).mean()}

    args = hf.TrainingArguments(str(tmp_path), report_to=[], use_cpu=True, dataloader_num_workers=0)
    trainer = hf.Trainer(model=Tiny(), args=args, train_dataset=TinyDataset(16))
    inner = loader_from(trainer)
    assert type(inner) is DataLoader and inner.dataset is trainer.train_dataset
    assert framework_of(trainer.get_train_dataloader()) == "accelerate"  # what it opened


def test_an_accelerate_loader_gives_its_base_dataloader() -> None:
    accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed")
    user = DataLoader(TinyDataset(16), batch_size=4)
    prepared = accelerate.Accelerator(cpu=True).prepare(user)
    assert isinstance(prepared, DataLoader)  # it says so of itself, and it is not one
    assert framework_of(prepared) == "accelerate"
    assert loader_from(prepared) is prepared.base_dataloader


def _target_hook_or_skip() -> None:
    import feedrate.loader.target as target

    if "loader_from" not in Path(target.__file__).read_text(encoding="utf-8"):
        pytest.skip("loader/target.py does not ask integrations.loader_from yet")


def test_a_target_may_name_a_lightning_datamodule(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch", reason="Lightning is not installed")
    _target_hook_or_skip()
    (tmp_path / "dm_target.py").write_text(
        "import lightning.pytorch as pl\n"
        "from torch.utils.data import DataLoader\n"
        "class Data(pl.LightningDataModule):\n"
        "    def setup(self, stage):\n"
        "        self.data = list(range(32))\n"
        "    def train_dataloader(self):\n"
        "        return DataLoader(self.data, batch_size=4)\n"
        "dm = Data()\n",
        encoding="utf-8",
    )
    loader = feedrate.load_target(f"{tmp_path / 'dm_target.py'}:dm")
    assert type(loader) is DataLoader and loader.dataset == list(range(32))


def test_a_target_may_name_a_transformers_trainer(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    _target_hook_or_skip()
    (tmp_path / "trainer_target.py").write_text(
        "import torch, transformers\n"
        "class Tiny(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(1, 1)\n"
        "    def forward(self, x):\n"
        "        return {'loss': self.layer(x).mean()}\n"
        f"args = transformers.TrainingArguments({str(tmp_path / 'out')!r}, report_to=[],"
        " use_cpu=True)\n"
        "data = [{'x': torch.tensor([float(i)])} for i in range(32)]\n"
        "trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=data)\n",
        encoding="utf-8",
    )
    loader = feedrate.load_target(f"{tmp_path / 'trainer_target.py'}:trainer")
    assert type(loader) is DataLoader and len(loader.dataset) == 32
