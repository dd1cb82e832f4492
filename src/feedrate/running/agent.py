"""What runs inside every Python process of a ``feedrate run`` command, from its start-up
(``sitecustomize``, see ``launch``): patch DataLoader when torch imports it, and at exit write
what was seen to ``$FEEDRATE_RUN_DIR/<pid>.json`` (a ``ProcessRun``).

It must cost nothing where no DataLoader is used: until ``torch`` has been imported (the patch
waits for the whole package: its modules import one another while it loads) only an import
hook waits; the sampling thread starts with the first loader iterated; a process that
iterated none writes nothing. It must never break the user's
program: every failure here is swallowed (and noted in the report where there is one).
A report is written at exit (``atexit``, and multiprocessing's own exit for its children), and
on SIGTERM when the program left SIGTERM to its default when it first iterated a loader (the
report is written, then the signal takes its default course, so the exit status is unchanged).
A SIGTERM that comes while the report is written waits for it (a ``Pool`` ends its workers so
as they exit), then takes the same course.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

ENV_DIR = "FEEDRATE_RUN_DIR"
ENV_T0 = "FEEDRATE_RUN_T0"
ENV_AUTOTUNE = "FEEDRATE_RUN_AUTOTUNE"
HOOKED = "torch"
FOLLOWED = "feedrate.autotuning.loader"

_state: dict[str, Any] = {}


def start() -> None:
    """Called by the ``sitecustomize`` of ``feedrate run``; does nothing outside one."""
    if ENV_DIR not in os.environ or _state:
        return
    _state["dir"] = os.environ[ENV_DIR]
    _state["notes"] = []
    _state["written"] = False
    for name, then in ((HOOKED, _on_import), (FOLLOWED, _on_autoloader)):
        if name in sys.modules:
            then(sys.modules[name])
        else:
            sys.meta_path.insert(0, _Hook(name, then))
    atexit.register(write_report)
    os.register_at_fork(after_in_child=_after_fork)


def _first_iter(sampler: Any) -> None:
    """The process iterates its first loader: start sampling, and catch SIGTERM (only now:
    a process that iterates no loader keeps its signals exactly as they were)."""
    sampler.start()
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)


class _Hook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when module ``name`` is imported, it wraps the loader of its spec
    so that ``then(module)`` follows the module's execution. It stays until the module is
    executed, not only found: transformers and datasets ask ``importlib.util.find_spec("torch")``
    before any import (a spec that is never executed), and the import after it must be patched
    too."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchAfter(spec.loader, self)
        return spec


class _PatchAfter(importlib.abc.Loader):
    def __init__(self, inner: Any, hook: _Hook) -> None:
        self._inner, self._hook = inner, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self._inner.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._hook)  # it is imported: imports go by as before
        self._inner.exec_module(module)
        self._hook.then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _on_import(torch: ModuleType) -> None:
    try:
        from torch.utils.data import dataloader

        # Everything the report needs is imported now: a module imported during exit makes
        # CPython forget that a KeyboardInterrupt ended the program (exit 1, not 130).
        from feedrate.machine import facts  # noqa: F401
        from feedrate.results import run  # noqa: F401
        from feedrate.running import tuning  # noqa: F401
        from feedrate.running.observer import Registry, install
        from feedrate.running.sampler import Sampler, read_at_shutdown
        from feedrate.running.streams import probe_first_epoch
        from feedrate.running.tuning import replacer

        # --autotune's replacer probes a stream itself before it adds workers.
        registry = Registry(
            _origin(), replacer() if os.environ.get(ENV_AUTOTUNE) else probe_first_epoch
        )
        sampler = Sampler(lambda: list(registry.watches))
        _state["registry"], _state["sampler"] = registry, sampler
        install(registry, dataloader.DataLoader)
        read_at_shutdown(lambda: _state.get("sampler"))
        registry.on_first_iter = lambda: _first_iter(sampler)
        from multiprocessing import util

        util.register_after_fork(_KEY, _multiprocessing_child)
    except Exception as exc:
        _state["notes"].append(f"feedrate could not watch DataLoader here: {exc!r}")


def _on_autoloader(module: ModuleType) -> None:
    """``feedrate.autotuning.loader`` is imported (torch was, first): the script's own
    ``feedrate.autotune(loader)`` is followed as ``loader``."""
    registry = _state.get("registry")
    if registry is None:
        return
    try:
        from feedrate.running.tuning import follow

        follow(registry, module.AutoLoader)
    except Exception as exc:
        _state["notes"].append(f"feedrate could not follow feedrate.autotune here: {exc!r}")


def _origin() -> float:
    """The reading of ``time.perf_counter`` at the moment ``feedrate run`` started the
    command (shared by every process through ``$FEEDRATE_RUN_T0``, a wall-clock time)."""
    try:
        t0 = float(os.environ.get(ENV_T0, ""))
    except ValueError:
        return time.perf_counter()
    return time.perf_counter() - (time.time() - t0)


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def report() -> dict[str, Any] | None:
    """This process's ``ProcessRun`` as a dict, or None when it iterated no loader."""
    registry = _state.get("registry")
    if registry is None:
        return None
    from feedrate.results.run import ProcessRun

    if _state.get("sampler") is not None:
        _state["sampler"].stop()
    from feedrate.running.tuning import finish

    for watch in registry.watches:
        finish(watch)  # --autotune's, or the script's own feedrate.autotune
    rank = _int_env("RANK")
    rank = _int_env("LOCAL_RANK") if rank is None else rank
    from feedrate.running.streams import NOTES, applied  # imported with torch: no import here

    loaders = [applied(w, w.result(os.getpid(), rank)) for w in registry.watches if w.batches]
    notes = list(_state.get("notes", [])) + NOTES
    if not loaders:
        api = sys.modules.get("feedrate.autotuning.api")
        made = api.made_here() if api is not None else 0
        if not made:
            return None
        notes.append(
            f"feedrate.autotune() in the script tuned {made} loader(s) that feedrate run could "
            "not follow (built where it does not look, or never iterated); AutoLoader.report() "
            "has what autotune did"
        )
    run = ProcessRun(
        pid=os.getpid(),
        ppid=os.getppid(),
        argv=list(sys.argv),
        rank=rank,
        local_rank=_int_env("LOCAL_RANK"),
        world_size=_int_env("WORLD_SIZE"),
        loaders=loaders,
        machine=_machine(),
        notes=notes,
    )
    return run.to_dict()


