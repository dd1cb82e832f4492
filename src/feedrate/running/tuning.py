"""``feedrate run --autotune``: each training loader's iteration goes through
``feedrate.autotune(loader)`` (the same batches in the same order, workers cleaned up, the
cache used and filled), and what it changed goes into the report.

A loader is tuned from its first ``iter()`` taken with autograd on and outside an evaluation
function (``sites.EVAL_FUNCTIONS``: an evaluation loop is left as it is, under
``torch.no_grad()`` or, as transformers' Trainer runs it, with autograd off only per step).
Where autotune cannot wrap a loader, the loader is observed as it is, and the report says why.
A loader that is feedrate's answer already (``result.loader()``, as the integrations' callbacks
hand it over) is observed as it is. A script's own ``feedrate.autotune(loader)`` is followed
as ``loader`` is (``follow``), with or without ``--autotune``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from feedrate.results.autotune import AutotuneReport
from feedrate.results.run import AutotuneChange
from feedrate.running.observer import Registry, Replacer, Watch
from feedrate.search.tuner import online


def replacer() -> Replacer:
    """The ``Registry`` replacer that hands each training loader's epochs to autotune."""
    from feedrate.loader.init_args import recording

    # Loaders built from now on keep their constructor's arguments: autotune can then build
    # a subclass with arguments of its own again.
    _recording.append(recording())
    _recording[-1].__enter__()
    return _tuned_epoch


_recording: list[Any] = []
#: The AutoLoaders ``--autotune`` made (``follow`` leaves them to the replacer).
_OURS: weakref.WeakSet[Any] = weakref.WeakSet()


def follow(registry: Registry, cls: type[Any]) -> None:
    """Wrap ``cls.__iter__`` (``AutoLoader``'s, once): the script's own
    ``feedrate.autotune(loader)`` is followed as ``loader`` (``Registry.iterate``): its epochs
    timed, what autotune changed in the report, as ``--autotune``'s are."""
    if getattr(cls, "__feedrate_run__", False):
        return
    own_iter = cls.__iter__

    @functools.wraps(own_iter)
    def __iter__(self: Any) -> Any:
        if self in _OURS:  # --autotune's, iterated by the loader's own watch already
            return own_iter(self)
        return registry.iterate(self.wrapped, lambda: own_iter(self), tuner=self)

    cls.__iter__ = __iter__
    cls.__feedrate_run__ = True


def _tuned_epoch(
    watch: Watch, loader: DataLoader[Any], own_iter: Callable[[], Any]
) -> Iterator[Any] | None:
    if watch.evaluating:
        return None  # an evaluation loop, even over a loader tuned for training: left as it is
    if watch.tuner is not None and watch.tuner not in _OURS:
        return None  # the script tunes it itself (follow): iterated raw, it is left as it is
    if watch.tuner is None:
        if watch.autotune is not None or not torch.is_grad_enabled():
            return None  # autotune refused it before, or an evaluation loop
        if watch.handed_over:
            return None  # feedrate tuned it in the script already (an integration's callback)
        try:
            from feedrate.autotuning.api import autotune
            from feedrate.loader.rebuild import rebuild

            rebuild(loader, watch.config)  # autotune's trial loaders are rebuilt: can they be?
            watch.tuner = autotune(loader)
            _OURS.add(watch.tuner)
        except Exception as exc:
            watch.autotune = AutotuneChange(before=watch.config, error=_why(exc))
            return None
        watch.autotune = AutotuneChange(before=watch.config)
    return _guarded(watch, iter(watch.tuner), own_iter)


def _guarded(watch: Watch, tuned: Iterator[Any], own_iter: Callable[[], Any]) -> Iterator[Any]:
    """``tuned``'s batches; if it fails before its first one, the loader's own (autotune is
    then given up for this loader, and the report says why)."""
    try:
        first = next(tuned)
    except StopIteration:
        return
    except Exception as exc:
        tuner, watch.tuner = watch.tuner, None
        watch.autotune = AutotuneChange(before=watch.config, error=_why(exc))
        if tuner is not None:
            tuner.close()
        yield from own_iter()
        return
    yield first
    yield from tuned


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def finish(watch: Watch) -> None:
    """At exit: stop the tuner's workers and note what it changed. The stall after is the
    loop's own over the last half of its batches (after tuning, when it settled early)."""
    tuner, change = watch.tuner, watch.autotune
    if tuner is None or change is None:
        return
    try:
        tuner.close()
        report = tuner.report()
        change.after = report.config
        change.settled = report.settled
        change.report = report.to_dict()
        change.started_from = report.started_from
        change.stall_before = own_stall(watch, report)
        change.stall_after = late_stall(watch)
    except Exception as exc:
        change.error = f"autotune's report was lost: {exc!r}"


def own_stall(watch: Watch, report: AutotuneReport) -> float | None:
    """The stall with the loader's own settings, where autotune ran them: its trial of them
    (autotune runs every configuration with persistent workers, ``online``: a trial of the
    user's settings is of those), or, where no trial ended and autotune never left them, the
    loop's over the last half of its batches (as the stall after); None where it never ran
    them."""
    own = (watch.config, online(watch.config))
    trial = next((t for t in report.trials if t.config in own), None)
    if trial is not None:
        return trial.stall_fraction
    return late_stall(watch) if not report.trials and report.config in own else None


def late_stall(watch: Watch) -> float | None:
    """The stall over the last half of the loop's batches, from its timeline."""
    half = watch.batches / 2
    wait = step = 0.0
    seen = 0
    for window in reversed(watch.timeline.windows()):
        wait, step, seen = wait + window.wait_s, step + window.step_s, seen + window.batches
        if seen >= half:
            break
    return wait / (wait + step) if wait + step > 0 else None
