"""``feedrate run`` end to end, as a user runs it: the script's own output, arguments and exit
status; the loaders found with where they were built and what they delivered, counted exactly;
a starved loop against a fed one (sleeps with a large margin, so a busy machine cannot flip
them); a crash, Ctrl-C, bad input; torchrun's ranks gathered; --autotune's batches unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from feedrate.running import sites

from commands import feedrate_cli
from faults import start_cli
from jobs import pythonpath

SCRIPTS = Path(__file__).resolve().parent / "run_scripts"
TRAIN = SCRIPTS / "train.py"


def line_of(path: Path, text: str) -> int:
    """The 1-based line of ``path`` where ``text`` first appears."""
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)


def feedrate_run(*args: str, cwd: Path = SCRIPTS, env: dict[str, str] | None = None) -> Any:
    return feedrate_cli("run", *args, cwd=cwd, env=env, timeout=120)


def test_the_script_keeps_its_output_argv_main_and_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    page = tmp_path / "run.html"
    args = ["--batches", "3", "--epochs", "2", "--exit", "7", "--print-batches"]
    done = feedrate_run("--json", str(out), "--html", str(page), "train.py", *args)
    assert done.returncode == 7, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"argv={['train.py', *args]!r} name=__main__"
    assert lines[1:4] == [f"batch {[float(i) for i in range(4 * b, 4 * b + 4)]}" for b in range(3)]
    assert "feedrate" not in done.stdout  # the report goes to stderr
    assert done.stderr.startswith("done\n")  # the script's own stderr comes first
    doc = json.loads(out.read_text())
    assert doc["schema"] == "feedrate.run/1" and doc["exit_code"] == 7
    assert doc["command"] == ["train.py", *args]
    (loader,) = doc["loaders"]
    assert loader["created_at"] == f"train.py:{line_of(TRAIN, 'loader = DataLoader(')}"
    assert (loader["batches"], loader["samples"], loader["epochs"]) == (6, 24, 2)
    assert (loader["config"]["num_workers"], loader["config"]["pin_memory"]) == (0, False)
    for key in ("wait_s", "step_s", "stall", "timeline", "startup_s", "next_step", "findings"):
        assert key in loader
    assert sum(w["batches"] for w in loader["timeline"]) == 6
    assert len(loader["epoch_restart_s"]) == 1
    assert "<img" in page.read_text()


def test_a_starved_loop_stalls_and_a_fed_one_is_told_plainly(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = feedrate_run("--json", str(out), "two_loaders.py")
    assert done.returncode == 0, done.stderr
    by_name = {ld["name"].rpartition(":")[2]: ld for ld in json.loads(out.read_text())["loaders"]}
    starved, fed = by_name["starved"], by_name["fed"]
    assert starved["stall"] > 0.5 and fed["stall"] < 0.2
    assert (starved["batches"], starved["samples"], fed["batches"]) == (8, 32, 8)
    assert fed["bottleneck"] == "consumer"
    assert "model is the bottleneck" in fed["next_step"][0]
    assert starved["bottleneck"] != "consumer"
    assert any(f["id"] == "data-stall" for f in starved["findings"])
    assert any("feedrate tune two_loaders.py:starved" in s for s in starved["next_step"])
    assert "training waits on data" in done.stderr


def test_a_loader_is_seen_after_torch_was_only_looked_up(tmp_path: Path) -> None:
    # transformers and datasets call importlib.util.find_spec("torch") before importing it:
    # the import after that look-up is patched too (it was not: "no DataLoader was iterated").
    out = tmp_path / "run.json"
    done = feedrate_run("--json", str(out), "spec_first.py")
    assert done.returncode == 0, done.stderr
    (loader,) = json.loads(out.read_text())["loaders"]
    assert (loader["batches"], loader["epochs"]) == (16, 2)


def test_an_evaluation_loader_is_shown_apart(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = feedrate_run("--json", str(out), "-m", "train", "--batches", "6", "--eval", "2")
    assert done.returncode == 0, done.stderr
    assert "name=__main__" in done.stdout
    roles = {
        ld["created_at"].rpartition(":")[2]: ld["role"]
        for ld in json.loads(out.read_text())["loaders"]
    }
    assert roles == {
        str(line_of(TRAIN, "loader = DataLoader(")): "train",
        str(line_of(TRAIN, "val = DataLoader(")): "eval",
    }
    assert "eval loader" in done.stderr


@pytest.mark.parametrize("autotune", [False, True])
def test_a_loader_iterated_in_an_evaluation_function_is_an_eval_loader(
    tmp_path: Path, autotune: bool
) -> None:
    out = tmp_path / "run.json"
    flags = ["--autotune"] if autotune else []
    done = feedrate_run(*flags, "--json", str(out), "eval_function.py")
    assert done.returncode == 0, done.stderr
    by_name = {ld["name"].rpartition(":")[2]: ld for ld in json.loads(out.read_text())["loaders"]}
    assert (by_name["train"]["role"], by_name["val"]["role"]) == ("train", "eval")
    assert by_name["val"]["autotune"] is None  # left as it is
    assert (by_name["val"]["batches"], by_name["train"]["batches"]) == (8, 32)


def test_a_crash_keeps_the_scripts_traceback_first_and_its_exit_status() -> None:
    done = feedrate_run("train.py", "--batches", "2", "--crash")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    error = done.stderr.index("RuntimeError: the script's own failure")
    assert error < done.stderr.index("feedrate run")


def test_a_script_killed_by_a_signal_is_said_so_and_leaves_no_worker(tmp_path: Path) -> None:
    # SIGKILL: no exit handler runs, so no report is written; the verdict must not claim that
    # no loader was iterated, and the workers it left are stopped with its process group.
    out = tmp_path / "run.json"
    args = ["--batches", "4", "--workers", "2", "--signal", str(int(signal.SIGKILL))]
    before = {p.pid for p in psutil.process_iter()}
    here = {**os.environ, "TMPDIR": str(tmp_path)}  # what the killed script leaves: here
    done = feedrate_run("--json", str(out), "train.py", *args, env=here)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    doc = json.loads(out.read_text())
    assert (
        "ended by SIGKILL" in doc["verdict"] and "no DataLoader was iterated" not in doc["verdict"]
    )
    time.sleep(0.5)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and "train.py" in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []


LIBRARY = """from torch.utils.data import DataLoader, SubsetRandomSampler
def make(ds):
    return (DataLoader(ds, batch_size=4, sampler=SubsetRandomSampler(range(0, 48))),
            DataLoader(ds, batch_size=8, sampler=SubsetRandomSampler(range(48, 64))))
