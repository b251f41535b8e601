"""File-level imports (a function's own import counts too): each package imports only the layers
under it (the engine nothing, results never the harness), and no modules of one package import
each other, directly or round a longer loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """Dotted names a module imports, absolute ("from .x import y" resolved within its package)."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def _module_graph(package: str) -> dict[str, set[str]]:
    """Each module of `package` (its subpackages too) -> the modules of the package it imports. A
    package's __init__ is left out: importing a subpackage by name is no loop."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts): _imports(p)
               for p in (ROOT / package).rglob("*.py") if p.stem != "__init__"}
    return {m: {n for n in names if n in modules and n != m} for m, names in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of a graph: its strongly connected components of two or more modules
    (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


# What each package may import (CONTRIBUTING.md): the engine nothing, so it runs alone on a phone;
# devices the engine; the campaign store the engine; results the engine and the store, never a
# device or the harness (everything is recomputable from a campaign directory); the harness all.
LAYERS = {"engine": set(), "devices": {"engine"}, "store": {"engine"}, "results": {"engine", "store"},
          "harness": {"engine", "devices", "store", "results"}}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_package_imports_only_the_layers_under_it(package):
    for path in (ROOT / package).rglob("*.py"):
        outside = {n for n in _imports(path) if n.split(".")[0] in set(LAYERS) - LAYERS[package] - {package}}
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_modules_of_a_package_import_each_other_round_a_loop(package):
    assert _cycles(_module_graph(package)) == []


def test_the_loop_finder_finds_a_loop_of_three_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}, "f": {"f"}}
    assert _cycles(graph) == [["a", "b", "c"]]



# results/'s rooms, top down (CONTRIBUTING.md): each imports only the rooms under it and the shared
# modules at results/'s top (errors, numbers, formats, publish), which import no room but read/'s
ROOMS = ("site", "analysis", "replay", "db", "read")


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_of_results_imports_only_the_rooms_under_it(room):
    above = set(ROOMS[:ROOMS.index(room)])
    for path in (ROOT / "results" / room).rglob("*.py"):
        up = {n for n in _imports(path) if n.startswith("results.") and n.split(".")[1] in above}
        assert not up, f"{path.relative_to(ROOT)} imports {sorted(up)}, a room above it"
    for path in (ROOT / "results").glob("*.py"):
        rooms = {n.split(".")[1] for n in _imports(path) if n.startswith("results.") and n.count(".") >= 2}
        assert not rooms & set(ROOMS), f"{path.relative_to(ROOT)} (shared by every room) imports {sorted(rooms)}"


# The rooms of harness/ and engine/, bottom up (CONTRIBUTING.md): each imports only the rooms under it;
# the modules at the package's top sit above every room (harness: the importer and the demo; the CLI
# is the top room) or below every room (engine: units, errors, fsutil, safetext, procfs, interface).
PACKAGE_ROOMS = {
    "harness": ("campaign", "plan", "run", "<top>", "cli"),
    "engine": ("<top>", "interface", "gguf", "kernels", "stream", "forward", "contract", "plan", "app"),
}


def _room(package: str, dotted: str) -> str:
    parts = dotted.split(".")
    rooms = PACKAGE_ROOMS[package]
    return parts[1] if len(parts) > 1 and parts[1] in rooms and (ROOT / package / parts[1]).is_dir() else "<top>"


@pytest.mark.parametrize("package", sorted(PACKAGE_ROOMS))
def test_each_room_imports_only_the_rooms_under_it(package):
    rooms = PACKAGE_ROOMS[package]
    for path in (ROOT / package).rglob("*.py"):
        here = _room(package, ".".join(path.relative_to(ROOT).with_suffix("").parts))
        if path.stem == "__main__":
            continue                     # `python -m engine` starts the app
        for name in _imports(path):
            if name.split(".")[0] != package:
                continue
            there = _room(package, name)
            assert rooms.index(there) <= rooms.index(here), \
                f"{path.relative_to(ROOT)} ({here}) imports {name} ({there}), a room above it"


@pytest.mark.parametrize("package", sorted(PACKAGE_ROOMS))
def test_a_package_top_holds_at_most_eight_modules(package):
    top = sorted(p.name for p in (ROOT / package).glob("*.py"))
    assert len(top) <= 8, f"{package}/ has {len(top)} modules at its top: {top}; give each a room"
