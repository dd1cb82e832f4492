"""Experiments inside 2 workers: a look at each worker right after ``worker_init_fn`` (threads,
environment, random generators, start-up time) and what each yields from an IterableDataset.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from feedrate.errors import PipelineError, PipelineTimeoutError
from feedrate.loader import started
from feedrate.loader.forwarding import Forwarding
from feedrate.loader.rebuild import is_iterable_style, quiet_worker_count_warning
from feedrate.machine.facts import THREAD_ENV_VARS
from feedrate.measuring import random_state
from feedrate.measuring.dataset_objects import digest, draw, generators, identity
from feedrate.measuring.diagnosis import explain
from feedrate.measuring.failures import (
    Watchdog,
    quiesce,
    share_temp_folder,
    shut_down,
    stop_workers,
)
from feedrate.measuring.runqueue import ThreadQueued
from feedrate.results.evidence import WorkerView
from feedrate.results.streams import StreamSamples

#: Workers the experiments use: the fewest that show what differs between workers.
WORKERS = 2


_init_seconds: float | None = None  # set in a worker by _TimedInit


def _identity(item: Any) -> Any:
    return item


class _TimedInit:
    """The user's ``worker_init_fn``, timed (picklable, so spawned workers get it too)."""

    def __init__(self, fn: Callable[[int], object] | None) -> None:
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        global _init_seconds
        began = time.perf_counter()
        if self.fn is not None:
            self.fn(worker_id)
        _init_seconds = time.perf_counter() - began


def _look(dataset: Any) -> WorkerView:
    info = get_worker_info()
    me = psutil.Process()
    cv2 = sys.modules.get("cv2")  # only when the pipeline imported it
    draws = {path: (kind, draw(gen)) for path, kind, gen in generators(dataset)}
    draws.update(global_draws())
    return WorkerView(
        worker_id=-1 if info is None else info.id,
        pid=os.getpid(),
        age_s=max(0.0, time.time() - me.create_time()),
        init_s=_init_seconds,
        torch_threads=torch.get_num_threads(),
        cv2_threads=int(cv2.getNumThreads()) if cv2 is not None else None,
        env={k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ},
        os_threads=me.num_threads(),
        draws=draws,
        pools=_used_pools(dataset, me),
    )


def _used_pools(dataset: Any, me: psutil.Process) -> dict[str, int]:
    """``native_pools``, where one sample of a map-style dataset made this worker start as many
    threads as a pool runs besides the caller (its draws taken first): a forked worker starts
    without a pool's threads and only a call into the library starts them, so a pool loaded but
    never called here (numpy imported, no BLAS in ``__getitem__``) costs nothing and is left
    out. Never the pipeline's problem."""
    pools = native_pools()
    if not pools or isinstance(dataset, IterableDataset):
        return {}
    try:
        before = me.num_threads()
        dataset[0]
        started = me.num_threads() - before
    except Exception:
        return {}
    # A pool of n runs a call on the caller and n - 1 threads of its own: those must have
    # started (threads of other kinds, an I/O loop, a client's pool, are not the library's).
    return {lib: n for lib, n in pools.items() if n > 1 and started >= n - 1}


