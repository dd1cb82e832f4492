"""The example pipelines in ``examples/``: they import, yield the promised batches, and their
datasets survive pickling (spawned workers) and forked workers."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``examples/<name>.py`` under its own name, as spawned workers will re-import it."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def two_batches(loader: DataLoader[object], **overrides: object) -> list[object]:
    kwargs: dict[str, object] = {"batch_size": loader.batch_size, "num_workers": 0}
    kwargs.update(overrides)
    rebuilt: DataLoader[object] = DataLoader(loader.dataset, **kwargs)  # type: ignore[arg-type]
    iterator = iter(rebuilt)
    batches = [next(iterator), next(iterator)]
    del iterator  # Shuts down any workers now rather than at some later collection.
    return batches


@pytest.fixture
def images(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.setenv("FEEDRATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FEEDRATE_EXAMPLE_IMAGES", "16")
    return load_example("images", monkeypatch)


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("FEEDRATE_EXAMPLE_LATENCY_MS", "1")
    return load_example("remote", monkeypatch)


@pytest.fixture
def tabular(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_example("tabular", monkeypatch)


def test_images_default_count_follows_the_cpus(images: ModuleType) -> None:
    # An epoch of 16 batches is over before 16 workers have had two rounds each: the default
    # grows with the CPUs, from the demo's 512 on 2 CPUs to a cap of 8192.
    assert [images.default_num_images(n) for n in (1, 2, 4, 16, 32, 128)] == [
        512,
        512,
        1024,
        4096,
        8192,
        8192,
    ]


def test_images_batches(images: ModuleType, tmp_path: Path) -> None:
    assert images.cache_dir() == tmp_path / "examples" / "images-v1"
    assert len(images.loader.dataset) == 16
    assert images.loader.batch_size == 32
    for x, y in two_batches(images.loader, batch_size=8):
        assert x.shape == (8, 3, images.CROP_SIZE, images.CROP_SIZE)
        assert x.dtype == torch.float32
        assert y.dtype == torch.int64
        assert bool(((y >= 0) & (y < images.NUM_CLASSES)).all())


def test_images_cache_dir_follows_xdg(
    images: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FEEDRATE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert images.cache_dir() == tmp_path / "xdg" / "feedrate" / "examples" / "images-v1"


def test_images_generation_is_idempotent(images: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "again"
    assert images.ensure_images(root, 4) == 4
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*.jpg")}
    assert len(before) == 4
    assert images.ensure_images(root, 4) == 0
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*.jpg")}
    assert after == before


def test_images_concurrent_generation_leaves_whole_files(
    images: ModuleType, tmp_path: Path
) -> None:
    root = tmp_path / "race"
    with ThreadPoolExecutor(max_workers=2) as pool:
        written = list(pool.map(lambda _: images.ensure_images(root, 8), range(2)))
    assert 8 <= sum(written) <= 16
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == [
        f"{i:05d}.jpg" for i in range(8)
    ]
    for index in range(8):
        path = images.image_path(root, index)
        assert path.read_bytes() == images.render_jpeg(index)
        with Image.open(path) as f:
            f.load()
            assert f.size == (images.IMAGE_SIZE, images.IMAGE_SIZE)


def test_images_augmentation_differs_between_calls(images: ModuleType) -> None:
    dataset = images.loader.dataset
    first, label = dataset[3]
    second, label_again = dataset[3]
    assert label == label_again == images.label_of(3)
    assert not torch.equal(first, second)


def test_images_with_workers_draw_different_crops(images: ModuleType) -> None:
    # Every sample is image 0; workers 0 and 1 take alternate batches. With a fixed generator
    # the run is deterministic, so this does not depend on luck or timing.
    loader = DataLoader(
        images.loader.dataset,
        batch_size=1,
        sampler=[0, 0, 0, 0],
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    batches = [x for x, _ in loader]  # Exhausting the iterator shuts the workers down.
    assert len(batches) == 4
    assert all(x.shape == (1, 3, images.CROP_SIZE, images.CROP_SIZE) for x in batches)
    assert not torch.equal(batches[0], batches[1])


def test_remote_batches(remote: ModuleType) -> None:
    assert len(remote.loader.dataset) == remote.NUM_OBJECTS == 2048
    assert remote.loader.dataset.mean_latency_ms == 1.0
    assert remote.loader.batch_size == 16
    for x, y in two_batches(remote.loader):
        assert x.shape == (16, remote.PAYLOAD_VALUES)
        assert x.dtype == torch.float32
        assert bool((x.abs() <= 1).all())
        assert y.dtype == torch.int64


def test_remote_latency_is_deterministic_and_bounded(remote: ModuleType) -> None:
    mean = remote.MEAN_LATENCY_MS
    latencies = [remote.latency_s(i, mean) for i in range(remote.NUM_OBJECTS)]
    assert latencies == [remote.latency_s(i, mean) for i in range(remote.NUM_OBJECTS)]
    tail = mean * remote.TAIL_FACTOR / 1000
    regular = [s for s in latencies if s != tail]
    low, high = (mean * (1 + sign * remote.JITTER_FRACTION) / 1000 for sign in (-1, 1))
    assert all(low <= s <= high for s in regular)
    assert 0 < len(latencies) - len(regular) < remote.NUM_OBJECTS / 20
    assert 0.95 * mean / 1000 < sum(latencies) / len(latencies) < 1.15 * mean / 1000


def test_remote_payload_is_deterministic(remote: ModuleType) -> None:
    dataset = remote.RemoteShards(num_objects=4, mean_latency_ms=0.0)
    x1, y1 = dataset[2]
    x2, y2 = dataset[2]
    assert torch.equal(x1, x2) and y1 == y2
    with pytest.raises(IndexError):
        dataset[4]


def test_tabular_batches(tabular: ModuleType) -> None:
    assert len(tabular.loader.dataset) == tabular.NUM_ROWS
    assert tabular.loader.batch_size == 256
    for x, y in two_batches(tabular.loader):
        assert x.shape == (256, tabular.NUM_FEATURES)
        assert x.dtype == torch.float32
        assert y.dtype == torch.int64


@pytest.mark.parametrize("name", ["images", "remote", "tabular"])
def test_datasets_pickle_for_spawned_workers(name: str, request: pytest.FixtureRequest) -> None:
    module: ModuleType = request.getfixturevalue(name)
    dataset = module.loader.dataset
    clone = pickle.loads(pickle.dumps(dataset))
    assert type(clone) is type(dataset)
    assert len(clone) == len(dataset)
    assert module.loader.num_workers == 0  # The untuned baseline.
