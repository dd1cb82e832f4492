"""The data stall before and after ``feedrate tune``, on one pipeline per data library
(webdataset, litdata, MosaicML streaming, Hugging Face datasets), each as its users write it
(the library's own dataset and loader classes, ``num_workers=0`` as first written) with 0.5 ms of
CPU work per sample, fed to a consumer that takes a batch every ``step`` seconds (a simulated
accelerator, 1.6× as fast as the pipeline without workers).

For each library: tune with that consumer (``budget_s``), then the user's settings and tune's
pick measured in turn, ``rounds`` times each (interleaved, so the machine's load falls on
both alike), and the medians of their stall (the share of the time the loop waited for data)
and samples/s. Writes ``benchmarks/results/libraries.json`` and ``.md``.

    python benchmarks/libraries.py                      # all four, ~5 min on 2 CPUs
    python benchmarks/libraries.py --only webdataset --rounds 3 --budget 20
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the data writers
from common import machine_line

import feedrate
from feedrate.measuring.consumer import make_consumer

import library_data as data

RESULTS = Path(__file__).resolve().parent / "results"
WORK_S = 0.0005  # CPU seconds of work per sample
BATCH = 16
SAMPLES = 4000  # per epoch: 2 s of work without workers


def work(sample: Any) -> Any:
    """0.5 ms of CPU (decoding and augmenting, as far as the CPUs can tell)."""
    end = time.perf_counter() + WORK_S
    while time.perf_counter() < end:
        pass
    return sample


def webdataset_loader(root: Path) -> Callable[[], DataLoader[Any]]:
    import webdataset as wds

    urls = data.write_tars(root, shards=8, n=SAMPLES)

    def make() -> DataLoader[Any]:
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()
        return DataLoader(ds.map(work).to_tuple("npy", "id"), batch_size=BATCH)

    return make


def litdata_loader(root: Path) -> Callable[[], DataLoader[Any]]:
    import litdata

    class Augmented(litdata.StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: Any) -> Any:
            return work(super().__getitem__(index))

    data.write_litdata(root, n=SAMPLES)

    def make() -> DataLoader[Any]:
        ds = Augmented(str(root), shuffle=True, seed=7)
        return litdata.StreamingDataLoader(ds, batch_size=BATCH)  # type: ignore[no-any-return]

    return make


def streaming_loader(root: Path) -> Callable[[], DataLoader[Any]]:
    data.stub_unloadable_torchvision()
    import streaming

    class Augmented(streaming.StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> Any:
            return work(super().__getitem__(index))

    data.write_mds(root, n=SAMPLES)

    def make() -> DataLoader[Any]:
        ds = Augmented(local=str(root), batch_size=BATCH, shuffle=True, shuffle_seed=3)
        return streaming.StreamingDataLoader(ds, batch_size=BATCH)  # type: ignore[no-any-return]

    return make


def datasets_loader(root: Path) -> Callable[[], DataLoader[Any]]:
    table = data.hf_dataset(n=SAMPLES)

    def make() -> DataLoader[Any]:
        ds = table.to_iterable_dataset(num_shards=8).map(work).with_format("torch")
        return DataLoader(ds, batch_size=BATCH)

    return make


PIPELINES = {
    "webdataset": webdataset_loader,
    "litdata": litdata_loader,
    "streaming": streaming_loader,
    "datasets": datasets_loader,
}


def measured(make: Callable[[], DataLoader[Any]], config: Any, step: float) -> dict[str, Any]:
    m = feedrate.measure(
        make, config, seconds=3.0, consumer=make_consumer(step_time=step), device=None
    )
    return {"stall": m.stall_fraction, "samples_per_s": m.samples_per_s}


def one(name: str, root: Path, rounds: int, budget_s: float) -> dict[str, Any]:
    make = PIPELINES[name](root)
    alone = feedrate.measure(make, seconds=2.0, device=None)
    step = BATCH / (1.6 * alone.samples_per_s)  # the consumer: 1.6× w=0's rate
    began = time.monotonic()
    result = feedrate.tune(make, step_time=step, budget_s=budget_s, use_cache=False, device=None)
    tune_s = time.monotonic() - began
    mine, best = feedrate.config_of(make()), result.best.config
    runs: dict[str, list[dict[str, Any]]] = {"yours": [], "tuned": []}
    for _ in range(rounds):
        runs["yours"].append(measured(make, mine, step))
        runs["tuned"].append(measured(make, best, step))
    median = {
        side: {k: statistics.median(r[k] or 0.0 for r in rs) for k in ("stall", "samples_per_s")}
        for side, rs in runs.items()
    }
    print(
        f"{name}: yours {mine.label()} stall {median['yours']['stall']:.0%}, tuned "
        f"{best.label()} stall {median['tuned']['stall']:.0%} (tune {tune_s:.0f} s)",
        flush=True,
    )
    failed = [f for f in result.findings if f.id in ("trials-failed", "check-failed")]
    return {
        "pipeline": name,
        "failures": [f"{f.id}: {f.message}" for f in failed],
        "w0_samples_per_s": alone.samples_per_s,
        "step_s": step,
        "yours": mine.to_dict(),
        "tuned": best.to_dict(),
        "tune_seconds": tune_s,
        "runs": runs,
        "median": median,
    }


def report(doc: dict[str, Any]) -> str:
    lines = [
        "# The stall before and after tune, per data library",
        "",
        f"`{doc['command']}` — {doc['date']}, feedrate {doc['feedrate_version']}.",
        "",
        f"Machine: {doc['machine_line']}. Shared with other work while it ran (load average "
        f"{doc['load'][0]:.1f} before, {doc['load'][1]:.1f} after): the figures are medians of "
        "interleaved runs, both sides under the same load.",
        "",
        f"Each pipeline: {SAMPLES} samples, {WORK_S * 1000:g} ms of CPU per sample, batches of "
        f"{BATCH}, `num_workers=0` as written; the consumer takes a batch every `step` s "
        "(1.6× the rate without workers). Stall: the share of the loop's time spent waiting "
        f"for data; {doc['rounds']} rounds of 3 s each side.",
        "",
        "| library | step (ms) | your settings | stall | samples/s | tune's pick | stall | "
        "samples/s | tune took |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        y, t = r["median"]["yours"], r["median"]["tuned"]
        mine = feedrate.LoaderConfig.from_dict(r["yours"]).label()
        best = feedrate.LoaderConfig.from_dict(r["tuned"]).label()
        lines.append(
            f"| {r['pipeline']} | {r['step_s'] * 1000:.1f} | {mine} | {y['stall']:.0%} | "
            f"{y['samples_per_s']:,.0f} | {best} | {t['stall']:.0%} | {t['samples_per_s']:,.0f} "
            f"| {r['tune_seconds']:.0f} s |"
        )
    failures = [(r["pipeline"], f) for r in doc["results"] for f in r.get("failures", [])]
    if failures:
        lines += ["", "What failed during tune (its findings):", ""]
        lines += [f"* {name}: {text}" for name, text in failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PIPELINES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--out", default=str(RESULTS / "libraries"))
    args = parser.parse_args(argv)
    results = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            root = Path(tmp) / name
            root.mkdir()
            results.append(one(name, root, args.rounds, args.budget))
    facts = feedrate.machine_facts().to_dict()
    doc = {
        "schema": "feedrate.bench.libraries/1",
        "command": "python benchmarks/libraries.py " + " ".join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "feedrate_version": feedrate.__version__,
        "machine": facts,
        "machine_line": machine_line(facts),
        "rounds": args.rounds,
        "load": [load_before, os.getloadavg()[0]],
        "results": results,
    }
    Path(args.out + ".json").write_text(json.dumps(doc, indent=2) + "\n")
    Path(args.out + ".md").write_text(report(doc))
    print(f"wrote {args.out}.json and .md")


if __name__ == "__main__":
    main(sys.argv[1:])