def _machine() -> dict[str, Any]:
    try:
        from feedrate.machine.facts import collect

        return collect().to_dict()
    except Exception:
        return {}


def write_report() -> None:
    """Write this process's report (once), atomically, as the process ends (at exit,
    multiprocessing's exit, SIGTERM). SIGCHLD is blocked from then on: on SIGTERM to the whole
    process group the workers die as the report is written, and torch's SIGCHLD handler raised
    in the middle of it ("DataLoader worker ... is killed by signal"; unblocked after, it would
    raise in the user's code instead). SIGTERM waits while it is written (``_on_sigterm``): a
    ``Pool`` ends its forked workers with SIGTERM as they write theirs at exit, which ended them
    mid-write. A write that fails anyway is tried once more; a report lost leaves
    ``<pid>.lost`` saying why, for the run's verdict."""
    if _state.get("written") or ENV_DIR not in os.environ:
        return
    _state["written"] = _state["writing"] = True
    _block(signal.SIGCHLD)
    error = None
    try:
        for _ in range(2):
            try:
                _write(report())
                error = None
                break
            except Exception as exc:
                error = exc
        if error is not None:
            sys.stderr.write(f"feedrate run: this process's report was lost: {error!r}\n")
            with contextlib.suppress(OSError), open(_path(".lost"), "w") as fh:
                fh.write(repr(error))
    finally:
        _state["writing"] = False
        if _state.pop("terminated", False):  # SIGTERM came as it was written: it ends us now
            _on_sigterm(signal.SIGTERM, None)
    if getattr(sys, "last_type", None) is KeyboardInterrupt and _main_process():
        _exit_as_interrupted()


def _path(suffix: str) -> str:
    return os.path.join(_state["dir"], f"{os.getpid()}{suffix}")


def _write(found: dict[str, Any] | None) -> None:
    if found is None:
        return
    tmp = _path(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(found, fh)
    os.replace(tmp, _path(".json"))


def _block(signum: int) -> None:
    """Block ``signum`` in this thread (where ``pthread_sigmask`` exists)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signum})


def _main_process() -> bool:
    return threading.current_thread() is threading.main_thread()


def _exit_as_interrupted() -> None:
    """End as CPython ends a program that a Ctrl-C stopped (killed by SIGINT, so its parent
    sees 130), even where something imported during exit made it forget."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _state.get("writing"):  # the report is being written: the signal waits for it
        _state["terminated"] = True
        return
    write_report()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


class _Key:
    """What multiprocessing's after-fork registry holds on to (it keeps weak references)."""


def _multiprocessing_child(_key: object) -> None:
    """A forked ``multiprocessing`` child leaves through ``os._exit``: its report is written
    by multiprocessing's own exit (its finalizers, registered here, after it cleared the
    ones inherited from the parent)."""
    from multiprocessing import util

    util.Finalize(None, write_report, exitpriority=-100)


_KEY = _Key()


def _after_fork() -> None:
    """A forked child (a DataLoader worker, a multiprocessing Process) starts with no loaders
    of its own."""
    registry = _state.get("registry")
    _state["written"] = False
    if registry is not None:
        registry.reset()
        from feedrate.running.sampler import Sampler

        _state["sampler"] = sampler = Sampler(lambda: list(registry.watches))
        registry.on_first_iter = lambda: _first_iter(sampler)
