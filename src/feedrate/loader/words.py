"""Advice in the words of the loader it is for: ``DataLoader(..., num_workers=4)`` said as
``StreamingDataLoader(..., num_workers=4)`` for litdata's loader, and as
``TrainingArguments(..., dataloader_num_workers=4)`` for one a transformers ``Trainer`` builds.
Plain strings, no torch: the checks word their fixes with it too."""

from __future__ import annotations

import re

#: A loader a transformers ``Trainer`` builds is set by its ``TrainingArguments``, in these words.
TRAINING_ARGUMENTS = {
    "num_workers": "dataloader_num_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "persistent_workers": "dataloader_persistent_workers",
    "pin_memory": "dataloader_pin_memory",
}

#: ``libraries.mark_wrapped``'s name for a loader a transformers ``Trainer`` builds.
BY_TRAINER = "TrainingArguments"

#: ``DataLoader(..., a=1, b=N)``: a setting of the user's loader, as the advice writes one.
_SETTING = re.compile(r"\bDataLoader\(\.\.\., ([^()]*)\)")


def in_words_of(loader_class: str, text: str) -> str:
    """``text`` with each ``DataLoader(..., SETTINGS)`` in it said for a loader of
    ``loader_class``; for a Trainer's, only where every setting has a ``TrainingArguments``
    word (``worker_init_fn`` has none: that advice stays about the DataLoader)."""
    if loader_class == "DataLoader":
        return text

    def said(match: re.Match[str]) -> str:
        if loader_class != BY_TRAINER:
            return f"{loader_class}(..., {match.group(1)})"
        settings = [s.strip().partition("=") for s in match.group(1).split(",")]
        if not all(name in TRAINING_ARGUMENTS for name, _, _ in settings):
            return match.group(0)
        words = [f"{TRAINING_ARGUMENTS[name]}={value}" for name, _, value in settings]
        return f"{BY_TRAINER}(..., {', '.join(words)})"

    return _SETTING.sub(said, text)
