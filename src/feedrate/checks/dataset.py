"""Diagnosis rules about what the dataset holds and what its workers see: copies of Python
objects growing in every worker, an IterableDataset repeating itself in every worker, random
generators shared by all workers, threads oversubscribing the CPUs.

Pure functions over the evidence the experiments gathered (``experiments``, ``inspect_dataset``),
each tested with synthetic evidence. ``workers`` is the worker count being judged: the user's,
or feedrate's suggestion when the user has none (a trap without workers is latent, so it is a
warning, not an error).
"""

from __future__ import annotations

from feedrate.checks.streams import stream_verdict
from feedrate.results.evidence import Container, SampleRun, StreamDigests, WorkerView
from feedrate.results.findings import Finding, FindingDoc
from feedrate.units import counted, size

MiB = 2**20
#: Mean worker USS growth over the run that, with large Python containers, is copy-on-read:
#: ``GROWTH_SHARE`` of the containers' size, but at least ``GROWTH_FLOOR`` (above the noise of
#: a worker's own allocations) and at most ``GROWTH_ENOUGH`` (plenty, whatever they hold).
GROWTH_FLOOR = 4 * MiB
GROWTH_ENOUGH = 16 * MiB
GROWTH_SHARE = 0.25
#: Compute threads (all workers) per usable CPU from which workers oversubscribe the CPUs.
OVERSUBSCRIBED = 2.0


def _attr(path: str) -> str:
    return f"self.{path}"


def copy_on_read_finding(containers: list[Container], run: SampleRun | None) -> Finding | None:
    """Worker memory grew while the dataset holds large containers of Python objects."""
    if not containers or run is None or not run.workers:
        return None
    growth = sum(w.growth for w in run.workers) / len(run.workers)
    total = sum(c.bytes for c in containers)
    if growth < max(GROWTH_FLOOR, min(GROWTH_ENOUGH, GROWTH_SHARE * total)):
        return None
    per_worker = ", ".join(
        f"worker {w.worker_id} {size(w.uss_early)} → {size(w.uss_late)}" for w in run.workers
    )
    frac = run.epoch_fraction
    span = f"{frac:.0%} of an epoch" if frac is not None else f"{run.memory_seconds:.1f} s"
    held = "; ".join(
        f"{_attr(c.path)}: {c.type_name} of {c.items:,} {c.item_type} "
        f"(~{c.objects:,} objects, ~{size(c.bytes)})"
        for c in containers[:3]
    )
    first = containers[0].path
    return Finding(
        "copy-on-read",
        "warning",
        f"worker memory (USS) grows while reading the dataset: {per_worker} over {span}; the "
        f"dataset holds {held}. Reading a Python object writes its reference count, so every "
        f"worker copies the pages of the objects it touches, up to ~{size(total)} per worker",
        f"hold the data in arrays, not Python objects: {_attr(first)} = np.array(...) (numbers, "
        "fixed-width strings), an Arrow table, or the records pickled into one np.uint8 buffer "
        "plus an offsets array",
    )


def duplicates_finding(digests: StreamDigests, workers: int) -> Finding | None:
    """Two workers of an IterableDataset yielded mostly the same samples (by identity, or by
    content with their random generators seeded alike)."""
    seen = stream_verdict(digests)
    if seen.verdict != "duplicates":
        return None
    (wa, wb), (na, nb) = seen.workers, seen.counts
    now = workers >= 2
    effect = (
        f"with num_workers={workers} every sample arrives up to {workers} times per epoch"
        if now
        else "with 2 or more workers every sample would arrive once per worker"
    )
    how = (
        "the same ids, keys or labels"
        if seen.by == "identity"
        else "identical content, random generators seeded alike in both"
    )
    return Finding(
        "iterable-duplicates",
        "error" if now else "warning",
        f"worker {wa} and worker {wb} yielded the same samples: {seen.shared} of the "
        f"{seen.fewest} {seen.unit} of the first {na} and {nb} match ({how}); the "
        f"IterableDataset does not split its stream by get_worker_info(), so {effect}",
        SPLIT_FIX,
    )