def global_draws() -> dict[str, tuple[str, str | None]]:
    """One draw from numpy's global generator (where the pipeline imported numpy) and Python's:
    torch seeds both apart in every worker, and a ``worker_init_fn`` that seeds them with a
    constant makes every worker draw alike again (an inspection worker's draws are its own)."""
    found: dict[str, tuple[str, str | None]] = {
        "<random>": ("random (global)", str(random.getrandbits(62)))
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        found["<numpy.random>"] = ("numpy.random (global)", str(numpy.random.randint(0, 2**31 - 1)))
    return found


def native_pools() -> dict[str, int]:
    """Threads each native library loaded here (OpenBLAS, MKL, OpenMP) runs a call on, as
    threadpoolctl reads it: with no ``OPENBLAS_NUM_THREADS`` set, OpenBLAS runs one per core
    in every worker, and no environment variable says so. Empty where none is loaded."""
    try:
        from threadpoolctl import threadpool_info

        return {
            str(p.get("internal_api") or p.get("user_api")): int(p["num_threads"])
            for p in threadpool_info()
        }
    except Exception:  # never the pipeline's problem
        return {}


class _Inspect(Forwarding, Dataset[WorkerView]):
    """Item ``i`` is a look at worker ``i`` (DataLoader hands indices to workers in turn)."""

    def __len__(self) -> int:
        return int(self._feedrate_count)

    def __getitem__(self, index: int) -> WorkerView:
        return _look(self._feedrate_inner)


#: The seeds the probe gives torch's, numpy's and Python's global generators before every item,
#: alike in both workers: a stream that is not split then makes the same "random" augmentation
#: of a sample in each, and its copies hash alike. Items at even positions get the first seed,
#: odd ones the second: an item that is nothing but a draw from those generators (synthetic
#: data, a random pick) alternates between two values in each worker, where DataLoader's own
#: seeds, different in every worker, would make the workers' items differ
#: (``checks.streams.stream_verdict``).
PROBE_SEEDS = (1234, 4321)


#: A global generator: (name, seed function, state getter, state setter).
_Global = tuple[str, Callable[[int], object], Callable[[], Any], Callable[[Any], object]]


def _global_generators() -> list[_Global]:
    """The global random generators DataLoader seeds in its workers (numpy's only once
    imported: the dataset may import it late)."""
    found: list[_Global] = [
        ("random", random.seed, random.getstate, random.setstate),
        ("torch", torch.manual_seed, torch.get_rng_state, torch.set_rng_state),
    ]
    np = sys.modules.get("numpy")
    if np is not None:
        found.append(("numpy", np.random.seed, np.random.get_state, np.random.set_state))
    return found


class _SeedAlike:
    """Seeds the global generators for the item at ``position`` (``PROBE_SEEDS``): the state
    each seed gives is kept and put back, a fraction of the cost of ``torch.manual_seed``."""

    def __init__(self) -> None:
        self.states: dict[tuple[str, int], Any] = {}

    def __call__(self, position: int) -> None:
        seed = PROBE_SEEDS[position % len(PROBE_SEEDS)]
        for name, seed_with, get_state, set_state in _global_generators():
            state = self.states.get((name, seed))
            if state is None:
                seed_with(seed)
                self.states[name, seed] = get_state()
            else:
                set_state(state)


class _Tagged(Forwarding, IterableDataset[tuple[int, str, str, float, float]]):
    """Iterates the user's IterableDataset in a worker, the global generators seeded before
    every item, alike in every worker (``PROBE_SEEDS``); yields (worker id, item identity,
    item digest, and the seconds of CPU (the worker's, all its threads) and of wall time that
    making the item took, less the time its thread was queued for a CPU: on a busy machine a
    stream is not thereby waiting on reads)."""

    def __iter__(self) -> Iterator[tuple[int, str, str, float, float]]:
        info = get_worker_info()
        worker_id = -1 if info is None else info.id
        seed_alike = _SeedAlike()
        seed_alike(0)  # an __iter__ may draw before its first item (a shuffle of its files)
        items, queued = iter(self._feedrate_inner), ThreadQueued()
        for position in range(self._feedrate_limit):
            seed_alike(position)
            wall, cpu, waited = time.perf_counter(), time.process_time(), queued()
            try:
                item = next(items)
            except StopIteration:
                return
            cpu, waited = time.process_time() - cpu, queued() - waited
            wall = time.perf_counter() - wall - waited  # on the CPUs it gets: not queued
            yield worker_id, identity(item), digest(item), cpu, wall


class Workers:
    """Iterate a loader with workers: on any failure, explain it (``PipelineError``), end the
    workers at once; on success, shut them down before returning."""

    def __init__(self, loader: DataLoader[Any], timeout_s: float) -> None:
        self.loader, self.timeout_s = loader, timeout_s
        self.it: Any = None

    def __enter__(self) -> Any:
        share_temp_folder()
        starts = started.Starts(self.loader)  # a worker hung in its fork: started again

        def make() -> Any:
            with quiet_worker_count_warning():
                self.it = iter(self.loader)
            return self.it

        try:
            return started.iterate(make, starts, stop_workers, started.bound(self.timeout_s))
        except BaseException:  # Ctrl-C while waiting: __exit__ will not run
            stop_workers(self.it)
            raise

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            shut_down(self.it)
            return
        quiesce(self.it, Watchdog(None, str))
        if isinstance(exc, RuntimeError) and "timed out after" in str(exc):
            error: PipelineError | None = PipelineTimeoutError(
                f"no item arrived within {self.timeout_s:.3g} s: the pipeline appears to hang "
                "(a deadlock, a blocking read, or a worker_init_fn that never returns)"
            )
        else:
            error = explain(exc, self.it)
        stop_workers(self.it)
        if error is not None:
            raise error from exc


def _loader_like(
    loader: DataLoader[Any], dataset: Any, timeout_s: float, **kwargs: Any
) -> DataLoader[Any]:
    """A DataLoader over ``dataset`` with the user's worker set-up (init function, start method,
    generator) and 2 workers, one item at a time."""
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=WORKERS,
        collate_fn=_identity,
        worker_init_fn=_TimedInit(loader.worker_init_fn),
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        timeout=timeout_s,
        **kwargs,
    )


