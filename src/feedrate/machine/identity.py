"""What an object holds, as a digest that tells two pipelines of one class apart.

Two Hugging Face datasets of one length, one formatted for torch and one with a transform, or
two webdataset pipelines over the same shards, one split by worker and one not, are objects of
one class: only their state tells them apart. ``state_of`` walks that state (``vars`` and
``__slots__``, the items of containers, the code, defaults and closures of functions, the
function and arguments of ``functools.partial``) and returns it as plain data, the same in
every process and run: nothing in it is an address, an ``id`` or a ``repr`` that may hold one.

The walk is bounded, so that a dataset holding a 10 GB array or an Arrow table costs what a
small one does: arrays and tables count by type, shape and dtype (schema and rows), never by
their data; a string or bytes past ``MAX_TEXT`` by length and a digest of its head; a container
by its length and ``MAX_ITEMS`` of its items (head and tail); nesting stops at ``MAX_DEPTH`` and
the walk at ``MAX_NODES`` values. Seeds and epoch counters are left out: they change which
sample comes when, never the settings that suit a pipeline, and some libraries draw a seed at
random on every run (``webdataset.WebDataset``), which would make every key new; so are caches
and process ids (``UNSTABLE``).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import inspect
import itertools
import json
import math
import os
import random
import sys
import types
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Nesting followed: a webdataset stage's function sits at 4 (dataset, pipeline, stage, args).
MAX_DEPTH = 6
#: Values visited in one walk, whatever its shape.
MAX_NODES = 4096
#: Items of one container visited: the first and last half of them.
MAX_ITEMS = 64
#: Characters of a string (bytes of a bytes) kept; a longer one counts by length and its head.
MAX_TEXT = 1024
#: Elements of an in-memory array kept by value (a mean or a std), on the CPU only.
MAX_ELEMENTS = 16
#: Attribute and keyword names whose values are left out: a seed or an epoch counter, a process
#: id, fsspec's token of a file system (it holds the process id); any name ending in
#: "state_dict", where a resumable stream stands (``datasets.IterableDataset``); and any ending
#: in "cache" unless it holds a bool (``use_cache``): a cache follows from the rest, and fills
#: as the pipeline runs.
UNSTABLE = frozenset({"seed", "_seed", "epoch", "_epoch", "pid", "_pid", "_fs_token_"})

_ARRAY_TYPES = ("torch.Tensor", "numpy.ndarray", "numpy.generic")
_DATASET = "torch.utils.data.dataset.Dataset"
_PLAIN = (type(None), bool, int, float, str, bytes)


def state_of(*objs: Any) -> list[Any]:
    """The state of each of ``objs`` as plain JSON-able data, bounded as the module says. One
    walk: an object they share (a sampler's dataset) is walked once, then referred to."""
    walk, states = _Walk(), []
    for obj in objs:
        walk.nodes = 0  # each its own budget: a large dataset hides no collate_fn's settings
        states.append(walk.state(obj, 0))
    return states


def state_digest(*objs: Any) -> str:
    """A short hex digest of ``state_of(*objs)``, the same in every process and run."""
    text = json.dumps(state_of(*objs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a class, function or other named object (never an address)."""
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', '?')}"


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def file_digest(path: str | None) -> str | None:
    """A digest of the source file at ``path`` (read once per version of it), or None."""
    if not path:
        return None
    try:
        info = os.stat(path)
        return _file_digest(path, info.st_mtime_ns, info.st_size) if os.path.isfile(path) else None
    except OSError:
        return None


def _code_digest(code: types.CodeType) -> str:
    """Bytecode, names and constants: tells apart two lambdas on one line, with no file."""
    parts: list[Any] = [code.co_code.hex(), list(code.co_names)]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(_code_digest(const))
        elif isinstance(const, frozenset):  # ``x in {"a", "b"}``: its order follows the hash seed
            parts.append(sorted(repr(c) for c in const))
        else:
            parts.append(repr(const))  # literals only: str, bytes, numbers, None, tuples of them
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _text(value: str | bytes) -> Any:
    if len(value) <= MAX_TEXT:
        return value if isinstance(value, str) else ["bytes", value.hex()]
    head = value[:MAX_TEXT]
    raw = head.encode("utf-8", "surrogatepass") if isinstance(head, str) else head
    return [type(value).__name__, len(value), hashlib.sha256(raw).hexdigest()[:16]]


def _unstable(name: Any, value: Any) -> bool:
    if not isinstance(name, str):
        return False
    lower = name.lower()
    if name in UNSTABLE or lower.endswith("state_dict"):
        return True
    return lower.endswith("cache") and not isinstance(value, bool)


def _has(cls: type, *names: str) -> bool:
    return all(inspect.getattr_static(cls, name, None) is not None for name in names)


def _is_rng(obj: Any) -> bool:
    return isinstance(obj, random.Random) or type(obj).__module__.startswith("numpy.random")


def _slots(obj: Any) -> Iterable[tuple[str, Any]]:
    for cls in type(obj).__mro__:
        names = cls.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            try:
                yield name, getattr(obj, name)
            except Exception:  # an unset slot, or a descriptor that fails: nothing to hold
                continue


class _Walk:
    """One bounded walk. Objects met again are written as ``["ref", n]`` (the n-th object met),
    which stops cycles; every object met is held until the walk ends so that no id is reused."""

    def __init__(self) -> None:
        self.nodes = 0
        self.seen: dict[int, int] = {}
        self.alive: list[Any] = []

    def state(self, obj: Any, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            return "..."
        if obj is None or isinstance(obj, (bool, float)):
            return obj
        if isinstance(obj, int):
            return obj if obj.bit_length() <= 64 else ["int", obj.bit_length()]
        if isinstance(obj, (str, bytes)):
            return _text(obj)
        if isinstance(obj, (bytearray, memoryview)):
            size = obj.nbytes if isinstance(obj, memoryview) else len(obj)
            return _text(bytes(obj)) if size <= MAX_TEXT else [type(obj).__name__, size]
        if isinstance(obj, (complex, enum.Enum, os.PathLike, types.ModuleType, type)):
            try:
                return self._named(obj)
            except Exception:  # a path whose __fspath__ raises: a key never fails a run
                return ["unreadable", qualified_name(type(obj))]
        if id(obj) in self.seen:
            return ["ref", self.seen[id(obj)]]
        if depth >= MAX_DEPTH:  # not remembered: met again nearer the top, it is walked there
            return ["deeper", qualified_name(type(obj))]
        self.seen[id(obj)] = len(self.seen)
        self.alive.append(obj)
        try:
            return self._compound(obj, depth + 1)
        except Exception:  # a property or a container that fails: a key never fails a run
            return ["unreadable", qualified_name(type(obj))]

    def _named(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return ["enum", qualified_name(type(obj)), obj.name]
        if isinstance(obj, os.PathLike):
            return ["path", os.fspath(obj)]
        if isinstance(obj, types.ModuleType):
            return ["module", obj.__name__]
        if isinstance(obj, type):
            return ["class", qualified_name(obj), file_digest(_source_file(obj))]
        return ["complex", repr(obj)]

    def _compound(self, obj: Any, depth: int) -> Any:
        if isinstance(obj, (list, tuple, deque)):
            return [qualified_name(type(obj)), len(obj), self._items(obj, depth)]
        if isinstance(obj, dict):
            return [qualified_name(type(obj)), len(obj), self._mapping(dict.items(obj), depth)]
        if isinstance(obj, (set, frozenset)):
            # Its order follows the hash seed (and addresses): plain values sorted, or names.
            if len(obj) > MAX_ITEMS:
                return [qualified_name(type(obj)), len(obj)]
            if all(isinstance(v, _PLAIN) for v in obj):
                items = sorted(json.dumps(self.state(v, depth)) for v in obj)
            else:
                items = sorted(qualified_name(type(v)) for v in obj)
            return [qualified_name(type(obj)), len(obj), items]
        if isinstance(obj, types.FunctionType):
            return self._function(obj, depth)
        if isinstance(obj, types.MethodType):
            return ["method", self.state(obj.__func__, depth), self.state(obj.__self__, depth)]
        if isinstance(obj, functools.partial):
            parts = (obj.func, obj.args, obj.keywords)
            return ["partial", *(self.state(part, depth) for part in parts)]
        if isinstance(obj, types.BuiltinFunctionType):
            owner = getattr(obj, "__self__", None)
            held = None if owner is None or isinstance(owner, types.ModuleType) else owner
            return ["builtin", qualified_name(obj), qualified_name(type(held))]
        if isinstance(obj, types.CodeType):
            return ["code", _code_digest(obj)]
        return self._object(obj, depth)

    def _items(self, seq: list[Any] | tuple[Any, ...] | deque[Any], depth: int) -> list[Any]:
        half = MAX_ITEMS // 2
        if len(seq) <= MAX_ITEMS:
            chosen: Iterable[Any] = iter(seq)
        else:  # the head and the tail: shards 0-99 and 100-199 differ in both
            tail = list(itertools.islice(reversed(seq), half))[::-1]
            chosen = itertools.chain(itertools.islice(iter(seq), half), tail)
        return [self.state(item, depth) for item in chosen]

    def _mapping(self, items: Iterable[tuple[Any, Any]], depth: int) -> list[Any]:
        pairs = []
        for name, value in itertools.islice(items, MAX_ITEMS):
            held = "*" if _unstable(name, value) else self.state(value, depth)
            pairs.append([self.state(name, depth), held])
        return sorted(pairs, key=lambda pair: json.dumps(pair, sort_keys=True))

    def _function(self, fn: types.FunctionType, depth: int) -> Any:
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(self.state(cell.cell_contents, depth))
            except ValueError:  # an empty cell
                cells.append("empty")
        return [
            "function",
            qualified_name(fn),
            _code_digest(fn.__code__),
            file_digest(fn.__code__.co_filename),
            self.state(fn.__defaults__, depth),
            self.state(fn.__kwdefaults__, depth),
            cells,
        ]

    def _object(self, obj: Any, depth: int) -> Any:
        cls = type(obj)
        name = qualified_name(cls)
        if _is_rng(obj):  # its state moves with every draw
            return ["rng", name]
        bases = {qualified_name(c) for c in cls.__mro__}
        if bases.intersection(_ARRAY_TYPES):
            return self._array(obj, name, depth)
        if _DATASET not in bases:  # a dataset with a ``shape`` is told apart by what it holds
            if _has(cls, "shape", "dtype") or _has(cls, "shape", "dtypes"):
                return self._array(obj, name, None)  # h5py, zarr, data frames
            if _has(cls, "schema", "num_rows"):  # Arrow tables and Hugging Face's wrappers
                return self._table(obj, name)
        try:
            attributes: Iterable[tuple[str, Any]] = vars(obj).items()
        except TypeError:
            attributes = ()
        fields = list(itertools.chain(itertools.islice(attributes, MAX_ITEMS), _slots(obj)))
        return ["object", name, file_digest(_source_file(cls)), self._mapping(fields, depth)]

    def _array(self, obj: Any, name: str, depth: int | None) -> Any:
        """Type, shape, dtype and device; the values of a tiny array on the CPU (torch, numpy:
        ``depth`` given) only."""
        try:
            shape = [int(n) for n in obj.shape]
            dtype = getattr(obj, "dtype", None)
            device = getattr(obj, "device", None)
            if dtype is None:
                dtype = getattr(obj, "dtypes", None)
        except Exception:  # a lazy or closed array that cannot say: its type is what is known
            return ["array", name]
        where = None if device is None else str(device)
        out: list[Any] = ["array", name, shape, _text(str(dtype)), where]
        if depth is not None and math.prod(shape) <= MAX_ELEMENTS and where in (None, "cpu"):
            with contextlib.suppress(Exception):  # a sparse or quantized tensor: its shape tells
                out.append(self.state(obj.tolist(), depth))
        return out

    def _table(self, obj: Any, name: str) -> Any:
        try:
            schema = hashlib.sha256(str(obj.schema).encode()).hexdigest()[:16]
            return ["table", name, schema, int(obj.num_rows)]
        except Exception:
            return ["table", name]


def _source_file(cls: type) -> str | None:
    module = sys.modules.get(getattr(cls, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return path if isinstance(path, str) and path.endswith(".py") else None
