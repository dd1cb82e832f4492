"""``measuring.runqueue``: a loop's time queued for a CPU, read from the kernel, and moved from
its wait to its step."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedrate.measuring.runqueue import (
    Marks,
    ThreadQueued,
    beside,
    busy,
    never,
    of_loop,
    split,
    wait_and_step,
)

LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/thread-self/schedstat")


@given(
    wait=st.floats(0, 10, allow_nan=False),
    step=st.floats(0, 10, allow_nan=False),
    queued=st.floats(-1, 20, allow_nan=False),
)
def test_split_moves_at_most_the_wait_and_keeps_the_total(
    wait: float, step: float, queued: float
) -> None:
    w, s = split(wait, step, queued)
    assert 0.0 <= w <= wait and s >= step
    assert w + s == pytest.approx(wait + step)


def test_wait_and_step_take_the_queue_of_the_wait_only() -> None:
    # asked at 1.0 (queued 0.5 so far), got it at 1.3 (queued 0.6), asked again at 2.0
    assert wait_and_step((1.0, 0.5, 0.0), (1.3, 0.6, 0.1), (2.0, 0.9, 0.7)) == pytest.approx(
        (0.2, 0.8)
    )
    assert busy((1.0, 0.5, 0.0), (1.3, 0.6, 0.1)) == pytest.approx(0.1)  # on a CPU in next()
    # No workers: the loop's thread made the batch in next(), queued or not: all of it waits.
    no_workers = wait_and_step((1.0, 0.5, 0.0), (1.3, 0.6, 0.1), (2.0, 0.9, 0.7), workers=False)
    assert no_workers == pytest.approx((0.3, 0.7))


def test_the_loop_s_queue_is_read_only_where_workers_make_the_batches() -> None:
    assert of_loop(time.perf_counter, 0) is never
    assert isinstance(of_loop(time.perf_counter, 2), ThreadQueued)
    assert of_loop(lambda: 0.0, 2) is never  # a fake clock: no queue to read beside it


def test_a_mark_not_exact_reads_the_clock_alone_and_counts_as_no_queue() -> None:
    # While autotune watches, a stall under the margin needs no correction: the clock alone.
    reads: list[str] = []
    marks = Marks(lambda: 1.0, lambda: reads.append("queued") or 0.5)
    full = marks()
    marks.exact = False
    lean = marks()
    assert reads == ["queued"] and lean[0] == 1.0
    later = (1.3, lean[1], lean[2])
    for asked, got in ((full, later), (lean, later), (lean, (1.3, 0.6, 0.1))):
        assert wait_and_step(asked, got, (2.0, 0.9, 0.7)) == pytest.approx((0.3, 0.7))
        assert busy(asked, got) == 0.0


def test_a_fake_clock_reads_no_run_queue() -> None:
    fake = iter(range(100)).__next__
    assert beside(fake) is never
    assert Marks(fake, lambda: 7.0)() == (0, 7.0, 0.0)  # no time on a CPU read either
    assert isinstance(beside(time.perf_counter), ThreadQueued)


@pytest.mark.skipif(not LINUX, reason="the run queue is read from Linux's schedstat")
def test_a_thread_sharing_its_cpu_with_a_busy_process_is_seen_queued() -> None:
    # This thread and a busy loop pinned to one CPU: each runs about half the time, so the
    # thread's run-queue time grows while it spins. Load elsewhere only adds to it.
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile 1: pass"]
    )
    mask = os.sched_getaffinity(0)
    queued = ThreadQueued()
    try:
        os.sched_setaffinity(threading.get_native_id(), {cpu})
        time.sleep(0.2)  # the busy loop is running
        before = queued()
        spun = time.thread_time() + 0.2
        while time.thread_time() < spun:
            pass
        assert queued() - before > 0.01
    finally:
        os.sched_setaffinity(threading.get_native_id(), mask)
        busy.kill()
        busy.wait()
        queued.close()


def test_a_mark_reads_the_thread_s_time_on_a_cpu_to_within_a_batch() -> None:
    # The loop's time on a CPU while it waits in next() is the hand-off's cost in the main
    # process: all of a short spin (a small batch arrives in a millisecond or two, under a
    # scheduler tick, which schedstat's CPU time of a running thread lags by), none of a sleep.
    marks = Marks(time.perf_counter)
    for _ in range(20):
        before, cpu = marks(), time.thread_time()
        spun = time.perf_counter() + 0.002
        while time.perf_counter() < spun:  # no system call: nothing brings the kernel's count up
            pass
        spinning = marks()
        cpu = time.thread_time() - cpu
        assert busy(before, spinning) == pytest.approx(cpu, abs=0.0005)
    time.sleep(0.05)
    assert busy(spinning, marks()) < 0.01
