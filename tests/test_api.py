"""The public Python API is pinned: a change to it is a deliberate, reviewed change."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import feedrate


def test_public_names_are_pinned() -> None:
    assert sorted(feedrate.__all__) == [
        "AutoLoader",
        "FeedrateError",
        "LoaderConfig",
        "MachineFacts",
        "Measurement",
        "PipelineError",
        "PipelineTimeoutError",
        "Report",
        "SampleFetchError",
        "TargetError",
        "Trial",
        "TuneResult",
        "UserError",
        "WorkerKilledError",
        "__version__",
        "allow_many_workers",
        "autotune",
        "config_of",
        "doctor",
        "load_target",
        "machine_facts",
        "measure",
        "rebuild",
        "threaded",
        "tune",
    ]
    for name in feedrate.__all__:
        assert hasattr(feedrate, name)


def test_lazy_names_are_the_ones_type_checkers_see() -> None:
    """``feedrate`` imports its names on first use; the ``TYPE_CHECKING`` imports that give them
    their types must name the same objects."""
    import ast
    import importlib
    import inspect

    tree = ast.parse(inspect.getsource(feedrate))
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    )
    seen = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    lazy = {name: (f"feedrate.{module}", attr) for name, (module, attr) in feedrate._LAZY.items()}
    assert seen == lazy
    assert set(feedrate.__all__) == {*lazy, "__version__"}
    for name, (module, attr) in lazy.items():
        assert getattr(feedrate, name) is getattr(importlib.import_module(module), attr)


def test_an_unknown_name_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'tuner'"):
        feedrate.tuner  # noqa: B018


def test_user_errors_exit_2_and_pipeline_errors_exit_3() -> None:
    assert feedrate.TargetError("x").exit_code == 2
    assert feedrate.UserError("x").exit_code == 2
    assert feedrate.PipelineError("x").exit_code == 3
    assert issubclass(feedrate.WorkerKilledError, feedrate.PipelineError)


def test_functions_do_not_shadow_their_modules() -> None:
    import importlib

    assert callable(feedrate.measure) and callable(feedrate.tune) and callable(feedrate.doctor)
    # Importing the layers (as the CLI and the tests do) must leave the public functions alone.
    importlib.import_module("feedrate.measuring.measure")
    importlib.import_module("feedrate.workflows.tune")
    importlib.import_module("feedrate.workflows.doctor")
    importlib.import_module("feedrate.autotuning.loader")
    assert importlib.import_module("feedrate.measuring.measure").measure is feedrate.measure
    assert importlib.import_module("feedrate.workflows.tune").tune is feedrate.tune
    assert importlib.import_module("feedrate.workflows.doctor").doctor is feedrate.doctor
    assert callable(feedrate.measure) and callable(feedrate.tune) and callable(feedrate.autotune)


def _shuffled() -> DataLoader[Any]:
    data = TensorDataset(torch.arange(4096, dtype=torch.float32).reshape(-1, 1))
    return DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "call",
    [
        lambda loader: feedrate.measure(loader, seconds=0.3, windows_count=2, device="cpu"),
        lambda loader: feedrate.tune(loader, budget_s=8, trial_seconds=0.3, use_cache=False),
        lambda loader: feedrate.doctor(loader, trial_seconds=0.3),
        # a step that draws (dropout, augmentation on the device), timed alone and in trials
        lambda loader: feedrate.tune(
            loader, step=lambda b: torch.rand(8), budget_s=8, trial_seconds=0.3, use_cache=False
        ),
    ],
    ids=["measure", "tune", "doctor", "tune-with-a-step"],
)
def test_the_calls_leave_the_user_s_random_state_as_it_was(
    call: Callable[[DataLoader[Any]], object],
) -> None:
    # Called in the training process before training, their runs shuffled with the loader's
    # own generator and drew workers' seeds from torch's: the first epoch's order changed.
    loader = _shuffled()
    torch.manual_seed(5)
    random.seed(5)
    call(loader)
    after = [b[0] for b in loader], torch.rand(3), random.random()
    torch.manual_seed(5)
    random.seed(5)
    untouched = [b[0] for b in _shuffled()], torch.rand(3), random.random()
    assert all(torch.equal(a, b) for a, b in zip(after[0], untouched[0], strict=True))
    assert torch.equal(after[1], untouched[1]) and after[2] == untouched[2]
