"""``autotune``: a loader that tunes itself while training runs (lanes, and a thin AutoLoader)."""
