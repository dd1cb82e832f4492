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

# Public name -> (module, name there). The TYPE_CHECKING imports say the same to type checkers;
# tests/test_api.py holds the two to agreement.
_LAZY = {
    "AutoLoader": ("autotuning", "AutoLoader"),
    "autotune": ("autotuning", "autotune"),
    "LoaderConfig": ("config", "LoaderConfig"),
    "allow_many_workers": ("config", "allow_many_workers"),
    "config_of": ("config", "config_of"),
    "rebuild": ("config", "rebuild"),
    "doctor": ("doctoring", "doctor"),
    "FeedrateError": ("errors", "FeedrateError"),
    "PipelineError": ("errors", "PipelineError"),
    "PipelineTimeoutError": ("errors", "PipelineTimeoutError"),
    "TargetError": ("errors", "TargetError"),
    "UserError": ("errors", "UserError"),
    "WorkerKilledError": ("errors", "WorkerKilledError"),
    "SampleFetchError": ("fetching", "SampleFetchError"),
    "threaded": ("fetching", "threaded"),
    "MachineFacts": ("machine", "MachineFacts"),
    "machine_facts": ("machine", "collect"),
    "measure": ("measuring", "measure"),
    "Report": ("report", "Report"),
    "Measurement": ("results", "Measurement"),
    "Trial": ("results", "Trial"),
    "TuneResult": ("results", "TuneResult"),
    "load_target": ("target", "load_target"),
    "tune": ("tuning", "tune"),
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
