"""What 2 workers yielded from an IterableDataset, by identity as well as by content."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from feedrate.results.evidence import StreamDigests


@dataclass
class StreamSamples(StreamDigests):
    """``StreamDigests`` (the content digests, taken with the same random seeds in both
    workers, so identical augmentations of one sample hash alike) with, per worker and in the
    same order, each item's identity digest (``dataset_objects.identity``: its ids, labels,
    keys and other non-float parts; '' for an item without any). ``cpu_share``: the seconds
    the workers spent on a CPU (all their threads) over those they spent making the items,
    where measured (a stream that waits on reads reads low)."""

    identities: dict[int, list[str]] = field(default_factory=dict)
    cpu_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["identities"] = {str(k): v for k, v in self.identities.items()}
        out["cpu_share"] = self.cpu_share
        return out
