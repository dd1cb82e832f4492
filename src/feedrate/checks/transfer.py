"""Deciding the host-to-device leg from measured figures: whether pinning pays, how much memory
it locks, and the copy line for the training loop. Pure functions over ``transfer`` figures and
trials, so each rule is tested with synthetic measurements on a machine without an accelerator.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from feedrate.loader.config import LoaderConfig
from feedrate.results.findings import Finding, FindingDoc
from feedrate.results.transfer import SizeFigures
from feedrate.results.trial import Trial
from feedrate.search.space import beats, covers, outpaced
from feedrate.units import size

#: Pinned (page-locked) memory in flight above this share of the machine's memory is a warning:
#: the OS cannot swap or reclaim it, and other processes (and the next job) lose it.
PINNED_SHARE = 0.1
#: A pinned copy must save more than this share of a pageable copy to be called faster.
PIN_GAIN = 0.1


def pinned_in_flight(config: LoaderConfig, batch_bytes: int | None) -> int | None:
    """Bytes of pinned memory DataLoader holds with ``pin_memory=True``: the batches the workers
    have ready (the pin thread pins each as it arrives) and the one the loop holds."""
    if batch_bytes is None or not config.pin_memory:
        return None
    return batch_bytes * (config.queue_depth + 1)


def pinned_budget(machine: dict[str, Any]) -> int | None:
    total = machine.get("memory_limit_bytes") or machine.get("memory_total_bytes")
    return int(total * PINNED_SHARE) if total else None


def pinned_over_budget(
    config: LoaderConfig, batch_bytes: int | None, machine: dict[str, Any]
) -> str | None:
    """Why a pinned configuration is not tried (its pinned memory in flight is over budget)."""
    need, budget = pinned_in_flight(config, batch_bytes), pinned_budget(machine)
    if need is None or budget is None or need <= budget:
        return None
    return (
        f"predicted pinned memory in flight {size(need)} (batch × {config.queue_depth + 1}) is "
        f"over the pinned budget {size(budget)} ({PINNED_SHARE:.0%} of memory)"
    )


def pinned_finding(config: LoaderConfig, trial: Trial, machine: dict[str, Any]) -> Finding | None:
    """With pin_memory on: how much memory it locks, a warning above the budget."""
    need = pinned_in_flight(config, trial.batch_bytes)
    if need is None or trial.batch_bytes is None:
        return None
    budget = pinned_budget(machine)
    over = budget is not None and need > budget
    fewer = max(1, (config.prefetch_factor or 2) // 2)
    return Finding(
        "pinned-memory",
        "warning" if over else "info",
        f"pin_memory=True locks about {size(need)} of RAM in flight ({size(trial.batch_bytes)} "
        f"batches × {config.queue_depth + 1})"
        + (f", over {PINNED_SHARE:.0%} of this machine's memory" if over else ""),
        f"DataLoader(..., prefetch_factor={fewer})" if over else "none needed",
    )


def pin_pays(pageable: Trial, pinned: Trial, consumer: bool = False) -> tuple[bool, str]:
    """From two end-to-end trials (the loop copies each batch to the device) that differ only
    in pin_memory: whether pinning is worth its locked memory, and why. Worth it when the
    pinned loop is faster beyond the noise, or, with a consumer, when only the pinned one keeps
    it fed (its rate is the consumer's, so the stall is what differs)."""
    if not (pageable.measured and pinned.measured):
        return False, "pin_memory was not measured both ways"
    copy = ""
    if pageable.copy_s_per_batch and pinned.copy_s_per_batch:
        copy = (
            f" (copy {pageable.copy_s_per_batch * 1e3:.2f} → "
            f"{pinned.copy_s_per_batch * 1e3:.2f} ms per batch)"
        )
    if beats(pinned, pageable) or outpaced(pinned, pageable):
        gain = pinned.median / pageable.median - 1
        return True, f"pinned memory and non_blocking copies are {gain:.0%} faster end to end{copy}"
    if consumer and covers(pinned) and not covers(pageable):
        return True, (
            "pinned memory and non_blocking copies keep the consumer fed: it waits "
            f"{pinned.stall_fraction or 0.0:.0%} of the time, against "
            f"{pageable.stall_fraction or 0.0:.0%} from pageable memory{copy}"
        )
    if beats(pageable, pinned) or outpaced(pageable, pinned):
        # Seen on an H200: pinned 699 against 1,766 samples/s, reported as "did not speed".
        loss = 1 - pinned.median / pageable.median
        return False, (
            f"pinning made the loop {loss:.0%} slower end to end ({pinned.median:,.0f} against "
            f"{pageable.median:,.0f} samples/s){copy}{_pin_thread_busy(pinned)}: it costs time "
            "and locks RAM"
        )
    return False, f"pinning did not speed the loop beyond the noise{copy}: it only locks RAM"


#: DataLoader's pin-memory thread this busy (share of a core) is the pinned loop's limit: it
#: copies every batch into pinned memory on one torch thread (with workers; 5 ms per 12 MiB
#: batch on an H200 machine, where the loop without pinning took 4.7 ms a batch).
PIN_THREAD_BUSY = 0.8


def _pin_thread_busy(pinned: Trial) -> str:
    """Why a pinned loop with workers was slower, where its pin-memory thread says so."""
    busy = pinned.pin_thread_cpu
    if busy is None or busy < PIN_THREAD_BUSY:
        return ""
    return (
        f"; DataLoader's pin-memory thread was busy {busy:.0%} of a core, copying each batch "
        "into pinned memory on one thread"
    )


def pin_twin(best: Trial, trials: list[Trial]) -> Trial | None:
    """The measured trial of ``best``'s settings with pin_memory the other way, if any."""
    flipped = replace(best.config, pin_memory=not best.config.pin_memory)
    return next((t for t in trials if t.measured and t.config == flipped), None)


def pin_verdict(
    best: Trial, trials: list[Trial], consumer: bool = False
) -> tuple[Trial, bool, str] | None:
    """Where ``best``'s settings were measured with pin_memory both ways: the one of the two
    the verdict keeps (the pinned one where pinning pays), and ``pin_pays``'s answer and why."""
    other = pin_twin(best, trials)
    if other is None:
        return None
    pinned, pageable = (best, other) if best.config.pin_memory else (other, best)
    pays, why = pin_pays(pageable, pinned, consumer)
    return (pinned if pays else pageable), pays, why


def pin_loser(best: Trial, trials: list[Trial], consumer: bool = False) -> Trial | None:
    """``best`` where the pin verdict (``pin_verdict``) rejects it for its twin; else None. A
    pick made among all trials can be the pinned twin only because it came out ahead within the
    noise, or the unpinned one though only pinning kept the consumer fed: the answer is then
    chosen again without it, so it says what the verdict says."""
    verdict = pin_verdict(best, trials, consumer)
    return None if verdict is None or verdict[0] is best else best


def without_guesses(findings: list[Finding]) -> list[Finding]:
    """``findings`` less the static ``pin-memory-unused`` (pageable copies are slower, judged
    from the batch's bytes) where ``pin-memory-measured`` timed pin_memory both ways: the
    measurement answers what the guess only warns about, and they must not disagree."""
    if not any(f.id == "pin-memory-measured" for f in findings):
        return findings
    return [f for f in findings if f.id != "pin-memory-unused"]


def copy_line(device: str, pin: bool) -> str:
    """The line for the training loop (non_blocking only helps from pinned memory)."""
    kind = device.split(":")[0]
    return f'batch = batch.to("{kind}", non_blocking={pin})'


def nearest(sizes: list[SizeFigures], nbytes: int) -> SizeFigures | None:
    """The measured size closest to ``nbytes`` on a log scale."""
    if not sizes:
        return None
    return min(sizes, key=lambda s: abs(math.log(max(1, s.bytes)) - math.log(max(1, nbytes))))


def bandwidth_findings(sizes: list[SizeFigures], batch_bytes: int | None = None) -> list[Finding]:
    """What ``feedrate transfer`` figures mean: at the batch's size (or the largest measured),
    how much faster pinned copies are, and whether pinning each batch anew costs more than
    copying into a pinned buffer kept between batches."""
    row = nearest(sizes, batch_bytes) if batch_bytes else max(sizes, key=lambda s: s.bytes)
    if row is None:
        return []
    out = []
    at = f"at {size(row.bytes)}"
    gain = row.h2d_pinned_gbps / row.h2d_pageable_gbps - 1 if row.h2d_pageable_gbps > 0 else 0.0
    if gain > PIN_GAIN:
        out.append(
            Finding(
                "pinned-copies-faster",
                "info",
                f"{at}, host-to-device copies run at {row.h2d_pinned_gbps:.1f} GB/s from pinned "
                f"memory against {row.h2d_pageable_gbps:.1f} GB/s from pageable ({gain:.0%} "
                "faster), and only pinned copies can be non_blocking",
                "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)",
            )
        )
    else:
        out.append(
            Finding(
                "pinned-copies-no-faster",
                "info",
                f"{at}, pinned copies ({row.h2d_pinned_gbps:.1f} GB/s) are not clearly faster "
                f"than pageable ones ({row.h2d_pageable_gbps:.1f} GB/s)",
                "keep pin_memory=False unless a tune with the device copy says otherwise",
            )
        )
    if row.pin_s > 2 * row.reuse_s and row.pin_s > 1e-4:
        out.append(
            Finding(
                "pinning-costs",
                "info",
                f"{at}, pinning a fresh tensor takes {row.pin_s * 1e3:.2f} ms against "
                f"{row.reuse_s * 1e3:.2f} ms to copy it into a pinned buffer kept between batches: "
                "DataLoader's pin thread pays the first for every batch, on the main process",
                "with a CPU-bound main process, reuse a pinned buffer (buf.copy_(batch); "
                "buf.to(device, non_blocking=True)) instead of pin_memory=True",
            )
        )
    return out


#: What each finding id of this module means, its evidence and its fix (``feedrate explain``).
DOCS = (
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
            "with `pin_memory` flipped, each measured end to end. Pinning pays only when its gain "
            "beats the noise (or held over 3% in repeats side by side), or, with a consumer, when "
            "only the pinned loop kept it fed; where pinning measured slower beyond the noise, "
            "the finding says by how much, and names DataLoader's pin-memory thread where it was "
            "busy most of a core (it copies every batch into pinned memory on one thread). The "
            "answer follows this verdict: where the pick was "
            "the twin it rejects, the answer is chosen again without it. On CUDA, the copy's "
            "device time per batch both ways, from CUDA events."
        ),
        fix=(
            'The copy line for your training loop: `batch = batch.to("cuda", non_blocking=True)` '
            "when pinning paid (with `pin_memory=True`), `non_blocking=False` when it did not."
        ),
        severity="info",
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
)
