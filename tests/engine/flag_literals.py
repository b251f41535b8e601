"""Where the tree spells an engine flag as a string literal of its own (`"--cache-mb"`), outside
the flag table: test_interface_flags.py fails on any not allowed below, each with its reason.

Long forms only: `-c`, `-m`, `-p`, `-t` are also `sh -c`, `python -m`, toybox's and adb's own
switches, so a short literal says nothing about which program it is for. A click option's name
(and a `SweepOption`'s, which becomes one: harness/campaign/sweep_options.py) is bmoe-fleet's own
command line, not the engine's, and a docstring is documentation."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("engine", "harness", "results", "devices", "store")  # benchmarks/ type command lines as a user would
EXEMPT = ("engine/interface/",)

# file -> flags it may spell, and why
ALLOWED: dict[str, set[str]] = {}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _click_options(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("option", "argument", "add_argument")):
            ids |= {id(a) for a in node.args}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SweepOption" and node.args:
            ids |= {id(n) for n in ast.walk(node.args[0])}       # its names: ("-n", "--n-predict")
    return ids


def string_constants(tree: ast.AST, names: set[str], skip: set[int]) -> set[str]:
    """The names the tree holds as whole string constants, but the nodes whose ids are in `skip`."""
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip and n.value in names}


def literal_flags(root: Path, names: set[str]) -> dict[str, set[str]]:
    """{file: the long flag names it holds as whole string literals} (docstrings and click
    option names aside)."""
    names = {n for n in names if n.startswith("--")}
    out: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(EXEMPT):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            hits = string_constants(tree, names, _docstrings(tree) | _click_options(tree))
            if hits:
                out[rel] = hits
    return out
