"""Two training loops back to back, with a large margin between them: ``starved`` makes each
batch of 4 in 100 ms of sleep for a 10 ms step (it waits ~90% of the time), ``fed`` makes its
batches at once for a 50 ms step (it waits ~0%)."""

from __future__ import annotations

import time

from torch.utils.data import DataLoader
from train import Sleepy  # this folder, the script's sys.path[0]

starved = DataLoader(Sleepy(32, 0.1), batch_size=4)
fed = DataLoader(Sleepy(32, 0.0), batch_size=4)

if __name__ == "__main__":
    for _batch in starved:
        time.sleep(0.01)
    for _batch in fed:
        time.sleep(0.05)
