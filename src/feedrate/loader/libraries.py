"""What feedrate knows of the data libraries users bring (webdataset, litdata, MosaicML
streaming, Hugging Face datasets), read off their objects without importing the libraries:
which pipelines batch their own items, which split their stream between workers, which random
generators the library reseeds in every worker itself, the state a rebuilt loader must keep,
and webdataset's ``WebLoader`` (a pipeline whose first stage is a DataLoader).

Every test is duck-typed on the library's own class and module names, so a library that is
not installed costs nothing and a look-alike of the user's own is not mistaken for one.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any

from torch.utils.data import DataLoader

#: Loader attributes of litdata's ``StreamingDataLoader`` that a rebuilt loader takes over, so
#: it goes on where the other stood between epochs: ``current_epoch`` chooses the epoch's
#: shuffle. (A resumption mid-epoch is ``load_state_dict``'s, given to the loader that runs.)
LITDATA_STATE = ("current_epoch",)
#: litdata's datasets that split their chunks between workers themselves.
LITDATA_DATASETS = ("StreamingDataset", "CombinedStreamingDataset", "ParallelStreamingDataset")


def library(obj: object) -> str | None:
    """The data library ``obj``'s class comes from ('webdataset', 'litdata', 'streaming',
    'datasets'), or None."""
    for cls in type(obj).__mro__:
        top = cls.__module__.split(".")[0]
        if top in ("webdataset", "litdata", "streaming", "datasets"):
            return top
    return None


def _is(obj: object, lib: str, *names: str) -> bool:
    """Whether ``obj`` is an instance of the class ``lib.<one of names>``, or of a subclass of
    it (users subclass the libraries' datasets to add their transforms)."""
    return any(
        cls.__module__.split(".")[0] == lib and cls.__name__ in names for cls in type(obj).__mro__
    )


def _stages(dataset: object) -> list[Any]:
    """The stages of a webdataset pipeline (empty for anything else)."""
    if library(dataset) != "webdataset":
        return []
    stages = getattr(dataset, "pipeline", None)
    return list(stages) if isinstance(stages, list) else []


def _stage_name(stage: object) -> str:
    """``_batched``, ``split_by_worker``, ``ResampledShards``: what a webdataset stage does."""
    fn = getattr(stage, "f", stage)  # a FilterFunction wraps the function in ``f``
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(stage).__name__


def batches_items(dataset: object) -> bool:
    """Whether the dataset is a pipeline that batches its own items (webdataset's
    ``.batched(n)`` not undone by a later ``.unbatched()``), so each item holds many samples."""
    batched = False
    for stage in _stages(dataset):
        name = _stage_name(stage)
        if name == "_batched":
            batched = True
        elif name == "_unbatched":
            batched = False
    return batched


def resampled(dataset: object) -> bool:
    """A webdataset pipeline that draws its shards at random, with replacement, in every
    worker (``resampled=True``): each worker makes its own endless stream."""
    stages = _stages(dataset)
    return bool(stages) and type(stages[0]).__name__ == "ResampledShards"


def splits_by_worker(dataset: object) -> str | None:
    """Why the library is known to give each worker its own part of the stream, or None when
    feedrate must look (``stream_digests``). Known: MosaicML's and litdata's streaming
    datasets (they partition samples by worker), Hugging Face's iterable datasets of 2 or
    more shards (shards go to workers in turn), webdataset with ``split_by_worker`` or
    resampled shards (each worker draws its own). Asking saves a probe that would cost a
    MosaicML epoch and fork a dataset that holds file locks."""
    if _is(dataset, "streaming", "StreamingDataset"):
        return "MosaicML's StreamingDataset partitions its samples between workers"
    if _is(dataset, "litdata", *LITDATA_DATASETS):
        return "litdata's streaming datasets partition their chunks between workers"
    shards = getattr(dataset, "num_shards", 0)
    if _is(dataset, "datasets", "IterableDataset") and isinstance(shards, int) and shards >= 2:
        return "a Hugging Face IterableDataset of several shards hands them to workers in turn"
    names = [_stage_name(s) for s in _stages(dataset)]
    if "split_by_worker" in names:
        return "the webdataset pipeline splits its shards by worker"
    if resampled(dataset):
        return "the webdataset pipeline draws its shards per worker (resampled)"
    return None


def worker_limit(dataset: object) -> int | None:
    """The most workers that each get a part of the stream where the library hands whole
    shards to workers, else None: a Hugging Face IterableDataset's shards; a webdataset
    pipeline's shard list split by worker (after ``split_by_node``, a rank's share of it). A
    worker past them yields nothing: webdataset then fails ("No samples found in dataset;
    perhaps you have fewer shards than workers"), Hugging Face stops it."""
    shards = getattr(dataset, "num_shards", 0)
    if _is(dataset, "datasets", "IterableDataset") and isinstance(shards, int) and shards >= 1:
        return shards
    stages = _stages(dataset)
    names = [_stage_name(s) for s in stages]
    urls = getattr(stages[0], "urls", None) if stages else None
    if "split_by_worker" not in names or resampled(dataset) or not isinstance(urls, list):
        return None
    ranks = _world() if "split_by_node" in names else 1
    return max(1, len(urls) // ranks)


def _world() -> int:
    """The job's ranks (torch.distributed's, else the launcher's WORLD_SIZE), at least 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return max(1, dist.get_world_size())
    with contextlib.suppress(ValueError):
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    return 1


def splits_by_rank(dataset: object) -> str | None:
    """Why the library is known to give each rank of a distributed job its own part of the
    data, or None when it is not known to: MosaicML's and litdata's streaming datasets (they
    read the job's ranks themselves), a Hugging Face IterableDataset split by
    ``split_dataset_by_node``, webdataset with ``split_by_node`` or resampled shards."""
    if _is(dataset, "streaming", "StreamingDataset"):
        return "MosaicML's StreamingDataset partitions its samples between ranks"
    if _is(dataset, "litdata", *LITDATA_DATASETS):
        return "litdata's streaming datasets partition their chunks between ranks"
    if _is(dataset, "datasets", "IterableDataset") and getattr(dataset, "_distributed", None):
        return "the Hugging Face IterableDataset is split by split_dataset_by_node"
    if "split_by_node" in [_stage_name(s) for s in _stages(dataset)]:
        return "the webdataset pipeline splits its shards by node"
    if resampled(dataset):
        return "the webdataset pipeline draws its shards per rank (resampled)"
    return None


def unsafe_to_iterate_here(dataset: object) -> str | None:
    """Why iterating ``dataset`` in this process would break the workers forked after it, or
    None: MosaicML's ``StreamingDataset`` takes file locks and shared memory on its first
    iteration, which forked workers inherit (they fail or hang)."""
    if _is(dataset, "streaming", "StreamingDataset"):
        return (
            "iterating MosaicML's StreamingDataset in this process leaves it file locks and "
            "shared memory that the workers forked after it inherit"
        )
    return None


def epoch_per_worker(dataset: object) -> int | None:
    """Samples each worker yields per epoch when a webdataset pipeline fixes it per worker
    (``resampled=True`` with ``.with_epoch(n)``): the epoch is then n × num_workers."""
    if not resampled(dataset):
        return None
    n = getattr(dataset, "nsamples", -1)
    return n if isinstance(n, int) and n > 0 else None


def managed_generator(dataset: object, path: str) -> bool:
    """Whether the random generator at ``path`` (from ``dataset_objects.walk``) is one the
    library reseeds in every worker itself: Hugging Face's ``IterableDataset.shuffle(seed=)``
    keeps it in its examples iterable and derives each worker's from it and the epoch."""
    return library(dataset) == "datasets" and path.startswith("_ex_iterable")


def set_dataset_epoch(dataset: object, epoch: int) -> bool:
    """Tell a library's dataset the epoch (Hugging Face's iterable datasets reshuffle by it,
    litdata's too), as samplers are told; returns whether it took it."""
    if library(dataset) is None:
        return False
    set_epoch = getattr(dataset, "set_epoch", None)
    if not callable(set_epoch):
        return False
    set_epoch(epoch)
    return True


def carry_state(old: DataLoader[Any], new: DataLoader[Any]) -> None:
    """Give ``new`` (``old`` rebuilt with other settings) ``old``'s place in its epochs, where
    the library keeps it on the loader (litdata's ``current_epoch`` and resumption state)."""
    if library(old) != "litdata" or type(old) is not type(new):
        return
    for name in LITDATA_STATE:
        if name in old.__dict__:
            object.__setattr__(new, name, old.__dict__[name])


def webloader_parts(obj: object) -> tuple[DataLoader[Any], list[Any]] | None:
    """(the DataLoader, the stages after it) of webdataset's ``WebLoader`` (a pipeline whose
    first stage is a DataLoader, e.g. ``.unbatched().shuffle(1000).batched(64)`` after it),
    else None."""
    if library(obj) != "webdataset":
        return None
    stages = getattr(obj, "pipeline", None)
    if not isinstance(stages, list) or not stages or not isinstance(stages[0], DataLoader):
        return None
    return stages[0], list(stages[1:])


def restaged(obj: object, first: Any) -> Any:
    """``obj`` (webdataset's ``WebLoader``) copied with ``first`` (a DataLoader, or a function
    called for each epoch) as its first stage and the stages after its DataLoader kept; ``first``
    itself where ``obj`` is none. The user's pipeline is never changed."""
    parts = webloader_parts(obj)
    if parts is None:
        return first
    pipe = copy.copy(obj)
    pipe.pipeline = [first, *parts[1]]  # type: ignore[attr-defined]
    return pipe


#: Where a DataLoader found inside a wrapper (a ``WebLoader``) keeps the wrapper's class name.
WRAPPED = "__feedrate_wrapped_by__"


def mark_wrapped(loader: DataLoader[Any], wrapper: str) -> None:
    """Remember that the user builds ``loader`` through ``wrapper`` (``WebLoader``), which
    takes DataLoader's arguments: the code line names it."""
    object.__setattr__(loader, WRAPPED, wrapper)


def class_name(loader: DataLoader[Any]) -> str:
    """The name the user's code builds the loader by: ``StreamingDataLoader``, ``WebLoader``
    (see ``mark_wrapped``), or ``DataLoader``."""
    wrapper = loader.__dict__.get(WRAPPED)
    return wrapper if isinstance(wrapper, str) else type(loader).__name__
