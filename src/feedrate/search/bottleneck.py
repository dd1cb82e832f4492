"""One vocabulary for what limits a pipeline (``Bottleneck``, in words ``LABELS``), used alike by
the search, the findings, the console, the JSON, the HTML report and the plot.

``bottleneck`` reads where a trial's CPU time went; ``classify`` adds what only the batch bytes
or a run without workers show (IPC-bound, workers that cost more than they save). The kinds
only a consumer shows (consumer-bound, contention, uneven supply) are told by
``checks.bottleneck.bottleneck_kind``."""

from __future__ import annotations

from typing import Literal

from feedrate.results.trial import Trial
from feedrate.search.space import beats

Bottleneck = Literal[
    "no-workers",
    "main-process",
    "cpu",
    "latency",
    "ipc",
    "consumer",
    "contention",
    "uneven",
    "unknown",
]
MiB = 2**20


#: Batches crossing shared memory at this rate or more, with the main process busy, make a
#: pipeline IPC-bound rather than collation-bound.
IPC_BYTES_PER_S = 128 * MiB


#: Workers that want a CPU (running or queued for one) less than this share of the time,
#: each, mostly wait: on I/O, or on the main process to take what they made.
WAITING_DEMAND = 0.5


#: The main process counts as busy from this share of a core (IPC-bound needs it busy).
MAIN_BUSY = 0.6


#: Each bottleneck kind in words.
LABELS: dict[str, str] = {
    "no-workers": "fastest without workers (the work per batch is too small to hand over)",
    "main-process": "main-process-bound (loading, collating, unpickling or pinning in it)",
    "cpu": "CPU-bound in the workers",
    "latency": "latency-bound (fetching mostly waits)",
    "unknown": "no single bottleneck stood out",
    "ipc": "IPC-bound (large batches through shared memory)",
    "consumer": "consumer-bound",
    "contention": "contention",
    "uneven": "uneven supply",
}


def bottleneck(t: Trial, cpus: int) -> Bottleneck:
    """What limits ``t``, from where its CPU time went (1.0 = one core busy)."""
    if not t.measured:
        return "unknown"
    if t.config.num_workers == 0:
        # The main process fetching its samples itself: asleep most of the time it waits for
        # one, it waits on I/O (a consumer's step aside), and more requests in flight help.
        # Queued for a CPU it is not asleep: on a busy machine that is its work held up.
        making = t.main_cpu + (t.main_runq or 0.0)
        fetching = making / t.stall_fraction if t.stall_fraction else making
        return "latency" if fetching < WAITING_DEMAND else "no-workers"
    if t.main_cpu >= 0.85:
        return "main-process"
    own = t.own_cpu
    if own >= 0.85 * cpus or t.worker_demand_mean >= 0.8 or competing(t, cpus):
        return "cpu"  # the workers use, or queue for, a core all the time
    if t.worker_demand_mean < WAITING_DEMAND:
        return "latency"  # workers mostly asleep: waiting on I/O, not on a CPU
    if (t.system_busy_cpus or 0.0) >= 0.85 * cpus:
        return "cpu"  # computing workers on CPUs that others fill: more workers only compete
    return "unknown"


def competing(t: Trial, cpus: int) -> bool:
    """The workers waited for a CPU longer than they ran, on CPUs busy (``0.85`` of them) mostly
    with this pipeline's own processes: they compete for the CPUs. Each may be runnable only a
    fraction of the time (many workers, each held up behind a full queue or a slow batch), yet
    none of them waits on I/O: more workers only queue longer (skewed CPU cost, 32 workers on 2
    CPUs: 1.4 CPUs of work, 10.8 of queueing, the machine 1.9 busy). Workers waiting on I/O
    sleep instead, and on a machine others keep busy their queueing is the others' doing."""
    busy = t.system_busy_cpus or 0.0
    own = t.own_cpu
    queued = t.workers_runq or 0.0
    return queued > t.workers_cpu and busy >= 0.85 * cpus and own >= 0.5 * busy


def busy_words(t: Trial, cpus: int) -> tuple[str, bool]:
    """The busy CPUs ``t`` was judged on, in words ("1.0 of 1 CPUs busy, 0.6 with its own
    work": with several ranks, a rank's share of the node's), and whether processes outside
    the pipeline filled 0.1 CPU or more of them (then its own load is named beside)."""
    own = t.own_cpu
    busy = max(own, t.system_busy_cpus or 0.0)
    others = busy - own >= 0.1
    text = f"{busy:.1f} of {cpus} CPUs busy" + (f", {own:.1f} with its own work" if others else "")
    return text, others


def ipc_bytes_per_s(t: Trial, batch_size: int | None) -> float | None:
    """Bytes of batches per second crossing from the workers to the main process."""
    if not t.measured or not t.batch_bytes or not batch_size or t.config.num_workers == 0:
        return None
    return t.batch_bytes * t.median / batch_size


def classify(
    t: Trial, cpus: int, batch_size: int | None = None, no_workers: Trial | None = None
) -> Bottleneck:
    """``search.bottleneck`` of ``t``, with time spent moving large batches between processes
    told apart as "ipc": batches cross shared memory at ``IPC_BYTES_PER_S`` or more and either
    the main process is busy (the workers not saturating the CPUs) or ``no_workers`` (the same
    pipeline without workers) is faster. Without large batches, workers slower than none make
    it "no-workers": handing batches over costs more than the work they carry."""
    kind: Bottleneck = bottleneck(t, cpus)
    rate = ipc_bytes_per_s(t, batch_size)
    heavy = rate is not None and rate >= IPC_BYTES_PER_S
    if t.config.num_workers and no_workers is not None and faster(no_workers, t):
        return "ipc" if heavy else "no-workers"
    if heavy and t.main_cpu >= MAIN_BUSY and kind != "cpu":
        return "ipc"
    return kind


def faster(a: Trial, b: Trial) -> bool:
    return a.measured and b.measured and beats(a, b)
