"""``transfer``: how fast batches reach the accelerator from pageable and pinned memory, with
the findings that follow (whether pinning pays, and its cost per batch)."""

from __future__ import annotations

from collections.abc import Sequence

from feedrate.checks.transfer import bandwidth_findings
from feedrate.measuring.device import DEFAULT_SIZES, NO_ACCELERATOR, bandwidth, parse_device
from feedrate.results.transfer import TransferResult


def transfer(
    sizes: Sequence[int] = DEFAULT_SIZES, *, repeats: int = 10, device: str | None = "auto"
) -> TransferResult:
    """Time host-to-device and device-to-host copies of each size (bytes), ``repeats`` times,
    from pageable and pinned memory, on ``device`` ("auto": the accelerator torch sees). Without
    an accelerator the result is ``skipped`` with the reason, and measures nothing."""
    dev = parse_device(device)
    if dev is None:
        return TransferResult.skip(NO_ACCELERATOR)
    result = bandwidth(dev, sizes, repeats)
    result.findings = bandwidth_findings(result.sizes)
    return result
