"""An image-classification input pipeline: JPEG files decoded and augmented on the CPU.

This imitates the classic ``ImageFolder`` + ``RandomResizedCrop`` + ``RandomHorizontalFlip`` +
``ColorJitter`` + ``Normalize`` training pipeline (ImageNet, CIFAR-style folders, most vision
fine-tuning scripts). Every sample costs a few milliseconds of pure CPU work on one core (JPEG
decode, resampling, colour maths), so the bottleneck is CPU: with ``num_workers=0`` one core feeds
the accelerator, more workers help until they use every usable core, and workers beyond the core
count only add memory and contention. The dataset is synthetic and nothing is downloaded:
on first use it writes ``FEEDRATE_EXAMPLE_IMAGES`` small JPEG files (default: 256 per usable CPU,
at least 512 and at most 8192, so that an epoch stays long against the batches in flight on a
many-core machine; about 30 KB each), deterministic per index, into
``$FEEDRATE_CACHE_DIR/examples/images-v1/`` (else ``$XDG_CACHE_HOME/feedrate/...``, else
``~/.cache/feedrate/...``), which takes about 1.6 ms an image once (a second for 512, some 15 s
for 8192, measured on a 2-CPU VM) and is reused afterwards.

Try::

    feedrate measure examples/images.py:loader -w 2
    feedrate tune examples/images.py:loader
    python examples/images.py                 # print a few batch shapes
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageEnhance
from torch.utils.data import DataLoader, Dataset

NUM_IMAGES = 512
"""The fewest images generated when ``FEEDRATE_EXAMPLE_IMAGES`` is not set (2 CPUs' worth)."""
IMAGES_PER_CPU = 256
"""Eight batches of 32 per usable CPU: with a worker per CPU and two batches each in flight, an
epoch still holds several rounds, and the pause between epochs does not dominate the figures."""
MAX_IMAGES = 8192
NUM_CLASSES = 10
IMAGE_SIZE = 256
"""Side of the stored JPEG files, in pixels."""
CROP_SIZE = 128
"""Side of the tensors the dataset returns, in pixels."""
CROP_SCALE = (0.25, 1.0)
"""Range of the crop's area as a fraction of the image (``RandomResizedCrop(scale=...)``)."""
CROP_RATIO = (3 / 4, 4 / 3)
"""Range of the crop's aspect ratio, width / height."""
JITTER = 0.4
"""Brightness, contrast and saturation factors are drawn from ``[1 - JITTER, 1 + JITTER]``."""
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
CACHE_VERSION = "images-v1"
"""Bump when the generated content changes, so stale caches are not reused."""


def cache_dir() -> Path:
    """Where the generated JPEG files live (the directory need not exist yet)."""
    root = os.environ.get("FEEDRATE_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "feedrate"
    return base / "examples" / CACHE_VERSION


def default_num_images(cpus: int) -> int:
    """``IMAGES_PER_CPU`` per usable CPU, within ``NUM_IMAGES .. MAX_IMAGES`` (512 on 2 CPUs)."""
    return max(NUM_IMAGES, min(MAX_IMAGES, IMAGES_PER_CPU * cpus))


def num_images_from_env() -> int:
    """``FEEDRATE_EXAMPLE_IMAGES`` if set (tests use a handful), else ``default_num_images``."""
    value = os.environ.get("FEEDRATE_EXAMPLE_IMAGES")
    return int(value) if value else default_num_images(_usable_cpus())


def _usable_cpus() -> int:
    # The CPUs this process can keep busy: its affinity (a taskset's) within a container's
    # CPU quota, as feedrate counts them (`feedrate env`).
    import feedrate

    return feedrate.machine_facts().cpus_usable


def label_of(index: int) -> int:
    return index % NUM_CLASSES


def image_path(root: Path, index: int) -> Path:
    """``root/class_<label>/<index>.jpg``, the layout ``torchvision.datasets.ImageFolder`` reads."""
    return root / f"class_{label_of(index)}" / f"{index:05d}.jpg"


def render_jpeg(index: int) -> bytes:
    """The JPEG bytes of image ``index``: a colour gradient plus grain, the same on every call.

    Gradients keep the files small and realistic to decode; the grain keeps JPEG from making
    them trivially cheap.
    """
    rng = np.random.default_rng(index)
    ramp = np.linspace(0.0, 1.0, IMAGE_SIZE, dtype=np.float32)
    slopes = rng.uniform(0.2, 1.0, (3, 2)).astype(np.float32)
    base = slopes[:, 0, None, None] * ramp[None, None, :] + slopes[:, 1, None, None] * ramp[:, None]
    grain = rng.integers(0, 48, (3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    pixels = ((base * 100 + 20).astype(np.uint8) + grain).transpose(1, 2, 0)
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _write_atomically(path: Path, data: bytes) -> None:
    # A unique temporary name in the same directory, then a rename: readers and concurrent
    # writers only ever see a missing file or a complete one, and identical bytes win either way.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_images(root: Path, num_images: int) -> int:
    """Create images ``0 .. num_images - 1`` under ``root`` if missing; return how many it wrote.

    Safe to run from several processes at once: each file appears atomically.
    """
    written = 0
    for index in range(num_images):
        path = image_path(root, index)
        if not path.exists():
            _write_atomically(path, render_jpeg(index))
            written += 1
    return written


class ImageFolderLike(Dataset[tuple[torch.Tensor, int]]):
    """JPEG files decoded and augmented per sample; items are ``(float32 [3, H, W] tensor, label)``.

    Random augmentation draws a fresh seed from torch's default generator for every sample. The
    DataLoader reseeds that generator in each worker (``base_seed + worker_id``, new every epoch)
    and it advances in the main process, so workers never repeat each other's crops and epochs
    differ. (A numpy Generator stored on the dataset would be copied into every worker with the
    same state, and all workers would draw the same "random" crops.)
    """

    def __init__(self, root: Path, num_images: int = NUM_IMAGES) -> None:
        self.root = Path(root)
        ensure_images(self.root, num_images)
        self.samples = [(image_path(self.root, i), label_of(i)) for i in range(num_images)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        with Image.open(path) as f:
            image = f.convert("RGB")
        image = random_resized_crop(image, rng)
        image = color_jitter(image, rng)
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        if rng.random() < 0.5:
            pixels = pixels[:, ::-1]
        pixels = (pixels - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))), label


def random_resized_crop(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A random crop of random area and aspect ratio, resized to ``CROP_SIZE`` square."""
    width, height = image.size
    for _ in range(10):
        area = width * height * rng.uniform(*CROP_SCALE)
        ratio = float(np.exp(rng.uniform(np.log(CROP_RATIO[0]), np.log(CROP_RATIO[1]))))
        w = round((area * ratio) ** 0.5)
        h = round((area / ratio) ** 0.5)
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            break
    else:  # Fall back to the whole image, as torchvision does.
        left, top, w, h = 0, 0, width, height
    box = (left, top, left + w, top + h)
    return image.resize((CROP_SIZE, CROP_SIZE), Image.Resampling.BILINEAR, box=box)


def color_jitter(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Random brightness, contrast and saturation, each by a factor in ``1 ± JITTER``."""
    for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhancer(image).enhance(rng.uniform(1 - JITTER, 1 + JITTER))
    return image


loader = DataLoader(
    ImageFolderLike(cache_dir(), num_images_from_env()), batch_size=32, shuffle=True
)


if __name__ == "__main__":
    for step, (images, labels) in enumerate(loader):
        print(f"batch {step}: images {tuple(images.shape)} {images.dtype}", end=", ")
        print(f"labels {tuple(labels.shape)} {labels.dtype}")
        if step == 2:
            break
