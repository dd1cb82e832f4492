"""The stall over time of one loader: wait and step seconds summed per window of wall time, in
a bounded number of windows (when they run out, neighbours merge and the width doubles), so a
run of days costs the same memory as a run of minutes."""

from __future__ import annotations

from feedrate.results.run import Window

#: Width of a window at first, in seconds.
FIRST_WIDTH_S = 0.5
#: Windows kept at most; past this, pairs merge.
MAX_WINDOWS = 240


class Timeline:
    """Add each batch's wait and step at the time it ended (``now``, on the clock whose reading
    at the run's start is ``origin``); ``windows()`` gives them back from the first window with
    a batch to the last one."""

    def __init__(
        self, origin: float, width_s: float = FIRST_WIDTH_S, max_windows: int = MAX_WINDOWS
    ) -> None:
        self.origin = origin
        self.width = width_s
        self.max = max(2, max_windows)
        self.wait: list[float] = []
        self.step: list[float] = []
        self.count: list[int] = []

    def add(self, now: float, wait: float, step: float) -> None:
        i = int((now - self.origin) / self.width)
        if i < 0:
            i = 0
        while i >= self.max:
            self._halve()
            i = int((now - self.origin) / self.width)
        if i >= len(self.count):
            grow = i + 1 - len(self.count)
            self.wait += [0.0] * grow
            self.step += [0.0] * grow
            self.count += [0] * grow
        self.wait[i] += wait
        self.step[i] += step
        self.count[i] += 1

    def _halve(self) -> None:
        def pairs(values: list[float]) -> list[float]:
            return [sum(values[i : i + 2]) for i in range(0, len(values), 2)]

        self.wait, self.step = pairs(self.wait), pairs(self.step)
        self.count = [sum(self.count[i : i + 2]) for i in range(0, len(self.count), 2)]
        self.width *= 2

    def windows(self) -> list[Window]:
        used = [i for i, n in enumerate(self.count) if n]
        if not used:
            return []
        return [
            Window(i * self.width, self.width, self.wait[i], self.step[i], self.count[i])
            for i in range(used[0], used[-1] + 1)
        ]
