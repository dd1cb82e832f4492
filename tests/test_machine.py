"""Tests for feedrate.machine: cgroup parsing on fake trees, usable_cpus, serialization, and a
smoke test of collect() on the real machine."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedrate.cpus import usable_cpus
from feedrate.machine import cgroups
from feedrate.machine.cgroups import CpuPool, cpu_pool, parse_cpu_list
from feedrate.machine.facts import (
    MachineFacts,
    cgroup_cpu_quota,
    cgroup_memory_limit,
    collect,
    tasks_free,
)
from feedrate.measuring.processes import system_busy


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def v2_tree(tmp_path: Path, cgroup: str = "/") -> tuple[Path, Path]:
    """A fake cgroup v2 mount and /proc/self/cgroup naming ``cgroup`` as this process's group."""
    root = tmp_path / "cgroup"
    root.mkdir()
    proc = tmp_path / "proc_self_cgroup"
    write(proc, f"0::{cgroup}")
    return root, proc


def v1_tree(tmp_path: Path, cpu: str = "/", memory: str = "/") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir()
    proc = tmp_path / "proc_self_cgroup"
    write(proc, f"4:memory:{memory}\n2:cpu,cpuacct:{cpu}\n1:name=systemd:/\n0::/")
    return root, proc


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000", None), ("150000 100000", 1.5), ("50000 100000", 0.5), ("200000 50000", 4.0)],
)
def test_v2_cpu_max_at_root(tmp_path: Path, cpu_max: str, expected: float | None) -> None:
    root, proc = v2_tree(tmp_path)
    write(root / "cpu.max", cpu_max)
    assert cgroup_cpu_quota(root, proc) == expected


def test_v2_parent_with_smaller_quota_wins(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, "/kubepods/pod1/ctr")
    write(root / "kubepods/pod1/ctr/cpu.max", "400000 100000")
    write(root / "kubepods/pod1/cpu.max", "200000 100000")
    write(root / "kubepods/cpu.max", "max 100000")
    assert cgroup_cpu_quota(root, proc) == 2.0


def test_v2_own_quota_tighter_than_parent(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, "/a/b")
    write(root / "a/b/cpu.max", "100000 100000")
    write(root / "a/cpu.max", "300000 100000")
    assert cgroup_cpu_quota(root, proc) == 1.0


def test_v2_host_path_absent_in_container_falls_back_to_root(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, "/docker/abc123")
    write(root / "cpu.max", "250000 100000")
    assert cgroup_cpu_quota(root, proc) == 2.5


def test_v2_path_escaping_namespace_uses_root_only(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, "/../../outside")
    write(root / "cpu.max", "300000 100000")
    assert cgroup_cpu_quota(root, proc) == 3.0


def test_no_cgroup_files_means_unknown(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, "/x")
    assert cgroup_cpu_quota(root, proc) is None
    assert cgroup_memory_limit(root, proc) is None


def test_missing_proc_self_cgroup_still_reads_root(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "cpu.max", "100000 100000")
    assert cgroup_cpu_quota(root, tmp_path / "absent") == 1.0


