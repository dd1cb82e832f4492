"""Reading a dataset object without running it: large Python containers, random generators,
and content digests of samples."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from feedrate.measuring.dataset_objects import (
    MAX_NODES,
    digest,
    draw,
    generator_kind,
    generators,
    large_containers,
    walk,
)

from pipelines import ArrayRecordsDataset, ObjectListDataset, SharedRngDataset


def test_large_containers_name_attributes_sizes_and_item_types() -> None:
    found = large_containers(ObjectListDataset(50_000))
    assert [c.path for c in found] == ["records"]
    (records,) = found
    assert records.type_name == "list" and records.items == 50_000
    assert records.item_type == "tuple"
    assert records.objects >= 3 * 50_000  # the tuple, its str and its int
    assert records.bytes > 50_000 * 100


def test_arrays_and_small_containers_are_not_large_python_containers() -> None:
    assert large_containers(ArrayRecordsDataset(50_000)) == []

    class Mixed:
        def __init__(self) -> None:
            self.classes = ["cat", "dog"]
            self.index = {i: str(i) for i in range(20_000)}
            self.objects = np.array([str(i) for i in range(20_000)], dtype=object)

    found = {c.path: c for c in large_containers(Mixed())}
    assert set(found) == {"index", "objects"}
    assert found["index"].type_name == "dict" and found["index"].items == 20_000


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("numpy", "numpy.random.Generator"),
        ("randomstate", "numpy.random.RandomState"),
        ("random", "random.Random"),
        ("torch", "torch.Generator"),
    ],
)
def test_generators_found_directly_and_nested(kind: str, name: str) -> None:
    direct = generators(SharedRngDataset(kind=kind))
    assert [(path, k) for path, k, _ in direct] == [("rng", name)]
    nested = generators(SharedRngDataset(kind=kind, nested=True))
    assert [(path, k) for path, k, _ in nested] == [("transform.steps[0]['rng']", name)]
    one, two = (draw(SharedRngDataset(kind=kind).rng) for _ in range(2))
    assert one is not None and one == two  # the same seed draws the same


def test_system_random_and_modules_are_not_generators() -> None:
    assert generator_kind(random.SystemRandom()) is None
    assert generator_kind(random) is None
    assert generator_kind(np.random) is None


def test_walk_is_bounded_and_survives_cycles() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self
            self.children = [object() for _ in range(50)]

    nodes = [Node() for _ in range(MAX_NODES)]
    assert len(list(walk(type("Root", (), {"__init__": lambda s: None})()))) == 0
    holder = type("Holder", (), {})()
    holder.__dict__.update({f"n{i}": n for i, n in enumerate(nodes)})
    assert len(list(walk(holder))) < MAX_NODES


def test_digest_is_by_content() -> None:
    a = (torch.arange(6).reshape(2, 3), {"label": 3, "path": "x.jpg"})
    b = (torch.arange(6).reshape(2, 3), {"path": "x.jpg", "label": 3})
    assert digest(a) == digest(b)
    assert digest(torch.zeros(3)) != digest(torch.zeros(3, dtype=torch.float64))
    assert digest(torch.zeros(3)) != digest(torch.ones(3))
    assert digest(np.arange(4)) == digest(np.arange(4))
    assert digest(torch.zeros(2, dtype=torch.bfloat16)) == digest(
        torch.zeros(2, dtype=torch.bfloat16)
    )
    assert digest(b"raw") != digest("raw")
