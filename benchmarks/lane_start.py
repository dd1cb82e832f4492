"""What does autotune's switch to a lane of many new workers cost the training loop?

A short epoch of ``remote`` (a ~10 ms wait per sample, batch 16) under a simulated consumer
(``RATE`` samples/s), on autotune's own lanes: a lane of ``FROM`` workers yields the first
``SWITCH_AT`` batches, then a lane of ``TO`` workers takes the rest of the epoch's indices, the
first lane drained in order meanwhile (as autotune switches). Two ways of starting the second
lane, interleaved round by round (the order alternating), so a drifting machine affects both:

* ``held``: ``Lane.start`` in the loop's thread (autotune before this benchmark): the loop waits
  while the workers fork;
* ``beside``: ``Lane.begin``, on a thread of its own, while the loop drains the first lane
  (autotune since): the loop waits only if the drain ends first (``ready``).

Per round: the epoch's wall time, and how long the loop waited on the start. Medians and the
ratio of the medians are printed and written to ``benchmarks/results/lane-start.{json,md}``.

    python benchmarks/lane_start.py                   # 32 -> 96 and 2 -> 32, 5 rounds (~4 min)
    python benchmarks/lane_start.py --pairs 32:96 --rounds 9
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from autotune import long_epoch
from common import commit_label, guarded, machine_line, provenance
from torch.utils.data import DataLoader

from feedrate.autotuning.lanes import Lane, Stream
from feedrate.loader.batches import sample_counter
from feedrate.loader.config import LoaderConfig
from feedrate.machine.facts import collect

from pipelines import BY_NAME

SCHEMA = "feedrate.bench.lane_start/1"
RATE = 1451.0  # samples/s: half the grid's best on remote (as benchmarks/autotune.py's consumer)
EPOCH_S = 4.0  # the epoch's length at RATE
SWITCH_AT = 150  # batches the first lane yields before the switch


def epoch(loader: DataLoader[Any], pair: tuple[int, int], mode: str) -> dict[str, float]:
    """One epoch, switching lanes at ``SWITCH_AT``: its seconds and the loop's wait on the
    second lane's start."""
    count = sample_counter(loader)
    stream = Stream(iter(loader.batch_sampler), len(loader))  # type: ignore[arg-type]
    lane = Lane(loader, LoaderConfig(pair[0], prefetch_factor=2), True, 0)
    nxt: Lane | None = None
    waited, batches = 0.0, 0
    began = time.perf_counter()
    lane.start(stream)
    try:
        while True:
            try:
                batch = next(lane.it)
            except StopIteration:
                if nxt is None:
                    break
                t = time.perf_counter()
                nxt.ready()
                waited += time.perf_counter() - t
                lane.close()
                lane, nxt = nxt, None
                continue
            batches += 1
            time.sleep(count(batch) / RATE)
            if batches == SWITCH_AT:
                nxt = Lane(loader, LoaderConfig(pair[1], prefetch_factor=2), True, 1)
                lane.freeze()
                t = time.perf_counter()
                if mode == "held":
                    nxt.start(stream)
                    waited = time.perf_counter() - t
                else:
                    nxt.begin(stream)
        seconds = time.perf_counter() - began
    finally:
        lane.close()
        if nxt is not None:
            nxt.close()
    assert batches == len(loader), (batches, len(loader))
    return {"epoch_s": seconds, "waited_s": waited}


def run(pairs: list[tuple[int, int]], rounds: int, out: Path) -> dict[str, Any]:
    loader = long_epoch(BY_NAME["remote"].factory(), RATE, EPOCH_S)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **provenance(),
        "machine": collect().to_dict(),
        "rate": RATE,
        "epoch_batches": len(loader),
        "switch_at": SWITCH_AT,
        "pairs": [],
    }
    for pair in pairs:
        got: dict[str, list[dict[str, float]]] = {"held": [], "beside": []}
        for r in range(rounds):
            for mode in ("held", "beside") if r % 2 == 0 else ("beside", "held"):
                got[mode].append(epoch(loader, pair, mode))
                last = got[mode][-1]
                print(
                    f"{pair[0]:>3} -> {pair[1]:<3} {mode:<6} epoch {last['epoch_s']:6.2f} s, "
                    f"loop waited {last['waited_s']:5.2f} s",
                    flush=True,
                )
        doc["pairs"].append({"from": pair[0], "to": pair[1], "rounds": got})
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(render(doc))
    return doc


def median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"# A lane's start: held vs beside the loop ({doc['date']}, {commit_label(doc)})",
        "",
        f"Machine: {machine_line(doc['machine'])}.",
        f"remote, consumer {doc['rate']:,.0f} samples/s, {doc['epoch_batches']} batches an "
        f"epoch, switch at batch {doc['switch_at']}. Command: `{doc['command']}`.",
        "",
        "| switch | rounds | epoch held (median) | epoch beside | beside / held "
        "| loop waited, held | loop waited, beside |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in doc["pairs"]:
        held, beside = p["rounds"]["held"], p["rounds"]["beside"]
        h, b = median(held, "epoch_s"), median(beside, "epoch_s")
        lines.append(
            f"| {p['from']} -> {p['to']} | {len(held)} | {h:.2f} s | {b:.2f} s | {b / h:.3f} "
            f"| {median(held, 'waited_s'):.2f} s | {median(beside, 'waited_s'):.2f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="32:96,2:32", help="FROM:TO worker counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/lane-start"))
    args = ap.parse_args()
    pairs = [(int(a), int(b)) for a, b in (p.split(":") for p in args.pairs.split(","))]
    return guarded(lambda: run(pairs, args.rounds, args.out), args.out, render)


if __name__ == "__main__":
    sys.exit(main())