#: The fix of ``iterable-duplicates``, wherever it is found.
SPLIT_FIX = (
    "in __iter__: info = torch.utils.data.get_worker_info(); yield only the items i with "
    "i % info.num_workers == info.id (or give each worker its own files or shards: "
    "webdataset's workersplitter=wds.split_by_worker)"
)


def copies_in_run_finding(why: str, workers: int) -> Finding:
    """``feedrate run``'s ``iterable-duplicates``: the probe at its first epoch (``why``, from
    ``autotuning.start.unsplit_stream``) saw 2 workers yield the same samples; with
    ``workers`` of 2 or more, the run's own figures counted the copies."""
    effect = (
        f"with num_workers={workers} every sample arrived up to {workers} times per epoch, and "
        "the figures above count the copies"
        if workers >= 2
        else "with 2 or more workers every sample would arrive once per worker"
    )
    return Finding(
        "iterable-duplicates",
        "error" if workers >= 2 else "warning",
        f"probed at its first epoch: {why}; {effect}",
        SPLIT_FIX,
    )


def epoch_per_worker_finding(per_worker: int | None, workers: int) -> Finding | None:
    """A webdataset pipeline of resampled shards with ``.with_epoch(n)``: each worker yields n
    samples an epoch, so the epoch grows with ``num_workers`` (``libraries.epoch_per_worker``)."""
    if per_worker is None:
        return None
    now = f"{per_worker * max(1, workers):,} with your num_workers={workers}"
    return Finding(
        "epoch-per-worker",
        "warning",
        f"the dataset's with_epoch({per_worker:,}) counts per worker (resampled shards: every "
        f"worker draws its own stream), so an epoch is {per_worker:,} × num_workers samples "
        f"({now}); another worker count, such as tune's or autotune's, changes the epoch",
        "set the epoch on the loader instead, where it counts batches whatever the workers: "
        "wds.WebLoader(dataset, ...).with_epoch(batches_per_epoch)",
    )


_RESEED = {
    "numpy.random.Generator": "np.random.default_rng(torch.initial_seed())",
    "numpy.random.RandomState": "np.random.RandomState(torch.initial_seed() % 2**32)",
    "random.Random": "random.Random(torch.initial_seed())",
    "torch.Generator": "torch.Generator().manual_seed(torch.initial_seed())",
    "numpy.random (global)": "np.random.seed(torch.initial_seed() % 2**32)",
    "random (global)": "random.seed(torch.initial_seed())",
}


def shared_generators(views: list[WorkerView]) -> list[tuple[str, str, str]]:
    """(path, kind, draw) of each generator every worker drew the same value from."""
    if len(views) < 2:
        return []
    shared = []
    for path, (kind, value) in views[0].draws.items():
        same = all(v.draws.get(path, (kind, None))[1] == value for v in views[1:])
        if value is not None and same:
            shared.append((path, kind, value))
    return shared


def shared_rng_finding(views: list[WorkerView], workers: int) -> Finding | None:
    """The dataset's own random generators give every worker the same draws."""
    shared = shared_generators(views)
    if not shared:
        return None
    held = [(p, kind) for p, kind, _ in shared if not p.startswith("<")]
    common = [kind for p, kind, _ in shared if p.startswith("<")]
    ids = " and ".join(str(v.worker_id) for v in views)
    now = workers >= 2
    effect = (
        f"so all {workers} workers produce the same 'random' augmentations"
        if now
        else "so with 2 or more workers every worker would produce the same 'random' "
        "augmentations (and without persistent_workers each epoch repeats the last)"
    )
    what, fixes = [], []
    if held:
        named = ", ".join(f"{_attr(p)} ({kind})" for p, kind in held)
        what.append(
            f"the dataset holds its own random generator {named}, created before the workers start"
        )
        reseed = "; ".join(f"ds.{p} = {_RESEED[kind]}" for p, kind in held)
        fixes.append(f"ds = torch.utils.data.get_worker_info().dataset; {reseed}")
    if common:
        what.append(
            f"the global generator {' and '.join(common)} is seeded alike in every "
            "worker (torch seeds it per worker: a constant seed in worker_init_fn undoes "
            "that)"
        )
        fixes.append("; ".join(_RESEED[kind] for kind in common))
    # A global generator seeded alike costs only where the transforms draw from it (numpy's
    # or Python's random; torch's own are seeded apart): said as a warning, with that if.
    severe = now and bool(held)
    if common and not held:
        effect += " where your transforms draw from it (np.random.*, random.*)"
    return Finding(
        "shared-rng",
        "error" if severe else "warning",
        f"{'; '.join(what)}: workers {ids} each drew {shared[0][2]} from it right after "
        f"worker_init_fn, {effect}",
        f"seed it per worker: def worker_init_fn(worker_id): {'; '.join(fixes)}  "
        "(DataLoader(..., worker_init_fn=worker_init_fn); or call this from yours, in place "
        "of a constant seed)",
    )


