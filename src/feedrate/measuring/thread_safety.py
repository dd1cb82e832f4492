"""Is a map-style dataset safe to fetch from several threads at once? Checked before threads are
measured or recommended.

* ``hazards``: objects on the dataset known not to be safe when threads share them: an open file
  (threads move one shared position), an h5py, LMDB or sqlite3 handle, a random generator the
  dataset holds itself (threads draw from it in whatever order they run; numpy's are not
  thread-safe at all).
* ``check``: the hazards, then the same indices fetched one by one twice and then on threads;
  when the two serial passes agree (the dataset is deterministic), the threaded results must
  agree with them. A nondeterministic dataset is not compared (it cannot be), and says so.
"""

from __future__ import annotations

import io
import sqlite3
import time
from typing import Any

from feedrate.loader.threaded import Threaded, unthreaded
from feedrate.measuring.dataset_objects import digest, generator_kind, walk
from feedrate.results.evidence import ThreadCheck

#: Samples compared, at most, and seconds the first serial pass may take before it stops early.
SAMPLES = 32


SERIAL_BUDGET_S = 3.0


#: Modules whose handles must not be shared between threads (checked by the type's module).
_UNSAFE_MODULES = {"h5py": "an h5py handle", "lmdb": "an LMDB handle"}


def hazard_kind(value: Any) -> str | None:
    """What makes ``value`` unsafe to share between threads, or None."""
    if isinstance(value, io.IOBase) and not value.closed:
        return "an open file"
    if isinstance(value, sqlite3.Connection | sqlite3.Cursor):
        return "a sqlite3 handle"
    root = type(value).__module__.split(".")[0]
    if root in _UNSAFE_MODULES:
        return _UNSAFE_MODULES[root]
    kind = generator_kind(value)
    if kind is not None:
        return f"a shared random generator ({kind})"
    return None


def hazards(dataset: Any) -> list[tuple[str, str]]:
    found = []
    for path, value in walk(unthreaded(dataset)):
        kind = hazard_kind(value)
        if kind is not None:
            found.append((path, kind))
    return found


def check(dataset: Any, threads: int, samples: int = SAMPLES) -> ThreadCheck:
    """Whether ``dataset`` may be fetched on ``threads`` threads (see the module)."""
    data = unthreaded(dataset)
    found = hazards(data)
    if found:
        return ThreadCheck(ok=False, hazards=found)
    indices = _spread(len(data), samples)
    first: list[str] = []
    began = time.monotonic()
    try:
        for i in indices:
            first.append(digest(data[i]))
            if time.monotonic() - began > SERIAL_BUDGET_S:
                break
        indices = indices[: len(first)]
        second = [digest(data[i]) for i in indices]
    except Exception as exc:  # the user's code: the trials will show it too
        return ThreadCheck(ok=False, error=f"fetching one by one failed first: {exc}")
    deterministic = first == second
    found = hazards(data)  # handles a dataset opens on first use exist only now
    if found:
        return ThreadCheck(ok=False, hazards=found, compared=len(indices))
    pool = Threaded(data, threads)
    try:
        together = [digest(x) for x in pool.__getitems__(indices)]
    except Exception as exc:  # the user's code, on threads: any failure blocks threads
        return ThreadCheck(
            ok=False, compared=len(indices), deterministic=deterministic, error=f"{exc}"
        )
    finally:
        pool.close()
    if deterministic:
        for i, a, b in zip(indices, first, together, strict=True):
            if a != b:
                return ThreadCheck(ok=False, compared=len(indices), deterministic=True, mismatch=i)
    return ThreadCheck(ok=True, compared=len(indices), deterministic=deterministic)


def _spread(n: int, k: int) -> list[int]:
    """Up to ``k`` indices spread evenly over ``range(n)``."""
    if n <= k:
        return list(range(n))
    return [i * n // k for i in range(k)]
