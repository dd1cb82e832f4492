"""What the cgroups binding this process say (v2, and v1's controllers): its CPU quota, memory
limit and tasks left (with ``ulimit -u``), and where the CPU time it competes for is counted
(``cpu_pool``). Paths are injectable so tests can point at fake cgroup trees; a file that is
absent or unreadable counts as no limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

_N = TypeVar("_N", int, float)

# cgroup v1 reports "no limit" as a huge page-aligned number (e.g. 9223372036854771712), not -1.
_V1_MEMORY_UNLIMITED = 2**60


def cgroup_cpu_quota(cgroup_root: Path, proc_self_cgroup: Path) -> float | None:
    """The tightest CPU quota (in CPUs, e.g. 1.5) binding this process, or ``None`` if unlimited
    or unknown. Reads cgroup v2 ``cpu.max`` and v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``
    in this process's cgroup and every ancestor up to ``cgroup_root``."""
    return _min_known([quota for quota, _ in _quotas(cgroup_root, proc_self_cgroup)])


def _quotas(cgroup_root: Path, proc_self_cgroup: Path) -> list[tuple[float | None, Path]]:
    """Each CPU quota on this process's cgroup path (v2 ``cpu.max``, v1's CFS files; None:
    unlimited or unknown), with the file where that cgroup counts its CPU time."""
    paths = _cgroup_paths(proc_self_cgroup)
    found = [
        (_parse_cpu_max(_read(d / "cpu.max")), d / "cpu.stat")
        for d in _ancestors(cgroup_root, paths.get(""))
    ]
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for d in _ancestors(cgroup_root / mount, paths.get("cpu")):
            quota = _parse_cfs(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
            found.append((quota, d / "cpuacct.usage"))
    return found


def cgroup_memory_limit(cgroup_root: Path, proc_self_cgroup: Path) -> int | None:
    """The tightest memory limit in bytes binding this process, or ``None`` if unlimited or
    unknown. Reads cgroup v2 ``memory.max`` and v1 ``memory.limit_in_bytes`` in this process's
    cgroup and every ancestor up to ``cgroup_root``."""
    paths = _cgroup_paths(proc_self_cgroup)
    limits = [
        _parse_memory_max(_read(d / "memory.max")) for d in _ancestors(cgroup_root, paths.get(""))
    ]
    for d in _ancestors(cgroup_root / "memory", paths.get("memory")):
        limits.append(_parse_v1_memory(_read(d / "memory.limit_in_bytes")))
    return _min_known(limits)


def tasks_free(cgroup_root: Path, proc_self_cgroup: Path) -> int | None:
    """How many more tasks (processes and threads: a DataLoader worker is one process with a
    few threads) may start before ``fork`` or a thread's start fails with EAGAIN, or ``None``
    where no limit applies: the tightest ``pids.max`` less ``pids.current`` of this process's
    cgroup and its ancestors (v2, or v1's pids controller), and for a user other than root,
    ``RLIMIT_NPROC``'s soft limit (``ulimit -u``) less the tasks of that user."""
    paths = _cgroup_paths(proc_self_cgroup)
    dirs = _ancestors(cgroup_root, paths.get(""))
    dirs += _ancestors(cgroup_root / "pids", paths.get("pids"))
    free = [_pids_free(_read(d / "pids.max"), _read(d / "pids.current")) for d in dirs]
    return _min_known([*free, _nproc_free_safely()])


def _pids_free(limit: str | None, current: str | None) -> int | None:
    """cgroup ``pids.max`` (``"max"``: unlimited) less ``pids.current``, at least 0."""
    if limit is None or current is None or limit == "max":
        return None
    try:
        return max(0, int(limit) - int(current))
    except ValueError:
        return None


#: A ``ulimit -u`` from this many tasks is not counted against (distributions set 60k-1M; a
#: search plans at most 512 workers, about 2k tasks): ``collect()`` stays cheap.
NPROC_UNCOUNTED = 2**15


def _nproc_free() -> int | None:
    import resource  # not on Windows: _nproc_free_safely answers None there

    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft == resource.RLIM_INFINITY or soft < 0 or os.geteuid() == 0:
        return None  # root (CAP_SYS_RESOURCE) is not held to it
    if soft >= NPROC_UNCOUNTED:
        return None  # far above what loaders start: not worth a scan of every process
    uid = os.getuid()
    used = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        uids, threads = p.info["uids"], p.info["num_threads"]
        if uids is not None and uids.real == uid:
            used += threads or 1
    return max(0, soft - used)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_paths(proc_self_cgroup: Path) -> dict[str, str]:
    """Map controller name to this process's cgroup path; the v2 unified entry is under ``""``."""
    paths: dict[str, str] = {}
    for line in (_read(proc_self_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def _ancestors(root: Path, cgroup_path: str | None) -> list[Path]:
    """``root/cgroup_path`` and each parent up to ``root`` itself, deepest first.

    Inside a container the listed path often names the host's hierarchy, which is absent under the
    container's mount; those directories simply have no files and ``root`` still answers. A path
    with ``..`` (seen across cgroup namespaces) cannot be placed, so only ``root`` is used.
    """
    parts = [p for p in (cgroup_path or "").split("/") if p]
    if ".." in parts:
        parts = []
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _min_known(values: list[_N | None]) -> _N | None:
    # Nested limits all bind, so the tightest one is the one that counts.
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _parse_cpu_max(text: str | None) -> float | None:
    """cgroup v2 ``cpu.max``: ``"max 100000"`` (unlimited) or ``"150000 100000"`` (1.5 CPUs)."""
    fields = (text or "").split()
    if not fields or fields[0] == "max":
        return None
    period = fields[1] if len(fields) > 1 else "100000"  # the kernel's default period
    return _ratio(fields[0], period)


def _parse_cfs(quota: str | None, period: str | None) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; a quota of -1 is unlimited."""
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _parse_memory_max(text: str | None) -> int | None:
    """cgroup v2 ``memory.max``: ``"max"`` (unlimited) or a byte count."""
    try:
        return int(text) if text and text != "max" else None
    except ValueError:
        return None


def _parse_v1_memory(text: str | None) -> int | None:
    limit = _parse_memory_max(text)
    return limit if limit is not None and 0 < limit < _V1_MEMORY_UNLIMITED else None


def _nproc_free_safely() -> int | None:
    try:
        return _nproc_free()
    except Exception:  # not on Windows, or a process table that cannot be read
        return None


@dataclass(frozen=True)
class CpuPool:
    """Where the busy CPU time that this process competes for is counted: ``usage``, the CPU
    usage file of the cgroup whose quota binds it (v2 ``cpu.stat``, v1 ``cpuacct.usage``:
    processes outside it take nothing from the quota); else ``cpus``, its cgroup's cpuset where
    that holds only some of the machine's CPUs; else (both None) the whole machine."""

    usage: Path | None = None
    cpus: tuple[int, ...] | None = None

    def busy_s(self) -> float | None:
        """The cgroup's CPU seconds so far (``usage``), or None (unreadable, or no ``usage``)."""
        if self.usage is None:
            return None
        text = _read(self.usage)
        if text is None:
            return None
        if self.usage.name == "cpu.stat":
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec" and value.strip().isdigit():
                    return int(value) / 1e6
            return None
        return int(text) / 1e9 if text.isdigit() else None


def cpu_pool(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_self_cgroup: Path = Path("/proc/self/cgroup")
) -> CpuPool:
    """Where the CPU time this process competes for is counted (see ``CpuPool``): a container
    limited to 2 CPUs on a 64-CPU host is busy by what its own processes use, not by the
    host's other tenants."""
    quotas = _quotas(cgroup_root, proc_self_cgroup)
    bound = [(quota, usage) for quota, usage in quotas if quota is not None and usage.is_file()]
    if bound:
        return CpuPool(usage=min(bound, key=lambda b: b[0])[1])
    paths = _cgroup_paths(proc_self_cgroup)
    sets = [_read(d / "cpuset.cpus.effective") for d in _ancestors(cgroup_root, paths.get(""))]
    sets += [
        _read(d / "cpuset.cpus") for d in _ancestors(cgroup_root / "cpuset", paths.get("cpuset"))
    ]
    cpus = next((c for c in map(parse_cpu_list, sets) if c), None)
    total = os.cpu_count() or 0
    if cpus and all(0 <= c < total for c in cpus) and len(cpus) < total:
        return CpuPool(cpus=tuple(cpus))
    return CpuPool()


def parse_cpu_list(text: str | None) -> list[int]:
    """A cpuset list (``"0-3,8,10-11"``) as CPU numbers; none where empty or malformed."""
    cpus: list[int] = []
    for part in (text or "").split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return []
        cpus.extend(range(int(first), int(last or first) + 1))
    return sorted(set(cpus))