@pytest.mark.parametrize("mount", ["cpu", "cpu,cpuacct"])
def test_v1_cfs_quota(tmp_path: Path, mount: str) -> None:
    root, proc = v1_tree(tmp_path)
    write(root / mount / "cpu.cfs_quota_us", "300000")
    write(root / mount / "cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) == 3.0


def test_v1_cfs_quota_minus_one_is_unlimited(tmp_path: Path) -> None:
    root, proc = v1_tree(tmp_path)
    write(root / "cpu/cpu.cfs_quota_us", "-1")
    write(root / "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) is None


def test_v1_nested_cpu_group(tmp_path: Path) -> None:
    root, proc = v1_tree(tmp_path, cpu="/job/7")
    write(root / "cpu/job/7/cpu.cfs_quota_us", "150000")
    write(root / "cpu/job/7/cpu.cfs_period_us", "100000")
    write(root / "cpu/cpu.cfs_quota_us", "-1")
    write(root / "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) == 1.5


@pytest.mark.parametrize(
    "text",
    ["", "garbage", "abc 100000", "100000 0", "100000 zero", "-5 100000", "\x00\x01"],
)
def test_malformed_v2_cpu_max_is_unknown(tmp_path: Path, text: str) -> None:
    root, proc = v2_tree(tmp_path)
    write(root / "cpu.max", text)
    assert cgroup_cpu_quota(root, proc) is None


def test_malformed_v1_cpu_files_are_unknown(tmp_path: Path) -> None:
    root, proc = v1_tree(tmp_path)
    write(root / "cpu/cpu.cfs_quota_us", "lots")
    write(root / "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) is None


def test_non_text_cgroup_file_is_unknown(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path)
    (root / "cpu.max").write_bytes(b"\xff\xfe\x00")
    (root / "memory.max").mkdir()  # a directory where a file should be: unreadable
    assert cgroup_cpu_quota(root, proc) is None
    assert cgroup_memory_limit(root, proc) is None


@pytest.mark.parametrize(
    ("memory_max", "expected"), [("max", None), ("4294967296", 4294967296), ("junk", None)]
)
def test_v2_memory_max(tmp_path: Path, memory_max: str, expected: int | None) -> None:
    root, proc = v2_tree(tmp_path, "/svc")
    write(root / "svc/memory.max", memory_max)
    assert cgroup_memory_limit(root, proc) == expected


def test_v2_memory_parent_limit_binds(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, "/a/b")
    write(root / "a/b/memory.max", "max")
    write(root / "a/memory.max", "1073741824")
    assert cgroup_memory_limit(root, proc) == 1073741824


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("2147483648", 2147483648), ("9223372036854771712", None), (str(2**60), None), ("x", None)],
)
def test_v1_memory_limit(tmp_path: Path, limit: str, expected: int | None) -> None:
    root, proc = v1_tree(tmp_path, memory="/process_api/abc")
    write(root / "memory/process_api/abc/memory.limit_in_bytes", limit)
    write(root / "memory/memory.limit_in_bytes", "9223372036854771712")
    assert cgroup_memory_limit(root, proc) == expected


def no_nproc_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)


def test_v2_tasks_left_under_the_tightest_pids_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_nproc_limit(monkeypatch)
    root, proc = v2_tree(tmp_path, "/pod/box")
    write(root / "pod/box/pids.max", "max")
    write(root / "pod/box/pids.current", "12")
    write(root / "pod/pids.max", "1024")
    write(root / "pod/pids.current", "1000")  # others in the pod hold most of it
    assert tasks_free(root, proc) == 24
    write(root / "pod/pids.max", "max")
    assert tasks_free(root, proc) is None


def test_v1_tasks_left_and_a_full_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_nproc_limit(monkeypatch)
    root, proc = tmp_path / "cgroup", tmp_path / "proc_self_cgroup"
    write(proc, "8:pids:/docker/abc\n0::/")
    write(root / "pids/docker/abc/pids.max", "100")
    write(root / "pids/docker/abc/pids.current", "130")  # lowered below what runs: none left
    assert tasks_free(root, proc) == 0


def test_tasks_left_under_ulimit_u_for_a_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import resource

    import psutil

    root, proc = v2_tree(tmp_path)
    mine = sum(
        p.info["num_threads"] or 1
        for p in psutil.process_iter(["uids", "num_threads"])
        if p.info["uids"] is not None and p.info["uids"].real == os.getuid()
    )
    monkeypatch.setattr(resource, "getrlimit", lambda _: (mine + 500, mine + 500))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert abs((tasks_free(root, proc) or 0) - 500) <= 20  # threads come and go meanwhile
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # root is not held to it
    assert tasks_free(root, proc) is None


@pytest.mark.parametrize(
    ("affinity", "quota", "expected"),
    [(8, 2.0, 2), (2, 16.0, 2), (8, 2.7, 2), (8, 0.5, 1), (8, None, 8), (4, 4.0, 4), (0, None, 1)],
)
def test_usable_cpus(affinity: int, quota: float | None, expected: int) -> None:
    assert usable_cpus(affinity, quota) == expected


def test_collect_uses_injected_cgroup_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_nproc_limit(monkeypatch)
    root, proc = v2_tree(tmp_path, "/job")
    write(root / "job/cpu.max", "50000 100000")
    write(root / "job/memory.max", "536870912")
    write(root / "job/pids.max", "300")
    write(root / "job/pids.current", "42")
    facts = collect(cgroup_root=root, proc_self_cgroup=proc, shm_path=tmp_path / "no_shm")
    assert facts.cpu_quota == 0.5
    assert facts.cpus_usable == 1
    assert facts.memory_limit_bytes == 536870912
    assert facts.shm_total_bytes is None
    assert facts.shm_free_bytes is None
    assert facts.tasks_free == 258


def test_collect_on_this_machine() -> None:
    facts = collect()
    assert facts.cpus_usable >= 1
    assert facts.cpus_usable <= facts.cpus_affinity
    assert facts.memory_total_bytes is not None and facts.memory_total_bytes > 0
    assert facts.accelerator in ("cuda", "mps", "none")
    assert (facts.accelerator == "none") == (facts.accelerator_count == 0)
    assert facts.start_method is not None
    d = facts.to_dict()
    assert MachineFacts.from_dict(json.loads(json.dumps(d))) == facts


def test_collect_does_not_fix_the_start_method() -> None:
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    collect()
    assert multiprocessing.get_start_method(allow_none=True) == before


small_ints = st.none() | st.integers(min_value=0, max_value=2**63)
facts_strategy = st.builds(
    MachineFacts,
    cpu_count=small_ints,
    cpu_quota=st.none() | st.floats(min_value=0.01, max_value=1e4),
    memory_total_bytes=small_ints,
    memory_available_bytes=small_ints,
    memory_limit_bytes=small_ints,
    thread_env=st.dictionaries(st.sampled_from(["OMP_NUM_THREADS", "MKL_NUM_THREADS"]), st.text()),
)


@settings(deadline=None, max_examples=50)
@given(facts_strategy)
def test_round_trip_through_json(facts: MachineFacts) -> None:
    restored = MachineFacts.from_dict(json.loads(json.dumps(facts.to_dict())))
    assert restored == facts


def test_from_dict_ignores_unknown_keys() -> None:
    facts = collect()
    d = facts.to_dict()
    d["added_in_a_later_version"] = {"x": 1}
    assert MachineFacts.from_dict(d) == facts


def test_from_dict_reads_facts_written_before_a_field_with_a_default() -> None:
    d = collect().to_dict()
    del d["tasks_free"]  # facts cached by a version before it
    assert MachineFacts.from_dict(d).tasks_free is None


def test_from_dict_rejects_missing_fields_and_bad_accelerator() -> None:
    d = collect().to_dict()
    with pytest.raises(ValueError, match="cpus_usable"):
        MachineFacts.from_dict({k: v for k, v in d.items() if k != "cpus_usable"})
    with pytest.raises(ValueError, match="accelerator"):
        MachineFacts.from_dict({**d, "accelerator": "tpu"})


# --- where the busy CPUs are counted: the cgroup's quota, its cpuset, or the machine -----------


def test_a_quota_binds_the_busy_cpus_to_its_cgroup_s_usage(tmp_path: Path) -> None:
    # A container of 2 CPUs on a busy 64-CPU host: the host's other tenants took 40 CPUs, which
    # read as a busy machine (every trial contended, more workers only competing).
    root, proc = v2_tree(tmp_path, "/kubepods/pod1/ctr")
    write(root / "kubepods/pod1/ctr/cpu.max", "max 100000")
    write(root / "kubepods/pod1/ctr/cpu.stat", "usage_usec 7000000\nuser_usec 6000000")
    write(root / "kubepods/pod1/cpu.max", "200000 100000")
    write(root / "kubepods/pod1/cpu.stat", "usage_usec 9500000\nuser_usec 9000000")
    pool = cpu_pool(root, proc)
    assert pool.usage == root / "kubepods/pod1/cpu.stat"
    assert system_busy(pool) == pytest.approx(9.5)
    write(root / "kubepods/pod1/cpu.stat", "usage_usec 11500000")
    assert system_busy(pool) == pytest.approx(11.5)


def test_a_v1_quota_reads_cpuacct_usage(tmp_path: Path) -> None:
    root, proc = v1_tree(tmp_path, cpu="/docker/abc")
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000")
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000")
    write(root / "cpu,cpuacct/docker/abc/cpuacct.usage", "2500000000")
    assert system_busy(cpu_pool(root, proc)) == pytest.approx(2.5)


def test_a_cpuset_of_some_cpus_counts_those_cpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, proc = v2_tree(tmp_path, "/ctr")
    write(root / "cpuset.cpus.effective", "0-7")
    write(root / "ctr/cpuset.cpus.effective", "2-3,6")
    monkeypatch.setattr(cgroups.os, "cpu_count", lambda: 8)
    pool = cpu_pool(root, proc)
    assert pool == CpuPool(cpus=(2, 3, 6))
    Times = collections.namedtuple("Times", "user system idle iowait")
    per_cpu = [Times(float(c), 1.0, 50.0, 0.5) for c in range(8)]
    monkeypatch.setattr(psutil, "cpu_times", lambda percpu=False: per_cpu)
    assert system_busy(pool) == pytest.approx((2 + 1) + (3 + 1) + (6 + 1))


def test_no_quota_and_every_cpu_is_the_whole_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, proc = v2_tree(tmp_path, "/ctr")
    write(root / "ctr/cpu.max", "max 100000")
    write(root / "ctr/cpu.stat", "usage_usec 1")
    write(root / "ctr/cpuset.cpus.effective", "0-3")
    monkeypatch.setattr(cgroups.os, "cpu_count", lambda: 4)
    assert cpu_pool(root, proc) == CpuPool()
    assert cpu_pool(root, tmp_path / "absent") == CpuPool()


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []), ("0-x", []), (None, [])],
)
def test_cpu_lists(text: str | None, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus
