"""A DataLoader subclass that takes none of DataLoader's arguments: autotune cannot build it
again with other settings, so ``--autotune`` must fall back to observing it as it is."""

from __future__ import annotations

from torch.utils.data import DataLoader
from train import Sleepy  # this folder, the script's sys.path[0]


class Fixed(DataLoader):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        super().__init__(Sleepy(n, 0.0), batch_size=4)


if __name__ == "__main__":
    total = sum(len(batch) for batch in Fixed(40))
    print("samples", total)
