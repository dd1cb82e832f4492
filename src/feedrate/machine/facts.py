"""Facts about this machine that explain DataLoader performance: usable CPUs (affinity and
container quota), memory and its cgroup limit, /dev/shm, open-file limits, the tasks left to
start (cgroup ``pids.max``, ``ulimit -u``), the multiprocessing start method and sharing
strategy, torch threading, and the accelerator.

``collect()`` is cheap (no subprocess, no CUDA context) and never raises: a probe that fails on a
strange machine yields ``None`` for its field. ``MachineFacts`` is plain data that round-trips
through JSON via ``to_dict`` / ``from_dict``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import platform
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import psutil
import torch
import torch.multiprocessing

from feedrate.cpus import usable_cpus

Accelerator = Literal["cuda", "mps", "none"]

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)

# cgroup v1 reports "no limit" as a huge page-aligned number (e.g. 9223372036854771712), not -1.
_V1_MEMORY_UNLIMITED = 2**60

_T = TypeVar("_T")
_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class MachineFacts:
    """What this machine offers a DataLoader. Sizes in bytes, CPU counts in logical CPUs.

    A field is ``None`` when its probe is unsupported here or failed, or (for ``cpu_quota``,
    ``memory_limit_bytes``, ``open_files_*`` and ``tasks_free``) when no limit applies.
    ``cpus_usable`` is the smaller of the affinity mask and the cgroup CPU quota, see
    ``usable_cpus``. ``tasks_free``: how many more processes and threads may start (every
    worker and its threads count), see ``tasks_free()``.
    """

    cpu_count: int | None
    cpus_affinity: int
    cpu_quota: float | None
    cpus_usable: int
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    memory_limit_bytes: int | None
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    open_files_soft: int | None
    open_files_hard: int | None
    start_method: str | None
    sharing_strategy: str | None
    torch_version: str
    torch_num_threads: int | None
    torch_num_interop_threads: int | None
    thread_env: dict[str, str]
    accelerator: Accelerator
    accelerator_name: str | None
    accelerator_count: int
    python_version: str
    platform: str | None
    tasks_free: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serializable dict of all fields (a deep copy)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MachineFacts:
        """Rebuild from ``to_dict`` output. Unknown keys are ignored so files written by newer
        versions still load, and those of older ones where the field has a default; a missing
        field without one or an unknown accelerator raises ``ValueError``."""
        fields = dataclasses.fields(cls)
        names = [f.name for f in fields if f.name in d]
        missing = [f.name for f in fields if f.name not in d and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError(f"machine facts lack fields: {', '.join(missing)}")
        if d["accelerator"] not in get_args(Accelerator):
            raise ValueError(f"unknown accelerator {d['accelerator']!r}")
        kwargs = {n: d[n] for n in names}
        kwargs["thread_env"] = dict(d["thread_env"])
        return cls(**kwargs)


def cpu_ids() -> list[int] | None:
    """The CPUs this process may run on (its affinity mask), None where it cannot be read: the
    ranks of a node pinned each to its own CPUs share the node through these."""
    return _safe(lambda: sorted(os.sched_getaffinity(0))) or None


def cgroup_cpu_quota(cgroup_root: Path, proc_self_cgroup: Path) -> float | None:
    """The tightest CPU quota (in CPUs, e.g. 1.5) binding this process, or ``None`` if unlimited
    or unknown. Reads cgroup v2 ``cpu.max`` and v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``
    in this process's cgroup and every ancestor up to ``cgroup_root``."""
    paths = _cgroup_paths(proc_self_cgroup)
    quotas = [_parse_cpu_max(_read(d / "cpu.max")) for d in _ancestors(cgroup_root, paths.get(""))]
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for d in _ancestors(cgroup_root / mount, paths.get("cpu")):
            quotas.append(_parse_cfs(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")))
    return _min_known(quotas)


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
    return _min_known([*free, _safe(_nproc_free)])


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
    import resource  # not on Windows: _safe answers None there

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


def collect(
    *,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_self_cgroup: Path = Path("/proc/self/cgroup"),
    shm_path: Path = Path("/dev/shm"),
) -> MachineFacts:
    """Probe this machine. Never raises; never creates a CUDA context or fixes the start method.

    The paths are injectable so tests can point at fake cgroup trees.
    """
    cpu_count = os.cpu_count()
    affinity = len(cpu_ids() or ()) or cpu_count or 1
    quota = _safe(lambda: cgroup_cpu_quota(cgroup_root, proc_self_cgroup))
    memory = _safe(psutil.virtual_memory)
    shm = _safe(lambda: shutil.disk_usage(shm_path))
    open_files = _open_files_limits()
    accelerator, accelerator_count, accelerator_name = _accelerator()
    return MachineFacts(
        cpu_count=cpu_count,
        cpus_affinity=affinity,
        cpu_quota=quota,
        cpus_usable=usable_cpus(affinity, quota),
        memory_total_bytes=memory.total if memory else None,
        memory_available_bytes=memory.available if memory else None,
        memory_limit_bytes=_safe(lambda: cgroup_memory_limit(cgroup_root, proc_self_cgroup)),
        shm_total_bytes=shm.total if shm else None,
        shm_free_bytes=shm.free if shm else None,
        open_files_soft=open_files[0],
        open_files_hard=open_files[1],
        start_method=_safe(_start_method),
        sharing_strategy=_safe(torch.multiprocessing.get_sharing_strategy),
        torch_version=str(torch.__version__),
        torch_num_threads=_safe(torch.get_num_threads),
        torch_num_interop_threads=_safe(torch.get_num_interop_threads),
        thread_env={k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ},
        accelerator=accelerator,
        accelerator_name=accelerator_name,
        accelerator_count=accelerator_count,
        python_version=platform.python_version(),
        platform=_safe(platform.platform),
        tasks_free=_safe(lambda: tasks_free(cgroup_root, proc_self_cgroup)),
    )


def _safe(probe: Callable[[], _T]) -> _T | None:
    # A probe that breaks on an exotic machine must cost one field, not the whole report.
    try:
        return probe()
    except Exception:
        return None


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


def _open_files_limits() -> tuple[int | None, int | None]:
    try:
        import resource
    except ImportError:  # Windows
        return None, None
    limits = _safe(lambda: resource.getrlimit(resource.RLIMIT_NOFILE))
    if limits is None:
        return None, None
    # RLIM_INFINITY is -1 on Linux; an unlimited count is reported as None, like other limits.
    soft, hard = (None if v == resource.RLIM_INFINITY or v < 0 else v for v in limits)
    return soft, hard


def _start_method() -> str:
    # multiprocessing.get_context().get_start_method() would *fix* the default context, making a
    # later set_start_method() in the user's code fail; the first listed method is the default.
    method = multiprocessing.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]


def _accelerator() -> tuple[Accelerator, int, str | None]:
    """Return (kind, device count, name of device 0) without initializing CUDA.

    ``torch.cuda.is_available()`` calls cuInit, after which forked DataLoader workers cannot use
    CUDA; ``device_count()`` asks NVML first and creates no context, so it decides availability.
    """
    count = _safe(torch.cuda.device_count) or 0
    if count > 0:
        return "cuda", count, _cuda_name()
    if _safe(torch.backends.mps.is_available):
        return "mps", 1, None
    return "none", 0, None


def _cuda_name() -> str | None:
    if _safe(torch.cuda.is_initialized):
        return _safe(lambda: torch.cuda.get_device_name(0))
    # get_device_name() would initialize CUDA in this process; NVML does not.
    return _safe(_nvml_device_name)


def _nvml_device_name() -> str | None:
    """Name of CUDA device 0 (after CUDA_VISIBLE_DEVICES) from NVML, or None."""
    if sys.platform != "linux":
        return None
    index = int(torch.cuda._get_nvml_device_index(0))
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return None
        name = ctypes.create_string_buffer(96)  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
        if nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(len(name))) != 0:
            return None
        return name.value.decode(errors="replace")
    finally:
        nvml.nvmlShutdown()
