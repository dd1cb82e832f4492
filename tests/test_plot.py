"""The PNG plot and the HTML report of a tuning result, drawn from hand-made trials (nothing is
measured): a latency-bound curve, a tiny-sample pipeline, a consumer, skipped and failed trials,
and a single trial."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from feedrate.errors import UserError
from feedrate.loader.config import LoaderConfig
from feedrate.render.html import render_html, write_html
from feedrate.render.plot import plot_png, png_bytes, series
from feedrate.results.findings import Finding
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MiB = 1024 * 1024
MACHINE = {
    "cpus_usable": 8,
    "cpu_count": 8,
    "torch_version": "2.13.0+cpu",
    "accelerator": "none",
    "memory_total_bytes": 32 * 1024 * MiB,
    "start_method": "fork",
}


def trial(
    workers: int, rate: float, reason: str = "explore", pf: int | None = None, **kw: Any
) -> Trial:
    """A measured trial at ``rate`` samples/s with a ±3% spread and memory growing per worker."""
    spread = Spread([rate * 0.97, rate, rate * 1.03], rate, rate * 0.97, rate * 1.03, rate * 0.02)
    figures: dict[str, Any] = {
        "samples_per_s": rate,
        "spread": spread,
        "startup_s": 0.05 + 0.04 * workers,
        "main_cpu": 0.4,
        "workers_cpu": 0.1 * workers,
        "main_uss_bytes": 300 * MiB,
        "workers_uss_bytes": 45 * MiB * workers or None,
    }
    figures.update(kw)
    return Trial(LoaderConfig(num_workers=workers, prefetch_factor=pf), reason, **figures)


def result(trials: list[Trial], best: Trial, baseline: Trial, **kw: Any) -> TuneResult:
    fields: dict[str, Any] = {
        "machine": MACHINE,
        "baseline": baseline,
        "best": best,
        "trials": trials,
        "findings": [],
        "search_seconds": 42.0,
        "reason": "the workers wait on storage, so more of them than CPUs help",
        "code": f"DataLoader(dataset, batch_size=64, {best.config.label()})",
        "target": "train.py:train_loader",
        "batch_size": 64,
    }
    fields.update(kw)
    return TuneResult(**fields)


def latency_bound() -> TuneResult:
    rates = {0: 60.0, 2: 125.0, 4: 250.0, 8: 480.0, 16: 900.0, 32: 910.0}
    trials = [trial(w, r, "baseline" if w == 0 else "double the workers") for w, r in rates.items()]
    trials[-1].verdict = "no better than w=16 within the noise"
    findings = [
        Finding("latency-bound", "info", "workers idle 92% of the time: <b>I/O</b> waits", "w=16"),
        Finding(
            "no-workers", "warning", "num_workers=0 loads on the main thread", "num_workers=16"
        ),
        Finding("shm-small", "error", "/dev/shm is 64 MiB & too small", "--shm-size=8g"),
    ]
    persistent = {"recommended": True, "epoch_restart_s": 0.9, "why": "restart costs 0.9 s/epoch"}
    return result(trials, trials[4], trials[0], findings=findings, persistent=persistent)


def tiny_samples() -> TuneResult:
    trials = [trial(w, r) for w, r in {0: 52000.0, 1: 21000.0, 2: 30000.0, 4: 34000.0}.items()]
    return result(trials, trials[0], trials[2], partial=True, partial_reason="time budget spent")


def with_consumer() -> TuneResult:
    trials = latency_bound().trials
    for t in trials:
        t.stall_fraction = max(0.0, 1 - t.median / 450)
    return result(trials, trials[3], trials[0], consumer={"kind": "rate", "samples_per_s": 450.0})


def with_skipped_and_failed() -> TuneResult:
    trials = latency_bound().trials[:5]
    trials.append(Trial(LoaderConfig(num_workers=64), "past the CPUs", skipped="RAM budget"))
    trials.append(Trial(LoaderConfig(num_workers=32), "past the CPUs", error="worker killed"))
    trials.append(trial(8, 500.0, "deeper prefetch", pf=4))
    return result(trials, trials[4], trials[0], from_cache=True)


def single() -> TuneResult:
    only = trial(0, 1200.0, "baseline")
    return result([only], only, only)


CASES = [latency_bound, tiny_samples, with_consumer, with_skipped_and_failed, single]


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_plot_writes_a_png(make: Callable[[], TuneResult], tmp_path: Path) -> None:
    path = plot_png(make(), tmp_path / "plot.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 5_000


def test_plot_with_all_trials_without_workers(tmp_path: Path) -> None:
    a, b = trial(0, 900.0), trial(0, 950.0)
    b.config = LoaderConfig(pin_memory=True)
    assert plot_png(result([a, b], b, a), tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)


def test_series_put_no_worker_trials_at_the_start_of_the_main_line() -> None:
    groups = series(with_skipped_and_failed().trials)
    assert [label for label, _ in groups] == ["prefetch 2", "prefetch 4"]
    assert [t.config.num_workers for t in groups[0][1]] == [0, 2, 4, 8, 16]


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_html_is_self_contained_and_complete(make: Callable[[], TuneResult]) -> None:
    res = make()
    page = render_html(res)
    assert '<img src="data:image/png;base64,' in page
    for banned in ("http://", "https://", "<script src", "<link"):
        assert banned not in page
    for t in res.trials:
        assert t.config.label() in page
    assert res.code.replace("'", "&#x27;") in page
    for f in res.findings:
        assert f.id in page


def test_html_escapes_text() -> None:
    page = render_html(latency_bound())
    assert "<b>I/O</b>" not in page
    assert "&lt;b&gt;I/O&lt;/b&gt;" in page
    assert "64 MiB &amp; too small" in page


def test_html_shows_banners_consumer_and_skips() -> None:
    assert "partial result" in render_html(tiny_samples())
    assert "time budget spent" in render_html(tiny_samples())
    page = render_html(with_skipped_and_failed())
    assert "from cache" in page
    assert "RAM budget" in page and "worker killed" in page
    assert "stall" in render_html(with_consumer())


def _without_image(page: str) -> str:
    return re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,", page)


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_a_saved_result_renders_the_same(make: Callable[[], TuneResult]) -> None:
    res = make()
    again = TuneResult.from_json(res.to_json())
    assert _without_image(render_html(again)) == _without_image(render_html(res))


def test_write_html(tmp_path: Path) -> None:
    path = write_html(single(), tmp_path / "report.html")
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_missing_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UserError, match=r"feedrate\[plot\]"):
        png_bytes(single())
    with pytest.raises(UserError, match=r"feedrate\[plot\]"):
        render_html(single())


def test_a_result_prints_in_a_few_lines() -> None:
    """``print(result)`` in a notebook: the answer, not the dataclass's pages of figures."""
    said = str(latency_bound()).splitlines()
    assert said[0] == "recommended  w=16 pf=2: 900.0 samples/s, 15.00× your w=0"
    assert said[2] == "code         DataLoader(dataset, batch_size=64, w=16 pf=2)"
    assert len(said) == 3
    assert str(tiny_samples()).splitlines()[-1] == "partial      time budget spent"
