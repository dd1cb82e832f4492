"""Whether each stream the script trains on splits by worker, probed at its first epoch.

An ``IterableDataset`` that does not split its stream by ``get_worker_info()`` yields the whole
stream once per worker. ``run``'s advice to change ``num_workers`` is then wrong twice over: the
measured rate counts copies, and more workers would train on more copies (QA's unsplit stream
of 2,048 items at 2 workers was advised 51 workers, with no word of the duplicates that
``doctor`` reports as an error). So such a loader is probed as autotune probes one before it
adds workers (``autotuning.start.unsplit_stream``: 2 workers, about 2 s), at its first
training epoch, before that epoch's clock starts. Not at the script's exit: a loader built in
``main()`` is gone by then, and at exit torch no longer stops the workers it starts (its exit
flag is set), which left the probe's 2 running.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.autotuning.start import unsplit_stream
from feedrate.loader.rebuild import is_iterable_style
from feedrate.results.run import LoaderRun
from feedrate.running.observer import Watch

#: Streams probed at most in a process: each one holds its first epoch ~2 s back.
PROBED_AT_MOST = 2
#: A probe whose workers give nothing for this long (s) is given up (a note says so).
PROBE_TIMEOUT_S = 10.0

#: Per watch probed: why its worker count must stay (None: it splits), and whether 2 workers
#: yielded the same samples.
_FOUND: weakref.WeakKeyDictionary[Watch, tuple[str | None, bool]] = weakref.WeakKeyDictionary()
#: What went wrong with a probe, for the report's notes.
NOTES: list[str] = []


def probe_first_epoch(
    watch: Watch, loader: DataLoader[Any], own_iter: Callable[[], Any]
) -> Iterator[Any] | None:
    """The ``Registry`` replacer without ``--autotune``: at a training stream's first epoch,
    its probe (the epoch's clock started after it); the loader's own iterator always (None)."""
    del own_iter
    if watch in _FOUND or len(_FOUND) >= PROBED_AT_MOST or not _training_stream(watch, loader):
        return None
    _FOUND[watch] = (None, False)
    try:
        why, _, copies = unsplit_stream(
            loader, who="feedrate", timeout_s=PROBE_TIMEOUT_S, raises=True
        )
    except Exception as exc:  # no verdict: the advice stays as the run alone gives it
        NOTES.append(f"the check of the stream built at {watch.site} failed: {exc}")
    else:
        _FOUND[watch] = (why, copies)
    watch.began = time.perf_counter()  # the probe is not the epoch's wait for its first batch
    return None


def _training_stream(watch: Watch, loader: DataLoader[Any]) -> bool:
    if watch.evaluating or not torch.is_grad_enabled() or watch.handed_over:
        return False
    return watch.tuner is None and is_iterable_style(loader)


def applied(watch: Watch, run: LoaderRun) -> LoaderRun:
    """``run`` with what the probe of ``watch`` found, where it found the stream kept."""
    why, copies = _FOUND.get(watch, (None, False))
    return run if why is None else replace(run, stream_kept=why, stream_copies=copies)
