"""File-level imports (a function's own import counts too): the engine imports no other package,
and no two harness modules import each other."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_the_engine_imports_no_other_package():
    for path in (ROOT / "engine").rglob("*.py"):
        outside = {n for n in _imports(path) if n.split(".")[0] in ("devices", "harness", "results")}
        assert not outside, f"{path.name} imports {sorted(outside)}"


def test_no_two_harness_modules_import_each_other():
    modules = {f"harness.{p.stem}": _imports(p) for p in (ROOT / "harness").glob("*.py")}
    pairs = sorted((a, b) for a in modules for b in modules
                   if a < b and b in modules[a] and a in modules[b])
    assert not pairs
