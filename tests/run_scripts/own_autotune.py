"""A script that wraps its loader in ``feedrate.autotune`` itself: the batches come from
autotune's own loaders, which ``feedrate run`` does not follow; the verdict says so rather than
that no loader was iterated."""

import torch
from torch.utils.data import DataLoader

import feedrate

loader = feedrate.autotune(DataLoader(torch.arange(64.0), batch_size=4), cache=False)
for _epoch in range(2):
    for _batch in loader:
        pass
loader.close()
print("done")
