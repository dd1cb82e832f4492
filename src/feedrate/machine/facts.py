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
from feedrate.machine.cgroups import cgroup_cpu_quota, cgroup_memory_limit, tasks_free

Accelerator = Literal["cuda", "mps", "none"]

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


_T = TypeVar("_T")


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
