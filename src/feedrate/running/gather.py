"""The run's report from what each process wrote: every process's loaders, with their roles,
bottleneck, findings and next step decided (``checks.stall``), ranks in order."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from typing import Any

from feedrate import __version__
from feedrate.checks import stall as rules
from feedrate.results.findings import by_severity, for_loader
from feedrate.results.run import ProcessRun, RunReport
from feedrate.running.launch import Outcome


def read_reports(folder: str) -> tuple[list[ProcessRun], list[str]]:
    """The processes' reports in ``folder`` (rank order, then pid), and a note for each one
    that could not be read."""
    found: list[ProcessRun] = []
    notes: list[str] = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except OSError as exc:
        return [], [f"cannot read the reports folder {folder}: {exc.strerror}"]
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                found.append(ProcessRun.from_dict(json.load(fh)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"the report of process {name[:-5]} could not be read: {exc}")
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".lost")):
        with contextlib.suppress(OSError), open(os.path.join(folder, name)) as fh:
            notes.append(f"the report of process {name[:-5]} was lost: {fh.read().strip()}")
    found.sort(key=lambda p: (p.rank is None, p.rank or 0, p.pid))
    return found, notes


def decide(report: RunReport, command: list[str]) -> RunReport:
    """Fill in each loader's role, bottleneck, findings and next step, and the verdict."""
    machine = report.machine
    cpus = int(machine.get("cpus_usable") or os.cpu_count() or 1)
    # The ranks feedrate run followed share this node's CPUs: each gets its share of them,
    # unless each is pinned to CPUs of its own (SLURM's --cpu-bind): then it sees its share.
    ranked = [p for p in report.processes if p.rank is not None and p.loaders]
    ranks = max(1, len({p.rank for p in ranked}))
    count = machine.get("cpu_count") or 0
    if all(0 < (p.machine.get("cpus_affinity") or count) * ranks <= count for p in ranked):
        ranks = 1
    for proc in report.processes:
        for ld, role in zip(proc.loaders, rules.roles(proc.loaders), strict=True):
            ld.role = role
            ld.bottleneck = rules.bottleneck_of(ld, cpus)
            ld.findings = for_loader(
                by_severity(rules.findings(ld, machine, cpus)), rules.words_of(ld)
            )
            ld.next_step = rules.next_step(ld, command, cpus, ranks) if role == "train" else []
    loaders = report.loaders
    report.verdict = rules.verdict(
        [ld for ld in loaders if ld.role == "train"], [ld for ld in loaders if ld.role == "eval"]
    )
    return report


def gather(folder: str, command: list[str], outcome: Outcome, *, autotune: bool) -> RunReport:
    """The whole run's report: ``command`` as the user gave it, ``outcome`` as it ended."""
    processes, notes = read_reports(folder)
    machine: dict[str, Any] = next((p.machine for p in processes if p.machine), {})
    if processes and notes:
        processes[0].notes.extend(notes)
    report = RunReport(
        command=list(command),
        exit_code=outcome.exit_code,
        wall_s=outcome.wall_s,
        interrupted=outcome.interrupted,
        autotune=autotune,
        processes=processes,
        machine=machine,
        feedrate_version=__version__,
    )
    decide(report, command)
    said = [n for p in processes for n in p.notes]
    if not report.loaders and (notes or said or outcome.signal is not None):
        report.verdict = _nothing_back([*notes, *said], outcome)
    return report


def _nothing_back(notes: list[str], outcome: Outcome) -> str:
    """The verdict where no loader's report came back, and something other than an idle
    script explains it: a report lost, the script's own ``feedrate.autotune()`` (whose lanes'
    loaders are not followed), or the script ended by a signal before it could write one (a
    crash in native code: no exit handler runs)."""
    if notes:
        return f"no DataLoader that feedrate run follows was seen: {notes[0]}"
    name = "a signal"
    if outcome.signal:
        try:
            name = signal.Signals(outcome.signal).name
        except ValueError:  # a real-time signal (SIGRTMIN+n): no name of its own
            name = f"signal {outcome.signal}"
    return (
        f"no loader's report came back: the command was ended by {name}, and a process "
        "ended so writes none (whether it iterated a DataLoader is not known)"
    )
