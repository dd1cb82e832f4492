"""A stream of ids 0..255 at 2 workers, built inside ``main()`` (gone before the script ends):
unsplit, each worker yields the whole stream (every sample twice an epoch); with ``--split``,
each worker its share by get_worker_info()."""

import sys

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Ids(IterableDataset):
    def __init__(self, split: bool) -> None:
        self.split = split

    def __iter__(self):
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info and self.split else (0, 1)
        for i in range(first, 256, step):
            yield {"id": i, "x": torch.full((4,), float(i))}


def main() -> None:
    loader = DataLoader(Ids(split="--split" in sys.argv), batch_size=16, num_workers=2)
    for _ in range(2):
        seen = sum(len(batch["id"]) for batch in loader)
    print("samples an epoch", seen)


if __name__ == "__main__":
    main()
