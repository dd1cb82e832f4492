"""The tune table says one thing per trial: its verdict and its samples/s rest on the same
figures (the median windows, ``space.shortfall`` against ``space.tolerance``), and the JSON's
``samples_per_s`` is the figure the table shows. Hand-built trials: no timing."""

from __future__ import annotations

import io
import json

from rich.console import Console

from feedrate.loader.config import LoaderConfig
from feedrate.render.console import trials_table
from feedrate.render.text import rate
from feedrate.results.spread import Spread
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.search import advice
from feedrate.search.propose import choose
from feedrate.search.space import Space, beats, shortfall, tolerance, with_workers

BASE = LoaderConfig(0)


def trial(workers: int, median: float, rel_se: float, aggregate: float | None = None) -> Trial:
    """A trial of 4 windows whose median is ``median`` and whose ± is ``rel_se``; its
    ``samples_per_s`` (samples over seconds across the windows) is ``aggregate``."""
    cfg = with_workers(BASE, workers) if workers else BASE
    stdev = rel_se * median * 2  # rel_se = stdev / median / sqrt(4)
    spread = Spread([median] * 4, median, 0.9 * median, 1.1 * median, stdev)
    return Trial(cfg, "t", samples_per_s=aggregate or median, spread=spread, main_cpu=0.1)


def table_text(result: TuneResult) -> str:
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(trials_table(result))
    return console.export_text()


def test_within_the_noise_says_how_far_behind_the_table_shows_it() -> None:
    # QA: "within noise of the fastest" beside a trial the table shows 8% slower. The verdict
    # now gives that gap and the gap the noise allows, in the same terms as its rule.
    space = Space(cpus=2, baseline=BASE, max_workers=32)
    yours, two, three, four = (
        trial(0, 300, 0.01),
        trial(2, 960, 0.05),
        trial(3, 920, 0.05),
        trial(4, 1000, 0.05),
    )
    trials = [yours, two, three, four]
    assert choose(space, trials) is two  # the cheapest within the noise of the fastest
    advice.verdicts(space, trials, two)
    assert two.verdict == "recommended"
    assert three.verdict == (
        "within noise of the fastest (8% slower; telling them apart takes more than 12%)"
    )
    assert four.verdict == (
        "fastest, but the recommended costs less within its noise "
        "(4% slower; telling them apart takes more than 12%)"
    )
    assert yours.verdict == "69% slower"
    text = table_text(TuneResult({}, yours, two, trials, [], 1.0, "", ""))
    assert "920 ± 5.0%" in text and "8% slower; telling them apart" in text


def test_a_gap_under_the_floor_reads_as_before() -> None:
    space = Space(cpus=2, baseline=BASE, max_workers=32)
    two, three, four = trial(2, 990, 0.01), trial(3, 985, 0.01), trial(4, 1000, 0.01)
    advice.verdicts(space, [two, three, four], two)
    assert three.verdict == "within noise of the fastest"  # 1.5%: nothing to reconcile


def test_within_noise_of_the_recommended_gives_the_gap_too() -> None:
    # Beaten by a precise fastest, but within the wide noise of a noisy answer 8% ahead.
    space = Space(cpus=2, baseline=BASE, max_workers=32)
    two, three, four = trial(2, 1000, 0.06), trial(3, 920, 0.005), trial(4, 1070, 0.005)
    assert choose(space, [two, three, four]) is two
    advice.verdicts(space, [two, three, four], two)
    assert three.verdict == (
        "within noise of the recommended (8% slower; telling them apart takes more than 11%)"
    )


def test_the_verdict_s_gap_and_tolerance_are_the_rule_s() -> None:
    for rel_se in (0.0, 0.01, 0.05, 0.2):
        for ratio in (0.5, 0.9, 0.95, 0.97, 0.99, 1.0, 1.02, 1.2):
            a, b = trial(2, 1000 * ratio, rel_se), trial(3, 1000, 0.02)
            assert beats(b, a) == (shortfall(a, b) > tolerance(a, b)), (rel_se, ratio)


def test_the_json_samples_per_s_is_the_table_s_figure() -> None:
    # QA: the JSON's samples_per_s (samples over seconds across the windows) differed from the
    # table's samples/s (the median window) for the same trial.
    yours, best = trial(0, 446, 0.01, aggregate=440), trial(17, 6072, 0.027, aggregate=5952)
    result = TuneResult({}, yours, best, [yours, best], [], 1.0, "", "")
    doc = json.loads(result.to_json())
    text = table_text(result)
    for shown, t in ((doc["best"], best), *zip(doc["trials"], (yours, best), strict=True)):
        assert shown["samples_per_s"] == t.median
        assert f"{rate(shown['samples_per_s'])} ±" in text
        assert shown["aggregate_samples_per_s"] == t.samples_per_s
    again = TuneResult.from_json(result.to_json())  # reads back as it was
    assert again.best.samples_per_s == 5952 and again.best.median == 6072


def test_a_document_without_the_aggregate_reads_as_before() -> None:
    doc = trial(2, 1000, 0.01, aggregate=990).to_dict()
    doc.pop("aggregate_samples_per_s", None)  # a document from before the field
    doc["samples_per_s"] = 990.0
    assert Trial.from_dict(doc).samples_per_s == 990.0
