"""Remembered tuning results, keyed by (machine facts, pipeline fingerprint, batch size, options).

A second ``tune`` of the same pipeline on the same machine answers at once from here. The
fingerprint covers what decides the right settings: the dataset's class and the source of the
file that defines it, its length, the state it holds (``identity.state_digest``: its transform,
its stages, its paths), the batching, sampling and collation; a change to any of them tunes
again. Files live in ``$FEEDRATE_CACHE_DIR/tune/`` (default ``~/.cache/feedrate/tune``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from feedrate.loader.rebuild import config_of
from feedrate.machine.facts import MachineFacts
from feedrate.machine.identity import file_digest, state_digest

#: Machine facts that change the answer; the free memory of the moment does not.
_MACHINE_KEYS = (
    "cpus_usable",
    "cpu_count",
    "memory_total_bytes",
    "shm_total_bytes",
    "start_method",
    "torch_version",
    "accelerator",
    "accelerator_name",
    "accelerator_count",
    "python_version",
)


def cache_dir() -> Path:
    root = os.environ.get("FEEDRATE_CACHE_DIR")
    if root:
        return Path(root) / "tune"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "feedrate" / "tune"


def _source_digest(obj: Any) -> str | None:
    """``identity.file_digest`` of the file that defines ``obj``'s class (or ``obj``)."""
    try:
        path = inspect.getsourcefile(obj if inspect.isclass(obj) else type(obj))
    except (TypeError, OSError):
        return None
    return file_digest(path)


def _name(obj: Any) -> str | None:
    if obj is None:
        return None
    kind = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}"


def fingerprint(loader: DataLoader[Any]) -> dict[str, Any]:
    """What identifies a pipeline, as plain data: the loader's class and its own settings (the
    baseline every answer is measured against), the dataset (class, source, length), the
    batching, sampling, collation and worker set-up, and the state the dataset, sampler, batch
    sampler, collate_fn and worker_init_fn hold. Two loaders of one dataset class with other
    settings, or two datasets of one class holding another transform, are other pipelines."""
    dataset = loader.dataset
    try:
        length: int | None = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    ctx = loader.multiprocessing_context
    return {
        "loader": _name(loader),
        "settings": config_of(loader).to_dict(),
        "dataset": _name(dataset),
        "dataset_source": _source_digest(dataset),
        "length": length,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "sampler": _name(loader.sampler),
        "batch_sampler": _name(loader.batch_sampler),
        "collate_fn": _name(loader.collate_fn),
        "collate_source": _source_digest(loader.collate_fn)
        if inspect.isfunction(loader.collate_fn)
        else None,
        "worker_init_fn": _name(loader.worker_init_fn),
        "start_method": ctx if ctx is None or isinstance(ctx, str) else ctx.get_start_method(),
        # Bounded and the same in every run: no data, no addresses (see ``identity``).
        "state": _state(loader),
    }


def _state(loader: DataLoader[Any]) -> str:
    """``identity.state_digest`` of what the loader holds; "unreadable" where it fails (a key
    never fails a run: such a pipeline is told apart by the rest of its fingerprint only)."""
    try:
        parts = (loader.dataset, loader.sampler, loader.batch_sampler, loader.collate_fn)
        return state_digest(*parts, loader.worker_init_fn)
    except Exception:
        return "unreadable"


def tune_options(
    *,
    device: str | None,
    consumer: dict[str, Any] | None = None,
    max_workers: int | None = None,
    memory_limit: int | None = None,
    allow_reorder: bool = False,
    allow_threads: bool = False,
    ranks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The options that decide a ``tune`` answer, as its cache key holds them; the defaults
    are a plain ``tune(loader)``, whose answer ``autotune`` starts from. ``device`` (the
    accelerator every trial copies batches to, e.g. "cuda:0", or None) has no default: an
    answer found copying to a GPU is another answer, and a key built without saying which
    device would miss it. ``ranks``: the shape of a distributed job tuned together (its
    ``Ranks.to_dict()``), another answer than one process's."""
    options: dict[str, Any] = {
        "consumer": consumer,
        "max_workers": max_workers,
        "memory_limit": memory_limit,
        "allow_reorder": allow_reorder,
        "allow_threads": allow_threads,
    }
    if device is not None:  # keys of runs without an accelerator stay as they were
        options["device"] = device
    if ranks is not None:  # and so do those of one process
        options["ranks"] = ranks
    return options


def autotune_options(*, max_workers: int | None, allow_threads: bool) -> dict[str, Any]:
    """The options of ``autotune``'s own entries (the settings it settled on)."""
    return {"autotune": 1, "max_workers": max_workers, "allow_threads": allow_threads}


#: Raised when a change makes earlier answers wrong, so that they are measured again rather
#: than served from the cache. 2 (2026-12-04): with an accelerator the answer pins only where
#: the pin verdict says so, and a real step's first call is warm-up, not a window's.
ANSWERS = 2


def key(facts: MachineFacts, loader: DataLoader[Any], options: dict[str, Any]) -> str:
    """The cache key of ``loader`` on the machine ``facts`` describe, run with ``options``
    (``tune_options`` or ``autotune_options``): the one key function tune and autotune share."""
    machine = {k: getattr(facts, k) for k in _MACHINE_KEYS}
    blob = json.dumps(
        {
            "machine": machine,
            "pipeline": fingerprint(loader),
            "options": options,
            "answers": ANSWERS,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def load(cache_key: str, directory: Path | None = None) -> dict[str, Any] | None:
    """The cached result document, or None (missing or unreadable: a cache never fails a run)."""
    path = (directory or cache_dir()) / f"{cache_key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save(cache_key: str, document: dict[str, Any], directory: Path | None = None) -> Path | None:
    """Write atomically; returns the path, or None when the cache directory is not writable."""
    folder = directory or cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
        final = folder / f"{cache_key}.json"
        os.replace(tmp, final)
    except OSError:
        return None
    return final
