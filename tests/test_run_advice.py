"""What ``feedrate run`` advises, and when it must not: a run that saw too little (a script
that crashed after a handful of batches) reports what it saw without advice; start-up cost is
no finding of a one-epoch run; ``--autotune``'s summary says the same thing in its headline
and its detail line. Each rule on synthetic observations, then end to end as a user runs it
(batch counts and sleeps with a wide margin: nothing depends on the machine's speed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset

from feedrate.checks import stall as rules
from feedrate.loader.config import LoaderConfig
from feedrate.render.run import run_report
from feedrate.results.autotune import AutotuneReport
from feedrate.results.run import AutotuneChange, LoaderRun, ProcessRun, RunReport
from feedrate.results.trial import Trial
from feedrate.running.gather import decide
from feedrate.running.observer import Watch
from feedrate.running.tuning import own_stall
from feedrate.search.tuner import online

from builders import loader_run
from commands import feedrate_cli


def run_of(**kw: Any) -> LoaderRun:
    """A starved loader without workers that waits asleep (it reads, not computes)."""
    return loader_run(**{"main_cpu_in_next": 0.0, **kw})


def shown(ld: LoaderRun) -> tuple[RunReport, str]:
    """The report of a run of ``ld`` alone, decided, and its console text."""
    report = RunReport(["train.py"], 1, 1.0, processes=[ProcessRun(pid=5, loaders=[ld])])
    decide(report, ["train.py"])
    console = Console(width=300, record=True)
    console.print(run_report(report))
    return report, console.export_text()


# --- a run that saw too little ---------------------------------------------------------------


def test_a_handful_of_batches_is_reported_without_advice() -> None:
    # QA: a loop that raised after 4 batches (0.04 s) was advised num_workers=11, with a
    # data-stall warning and a bottleneck, all resting on 3 batches past start-up.
    crashed = run_of(batches=4, samples=16, wait_s=0.037, step_s=0.004, startup_s=0.011)
    report, text = shown(crashed)
    assert crashed.bottleneck is None
    assert {f.id for f in crashed.findings} == set()
    assert crashed.next_step == [
        "too little observed to advise: 4 batch(es) in 1 epoch(s) over 0.04 s of loop "
        "(3 past start-up, where advice needs 5); run it longer (more batches) for advice"
    ]
    assert report.verdict == "too little observed to advise: 4 batch(es), at train.py:9 (pid 5)"
    assert "4 batches · 16 samples" in text  # what it saw, still reported
    assert "try DataLoader" not in text and "data-stall" not in text and "bound" not in text


def test_batches_the_workers_queued_at_start_up_do_not_count_as_observation() -> None:
    # 2 workers, prefetch 2: the first 4 batches after the first were made while it waited.
    queued = run_of(config=LoaderConfig(num_workers=2), batches=9)
    assert rules.too_little(queued) is not None
    assert rules.too_little(run_of(config=LoaderConfig(num_workers=2), batches=10)) is None
    assert rules.too_little(run_of(batches=6)) is None  # 5 past each epoch's first
    assert rules.too_little(run_of(batches=8, epochs=4)) is not None  # 4 past them
    # 8 workers, prefetch 2: 8 batches may all come out of the queue they filled at start.
    assert rules.too_little(run_of(config=LoaderConfig(num_workers=8), batches=8)) is not None


def test_long_runs_are_judged_however_their_epochs_and_queue_are_shaped() -> None:
    # A loop that calls next(iter(loader)) at each step (or trains on one batch an epoch):
    # an epoch a batch, each start evidence of what the loop waits for.
    assert rules.too_little(run_of(batches=100, epochs=100)) is None
    # 64 workers, prefetch 4 (256 queued at start) over 250 slow steps: no less a run.
    deep = LoaderConfig(num_workers=64, prefetch_factor=4, persistent_workers=True)
    assert rules.too_little(run_of(config=deep, batches=250)) is None


def test_a_run_with_enough_still_gets_its_advice_beside_one_with_too_little() -> None:
    starved, brief = run_of(), run_of(created_at="train.py:20", batches=3)
    proc = ProcessRun(pid=5, loaders=[starved, brief])
    report = decide(RunReport(["train.py"], 0, 9.0, processes=[proc]), ["train.py"])
    assert report.verdict.startswith("training waits on data 75%"), report.verdict
    assert starved.next_step[0].startswith("try DataLoader(..., num_workers=")


# --- start-up cost needs epochs to restart ---------------------------------------------------


def _slow_starting(epochs: int) -> LoaderRun:
    # 2 workers, not persistent, 2 s to start against an epoch of ~8 s: a quarter of an epoch.
    restarts = [2.0] * (epochs - 1)
    return run_of(
        config=LoaderConfig(num_workers=2),
        epochs=epochs,
        batches=100 * epochs,
        samples=400 * epochs,
        startup_s=2.0,
        epoch_restart_s=restarts,
        epoch_batches=100,
        batch_size=4,
    )


def test_start_up_cost_is_no_finding_of_a_one_epoch_run() -> None:
    # QA: "every epoch loses 2.00 s (25% of an epoch)" on a run of one epoch, where persistent
    # workers save nothing.
    assert "startup-cost" not in {f.id for f in rules.findings(_slow_starting(1), {}, 2)}
    found = {f.id: f for f in rules.findings(_slow_starting(3), {}, 2)}
    assert "every epoch loses 2.00 s" in found["startup-cost"].message


# --- --autotune's summary --------------------------------------------------------------------


def _tuning(settled: bool, stall_before: float | None, started_from: str) -> LoaderRun:
    ld = run_of(config=LoaderConfig(num_workers=2))
    ld.autotune = AutotuneChange(
        before=LoaderConfig(num_workers=2),
        after=LoaderConfig(num_workers=4, persistent_workers=True),
        settled=settled,
        started_from=started_from,
        stall_before=stall_before,
        stall_after=0.6,
    )
    return ld


def test_the_verdict_of_a_loader_still_tuning_says_so_as_its_detail_line_does() -> None:
    # QA: "training waits on data 60% of its loop time once autotune tuned it" above
    # "autotune: ... (still tuning, ...)".
    trying = _tuning(False, 0.3, "your settings")
    report, text = shown(trying)
    assert "once autotune tuned it" not in report.verdict
    assert "while autotune was still tuning it" in report.verdict, report.verdict
    assert "still tuning" in text
    assert trying.next_step[0] == (
        "autotune moved w=2 pf=2 → w=4 pf=2 persistent (stall 30% with your settings → 60% "
        "over the last half of the batches), a trial: it was still tuning when the run ended; "
        "a longer run lets it settle on settings to keep"
    )
    settled, _ = shown(_tuning(True, 0.3, "your settings"))
    assert "once autotune tuned it" in settled.verdict


def test_settings_autotune_never_ran_are_said_so_not_measured() -> None:
    elsewhere = _tuning(False, None, "4 workers, one per usable CPU")
    shown(elsewhere)
    first = elsewhere.next_step[0]
    assert "not measured with your settings" not in first
    assert "your settings did not run: autotune started from 4 workers" in first, first


def _watch(config_workers: int) -> Watch:
    data = TensorDataset(torch.arange(40.0))
    watch = Watch(DataLoader(data, batch_size=4, num_workers=config_workers), "t.py:1", None, 0.0)
    watch.new_epoch(0.0)
    for i in range(10):  # each batch waits 0.1 s after a 0.3 s step: 25% late in the loop
        watch.took([torch.zeros(4)], 0.4 * i + 0.3 * (i > 0), 0.4 * i + 0.4, cpu=0.0)
    return watch


def test_the_stall_of_the_user_s_settings_is_autotune_s_trial_of_them() -> None:
    # Autotune runs every configuration with persistent workers: its trial of the user's
    # (non-persistent) settings was not found, and "started from your settings" came with
    # "stall with your settings not measured".
    watch = _watch(2)
    mine = online(watch.config)
    assert mine != watch.config
    other = LoaderConfig(num_workers=4, persistent_workers=True)
    tried = [Trial(config=mine, reason="start", stall_fraction=0.4), Trial(other, "more")]
    assert own_stall(watch, AutotuneReport(other, False, "your settings", tried)) == 0.4
    # No trial ended, still on the user's settings: the loop ran them, all of it.
    late = own_stall(watch, AutotuneReport(mine, False, "your settings"))
    assert late is not None and abs(late - 0.25) < 1e-9
    # Started elsewhere: the user's settings never ran.
    assert own_stall(watch, AutotuneReport(other, False, "4 workers")) is None


# --- end to end ------------------------------------------------------------------------------

CRASH = """
import time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.zeros(4)

