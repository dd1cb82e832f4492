"""``threaded(dataset, threads)``: a batch's samples fetched concurrently inside each worker.

DataLoader hides a pipeline's waits (object storage, network file systems, slow disks) only with
more worker processes, and every process costs memory. PyTorch's fetcher calls
``dataset.__getitems__(indices)`` for a whole batch when the dataset defines it; ``Threaded``
defines it to fetch the batch's samples on a thread pool, so a few processes keep many requests
in flight.

* Order is kept: sample ``i`` of the batch is ``dataset[indices[i]]``.
* The pool is created on first use in the process that uses it (never inherited across fork: a
  forked worker makes its own) and shut down when that worker exits, or by ``close()``.
* A failing sample raises ``SampleFetchError`` naming the index and the original error (the
  original is its ``__cause__`` where the exception stays in one process).
* ``len()``, indexing and attributes are the dataset's own (reads and writes go through).
* A dataset that defines its own ``__getitems__`` (a batched read) keeps it: the indices are
  split into up to ``threads`` contiguous chunks, in order, and each chunk is one call of its
  ``__getitems__`` on a thread; the results are joined in order.
* An ``IterableDataset`` has no indices to spread over threads: it is refused.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import util as mp_util
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from feedrate.errors import UserError
from feedrate.loader.forwarding import Forwarding

#: More threads than this per process stop helping and start costing (stacks, GIL hand-offs).
MAX_THREADS = 256

#: Guards making a process's pools; made anew in a forked child (a parent's thread may have
#: held it at the fork).
_LOCK = threading.Lock()


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


class SampleFetchError(RuntimeError):
    """A sample failed while fetched on a thread; the message names its index. Constructible
    from the message alone, so DataLoader can re-raise it in the main process."""


class Threaded(Forwarding, Dataset[Any]):
    """``inner`` with each batch's samples fetched on ``threads`` threads (see the module)."""

    def __init__(self, inner: Any, threads: int) -> None:
        super().__init__(inner, threads=threads, _pool=None, _pool_pid=None)

    def __len__(self) -> int:
        return len(self._feedrate_inner)

    def __getitem__(self, index: Any) -> Any:
        return self._feedrate_inner[index]

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        indices = list(indices)
        if self.threads <= 1 or len(indices) <= 1:
            return _serial(self._feedrate_inner, indices)
        pool = self._pool_here()
        own = getattr(self._feedrate_inner, "__getitems__", None)
        if own is not None and not getattr(self._feedrate_inner, "feedrate_per_index", False):
            return _chunked(pool, own, indices, self.threads)
        futures = [pool.submit(self._feedrate_inner.__getitem__, i) for i in indices]
        return _gather(futures, indices)

    def _pool_here(self) -> ThreadPoolExecutor:
        """This process's pool, made on first use (a pool inherited by fork has no threads)."""
        pid = os.getpid()
        if self._pool is None or self._pool_pid != pid:
            with _LOCK:
                if self._pool is None or self._pool_pid != pid:
                    pool = ThreadPoolExecutor(self.threads, thread_name_prefix="feedrate-fetch")
                    object.__setattr__(self, "_pool", pool)
                    object.__setattr__(self, "_pool_pid", pid)
                    # Runs when a DataLoader worker exits normally (multiprocessing's finalizers).
                    mp_util.Finalize(self, _shutdown, args=(pool,), exitpriority=10)
        pool_here: ThreadPoolExecutor = self._pool
        return pool_here

    def close(self) -> None:
        """Shut this process's pool down (it is made again if the dataset is used again)."""
        pool = self._pool if self._pool_pid == os.getpid() else None
        object.__setattr__(self, "_pool", None)
        object.__setattr__(self, "_pool_pid", None)
        if pool is not None:
            pool.shutdown(wait=True)

    def __reduce__(self) -> tuple[Any, ...]:
        # Spawned workers get the dataset and the thread count, never the pool.
        return (Threaded, (self._feedrate_inner, self.threads))

    def __repr__(self) -> str:
        return f"threaded({self._feedrate_inner!r}, {self.threads})"


