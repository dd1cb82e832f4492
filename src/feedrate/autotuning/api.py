"""``feedrate.autotune``: the entry point, which checks its arguments and wraps the loader in an
``AutoLoader`` (``autotuning.loader``)."""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import DataLoader

from feedrate.autotuning import delegation
from feedrate.autotuning.loader import AutoLoader
from feedrate.autotuning.start import check_arguments
from feedrate.errors import UserError
from feedrate.loader import libraries
from feedrate.machine.facts import MachineFacts
from feedrate.search.tuner import BUDGET_S


def autotune(
    loader: DataLoader[Any] | Any,
    *,
    rate: float | None = None,
    budget_s: float = BUDGET_S,
    max_workers: int | None = None,
    allow_threads: bool = False,
    cache: bool = True,
    machine: MachineFacts | None = None,
    coordinate: bool | None = None,
) -> AutoLoader:
    """Wrap ``loader`` so it tunes its own settings while the training loop iterates it.

    Use it where the loader was: ``for batch in feedrate.autotune(loader): ...``. It yields the
    same batches in the same order (map-style datasets), tries a few configurations on stretches
    of the first epoch, keeps the cheapest that removes the data stall of *this* loop, remembers
    it in the cache shared with ``tune`` (the next run starts there), and tunes again if the
    stall comes back. ``allow_threads`` lets it fetch on threads inside workers (a thread-safe
    ``__getitem__`` is needed). ``.config`` is the settings in use, ``.report()`` what it tried.

    ``rate``: the samples/s your loop will take at its fastest, if known (after compilation): a
    configuration then feeds the loop only if it also delivered that rate (the report says
    when a slower loop limited the answer). ``budget_s``: training seconds one round of tuning
    may spend on trials; once spent, it settles on the best configuration so far.

    ``loader`` may be webdataset's ``WebLoader`` (its DataLoader is tuned, its stages run after
    it). ``state_dict``/``load_state_dict`` are a streaming loader's (litdata's, MosaicML's).

    In a distributed job (``torch.distributed`` initialized with several ranks when the loop
    first iterates), call it in every rank: the ranks meet at that first iteration (so every
    rank must iterate its loader at the same point, as training does), start from rank 0's
    settings, switch together at the same batches on the figures of every rank, and keep
    their own shard's order; each decides within its share of the node, only rank 0 writes the
    cache. ``coordinate=False`` tunes this process alone (a loader only one rank iterates).
    ``close()`` (or ``with``) ends the workers and the channel to the other ranks.
    """
    webloader = libraries.webloader_parts(loader)
    inner = loader if webloader is None else webloader[0]
    if not isinstance(inner, DataLoader):
        raise UserError(
            f"autotune() takes a torch.utils.data.DataLoader, got {type(loader).__name__}"
        )
    check_arguments(max_workers=max_workers, rate=rate, budget_s=budget_s)
    auto = AutoLoader(
        inner,
        max_workers=max_workers,
        allow_threads=allow_threads,
        use_cache=cache,
        machine=machine,
        rate=None if rate is None else float(rate),
        budget_s=float(budget_s),
        coordinate=coordinate,
    )
    if webloader is not None:  # wds.WebLoader: tune its DataLoader, keep the stages after it
        # The stages after it end on a batch's error, as on their DataLoader's own.
        epoch = lambda: delegation.Batches(lambda _: auto._epoch())  # noqa: E731
        auto._pipeline = delegation.around(loader, epoch)
        auto._plain = loader
    MADE.append(os.getpid())
    return auto


#: The pid of the process of each ``autotune()`` call (``feedrate run`` counts the script's
#: own, whose batches its lanes' loaders deliver, not the loader it watches; a forked worker
#: inherits the list, so only this process's entries count: ``made_here``).
MADE: list[int] = []


def made_here() -> int:
    """``autotune()`` calls made in this process."""
    return MADE.count(os.getpid())
