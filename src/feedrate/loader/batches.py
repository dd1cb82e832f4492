"""What a loader's batches and epochs hold: samples per batch, bytes and tensors per batch, batches
and samples per epoch, and the threads per worker worth trying.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from feedrate.loader.libraries import batches_items
from feedrate.loader.rebuild import (
    is_iterable_style,
)


def count_samples(batch: Any, default: int = 1, collated: bool = True) -> int:
    """Samples in a collated batch: the leading dimension of its first tensor or array (looking
    into sequences and mappings), else the length of a sequence of plain items, else ``default``.

    A list whose items are samples rather than collated fields (an identity ``collate_fn``) is
    counted by its length: default_collate emits no 0-d tensor as a field, and a tuple only of
    strings or bytes (a text field: the samples' own, as ``zip`` paired them), so a head that is
    either other kind marks a list of samples; so does a list exactly ``default`` long. Not
    ``collated`` by default_collate (a ``collate_fn`` of the user's), a tuple of strings is a
    sample like any other tuple."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else default
    if isinstance(batch, Mapping):
        first = next(iter(batch.values()), None)
        return default if first is None else count_samples(first, default, collated)
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes):
        if not batch:
            return default
        head = batch[0]
        head_shape = getattr(head, "shape", None)
        text = collated and _text_field(head)
        if text and _fields_of(batch, len(head), default):
            return len(head)
        if len(batch) == default > 1 or (isinstance(head, tuple) and not text) or head_shape == ():
            return len(batch)
        nested = head_shape is not None or isinstance(head, Mapping | list) or text
        return count_samples(head, default, collated) if nested else len(batch)
    return default


def _text_field(value: Any) -> bool:
    """A tuple of strings or bytes: what default_collate makes of a text field."""
    return (
        isinstance(value, tuple) and bool(value) and all(isinstance(v, str | bytes) for v in value)
    )


def _fields_of(batch: Sequence[Any], n: int, default: int) -> bool:
    """``batch`` is default_collate's fields of ``n`` samples: a tensor or array among them leads
    with ``n``, or, all of them text fields ``n`` long, the batch is not ``default`` long (then
    it could as well be ``default`` samples of text alone, from an identity ``collate_fn``)."""
    leads = [getattr(field, "shape", None) for field in batch]
    if any(shape is not None and len(shape) > 0 and int(shape[0]) == n for shape in leads):
        return True
    return len(batch) != default and all(_text_field(f) and len(f) == n for f in batch)


def batch_nbytes(batch: Any) -> int:
    """Bytes of tensor and array data in a batch (what crosses shared memory from a worker)."""
    if hasattr(batch, "element_size") and hasattr(batch, "numel"):
        return int(batch.element_size() * batch.numel())
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(batch, Mapping):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, list | tuple):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def _lead(value: Any) -> tuple[int, bool] | None:
    """(leading size, whether that size is surely a batch's) of one field of an item, or None
    for a scalar. Surely a batch's: a tensor or array of 2 or more dimensions, or a list of
    strings, bytes, tensors or containers (a sample's key is a string, not a list of them; a
    list of numbers may be one sample's token ids)."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return (int(shape[0]), len(shape) >= 2) if len(shape) > 0 else None
    if isinstance(value, list | tuple) and value:
        head = value[0]
        sure = isinstance(head, str | bytes | Mapping | list | tuple) or hasattr(head, "shape")
        return len(value), sure
    return None


def item_samples(item: Any, batched: bool = False) -> int:
    """Samples in one item of a loader without automatic batching (``batch_size=None``).

    An item that is itself a batch (webdataset's ``.batched(16)``, Hugging Face's
    ``.batch(16)``, a dataset that yields batches) holds as many samples as its fields' common
    leading size, when two or more fields share it and one of them is surely a batch's (see
    ``_lead``): ``(images[16, 3, H, W], labels[16])``, ``{"__key__": [16 keys], ...}``. Anything
    else is one sample (``(torch.randn(8), i)``, ``{"input_ids": [128 ids], "label": 3}``).
    ``batched``: the pipeline is known to batch its items, so a lone tensor counts by its
    leading dimension too."""
    if isinstance(item, Mapping):
        fields: list[Any] = list(item.values())
    elif isinstance(item, list | tuple):
        fields = list(item)
    else:
        fields = [item]
    leads = [lead for lead in map(_lead, fields) if lead is not None]
    if batched and leads:
        return leads[0][0]
    for size in dict.fromkeys(n for n, _ in leads):
        same = [sure for n, sure in leads if n == size]
        if size > 1 and len(same) >= 2 and any(same):
            return size
    return 1


def sample_counter(loader: DataLoader[Any]) -> Callable[[Any], int]:
    """Samples in each item the loader yields: with automatic batching, the batch counted;
    without, ``item_samples`` (one, unless the item is itself a batch, or the dataset is a
    pipeline known to batch its items: ``libraries.batches_items``)."""
    if loader.batch_size is None and loader.batch_sampler is None:
        batched = batches_items(loader.dataset)
        return lambda item: item_samples(item, batched)
    default = loader.batch_size or 1
    collated = loader.collate_fn is default_collate
    return lambda batch: count_samples(batch, default, collated)


def batch_size_of(loader: DataLoader[Any]) -> int | None:
    """Samples in one batch: ``loader.batch_size``, else its batch sampler's where it says
    (a DataLoader built with ``batch_sampler=``, as accelerate and the transformers Trainer
    build theirs: a ``BatchSampler``, accelerate's ``BatchSamplerShard``, whose
    ``split_batches`` gives each process its share), else None: unknown."""
    if loader.batch_size is not None:
        return loader.batch_size
    batches = loader.batch_sampler
    size = getattr(batches, "batch_size", None)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    if getattr(batches, "split_batches", False):
        size //= max(1, int(getattr(batches, "num_processes", 1)))
    return size or None


def epoch_length(loader: DataLoader[Any]) -> int | None:
    if is_iterable_style(loader):
        return None  # its __len__, if any, is only a hint
    try:
        return len(loader)
    except TypeError:
        return None


def length_hint(loader: DataLoader[Any]) -> int | None:
    """Batches an epoch of an IterableDataset says it has (its ``__len__``, a hint it may not
    keep), without asking the loader (``len(loader)`` arms DataLoader's warning about it)."""
    if not is_iterable_style(loader) or not loader.batch_size:
        return None
    try:
        n = len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
    return -(-n // loader.batch_size) if n > 0 else None


def count_tensors(batch: Any) -> int:
    """Tensors in a batch (each crosses shared memory as its own file under file_descriptor)."""
    if isinstance(batch, torch.Tensor):
        return 1
    if isinstance(batch, dict):
        return sum(count_tensors(v) for v in batch.values())
    if isinstance(batch, list | tuple):
        return sum(count_tensors(v) for v in batch)
    return 0


#: Threads per worker a search tries at most (more only add contention for the GIL).
MAX_SEARCH_THREADS = 64


def thread_cap(loader: DataLoader[Any]) -> int:
    """Threads per worker worth trying: up to a batch's samples (a worker fetches one batch at
    a time), at most ``MAX_SEARCH_THREADS``; 1 where DataLoader never calls ``__getitems__``
    (an IterableDataset, or no automatic batching)."""
    if is_iterable_style(loader) or loader.batch_sampler is None:
        return 1
    size = loader.batch_size or MAX_SEARCH_THREADS
    return max(1, min(size, MAX_SEARCH_THREADS))


def epoch_samples(loader: DataLoader[Any], seen: Iterable[Any] = ()) -> int | None:
    """Samples in one epoch, where the sampler knows (with a custom batch sampler DataLoader's
    own sampler spans the dataset, which is close enough for judging start-up cost); else, a
    stream's, as counted where a measurement in ``seen`` (trials) saw one end (their
    ``epoch_samples``): without it, ``persistent_workers`` was never judged against a stream's
    epoch."""
    if not is_iterable_style(loader):
        try:
            return len(loader.sampler)  # type: ignore[arg-type]
        except TypeError:
            pass
    return next((n for t in seen if (n := getattr(t, "epoch_samples", None))), None)
