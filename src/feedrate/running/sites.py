"""Where in the script a loader is built or iterated: the frames that are the user's, and an
evaluation loop on the stack."""

from __future__ import annotations

import os
import sysconfig
from types import FrameType

#: Functions that run an evaluation loop: a loader iterated from inside one is an evaluation
#: loader, whatever autograd's state (transformers' Trainer turns autograd off only around each
#: step, inside ``prediction_step``).
EVAL_FUNCTIONS = frozenset(
    {"evaluation_loop", "prediction_loop", "evaluate", "predict", "validate", "validation_loop"}
)


def evaluating(frame: FrameType | None, depth: int = 64) -> bool:
    """A function of ``EVAL_FUNCTIONS`` is on the stack from ``frame`` outwards (``depth``
    frames at most)."""
    while frame is not None and depth > 0:
        if frame.f_code.co_name in EVAL_FUNCTIONS:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


#: Where installed packages and the standard library live.
_LIBRARY_DIRS = tuple(
    {os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib", "stdlib")}
)


def library(path: str) -> bool:
    """``path`` (absolute) is an installed package's or the standard library's file."""
    parts = path.split(os.sep)
    return path.startswith(_LIBRARY_DIRS) or "site-packages" in parts or "dist-packages" in parts


def shown(file: str) -> str:
    path = os.path.abspath(file)
    here = os.getcwd() + os.sep
    return path[len(here) :] if path.startswith(here) else path


#: The trainers whose own code builds the loaders they train on, by their package's folder.
_TRAINERS = {
    "transformers": "transformers",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
}


def built_by(frame: FrameType | None, depth: int = 64) -> str | None:
    """The trainer whose code built a loader, from ``frame`` (the caller of its ``__init__``)
    outwards: "transformers", "accelerate" or "lightning", the outermost on the stack
    (transformers' Trainer builds its loaders through accelerate), else None. Its loaders take
    its integration's line, not ``feedrate.autotune(DataLoader(...))``: the trainer builds them
    again (Lightning adds its sampler under DDP, accelerate shards them)."""
    found = None
    while frame is not None and depth > 0:
        module = str(frame.f_globals.get("__name__") or "").partition(".")[0]
        found = _TRAINERS.get(module, found)
        frame, depth = frame.f_back, depth - 1
    return found
