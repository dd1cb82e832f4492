"""The copy to the accelerator, as plain data: per batch size, pageable against pinned."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from feedrate.results.findings import Finding

SCHEMA = "feedrate.transfer/1"


@dataclass(frozen=True)
class SizeFigures:
    """One size: copy bandwidth (GB/s, 1e9 bytes) each way from pageable and pinned memory,
    and the seconds to pin a fresh tensor (``pin_memory()``) against copying it into a pinned
    buffer kept from batch to batch."""

    bytes: int
    h2d_pageable_gbps: float
    h2d_pinned_gbps: float
    d2h_pageable_gbps: float
    d2h_pinned_gbps: float
    pin_s: float
    reuse_s: float


@dataclass
class TransferResult:
    """``transfer``'s figures per size and its findings; ``skipped`` says why nothing was
    measured (no accelerator)."""

    schema: str
    device: str
    device_name: str
    repeats: int
    sizes: list[SizeFigures]
    seconds: float
    findings: list[Finding] = field(default_factory=list)
    skipped: str | None = None

    @classmethod
    def skip(cls, why: str) -> TransferResult:
        return cls(SCHEMA, "", "", 0, [], 0.0, skipped=why)

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"schema": self.schema, "skipped": self.skipped}
        return {
            "schema": self.schema,
            "device": self.device,
            "device_name": self.device_name,
            "repeats": self.repeats,
            "sizes": [asdict(s) for s in self.sizes],
            "seconds": self.seconds,
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransferResult:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document")
        if d.get("skipped"):
            return cls.skip(str(d["skipped"]))
        return cls(
            d["schema"],
            d["device"],
            d["device_name"],
            int(d["repeats"]),
            [SizeFigures(**s) for s in d["sizes"]],
            float(d["seconds"]),
            [Finding.from_dict(f) for f in d.get("findings", [])],
        )
