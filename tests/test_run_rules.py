"""``feedrate run``'s parts without running a script: the observer's accounting driven by
given clock readings, the timeline, the rules (roles, bottleneck, workers needed, next step,
verdict), the report's JSON round trip and its rendering."""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

from feedrate.checks import stall as rules
from feedrate.loader.config import LoaderConfig
from feedrate.render.run import render_html, run_report, sparkline
from feedrate.results.run import AutotuneChange, LoaderRun, ProcessRun, RunReport, Window
from feedrate.running.launch import command_of, module_found
from feedrate.running.observer import ObservedIterator, Registry, Watch, importable, install
from feedrate.running.sampler import Sampler
from feedrate.running.timeline import Timeline
from feedrate.running.tuning import _tuned_epoch, follow

from builders import loader_run


def _loader(n: int = 12) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.arange(float(n))), batch_size=4)


# --- the observer, on given clock readings ----------------------------------------------------


def test_a_watch_splits_wait_from_step_and_counts_start_up_and_restarts() -> None:
    watch = Watch(_loader(), "train.py:3", "__main__", origin=0.0)
    batch = [torch.zeros(4)]
    watch.new_epoch(10.0)
    watch.took(batch, 10.0, 10.5, cpu=0.1)  # first batch: waited from iter(), 0.5 s
    watch.took(batch, 10.7, 10.8, cpu=0.0)  # stepped 0.2 s, waited 0.1 s
    watch.ran_out(11.0)  # the last step, 0.2 s
    watch.new_epoch(20.0)  # the 9 s between epochs belong to no loop
    watch.took(batch, 20.0, 20.3, cpu=0.0)
    run = watch.result(pid=1, rank=None)
    assert (run.epochs, run.batches, run.samples) == (2, 3, 12)
    assert run.startup_s == 0.5 and run.epoch_restart_s == [0.30000000000000071]
    assert abs(run.wait_s - 0.9) < 1e-9 and abs(run.step_s - 0.4) < 1e-9
    assert run.stall is not None and abs(run.stall - 0.9 / 1.3) < 1e-9
    assert sum(w.batches for w in run.timeline) == 3


def test_a_watch_counts_the_wait_queued_for_a_cpu_as_the_loops_step() -> None:
    loader = DataLoader(TensorDataset(torch.arange(12.0)), batch_size=4, num_workers=2)
    watch = Watch(loader, "train.py:3", "__main__", origin=0.0)
    batch = [torch.zeros(4)]
    watch.new_epoch(10.0)
    watch.took(batch, 10.0, 10.5, cpu=0.1)  # start-up: all of it counted as such
    watch.took(batch, 10.7, 10.8, cpu=0.0, queued=0.06)  # 0.1 s waited, 0.06 s of it queued
    watch.took(batch, 11.0, 11.1, cpu=0.0, queued=0.5)  # never more than the wait itself
    run = watch.result(pid=1, rank=None)
    assert run.startup_s == 0.5
    assert abs(run.wait_s - (0.5 + 0.04 + 0.0)) < 1e-9
    assert abs(run.step_s - (0.2 + 0.06 + 0.2 + 0.1)) < 1e-9


def test_without_workers_a_wait_queued_for_a_cpu_is_the_data_s() -> None:
    # The loop's thread makes the batch in next(): queued there, it still waited on its data.
    watch = Watch(_loader(), "train.py:3", "__main__", origin=0.0)
    batch = [torch.zeros(4)]
    watch.new_epoch(10.0)
    watch.took(batch, 10.0, 10.5, cpu=0.1)
    watch.took(batch, 10.7, 10.8, cpu=0.0, queued=0.06)
    run = watch.result(pid=1, rank=None)
    assert abs(run.wait_s - (0.5 + 0.1)) < 1e-9 and abs(run.step_s - 0.2) < 1e-9