loader = DataLoader(Slow(), batch_size=4, num_workers={workers}{extra})
for epoch in range({epochs}):
    for i, batch in enumerate(loader):
        time.sleep({step})
        if i + 1 == {crash_at}:
            raise RuntimeError("the loop's own failure")
"""


def feedrate_run(tmp_path: Path, *args: str, **script: Any) -> tuple[Any, dict[str, Any]]:
    """``feedrate run [args] script.py --json``, of a script made of ``CRASH``'s lines."""
    values = {"workers": 0, "extra": "", "epochs": 1, "step": 0.001, "crash_at": -1, **script}
    path = tmp_path / "script.py"
    path.write_text(CRASH.format(**values))
    out = tmp_path / "run.json"
    run = ["run", *args, "--json", str(out), str(path)]
    done = feedrate_cli(*run, cwd=tmp_path, cache=tmp_path / "cache", timeout=300)
    return done, json.loads(out.read_text())


def test_a_script_that_crashed_after_4_batches_reports_them_without_advice(
    tmp_path: Path,
) -> None:
    done, doc = feedrate_run(tmp_path, crash_at=4)
    assert done.returncode == 1 and done.stderr.startswith("Traceback"), done.stderr
    (loader,) = doc["loaders"]
    assert (loader["batches"], loader["samples"], loader["bottleneck"]) == (4, 16, None)
    assert loader["findings"] == []
    assert len(loader["next_step"]) == 1
    assert loader["next_step"][0].startswith("too little observed to advise: 4 batch(es)")
    assert doc["verdict"].startswith("too little observed to advise: 4 batch(es)"), doc["verdict"]
    assert "try DataLoader" not in done.stderr and "data-stall" not in done.stderr
    assert "4 batches · 16 samples" in done.stderr
    assert "not judged: too little observed" in done.stderr
    assert "no problems found" not in done.stderr


