"""Whether the workers of an IterableDataset split its stream or each yield all of it, judged
from what 2 workers yielded (``StreamSamples``): by the samples' identity first (ids, keys,
labels), which random augmentation leaves alone, else by content hashed with the workers'
random generators seeded alike. Pure: a function of the evidence, tested with synthetic digests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from feedrate.results.evidence import StreamDigests
from feedrate.results.streams import StreamSamples

#: Items each worker must yield for a duplicate verdict, and the share that must be shared.
DUPLICATE_MIN_ITEMS = 4
DUPLICATE_SHARE = 0.5
#: Identities count as ids (compared as sets) when at least this share of a worker's are
#: distinct; fewer distinct are labels, compared position by position.
DISTINCT_SHARE = 0.8

Verdict = Literal["split", "duplicates", "unknown"]


@dataclass(frozen=True)
class StreamVerdict:
    """How 2 workers' items compare: ``verdict`` 'split' (different samples), 'duplicates'
    (the same samples) or 'unknown' (too few items to tell); ``by`` what told ('identity':
    ids, labels, keys; 'content': the items hashed, augmentations seeded alike); ``shared`` of
    ``fewest`` compared (distinct items, or positions for labels), from ``counts`` items."""

    verdict: Verdict
    by: str = ""
    shared: int = 0
    fewest: int = 0
    counts: tuple[int, int] = (0, 0)
    workers: tuple[int, int] = (0, 1)
    unit: str = "distinct items"


def _overlap(a: list[str], b: list[str]) -> tuple[int, int]:
    sa, sb = set(a), set(b)
    return len(sa & sb), min(len(sa), len(sb))


def stream_verdict(digests: StreamDigests) -> StreamVerdict:
    """Whether 2 workers of an IterableDataset yielded the same samples, judged by identity
    first: the items' ids, keys and labels (``StreamSamples.identities``) say which sample an
    item is whatever random augmentation did to it. Distinct ids are compared as sets; labels
    (few distinct values) by position, an unsplit stream repeating the same sequence. Without
    identity the content digests decide, taken with the workers' random generators seeded
    alike. 'split' only on evidence of different samples, never on too little."""
    ids = getattr(digests, "identities", {}) or {}
    pairs = [(w, items) for w, items in sorted(digests.per_worker.items()) if items]
    if len(pairs) < 2:
        return StreamVerdict("unknown")
    (wa, ca), (wb, cb) = pairs[:2]

    def made(
        verdict: Verdict,
        by: str = "",
        shared: int = 0,
        fewest: int = 0,
        unit: str = "distinct items",
    ) -> StreamVerdict:
        return StreamVerdict(verdict, by, shared, fewest, (len(ca), len(cb)), (wa, wb), unit)

    ka, kb = ids.get(wa, []), ids.get(wb, [])
    labelled = False
    if ka and kb and all(ka) and all(kb):
        shared, fewest = _overlap(ka, kb)
        if fewest >= DUPLICATE_MIN_ITEMS and fewest >= DISTINCT_SHARE * min(len(ka), len(kb)):
            verdict: Verdict = "duplicates" if shared / fewest >= DUPLICATE_SHARE else "split"
            return made(verdict, "identity", shared, fewest)
        n = min(len(ka), len(kb))
        same = sum(x == y for x, y in zip(ka, kb, strict=False))
        if n >= DUPLICATE_MIN_ITEMS and same / n >= DUPLICATE_SHARE:
            return made("duplicates", "identity", same, n, "positions (labels)")
        labelled = n >= DUPLICATE_MIN_ITEMS
    shared, fewest = _overlap(ca, cb)
    if fewest < DUPLICATE_MIN_ITEMS:
        return made("unknown")
    if shared / fewest >= DUPLICATE_SHARE:
        return made("duplicates", "content", shared, fewest)
    # Different content: trusted only where the generators were seeded alike (StreamSamples),
    # or where the labels did not repeat in step either.
    trusted = isinstance(digests, StreamSamples) or labelled
    return made("split" if trusted else "unknown", "content", shared, fewest)


def stream_splits(digests: StreamDigests) -> bool:
    """Two workers of an IterableDataset were seen to yield different samples (by identity,
    or by content with augmentations seeded alike): the stream is split between workers, so
    running it in workers is safe. Too little to tell is not a split."""
    return stream_verdict(digests).verdict == "split"
