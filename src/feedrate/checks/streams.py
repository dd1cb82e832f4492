"""Whether the workers of an IterableDataset split its stream or each yield all of it, judged
from what 2 workers yielded (``StreamSamples``): by the samples' identity first (ids, keys,
labels), which random augmentation leaves alone, else by content hashed with the workers'
random generators seeded alike, before every item. Items that are nothing but draws from those
generators (synthetic data) are no samples repeated: DataLoader seeds every worker apart. Pure:
a function of the evidence, tested with synthetic digests.
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
#: Items each worker must yield, alternating between 2 values, to be taken for random draws.
DRAWN_MIN_ITEMS = 8

Verdict = Literal["split", "duplicates", "unknown"]


@dataclass(frozen=True)
class StreamVerdict:
    """How 2 workers' items compare: ``verdict`` 'split' (different samples), 'duplicates'
    (the same samples) or 'unknown' (too few items to tell); ``by`` what told ('identity':
    ids, labels, keys; 'content': the items hashed, augmentations seeded alike; 'random': the
    items are draws from the global generators, ``drawn``); ``shared`` of
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


def drawn(items: list[str]) -> bool:
    """Whether a worker's items (digests, in order) are draws from the global random
    generators and nothing else. The probe seeds those generators before every item, alike in
    both workers, with one seed at even positions and another at odd ones (``StreamSamples``),
    so such items alternate between two values. In training DataLoader seeds every worker
    apart and their draws differ: random items repeat no sample, split or not. A sample's data
    differs from item to item; a constant is the same at both seeds."""
    if len(items) < DRAWN_MIN_ITEMS or items[0] == items[1]:
        return False
    return all(item == items[i % 2] for i, item in enumerate(items))


def _whole(content: list[str], ids: list[str]) -> list[str]:
    """Each item's identity and content digests together (content alone without identities)."""
    if len(ids) != len(content):
        return content
    return [k + c for k, c in zip(ids, content, strict=True)]


def stream_verdict(digests: StreamDigests) -> StreamVerdict:
    """Whether 2 workers of an IterableDataset yielded the same samples. Items that are
    random draws and nothing else (``drawn``, the evidence seeded alike: ``StreamSamples``)
    are 'split': in training each worker draws its own. Else by identity first: the items'
    ids, keys and labels (``StreamSamples.identities``; not random ones) say which sample an
    item is whatever random augmentation did to it. Distinct ids are compared as sets; labels
    (few distinct values) by position, an unsplit stream repeating the same sequence (a label
    that never changes tells nothing). Without identity the content digests decide, taken
    with the workers' random generators seeded alike. 'split' only on evidence of different
    samples, never on too little."""
    ids = getattr(digests, "identities", {}) or {}
    seeded = isinstance(digests, StreamSamples)  # seeded alike, item by item
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
    if seeded and drawn(_whole(ca, ka)) and drawn(_whole(cb, kb)):
        return made("split", "random", *_overlap(ca, cb))
    if seeded and drawn(ka) and drawn(kb):
        ka = kb = []  # random labels name no sample: the content tells
    labelled = False
    if ka and kb and all(ka) and all(kb):
        shared, fewest = _overlap(ka, kb)
        if fewest >= DUPLICATE_MIN_ITEMS and fewest >= DISTINCT_SHARE * min(len(ka), len(kb)):
            verdict: Verdict = "duplicates" if shared / fewest >= DUPLICATE_SHARE else "split"
            return made(verdict, "identity", shared, fewest)
        n = min(len(ka), len(kb))
        same = sum(x == y for x, y in zip(ka, kb, strict=False))
        if n >= DUPLICATE_MIN_ITEMS and same / n >= DUPLICATE_SHARE and len(set(ka[:n])) > 1:
            return made("duplicates", "identity", same, n, "positions (labels)")
        labelled = n >= DUPLICATE_MIN_ITEMS and same / n < DUPLICATE_SHARE
    shared, fewest = _overlap(ca, cb)
    if fewest < DUPLICATE_MIN_ITEMS:
        return made("unknown")
    if shared / fewest >= DUPLICATE_SHARE:
        return made("duplicates", "content", shared, fewest)
    # Different content: trusted only where the generators were seeded alike (StreamSamples),
    # or where the labels did not repeat in step either.
    trusted = seeded or labelled
    return made("split" if trusted else "unknown", "content", shared, fewest)


def stream_splits(digests: StreamDigests) -> bool:
    """Two workers of an IterableDataset were seen to yield different samples (by identity,
    or by content with augmentations seeded alike): the stream is split between workers, so
    running it in workers is safe. Too little to tell is not a split."""
    return stream_verdict(digests).verdict == "split"
