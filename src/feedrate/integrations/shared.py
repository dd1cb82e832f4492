"""What every trainer integration does alike: tune once on the main process and share the
answer with the other ranks, and say the answer in the framework's own words.

A ``TuneResult`` is plain data, so the ranks share it whole (``to_dict``/``from_dict``): every
rank then rebuilds its own loader (its own shard) with the same settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import DataLoader

from feedrate.distributed import group
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect
from feedrate.render.text import rate
from feedrate.results.tune import TuneResult
from feedrate.workflows.tune import tune

#: DataLoader's own words for the settings feedrate applies, in the order they are printed.
DATALOADER_WORDS: Mapping[str, str] = {
    "num_workers": "num_workers",
    "prefetch_factor": "prefetch_factor",
    "persistent_workers": "persistent_workers",
    "pin_memory": "pin_memory",
}

#: The key of the document the main process sends instead of a result when tuning failed.
FAILED = "feedrate_tune_failed"

#: What a distributed job does before the others use what the main process sent: a
#: ``broadcast(obj)`` that returns rank 0's object on every rank.
Broadcast = Callable[[Any], Any]


def settings(config: LoaderConfig) -> dict[str, Any]:
    """The four settings a trainer takes, as DataLoader applies them (``prefetch_factor``
    None and ``persistent_workers`` False without workers)."""
    return {
        "num_workers": config.num_workers,
        "prefetch_factor": config.prefetch_factor,
        "persistent_workers": config.persistent_workers,
        "pin_memory": config.pin_memory,
    }


def in_words(config: LoaderConfig, words: Mapping[str, str] = DATALOADER_WORDS) -> str:
    """``config`` as ``name=value`` pairs under the framework's names for them, e.g.
    ``dataloader_num_workers=8, dataloader_prefetch_factor=4, ...``."""
    values = settings(config)
    return ", ".join(f"{words[k]}={values[k]!r}" for k in words)


def evidence(result: TuneResult) -> str:
    """Why, in one clause: the rate measured against the user's own, and where it came from."""
    if result.best.config == result.baseline.config:
        said = f"your settings measured fastest, {rate(result.best_rate)} samples/s"
    else:
        said = (
            f"{rate(result.best_rate)} samples/s, {result.speedup:.2f}× your settings' "
            f"{rate(result.baseline_rate)} ({result.baseline.config.label()})"
        )
    if result.from_cache:
        said += "; from feedrate's cache"
    elif result.partial:
        said += "; the search was cut short by its budget"
    return said


def tune_shared(
    loader: DataLoader[Any],
    tune_kwargs: Mapping[str, Any],
    *,
    main: bool = True,
    broadcast: Broadcast | None = None,
) -> TuneResult:
    """In a distributed job (``torch.distributed`` initialized): ``tune`` in every rank, the node
    tuned as a unit, every rank loading its own shard at once (``workflows.tune_node``). Else
    ``tune(loader, **tune_kwargs)`` on the main process, and with ``broadcast`` the others wait
    for its answer instead of measuring (a job whose group is not up yet). Every rank gets the
    same result; ``result.loader(loader)`` rebuilds each rank's own loader with it.
    """
    if group.active():
        return tune(loader, **tune_kwargs)
    document: dict[str, Any] | None = None
    if main:
        try:
            document = tune(loader, **tune_kwargs).to_dict()
        except BaseException as exc:
            if broadcast is not None:  # the others wait for an answer: tell them there is none
                broadcast({FAILED: f"{type(exc).__name__}: {exc}"})
            raise
    if broadcast is not None:
        document = broadcast(document)
    if document is None or FAILED in document:
        why = "sent nothing" if document is None else f"failed ({document[FAILED]})"
        raise RuntimeError(f"the main process tunes for every rank, and it {why}")
    return TuneResult.from_dict(document)


def workers_per_rank(cpus: int | None, ranks: int) -> int | None:
    """A cap on workers for each of ``ranks`` processes sharing ``cpus`` (None: no cap, one
    process). Measured alone, one rank would take the CPUs its neighbours also need."""
    if ranks <= 1 or not cpus:
        return None
    return max(1, cpus // ranks)


def local_ranks(default: int) -> int:
    """The processes of this job on this node: torchrun's ``LOCAL_WORLD_SIZE``, else
    ``default`` (the framework's own count)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", default)))
    except ValueError:
        return max(1, default)


def share_cpus(tune_kwargs: dict[str, Any], ranks: int) -> str:
    """With ``ranks`` processes on this node and no ``max_workers`` given: cap the workers of
    each at its share of the CPUs (in ``tune_kwargs``), and return what to say of it ("" when
    nothing was capped). In a distributed job nothing is capped: the tune measures every rank
    loading at once, each within its share of the node."""
    if ranks > 1 and group.active():
        return f"; measured with all {ranks} ranks of this node loading at once"
    if ranks <= 1 or "max_workers" in tune_kwargs:
        return ""
    facts = tune_kwargs.setdefault("machine", collect())
    cap = workers_per_rank(facts.cpus_usable, ranks)
    tune_kwargs["max_workers"] = cap
    if cap is None:
        return ""
    workers = "1 worker" if cap == 1 else f"{cap} workers"
    return (
        f"; {ranks} ranks share {facts.cpus_usable} CPUs, so each may have at most {workers}: "
        "max_workers= to choose"
    )
