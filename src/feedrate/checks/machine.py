"""Rules about the machine's resources against the settings: pinned memory without an accelerator
or unused, the CPU quota, /dev/shm, the open-file limit and the processes and threads left to
start. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.findings import Finding, FindingDoc
from feedrate.results.trial import Trial
from feedrate.search.space import (
    FDS_BASE,
    FDS_PER_BATCH,
    FDS_PER_WORKER,
    SHM_HEADROOM,
    TASKS_PER_WORKER,
    TASKS_SEEN,
    tasks,
)
from feedrate.units import size


def pin_memory_finding(baseline: Trial, machine: dict[str, Any]) -> Finding | None:
    if machine.get("accelerator", "none") != "none" or not baseline.config.pin_memory:
        return None
    return Finding(
        "pin-memory-no-accelerator",
        "warning",
        "pin_memory=True but this machine has no accelerator: pinning only speeds copies to a "
        "GPU, here it costs main-process CPU and locked memory for nothing",
        "DataLoader(..., pin_memory=False)",
    )


def cpu_quota_finding(machine: dict[str, Any]) -> Finding | None:
    quota, count = machine.get("cpu_quota"), machine.get("cpu_count")
    if quota is None or count is None or quota >= count:
        return None
    return Finding(
        "cpu-quota",
        "warning",
        f"the container may use {quota:g} CPUs but os.cpu_count() says {count}: rules based on "
        "the CPU count start too many workers",
        f"size workers from the quota: num_workers ≈ {machine.get('cpus_usable')}",
    )


MiB = 2**20


#: pin_memory matters for batches of at least this many bytes (smaller copies are cheap).
PIN_BYTES = MiB


#: Open files in use above this share of the soft limit are a warning (at 100%, an error).
FD_WARN_SHARE = 0.8


def pin_memory_unused_finding(
    config: LoaderConfig, machine: dict[str, Any], batch_bytes: int | None
) -> Finding | None:
    """An accelerator is present and pin_memory is off. This check does not time the copy
    (``tune`` measures pin_memory both ways, and its verdict replaces this one), so it is a
    warning only for batches large enough for the copy to matter."""
    accel = machine.get("accelerator", "none")
    if accel == "none" or config.pin_memory:
        return None
    name = machine.get("accelerator_name")
    device = f"{accel} × {machine.get('accelerator_count', 1)}" + (f" ({name})" if name else "")
    each = f"each {size(batch_bytes)} batch is" if batch_bytes else "batches are"
    big = batch_bytes is not None and batch_bytes >= PIN_BYTES
    return Finding(
        "pin-memory-unused",
        "warning" if big else "info",
        f"an accelerator is present ({device}) and pin_memory is off: {each} copied from "
        "pageable memory, which is slower and cannot overlap compute (non_blocking copies need "
        "pinned memory); not timed here: `feedrate tune` measures pin_memory both ways",
        "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)",
    )


def shm_finding(
    config: LoaderConfig, machine: dict[str, Any], batch_bytes: int | None, suggested: bool = False
) -> Finding | None:
    """/dev/shm smaller than the batches in flight (num_workers × prefetch_factor of them) need:
    an error when they do not fit at all (workers die of SIGBUS), a warning when they fit without
    ``SHM_HEADROOM``. ``suggested``: ``config`` is feedrate's suggestion, not the user's.

    The one /dev/shm rule: a configuration it reports is predicted to overflow /dev/shm, and
    the doctor, tune and autotune do not start it."""
    free = machine.get("shm_free_bytes")
    if free is None or not batch_bytes or config.num_workers == 0:
        return None
    inflight = config.queue_depth
    need = batch_bytes * inflight
    if need * SHM_HEADROOM <= free:
        return None
    whose = "the suggested" if suggested else "your"
    return Finding(
        "shm-too-small",
        "error" if need > free else "warning",
        f"/dev/shm has {_shm_free(machine)} but {whose} {config.num_workers} workers × "
        f"prefetch_factor {config.prefetch_factor} keep {inflight} batches of "
        f"{size(batch_bytes)} in flight ({size(need)}, {size(need * SHM_HEADROOM)} with "
        "headroom): workers "
        + ("will fail" if need > free else "risk failing")
        + " to hand batches over ('unable to allocate shared memory', or a bus error, SIGBUS)",
        _shm_fix(config, machine, batch_bytes),
    )


def shm_failed_finding(
    config: LoaderConfig, machine: dict[str, Any], batch_bytes: int | None, what: str, error: str
) -> Finding:
    """A run (``what``) died of /dev/shm running out, as its ``error`` says (``measuring.
    diagnosis.shm_exhausted`` recognises the words): an error, with the fixes."""
    inflight = (
        f"; {config.num_workers} workers × prefetch_factor {config.prefetch_factor} keep "
        f"{config.queue_depth} batches of {size(batch_bytes)} in flight"
        if batch_bytes and config.num_workers
        else ""
    )
    said = error.split(": /dev/shm is too small")[0]  # the advice diagnosis added: our fix
    return Finding(
        "shm-too-small",
        "error",
        f"the {what} died because /dev/shm ran out ({_shm_free(machine)}{inflight}): {said}",
        _shm_fix(config, machine, batch_bytes),
    )


def shm_fitting(
    config: LoaderConfig, machine: dict[str, Any], batch_bytes: int | None
) -> LoaderConfig:
    """``config`` itself when ``shm_finding`` does not report it, else the nearest one it does
    not: fewer workers at the same queue depth per worker, then one worker with a shallower
    queue, then no workers."""
    if shm_finding(config, machine, batch_bytes) is None:
        return config
    pf = config.prefetch_factor or 1
    for workers in range(config.num_workers - 1, 0, -1):
        fewer = replace(config, num_workers=workers)
        if shm_finding(fewer, machine, batch_bytes) is None:
            return fewer
    for depth in range(pf - 1, 0, -1):
        shallower = replace(config, num_workers=1, prefetch_factor=depth)
        if shm_finding(shallower, machine, batch_bytes) is None:
            return shallower
    return replace(config, num_workers=0)


def _shm_free(machine: dict[str, Any]) -> str:
    free, total = machine.get("shm_free_bytes"), machine.get("shm_total_bytes")
    if free is None:
        return "/dev/shm free unknown"
    return f"{size(free)} free" + (f" (of {size(total)})" if total else "")


def _shm_fix(config: LoaderConfig, machine: dict[str, Any], batch_bytes: int | None) -> str:
    """More /dev/shm (sized for ``config``'s batches in flight with headroom, when known), or
    fewer batches in flight (as many as fit)."""
    free = machine.get("shm_free_bytes")
    need = (batch_bytes or 0) * config.queue_depth * SHM_HEADROOM
    gib = max(1, math.ceil(need / 2**30)) if need else 2
    fewer = "or fewer workers or a shallower queue (lower num_workers or prefetch_factor)"
    if batch_bytes and free is not None:
        fits = max(0, int(free / (batch_bytes * SHM_HEADROOM)))
        fewer = f"or fewer workers or a shallower queue (num_workers × prefetch_factor ≤ {fits})"
    return (
        f"docker run --shm-size={gib}g (or --ipc=host; on Kubernetes an emptyDir with medium: "
        f"Memory at /dev/shm), {fewer} (the file_system sharing strategy does not help: its "
        "files are in /dev/shm too)"
    )


def fd_limit_finding(
    config: LoaderConfig, machine: dict[str, Any], tensors_per_batch: int | None
) -> Finding | None:
    """The open-file soft limit against what the file_descriptor sharing strategy keeps open:
    a few files per worker and one per tensor of every batch in flight."""
    soft = machine.get("open_files_soft")
    if machine.get("sharing_strategy") != "file_descriptor" or soft is None:
        return None
    if config.num_workers == 0:
        return None
    per_batch = tensors_per_batch or FDS_PER_BATCH
    pf = config.prefetch_factor or 0
    need = FDS_BASE + config.num_workers * (FDS_PER_WORKER + pf * per_batch)
    if need <= soft * FD_WARN_SHARE:
        return None
    return Finding(
        "fd-limit",
        "error" if need > soft else "warning",
        f"the open-file limit is {soft} (ulimit -n) and the file_descriptor sharing strategy "
        f"keeps about {need} files open at {config.label()} ({config.num_workers} workers, "
        f"{config.queue_depth} batches of {per_batch} tensors in flight): "
        + ("expect 'Too many open files'" if need > soft else "close to 'Too many open files'"),
        f"ulimit -n {max(4096, 2 ** math.ceil(math.log2(need * 2)))}, or "
        'torch.multiprocessing.set_sharing_strategy("file_system")',
    )


def limit_findings(
    config: LoaderConfig, machine: dict[str, Any], tensors_per_batch: int | None
) -> tuple[Finding | None, Finding | None]:
    """``fd_limit_finding`` and ``task_limit_finding`` of ``config``."""
    return fd_limit_finding(config, machine, tensors_per_batch), task_limit_finding(config, machine)


def refusal(config: LoaderConfig, machine: dict[str, Any], batch_bytes: int | None) -> str | None:
    """Why a run of ``config`` is not started: its workers need more processes and threads than
    are left (``task_limit_finding`` at error), or its batches in flight, of ``batch_bytes``
    each, are predicted to overflow /dev/shm (``shm_finding``); None when it may start."""
    if task_limit_finding(config, machine, at="error") is not None:
        return (
            f"not started: its {config.num_workers} workers need about {tasks(config)} processes "
            f"and threads, more than the {machine.get('tasks_free')} left (see task-limit)"
        )
    if batch_bytes is None or not shm_finding(config, machine, batch_bytes):
        return None
    return (
        f"not started: its {config.queue_depth} batches of {size(batch_bytes)} in flight would "
        "overflow /dev/shm (see shm-too-small)"
    )


def task_limit_finding(
    config: LoaderConfig, machine: dict[str, Any], *, at: str = "warning"
) -> Finding | None:
    """The processes and threads left to start (the cgroup's ``pids.max``, ``ulimit -u``)
    against those ``config``'s workers hold: about ``TASKS_PER_WORKER`` each, their threads
    included. An error where even ``TASKS_SEEN`` each would not fit; ``at="error"``: only
    that (what refuses to start a run: settings that start are never refused)."""
    free = machine.get("tasks_free")
    if free is None or config.num_workers == 0:
        return None
    need, least = tasks(config), tasks(config, TASKS_SEEN)  # planned, and at the least
    if least <= free if at == "error" else need <= free * FD_WARN_SHARE:
        return None
    each = need // config.num_workers
    fits = max(0, int(free * FD_WARN_SHARE) // each)
    over = least > free
    return Finding(
        "task-limit",
        "error" if over else "warning",
        f"only {free} more processes and threads may start here (the cgroup's pids.max or "
        f"ulimit -u), and {config.label()} starts {config.num_workers} worker processes of "
        f"about {each} each ({need}): "
        + (
            "expect 'Resource temporarily unavailable' when they start"
            if over
            else "close to 'Resource temporarily unavailable'"
        ),
        f"num_workers={fits} or fewer, or raise the limit (docker run --pids-limit, the "
        "kubelet's podPidsLimit, ulimit -u)",
    )


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
    FindingDoc(
        id="pin-memory-no-accelerator",
        title="pin_memory without an accelerator",
        means=(
            "`pin_memory=True` on a machine without an accelerator. Pinned (page-locked) memory "
            "only speeds copies to a GPU; here the pin-memory thread spends main-process CPU and "
            "locks RAM for nothing."
        ),
        evidence=(
            "From `tune` and `doctor`: your loader's `pin_memory`, and no CUDA or MPS device "
            "visible to torch."
        ),
        fix="`DataLoader(..., pin_memory=False)`",
        severity="warning",
    ),
    FindingDoc(
        id="cpu-quota",
        title="The container's CPU quota is below the CPU count",
        means=(
            "The container's CPU quota (cgroup) is below the CPU count `os.cpu_count()` reports. "
            "Rules that size workers from the CPU count, DataLoader's own suggestion among them, "
            "start too many workers, which then compete for the quota."
        ),
        evidence=(
            "From the machine facts (`feedrate env`): the cgroup (v1 or v2) CPU quota against "
            "`os.cpu_count()`."
        ),
        fix=(
            "Size workers from the usable CPUs (`feedrate env` shows them: the smaller of the "
            "affinity and the quota), or let `feedrate tune` measure."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="pin-memory-unused",
        title="An accelerator, and pin_memory off",
        means=(
            "An accelerator is present and `pin_memory` is off: batches are copied from pageable "
            "memory, which is slower and cannot overlap compute (`non_blocking` copies need pinned "
            "memory)."
        ),
        evidence=(
            "From `doctor`, and `tune` where it could not measure `pin_memory` both ways: the "
            "machine's accelerator, your loader's `pin_memory`, and the bytes of a real batch. "
            "This check does not time the copy; `tune`'s `pin-memory-measured` does, end to end, "
            "and replaces it; `feedrate transfer` times the copies."
        ),
        fix="`DataLoader(..., pin_memory=True)` and `batch.to(device, non_blocking=True)`",
        severity="warning for batches of 1 MiB or more; info for smaller ones",
    ),
    FindingDoc(
        id="shm-too-small",
        title="/dev/shm is too small for the batches in flight",
        means=(
            "`/dev/shm`, where workers hand batches to the main process, is too small for the "
            "batches the settings keep in flight (`num_workers` × `prefetch_factor` of them). A "
            'worker that cannot write its batch dies of a bus error (SIGBUS) or with "unable to '
            "allocate shared memory ... No space left on device\". Docker's default of 64 MiB is "
            "a common cause."
        ),
        evidence=(
            "From `doctor`, `tune` and `autotune`, before any worker runs: the free (and total) "
            "size of `/dev/shm` against the bytes of one batch made in the main process × "
            "`num_workers` × `prefetch_factor`, with 1.5× headroom; a configuration predicted to "
            "overflow is not started (`doctor` skips the runs, `tune` stops, `autotune` starts "
            "lower). Also from a run that died of it, recognised by torch's words or SIGBUS."
        ),
        fix=(
            "`docker run --shm-size=Ng` (or `--ipc=host`; on Kubernetes an `emptyDir` with "
            "`medium: Memory` at `/dev/shm`), or keep `num_workers` × `prefetch_factor` at most "
            "the batches that fit (the message gives both numbers). The `file_system` sharing "
            "strategy does not help: its files live in `/dev/shm` too (tried on a 64 MiB tmpfs)."
        ),
        severity=(
            "error when the batches in flight do not fit; warning when they fit without the 1.5× "
            "headroom"
        ),
    ),
    FindingDoc(
        id="fd-limit",
        title="Close to the open-file limit",
        means=(
            "Under the `file_descriptor` sharing strategy every tensor of every batch in flight "
            "holds an open file in the main process. With the open-file limit (`ulimit -n`) near "
            "what your settings need, loading fails with 'Too many open files'."
        ),
        evidence=(
            "From `doctor` and `tune`: the soft `RLIMIT_NOFILE` and the sharing strategy "
            "(`feedrate env`), against about 64 + `num_workers` × (4 + `prefetch_factor` × tensors "
            "per batch) files, the tensors counted in a real batch (4 when unknown)."
        ),
        fix=(
            "Raise the limit (`ulimit -n`, the message gives a number, at least 4096), or "
            '`torch.multiprocessing.set_sharing_strategy("file_system")`.'
        ),
        severity="error when the files needed exceed the limit; warning above 80% of it",
    ),
    FindingDoc(
        id="task-limit",
        title="Close to the limit of processes and threads",
        means=(
            "Every worker is a process with a few threads, and a container's `pids.max` (Docker's "
            "`--pids-limit`, the kubelet's `podPidsLimit`) or the user's `ulimit -u` counts each. "
            "Near that limit, starting the workers fails with 'Resource temporarily unavailable' "
            "(EAGAIN from `fork`, or 'can't start new thread')."
        ),
        evidence=(
            "From `doctor` and `tune`: the tasks left to start (`tasks_free` in `feedrate env`: "
            "`pids.max` less `pids.current` of the cgroup and its ancestors, and for a user other "
            f"than root `ulimit -u` less that user's tasks) against {TASKS_PER_WORKER} per worker "
            "and its threads (a threaded worker's `threads` - 1 more). `tune` and `autotune` "
            "plan within 80% of them, split between the ranks of a node, and after a start that "
            "failed go no higher than half way to it."
        ),
        fix=(
            "Fewer workers (the message gives a count), or raise the limit: `docker run "
            "--pids-limit`, the kubelet's `podPidsLimit`, `ulimit -u`."
        ),
        severity=(
            "error when the workers need more than are left, even at 3 each (a run is then not "
            "started); warning above 80% of them at 4 each"
        ),
    ),
)
