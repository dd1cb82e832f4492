"""At the end of a run, whether each stream the script trained on splits by worker.

An ``IterableDataset`` that does not split its stream by ``get_worker_info()`` yields the whole
stream once per worker. ``run``'s advice to change ``num_workers`` is then wrong twice over: the
measured rate counts copies, and more workers would train on more copies (QA's unsplit stream
of 2,048 items at 2 workers was advised 51 workers, with no word of the duplicates that
``doctor`` reports as an error). So each such loader is probed as the script ends, as autotune
probes one before it adds workers (``autotuning.start.unsplit_stream``: 2 workers, about 2 s),
and the answer goes in its ``LoaderRun`` for the rules (``checks.stall``).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader

from feedrate.autotuning.start import unsplit_stream
from feedrate.loader.rebuild import is_iterable_style
from feedrate.results.run import LoaderRun

#: Streams probed at most, the most used first: each one holds the script's end ~2 s.
PROBED_AT_MOST = 2
#: A probe whose workers give nothing for this long (s) is given up: its stream is kept.
PROBE_TIMEOUT_S = 10.0


def probed(runs: list[tuple[DataLoader[Any] | None, LoaderRun]]) -> list[LoaderRun]:
    """``runs`` (each loader, None where it is gone, with what it did), those of a stream
    that a worker count of their own would matter to (not autotune's: it probes its own)
    with what the probe found. Not after a script that failed or was interrupted: its end is
    not held up for advice."""
    if getattr(sys, "last_type", None) is not None:
        return [run for _, run in runs]
    order = sorted(range(len(runs)), key=lambda i: -runs[i][1].batches)
    chosen = {i for i in order if _streams(*runs[i])}
    chosen = set(sorted(chosen, key=order.index)[:PROBED_AT_MOST])
    out = []
    for i, (loader, run) in enumerate(runs):
        if i in chosen and loader is not None:
            why, _, copies = unsplit_stream(loader, who="feedrate", timeout_s=PROBE_TIMEOUT_S)
            run = replace(run, stream_kept=why, stream_copies=copies)
        out.append(run)
    return out


def _streams(loader: DataLoader[Any] | None, run: LoaderRun) -> bool:
    return (
        loader is not None
        and run.batches > 0
        and run.autotune is None
        and (is_iterable_style(loader))
    )
