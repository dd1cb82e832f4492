"""Do DataLoader workers hang when a sibling's stream ends first?

An IterableDataset's worker is shut down as soon as its stream ends, while the others go on. A
worker that leaves without joining its queue's feeder thread can die holding the write lock it
shares with them (between sending its last message and releasing the lock), and they then wait
for it for ever. Until 1f4e278 feedrate cancelled that join in every worker it started (so that
workers of a run killed by SIGKILL leave); since then only a worker whose main process is gone
does. This counts the hangs of feedrate's 2-worker stream probe (``stream_digests``: 32 items
per worker, the first worker's stream ending first) in two arms, alternating, beside ``--busy``
busy loops and with ``--threads`` threads in the probing process that wake every 0.5 ms (as a
trainer's or a test runner's do): the race needs both.

* ``cancel-at-start``: the join cancelled as each worker starts (the old way);
* ``current``: feedrate as it is.

A probe with no item within ``--hang-s`` hung.

    python benchmarks/stream_ends.py                     # 150 probes per arm (~6 min)
    python benchmarks/stream_ends.py --probes 300 --busy 3 --threads 3

Writes ``benchmarks/results/stream-ends.{json,md}`` (``--out`` for another folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from common import machine_line, provenance
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from feedrate.errors import PipelineTimeoutError
from feedrate.loader import started
from feedrate.machine.facts import collect
from feedrate.measuring.workers import stream_digests

SCHEMA = "feedrate.bench.stream_ends/1"
ARMS = ("cancel-at-start", "current")


class Sharded(IterableDataset[torch.Tensor]):
    """``range(96)`` split between workers, 10 ms of CPU per item."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 96, step):
            end = time.process_time() + 0.01
            while time.process_time() < end:
                pass
            yield torch.full((4,), float(i))


def _cancel_at_start(frame: FrameType | None) -> None:
    """The old ``_leave_with_main_process``: the join cancelled as the worker starts."""
    for _ in range(4):
        if frame is None:
            return
        if frame.f_code.co_name == "_worker_loop":
            frame.f_locals["data_queue"].cancel_join_thread()
            return
        frame = frame.f_back


def probe(arm: str, hang_s: float) -> tuple[bool, float]:
    """One probe in ``arm``: whether it hung, and its seconds."""
    if arm == "cancel-at-start":
        started._leave_with_main_process = _cancel_at_start  # type: ignore[assignment]
    began = time.monotonic()
    try:
        stream_digests(DataLoader(Sharded(), batch_size=4), limit=32, seconds=2.0, timeout_s=hang_s)
        hung = False
    except PipelineTimeoutError:
        hung = True
    return hung, time.monotonic() - began


def _wakes() -> None:
    while True:
        time.sleep(0.0005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=150, help="probes per arm")
    parser.add_argument("--busy", type=int, default=3, help="busy loops beside the probes")
    parser.add_argument("--threads", type=int, default=3, help="threads beside each probe")
    parser.add_argument("--hang-s", type=float, default=5.0, help="no item this long: hung")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--one", choices=ARMS, help=argparse.SUPPRESS)  # a child's probes
    args = parser.parse_args()
    if args.one:
        for _ in range(args.threads):
            threading.Thread(target=_wakes, daemon=True).start()
        found = [probe(args.one, args.hang_s) for _ in range(args.probes)]
        print(json.dumps(found))
        return
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    runs: dict[str, list[tuple[bool, float]]] = {arm: [] for arm in ARMS}
    try:
        batch = 10
        for done in range(0, args.probes, batch):
            for arm in ARMS:  # interleaved, each in a process of its own
                n = min(batch, args.probes - done)
                cmd = [sys.executable, __file__, "--one", arm, "--probes", str(n)]
                cmd += ["--hang-s", str(args.hang_s), "--threads", str(args.threads)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                runs[arm] += [tuple(x) for x in json.loads(out.splitlines()[-1])]
                hung = sum(h for h, _ in runs[arm])
                print(f"{arm:16s} {len(runs[arm]):4d} probes, {hung} hung", flush=True)
    finally:
        for proc in busy:
            proc.kill()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_line(collect().to_dict()),
        "provenance": provenance(),
        "busy_loops": args.busy,
        "threads": args.threads,
        "hang_s": args.hang_s,
        "arms": {arm: {"probes": len(r), "hung": sum(h for h, _ in r)} for arm, r in runs.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stream-ends.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# Stream probes that hung when one worker's stream ended first",
        "",
        f"{doc['when']}, {doc['machine']}, {args.busy} busy loops beside, {args.threads} threads "
        "in the probing process, `python benchmarks/stream_ends.py --probes "
        f"{args.probes} --busy {args.busy} --threads {args.threads}`",
        "",
        "| arm | probes | hung |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {arm} | {a['probes']} | {a['hung']} |" for arm, a in doc["arms"].items()]
    (args.out / "stream-ends.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
