"""The findings catalog: what each finding id means, what evidence it rests on, the fix, and
its severity. ``feedrate explain ID`` prints an entry; docs/findings.md is the same text, one
section per id (``markdown_section``), so the two cannot drift apart. Each entry is written
beside the rule that raises the finding (``DOCS`` of each checks module).
"""

from __future__ import annotations

import difflib

from feedrate.checks import bottleneck, dataset, machine, threads, transfer, tune, workers
from feedrate.results.findings import FindingDoc

_FAMILIES = (bottleneck, workers, machine, dataset, threads, transfer, tune)

#: Every finding id feedrate reports, in alphabetical order.
CATALOG: dict[str, FindingDoc] = {
    doc.id: doc for doc in sorted((d for f in _FAMILIES for d in f.DOCS), key=lambda d: d.id)
}


def explain(finding_id: str) -> FindingDoc:
    """The entry for ``finding_id``. Raises ``KeyError`` (with the id as its argument) for an
    id that is not in ``CATALOG``; ``close_matches`` suggests what was meant."""
    try:
        return CATALOG[finding_id]
    except KeyError:
        raise KeyError(finding_id) from None


def close_matches(finding_id: str) -> list[str]:
    """Up to 3 known ids that look like ``finding_id`` (a typo, another case, spaces or
    underscores for hyphens), closest first; empty when none is close."""
    wanted = finding_id.strip().lower().replace("_", "-").replace(" ", "-")
    if wanted in CATALOG and wanted != finding_id:
        return [wanted]
    return difflib.get_close_matches(wanted, list(CATALOG), n=3, cutoff=0.6)


def markdown_section(doc: FindingDoc) -> str:
    """The entry as a section of docs/findings.md: a ``## `id` `` heading (its anchor is the
    id), the title, then the four fields."""
    return (
        f"## `{doc.id}`\n\n"
        f"*{doc.title}*\n\n"
        f"**Means.** {doc.means}\n\n"
        f"**Evidence.** {doc.evidence}\n\n"
        f"**Fix.** {doc.fix}\n\n"
        f"**Severity.** {doc.severity}\n"
    )
