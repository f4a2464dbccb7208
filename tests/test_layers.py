"""The import graph, read from the source with `ast`: the package's floors hold and nothing in the tree imports
a test module.

Every import counts: at the top, inside functions (the lazy ones) and under `TYPE_CHECKING`, since each is an
edge a reader must follow and an upward one is a cycle waiting for its second half.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "rnic_exporter"

# Lowest first. A package may import its own modules and those of lower floors, never a higher floor or
# another package of its own floor. This is docs/development.md's layout as the code has it: the target's
# floors (the December 2026 design review's target layout: model → catalog, sources → detect, sim, dashboards → config →
# sinks, web → daemon → commands → cli) with web above sinks, since the web front serves the sinks' families.
FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "model errors",
        "catalog",
        "sources",
        "detect sim dashboards",
        "config",
        "sinks",
        "web",
        "daemon",
        "commands",
        "cli",
        "__main__",
    )
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


@dataclass(frozen=True)
class Edge:
    source: str  # the importing file, relative to the repository
    line: int
    module: str  # the imported module, absolute


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[Edge]:
    """Every module `path` imports, wherever the statement stands; relative imports made absolute."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    rel = str(path.relative_to(REPO))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(rel, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            if node.module is None:  # `from . import x`: x may be a module
                for alias in node.names:
                    yield Edge(rel, node.lineno, f"{stem}.{alias.name}")
            else:
                yield Edge(rel, node.lineno, stem)


def package_of(module: str) -> str | None:
    """The top-level package (or module) of rnic_exporter that `module` is in, or None outside it."""
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else None


def package_edges(root: Path) -> dict[tuple[str, str], list[Edge]]:
    """(importing package, imported package) -> the imports that make the edge, between different packages."""
    edges: dict[tuple[str, str], list[Edge]] = {}
    for path in sorted(root.rglob("*.py")):
        source = package_of(module_name(path))
        for edge in imports(path):
            target = package_of(edge.module)
            if source is not None and target is not None and target != source:
                edges.setdefault((source, target), []).append(edge)
    return edges


def upward(edges: dict[tuple[str, str], list[Edge]]) -> list[str]:
    """Each import that reaches a package on its own floor or above, as `file:line source -> target`."""
    found = []
    for (source, target), where in sorted(edges.items()):
        if FLOOR[target] >= FLOOR[source]:
            found += [f"{e.source}:{e.line} {source} (floor {FLOOR[source]}) -> {e.module}" for e in where]
    return found


def cycles(edges: dict[tuple[str, str], list[Edge]]) -> list[list[str]]:
    """The package cycles, one path each, found by a depth-first search."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_every_package_has_a_floor() -> None:
    packages = {module_name(p).split(".")[1] for p in (REPO / PACKAGE).rglob("*.py") if p.parent != REPO / PACKAGE}
    modules = {p.stem for p in (REPO / PACKAGE).glob("*.py")} - {"__init__"}
    assert packages | modules == set(FLOOR), "a new package needs its floor in FLOORS"


def test_no_package_imports_its_floor_or_above() -> None:
    edges = package_edges(REPO / PACKAGE)
    assert len(edges) > 30  # the walk saw the package, imports inside functions and TYPE_CHECKING included
    assert upward(edges) == []


def test_no_cycle_between_packages() -> None:
    assert cycles(package_edges(REPO / PACKAGE)) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / PACKAGE


@pytest.mark.parametrize(
    "text",
    [
        "from rnic_exporter.daemon.agent import Agent\n",
        "def f() -> None:\n    from rnic_exporter.daemon import agent\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rnic_exporter.daemon.agent import Agent\n",
        "from ..daemon import agent\n",
        "from .. import daemon\n",
    ],
    ids=["top", "in a function", "TYPE_CHECKING", "relative", "relative package"],
)
def test_an_upward_import_is_found_wherever_it_stands(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    root = _write(
        tmp_path,
        {
            f"{PACKAGE}/__init__.py": "",
            f"{PACKAGE}/sources/__init__.py": "",
            f"{PACKAGE}/sources/sysfs.py": text,
            f"{PACKAGE}/daemon/__init__.py": "",
            f"{PACKAGE}/daemon/agent.py": "from rnic_exporter.sources import sysfs\n",
        },
    )
    edges = package_edges(root)
    assert [line.split(" ", 1)[1] for line in upward(edges)] == [
        f"sources (floor {FLOOR['sources']}) -> {edge.module}" for edge in edges["sources", "daemon"]
    ]
    assert upward(edges) and cycles(edges) == [["daemon", "sources", "daemon"]]


def test_an_import_within_a_floor_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    root = _write(
        tmp_path,
        {f"{PACKAGE}/__init__.py": "", f"{PACKAGE}/sim/__init__.py": "from rnic_exporter.detect import diff\n"},
    )
    assert upward(package_edges(root)) == ["rnic_exporter/sim/__init__.py:1 sim (floor 3) -> rnic_exporter.detect"]


def test_nothing_imports_a_test_module_and_tests_do_not_import_bench() -> None:
    """Shared helpers live in tests/support; bench/ uses them, the tests never use bench/."""
    bench_modules = {"bench"} | {p.stem for p in (REPO / "bench").glob("*.py")}
    found = []
    for top in (PACKAGE, "tests", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            for edge in imports(path):
                parts = edge.module.split(".")
                if (
                    any(p.startswith("test_") for p in parts)
                    or (top != "bench" and parts[0] in bench_modules)
                    or (top == PACKAGE and parts[0] == "tests")
                ):
                    found.append(f"{edge.source}:{edge.line} -> {edge.module}")
    assert found == []
