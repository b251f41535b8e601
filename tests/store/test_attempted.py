"""`attempted` has one meaning (store.ledger.was_attempted): a ledger line or run record ran the
engine unless it says `attempted: false`; a line without the key ran. Every reader counts attempts
through that one test, so spent, status, the run table and the benchmarks never disagree."""

from __future__ import annotations

import ast

import pytest

from store import versioned
from store.ledger import ATTEMPTED_DEFAULT, ledger_line, spent_of, was_attempted
from store.run_record import RunRecord
from tests.source_scan import ROOT, assert_none_outside

HOME = ROOT / "store" / "ledger.py"


@pytest.mark.parametrize(("record", "ran"), [
    ({}, True),                                  # written before the key existed
    ({"attempted": True}, True),
    ({"attempted": False}, False),               # recorded without running
    ({"attempted": None}, True),                 # not what the harness writes: only false says "not run"
    ({"attempted": 0}, True),
])
def test_only_an_explicit_false_is_not_an_attempt(record, ran):
    assert ATTEMPTED_DEFAULT is True and was_attempted(record) is ran


@pytest.mark.parametrize(("extra", "ran"), [({}, True), ({"attempted": True}, True), ({"attempted": False}, False),
                                            ({"attempted": None}, True)])
def test_a_run_record_counts_as_its_dict_does(extra, ran):
    doc = {**versioned.RUN.stamp(), "cell_id": "c-1", "attempt": 1, "outcome": "ok", **extra}
    assert was_attempted(RunRecord.from_dict(doc, "run.json")) is ran is was_attempted(doc)


def test_spent_and_the_ledger_line_count_as_the_one_test_does():
    base = {"outcome": "ok", "attempt": 1, "started_at": 10.0, "ended_at": 15.0, "host": "h"}
    records = [{**base, "cell_id": f"c-{i}", **extra} for i, extra in
               enumerate(({}, {"attempted": True}, {"attempted": False}, {"attempted": None}))]
    assert spent_of(records).cells == 3 and spent_of(records).device_s == 15.0
    runs = [RunRecord.from_dict({**versioned.RUN.stamp(), **r}, "run.json") for r in records]
    assert [ledger_line(r)["attempted"] for r in runs] == [True, True, False, True]


def _reads_attempted(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "attempted"
    return isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
        and isinstance(node.slice, ast.Constant) and node.slice.value == "attempted"


def reads(text: str) -> list[str]:
    """Where a module reads a record's `attempted` itself (`r.get("attempted", …)`, `r["attempted"]`)
    instead of asking store.ledger.was_attempted."""
    return [f"{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(text)) if _reads_attempted(node)]


PLANTS = (  # each spells it a second way: the scan must find every one
    'lost = [r for r in records if r.get("attempted", True)]\n',
    'unrun = sum(1 for r in lines if not r.get("attempted"))\n',
    'ran = rec.get("attempted", False)\n',
    'if record["attempted"]:\n    pass\n',
)


def test_no_module_reads_attempted_but_the_ledger():
    assert_none_outside(HOME, reads, "attempted read, not through was_attempted,", PLANTS)


def test_the_scan_leaves_writes_alone():
    assert reads('record = {"attempted": True}\nrecord["attempted"] = False\nrecord.update(attempted=False)\n') == []
