"""Failures whose cause is known get the fix where the user reads the error: a collate_fn that
raises names the batch's sample indices, too many open files says how to raise the limit, and
a dataset that cannot be pickled for spawned workers says how to make it picklable."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import feedrate
from feedrate.errors import PipelineError

from faults import Squares, fault


def ragged(samples: list[int]) -> torch.Tensor:
    if 13 in samples:
        raise ValueError("ragged sample")
    return torch.tensor(samples)


class OutOfFiles(Squares):
    def __getitem__(self, i: int) -> torch.Tensor:
        raise OSError(24, "Too many open files")


@pytest.mark.parametrize(
    ("case", "workers"), [(fault("collate-raises"), 0), ("collate-raises-in-a-worker", 2)]
)
def test_a_collate_error_names_the_batch(case: str, workers: int) -> None:
    loader = DataLoader(list(range(64)), batch_size=4, collate_fn=ragged, num_workers=workers)
    with pytest.raises(
        PipelineError, match=r"collating the batch of sample indices \[12, 13, 14, 15\]"
    ):
        feedrate.measure(loader, batches=10)


@pytest.mark.parametrize("case", [fault("too-many-open-files")])
def test_too_many_open_files_says_how_to_raise_the_limit(case: str) -> None:
    with pytest.raises(PipelineError, match=r"ulimit -n .*file_system"):
        feedrate.measure(DataLoader(OutOfFiles(8), batch_size=2), batches=5)


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
@pytest.mark.parametrize("case", [fault("unpicklable-dataset-under-spawn")])
def test_a_dataset_spawn_cannot_pickle_says_how_to_fix_it(case: str) -> None:
    class Local(Dataset[Any]):  # defined in a function: spawn cannot pickle it
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i

    loader = DataLoader(Local(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(PipelineError, match=r"define the dataset .* at module level"):
        feedrate.measure(loader, batches=5, timeout_s=60)
