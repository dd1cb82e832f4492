"""Small local datasets in each data library's own format, written by the tests themselves
(no download), and the checks the library tests share: the ids an epoch yields, the worker
processes alive. Each writer returns the sample ids it wrote; every sample carries its ``id``.

A library is imported only inside its writer, so a test module skips itself with
``pytest.importorskip`` when it is missing. MosaicML streaming imports torchvision's vision
datasets at import time; a torchvision that cannot load beside this torch (PyPI has only its
CUDA build) is replaced by an empty stand-in first, which the parts used here never touch.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import time
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

N = 240  # samples in every dataset here: 15 batches of 16


def ids_of(batch: Any) -> list[int]:
    """The sample ids in a batch (a dict with ``id``, or a tuple whose last field is the ids)."""
    ids = batch["id"] if isinstance(batch, dict) else batch[-1]
    if isinstance(ids, torch.Tensor | np.ndarray):
        return [int(i) for i in ids.reshape(-1).tolist()]
    return [int(i) for i in ids]


def epoch_ids(loader: Iterable[Any], step_s: float = 0.0) -> list[int]:
    """The ids one epoch yields, in order (``step_s``: a training step's sleep per batch)."""
    out: list[int] = []
    for batch in loader:
        out += ids_of(batch)
        if step_s:
            time.sleep(step_s)
    return out


def children() -> list[psutil.Process]:
    """This process's child processes that are alive (not zombies)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(
                p.cmdline()
            ):
                out.append(p)
        except psutil.Error:
            continue
    return out


def none_left(timeout_s: float = 5.0) -> bool:
    """Whether every child process is gone within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while children():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- webdataset -------------------------------------------------------------------------------


def write_tars(root: Path, shards: int = 4, n: int = N) -> str:
    """``shards`` tar files of ``n`` samples in all (``__key__``, ``npy`` image, ``cls``,
    ``id``); returns the brace pattern that names them."""
    import webdataset as wds

    per = n // shards
    for s in range(shards):
        with wds.TarWriter(str(root / f"shard-{s:02d}.tar")) as sink:
            for i in range(s * per, (s + 1) * per):
                image = np.full((3, 12, 12), i % 251, dtype=np.float32)
                sink.write({"__key__": f"s{i:05d}", "npy": image, "cls": i % 10, "id": i})
    return str(root / f"shard-{{00..{shards - 1:02d}}}.tar")


def random_crop(sample: dict[str, Any]) -> dict[str, Any]:
    """An augmentation: an 8×8 crop at a random place (torch's global generator)."""
    y, x = (int(v) for v in torch.randint(0, 5, (2,)))
    image = torch.as_tensor(sample["npy"])[:, y : y + 8, x : x + 8] + torch.randn(1)
    return {**sample, "npy": image}


# -- litdata ----------------------------------------------------------------------------------


def write_litdata(root: Path, n: int = N) -> Path:
    """``n`` samples in litdata's chunked format (``id``, ``x``)."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(root), chunk_size=30)
    for i in range(n):
        writer[i] = {"id": i, "x": torch.full((4,), float(i))}
    writer.done()
    writer.merge()
    return root


# -- MosaicML streaming -----------------------------------------------------------------------


@contextlib.contextmanager
def stub_unloadable_torchvision() -> Iterator[None]:
    """Inside the block, an empty ``torchvision`` in ``sys.modules`` when the real one cannot be
    imported (MosaicML streaming imports ``torchvision.datasets`` for its vision datasets);
    gone afterwards, so that what the rest of the suite imports later (transformers, Lightning)
    sees the machine as it is, whichever order the test files are collected in. transformers,
    which streaming imports, decides once, when first imported, whether torchvision is there:
    it is imported first, so that it decides on the machine and not on the stub."""
    with contextlib.suppress(Exception):
        import transformers  # noqa: F401
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    else:
        yield
        return
    modules = {}
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        modules[name] = module
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.__spec__ = importlib.machinery.ModuleSpec(functional.__name__, None)
    functional.to_tensor = lambda x: x  # type: ignore[attr-defined]
    modules[functional.__name__] = functional
    modules["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
    modules["torchvision.datasets"].CIFAR10 = modules["torchvision.datasets"].VisionDataset  # type: ignore[attr-defined]
    modules["torchvision.transforms"].functional = functional  # type: ignore[attr-defined]
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in modules.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def write_mds(root: Path, n: int = N) -> Path:
    """``n`` samples in MosaicML's MDS format (``id``, ``x``)."""
    from streaming import MDSWriter

    with MDSWriter(
        out=str(root), columns={"id": "int", "x": "ndarray:float32"}, size_limit=1 << 12
    ) as sink:
        for i in range(n):
            sink.write({"id": i, "x": np.full(4, i, dtype=np.float32)})
    return root


# -- Hugging Face datasets --------------------------------------------------------------------


def hf_dataset(n: int = N) -> Any:
    """``n`` samples as a Hugging Face ``Dataset`` in memory (``id``, ``x``)."""
    import datasets

    return datasets.Dataset.from_dict(
        {"id": list(range(n)), "x": [[float(i)] * 4 for i in range(n)]}
    )
