"""Resolve a TARGET (``path/to/file.py:NAME`` or ``package.module:NAME``) to the user's DataLoader.

NAME is a ``torch.utils.data.DataLoader`` or a zero-argument callable returning one. Every way this
can fail raises :class:`~feedrate.errors.TargetError` with a one-line message meant for the user;
when the user's own code raised, that exception is kept as ``__cause__``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from torch.utils.data import DataLoader, Dataset

from feedrate.errors import TargetError
from feedrate.loader import libraries
from feedrate.loader.init_args import recording
from feedrate.loader.rebuild import quiet_worker_count_warning
from feedrate.loader.user_code import run_user
from feedrate.loader.words import BY_TRAINER

__all__ = [
    "TargetKind",
    "TargetSpec",
    "found_target",
    "load_source",
    "load_step",
    "load_target",
    "parse_target",
]

TargetKind = Literal["file", "module"]

_FORM = "expected path/to/file.py:NAME or package.module:NAME"
_NOT_LOADER = "not a torch.utils.data.DataLoader or a zero-argument callable returning one"
_SEPARATORS = [s for s in ("/", os.sep, os.altsep) if s]


@dataclass(frozen=True)
class TargetSpec:
    """A parsed TARGET. ``str()`` gives it back as ``location:name``.

    ``location`` is a file path exactly as the user wrote it (``kind == "file"``) or a dotted
    module name (``kind == "module"``); ``name`` is an attribute path in it, e.g. ``loader`` or
    ``cfg.train``. ``args`` are the script's own command-line arguments: its ``sys.argv[1:]``
    while it is imported and while NAME builds a loader (``sys.argv[0]`` is ``location``), as
    ``python train.py ARGS`` would give it. A script that parses its arguments where it builds
    the loader gets them, not feedrate's own.
    """

    kind: TargetKind
    location: str
    name: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.location}:{self.name}"


def parse_target(spec: str, args: tuple[str, ...] = ()) -> TargetSpec:
    """Split ``spec`` at its last colon; raise TargetError unless it has the form of a TARGET.
    ``args`` are the script's own arguments (``TargetSpec.args``).

    The location is a file when it ends in ``.py`` or contains a path separator, otherwise a
    dotted module name. Nothing is imported or checked on disk here.
    """
    location, colon, name = spec.rpartition(":")
    if not colon:
        raise _bad_form(spec, "no ':NAME'")
    if not location or not name:
        raise _bad_form(spec, "empty location" if not location else "empty NAME")
    if not _is_dotted_identifier(name):
        raise _bad_form(spec, f"NAME {name!r} is not a Python name")
    if location.endswith(".py") or any(s in location for s in _SEPARATORS):
        return TargetSpec("file", location, name, tuple(args))
    if not _is_dotted_identifier(location):
        raise _bad_form(spec, f"{location!r} is neither a .py file nor a dotted module name")
    return TargetSpec("module", location, name, tuple(args))


def load_target(spec: str | TargetSpec) -> DataLoader[Any]:
    """Import the TARGET's file or module and return its DataLoader (calling NAME if needed).

    A file is imported under its stem as module name (or a unique ``_feedrate_target_*`` name when
    that name is taken by another module) and registered in ``sys.modules``; its directory is put
    first on ``sys.path``. Both let spawned DataLoader workers unpickle classes defined in the file.
    A file already imported under its stem is reused, not executed again.
    Raises TargetError for every failure; KeyboardInterrupt propagates.
    """
    # A DataLoader subclass built meanwhile keeps its arguments (rebuild); DataLoader's warning
    # about more workers than CPUs is feedrate's to judge (workers-past-cpus), not to print.
    target = spec if isinstance(spec, TargetSpec) else parse_target(spec)
    with recording(), quiet_worker_count_warning(), script_argv(target):
        value = _load_object(target)
        return _as_loader(value, target)


def load_source(spec: str | TargetSpec) -> DataLoader[Any] | Callable[[], DataLoader[Any]]:
    """As ``load_target``, but a NAME that is a function comes back as a zero-argument callable
    that builds a fresh loader at each call (the first call returns the one built here, where
    every error is raised as for ``load_target``): a run that iterates a dataset then leaves
    nothing behind for the next (MosaicML's ``StreamingDataset`` keeps file locks)."""
    target = spec if isinstance(spec, TargetSpec) else parse_target(spec)
    with recording(), quiet_worker_count_warning(), script_argv(target):
        value = _load_object(target)
        first = _as_loader(value, target)
    if not (inspect.isfunction(value) or inspect.ismethod(value)):
        return first
    return _Factory(target, value, first)


class _Factory:
    """A TARGET's function, called for each loader (see ``load_source``)."""

    def __init__(self, target: TargetSpec, fn: Callable[[], object], first: DataLoader[Any]):
        self.target, self.fn = target, fn
        self.first: DataLoader[Any] | None = first

    def __call__(self) -> DataLoader[Any]:
        if self.first is not None:
            loader, self.first = self.first, None
            return loader
        with recording(), quiet_worker_count_warning(), script_argv(self.target):
            return _as_loader(self.fn, self.target)


def _load_object(target: TargetSpec, step: bool = False) -> object:
    """Import the TARGET's file or module and look NAME up in it."""
    if target.kind == "file":
        module = _import_file(target)
    else:
        module = run_user(target, "importing it", lambda: _import_module(target.location))
    return run_user(target, "getting it", lambda: _resolve(module, target, step))


@contextlib.contextmanager
def script_argv(target: TargetSpec) -> Iterator[None]:
    """``sys.argv`` as the script would see it run (``TargetSpec.args``), feedrate's back after."""
    kept = sys.argv
    sys.argv = [target.location, *target.args]
    try:
        yield
    finally:
        sys.argv = kept


def load_step(spec: str | TargetSpec) -> Callable[[Any], object]:
    """Import a training step ``FILE.py:FUNC`` or ``package.module:FUNC``: a callable taking one
    batch. Errors as for ``load_target`` (TargetError, one line)."""
    target = spec if isinstance(spec, TargetSpec) else parse_target(spec)
    with script_argv(target):
        value = _load_object(target, step=True)
    if not callable(value):
        raise TargetError(f"{target} is {_a(value)}, not a callable taking a batch")
    step: Callable[[Any], object] = value
    try:
        inspect.signature(step).bind(object())
    except TypeError as exc:
        raise TargetError(f"{target} must take exactly one argument, the batch ({exc})") from None
    except ValueError:
        pass  # no signature to check (a builtin): trust it
    return step


def found_target(spec: str | TargetSpec) -> TargetSpec:
    """``spec`` parsed (``parse_target``), its file found on disk; nothing imported. What can
    be told of a TARGET before anything is started for it (the ranks of ``--nproc-per-node``)."""
    target = spec if isinstance(spec, TargetSpec) else parse_target(spec)
    path = Path(target.location)
    if target.kind == "file" and not path.is_file():
        what = "not a file" if path.exists() else "no such file"
        raise TargetError(f"{what}: {target.location}")
    return target


def _import_file(target: TargetSpec) -> ModuleType:
    path = Path(found_target(target).location)
    filename = os.path.abspath(path)
    directory = os.path.dirname(filename)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    existing = sys.modules.get(path.stem)
    existing_file = getattr(existing, "__file__", None)
    if existing is not None and existing_file and _same(existing_file, filename):
        return existing
    name = _free_module_name(path.stem)
    # An explicit loader: spec_from_file_location finds none for names not ending in .py.
    loader = importlib.machinery.SourceFileLoader(name, filename)
    module_spec = importlib.util.spec_from_file_location(name, filename, loader=loader)
    assert module_spec is not None  # never None when a loader is given
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        run_user(target, "importing it", lambda: loader.exec_module(module))
    except BaseException:
        if sys.modules.get(name) is module:
            del sys.modules[name]
        raise
    return module


def _free_module_name(stem: str) -> str:
    """``stem`` when it is a free module name, else a fresh ``_feedrate_target_<stem>_<n>``."""
    if stem.isidentifier() and stem not in sys.modules:
        return stem
    safe = "".join(c if c.isalnum() else "_" for c in stem)
    names = (f"_feedrate_target_{safe}_{n}" for n in itertools.count())
    return next(name for name in names if name not in sys.modules)


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # Only the target (or a parent package) missing is a bad TARGET; any other missing module
        # was imported by the user's code and is reported as its exception by _run_user.
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise
        hint = name.replace(".", os.sep) + ".py"
        extra = f" (there is a file {hint} here: use {hint}:NAME)" if os.path.isfile(hint) else ""
        raise TargetError(f"no module named {name!r}{extra}") from exc


def _resolve(module: ModuleType, target: TargetSpec, step: bool = False) -> object:
    value: object = module
    missing = object()
    parts = target.name.split(".")
    for i, part in enumerate(parts):
        found = getattr(value, part, missing)
        if found is missing:
            if i == 0:
                namespace: Mapping[str, object] = vars(module)
                hint = _hint(part, namespace, module.__name__, 1 if step else 0)
                raise TargetError(f"{target.location} has no name {part!r}{hint}")
            owner = f"{target.location}:{'.'.join(parts[:i])}"
            namespace = dict.fromkeys(dir(value))
            raise TargetError(f"{owner} has no attribute {part!r}{_hint(part, namespace)}")
        value = found
    return value


def _hint(
    name: str, namespace: Mapping[str, object], home: str | None = None, args: int = 0
) -> str:
    """' (did you mean ...?)' from close public names, else the DataLoaders present and the
    functions of module ``home`` that take ``args`` arguments (0: a loader's factory, 1: a
    training step), else ''."""
    public = [n for n in namespace if not n.startswith("_")]
    close = difflib.get_close_matches(name, public, n=3)
    if close:
        return f" (did you mean {' or '.join(map(repr, close))}?)"
    loaders = [] if args else [n for n in public if isinstance(namespace[n], DataLoader)][:5]
    found = [f"DataLoaders it defines: {', '.join(loaders)}"] if loaders else []
    fits = [n for n in public if home is not None and _takes(namespace[n], home, args)][:5]
    if fits:
        what = "one argument" if args else "no arguments"
        found.append(f"functions it defines that take {what}: {', '.join(fits)}")
    return f" ({'; '.join(found)})" if found else ""


def _takes(value: object, home: str, args: int) -> bool:
    """A function of module ``home`` (not imported) that needs ``args`` arguments: with none,
    it may build a loader (a factory ``FILE:NAME`` takes too); with one, be a training step."""
    own = inspect.isfunction(value) and value.__module__ == home
    return own and len(_required_parameters(value)) == args  # type: ignore[arg-type]


def _as_loader(value: object, target: TargetSpec) -> DataLoader[Any]:
    found = _held_loader(value, target)
    if found is not None:
        return found
    if not callable(value):
        hint = ": wrap the Dataset in a DataLoader" if isinstance(value, Dataset) else ""
        raise TargetError(f"{target} is {_a(value)}, {_NOT_LOADER}{hint}")
    required = _required_parameters(value)
    if required:
        raise TargetError(
            f"{target} needs arguments ({', '.join(required)}), but {target.name} must take"
            f" none: point the TARGET at a function without parameters that builds the loader"
        )
    result = run_user(target, "calling it", value)
    held = _held_loader(result, target)
    if held is not None:
        return held
    if not isinstance(result, DataLoader):
        hint = " (does it end with 'return loader'?)" if result is None else ""
        raise TargetError(f"{target} returned {_a(result)}, not a DataLoader{hint}")
    return result


def _held_loader(value: object, target: TargetSpec) -> DataLoader[Any] | None:
    """The DataLoader ``value`` is or holds: a framework's (``integrations.loader_from``: a
    LightningDataModule, a transformers Trainer, an accelerate-prepared loader), the one
    inside webdataset's ``WebLoader`` (tuned alone: the stages after it run in this process
    and are kept as they are), the DataLoader itself; else None."""
    try:
        from feedrate.integrations import loader_from
    except ImportError:  # the framework adapters are not there
        held = None
    else:
        held = run_user(target, "getting its DataLoader", lambda: loader_from(value))
    if held is not None:
        if type(value).__module__.startswith("transformers"):  # a Trainer: set by its arguments
            libraries.mark_wrapped(held, BY_TRAINER)
        return held
    parts = libraries.webloader_parts(value)
    if parts is not None:
        libraries.mark_wrapped(parts[0], type(value).__name__)
        return parts[0]
    return value if isinstance(value, DataLoader) else None


def _required_parameters(fn: Callable[..., object]) -> list[str]:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature available (some builtins): just call it
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.default is p.empty and p.kind not in variadic]


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _is_dotted_identifier(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _bad_form(spec: str, reason: str) -> TargetError:
    return TargetError(f"bad TARGET {spec!r} ({reason}): {_FORM}")


def _a(value: object) -> str:
    """'a list', 'an int', 'None': the value's type with an article, for messages."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
