"""The findings catalog: every finding id the code can raise is documented, the guide's
reference says the same words, and ``feedrate explain`` prints an entry or names the problem."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import feedrate
from feedrate.checks.catalog import (
    CATALOG,
    TABLE_HEAD,
    close_matches,
    explain,
    markdown_section,
    reference,
)
from feedrate.cli import main

ROOT = Path(__file__).resolve().parents[1]


def raised_ids() -> set[str]:
    """The ids of every ``Finding(...)`` built in the package's source."""
    ids = set()
    for path in Path(feedrate.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "Finding"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                ids.add(node.args[0].value)
    return ids


def test_every_finding_raised_is_documented_and_nothing_else() -> None:
    raised = raised_ids()
    assert len(raised) >= 20  # the walk sees the rules
    assert raised == set(CATALOG)


def test_the_guide_holds_the_catalog_word_for_word() -> None:
    page = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    for doc in CATALOG.values():
        assert markdown_section(doc) in page, doc.id
    intro = page[: page.index(TABLE_HEAD)]
    assert page == reference(intro), (
        'docs/findings.md is out of date: python -c "from feedrate.checks.catalog import '
        'rewrite_page; rewrite_page()"'
    )


def test_an_unknown_id_suggests_the_near_one() -> None:
    assert explain("shm-too-small").id == "shm-too-small"
    with pytest.raises(KeyError):
        explain("shm-to-small")
    assert close_matches("shm_too_small") == ["shm-too-small"]
    assert close_matches("zzzz") == []


def test_explain_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["explain", "copy-on-read"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "copy-on-read" in out and "fix" in out and CATALOG["copy-on-read"].title in out
    with pytest.raises(SystemExit) as stop:
        main(["explain", "copy-on-reed"])
    assert stop.value.code == 2
    assert "did you mean copy-on-read" in capsys.readouterr().err
