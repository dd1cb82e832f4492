"""Timing every DataLoader a script iterates, from inside its process.

``install(module)`` wraps ``DataLoader.__init__`` (to note where the user's code built each
loader) and ``DataLoader.__iter__`` (so subclasses are caught too): each iterator handed out is
an ``ObservedIterator``, which reads the clock twice per batch, and the main thread's CPU clock
and run-queue time (``measuring.runqueue``) twice, and adds to the loader's ``Watch``. Nothing
else happens per batch: worker processes are read by ``sampler`` from its own thread, every
second or so.

The wait of an epoch's first batch is counted from ``iter()`` (it holds the worker start-up);
the step is the time from handing a batch out to the next ``next()``. Loaders that feedrate
itself builds (``--autotune``'s trial loaders) are not watched.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.loader.batches import batch_nbytes, batch_size_of, epoch_length, sample_counter
from feedrate.loader.rebuild import built_for_the_user, config_of
from feedrate.measuring import runqueue
from feedrate.results.run import AutotuneChange, LoaderRun, WorkerUse
from feedrate.running.sites import built_by, evaluating, library, shown
from feedrate.running.timeline import Timeline

#: The calling thread's seconds queued for a CPU: a wait the loop spent there is not the data's.
QUEUED = runqueue.ThreadQueued()
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FEEDRATE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: Makes an iterator for a watched loader in place of DataLoader's own (``--autotune``), or
#: returns None to leave it to DataLoader; it is given DataLoader's own ``__iter__`` too.
Replacer = Callable[["Watch", DataLoader[Any], Callable[[], Any]], "Iterator[Any] | None"]


class Watch:
    """What one loader did, summed as it runs (seconds on ``time.perf_counter``)."""

    def __init__(self, loader: DataLoader[Any], site: str, module: str | None, origin: float):
        self.loader, self.site, self.module = weakref.ref(loader), site, module
        self.key: tuple[object, ...] = ()  # what tells it apart from other loaders (Registry)
        self.config = config_of(loader)
        self.loader_type = type(loader).__name__
        self.dataset_type = type(loader.dataset).__name__
        self.dataset_id = id(loader.dataset)
        self.batch_size = batch_size_of(loader)
        self.epoch_batches = epoch_length(loader)
        self.count = sample_counter(loader)
        self.epochs = self.batches = self.samples = self.grad_off = 0
        self.evaluating = False  # this epoch is iterated from an evaluation loop
        self.handed_over = built_for_the_user()  # feedrate's answer already: result.loader()
        self.wait = self.step = self.cpu_in_next = self.queued_in_next = 0.0
        self.startup: float | None = None
        self.restarts: list[float] = []
        self.batch_bytes: int | None = None
        self.last: float | None = None  # when the last batch was handed out, in this epoch
        self.began = 0.0  # when this epoch's iter() was called
        self.timeline = Timeline(origin)
        self._iterator: Callable[[], Any] = _none  # the epoch's iterator, weakly (its workers)
        self.worker_cpu: dict[int, float] = {}  # pid → CPU seconds read last
        self.worker_runq: dict[int, float] = {}  # pid → seconds queued for a CPU, read last
        # (time.perf_counter, the machine's busy CPU seconds) at the first and last readings
        self.busy_first: tuple[float, float] | None = None
        self.busy_last: tuple[float, float] | None = None
        self.worker_uss: int | None = None
        self.worker_pss: int | None = None
        self.shm_peak: int | None = None
        self.autotune: AutotuneChange | None = None
        self.tuner: Any = None  # the AutoLoader standing in for the loader, with --autotune

    @property
    def iterator(self) -> Any:
        """The iterator of the epoch in progress (its workers), while the script holds it."""
        return self._iterator()

    @iterator.setter
    def iterator(self, inner: Any) -> None:
        # Held weakly: the script's loaders and their workers live as long as without feedrate.
        try:
            self._iterator = _none if inner is None else weakref.ref(inner)
        except TypeError:  # an iterator with no weak references (a list's) has no workers
            self._iterator = _none

    def new_epoch(self, now: float, evaluating: bool = False) -> None:
        """An epoch begins at ``now``; ``evaluating``: iterated from an evaluation loop. It is
        counted at its first batch: an ``iter()`` that yields none (Lightning's) is none."""
        self.began, self.last, self.evaluating = now, None, evaluating

    def took(self, batch: Any, t0: float, t1: float, cpu: float, queued: float = 0.0) -> None:
        """A batch asked for at ``t0`` arrived at ``t1``, ``cpu`` s of main-thread CPU later,
        the thread having spent ``queued`` s of the wait queued for a CPU: the loop's, not the
        data's, where workers made the batch (see ``runqueue``)."""
        if self.last is None:  # the epoch's first batch: it waited from iter()
            wait, step, self.epochs = t1 - self.began, 0.0, self.epochs + 1
            if self.startup is None:
                self.startup = wait
                self.batch_bytes = batch_nbytes(batch)
            else:
                self.restarts.append(wait)
        else:
            lane = getattr(self.tuner, "config", None) or self.config  # autotune's, if any
            here = lane.num_workers == 0  # the batch is made in next(): its queue is the data's
            wait, step = runqueue.split(t1 - t0, t0 - self.last, 0.0 if here else queued)
            self.queued_in_next += queued if here else 0.0
        self.wait += wait
        self.step += step
        self.cpu_in_next += cpu
        self.batches += 1
        self.samples += self.count(batch)
        if self.evaluating or not torch.is_grad_enabled():
            self.grad_off += 1
        self.timeline.add(t1, wait, step)
        self.last = t1

    def ran_out(self, t0: float) -> None:
        """The loader ran out at ``t0``: the step on the last batch ends there."""
        if self.last is not None:
            self.step += t0 - self.last
            self.timeline.add(t0, 0.0, t0 - self.last)
            self.timeline.count[-1] -= 1  # a step, not a batch
        self.last = None

    def result(self, pid: int, rank: int | None) -> LoaderRun:
        cpu, runq = sum(self.worker_cpu.values()), sum(self.worker_runq.values())
        loop = self.wait + self.step
        busy = None
        if self.busy_first is not None and self.busy_last is not None:
            (t0, b0), (t1, b1) = self.busy_first, self.busy_last
            busy = (b1 - b0) / (t1 - t0) if t1 > t0 else None
        return LoaderRun(
            created_at=self.site,
            config=self.config,
            pid=pid,
            rank=rank,
            name=self.name(),
            loader_type=self.loader_type,
            dataset_type=self.dataset_type,
            batch_size=self.batch_size,
            epoch_batches=self.epoch_batches,
            epochs=self.epochs,
            batches=self.batches,
            samples=self.samples,
            wait_s=self.wait,
            step_s=self.step,
            startup_s=self.startup,
            epoch_restart_s=list(self.restarts),
            main_cpu_in_next=self.cpu_in_next / self.wait if self.wait > 0 else None,
            main_queued_in_next=self.queued_in_next / self.wait if self.wait > 0 else None,
            built_by=str(self.key[2]) if self.key and self.key[2] else None,
            handed_over=self.handed_over,
            grad_off_batches=self.grad_off,
            batch_bytes=self.batch_bytes,
            workers=WorkerUse(
                cpu_util=cpu / loop if self.worker_cpu and loop > 0 else None,
                runq_util=runq / loop if self.worker_runq and loop > 0 else None,
                uss_bytes=self.worker_uss,
                pss_bytes=self.worker_pss,
                processes=len(self.worker_cpu),
            ),
            shm_peak_bytes=self.shm_peak,
            system_busy_cpus=busy,
            timeline=self.timeline.windows(),
            autotune=self.autotune,
        )

    def name(self) -> str | None:
        """``file.py:NAME`` where the loader is a module-level name of the module that built
        it and importing that module gives it at once (what ``feedrate tune`` takes)."""
        loader, module = self.loader(), sys.modules.get(self.module or "")
        if loader is None or module is None:
            return None
        file = self.site.rpartition(":")[0]
        for key, value in list(vars(module).items()):
            if value is loader and not key.startswith("_") and importable(file, key):
                return f"{file}:{key}"
        return None


def importable(file: str, key: str) -> bool:
    """``feedrate tune file:key`` would find ``key`` by importing ``file`` and do nothing else
    first: a top-level statement of ``file`` assigns it (not one under ``if __name__ ==
    "__main__":``), and none loops or calls a function for its own sake (training at the top
    level would run whole on import)."""
    try:
        with open(file, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return False
    assigned = False
    for node in tree.body:
        if isinstance(node, ast.For | ast.While | ast.AsyncFor | ast.With):
            return False
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return False
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        assigned |= any(isinstance(t, ast.Name) and t.id == key for t in targets)
    return assigned


def _none() -> None:
    return None


class ObservedIterator:
    """The iterator of a watched loader: the loader's own, timed. Anything else asked of it
    (``_workers``, ``len``, its class for ``isinstance``) is the inner iterator's."""

    def __init__(self, inner: Iterator[Any], watch: Watch) -> None:
        self._inner, self._watch = inner, watch

    def __iter__(self) -> ObservedIterator:
        return self

    def __next__(self) -> Any:
        c0, q0 = time.thread_time(), QUEUED()
        t0 = time.perf_counter()
        try:
            batch = next(self._inner)
        except StopIteration:
            self._watch.ran_out(t0)
            raise
        t1 = time.perf_counter()
        cpu, queued = time.thread_time() - c0, QUEUED() - q0
        # A try costs nothing per batch where suppress() builds an object: never the user's
        # problem, a batch feedrate cannot count.
        try:  # noqa: SIM105
            self._watch.took(batch, t0, t1, cpu, queued)
        except Exception:
            pass
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    @property  # type: ignore[misc]
    def __class__(self) -> type[Any]:
        # isinstance(it, _MultiProcessingDataLoaderIter) still holds (as frameworks check).
        return type(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Registry:
    """The watches of this process, and the DataLoader methods they replace."""

    def __init__(self, origin: float, replacer: Replacer | None = None) -> None:
        self.origin = origin
        self.replacer = replacer
        #: Called once, when the first watched loader is iterated (starts the sampler).
        self.on_first_iter: Callable[[], None] | None = None
        self.lock = threading.Lock()
        self.watches: list[Watch] = []
        self.by_loader: weakref.WeakKeyDictionary[DataLoader[Any], Watch] = (
            weakref.WeakKeyDictionary()
        )

    def reset(self) -> None:
        """After a fork: the child's loaders are its own."""
        self.lock = threading.Lock()
        self.watches, self.by_loader = [], weakref.WeakKeyDictionary()

    def created(self, loader: DataLoader[Any], frame: FrameType | None) -> None:
        """Watch a loader just built. One built again at the same line, over the same dataset
        with the same settings (a loop that makes a new loader every epoch) adds to the same
        watch: its epochs are that loader's epochs."""
        site = creation_site(loader, frame)
        if site is None:
            return
        watch = Watch(loader, site[0], site[1], self.origin)
        # The line that built it, which a library's frames skipped for the site may hide (one
        # call building a train and an eval loader), and how it batches, tell loaders apart.
        inner, by = _innermost(loader, frame), built_by(frame)
        watch.key = (watch.site, inner, by, watch.dataset_type, watch.config, _batching(loader))
        with self.lock:
            for seen in reversed(self.watches):
                # Over the same dataset; or a new one of its kind and length once an epoch ended
                # (a loop that builds its dataset again every epoch), not one beside it (val).
                again = seen.dataset_id == watch.dataset_id or bool(
                    seen.epochs and seen.last is None and watch.epoch_batches is not None
                )
                if seen.key == watch.key and again:
                    seen.loader = watch.loader
                    self.by_loader[loader] = seen
                    return
            self.watches.append(watch)
            self.by_loader[loader] = watch

    def iterate(
        self, loader: DataLoader[Any], own_iter: Callable[[], Any], tuner: Any = None
    ) -> Any:
        """An epoch of ``loader``: ``own_iter()``'s, timed, where it is watched. ``tuner``: the
        script's own ``feedrate.autotune(loader)`` that ``own_iter`` iterates (its epochs are
        the loader's, what it changed goes in the report, and it is not tuned again)."""
        watch = self.by_loader.get(loader)
        if watch is None:
            return own_iter()
        if self.on_first_iter is not None:
            start, self.on_first_iter = self.on_first_iter, None
            start()
        watch.new_epoch(time.perf_counter(), evaluating(sys._getframe(1)))
        if tuner is not None and watch.tuner is not tuner:  # the latest the script made
            watch.tuner = tuner
            watch.autotune = watch.autotune or AutotuneChange(before=watch.config)
        replace = self.replacer if tuner is None else None
        inner = replace(watch, loader, own_iter) if replace is not None else None
        if inner is None:
            inner = own_iter()
        # Not a tuner's generator (its lane's workers are read through it): a break out of
        # the loop closes it at once, its workers ended, the other ranks told.
        watch.iterator = inner if watch.tuner is None else None
        return ObservedIterator(inner, watch)


def creation_site(loader: object, frame: FrameType | None) -> tuple[str, str | None] | None:
    """``(file:line, module name)`` of the user's code that built ``loader``, from ``frame``
    (the caller of DataLoader's ``__init__``) outwards: torch's frames, the ``__init__`` of the
    loader's own subclasses, and installed libraries' frames (Lightning's wrapper of every
    loader's ``__init__`` during ``fit``, transformers' Trainer, webdataset's loader) are
    skipped; the first library frame stands where no user frame is found. None when feedrate
    built it for a measurement of its own, through a library's frames or not (its trial
    loaders are not the user's); one it built for the user's code to train on
    (``for_the_user``: ``result.loader()``) is the user's, at the user's line that led there."""
    via: tuple[str, str | None] | None = None
    while frame is not None:
        file = frame.f_code.co_filename
        path = os.path.abspath(file)
        ours = path.startswith(_FEEDRATE_DIR)
        if ours and not built_for_the_user():
            return None
        if _building(loader, frame) or ours:
            frame = frame.f_back
            continue
        site = f"{shown(file)}:{frame.f_lineno}", frame.f_globals.get("__name__")
        if not library(path):
            return site
        via = via or site
        frame = frame.f_back
    return via or ("<unknown>:0", None)


def _building(loader: object, frame: FrameType) -> bool:
    """``frame`` is torch's, or the ``__init__`` of ``loader``'s own class: part of building it,
    not the line that asked for it."""
    code = frame.f_code
    own_init = code.co_name == "__init__" and frame.f_locals.get("self") is loader
    return own_init or code.co_filename.startswith(_TORCH_DIR)


def _innermost(loader: object, frame: FrameType | None) -> str:
    """``file:line`` of the innermost frame that is not ``_building`` ``loader``: the line that
    built it, a library's or the user's."""
    while frame is not None and _building(loader, frame):
        frame = frame.f_back
    return "<unknown>:0" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _batching(loader: DataLoader[Any]) -> tuple[object, ...]:
    """How ``loader`` makes its batches: its batch size, sampler and batch sampler classes,
    ``drop_last``, and its epoch's length where known."""
    sampler, batches = type(loader.sampler).__name__, type(loader.batch_sampler).__name__
    return loader.batch_size, sampler, batches, loader.drop_last, epoch_length(loader)


def install(registry: Registry, cls: type[DataLoader[Any]] = DataLoader) -> None:
    """Wrap ``cls.__init__`` and ``cls.__iter__`` to feed ``registry`` (once per class)."""
    if getattr(cls, "__feedrate_run__", False):
        return
    own_init, own_iter = cls.__init__, cls.__iter__

    # wraps(): the signature stays DataLoader's own, for the frameworks that read it to build
    # a loader again (Lightning does), and for feedrate's own rebuild.
    @functools.wraps(own_init)
    def __init__(self: DataLoader[Any], *args: Any, **kwargs: Any) -> None:
        own_init(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            registry.created(self, sys._getframe(1))

    @functools.wraps(own_iter)
    def __iter__(self: DataLoader[Any]) -> Any:
        return registry.iterate(self, lambda: own_iter(self))

    cls.__init__ = __init__  # type: ignore[method-assign]
    cls.__iter__ = __iter__  # type: ignore[method-assign,assignment]
    cls.__feedrate_run__ = True  # type: ignore[attr-defined]
