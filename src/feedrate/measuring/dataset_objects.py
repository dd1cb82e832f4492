"""What a dataset object holds, read without running it, and a content digest of what it yields.

* ``large_containers``: Python lists, dicts, sets (and numpy object arrays) of many Python
  objects on the dataset. Forked workers share the pages these objects live in until they touch
  them, and reading an object touches it (its reference count), so every worker slowly gets its
  own copy: "copy-on-read".
* ``generators``: random generators the dataset holds itself (numpy ``Generator`` /
  ``RandomState``, ``random.Random``, ``torch.Generator``). DataLoader reseeds torch's, numpy's
  and Python's *global* generators in every worker, but not these: each worker starts from a copy
  of the same state.
* ``draw``: one draw from such a generator, to compare across workers.
* ``digest``: a short content hash of a sample (tensors, arrays, containers, anything picklable).

The object graph is walked a bounded number of levels and nodes, so a huge dataset costs the
same as a small one.
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
import random
import sys
import types
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from feedrate.loader import libraries
from feedrate.results.evidence import Container

#: A container with at least this many items is "large": its objects are worth copying-on-read.
LARGE_CONTAINER_ITEMS = 10_000
#: How deep the walk goes from the dataset (``transform.steps[0]['rng']`` is depth 4).
MAX_DEPTH = 4
#: Nodes visited at most, and items of a small container looked into.
MAX_NODES = 2_000
SMALL_CONTAINER_ITEMS = 64
#: Items sampled from a large container to estimate its size.
SIZE_SAMPLE = 100

_CONTAINERS = (list, tuple, dict, set, frozenset, deque)
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.Tensor)
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    """(path suffix, child) for the attributes of an object or the items of a small container."""
    if isinstance(value, Mapping):
        if len(value) <= SMALL_CONTAINER_ITEMS:
            for key, child in value.items():
                yield f"[{key!r}]", child
        return
    if isinstance(value, list | tuple):
        if len(value) <= SMALL_CONTAINER_ITEMS:
            for i, child in enumerate(value):
                yield f"[{i}]", child
        return
    if isinstance(value, _LEAVES + _OPAQUE) or _is_array(value) or generator_kind(value):
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        for name, child in list(attrs.items()):
            yield f".{name}", child
    for name in getattr(type(value), "__slots__", ()):
        if isinstance(name, str) and hasattr(value, name):
            yield f".{name}", getattr(value, name)


def walk(root: Any) -> Iterator[tuple[str, Any]]:
    """(path, value) for everything reachable from ``root`` within ``MAX_DEPTH`` steps, breadth
    first, each object once, at most ``MAX_NODES`` of them. Paths read like code: ``samples``,
    ``transform.rng``, ``datasets[0].files``."""
    seen = {id(root)}
    queue: deque[tuple[str, Any, int]] = deque([("", root, 0)])
    visited = 0
    while queue and visited < MAX_NODES:
        path, value, depth = queue.popleft()
        visited += 1
        if path:
            yield path, value
        if depth >= MAX_DEPTH:
            continue
        for suffix, child in _children(value):
            if id(child) in seen:
                continue
            seen.add(id(child))
            queue.append(((path + suffix).lstrip("."), child, depth + 1))


def _is_array(value: Any) -> bool:
    return hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "tobytes")


def generator_kind(value: Any) -> str | None:
    """The kind of random generator ``value`` is, or None. ``random.SystemRandom`` draws from
    the OS and cannot repeat, so it is not one. numpy is only looked at when already imported."""
    if isinstance(value, random.Random) and not isinstance(value, random.SystemRandom):
        return "random.Random"
    if isinstance(value, torch.Generator):
        return "torch.Generator"
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.random.Generator):
            return "numpy.random.Generator"
        if isinstance(value, np.random.RandomState):
            return "numpy.random.RandomState"
    return None


def generators(dataset: Any) -> list[tuple[str, str, Any]]:
    """(path, kind, generator) for every random generator reachable from ``dataset``, but those
    its library reseeds in every worker itself (``libraries.managed_generator``: Hugging
    Face's ``IterableDataset.shuffle(seed=...)``)."""
    found = []
    for path, value in walk(dataset):
        kind = generator_kind(value)
        if kind is not None and not libraries.managed_generator(dataset, path):
            found.append((path, kind, value))
    return found


def draw(generator: Any) -> str | None:
    """One 62-bit draw from ``generator``, as text; None when it cannot be drawn from here (a
    generator on an accelerator)."""
    kind = generator_kind(generator)
    if kind == "random.Random":
        return str(generator.getrandbits(62))
    if kind == "torch.Generator":
        if generator.device.type != "cpu":
            return None
        return str(int(torch.randint(0, 2**62, (1,), generator=generator).item()))
    if kind == "numpy.random.Generator":
        return str(int(generator.integers(0, 2**62)))
    if kind == "numpy.random.RandomState":
        return str(int(generator.randint(0, 2**31 - 1)))
    return None


def _item_objects(item: Any) -> tuple[int, int]:
    """(Python objects, bytes) of one container item: itself and its direct children."""
    objects, size = 1, sys.getsizeof(item)
    if isinstance(item, list | tuple | set | frozenset):
        parts: Any = item
    elif isinstance(item, Mapping):
        parts = itertools.chain(item.keys(), item.values())
    else:
        parts = (getattr(item, "__dict__", None) or {}).values()
    for part in itertools.islice(parts, 256):
        objects += 1
        size += sys.getsizeof(part)
    return objects, size


def _sample(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        keys = list(itertools.islice(value.keys(), SIZE_SAMPLE))
        return keys + [value[k] for k in keys]
    if isinstance(value, list | tuple):
        step = max(1, len(value) // SIZE_SAMPLE)
        return list(value[::step][:SIZE_SAMPLE])
    if _is_array(value):
        return list(value.ravel()[:SIZE_SAMPLE])
    return list(itertools.islice(iter(value), SIZE_SAMPLE))


def _items(value: Any) -> int | None:
    """How many items ``value`` holds when it is a container of Python objects, else None."""
    if isinstance(value, _CONTAINERS):
        return len(value) * (2 if isinstance(value, Mapping) else 1)
    if _is_array(value) and getattr(value.dtype, "kind", None) == "O":
        return int(value.size)
    return None


def large_containers(dataset: Any, min_items: int = LARGE_CONTAINER_ITEMS) -> list[Container]:
    """The large containers of Python objects reachable from ``dataset``, largest first."""
    found = []
    for path, value in walk(dataset):
        items = _items(value)
        if items is None or items < min_items:
            continue
        sample = _sample(value)
        per = [_item_objects(item) for item in sample] or [(1, 0)]
        mean_objects = sum(o for o, _ in per) / len(per)
        mean_bytes = sum(b for _, b in per) / len(per)
        found.append(
            Container(
                path=path,
                type_name=type(value).__name__,
                items=len(value) if not _is_array(value) else items,
                objects=int(items * mean_objects),
                bytes=int(sys.getsizeof(value) + items * mean_bytes),
                item_type=type(sample[0]).__name__ if sample else "?",
            )
        )
    return sorted(found, key=lambda c: -c.bytes)


def digest(obj: Any) -> str:
    """A short hash of ``obj``'s content: equal samples give equal digests in any process."""
    h = hashlib.blake2b(digest_size=12)
    _feed(h, obj, 0)
    return h.hexdigest()


def _feed(h: Any, obj: Any, depth: int) -> None:
    if depth > 8:
        h.update(type(obj).__name__.encode())
        return
    if isinstance(obj, torch.Tensor):
        _feed_tensor(h, obj)
    elif _is_array(obj) and getattr(obj.dtype, "kind", None) != "O":
        h.update(f"A{obj.dtype}{tuple(obj.shape)}".encode())
        h.update(obj.tobytes())
    elif isinstance(obj, bytes | bytearray | memoryview):
        h.update(b"B" + bytes(obj))
    elif isinstance(obj, str | int | float | complex | bool | type(None)):
        h.update(f"{type(obj).__name__}:{obj!r}".encode())
    elif isinstance(obj, Mapping):
        h.update(b"M")
        for key in sorted(obj, key=repr):
            _feed(h, key, depth + 1)
            _feed(h, obj[key], depth + 1)
    elif isinstance(obj, list | tuple) or _is_array(obj):
        h.update(f"L{type(obj).__name__}{len(obj)}".encode())
        for item in obj:
            _feed(h, item, depth + 1)
    else:
        try:
            h.update(pickle.dumps(obj, protocol=4))
        except Exception:
            h.update(repr(obj).encode(errors="replace"))


def _feed_tensor(h: Any, t: torch.Tensor) -> None:
    h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
    try:
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().tobytes())
    except Exception:  # sparse, quantized, ...: their text is still their content
        h.update(repr(t).encode(errors="replace"))


#: An integer tensor or array up to this many elements is an id or a label (identity); a larger
#: one is data (pixels, token ids), which augmentation may change.
IDENTITY_ELEMENTS = 16


def identity(obj: Any) -> str:
    """A short hash of what names a sample rather than what it shows: its strings, bytes,
    integers and booleans, and integer tensors of up to ``IDENTITY_ELEMENTS`` elements (ids,
    labels, webdataset's ``__key__``), leaving out floating-point values and larger arrays,
    which random augmentation changes. '' when the sample has no such part."""
    h = hashlib.blake2b(digest_size=12)
    return h.hexdigest() if _feed_identity(h, obj, 0) else ""


def _feed_identity(h: Any, obj: Any, depth: int) -> bool:
    """Feed the identity parts of ``obj``; whether there were any."""
    if depth > 8 or isinstance(obj, float | complex):
        return False
    if isinstance(obj, str | bytes | bytearray | int | bool):
        h.update(f"{type(obj).__name__}:{obj!r}".encode())
        return True
    if isinstance(obj, torch.Tensor) or _is_array(obj):
        kind = str(obj.dtype)
        small = int(obj.numel() if isinstance(obj, torch.Tensor) else obj.size) <= IDENTITY_ELEMENTS
        if not small or "float" in kind or "complex" in kind:
            return False
        _feed(h, obj, depth)
        return True
    if isinstance(obj, Mapping):
        found = False
        for key in sorted(obj, key=repr):
            h.update(f"K{key!r}".encode())
            found = _feed_identity(h, obj[key], depth + 1) or found
        return found
    if isinstance(obj, list | tuple):
        found = False
        for i, item in enumerate(obj):
            h.update(f"I{i}".encode())
            found = _feed_identity(h, item, depth + 1) or found
        return found
    return False
