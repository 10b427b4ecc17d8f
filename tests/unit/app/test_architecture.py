"""The rules of docs/ARCHITECTURE.md ("Rules of the tree"), read from the source itself.

The folders are the architecture only while these hold: a change that adds a package
cycle, lets the domain import settings or a storage class, reaches into another package's
private module or piles a folder past its size fails here, with the offending imports
named, instead of being found by the next person who draws the tree.
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
OURS = ("app", "auth", "pool", "jail")
# Only the composition root and the operator commands wire settings and storage
# classes; the settings and storage packages import themselves.
WIRING = ("app.root", "app.ops", "app.cli", "app.settings", "app.storage")
# A folder holds one concept: past about twenty modules it holds several. The
# migrations are a numbered sequence, one per schema change, not concepts.
MAX_FOLDER_MODULES = 20
SEQUENCES = ("app/storage/migrations/versions",)


def module_files() -> dict[str, Path]:
    """Every module of ours, by dotted name (a package by its folder's name)."""
    found: dict[str, Path] = {}
    for top in OURS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = module_files()


def imports_of(name: str, path: Path) -> Iterator[str]:
    """The modules of ours that `name` imports, resolved to a known module."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


EDGES = {name: set(imports_of(name, path)) for name, path in MODULES.items()}


def package_of(name: str) -> str:
    """The folder a module lives in (a package is its own folder)."""
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def cycles(depth: int) -> list[list[str]]:
    """The strongly connected groups of app's folders, cut at `depth` parts."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, targets in EDGES.items():
        if not name.startswith("app."):
            continue
        here = ".".join(package_of(name).split(".")[:depth])
        for target in targets:
            there = ".".join(package_of(target).split(".")[:depth])
            if target.startswith("app.") and there != here and there != "app":
                graph[here].add(there)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_the_packages_of_app_form_a_dag(depth: int) -> None:
    assert cycles(depth) == []


def test_auth_pool_and_jail_import_nothing_of_app() -> None:
    offenders = sorted(
        (name, target)
        for name, targets in EDGES.items()
        if name.split(".")[0] in ("auth", "pool", "jail")
        for target in targets
        if target.split(".")[0] == "app"
    )
    assert offenders == []


def test_only_the_composition_root_imports_settings_or_storage() -> None:
    offenders = sorted(
        (name, target)
        for name, targets in EDGES.items()
        if name.startswith("app.") and not name.startswith(WIRING)
        for target in targets
        if target.startswith(("app.settings", "app.storage"))
    )
    assert offenders == []


def test_no_module_imports_another_package_s_private_module() -> None:
    offenders = []
    for name, targets in EDGES.items():
        for target in targets:
            parts = target.split(".")
            private = [i for i, part in enumerate(parts) if part.startswith("_")]
            if not private or parts[private[0]].startswith("__"):
                continue
            owner = ".".join(parts[: private[0]])
            if not (name == owner or name.startswith(owner + ".")):
                offenders.append((name, target))
    assert sorted(offenders) == []


def test_every_package_names_its_surface() -> None:
    silent = [
        name
        for name, path in MODULES.items()
        if path.name == "__init__.py"
        and "migrations" not in path.parts
        and "__all__" not in path.read_text()
    ]
    assert silent == []


def test_no_folder_holds_more_than_about_twenty_modules() -> None:
    sizes = Counter(
        str(path.parent.relative_to(ROOT))
        for name, path in MODULES.items()
        if name.startswith("app.") and path.name != "__init__.py"
    )
    crowded = {
        folder: count
        for folder, count in sizes.items()
        if count > MAX_FOLDER_MODULES and folder not in SEQUENCES
    }
    assert crowded == {}


def test_no_two_public_classes_share_a_name() -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for name, path in MODULES.items():
        if "migrations" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                homes[node.name].append(name)
    assert {cls: where for cls, where in homes.items() if len(where) > 1} == {}


def test_the_rules_hold_on_a_graph_that_has_edges() -> None:
    # The checks above pass on an empty graph too: this one says the graph is real.
    assert len(MODULES) > 200
    assert "app.storage.experiment_store" in EDGES["app.root.main"]
    assert sum(len(targets) for targets in EDGES.values()) > 500