def threaded(dataset: Any, threads: int) -> Threaded:
    """Wrap a map-style ``dataset`` so each batch's samples are fetched on ``threads`` threads in
    whichever process loads the batch (each DataLoader worker, or the main process without
    workers). ``__getitem__`` must be safe to call from several threads at once; ``feedrate tune
    --threads`` checks that before recommending it. Wrapping a wrapped dataset replaces the
    thread count."""
    if isinstance(dataset, IterableDataset):
        raise UserError(
            "threaded() needs a map-style dataset (with __getitem__ and __len__): an "
            "IterableDataset yields samples in its own order, with no indices to spread over "
            "threads; read ahead inside its __iter__ instead"
        )
    if not hasattr(dataset, "__getitem__"):
        raise UserError(
            f"threaded() needs a dataset with __getitem__, got {type(dataset).__name__}"
        )
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise UserError(f"threads must be a whole number from 1 to {MAX_THREADS}, got {threads!r}")
    return Threaded(unthreaded(dataset), threads)


def unthreaded(dataset: Any) -> Any:
    """The dataset inside a ``Threaded`` wrapper, or ``dataset`` itself."""
    return dataset._feedrate_inner if isinstance(dataset, Threaded) else dataset


def threads_of(dataset: Any) -> int:
    return dataset.threads if isinstance(dataset, Threaded) else 1


def close(dataset: Any) -> None:
    """Shut down the thread pool of a ``Threaded`` dataset in this process, if any."""
    if isinstance(dataset, Threaded):
        dataset.close()
    else:
        inner = getattr(dataset, "_feedrate_inner", None)
        if isinstance(inner, Threaded):
            inner.close()


def _shutdown(pool: ThreadPoolExecutor) -> None:
    # A pool thread that drops the last reference cannot wait for itself.
    own_thread = threading.current_thread().name.startswith("feedrate-fetch")
    pool.shutdown(wait=not own_thread, cancel_futures=True)


def _serial(dataset: Any, indices: list[Any]) -> Any:
    own = getattr(dataset, "__getitems__", None)
    return own(indices) if own is not None else [dataset[i] for i in indices]


def _gather(futures: list[Future[Any]], indices: list[Any]) -> list[Any]:
    """Results in order; the first failure (in index order) raised naming its index, after the
    rest of the batch has finished (no thread is left working on an abandoned batch)."""
    out: list[Any] = []
    failure: tuple[Any, BaseException] | None = None
    for index, future in zip(indices, futures, strict=True):
        exc = future.exception()
        if exc is not None:
            failure = failure or (index, exc)
        elif failure is None:
            out.append(future.result())
    if failure is not None:
        index, exc = failure
        raise SampleFetchError(
            f"sample index {index} failed on a fetch thread: {type(exc).__name__}: {exc}"
        ) from exc
    return out


def _chunked(pool: ThreadPoolExecutor, own: Any, indices: list[Any], threads: int) -> Any:
    """The dataset's own ``__getitems__`` on contiguous chunks, joined in order. Its result for
    a chunk must be a list (or tuple) of samples to be joined; anything else (a dict or tensor
    for a custom ``collate_fn``) cannot be, and the whole batch is fetched in one call."""
    size = math.ceil(len(indices) / min(threads, len(indices)))
    chunks = [indices[i : i + size] for i in range(0, len(indices), size)]
    futures = [pool.submit(own, c) for c in chunks]
    out: list[Any] = []
    for chunk, future in zip(chunks, futures, strict=True):
        exc = future.exception()
        if exc is not None:
            where = f"{chunk[0]}..{chunk[-1]}" if len(chunk) > 1 else f"{chunk[0]}"
            for f in futures:
                f.exception()  # let the others finish before raising
            raise SampleFetchError(
                f"sample indices {where} failed in the dataset's __getitems__ on a fetch thread: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        part = future.result()
        if not isinstance(part, list | tuple):
            return own(indices)  # not a list of samples: no joining chunks of it
        out.extend(part)
    return out
