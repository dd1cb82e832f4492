"""``feedrate report`` on what ``feedrate run --json`` saved: the run's report printed again (its
command, verdict, and each loader where it was built), its timeline drawn with ``--plot`` and
``--html``, and a document that is no feedrate result, or a run cut short, refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_run import TRAIN, feedrate_run, line_of

from feedrate.cli import main

ARGS = ["train.py", "--batches", "3", "--epochs", "2"]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's JSON, made once for the module (a tiny script: 6 batches)."""
    path = tmp_path_factory.mktemp("saved") / "run.json"
    done = feedrate_run("--json", str(path), *ARGS)
    assert done.returncode == 0, done.stderr
    return path


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[Any, str, str]:
    """``feedrate report ARGS`` in this process: its exit status, stdout and stderr."""
    with pytest.raises(SystemExit) as info:
        main(["report", *args])
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def test_a_saved_run_is_reported_again(saved_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(saved_run.read_text())
    code, stdout, stderr = report(capsys, str(saved_run))
    assert code == 0, stderr
    assert f"feedrate run {' '.join(ARGS)}  (exit 0," in stdout
    assert doc["verdict"] and doc["verdict"] in stdout
    assert f"train loader train.py:{line_of(TRAIN, 'loader = DataLoader(')}" in stdout
    assert "6 batches · 24 samples" in stdout and "stall over time |" in stdout
    assert "next step" in stdout


def test_a_saved_run_draws_its_timeline(
    saved_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png, page = tmp_path / "run.png", tmp_path / "run.html"
    code, stdout, stderr = report(capsys, str(saved_run), "--plot", str(png), "--html", str(page))
    assert code == 0, stderr
    assert "feedrate run train.py" in stdout
    assert png.read_bytes().startswith(b"\x89PNG")
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<img" in html
    assert f"train.py:{line_of(TRAIN, 'loader = DataLoader(')}" in html
    assert f"wrote {png}" in stderr and f"wrote {page}" in stderr


def test_a_run_cut_short_is_refused_with_the_missing_field(
    saved_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(saved_run.read_text())
    del doc["loaders"]
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(doc))
    code, _, stderr = report(capsys, str(cut))
    assert code == 2
    assert f"{cut}: a feedrate.run/1 document, but loaders is missing" in stderr
    assert "Traceback" not in stderr


def test_a_foreign_document_is_no_feedrate_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "other.json"
    foreign.write_text('{"schema": "other.tool/3", "loaders": []}')
    code, stdout, stderr = report(capsys, str(foreign))
    assert code == 2 and stdout == ""
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"feedrate: error: {foreign}: it is not a feedrate result")
    assert "'other.tool/3'" in line and "feedrate.run/1" in line


def test_a_result_without_a_picture_refuses_plot_and_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "transfer.json"
    cheap = ["--sizes", "64KiB", "--repeats", "1", "--device", "cpu"]
    with pytest.raises(SystemExit) as info:
        main(["transfer", *cheap, "--json", str(saved)])
    assert info.value.code == 0, capsys.readouterr().err
    capsys.readouterr()
    code, stdout, stderr = report(capsys, str(saved), "--plot", str(tmp_path / "t.png"))
    assert code == 2 and stdout == ""
    assert "--plot and --html draw tune results and runs only" in stderr
    assert "feedrate.transfer/1" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "t.png").exists()
