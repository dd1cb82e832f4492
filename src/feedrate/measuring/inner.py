"""The DataLoader iterator behind what ``iter(loader)`` returned, and the worker processes it
runs, however the loader hides them.

A DataLoader subclass whose ``__iter__`` is a generator (litdata's and MosaicML's
``StreamingDataLoader``: ``for batch in super().__iter__(): ...; yield batch``) returns a
generator, which has no ``_workers``: the real iterator sits on the generator's stack from its
first ``next()`` on. The garbage collector's view of a generator includes its stack, so it is
found there (``real_iterator``). Where even that fails, the workers are found as what they are:
child processes of this one started after ``iter()`` (``new_children``).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterable
from typing import Any

import psutil

#: Generators (and wrappers) looked through at most on the way to the DataLoader iterator.
MAX_DEPTH = 4


def _is_loader_iterator(obj: object) -> bool:
    # DataLoader's iterators (_SingleProcessDataLoaderIter, _MultiProcessingDataLoaderIter)
    # have these; duck-typed so torch's private classes are not imported.
    return hasattr(obj, "_dataset_fetcher") or hasattr(obj, "_workers")


def real_iterator(it: object) -> Any:
    """The DataLoader iterator ``it`` is or holds (through generators, ``yield from`` and the
    attributes ``_iterator``/``it`` of wrappers), or ``it`` itself when none is found."""
    found = _find(it, MAX_DEPTH, set())
    return it if found is None else found


def is_generator(obj: object) -> bool:
    """A generator (what a generator ``__iter__`` returns)."""
    return hasattr(obj, "gi_frame") and hasattr(obj, "gi_code")


def _find(obj: object, depth: int, seen: set[int]) -> Any:
    if obj is None or id(obj) in seen:
        return None
    seen.add(id(obj))
    if _is_loader_iterator(obj):
        return obj
    if depth <= 0:
        return None
    nexts: list[object] = []
    if is_generator(obj):
        nexts.append(getattr(obj, "gi_yieldfrom", None))
        with contextlib.suppress(Exception):
            nexts.extend(r for r in gc.get_referents(obj) if _worth(r))
        frame = getattr(obj, "gi_frame", None)
        if frame is not None and not getattr(obj, "gi_running", True):
            # Not started yet (or between batches): the loader it belongs to, whose
            # persistent iterator (``_iterator``) runs the workers from one epoch to the next.
            with contextlib.suppress(Exception):
                nexts.append(getattr(frame.f_locals.get("self"), "_iterator", None))
    else:
        nexts.extend(getattr(obj, name, None) for name in ("_iterator", "it", "_it"))
    for candidate in nexts:
        inner = _find(candidate, depth - 1, seen)
        if inner is not None:
            return inner
    return None


def _worth(obj: object) -> bool:
    """A referent of a generator that may lead to the DataLoader iterator."""
    return _is_loader_iterator(obj) or is_generator(obj)


def worker_handles(it: object) -> list[Any]:
    """The ``multiprocessing.Process`` objects of the workers behind ``it`` (none without)."""
    return list(getattr(real_iterator(it), "_workers", None) or [])


def children() -> set[int]:
    """The pids of this process's children now."""
    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process().children(recursive=False)}
    return set()


def new_children(before: Iterable[int]) -> list[psutil.Process]:
    """Child processes of this one (direct, alive) that are not in ``before``: the workers a
    loader started after ``before`` was read, when it hides them otherwise."""
    known = set(before)
    out = []
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process().children(recursive=False):
            if proc.pid not in known and proc.pid != os.getpid():
                out.append(proc)
    return sorted(out, key=lambda p: p.pid)
