"""The outcome vocabulary is spelled once (store/outcomes.py): no other module lists outcomes as a
literal tuple, list or set, nor compares an outcome with a literal name; each uses the names and
the sets store.outcomes declares."""

from __future__ import annotations

import ast

import pytest

from store import outcomes
from tests.source_scan import ROOT, assert_none_outside

HOME = ROOT / "store" / "outcomes.py"
NAMES = frozenset(outcomes.OUTCOMES)


def _names_in(node: ast.AST) -> list[str]:
    """The outcome names a literal collection spells (a tuple, list, set, or frozenset([...]) of them)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple") \
            and len(node.args) == 1:
        node = node.args[0]
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return []
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]


def spelled(text: str) -> list[str]:
    """Where a module's source spells outcomes itself: a literal collection of two or more names, or a
    comparison of an outcome with a literal name (`row["outcome"] == "ok"`, `o in ("killed", …)`)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        names = _names_in(node)
        if len(names) >= 2:
            found.append(f"{node.lineno}: the outcomes {names} listed")
        if isinstance(node, ast.Compare) and "outcome" in ast.unparse(node):
            for side in (node.left, *node.comparators):
                if (isinstance(side, ast.Constant) and side.value in NAMES) or _names_in(side):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
                    break
    return found


PLANTS = (  # each spells it a second way: the scan must find every one
    'if rec["outcome"] in ("lmk_killed", "killed"):\n    pass\n',
    'FAILED = frozenset(["lmk_killed", "killed", "config_error", "engine_error", "timeout", "invalid"])\n',
    'RETRIED = {"device_lost", "push_failed"}\n',
    'ok = table[table["outcome"] == "ok"]\n',
    'done = [r for r in recs if r.get("outcome") != "ok"]\n',
    'lost = outcome_name == "device_lost"\n',
)


def test_no_module_but_store_outcomes_spells_the_outcomes():
    assert_none_outside(HOME, spelled, "outcomes spelled, not through its names and sets,", PLANTS)


@pytest.mark.parametrize("fine", [
    'verdict = "ok" if decode <= 1.5 else "NOT MET"\n',             # a word, not a run's outcome
    'done = sum(t["outcome"] == "done" for t in turns)\n',           # a turn's outcome, another vocabulary
    'ok = table[table["outcome"] == OK]\n',
    'if rec["outcome"] in outcomes.KILLS:\n    pass\n',
    'modes = {"ok": m.ok, "runs": m.runs}\n',
])
def test_the_scan_leaves_the_names_in_use_alone(fine):
    assert spelled(fine) == []


def test_the_sets_are_the_vocabulary_split_once():
    assert set(outcomes.RESULTS).isdisjoint(outcomes.INFRA) and set(outcomes.OUTCOMES) == {*outcomes.RESULTS, *outcomes.INFRA}
    assert set(outcomes.KILLS) <= set(outcomes.RESULTS) and outcomes.OK in outcomes.RESULTS
