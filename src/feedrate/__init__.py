"""feedrate: measure and tune PyTorch DataLoader settings on this machine.

import feedrate
m = feedrate.measure(loader, feedrate.LoaderConfig(num_workers=4))
print(m.samples_per_s, m.spread.rel, m.startup_s)
report = feedrate.doctor(loader)             # what is wrong or risky, with the fix
print([(f.severity, f.id) for f in report.findings])
loader = DataLoader(feedrate.threaded(dataset, 16), batch_size=16, num_workers=2)  # waits on I/O
for batch in feedrate.autotune(loader): ...   # tunes itself while training runs

Names are imported on first use (PEP 562), so ``import feedrate`` and the command line start
without importing torch: ``feedrate --help`` answers at once, and a Ctrl-C while torch loads
reaches the command's own handling instead of printing a traceback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from feedrate.autotuning.api import autotune
    from feedrate.autotuning.loader import AutoLoader
    from feedrate.errors import (
        FeedrateError,
        PipelineError,
        PipelineTimeoutError,
        TargetError,
        UserError,
        WorkerKilledError,
    )
    from feedrate.loader.config import LoaderConfig
    from feedrate.loader.rebuild import allow_many_workers, config_of, rebuild
    from feedrate.loader.target import load_target
    from feedrate.loader.threaded import SampleFetchError, threaded
    from feedrate.machine.facts import MachineFacts
    from feedrate.machine.facts import collect as machine_facts
    from feedrate.measuring.measure import measure
    from feedrate.results.doctor import Report
    from feedrate.results.measurement import Measurement
    from feedrate.results.trial import Trial
    from feedrate.results.tune import TuneResult
    from feedrate.workflows.doctor import doctor
    from feedrate.workflows.tune import tune

# Public name -> (module, name there). The TYPE_CHECKING imports say the same to type checkers;
# tests/test_api.py holds the two to agreement.
_LAZY = {
    "AutoLoader": ("autotuning.loader", "AutoLoader"),
    "autotune": ("autotuning.api", "autotune"),
    "LoaderConfig": ("loader.config", "LoaderConfig"),
    "allow_many_workers": ("loader.rebuild", "allow_many_workers"),
    "config_of": ("loader.rebuild", "config_of"),
    "rebuild": ("loader.rebuild", "rebuild"),
    "doctor": ("workflows.doctor", "doctor"),
    "FeedrateError": ("errors", "FeedrateError"),
    "PipelineError": ("errors", "PipelineError"),
    "PipelineTimeoutError": ("errors", "PipelineTimeoutError"),
    "TargetError": ("errors", "TargetError"),
    "UserError": ("errors", "UserError"),
    "WorkerKilledError": ("errors", "WorkerKilledError"),
    "SampleFetchError": ("loader.threaded", "SampleFetchError"),
    "threaded": ("loader.threaded", "threaded"),
    "MachineFacts": ("machine.facts", "MachineFacts"),
    "machine_facts": ("machine.facts", "collect"),
    "measure": ("measuring.measure", "measure"),
    "Report": ("results.doctor", "Report"),
    "Measurement": ("results.measurement", "Measurement"),
    "Trial": ("results.trial", "Trial"),
    "TuneResult": ("results.tune", "TuneResult"),
    "load_target": ("loader.target", "load_target"),
    "tune": ("workflows.tune", "tune"),
}

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


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'feedrate' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(f"feedrate.{module}"), attr)
    globals()[name] = value  # once: later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
