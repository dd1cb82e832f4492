"""The findings catalog: what each finding id means, what evidence it rests on, the fix, and
its severity. ``feedrate explain ID`` prints an entry; docs/findings.md is the same text, one
section per id (``markdown_section``), so the two cannot drift apart. Each entry is written
beside the rule that raises the finding (``DOCS`` of each checks module).
"""

from __future__ import annotations

import difflib

from feedrate.checks import bottleneck, dataset, machine, ranks, threads, transfer, tune, workers
from feedrate.results.findings import FindingDoc

_FAMILIES = (bottleneck, workers, machine, dataset, threads, transfer, tune, ranks)

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


#: Where the findings reference begins on docs/findings.md: the text above it is the page's own.
TABLE_HEAD = "| id | in short | severity |"


def reference(intro: str) -> str:
    """docs/findings.md: ``intro`` (the page's own text, up to the table), then a table of
    every id and a section per id (``markdown_section``)."""
    rows = [TABLE_HEAD, "| --- | --- | --- |"]
    rows += [f"| [`{d.id}`](#{d.id}) | {d.title} | {d.severity} |" for d in CATALOG.values()]
    sections = "\n".join(markdown_section(d) for d in CATALOG.values())
    return intro + "\n".join(rows) + "\n\n" + sections


def rewrite_page(path: str = "docs/findings.md") -> None:
    """Write the reference into the page at ``path`` again, keeping its introduction. From the
    repository: ``python -c "from feedrate.checks.catalog import rewrite_page; rewrite_page()"``.
    """
    from pathlib import Path

    page = Path(path)
    text = page.read_text(encoding="utf-8")
    page.write_text(reference(text[: text.index(TABLE_HEAD)]), encoding="utf-8")