def inspect_workers(loader: DataLoader[Any], *, timeout_s: float = 30.0) -> list[WorkerView]:
    """A look inside each of 2 workers right after the user's ``worker_init_fn`` (its random
    draws taken first; then, where a native thread pool is loaded, one item of a map-style
    dataset, to see whether it starts the pool: ``_used_pools``). Raises ``PipelineError`` when
    the workers fail to start. The user's random state is left as it was (``random_state``:
    iter() draws the workers' base seed from it)."""
    probe = _Inspect(loader.dataset, _feedrate_count=WORKERS)
    views: list[WorkerView] = []
    like = _loader_like(loader, probe, timeout_s, prefetch_factor=1)
    with random_state.kept(loader), Workers(like, timeout_s) as it:
        for view in it:
            views.append(view)
    return sorted(views, key=lambda v: v.worker_id)


def stream_digests(
    loader: DataLoader[Any],
    *,
    limit: int = 64,
    seconds: float = 3.0,
    timeout_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> StreamSamples:
    """Iterate the loader's IterableDataset in 2 workers, at most ``limit`` items per worker and
    about ``seconds`` from the first item (worker start-up is not counted: under spawn it alone
    can take seconds), the global random generators seeded before every item, alike in both
    (``PROBE_SEEDS``), and hash every item's identity and content in its worker; with the
    share of its time a worker making items spent on a CPU (``cpu_share``). The user's random
    state is left as it was (``random_state``: autotune's probe must not move its order)."""
    if not is_iterable_style(loader):
        raise ValueError("stream_digests needs an IterableDataset")
    tagged = _Tagged(loader.dataset, _feedrate_limit=limit)
    per_worker: dict[int, list[str]] = {i: [] for i in range(WORKERS)}
    identities: dict[int, list[str]] = {i: [] for i in range(WORKERS)}
    began: float | None = None
    complete = True
    cpu_s = wall_s = 0.0
    like = _loader_like(loader, tagged, timeout_s)
    with random_state.kept(loader), Workers(like, timeout_s) as it:
        for worker_id, item_identity, item_digest, item_cpu, item_wall in it:
            began = clock() if began is None else began
            per_worker.setdefault(worker_id, []).append(item_digest)
            identities.setdefault(worker_id, []).append(item_identity)
            if len(identities[worker_id]) > 1:  # a first item also opens the stream
                cpu_s, wall_s = cpu_s + item_cpu, wall_s + item_wall
            if clock() - began > seconds:
                complete = False
                break
    seconds_taken = 0.0 if began is None else clock() - began
    share = min(1.0, cpu_s / wall_s) if wall_s > 0 else None
    return StreamSamples(per_worker, seconds_taken, complete, identities, share)