def test_one_epoch_of_slow_starting_workers_has_no_start_up_finding(tmp_path: Path) -> None:
    # Each worker sleeps 1.5 s before its first sample: start-up costs more than
    # PERSISTENT_SECONDS whatever the machine's speed.
    slow = ", worker_init_fn=lambda _: time.sleep(1.5)"
    _, one = feedrate_run(tmp_path, workers=2, extra=slow, epochs=1)
    _, two = feedrate_run(tmp_path, workers=2, extra=slow, epochs=2)
    ids = [[f["id"] for f in doc["loaders"][0]["findings"]] for doc in (one, two)]
    assert one["loaders"][0]["epochs"] == 1 and "startup-cost" not in ids[0], ids
    assert "startup-cost" in ids[1], ids  # the rule is alive where workers do restart


def test_autotune_from_the_user_s_settings_measures_their_stall_and_says_one_thing(
    tmp_path: Path,
) -> None:
    done, doc = feedrate_run(tmp_path, "--autotune", workers=2, step=0.01)
    assert done.returncode == 0, done.stderr
    (loader,) = doc["loaders"]
    change = loader["autotune"]
    assert change["error"] is None and change["started_from"] == "your settings", change
    assert change["stall_before"] is not None
    assert "stall with your settings not measured" not in done.stderr
    tuned = "once autotune tuned it" in doc["verdict"]
    trying = "while autotune was still tuning it" in doc["verdict"]
    assert (tuned, trying) == (change["settled"], not change["settled"]), doc["verdict"]
    assert ("(still tuning," in done.stderr) == trying
