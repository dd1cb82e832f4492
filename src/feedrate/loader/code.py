"""A user's loader as a paste-able line of code, with the recommended settings."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate, default_convert
from torch.utils.data.dataloader import _InfiniteConstantSampler

from feedrate.loader import libraries
from feedrate.loader.config import LoaderConfig
from feedrate.loader.words import BY_TRAINER, TRAINING_ARGUMENTS

#: The samplers DataLoader makes itself (for shuffle=False, and for an IterableDataset).
_OWN_SAMPLERS = (SequentialSampler, _InfiniteConstantSampler)


def code_line(loader: DataLoader[Any], config: LoaderConfig) -> str:
    """A ``DataLoader(...)`` line with the loader's batching and the recommended settings,
    named by the loader's own class (``StreamingDataLoader(...)`` for litdata's); for one a
    transformers ``Trainer`` builds, its ``TrainingArguments(...)`` words."""
    if libraries.class_name(loader) == BY_TRAINER:
        given = config.kwargs().items()
        words = [f"{TRAINING_ARGUMENTS[k]}={v!r}" for k, v in given if k in TRAINING_ARGUMENTS]
        line = f"TrainingArguments(..., {', '.join(words)})"
        if config.threads > 1:  # not an argument: the Trainer's dataset, wrapped
            threaded = f"feedrate.threaded(train_dataset, {config.threads})"
            line += f"; Trainer(..., train_dataset={threaded})"
        if config.in_order is False:  # not an argument either: say so rather than drop it
            line += "  # and in_order=False, which TrainingArguments cannot set"
        return line
    parts = [f"feedrate.threaded(dataset, {config.threads})" if config.threads > 1 else "dataset"]
    custom_batches = loader.batch_size is None and loader.batch_sampler is not None
    if custom_batches:
        parts.append("batch_sampler=batch_sampler")
    else:
        parts.append(f"batch_size={loader.batch_size}")
        if isinstance(loader.sampler, RandomSampler):
            parts.append("shuffle=True")
        elif not isinstance(loader.sampler, _OWN_SAMPLERS):  # a DistributedSampler, yours
            parts.append("sampler=sampler")
        if loader.drop_last:
            parts.append("drop_last=True")
    built_by = libraries.class_name(loader)
    plain = built_by == "DataLoader"  # a library's loader sets its own
    if plain and loader.collate_fn not in (default_collate, default_convert):
        parts.append("collate_fn=collate_fn")  # left out, the batches would change
    if plain and loader.worker_init_fn is not None:
        parts.append("worker_init_fn=worker_init_fn")
    for name, value in config.kwargs().items():
        if name == "pin_memory" and not value:
            continue
        parts.append(f"{name}={value!r}")
    return f"{built_by}({', '.join(parts)})"
