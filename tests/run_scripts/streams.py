"""Two streams of ids 0..255 at 2 workers: ``unsplit`` yields the whole stream in each worker
(every sample twice an epoch), ``split`` gives each worker its share by get_worker_info()."""

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


unsplit = DataLoader(Ids(split=False), batch_size=16, num_workers=2)
split = DataLoader(Ids(split=True), batch_size=16, num_workers=2)

if __name__ == "__main__":
    loader = split if "--split" in sys.argv else unsplit
    for _ in range(2):
        seen = sum(len(batch["id"]) for batch in loader)
    print("samples an epoch", seen)
