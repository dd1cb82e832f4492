"""``feedrate.distributed.forks``: before a fork in a distributed job, on the Pythons whose
children can inherit the thread-state lock held (gh-112275), wait until no C++ thread is
running; which Pythons; which threads count as busy; and that it is installed where feedrate
talks over ``torch.distributed``. (That the wait takes the hangs away is counted in
``benchmarks/fork_guard.py``: it depends on timing.)"""

from __future__ import annotations

import _thread
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from feedrate.distributed import forks


@pytest.mark.parametrize(
    ("version", "hangs"),
    [
        ((3, 11, 7), True),  # this machine's: the hang was seen here
        ((3, 11, 9), True),
        ((3, 11, 10), False),
        ((3, 10, 14), True),
        ((3, 10, 15), False),
        ((3, 9, 20), False),
        ((3, 12, 0), False),
        ((3, 13, 1), False),
    ],
)
def test_the_pythons_whose_fork_can_hang(version: tuple[int, int, int], hangs: bool) -> None:
    assert forks.affected(version) is hangs


def test_a_fork_waits_until_no_unknown_thread_runs() -> None:
    states = [{101, 102}, {102}, set()]  # two C++ threads busy, then one, then none
    slept: list[float] = []
    left = forks.wait_quiet(lambda: states.pop(0), 1.0, sleep=slept.append, clock=lambda: 0.0)
    assert left == set() and len(slept) == 2 and states == []


def test_a_fork_waits_no_longer_than_its_limit() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += 0.03

    left = forks.wait_quiet(lambda: {7}, 0.1, sleep=sleep, clock=lambda: now[0])
    assert left == {7}  # a thread that spins costs each fork the limit, then it goes ahead
    assert 0.1 <= now[0] < 0.15


def task_dir(tmp_path: Path, states: dict[int, tuple[str, str]]) -> str:
    tmp_path.mkdir(exist_ok=True)
    for tid, (comm, state) in states.items():
        folder = tmp_path / str(tid)
        folder.mkdir()
        (folder / "stat").write_text(f"{tid} ({comm}) {state} 1 2 3 4\n")
    return str(tmp_path)


def test_running_runnable_and_uninterruptible_threads_are_busy(tmp_path: Path) -> None:
    states = {
        1: ("python", "R"),  # known to Python: left out
        2: ("gloo) S (x", "R"),  # a name with parentheses and spaces: the state is after it
        3: ("python", "S"),  # asleep (a lock, a condition, epoll): cannot be in the window
        4: ("python", "D"),
        5: ("python", "Z"),
    }
    assert forks.busy_threads({1}, task_dir(tmp_path, states)) == {2, 4}


@pytest.mark.parametrize("through", ["libc", "python"])
def test_a_state_is_read_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    # Read through libc, keeping the GIL (no other Python thread runs between the last look
    # and the fork); through Python's own files where libc cannot be loaded.
    if through == "python":
        monkeypatch.setattr(forks, "_libc", lambda: None)
    stat = tmp_path / "stat"
    stat.write_bytes(b"7 (gloo) R 1 2 3\n")
    assert forks.read_holding_gil(str(stat)) == b"7 (gloo) R 1 2 3\n"
    assert forks.read_holding_gil(str(tmp_path / "gone")) is None
    assert forks.busy_threads(set(), task_dir(tmp_path / "t", {9: ("x", "R")})) == {9}


def test_the_real_threads_states_are_read() -> None:
    # This thread runs as it reads; a thread waiting on an event sleeps.
    me = threading.get_native_id()
    event = threading.Event()
    sleeper = threading.Thread(target=event.wait, name="test-sleeper")
    sleeper.start()
    try:
        assert sleeper.native_id is not None
        asleep = 0
        for _ in range(500):  # until seen asleep twice in a row (on the event, not the GIL)
            asleep = asleep + 1 if sleeper.native_id not in forks.busy_threads(set()) else 0
            if asleep == 2:
                break
            time.sleep(0.01)
        busy = forks.busy_threads(set())
        assert me in busy
        assert sleeper.native_id not in busy
        assert me not in forks.busy_threads({me})
    finally:
        event.set()
        sleeper.join()


def test_the_wait_runs_before_a_fork_only_in_a_distributed_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waited: list[set[int]] = []
    monkeypatch.setattr(forks, "wait_quiet", lambda busy, limit: waited.append(busy()) or set())
    looked: list[set[int]] = []
    monkeypatch.setattr(forks, "busy_threads", lambda known: looked.append(known) or {-1})
    job = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", job)
    forks._before_fork()
    assert waited == []  # torch.distributed not initialized: no C++ thread of its to wait for
    job.is_initialized = lambda: True
    forks._before_fork()
    assert waited == [{-1}]
    # The forking thread (running, always) and the others Python runs are left out.
    assert threading.get_native_id() in looked[0]
    assert threading.main_thread().native_id in looked[0]


def test_a_foreign_thread_that_once_ran_python_is_still_watched() -> None:
    # A thread Python did not start gets a dummy entry in threading for good once its code
    # asks for its thread (a callback, logging): it is still a thread to wait for.
    seen: list[int] = []
    done = threading.Event()

    def foreign() -> None:
        threading.current_thread()  # registers the dummy
        seen.append(threading.get_native_id())
        done.set()

    _thread.start_new_thread(foreign, ())
    assert done.wait(10)
    assert seen[0] not in forks.python_threads()
    assert threading.get_native_id() in forks.python_threads()


def test_a_failing_wait_never_fails_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> set[int]:
        raise OSError("no /proc")

    monkeypatch.setattr(forks, "wait_quiet", broken)
    job = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", job)
    forks._before_fork()  # no exception


def test_installed_once_and_only_where_forks_can_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(os, "register_at_fork", lambda before: registered.append(before))
    monkeypatch.setattr(forks, "_installed", False)
    monkeypatch.setattr(forks, "affected", lambda: False)
    assert forks.guard_forks() is False and registered == []
    monkeypatch.setattr(forks, "affected", lambda: True)
    assert forks.guard_forks() is True and forks.guard_forks() is True
    assert registered == [forks._before_fork]  # once, however often feedrate asks


def test_feedrate_guards_forks_wherever_it_talks_to_the_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from feedrate.autotuning import meeting
    from feedrate.distributed import channel

    calls: list[str] = []
    monkeypatch.setattr(forks, "guard_forks", lambda: calls.append("guard") or True)
    monkeypatch.setattr(channel.dist, "get_world_size", lambda: calls.append("world") or 2)
    monkeypatch.setattr(channel.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(
        channel.dist, "new_group", lambda **kw: (_ for _ in ()).throw(RuntimeError("down"))
    )
    with pytest.raises(channel.RankError):
        channel.Channel.open("test", 1.0)
    assert calls[:2] == ["guard", "world"]  # before any collective
    calls.clear()
    monkeypatch.setattr(meeting.group, "active", lambda: True)
    auto: Any = SimpleNamespace(_coordinate=False, _joined=False)
    meeting.Meeting._join(auto)
    assert calls == ["guard"] and auto._joined  # not coordinating: its lanes still fork
