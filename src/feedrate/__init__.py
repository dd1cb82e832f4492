"""feedrate: measure and tune PyTorch DataLoader settings on this machine.

import feedrate
m = feedrate.measure(loader, feedrate.LoaderConfig(num_workers=4))
print(m.samples_per_s, m.spread.rel, m.startup_s)
report = feedrate.doctor(loader)             # what is wrong or risky, with the fix
print([(f.severity, f.id) for f in report.findings])
loader = DataLoader(feedrate.threaded(dataset, 16), batch_size=16, num_workers=2)  # waits on I/O
for batch in feedrate.autotune(loader): ...   # tunes itself while training runs
"""

from __future__ import annotations

__version__ = "0.1.0"

from feedrate.autotuning import AutoLoader, autotune
from feedrate.config import LoaderConfig, allow_many_workers, config_of, rebuild
from feedrate.doctoring import doctor
from feedrate.errors import (
    FeedrateError,
    PipelineError,
    PipelineTimeoutError,
    TargetError,
    UserError,
    WorkerKilledError,
)
from feedrate.fetching import SampleFetchError, threaded
from feedrate.machine import MachineFacts
from feedrate.machine import collect as machine_facts
from feedrate.measuring import measure
from feedrate.report import Report
from feedrate.results import Measurement, Trial, TuneResult
from feedrate.target import load_target
from feedrate.tuning import tune

__all__ = [
    "AutoLoader",
    "FeedrateError",
    "LoaderConfig",
    "MachineFacts",
    "Measurement",
    "PipelineError",
    "PipelineTimeoutError",
    "Report",
    "SampleFetchError",
    "TargetError",
    "Trial",
    "TuneResult",
    "UserError",
    "WorkerKilledError",
    "__version__",
    "allow_many_workers",
    "autotune",
    "config_of",
    "doctor",
    "load_target",
    "machine_facts",
    "measure",
    "rebuild",
    "threaded",
    "tune",
]
