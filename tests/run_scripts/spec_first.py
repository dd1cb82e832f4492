"""A script that asks for torch's spec before it imports torch, as transformers and datasets do
(``importlib.util.find_spec("torch")``): its loader must be seen all the same."""

import importlib.util

assert importlib.util.find_spec("torch") is not None

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

loader = DataLoader(torch.arange(32.0), batch_size=4)
for _epoch in range(2):
    for _batch in loader:
        pass
