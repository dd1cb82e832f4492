"""The findings catalog: what each finding id means, what evidence it rests on, the fix, and
its severity. ``feedrate explain ID`` prints an entry; docs/findings.md is the same text, one
section per id (``markdown_section``), so the two cannot drift apart.

Plain data with no import from the rest of feedrate (and no torch): the rules that raise the
findings live with the checks; this says, in words, what each rule looks at. Inline code is
written in backticks, as in the guide.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class FindingDoc:
    """One finding id, documented: a short ``title``; what it ``means``; the ``evidence`` it
    rests on (which command reports it and from what measurement or fact); the ``fix``; and the
    ``severity`` it is reported with (``error``, ``warning`` or ``info``, with the condition
    where it depends on one)."""

    id: str
    title: str
    means: str
    evidence: str
    fix: str
    severity: str


_DOCS = (
    FindingDoc(
        id="bottleneck",
        title="What limits the pipeline",
        means=(
            "What limits this pipeline's rate, as one kind of one vocabulary: `no-workers`, "
            "`main-process`, `cpu`, `latency`, `ipc`, `consumer`, `contention`, `uneven` or "
            "`unknown`. It is not a problem in itself: it says which lever can help and which "
            "cannot."
        ),
        evidence=(
            "From `tune` (the recommended configuration) and `doctor` (your settings and the "
            "alternatives it measured): where the CPU time went over the measured windows, that is "
            "the main process's share of a core, the workers' CPU in total and each, and the time "
            "they spent queued for a CPU (Linux schedstat), against the usable CPUs; the bytes per "
            "second of batches crossing shared memory; a run without workers, where one was "
            "measured. With a consumer: the loader alone, the consumer alone and the two together, "
            "and the share of time the consumer waited for data."
        ),
        fix=(
            "The finding's own fix line, by kind: `no-workers` keep `num_workers=0` (cheaper "
            "per-batch work or bigger batches for more speed); `main-process` a `collate_fn` that "
            "builds one tensor, smaller batches through shared memory, or fewer, larger samples; "
            "`cpu` more CPUs, cheaper per-sample work, or fewer threads per worker; `latency` more "
            "workers or threads inside workers, or a local cache of the remote data; `ipc` fewer "
            "bytes per batch (`uint8` instead of `float32`, crop, decode or normalize on the "
            "accelerator); `consumer` a faster training step, the loader has headroom; "
            "`contention` leave CPUs to the training step or run it on the accelerator; `uneven` a "
            "deeper queue (`prefetch_factor=4`) or one more worker; `unknown` measure with a "
            "consumer (`--rate`, `--step-time` or `--step`)."
        ),
        severity="info",
    ),
    FindingDoc(
        id="budget-limited",
        title="Configurations skipped as over a budget",
        means=(
            "The search did not start some configurations because it predicted they would exceed a "
            "budget: the memory the workers may use, the `/dev/shm` the batches in flight need, "
            "the open files, or (with an accelerator) the pinned memory. The answer is the best of "
            "those that fit."
        ),
        evidence=(
            "From `tune`: how many configurations were skipped, and the first with its prediction, "
            "made from what the trials so far measured: the main process's memory plus the largest "
            "worker's (USS) times the workers, against half the available memory (or "
            "`--memory-limit`); the batch's bytes × `num_workers` × `prefetch_factor` × 1.5, "
            "against half the free `/dev/shm`; the open files the `file_descriptor` sharing "
            "strategy would hold, against 80% of the soft limit; the pinned memory in flight, "
            "against 10% of the machine's memory."
        ),
        fix=(
            "Raise the budget if you want them tried: `--memory-limit` (`tune(memory_limit=...)`), "
            "more memory or a larger `/dev/shm` for the container (`docker run --shm-size=...`), "
            "or `ulimit -n`."
        ),
        severity="info",
    ),
    FindingDoc(
        id="busy-machine",
        title="Other processes kept the CPUs busy",
        means=(
            "Other processes kept CPUs busy while the pipeline was measured. The rates are lower "
            "and noisier than on a quiet machine, and the worker count that measured best is the "
            "best for a machine that busy."
        ),
        evidence=(
            "From `doctor`: the machine's busy CPUs (all processes) less the pipeline's own (main "
            "process and workers), averaged over the configurations measured; reported from 0.5 "
            "CPUs or a quarter of the usable CPUs, whichever is more."
        ),
        fix=(
            "Measure again on a quiet machine, or give the job CPUs of its own (`taskset`, "
            "cpusets, a container's `--cpuset-cpus`)."
        ),
        severity="info",
    ),
    FindingDoc(
        id="check-failed",
        title="A check could not finish",
        means=(
            "One of the doctor's steps (the look inside 2 workers, the `IterableDataset` duplicate "
            "run, the memory run, the throughput measurement) could not finish, so the findings it "
            "would have given are missing. The other findings stand."
        ),
        evidence=(
            "From `doctor`: the step's own error (the pipeline's exception with its sample index, "
            "a worker killed by a signal, no batch within `--timeout`) and the later steps not run "
            "because of it: once the pipeline itself has failed, the steps that would run it again "
            "are skipped."
        ),
        fix="Fix the cause the message names and run `feedrate doctor` again.",
        severity="warning",
    ),
    FindingDoc(
        id="copy-on-read",
        title="Worker memory grows with Python objects",
        means=(
            "The dataset holds large containers of Python objects (lists or dicts of records). "
            "Reading a Python object writes its reference count, so every worker gradually copies "
            "the memory pages of the objects it touches: memory grows in every worker, up to a "
            "copy of the containers each."
        ),
        evidence=(
            "From `doctor`, and from `tune` when the dataset holds such containers: the containers "
            "found on the dataset (attribute, type, items, approximate objects and bytes) and each "
            "worker's USS early and late in a run of your loader with 2 workers; reported when the "
            "workers' mean growth reaches a quarter of the containers' size, but at least 4 MiB "
            "and at most 16 MiB."
        ),
        fix=(
            "Hold the data in arrays, not Python objects: `np.array(...)` for numbers and "
            "fixed-width strings, an Arrow table, or the records pickled into one `np.uint8` "
            "buffer plus an offsets array."
        ),
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
        id="data-stall",
        title="The consumer waits for data",
        means=(
            "With a consumer (`--rate`, `--step-time` or `--step`), your settings leave it waiting "
            "for data more than 5% of the time: the accelerator, or the training step, idles while "
            "the loader catches up."
        ),
        evidence=(
            "From `doctor` with a consumer: at your settings, the share of the loop's time spent "
            "in `next()` waiting for a batch, and the samples/s that reached the consumer. Not "
            "reported when `too-few-workers` already says it."
        ),
        fix=(
            "What helps the bottleneck found (the `bottleneck` finding's fix); `feedrate tune "
            "TARGET --rate R` finds the fewest workers that keep a consumer of R samples/s fed."
        ),
        severity="warning",
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
        id="iterable-duplicates",
        title="An IterableDataset repeats itself in every worker",
        means=(
            "An `IterableDataset` that does not split its stream between workers: every worker "
            "runs the same `__iter__`, so each sample arrives once per worker per epoch."
        ),
        evidence=(
            "From `doctor` and `tune`: the `IterableDataset` run in 2 workers (at most 32 items "
            "each), the items hashed by content; reported when each worker yielded at least 4 "
            "distinct items and at least half of the fewer distinct items are shared by both."
        ),
        fix=(
            "In `__iter__`: `info = torch.utils.data.get_worker_info()`; yield only the items `i` "
            "with `i % info.num_workers == info.id` (or give each worker its own files or shards)."
        ),
        severity=(
            "error with `num_workers` ≥ 2 (the duplicates happen now); warning with fewer (they "
            "would with 2 or more)"
        ),
    ),
    FindingDoc(
        id="pin-memory-measured",
        title="pin_memory measured both ways on the accelerator",
        means=(
            "With an accelerator, `tune` measured its answer with `pin_memory` on and off, the "
            "loop copying every batch to the device as training does, and says whether pinned "
            "memory with `non_blocking` copies is faster end to end."
        ),
        evidence=(
            "From `tune` on a machine with CUDA or MPS: the recommended configuration and the same "
            "with `pin_memory` flipped, each measured end to end; pinning counts as faster only "
            "when its gain beats the noise; on CUDA the copy's device time per batch both ways, "
            "from CUDA events."
        ),
        fix=(
            'The copy line for your training loop: `batch = batch.to("cuda", non_blocking=True)` '
            "when pinning paid (with `pin_memory=True`), `non_blocking=False` when it did not."
        ),
        severity="info",
    ),
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
        id="pin-memory-unused",
        title="An accelerator, and pin_memory off",
        means=(
            "An accelerator is present and `pin_memory` is off: batches are copied from pageable "
            "memory, which is slower and cannot overlap compute (`non_blocking` copies need pinned "
            "memory)."
        ),
        evidence=(
            "From `doctor` and `tune`: the machine's accelerator, your loader's `pin_memory`, and "
            "the bytes of a real batch. This check does not measure the copy; `tune`'s "
            "`pin-memory-measured` does, end to end, and `feedrate transfer` times the copies."
        ),
        fix="`DataLoader(..., pin_memory=True)` and `batch.to(device, non_blocking=True)`",
        severity="warning for batches of 1 MiB or more; info for smaller ones",
    ),
    FindingDoc(
        id="pinned-copies-faster",
        title="Pinned copies are faster here",
        means=(
            "`feedrate transfer` measured host-to-device copies from pinned memory clearly faster "
            "than from pageable memory, and only pinned copies can be `non_blocking`."
        ),
        evidence=(
            "From `feedrate transfer`: the median host-to-device bandwidth (GB/s) from pinned and "
            "from pageable memory at the size nearest the batch's (the largest size measured when "
            "the batch is unknown); reported when pinned is more than 10% faster."
        ),
        fix="`DataLoader(..., pin_memory=True)` and `batch.to(device, non_blocking=True)`",
        severity="info",
    ),
    FindingDoc(
        id="pinned-copies-no-faster",
        title="Pinned copies are no faster here",
        means=(
            "`feedrate transfer` measured pinned copies not clearly faster than pageable ones: "
            "pinning would lock RAM for little gain."
        ),
        evidence=(
            "From `feedrate transfer`: the same bandwidths as for `pinned-copies-faster`, pinned "
            "within 10% of pageable."
        ),
        fix=(
            "Keep `pin_memory=False` unless a tune with the copy to the device "
            "(`pin-memory-measured`) says otherwise."
        ),
        severity="info",
    ),
    FindingDoc(
        id="pinned-memory",
        title="How much memory pin_memory locks",
        means=(
            "With `pin_memory=True` DataLoader holds every batch in flight in pinned (page-locked) "
            "memory, which the OS cannot swap or reclaim. This says how much, and warns when it is "
            "more than 10% of the machine's memory."
        ),
        evidence=(
            "From `tune` with an accelerator: the recommended configuration's batch bytes × "
            "(`num_workers` × `prefetch_factor` + 1), the batches the workers have ready and the "
            "one the loop holds, against the memory limit (or the total memory)."
        ),
        fix=(
            "Over 10%: a shallower queue, `DataLoader(..., prefetch_factor=N)` with N half the "
            "current one (the message gives it). Otherwise none needed."
        ),
        severity="warning over 10% of memory; info otherwise",
    ),
    FindingDoc(
        id="pinning-costs",
        title="Pinning each batch costs more than reusing a buffer",
        means=(
            "`feedrate transfer` measured pinning a fresh tensor (what DataLoader's pin-memory "
            "thread does for every batch, in the main process) at more than twice the cost of "
            "copying it into a pinned buffer kept between batches."
        ),
        evidence=(
            "From `feedrate transfer`: the median time of `tensor.pin_memory()` against a copy "
            "into a kept pinned buffer, at the batch's size (or the largest measured); reported "
            "when pinning takes more than twice as long, and more than 0.1 ms."
        ),
        fix=(
            "With a CPU-bound main process, reuse a pinned buffer (`buf.copy_(batch); "
            "buf.to(device, non_blocking=True)`) instead of `pin_memory=True`."
        ),
        severity="info",
    ),
    FindingDoc(
        id="shared-rng",
        title="Every worker draws the same random numbers",
        means=(
            "The dataset holds its own random generator (numpy's, `random.Random` or a "
            "`torch.Generator`), created before the workers start. Each worker gets a copy in the "
            "same state, so all workers produce the same 'random' augmentations, and without "
            "`persistent_workers` each epoch repeats the last."
        ),
        evidence=(
            "From `doctor` and `tune`: inside 2 workers, right after `worker_init_fn`, one draw "
            "from each generator found on the dataset; reported when every worker drew the same "
            "value."
        ),
        fix=(
            "Seed it per worker: `def worker_init_fn(worker_id): ds = "
            "torch.utils.data.get_worker_info().dataset; ds.rng = "
            "np.random.default_rng(torch.initial_seed())` (the message gives the line for each "
            "generator found), and `DataLoader(..., worker_init_fn=worker_init_fn)`."
        ),
        severity=(
            "error with `num_workers` ≥ 2; warning with fewer (the same augmentations would come "
            "with 2 or more)"
        ),
    ),
    FindingDoc(
        id="shm-too-small",
        title="/dev/shm is too small for the batches in flight",
        means=(
            "`/dev/shm`, where workers hand batches to the main process, is too small for the "
            "batches the settings keep in flight (`num_workers` × `prefetch_factor` of them). A "
            "worker that cannot write its batch dies of a bus error (SIGBUS). Docker's default of "
            "64 MiB is a common cause."
        ),
        evidence=(
            "From `doctor` and `tune`: the free (and total) size of `/dev/shm` against a real "
            "batch's bytes × `num_workers` × `prefetch_factor`, with 1.5× headroom; checked for "
            "your settings and for the suggested ones."
        ),
        fix=(
            "`docker run --shm-size=Ng` (or `--ipc=host`; on Kubernetes an `emptyDir` with "
            "`medium: Memory` at `/dev/shm`), or keep `num_workers` × `prefetch_factor` at most "
            "the batches that fit (the message gives both numbers)."
        ),
        severity=(
            "error when the batches in flight do not fit; warning when they fit without the 1.5× "
            "headroom"
        ),
    ),
    FindingDoc(
        id="startup-cost",
        title="Workers restart every epoch at a measured cost",
        means=(
            "Your workers restart every epoch (`persistent_workers=False`), and starting them "
            "costs a measurable share of the epoch."
        ),
        evidence=(
            "From `tune` and `doctor`: the time each later epoch waited for its first batch (else "
            "the start-up to the first batch) against the epoch's length at the measured rate; "
            "reported from 1 s or 1% of an epoch. The doctor adds the likely cause when it sees "
            "one: a slow `worker_init_fn`, or the `spawn` or `forkserver` start method (every "
            "worker imports your modules and unpickles the dataset)."
        ),
        fix="`DataLoader(..., persistent_workers=True)`",
        severity="warning from 5% of an epoch; info below",
    ),
    FindingDoc(
        id="thread-oversubscription",
        title="More compute threads than CPUs",
        means=(
            "Each worker may run several compute threads (torch's intra-op pool, OpenCV's, "
            "`OMP_NUM_THREADS` and the like), and all workers together run far more threads than "
            "there are usable CPUs: they preempt one another and the main process."
        ),
        evidence=(
            "From `doctor` and `tune`: read inside the workers after `worker_init_fn`, torch's "
            "thread count, OpenCV's, and `OMP_NUM_THREADS`, `MKL_NUM_THREADS`, "
            "`OPENBLAS_NUM_THREADS`, `NUMEXPR_NUM_THREADS`; reported when a worker may run 2 or "
            "more and workers × threads is at least twice the usable CPUs; with the OS threads "
            "each worker ran while loading, where measured."
        ),
        fix=(
            "In `worker_init_fn`: `torch.set_num_threads(1)` (and `cv2.setNumThreads(1)` where "
            "OpenCV is used); set the thread variables to 1, or unset them."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="threads-chosen",
        title="The recommendation fetches on threads",
        means=(
            "The recommendation fetches each batch's samples on threads inside each worker "
            "(`feedrate.threaded`): they overlap the pipeline's waits with fewer processes and "
            "less memory."
        ),
        evidence=(
            "From `tune --threads`: the threaded configuration measured best, its worker memory, "
            "and the thread-safety check's result (samples fetched on threads matched the same "
            "samples fetched one by one, or, for a dataset that never returns the same sample "
            "twice, no unsafe objects were found)."
        ),
        fix=(
            "Keep `__getitem__` safe to call from several threads at once: no shared open file, "
            "database handle or random generator on the dataset."
        ),
        severity="info",
    ),
    FindingDoc(
        id="threads-unsafe",
        title="Threads could help, but are not safe here",
        means=(
            "Threads inside workers could overlap this pipeline's waits, but the thread-safety "
            "check failed, so no threaded configuration was measured or recommended."
        ),
        evidence=(
            "From `tune`, where the workers mostly wait: objects on the dataset that threads must "
            "not share (an open file, an h5py, LMDB or sqlite3 handle, a random generator the "
            "dataset holds), a fetch on threads that raised, or a sample that came out different "
            "on threads than fetched one by one (up to 32 samples, for a deterministic dataset)."
        ),
        fix=(
            "Open such handles per thread (`threading.local()`) or per worker (`worker_init_fn`), "
            "draw random numbers from torch's or numpy's global generators, then tune again with "
            "`--threads`."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="threads-would-help",
        title="Threads measured better, but were not allowed",
        means=(
            "A configuration with threads inside workers measured faster than the recommendation, "
            "or as fast on at most half its worker memory, but threads need a thread-safe "
            "`__getitem__`, so `tune` recommends them only with `--threads`."
        ),
        evidence=(
            "From `tune` without `--threads`: the threaded configuration measured after the "
            "search, its samples/s and worker memory (USS) against the recommendation's, and the "
            "thread-safety check's result."
        ),
        fix=(
            "`feedrate tune TARGET --threads`, or in code `DataLoader(feedrate.threaded(dataset, "
            "T), num_workers=W, ...)` with the T and W the message gives."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="too-few-workers",
        title="Your num_workers is too low",
        means=(
            "Your `num_workers` is below a count that measured better: without a consumer, fewer "
            "than the fastest; with one, too few to keep it fed."
        ),
        evidence=(
            "From `tune` and `doctor`: your settings and the better count, measured again side by "
            "side; the samples/s of each and the samples/s lost; with a consumer, the share of "
            "time it waited for data at each. Reported only when the gain beats the noise."
        ),
        fix="`DataLoader(..., num_workers=N)` with the count the message gives.",
        severity="warning",
    ),
    FindingDoc(
        id="too-many-workers",
        title="Your num_workers is too high",
        means=(
            "Your `num_workers` is above a count that measured better: without a consumer, fewer "
            "workers were faster (they competed for the CPUs, or the copies between processes cost "
            "more than they saved); with one, fewer workers keep it fed as well, for less memory "
            "and start-up."
        ),
        evidence=(
            "From `tune` and `doctor`: your settings and the better count, measured again side by "
            "side; without a consumer, the samples/s lost (only when the gain beats the noise); "
            "with one, the stall at each and the memory saved."
        ),
        fix="`DataLoader(..., num_workers=N)` with the count the message gives.",
        severity=(
            "warning without a consumer (samples/s are lost); info with one (only memory and "
            "start-up are at stake)"
        ),
    ),
    FindingDoc(
        id="workers-past-cpus",
        title="More workers than CPUs, on purpose",
        means=(
            "The recommendation uses more workers than usable CPUs because more of them measured "
            "faster, usually because they mostly wait (on storage or the network). DataLoader "
            "warns about any count above its suggested maximum; that warning is a rule of thumb, "
            "this count was measured."
        ),
        evidence=(
            "From `tune`: the recommended count against the usable CPUs, its samples/s against "
            "your settings', and each worker's CPU use."
        ),
        fix=(
            "`loader = result.loader()` (a rebuilt loader that does not warn), or "
            "`feedrate.allow_many_workers(your_loader)` to drop the warning from a loader you "
            "built."
        ),
        severity="info",
    ),
)

#: Every finding id feedrate reports, in alphabetical order.
CATALOG: dict[str, FindingDoc] = {doc.id: doc for doc in _DOCS}


def explain(finding_id: str) -> FindingDoc:
    """The entry for ``finding_id``. Raises ``KeyError`` (with the id as its argument) for an
    id that is not in ``CATALOG``; ``close_matches`` suggests what was meant."""
    try:
        return CATALOG[finding_id]
    except KeyError:
        raise KeyError(finding_id) from None


def close_matches(finding_id: str) -> list[str]:
    """Up to 3 known ids that look like ``finding_id`` (a typo, another case, spaces or
    underscores for hyphens), closest first; empty when none is close."""
    wanted = finding_id.strip().lower().replace("_", "-").replace(" ", "-")
    if wanted in CATALOG and wanted != finding_id:
        return [wanted]
    return difflib.get_close_matches(wanted, list(CATALOG), n=3, cutoff=0.6)


def markdown_section(doc: FindingDoc) -> str:
    """The entry as a section of docs/findings.md: a ``## `id` `` heading (its anchor is the
    id), the title, then the four fields."""
    return (
        f"## `{doc.id}`\n\n"
        f"*{doc.title}*\n\n"
        f"**Means.** {doc.means}\n\n"
        f"**Evidence.** {doc.evidence}\n\n"
        f"**Fix.** {doc.fix}\n\n"
        f"**Severity.** {doc.severity}\n"
    )
