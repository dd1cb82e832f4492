"""``feedrate run`` under a framework that builds its own loop around the user's loaders
(Lightning): the loaders are found, told apart and counted; skipped where it is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "run_scripts"


def test_a_lightning_fit_is_observed(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="Lightning is not installed here")
    out = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "feedrate", "run", "--json", str(out), "lightning_fit.py"],
        capture_output=True,
        text=True,
        cwd=SCRIPTS,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "fit done" in done.stdout
    loaders = {ld["name"]: ld for ld in json.loads(out.read_text())["loaders"]}
    train, val = loaders["lightning_fit.py:train"], loaders["lightning_fit.py:val"]
    assert (train["role"], train["batches"], train["samples"], train["epochs"]) == (
        "train",
        64,
        512,
        2,
    )
    assert (val["role"], val["batches"], val["samples"]) == ("eval", 16, 512)