"""

SCRIPT = """import torch
from mylib import make
train, val = make(torch.arange(64.0))
for _ in range(2):
    for batch in train:
        pass
    with torch.no_grad():
        seen = sorted(int(x) for batch in val for x in batch)
    print("val", min(seen), len(seen))
"""


@pytest.mark.parametrize("autotune", [False, True])
def test_two_loaders_one_library_call_builds_stay_two(tmp_path: Path, autotune: bool) -> None:
    # Both are shown at the user's line (the library's frames skipped); they must not become
    # one loader: under --autotune the evaluation loop was fed the training loader's batches.
    lib = tmp_path / "site-packages"
    lib.mkdir()
    (lib / "mylib.py").write_text(LIBRARY)
    (tmp_path / "two.py").write_text(SCRIPT)
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(lib), env.get("PYTHONPATH", "")])
    out = tmp_path / "run.json"
    flags = ["--autotune"] if autotune else []
    done = feedrate_run(*flags, "--json", str(out), "two.py", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["val 48 16", "val 48 16"]  # its own samples, each time
    roles = sorted(ld["role"] for ld in json.loads(out.read_text())["loaders"])
    assert roles == ["eval", "train"]


def test_a_script_s_own_autotune_is_followed_as_its_loader(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path / "cache")}
    done = feedrate_run("--json", str(out), "own_autotune.py", env=env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert len(doc["processes"]) == 1  # the script's: not each of autotune's workers too
    (loader,) = doc["loaders"]  # the loader the script built, its epochs autotune's
    assert loader["created_at"].startswith("own_autotune.py:")
    assert (loader["epochs"], loader["batches"], loader["samples"]) == (2, 32, 128)
    change = loader["autotune"]
    assert change is not None and change["error"] is None and change["after"] is not None
    assert change["report"]["schema"] == "feedrate.autotune/1"
    assert "autotune: w=0 → " in done.stderr, done.stderr
    assert "could not follow" not in doc["verdict"]


def test_workers_of_a_loader_the_script_let_go_end_as_without_feedrate() -> None:
    done = feedrate_run("loaders_let_go.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["live 0"] * 3, done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr


def test_workers_that_end_with_a_short_epoch_are_read_before_they_go(tmp_path: Path) -> None:
    # Each epoch's two workers compute 0.4 s of CPU each and exit with the epoch, before the
    # next reading a second later: read only then, their CPU was a fraction of it (21% of a
    # core where they used 55%, and a CPU-bound loader was called latency-bound).
    out = tmp_path / "run.json"
    done = feedrate_run("--json", str(out), "short_epochs.py", "--epochs", "2")
    assert done.returncode == 0, done.stderr
    loader = json.loads(out.read_text())["loaders"][0]
    cpu_s = loader["workers"]["cpu_util"] * (loader["wait_s"] + loader["step_s"])
    assert cpu_s >= 0.9 * 2 * 2 * 0.4, loader  # 2 epochs × 2 workers × 0.4 s
    assert loader["workers"]["processes"] == 4


def test_a_report_written_while_workers_die_is_not_lost(tmp_path: Path) -> None:
    # SIGTERM to the whole group: workers die while the script's report is written, and
    # torch's SIGCHLD handler raised inside it ("report was lost", in half of the runs).
    code = (
        "import os, signal, time, json\n"
        "from feedrate.running import agent\n"
        "def died(*_):\n"
        "    raise RuntimeError('DataLoader worker (pid 1) is killed by signal: Terminated.')\n"
        "signal.signal(signal.SIGCHLD, died)\n"
        "agent.start()\n"
        "def report():\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "    time.sleep(0.3)\n"  # the child ends meanwhile: SIGCHLD
        "    return {'written': True}\n"
        "agent.report = report\n"
        "agent.write_report()\n"
    )
    env = {**os.environ, "FEEDRATE_RUN_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "was lost" not in done.stderr
    (written,) = tmp_path.glob("*.json")
    assert json.loads(written.read_text()) == {"written": True}


REBUILT = """
import torch
from torch.utils.data import DataLoader, Dataset