def _env_threads(env: dict[str, str]) -> tuple[int, str | None]:
    best, name = 0, None
    for key, value in env.items():
        try:
            n = int(value)
        except ValueError:
            continue
        if n > best:
            best, name = n, key
    return best, name


def worker_threads(view: WorkerView) -> tuple[int, list[str]]:
    """Compute threads one worker may run at once, and where that number comes from (a native
    library's pool where a sample started its threads: ``WorkerView.pools``)."""
    sources = [(view.torch_threads, f"torch {view.torch_threads}")]
    if view.cv2_threads is not None:
        sources.append((view.cv2_threads, f"OpenCV {view.cv2_threads}"))
    env_n, env_name = _env_threads(view.env)
    if env_name:
        sources.append((env_n, f"{env_name}={env_n}"))
    for library, n in sorted(view.pools.items()):
        sources.append((n, f"{_POOLS.get(library, library)} {n}"))
    most = max(n for n, _ in sources)
    return most, [text for n, text in sources if n > 1]


def thread_finding(
    views: list[WorkerView], run: SampleRun | None, workers: int, cpus: int
) -> Finding | None:
    """Threads per worker × workers well above the usable CPUs."""
    if not views or workers == 0:
        return None
    most = max(w.os_threads for w in run.workers) if run is not None and run.workers else None
    per_worker, sources = max((worker_threads(v) for v in views), key=lambda x: x[0])
    total = per_worker * workers
    if per_worker < 2 or total < OVERSUBSCRIBED * cpus:
        return None
    running = f"; worker processes ran up to {most} OS threads each while loading" if most else ""
    fixes = ["torch.set_num_threads(1)"]
    if any(s.startswith("OpenCV") for s in sources):
        fixes.append("cv2.setNumThreads(1)")
    if any(s.split()[0] in _POOLS.values() for s in sources):
        # Read once, when the library loads: a variable set in the worker comes too late.
        fixes.append("threadpoolctl.threadpool_limits(1)")
    env = [s.split("=")[0] for s in sources if "=" in s]
    return Finding(
        "thread-oversubscription",
        "warning",
        f"each worker may run {per_worker} compute threads ({', '.join(sources)}, read in "
        f"the workers after worker_init_fn): {workers} workers × {per_worker} = {total} "
        f"threads on {counted(cpus, 'usable CPU')}{running}; they preempt one another and the "
        "main process",
        f"in worker_init_fn: {'; '.join(fixes)}"
        # Unset, OpenBLAS and OpenMP run one thread per core: the same oversubscription.
        + (f"; and set {', '.join(env)}=1 before starting Python" if env else ""),
    )


