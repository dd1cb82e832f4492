"""Once settled, ``autotune`` watches the loop's stall over stretches of batches: two stretches
in a row well above the settled stall start tuning again (``OnlineTuner.observe``)."""

from __future__ import annotations

from dataclasses import dataclass

from feedrate.results.trial import Trial
from feedrate.search.space import STALL_MARGIN, covers

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
    #: Read by the clock alone (``OnlineTuner.wants_queued``).
    lean: bool = False
    #: Batches left out first: a lane's warm-up, whose prefetched batches come at once.
    skip: int = 0
    waited: float = 0.0
    stepped: float = 0.0
    batches: int = 0

    def add(self, wait: float, step: float) -> float | None:
        """The stall of the stretch this batch completes (the next one begins), else None."""
        if self.skip > 0:
            self.skip -= 1
            return None
        self.waited += wait
        self.stepped += step
        self.batches += 1
        total = self.waited + self.stepped
        if self.batches < self.need or (not self.counted and total < WATCH_S):
            return None
        stall = self.waited / total
        self.waited, self.stepped, self.batches = 0.0, 0.0, 0
        return stall


def settled_why(best: Trial, rate: float | None) -> str:
    """Why autotune settled on ``best``, in one sentence."""
    stall = best.stall_fraction or 0.0
    pace = "the step" if rate is None else f"the step at rate={rate:,.0f} samples/s"
    if covers(best):
        return f"{best.config.label()} keeps {pace} fed ({stall:.0%} stall)"
    why = f"no configuration tried keeps {pace} fed; {best.config.label()} stalls {stall:.0%}"
    if rate is not None and best.samples_per_s < rate and (best.stall_fraction or 0) > 0:
        why += (
            f" (the loop took {best.samples_per_s:,.0f} samples/s: a loader faster than its "
            "loop cannot be measured)"
        )
    return why
