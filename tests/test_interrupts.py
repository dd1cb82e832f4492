"""Ctrl-C stops a run even where Python loses the KeyboardInterrupt (a fork handler, a
``__del__``), and the workers are gone afterwards; they are gone too when the run is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from feedrate.measuring import interrupts

from faults import default_signals, wait_for_children


@pytest.fixture(autouse=True)
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler, as in a terminal: a test run started in the background
    (``cmd &``) inherits SIGINT ignored, which feedrate rightly leaves alone."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _swallowed_interrupt() -> None:
    """A SIGINT that lands inside ``__del__``: Python prints "Exception ignored" and goes on."""

    class Dies:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here, inside __del__

    Dies()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # that is the point
def test_a_lost_interrupt_is_raised_again_at_the_next_check() -> None:
    with interrupts.stoppable():
        _swallowed_interrupt()  # no exception escapes
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    interrupts.check()  # outside, nothing is pending any more
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_program_with_its_own_sigint_handler_is_left_alone() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with interrupts.stoppable():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            interrupts.check()  # its handler took it: nothing to raise
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import psutil
    from torch.utils.data import DataLoader
    import feedrate
    from pipelines import SleepDataset

    fired = []

    def interrupt_during_fork():
        # As Ctrl-C pressed while DataLoader forks its second worker: the KeyboardInterrupt is
        # raised inside os.fork's handler, where Python ignores it.
        if len(fired) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        fired.append(1)

    os.register_at_fork(after_in_parent=interrupt_during_fork)
    loader = DataLoader(SleepDataset(4096, sleep_s=0.01), batch_size=4)
    began = time.monotonic()
    try:
        feedrate.measure(loader, feedrate.LoaderConfig(3), seconds=30)
    except KeyboardInterrupt:
        left = psutil.Process().children(recursive=True)
        print("interrupted after", round(time.monotonic() - began, 1), "s; left", len(left))
        sys.exit(0 if not left else 1)
    print("not interrupted")
    sys.exit(1)
    """
)


def test_measure_stops_when_ctrl_c_lands_while_a_worker_is_forked(tmp_path: Path) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        preexec_fn=default_signals,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interrupted after" in done.stdout and "left 0" in done.stdout


KILLED = textwrap.dedent(
    """
    from torch.utils.data import DataLoader, Dataset
    import feedrate

    class Blobs(Dataset):
        # Batches of 1.6 MB that are no tensors go through the workers' pipe: it is always full.
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            return b"x" * 200_000

    loader = DataLoader(Blobs(), batch_size=8, collate_fn=list)
    feedrate.measure(loader, feedrate.LoaderConfig(2, prefetch_factor=4), seconds=300)
    """
)


def test_workers_leave_when_the_run_is_killed(tmp_path: Path) -> None:
    """SIGKILL (the OOM killer's, or ``kill -9``) gives feedrate no time to stop its workers:
    they leave by themselves, where torch's would wait for ever on their full pipe."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    run = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=default_signals,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # what a killed process leaves: here
    )
    workers = []
    try:
        workers = wait_for_children(run.pid, 2)
        time.sleep(1.0)  # batches on their way: each worker's feeder thread writes to the pipe
    finally:
        run.kill()
        run.wait()
    _, left = psutil.wait_procs(workers, timeout=60)
    for worker in left:
        worker.kill()
    assert not left, f"workers {[w.pid for w in left]} outlived their main process by 60 s"
