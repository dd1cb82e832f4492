"""Once settled, ``autotune`` watches the loop's stall over stretches of batches: two stretches
in a row well above the settled stall start tuning again (``OnlineTuner.observe``)."""

from __future__ import annotations

from dataclasses import dataclass

from feedrate.search.space import STALL_MARGIN

#: While watching: the stall over a stretch of at least this many batches and seconds, above
#: ``RETUNE_STALL``, starts tuning again.
WATCH_BATCHES = 64
WATCH_S = 2.0
RETUNE_STALL = 2 * STALL_MARGIN

#: Windows in a row whose stall exceeds the settled one by ``RETUNE_STALL`` to tune again.
RETUNE_WINDOWS = 2


@dataclass
class Watch:
    """Once settled: the waits and steps (s) of the stretch being watched, of at least
    ``need`` batches and (unless ``counted``: batches only) ``WATCH_S`` seconds."""

    need: int = WATCH_BATCHES
    counted: bool = False
    waited: float = 0.0
    stepped: float = 0.0
    batches: int = 0

    def add(self, wait: float, step: float) -> float | None:
        """The stall of the stretch this batch completes (the next one begins), else None."""
        self.waited += wait
        self.stepped += step
        self.batches += 1
        total = self.waited + self.stepped
        if self.batches < self.need or (not self.counted and total < WATCH_S):
            return None
        stall = self.waited / total
        self.waited, self.stepped, self.batches = 0.0, 0.0, 0
        return stall