def test_the_observer_finds_the_users_line_and_skips_feedrates_own_loaders() -> None:
    class Mine(DataLoader[Any]):
        def __init__(self, dataset: Any, **kwargs: Any) -> None:
            super().__init__(dataset, **kwargs)

    registry = Registry(origin=0.0)
    install(registry, Mine)
    line = sys._getframe().f_lineno + 1
    loader = Mine(TensorDataset(torch.arange(12.0)), batch_size=4)
    (watch,) = registry.watches
    assert watch.site.endswith(f"test_run_rules.py:{line}")
    # The signature stays the class's own (frameworks read it to build a loader again).
    assert list(inspect.signature(Mine.__init__).parameters) == ["self", "dataset", "kwargs"]
    it = iter(loader)
    assert isinstance(it, ObservedIterator) and len(it) == 3
    assert isinstance(it, _SingleProcessDataLoaderIter)  # as frameworks check it
    assert [b[0].tolist() for b in it] == [[0.0, 1.0, 2.0, 3.0], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert (watch.batches, watch.samples, watch.epochs) == (3, 12, 1)
    from feedrate.loader.rebuild import rebuild

    rebuild(loader, LoaderConfig(num_workers=0))  # built inside feedrate: not watched
    assert len(registry.watches) == 1


def test_a_loader_built_again_every_epoch_is_one_loader() -> None:
    class Again(DataLoader[Any]):
        pass

    registry = Registry(origin=0.0)
    install(registry, Again)
    data = TensorDataset(torch.arange(8.0))
    for _epoch in range(3):
        loader = Again(data, batch_size=4)
        assert sum(1 for _ in loader) == 2
    other = Again(TensorDataset(torch.arange(8.0)), batch_size=4)  # another dataset: apart
    assert len(list(other)) == 2
    first, second = registry.watches
    assert (first.epochs, first.batches, len(first.restarts)) == (3, 6, 2)
    assert (second.epochs, second.batches) == (1, 2)


def test_a_script_s_own_tuner_is_followed_as_its_loader_and_its_lanes_workers_read() -> None:
    class Own(DataLoader[Any]):
        pass

    registry = Registry(origin=0.0, replacer=_tuned_epoch)  # as under --autotune
    install(registry, Own)
    loader = Own(TensorDataset(torch.arange(8.0)), batch_size=4)

    class Tuner:  # what follow() needs of an AutoLoader: the loader it wraps, its lane's workers
        def __init__(self, wrapped: DataLoader[Any]) -> None:
            self.wrapped = wrapped
            self.lane_iterator = SimpleNamespace(_workers=[SimpleNamespace(pid=os.getpid())])

        def __iter__(self) -> Iterator[Any]:  # a lane of its own (feedrate's: not watched)
            return iter(DataLoader(self.wrapped.dataset, batch_size=4))

    follow(registry, Tuner)
    tuner = Tuner(loader)
    for _epoch in range(2):
        assert sum(1 for _ in tuner) == 2
    (watch,) = registry.watches
    assert (watch.epochs, watch.batches, watch.tuner) == (2, 4, tuner)
    assert watch.autotune is not None and watch.autotune.before == watch.config
    # Its generator is not held (a break ends its workers at once); its lane's workers are read.
    assert watch.iterator is None
    Sampler(lambda: list(registry.watches)).read(memory=False)
    assert list(watch.worker_cpu) == [os.getpid()]  # the lane's workers, not the loader's none
    # The loader iterated raw (an evaluation pass over it): observed as it is, not handed to
    # the script's tuner, whose epoch it would count twice.
    assert sum(1 for _ in loader) == 2
    assert (watch.epochs, watch.batches, watch.tuner) == (3, 6, tuner)


def test_the_timeline_keeps_a_bounded_number_of_windows() -> None:
    line = Timeline(origin=0.0, width_s=1.0, max_windows=4)
    for t in range(10):
        line.add(t + 0.5, wait=0.25, step=0.75)
    windows = line.windows()
    assert len(windows) <= 4 and line.width == 4.0
    assert sum(w.batches for w in windows) == 10
    assert all(w.stall == 0.25 for w in windows)


# --- the rules -------------------------------------------------------------------------------


def run_of(**kw: Any) -> LoaderRun:
    return loader_run(**kw)


def test_roles_tell_evaluation_from_training() -> None:
    train = run_of(batches=100)
    val = run_of(batches=100, grad_off_batches=100)  # taken under torch.no_grad()
    small = run_of(batches=10)  # much less than the training loader
    assert rules.roles([train, val, small]) == ["train", "eval", "eval"]
    assert rules.roles([val]) == ["eval"]


def test_the_bottleneck_of_an_observed_loader() -> None:
    assert rules.bottleneck_of(run_of(wait_s=0.05, step_s=2.0), cpus=2) == "consumer"
    assert rules.bottleneck_of(run_of(main_cpu_in_next=0.95), cpus=2) == "main-process"
    assert rules.bottleneck_of(run_of(main_cpu_in_next=0.02), cpus=2) == "latency"
    workers = LoaderConfig(num_workers=2)
    busy = run_of(config=workers, main_cpu_in_next=0.1)
    busy.workers.cpu_util = 1.9
    assert rules.bottleneck_of(busy, cpus=2) == "cpu"
    idle = run_of(config=workers, main_cpu_in_next=0.1)
    idle.workers.cpu_util = 0.1
    assert rules.bottleneck_of(idle, cpus=2) == "latency"


def test_workers_queued_for_a_cpu_on_a_busy_machine_are_not_called_latency_bound() -> None:
    # Two CPU-bound workers on a machine that others keep busy: each ran 30% of the time and sat
    # in the run queue 60% of it. Their CPU alone reads as mostly asleep; they were not.
    workers = LoaderConfig(num_workers=2)
    queued = run_of(config=workers, main_cpu_in_next=0.1, system_busy_cpus=2.0)
    queued.workers.cpu_util, queued.workers.runq_util = 0.6, 1.2
    assert rules.bottleneck_of(queued, cpus=2) == "cpu"
    queued.bottleneck = "cpu"
    found = next(f for f in rules.findings(queued, {}, 2) if f.id == "bottleneck")
    assert "queued for a CPU 60% of the time each" in found.message, found.message
    assert "2.0 of 2 CPUs busy" in found.message, found.message
    assert "remote" not in found.fix
    assert rules.workers_needed(queued, cpus=2) == 2  # more would only queue longer
    # The same CPU, asleep rather than queued: workers waiting on I/O.
    asleep = run_of(config=workers, main_cpu_in_next=0.1, system_busy_cpus=0.8)
    asleep.workers.cpu_util, asleep.workers.runq_util = 0.6, 0.02
    assert rules.bottleneck_of(asleep, cpus=2) == "latency"


def test_the_rate_that_reaches_the_loop_is_the_one_the_report_shows() -> None:
    # 400 samples over an 8 s loop: 50 samples/s, whatever the median of two uneven windows.
    uneven = [Window(0.0, 4.0, 5.0, 1.0, 20), Window(4.0, 4.0, 1.0, 1.0, 80)]
    ld = run_of(timeline=uneven, main_cpu_in_next=0.02)
    stall = next(f for f in rules.findings(ld, {}, 2) if f.id == "data-stall")
    assert ": 50 samples/s reach it" in stall.message, stall.message


def test_workers_needed_follows_the_data_time_against_the_step() -> None:
    # 6 s of waiting (0.1 s start-up) over 99 steady batches: ~60 ms a batch for a 20 ms step.
    latency = run_of(main_cpu_in_next=0.0)
    assert rules.workers_needed(latency, cpus=2) == 4
    cpu_bound = run_of(main_cpu_in_next=0.95, bottleneck="main-process")
    assert rules.workers_needed(cpu_bound, cpus=2) == 2  # no more than the CPUs
    # 2 workers on a CPU 76% of the time each (spawned, importing torch every epoch): more
    # than the CPUs would only compete, whatever the loop's pace.
    computing = run_of(config=LoaderConfig(2), main_cpu_in_next=0.01, bottleneck="unknown")
    computing.workers.cpu_util = 1.52
    assert rules.workers_needed(computing, cpus=2) == 2
    # 16 epochs of 6 batches: the 4 workers the pace asks for make an epoch in 2 rounds of one
    # batch each, as 3 do.
    short = run_of(main_cpu_in_next=0.0, batches=96, epochs=16, epoch_batches=6)
    assert rules.workers_needed(short, cpus=2) == 3
    assert rules.workers_needed(replace(short, epoch_batches=None), cpus=2) == 4
    # A run that stalled a little at 4 workers asks for 5; with 8 batches an epoch both make it
    # in 2 rounds, so it is told the count that saves one, 8: never fewer workers than it had,
    # nor its own count (no advice at all).
    four = run_of(config=LoaderConfig(4), main_cpu_in_next=0.0, batches=96, epochs=16, wait_s=0.3)
    four.workers.cpu_util = 0.1
    assert rules.workers_needed(four, cpus=2) == 5
    assert rules.workers_needed(replace(four, epoch_batches=8), cpus=2) == 8


def test_a_bottleneck_that_stood_out_nowhere_sends_to_the_doctor_by_name() -> None:
    def fix_of(ld: LoaderRun) -> str:
        found = rules.findings(ld, {"accelerator": "none"}, 2)
        (fix,) = {f.fix for f in found if f.id == "bottleneck"}
        return fix

    assert fix_of(run_of(name="train.py:loader", bottleneck="unknown")) == (
        "feedrate doctor train.py:loader"
    )
    # Built where feedrate tune cannot import it: the doctor on a name the user gives it.
    assert "exposed as a name (file.py:NAME)" in fix_of(run_of(bottleneck="unknown"))


def test_the_next_step_and_the_verdict() -> None:
    fed = run_of(wait_s=0.05, step_s=2.0)
    fed.bottleneck = rules.bottleneck_of(fed, 2)
    assert "model is the bottleneck" in rules.next_step(fed, ["train.py"], 2)[0]
    assert "does not wait on data" in rules.verdict([fed], [])
    starved = run_of(name="train.py:loader", main_cpu_in_next=0.0)
    starved.bottleneck = rules.bottleneck_of(starved, 2)
    steps = rules.next_step(starved, ["train.py", "--lr", "3"], 2)
    assert steps[0].startswith("try DataLoader(..., num_workers=4)")
    assert "feedrate run --autotune train.py --lr 3" in steps
    assert steps[-1] == "feedrate tune train.py:loader --step-time 0.02"
    assert "waits on data 75%" in rules.verdict([starved, fed], [])
    found = {f.id for f in rules.findings(starved, {"accelerator": "none"}, 2)}
    assert {"data-stall", "bottleneck"} <= found
    assert rules.verdict([], []).startswith("no DataLoader was iterated")


def test_the_next_step_is_said_for_the_loader_s_own_class() -> None:
    starved = run_of(main_cpu_in_next=0.0, loader_type="StreamingDataLoader")
    starved.bottleneck = rules.bottleneck_of(starved, 2)
    assert rules.next_step(starved, ["train.py"], 2)[0].startswith(
        "try StreamingDataLoader(..., num_workers=4): the run shows"
    )
    starved.autotune = AutotuneChange(
        before=LoaderConfig(), after=LoaderConfig(num_workers=2), settled=True, stall_after=0.0
    )
    steps = rules.next_step(starved, ["train.py"], 2)
    assert "without autotune: StreamingDataLoader(..., num_workers=2, pin_memory" in steps[0]


def test_without_workers_time_queued_for_a_cpu_is_the_dataset_s_work() -> None:
    # A CPU-bound dataset in the main process on a busy machine: its thread computed 41% of
    # the wait and sat queued for a CPU most of the rest. It was called latency-bound, with
    # "a local cache of the remote data" and 7 workers on one CPU.
    queued = run_of(main_cpu_in_next=0.41, main_queued_in_next=0.5)
    queued.bottleneck = rules.bottleneck_of(queued, 1)
    assert queued.bottleneck == "main-process"
    found = next(f for f in rules.findings(queued, {}, 1) if f.id == "bottleneck")
    assert "queued for a CPU 50% of it" in found.message
    assert rules.next_step(queued, ["train.py"], 1)[0].startswith(
        "try DataLoader(..., num_workers=1)"
    )
    asleep = run_of(main_cpu_in_next=0.41, main_queued_in_next=0.02)
    assert rules.bottleneck_of(asleep, 1) == "latency"


def test_the_worker_count_advised_is_each_rank_s_share_of_the_node() -> None:
    # 2 ranks on 2 CPUs, CPU-bound: 2 workers in each would be 4 on 2 CPUs.
    starved = run_of(rank=0)
    starved.bottleneck = rules.bottleneck_of(starved, 2)
    assert rules.next_step(starved, ["train.py"], 2, ranks=1)[0].startswith(
        "try DataLoader(..., num_workers=2): the run shows"
    )
    assert rules.next_step(starved, ["train.py"], 2, ranks=2)[0].startswith(
        "try DataLoader(..., num_workers=1) in each of the 2 ranks on this node"
    )


@pytest.mark.parametrize(
    ("trainer", "line"),
    [
        ("lightning", "Trainer(..., callbacks=[FeedrateCallback()])"),
        ("transformers", "tune_trainer(trainer) before trainer.train()"),
        ("accelerate", "tune_prepared(accelerator, loader) after accelerator.prepare(...)"),
        (None, "loader = feedrate.autotune(DataLoader(...))"),
    ],
)
def test_a_loader_a_trainer_built_is_advised_its_integration(
    trainer: str | None, line: str
) -> None:
    # Wrapping the loader Lightning rebuilds under DDP by hand lost its DistributedSampler:
    # every rank read the whole dataset.
    starved = run_of(main_cpu_in_next=0.0, built_by=trainer)
    starved.bottleneck = rules.bottleneck_of(starved, 2)
    steps = rules.next_step(starved, ["train.py"], 2)
    assert steps[-1].startswith(f"in code, at train.py:9: {line}")
    said = "TrainingArguments(..., dataloader_num_workers=4)" in steps[0]
    assert said == (trainer == "transformers") and ("DataLoader(" in steps[0]) != said


def test_settings_autotune_was_still_trying_are_not_offered_to_keep() -> None:
    # Interrupted while tuning, the run offered "to keep it without autotune: DataLoader(...,
    # num_workers=8)", a trial on 2 CPUs, with the loop stalled 55%.
    trying = run_of()
    trying.autotune = AutotuneChange(
        before=LoaderConfig(), after=LoaderConfig(num_workers=8), settled=False, stall_after=0.55
    )
    trying.bottleneck = rules.bottleneck_of(trying, 2)
    first = rules.next_step(trying, ["train.py"], 2)[0]
    assert "still tuning when the run ended" in first and "num_workers=8" not in first


def test_an_autotuned_loader_is_judged_by_its_settled_stall() -> None:
    tuned = run_of()
    tuned.autotune = AutotuneChange(
        before=LoaderConfig(), after=LoaderConfig(num_workers=2), settled=True, stall_after=0.02
    )
    tuned.bottleneck = rules.bottleneck_of(tuned, 2)
    assert tuned.bottleneck == "consumer"
    steps = rules.next_step(tuned, ["train.py"], 2)
    assert "autotune moved w=0 → w=2 pf=2" in steps[0] and "num_workers=2" in steps[0]
    # Not named (built where tune cannot import it) and autotuned already: no step to wrap it
    # in feedrate.autotune again.
    assert not any("feedrate.autotune(" in step for step in steps), steps
    kept = run_of()  # settled where it began: kept, not "moved w=0 → w=0" (QA)
    kept.autotune = AutotuneChange(
        before=LoaderConfig(), after=LoaderConfig(), settled=True, stall_after=0.02
    )
    assert rules.next_step(kept, ["train.py"], 2)[0].startswith("autotune kept w=0 (stall")
    starved = run_of()
    starved.autotune = AutotuneChange(
        before=LoaderConfig(), after=LoaderConfig(num_workers=2), settled=True, stall_after=0.6
    )
    stall = next(f for f in rules.findings(starved, {}, 2) if f.id == "data-stall")
    assert "with autotune's settings (w=2" in stall.message  # not "your settings": yours were w=0
    starved.bottleneck = rules.bottleneck_of(starved, 2)
    found = next(f for f in rules.findings(starved, {}, 2) if f.id == "bottleneck")
    # Not what w=0 would show (the user's settings, which autotune left): autotune's answer.
    assert "w=2 pf=2, autotune's (settled): the run does not tell" in found.message, found.message
    assert "w=0" not in found.message


# --- the report: JSON and rendering ----------------------------------------------------------


def report_of() -> RunReport:
    train, val = run_of(rank=0), run_of(grad_off_batches=100, created_at="train.py:12", rank=0)
    proc = ProcessRun(pid=5, rank=0, loaders=[train, val])
    report = RunReport(["train.py"], 0, 9.5, processes=[proc], machine={"cpus_usable": 2})
    from feedrate.running.gather import decide

    return decide(report, ["train.py"])


@pytest.mark.parametrize("affinity", [4, 2, None])
def test_ranks_share_the_node_s_cpus_unless_pinned_apart(affinity: int | None) -> None:
    # 2 ranks on 4 CPUs, CPU-bound: each is advised its share, 2 workers; a rank pinned to 2
    # CPUs of its own sees its share already, and is not halved again (to 1).
    machine = {"cpus_usable": affinity or 4, "cpu_count": 4, "cpus_affinity": affinity}
    procs = [
        ProcessRun(pid=5 + r, rank=r, loaders=[run_of(rank=r)], machine=machine) for r in (0, 1)
    ]
    report = RunReport(["train.py"], 0, 9.5, processes=procs, machine=machine)
    from feedrate.running.gather import decide

    first = decide(report, ["train.py"]).loaders[0].next_step[0]
    assert first.startswith("try DataLoader(..., num_workers=2)"), first
    assert ("in each of the 2 ranks" in first) == (affinity != 2), first


def test_the_report_round_trips_through_json() -> None:
    report = report_of()
    doc = json.loads(report.to_json())
    assert doc["schema"] == "feedrate.run/1"
    for loader in doc["loaders"]:
        for key in ("created_at", "config", "batches", "samples", "wait_s", "step_s", "stall"):
            assert key in loader
        assert loader["timeline"][0]["stall"] == 0.75
    again = RunReport.from_dict(doc)
    assert again.to_dict() == doc


def test_the_console_and_html_reports() -> None:
    report = report_of()
    console = Console(width=100, record=True)
    console.print(run_report(report))
    text = console.export_text()
    assert "train loader train.py:9" in text and "eval loader train.py:12" in text
    assert text.index("train loader") < text.index("eval loader")
    assert "stall over time |▇▇|" in text and "next step" in text
    assert sparkline([Window(0, 1, 0, 1, 1), Window(1, 1, 0, 0, 0), Window(2, 1, 1, 0, 1)]) == (
        "▁ █"
    )
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page


def test_commands_are_resolved_as_python_and_a_shell_would(tmp_path: Any) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert command_of([str(script), "--a"]) == [sys.executable, str(script), "--a"]
    assert command_of(["json.tool", "-x"], module=True) == [sys.executable, "-m", "json.tool", "-x"]
    assert command_of(["sh", "-c", "true"])[1:] == ["-c", "true"]
    app = tmp_path / "app"  # a folder with a __main__.py: python runs it
    app.mkdir()
    (app / "__main__.py").write_text("")
    assert command_of([str(app), "a"]) == [sys.executable, str(app), "a"]
    assert module_found("json.tool") and module_found("feedrate.running")
    assert not module_found("feedrate.no_such_module") and not module_found("no.such")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("loader = make()\nif __name__ == '__main__':\n    train(loader)\n", True),
        ("if __name__ == '__main__':\n    loader = make()\n", False),  # not found on import
        ("loader = make()\nfor batch in loader:\n    step(batch)\n", False),  # trains on import
        ("loader = make()\ntrain(loader)\n", False),
        ("def main():\n    loader = make()\n", False),
        ("loader: object = make()\n", True),
        ("loader = (\n", False),  # a file that does not parse
    ],
)
def test_a_name_is_suggested_only_where_importing_the_file_gives_it(
    tmp_path: Path, body: str, expected: bool
) -> None:
    path = tmp_path / "train.py"
    path.write_text(body)
    assert importable(str(path), "loader") is expected


