"""One fact, one place: the byte units KIB, MIB and GIB are engine/units.py's (CONTRIBUTING.md: the
ground every layer stands on). No module anywhere else, tests included, defines its own; no module
under engine/, devices/, harness/, results/, store/ or benchmarks/ spells one inline (`1 << 20`,
`n << 20`, `x >> 20`, `2 ** 20`, `1024 * 1024`, and the same for KiB and GiB): it writes `n * MIB`,
`x / MIB`, `x // MIB`. Tests may spell their sizes inline.

The phone's tool modules (devices/virtual/phone.py's TOOL_MODULES) are left out: they run on the
phone as `python -I -S` with only the standard library and each other on their path, so they cannot
import engine."""

from __future__ import annotations

import ast
from pathlib import Path

from devices.virtual.phone import TOOL_MODULES

ROOT = Path(__file__).resolve().parents[1]
CODE = ("engine", "devices", "harness", "results", "store", "benchmarks")
UNITS = ROOT / "engine" / "units.py"
STANDALONE = {ROOT / "devices" / "virtual" / name for name in TOOL_MODULES}
NAMES = {"KIB", "MIB", "GIB"}
SHIFTS = {10: "KIB", 20: "MIB", 30: "GIB"}
POWERS_OF_1024 = {1: "KIB", 2: "MIB", 3: "GIB"}


def _int(node: ast.expr) -> int | None:
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def definitions(source: str) -> list[tuple[int, str]]:
    """(line, name) for each assignment to KIB, MIB or GIB at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) else []
        found += [(node.lineno, n.id) for t in targets for n in ast.walk(t)
                  if isinstance(n, ast.Name) and n.id in NAMES]
    return sorted(found)


def _unit_of(node: ast.BinOp) -> str | None:
    """The byte unit an arithmetic of constants spells, if it spells one."""
    left, right = _int(node.left), _int(node.right)
    if isinstance(node.op, ast.LShift | ast.RShift):        # n << 20, x >> 20
        return SHIFTS.get(right) if right is not None else None
    if isinstance(node.op, ast.Pow) and left == 2:          # 2 ** 20
        return SHIFTS.get(right) if right is not None else None
    if isinstance(node.op, ast.Pow) and left == 1024:       # 1024 ** 2
        return POWERS_OF_1024.get(right) if right is not None else None
    if isinstance(node.op, ast.Mult) and left == right == 1024:
        return "MIB"
    if isinstance(node.op, ast.Mult) and 1024 in (left, right) and None not in (left, right):
        return "KIB"                                        # 64 * 1024
    return None


def inline_units(source: str) -> list[tuple[int, str]]:
    """(line, unit) for each arithmetic that spells a byte unit inline: a shift by 10, 20 or 30
    bits, 2 ** 10/20/30, 1024 ** 1/2/3, 1024 * 1024, a constant times 1024."""
    return sorted((node.lineno, unit) for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.BinOp) and (unit := _unit_of(node)) is not None)


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py")
                  if p != UNITS and p not in STANDALONE)


def test_only_engine_units_defines_a_byte_unit():
    found = [f"{p.relative_to(ROOT)}:{line} defines {name}; import it from engine.units"
             for p in _modules(*CODE, "tests") for line, name in definitions(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_no_module_spells_a_byte_unit_inline():
    found = [f"{p.relative_to(ROOT)}:{line} spells {unit} inline; use engine.units.{unit}"
             for p in _modules(*CODE) for line, unit in inline_units(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_finders_find_each_spelling_and_nothing_else():
    source = '''
MIB = 1 << 20
GIB: int = 1 << 30
KIB, x = 1 << 10, 2
def f(n, MIB=3):
    global GIB
    GIB += 1
    return n << 20, n >> 20, n / (1 << 30), 2 ** 20, 1024 ** 2, 1024 * 1024, 64 << 10
    return 64 * 1024, 4096 * 1024
ok = (1 << 40, 1000 ** 2, 2 ** 8, 1024 * n, n << 12, "1 << 20", (MIB_PER_S := 1), obj.MIB, 1 << 20.0, 4096)
'''
    assert definitions(source) == [(2, "MIB"), (3, "GIB"), (4, "KIB"), (7, "GIB")]
    assert inline_units(source) == [
        (2, "MIB"), (3, "GIB"), (4, "KIB"),
        (8, "GIB"), (8, "KIB"), (8, "MIB"), (8, "MIB"), (8, "MIB"), (8, "MIB"), (8, "MIB"),
        (9, "KIB"), (9, "KIB")]
