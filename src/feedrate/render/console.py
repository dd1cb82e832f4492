"""Console rendering (rich) of result objects. Takes plain data, prints; measures nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from feedrate.render.ranks import measured_ranks_rows, ranks_rows
from feedrate.render.text import noise_of, plus_minus, rate, size
from feedrate.results.findings import Finding, by_severity
from feedrate.results.measurement import Measurement
from feedrate.results.processes import ProcessFigures
from feedrate.results.transfer import TransferResult
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult

if TYPE_CHECKING:
    from feedrate.machine.facts import MachineFacts
from feedrate.units import counted


def kv_table(rows: Iterable[tuple[str, str]], title: str | None = None) -> Table:
    table = Table(show_header=False, box=None, title=title, title_justify="left", pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def machine_table(facts: MachineFacts) -> Table:
    """The machine facts that bear on DataLoader settings."""
    quota = "none" if facts.cpu_quota is None else f"{facts.cpu_quota:g} CPUs"
    accel: str = facts.accelerator
    if facts.accelerator != "none":
        accel = f"{facts.accelerator} × {facts.accelerator_count} ({facts.accelerator_name or '?'})"
    threads = ", ".join(f"{k}={v}" for k, v in facts.thread_env.items()) or "none set"
    memory = size(facts.memory_total_bytes)
    if facts.memory_limit_bytes:
        memory += f", cgroup limit {size(facts.memory_limit_bytes)}"
    tasks = "no limit" if facts.tasks_free is None else f"{facts.tasks_free:,}"
    rows = [
        (
            "usable CPUs",
            f"{facts.cpus_usable} (os.cpu_count {facts.cpu_count}, "
            f"affinity {facts.cpus_affinity}, cgroup quota {quota})",
        ),
        ("memory", f"{size(facts.memory_available_bytes)} available of {memory}"),
        ("/dev/shm", f"{size(facts.shm_free_bytes)} free of {size(facts.shm_total_bytes)}"),
        (
            "open files",
            f"soft {facts.open_files_soft or 'unlimited'}, "
            f"hard {facts.open_files_hard or 'unlimited'}",
        ),
        ("tasks left", f"{tasks} (processes and threads: pids.max, ulimit -u)"),
        ("start method", f"{facts.start_method} (sharing strategy {facts.sharing_strategy})"),
        (
            "torch",
            f"{facts.torch_version}, {facts.torch_num_threads} intra-op threads, "
            f"{facts.torch_num_interop_threads} inter-op",
        ),
        ("thread env", threads),
        ("accelerator", accel),
        ("python", f"{facts.python_version} on {facts.platform}"),
    ]
    return kv_table(rows, title="Machine")


def _process_row(fig: ProcessFigures, name: str) -> tuple[str, ...]:
    return (
        name,
        "-" if fig.pid is None else str(fig.pid),
        f"{fig.cpu_util * 100:.0f}%",
        size(fig.uss_bytes),
        size(fig.pss_bytes),
    )


def processes_table(m: Measurement) -> Table:
    """CPU (100% = one core busy) and memory of each process over the measured windows."""
    table = Table(title="Processes over the measured windows", title_justify="left")
    for col in ("process", "pid", "CPU", "USS", "PSS"):
        table.add_column(col, justify="left" if col == "process" else "right")
    procs = m.processes
    table.add_row(*_process_row(procs.main, "main (loop, collation, unpickling)"))
    if procs.pin_memory_thread is not None:
        table.add_row(*_process_row(procs.pin_memory_thread, "  pin-memory thread"))
    for w in procs.workers:
        table.add_row(*_process_row(w, f"worker {w.worker_id}"))
    if procs.workers:
        busy = sum(w.cpu_util for w in procs.workers)
        uss = sum(w.uss_bytes or 0 for w in procs.workers)
        table.add_row("all workers", "", f"{busy * 100:.0f}%", size(uss), "", style="bold")
    return table


def measurement_summary(m: Measurement) -> Table:
    s, w = m.spread, m.window
    warm = ", their warm-up batches not counted" if w.warmup_batches else ""
    epochs = f", {counted(w.epochs, 'epoch')} completed{warm}" if w.epochs else ""
    restarts = ""
    if m.epoch_restart_s:
        mean = sum(m.epoch_restart_s) / len(m.epoch_restart_s)
        restarts = f"; each new epoch waited {mean:.2f} s for its first batch"
    rows = [
        ("config", m.config.label()),
        ("start-up", f"{m.startup_s:.2f} s to the first batch{restarts}"),
        ("warm-up", f"{w.warmup_batches} batches discarded ({w.warmup_s:.2f} s after the first)"),
        (
            "steady state",
            f"{rate(m.samples_per_s)} samples/s {plus_minus(s.rel_se, len(s.windows))}  "
            f"({rate(m.batches_per_s)} batches/s)",
        ),
        (
            "spread",
            f"{len(s.windows)} windows: median {rate(s.median)}, "
            f"range {rate(s.min)}–{rate(s.max)} samples/s",
        ),
        (
            "measured",
            f"{w.batches} batches, {w.samples} samples in {w.seconds:.1f} s{epochs} ({w.method})",
        ),
        ("/dev/shm peak", size(m.processes.shm_peak_bytes) + " above its level at start"),
    ]
    rows += measured_ranks_rows(m)
    if m.transfer:
        t = m.transfer
        rows.append(
            (
                "copy to device",
                f"{t['copy_s_per_batch'] * 1e3:.2f} ms per batch to {t['device']} "
                f"(non_blocking={t['non_blocking']}; "
                + (
                    "device time from CUDA events)"
                    if str(t["device"]).startswith("cuda")
                    else "host clock around a device sync)"
                ),
            )
        )
    title = f"feedrate measure {m.target}" if m.target else "feedrate measure"
    return kv_table(rows, title=title)


def measurement(m: Measurement) -> RenderableType:
    """The whole console report of one measurement."""
    parts: list[Any] = [measurement_summary(m), Text(""), processes_table(m)]
    for note in m.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)


def _trial_row(t: Trial, best: Trial, baseline: Trial) -> tuple[str, ...]:
    label = t.config.label()
    if t is baseline:
        label += " (yours)"
    if t.skipped:
        return (label, t.reason, "-", "-", "-", "-", "-", f"skipped: {t.skipped}")
    if t.error:
        return (label, t.reason, "-", "-", "-", "-", "-", f"failed: {t.error}")
    stall = "" if t.stall_fraction is None else f"{t.stall_fraction:.0%}"
    return (
        label,
        t.reason,
        f"{rate(t.median)} {noise_of(t)}" + (f" ({t.repeats} runs)" if t.repeats > 1 else ""),
        f"{t.main_cpu:.0%} / {t.workers_cpu:.0%}",
        size(t.memory_bytes) if t.memory_bytes else "-",
        f"{t.startup_s:.2f}",
        stall,
        t.verdict,
    )


def trials_table(result: TuneResult) -> Table:
    """Every trial in the order tried, with why it was tried and the verdict."""
    table = Table(title="Trials (in the order tried)", title_justify="left", expand=False)
    for col, justify in (
        ("config", "left"),
        ("why tried", "left"),
        ("samples/s", "right"),
        ("CPU main / workers", "right"),
        ("memory (PSS)", "right"),
        ("start-up s", "right"),
        ("stall", "right"),
        ("verdict", "left"),
    ):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for t in result.trials:
        style = "bold green" if t.config == result.best.config or t is result.best else None
        table.add_row(*_trial_row(t, result.best, result.baseline), style=style)
    return table


def _persistent_line(p: dict[str, Any]) -> str | None:
    if not p.get("applies"):
        return None
    saved = p["seconds_saved_per_epoch"]
    share = p.get("share_of_epoch")
    of_epoch = f" ({share:.1%} of an epoch)" if share is not None else ""
    verdict = "on" if p["recommended"] else "off (not worth it)"
    return (
        f"{verdict}: restarting workers costs {saved:.2f} s per epoch{of_epoch}, "
        f"measured from {p.get('measured_from', 'start-up')}"
    )


def _measured_line(result: TuneResult) -> str:
    """The recommendation's rate and the speed-up over yours, the restart of every epoch counted
    where workers are not persistent (and said where that changes the figure shown)."""
    best, base, r = result.best, result.baseline, rate
    own = f", {r(result.best_rate)} counting its {result.best_restart_s:.2f} s restart every epoch"
    own = own if r(result.best_rate) != r(best.median) else ""
    theirs = f", counting its {result.baseline_restart_s:.2f} s restart every epoch"
    theirs = theirs if r(result.baseline_rate) != r(base.median) else ""
    return (
        f"{rate(best.median)} samples/s {noise_of(best)}{own} ({result.speedup:.2f}× "
        f"your {rate(result.baseline_rate)} samples/s with {base.config.label()}{theirs})"
    )


def recommendation(result: TuneResult) -> Table:
    best, base = result.best, result.baseline
    rows = [
        ("recommended", best.config.label()),
        ("measured", _measured_line(result)),
        ("why", result.reason),
        (
            "resources",
            f"{best.own_cpu:.1f} CPUs busy, "
            f"{size(best.memory_bytes)} memory (PSS, main process and workers)",
        ),
    ]
    if result.consumer is not None:
        stalls = f"{best.stall_fraction or 0:.0%} (yours: {base.stall_fraction or 0:.0%})"
        rows.append(("data stall", stalls))
    persistent = _persistent_line(result.persistent)
    if persistent:
        rows.append(("persistent_workers", persistent))
    if result.machine.get("accelerator", "none") == "none":
        rows.append(("pin_memory", "no effect here: there is no accelerator to copy to"))
    else:
        pin = next((f for f in result.findings if f.id == "pin-memory-measured"), None)
        rows.append(("pin_memory", pin.message if pin else "not measured (--device cpu)"))
    rows += ranks_rows(result)
    rows.append(("code", result.code))
    origin = " (from the cache: --fresh measures again)" if result.from_cache else ""
    searched = f"{counted(len(result.trials), 'trial')} in {result.search_seconds:.0f} s"
    rows.append(("search", searched + origin))
    return kv_table(rows, title=title_of("tune", result.target, result.ranks))


def findings_list(findings: list[Finding]) -> RenderableType:
    """Findings most important first (errors, warnings, then info), each with its fix."""
    if not findings:
        return Text("no problems found", style="green")
    colors = {"error": "red", "warning": "yellow", "info": "cyan"}
    lines = []
    for f in by_severity(findings):
        line = Text()
        line.append(f"{f.severity:7s} ", style=f"bold {colors.get(f.severity, '')}")
        line.append(f"{f.id}: ", style="bold")
        line.append(f.message)
        line.append(f"\n        fix: {f.fix}", style="dim")
        lines.append(line)
    return Group(*lines)


def tune_result(result: TuneResult) -> RenderableType:
    parts: list[Any] = [trials_table(result), Text("")]
    if result.partial:
        parts.append(Text(f"PARTIAL RESULT: {result.partial_reason}", style="bold red"))
    parts += [
        recommendation(result),
        Text(""),
        Text("Findings", style="bold"),
        findings_list(result.findings),
    ]
    return Group(*parts)


def title_of(command: str, target: str | None, ranks: dict[str, Any] | None) -> str:
    """``feedrate COMMAND TARGET``, with the job's shape where it ran over ranks: the figures
    are per rank, and the line should say how it was run."""
    title = f"feedrate {command} {target or ''}".rstrip()
    if ranks:
        local, world = ranks.get("local_world_size"), ranks.get("world_size")
        where = " on this node" if world == local else f", {local} per node"
        title += f" (over {world} ranks{where})"
    return title


def transfer_result(
    result: TransferResult, findings: list[Finding] | None = None
) -> RenderableType:
    """``feedrate transfer``: bandwidth per size and direction, pinning against reuse, and the
    findings (``result.findings`` unless given)."""
    if result.skipped is not None:
        return Text(f"skipped: {result.skipped}.")
    title = f"host ↔ {result.device} ({result.device_name}), median of {result.repeats}"
    table = Table(title=title)
    for col in (
        "size",
        "H2D pageable",
        "H2D pinned",
        "D2H pageable",
        "D2H pinned",
        "pin_memory()",
        "copy to pinned buffer",
    ):
        table.add_column(col, justify="right")
    for r in result.sizes:
        table.add_row(
            size(r.bytes),
            f"{r.h2d_pageable_gbps:.1f} GB/s",
            f"{r.h2d_pinned_gbps:.1f} GB/s",
            f"{r.d2h_pageable_gbps:.1f} GB/s",
            f"{r.d2h_pinned_gbps:.1f} GB/s",
            f"{r.pin_s * 1e3:.2f} ms",
            f"{r.reuse_s * 1e3:.2f} ms",
        )
    return Group(table, Text(""), findings_list(result.findings if findings is None else findings))
