"""The probe of ``autotune``'s trial in progress: the processes of the lane it runs on (main
process, workers), watched over the trial's window, so a concluded trial carries the CPU and
memory figures the search reads."""

from __future__ import annotations

from typing import Any

from feedrate.measuring.processes import ProcessProbe
from feedrate.results.processes import ProbeReport
from feedrate.search.online_trial import TrialTiming


class TrialProbe:
    """One probe at a time, on the trial it was started for."""

    def __init__(self) -> None:
        self._probe: ProcessProbe | None = None
        self._probed: TrialTiming | None = None  # the trial the probe watches
        self._window = False  # the probe's window is open

    def follow(self, trial: TrialTiming | None, iterator: Any, now: float) -> None:
        """Keep a probe on ``trial`` (the tuner's in progress): a trial that started gets a
        probe on the processes of ``iterator`` (its lane's), whose window opens when the
        trial's does."""
        if trial is not None and not trial.started:
            trial = None  # planned for the next epoch's lane
        if trial is not self._probed:
            self.stop()
            if trial is not None:
                self._probe = ProcessProbe().__enter__()
                self._probe.attach(iterator)
                self._probed, self._window = trial, False
        if trial is not None and trial.opened and not self._window and self._probe is not None:
            self._probe.window_open(now)
            self._window = True

    def close(self, trial: TrialTiming | None, now: float) -> ProbeReport | None:
        """What the probe saw over ``trial``'s window, closed at ``now``; the probe ends."""
        probe = self._probe
        if probe is None or self._probed is not trial:
            return None
        probe.window_close(now)
        report = probe.report()
        self.stop()
        return report

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.__exit__()
        self._probe, self._probed, self._window = None, None, False
