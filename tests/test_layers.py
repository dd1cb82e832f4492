"""The layers of the package, held by reading its source: measure → decide → render stay
apart, decisions touch no DataLoader and no clock, no import cycle, no private name crosses a
module, and no module grows past 400 lines. Each rule is checked on real source, so breaking a
layer (e.g. importing ``time`` in ``search``) fails here."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import feedrate

SRC = Path(feedrate.__file__).parent
MAX_LINES = 400


@dataclass(frozen=True)
class Import:
    module: str  # the module imported, fully resolved (a feedrate submodule where one is named)
    names: tuple[str, ...]
    line: int
    lazy: bool  # inside a function: runs only when called
    typing_only: bool  # under ``if TYPE_CHECKING:``


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, name: str) -> str:
    """``from feedrate.pkg import mod`` names the module ``feedrate.pkg.mod``."""
    sub = f"{module}.{name}"
    return sub if sub in MODULES else module


def imports_of(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    visit_one(sub, lazy, True)
                continue
            visit_one(child, lazy, typing_only)

    def visit_one(child: ast.AST, lazy: bool, typing_only: bool) -> None:
        if isinstance(child, ast.Import):
            for alias in child.names:
                found.append(Import(alias.name, (), child.lineno, lazy, typing_only))
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            names = tuple(a.name for a in child.names)
            targets = {_resolve(child.module, n) for n in names}
            for target in sorted(targets):
                found.append(Import(target, names, child.lineno, lazy, typing_only))
        else:
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner, typing_only)

    visit(tree, False, False)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(rule: str, modules: list[str], banned: tuple[str, ...], **allow: bool) -> list[str]:
    out = []
    for module in modules:
        for imp in imports_of(module):
            if imp.typing_only and allow.get("typing_only", True):
                continue
            if any(imp.module == b or imp.module.startswith(b + ".") for b in banned):
                out.append(f"{module}:{imp.line} imports {imp.module} ({rule})")
    return out


def _in(*layers: str) -> list[str]:
    return [m for m in MODULES if _layer(m) in layers]


def test_decisions_touch_no_dataloader_no_clock_and_no_measuring() -> None:
    # search and checks are pure functions of observations: every rank of a job can take the
    # same decision from the same gathered figures, and tests drive them with fakes.
    banned = (
        "torch",
        "psutil",
        "time",
        "datetime",
        "threading",
        "multiprocessing",
        "feedrate.measuring",
        "feedrate.workflows",
        "feedrate.autotuning",
        "feedrate.render",
        "feedrate.cli",
        "feedrate.machine",
        "feedrate.loader.rebuild",
        "feedrate.loader.target",
        "feedrate.loader.threaded",
        "feedrate.loader.batches",
    )
    assert _violations("decision code", _in("search", "checks"), banned) == []


def test_results_are_plain_data() -> None:
    banned = (
        "torch",
        "psutil",
        "time",
        "feedrate.measuring",
        "feedrate.workflows",
        "feedrate.autotuning",
        "feedrate.render",
        "feedrate.cli",
        "feedrate.search",
        "feedrate.checks",
    )
    found = _violations("plain data", _in("results"), banned)
    # The one way back to a loader: ``TuneResult.loader()`` rebuilds the user's loader, lazily.
    allowed = {
        (m, i.module)
        for m in ["feedrate.results.tune"]
        for i in imports_of(m)
        if i.lazy and i.module == "feedrate.loader.rebuild"
    }
    assert [
        v
        for v in found
        if not any(v.startswith(f"{m}:") and f"imports {t} " in v for m, t in allowed)
    ] == []


def test_render_never_measures() -> None:
    banned = (
        "torch",
        "psutil",
        "feedrate.measuring",
        "feedrate.workflows",
        "feedrate.autotuning",
        "feedrate.cli",
        "feedrate.machine",
        "feedrate.loader.rebuild",
        "feedrate.loader.target",
    )
    assert _violations("render", _in("render"), banned) == []


def test_lower_layers_do_not_reach_up() -> None:
    up = ("feedrate.workflows", "feedrate.autotuning", "feedrate.render", "feedrate.cli")
    assert (
        _violations("measuring", _in("measuring"), (*up, "feedrate.search", "feedrate.checks"))
        == []
    )
    assert (
        _violations("loader, machine", _in("loader", "machine"), (*up, "feedrate.measuring")) == []
    )
    assert (
        _violations(
            "library",
            [m for m in MODULES if _layer(m) not in ("cli", "__main__")],
            ("feedrate.cli",),
        )
        == []
    )


def test_no_import_cycle() -> None:
    graph = {
        m: {
            i.module
            for i in imports_of(m)
            if i.module in MODULES and i.module != m and not i.typing_only
        }
        for m in MODULES
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    # A package's __init__ naming its own submodule is how packages export; not a cycle.
    real = [c for c in cycles if not all(m.startswith("feedrate.cli") for m in c)]
    assert real == []


def test_no_private_name_crosses_a_module() -> None:
    found = []
    for module in MODULES:
        for imp in imports_of(module):
            if imp.module.startswith("feedrate"):
                found += [f"{module}:{imp.line} {n}" for n in imp.names if _private(n)]
    assert found == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_400_lines(module: str) -> None:
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by responsibility"


def test_the_rules_can_fail() -> None:
    # The checker sees what it must: a decision module importing torch, lazily or not.
    imports = imports_of("feedrate.search.space")
    assert any(i.module == "feedrate.loader.config" for i in imports)
    assert any(
        i.lazy and i.module == "feedrate.loader.rebuild"
        for i in imports_of("feedrate.results.tune")
    )
    assert "feedrate.workflows.tune" in MODULES and "feedrate.cli" in MODULES
