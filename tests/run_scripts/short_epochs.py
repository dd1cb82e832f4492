"""Two workers, not persistent, that each compute for a known CPU time in an epoch shorter than
the reading interval of ``feedrate run``, then exit with the epoch (``--epochs N``)."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

#: CPU seconds each sample costs its worker.
SAMPLE_CPU_S = 0.1


class Burn(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        until = time.process_time() + SAMPLE_CPU_S
        while time.process_time() < until:
            pass
        return torch.zeros(4)


loader = DataLoader(Burn(), batch_size=1, num_workers=2)
if __name__ == "__main__":
    for _ in range(int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 1):
        for _batch in loader:
            pass
    time.sleep(1.5)  # past the next reading: the workers are gone by then
