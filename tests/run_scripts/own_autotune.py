"""A script that wraps its loader in ``feedrate.autotune`` itself: ``feedrate run`` follows
it as the loader it tunes (its batches come from autotune's own loaders)."""

import torch
from torch.utils.data import DataLoader

import feedrate

loader = feedrate.autotune(DataLoader(torch.arange(64.0), batch_size=4), cache=False)
for _epoch in range(2):
    for _batch in loader:
        pass
loader.close()
print("done")
