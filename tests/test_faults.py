"""The testing guide says how many bad inputs and faults the suite tries by name: that number
is counted here from the tests themselves, so it cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NAMED = re.compile(r'fault\(\s*"([a-z0-9-]+)"\s*\)')


def named_faults() -> set[str]:
    return {m for path in TESTS.glob("*.py") for m in NAMED.findall(path.read_text("utf-8"))}


def test_the_testing_guide_counts_the_faults_the_suite_tries() -> None:
    page = (TESTS.parent / "docs" / "testing.md").read_text(encoding="utf-8")
    stated = re.search(r"the suite tries \*\*(\d+)\*\* of them by name", page)
    assert stated is not None, "docs/testing.md no longer states the count"
    assert int(stated.group(1)) == len(named_faults()), sorted(named_faults())


def test_fault_names_are_unique_per_test_file() -> None:
    for path in TESTS.glob("test_*.py"):
        names = NAMED.findall(path.read_text("utf-8"))
        assert len(names) == len(set(names)), path.name