#: threadpoolctl's names of the native libraries, as the finding writes them.
_POOLS = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS", "openmp": "OpenMP"}


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
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
        id="iterable-duplicates",
        title="An IterableDataset repeats itself in every worker",
        means=(
            "An `IterableDataset` that does not split its stream between workers: every worker "
            "runs the same `__iter__`, so each sample arrives once per worker per epoch."
        ),
        evidence=(
            "From `doctor`, `tune` and `run` (at the first epoch of the first 2 streams a "
            "script trains on): the `IterableDataset` run in 2 workers (at most 64 items "
            "each), their random generators seeded alike before every item, each item hashed "
            "by identity (its ids, labels, keys and other non-float parts, which random "
            "augmentation leaves alone) and by content. Distinct ids are compared as sets, "
            "labels position by position; items without any are compared by content. Items "
            "that are nothing but random draws (synthetic data: one value at the even seeds, "
            "another at the odd ones) repeat no sample, since DataLoader seeds every worker "
            "apart. Reported when each worker "
            "yielded at least 4 items to compare and at least half of them match. `autotune` "
            "gives an `IterableDataset` another worker count only when 2 workers were seen to "
            "yield different samples, or its library splits streams by worker."
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
        id="epoch-per-worker",
        title="An epoch that grows with the worker count",
        means=(
            "A webdataset pipeline that draws its shards at random in every worker "
            "(`resampled=True`) and sets its epoch on the dataset with `.with_epoch(n)`: each "
            "worker yields n samples, so one epoch is n × `num_workers` samples, and changing "
            "the worker count (as `tune` and `autotune` do) changes the epoch."
        ),
        evidence=(
            "From `doctor`: read off the dataset object (its shard list resamples and its "
            "`with_epoch` is set); nothing is run."
        ),
        fix=(
            "Set the epoch where it counts batches whatever the workers: "
            "`wds.WebLoader(dataset, ...).with_epoch(batches_per_epoch)`."
        ),
        severity="warning",
    ),
    FindingDoc(
        id="shared-rng",
        title="Every worker draws the same random numbers",
        means=(
            "The dataset holds its own random generator (numpy's, `random.Random` or a "
            "`torch.Generator`), created before the workers start, or a `worker_init_fn` seeds "
            "numpy's or Python's global generator with a constant (torch seeds them per worker; "
            "that undoes it). Each worker draws the same numbers, so all workers produce the "
            "same 'random' augmentations, and without `persistent_workers` each epoch repeats "
            "the last."
        ),
        evidence=(
            "From `doctor` and `tune`: inside 2 workers, right after `worker_init_fn`, one draw "
            "from each generator found on the dataset, and from numpy's and Python's global "
            "ones; reported when every worker drew the same value."
        ),
        fix=(
            "Seed it per worker: `def worker_init_fn(worker_id): ds = "
            "torch.utils.data.get_worker_info().dataset; ds.rng = "
            "np.random.default_rng(torch.initial_seed())` (the message gives the line for each "
            "generator found), and `DataLoader(..., worker_init_fn=worker_init_fn)`."
        ),
        severity=(
            "error with `num_workers` ≥ 2; warning with fewer (the same augmentations would come "
            "with 2 or more), and for a global generator alone (it costs only where the "
            "transforms draw from it)"
        ),
    ),
    FindingDoc(
        id="thread-oversubscription",
        title="More compute threads than CPUs",
        means=(
            "Each worker may run several compute threads (torch's intra-op pool, OpenCV's, "
            "numpy's OpenBLAS or MKL, OpenMP), and all workers together run far more threads "
            "than there are usable CPUs: they preempt one another and the main process. With no "
            "variable set, OpenBLAS and OpenMP run one thread per core in every worker."
        ),
        evidence=(
            "From `doctor` and `tune`: read inside the workers after `worker_init_fn`, torch's "
            "thread count, OpenCV's, the thread pools of the native libraries loaded (OpenBLAS, "
            "MKL, BLIS, OpenMP, as threadpoolctl reads them, where one sample started their "
            "threads: a pool loaded but never called costs nothing), and `OMP_NUM_THREADS`, "
            "`MKL_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, `NUMEXPR_NUM_THREADS`; reported when a "
            "worker may run 2 or more and workers × threads is at least twice the usable CPUs; "
            "with the OS threads each worker ran while loading, where measured."
        ),
        fix=(
            "In `worker_init_fn`: `torch.set_num_threads(1)` (and `cv2.setNumThreads(1)` where "
            "OpenCV is used, `threadpoolctl.threadpool_limits(1)` where numpy's BLAS or OpenMP "
            "runs several); the thread variables set to 1 before Python starts. Unset, they "
            "mean one thread per core: the same oversubscription."
        ),
        severity="warning",
    ),
)