class Files(Dataset):
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.tensor(i)

def make(n):
    return DataLoader(Files(n), batch_size=4)

for epoch in range(3):
    for batch in DataLoader(Files(64), batch_size=4):  # a new dataset every epoch
        pass
train, val = make(32), make(32)  # two beside each other, at one line
for loader in (train, val):
    for batch in loader:
        pass
"""


def test_a_loader_built_again_over_a_new_dataset_every_epoch_is_one_loader(
    tmp_path: Path,
) -> None:
    # It was a new loader each epoch wherever Python gave the new dataset a new id().
    (tmp_path / "rebuilt.py").write_text(REBUILT)
    out = tmp_path / "run.json"
    done = feedrate_run("--json", str(out), "rebuilt.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = sorted(
        (ld["created_at"], ld["epochs"], ld["batches"])
        for ld in json.loads(out.read_text())["loaders"]
    )
    assert found == [("rebuilt.py:14", 1, 8), ("rebuilt.py:14", 1, 8), ("rebuilt.py:17", 3, 48)]


def test_the_trainer_that_built_a_loader_is_the_outermost_on_the_stack() -> None:
    # transformers' Trainer builds its loaders through accelerate: its advice is the Trainer's.
    def here() -> str | None:
        return sites.built_by(sys._getframe())

    accelerate: dict[str, Any] = {"__name__": "accelerate.data_loader", "here": here}
    exec("def prepare():\n    return here()", accelerate)
    trainer: dict[str, Any] = {"__name__": "transformers.trainer", "inner": accelerate["prepare"]}
    exec("def get_train_dataloader():\n    return inner()", trainer)
    assert trainer["get_train_dataloader"]() == "transformers"
    assert accelerate["prepare"]() == "accelerate"
    assert here() is None


def test_sigterm_while_the_report_is_written_ends_the_process_after_it(tmp_path: Path) -> None:
    # A Pool ends its forked workers with SIGTERM as they write their reports at exit: one of
    # two reports was lost in 5 of 8 runs (the process died mid-write), and the run said "no
    # DataLoader was iterated".
    code = (
        "import os, signal, time\n"
        "from feedrate.running import agent\n"
        "agent.start()\n"
        "signal.signal(signal.SIGTERM, agent._on_sigterm)\n"  # as at the first loader iterated
        "def report():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"  # the handler has run meanwhile
        "    return {'written': True}\n"
        "agent.report = report\n"
        "agent.write_report()\n"
        "print('not reached')\n"
    )
    env = {**os.environ, "FEEDRATE_RUN_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGTERM, done.stderr  # ended by it, once written
    assert "not reached" not in done.stdout
    (written,) = tmp_path.glob("*.json")
    assert json.loads(written.read_text()) == {"written": True}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no script or command given"),
        (("missing.py",), "no such script: missing.py"),
        (("-m", "no_such_module.here"), "no module named 'no_such_module.here'"),
        (("no-such-command-anywhere",), "no such script or command"),
    ],
    ids=["no script", "missing file", "missing module", "missing command"],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = feedrate_run(*args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("feedrate: error: ")
    assert message in done.stderr


def test_ctrl_c_exits_130_and_leaves_no_process() -> None:
    proc = start_cli("run", str(TRAIN), "--hang", "--workers", "2", "--batches", "4")
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    while "hanging" not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    kids = psutil.Process(proc.pid).children(recursive=True)
    assert len(kids) >= 3  # the script and its two workers
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "KeyboardInterrupt" in err and "interrupted" in err
    time.sleep(0.2)
    alive = [k.pid for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def _torchrun() -> str | None:
    from feedrate.running.launch import found_command

    return found_command("torchrun")


@pytest.mark.skipif(_torchrun() is None, reason="torchrun is not installed here")
@pytest.mark.parametrize(
    "launch",
    [("--", "torchrun", "--nproc_per_node=2"), ("--nproc-per-node", "2")],
    ids=["torchrun", "nproc-per-node"],
)
def test_torchrun_ranks_are_followed_and_gathered(
    tmp_path: Path, short_tmp: str, launch: tuple[str, ...]
) -> None:
    out = tmp_path / "run.json"
    # TMPDIR: torchrun's torchelastic_* log folder goes with the test's own.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": short_tmp}
    done = feedrate_run("--json", str(out), *launch, "ddp.py", env=env)
    assert done.returncode == 0, done.stderr
    assert "rank 0 done" in done.stdout and "rank 1 done" in done.stdout
    doc = json.loads(out.read_text())
    ranks = sorted((ld["rank"], ld["batches"], ld["samples"]) for ld in doc["loaders"])
    assert ranks == [(0, 32, 128), (1, 32, 128)], done.stderr
    assert {p["world_size"] for p in doc["processes"]} == {2}
    assert " ".join(done.stderr.split()).count("also rank ") == 1  # one report, every rank


@pytest.mark.skipif(_torchrun() is None, reason="torchrun is not installed here")
def test_run_under_torchrun_reports_rank_zero_once(tmp_path: Path, short_tmp: str) -> None:
    # Each rank's feedrate run follows its own rank: rank 0 reports, and says how to see all.
    out = tmp_path / "run.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": short_tmp}
    torchrun = [str(_torchrun()), "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*torchrun, "-m", "feedrate", "run", "--json", str(out), "ddp.py"],
        capture_output=True,
        text=True,
        cwd=SCRIPTS,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("feedrate run ddp.py") == 1, done.stderr  # rank 0's report only
    assert "this is rank 0's report only" in " ".join(done.stderr.split())
    doc = json.loads(out.read_text())
    assert [ld["rank"] for ld in doc["loaders"]] == [0]


def test_nproc_per_node_refuses_a_command_that_is_a_launcher() -> None:
    done = feedrate_run("--nproc-per-node", "2", "--", "true")
    assert done.returncode == 2 and "give the script itself" in done.stderr


def test_autotune_yields_the_same_batches_in_the_same_order(tmp_path: Path) -> None:
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path / "cache")}
    args = ["train.py", "--batches", "60", "--data-s", "0.02", "--step-s", "0.01"]
    args += ["--shuffle", "--print-batches"]
    plain = feedrate_run(*args, env=env)
    out = tmp_path / "run.json"
    tuned = feedrate_run("--autotune", "--json", str(out), *args, env=env)
    assert plain.returncode == tuned.returncode == 0, tuned.stderr
    batches = [ln for ln in plain.stdout.splitlines() if ln.startswith("batch")]
    assert len(batches) == 60 and len(set(batches)) == 60
    assert [ln for ln in tuned.stdout.splitlines() if ln.startswith("batch")] == batches
    (loader,) = json.loads(out.read_text())["loaders"]
    change = loader["autotune"]
    assert change is not None and change["error"] is None
    # autotune ran the loader: started past one worker per CPU (it mostly waits), no trial
    # concluded within 60 batches of so many workers' warm-up.
    assert change["after"]["num_workers"] > 2 and "projected" in change["report"]["started_from"]
    assert (loader["batches"], loader["samples"]) == (60, 240)


def test_autotune_falls_back_to_observing_a_loader_it_cannot_wrap(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    env = {**os.environ, "FEEDRATE_CACHE_DIR": str(tmp_path / "cache")}
    done = feedrate_run("--autotune", "--json", str(out), "fixed_loader.py", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "samples 40\n"
    (loader,) = json.loads(out.read_text())["loaders"]
    assert (loader["batches"], loader["samples"]) == (10, 40)
    assert "cannot rebuild Fixed" in loader["autotune"]["error"]
    assert "autotune could not wrap it" in done.stderr


def test_sigterm_is_passed_on_and_the_report_still_comes(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = start_cli("run", "--json", str(out), str(TRAIN), "--hang", "--batches", "4")
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    while "hanging" not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True and doc["exit_code"] == 143
    (loader,) = doc["loaders"]
    assert loader["batches"] == 1  # written by the script's process as SIGTERM ended it


def test_a_script_that_catches_ctrl_c_and_ends_as_usual_was_not_interrupted(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run.json"
    proc = start_cli("run", "--json", str(out), str(SCRIPTS / "handles_sigint.py"))
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    while "ready" not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "caught" in rest
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is False and doc["exit_code"] == 0
    assert "SIGINT" not in err, err


def test_a_signal_delivered_twice_at_once_reaches_the_script_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `timeout -s INT` signals feedrate and then its own process group, feedrate among it: the
    # second copy, passed on too, hit DataLoader workers already exiting on the first
    # (tracebacks from their queues' feeder threads). A later signal is the user's again.
    monkeypatch.setenv("FEEDRATE_TEST_LISTEN_S", "5")
    proc = start_cli(
        "run", "--json", str(tmp_path / "run.json"), str(SCRIPTS / "handles_sigint.py")
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    while "ready" not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(2.5)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "caught 2" in rest, (rest, err)


def test_the_interpreters_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the user sitecustomize', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": pythonpath(tmp_path)}
    out = tmp_path / "run.json"
    done = feedrate_run("--json", str(out), "train.py", "--batches", "2", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "the user sitecustomize"
    assert json.loads(out.read_text())["loaders"][0]["batches"] == 2


@pytest.mark.parametrize("split", [False, True])
def test_a_stream_that_repeats_in_every_worker_is_named_and_gets_no_worker_count(
    tmp_path: Path, split: bool
) -> None:
    """The stream (built in main(), gone by the script's end) is probed at its first epoch (2
    workers): one that yields the whole stream in each worker is an error, its figures said to
    count the copies, and the advice is to split it, never another num_workers, nor a
    bottleneck read from the copies (QA's unsplit stream was advised 51 workers); a split one
    has no such finding; no probe's worker is left running."""
    out = tmp_path / "run.json"
    before = {p.pid for p in psutil.process_iter()}
    done = feedrate_run("--json", str(out), "streams.py", *(["--split"] if split else []))
    assert done.returncode == 0, done.stderr
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and "streams.py" in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []
    assert ("samples an epoch 256" if split else "samples an epoch 512") in done.stdout
    (loader,) = json.loads(out.read_text())["loaders"]
    ids = [f["id"] for f in loader["findings"]]
    if split:
        assert loader["stream_kept"] is None and not loader["stream_copies"]
        assert "iterable-duplicates" not in ids
        return
    assert loader["stream_copies"] and "same samples" in loader["stream_kept"]
    (dup,) = [f for f in loader["findings"] if f["id"] == "iterable-duplicates"]
    assert dup["severity"] == "error" and "count the copies" in dup["message"]
    assert "get_worker_info()" in dup["fix"]
    assert not any("num_workers=" in s and "try" in s for s in loader["next_step"])
    assert "split the stream by worker" in loader["next_step"][0]
    assert "bottleneck" not in ids and "iterable-duplicates" in done.stderr