def test_a_run_ended_by_a_real_time_signal_gets_a_verdict() -> None:
    from feedrate.running.gather import _nothing_back
    from feedrate.running.launch import Outcome

    rt = signal.SIGRTMIN + 6  # no name of its own in signal.Signals
    said = _nothing_back([], Outcome(exit_code=128 + rt, signal=rt, wall_s=1.0))
    assert f"ended by signal {rt}" in said
    assert "ended by SIGKILL" in _nothing_back([], Outcome(137, signal.SIGKILL, 1.0))


def test_a_stream_that_keeps_its_worker_count_gets_no_other() -> None:
    """Probed as the script ended: copies at 2 workers are an error and the step is to split
    the stream; a stream not seen split keeps its count; either way no worker count is
    advised, where one would be without the probe's answer."""
    two = LoaderConfig(num_workers=2)
    plain = run_of(config=two, main_cpu_in_next=0.02)
    assert any("num_workers=" in s and "try" in s for s in rules.next_step(plain, ["t.py"], 64))
    copies = run_of(config=two, main_cpu_in_next=0.02, stream_kept="the same", stream_copies=True)
    (dup,) = [f for f in rules.findings(copies, {}, 2) if f.id == "iterable-duplicates"]
    assert dup.severity == "error" and "num_workers=2" in dup.message
    steps = rules.next_step(copies, ["t.py"], 64)
    assert "split the stream by worker" in steps[0]
    assert not any("try" in s and "num_workers=" in s for s in steps)
    kept = run_of(config=two, main_cpu_in_next=0.02, stream_kept="too few to tell")
    assert "iterable-duplicates" not in [f.id for f in rules.findings(kept, {}, 2)]
    steps = rules.next_step(kept, ["t.py"], 64)
    assert steps[0] == "keep num_workers=2 until the stream splits by worker: too few to tell"
