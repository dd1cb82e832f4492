"""``feedrate run`` under a framework that builds its own loop around the user's loaders
(Lightning): the loaders are found, told apart and counted; skipped where it is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands import feedrate_cli

SCRIPTS = Path(__file__).resolve().parent / "run_scripts"


def test_a_lightning_fit_is_observed(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="Lightning is not installed here")
    out = tmp_path / "run.json"
    done = feedrate_cli("run", "--json", str(out), "lightning_fit.py", cwd=SCRIPTS)
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


def test_feedrate_s_own_lightning_callback_under_autotune_trains_once(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="Lightning is not installed here")
    out = tmp_path / "run.json"
    script = SCRIPTS / "lightning_callback.py"
    done = feedrate_cli(
        "run", "--autotune", "--json", str(out), script.name, cwd=SCRIPTS, cache=tmp_path / "cache"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fit done" in done.stdout and "RecursionError" not in done.stderr
    (train,) = json.loads(out.read_text())["loaders"]  # the callback's trial loaders are not
    fit_line = next(
        i for i, ln in enumerate(script.read_text().splitlines(), 1) if "fit line" in ln
    )
    assert train["created_at"] == f"{script.name}:{fit_line}"  # the user's line, not Lightning's
    assert (train["role"], train["epochs"], train["batches"]) == ("train", 2, 32)
    assert train["autotune"] is None  # the callback's answer is left as it is
