"""A tabular pipeline: small rows of an in-memory array, indexed one sample at a time.

This imitates the common pattern of wrapping a pandas frame or numpy array (click logs, sensor
readings, a CSV loaded at start-up) in a map-style ``Dataset`` whose ``__getitem__`` returns one
row. Each sample costs microseconds, so per-sample work is negligible and the cost lies in the
DataLoader's own machinery: with workers, every batch is collated in a worker, put into shared
memory, pickled through a queue and unpickled by the main process, which costs more than producing
it. Here ``num_workers=0`` is the fastest setting, and the folklore "as many workers as cores"
makes it slower (the real fix is a larger batch or batched indexing, not more processes). The
table (``NUM_ROWS`` x ``NUM_FEATURES`` float32 features and an int64 label) is generated
deterministically at import in a few tens of milliseconds.

Try::

    feedrate measure examples/tabular.py:loader -w 0
    feedrate tune examples/tabular.py:loader
    python examples/tabular.py                # print a few batch shapes
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

NUM_ROWS = 200_000
NUM_FEATURES = 16
NUM_CLASSES = 2
SEED = 0


def make_table(
    num_rows: int = NUM_ROWS, num_features: int = NUM_FEATURES, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Features ``float32 [num_rows, num_features]`` and labels ``int64 [num_rows]``.

    The label is a noisy linear rule of the features, so a model could learn it.
    """
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((num_rows, num_features), dtype=np.float32)
    weights = rng.standard_normal(num_features, dtype=np.float32)
    noise = rng.standard_normal(num_rows, dtype=np.float32)
    labels = (features @ weights + noise > 0).astype(np.int64)
    return features, labels


class TabularRows(Dataset[tuple[torch.Tensor, int]]):
    """One row per item: ``(float32 [NUM_FEATURES] tensor, label)``; the tensor views the array."""

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        if len(features) != len(labels):
            raise ValueError(f"{len(features)} feature rows but {len(labels)} labels")
        self.features = features
        self.labels = labels

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.features[index]), int(self.labels[index])


loader = DataLoader(TabularRows(*make_table()), batch_size=256, shuffle=True)


if __name__ == "__main__":
    for step, (rows, labels) in enumerate(loader):
        print(f"batch {step}: rows {tuple(rows.shape)} {rows.dtype}", end=", ")
        print(f"labels {tuple(labels.shape)} {labels.dtype}")
        if step == 2:
            break
