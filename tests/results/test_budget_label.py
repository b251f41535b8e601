"""One budget label (docs/decisions/budget-labels.md): results.read.run_keys.budget_label spells every
budget a person reads, each meaning once; every path that shows one (the plan's progress lines, the
run table, the budget points, the planner's pick, compare, the app's rungs) shows what it returns,
and no other module writes a label's words."""

from __future__ import annotations

import ast
import math
import re

import pandas as pd
import pytest

from harness.plan import grid
from results.analysis import analyze, android_app, compare, planner_check
from results.read import table
from results.read.run_keys import budget_label
from store.cells import CellConfig
from tests.results.test_app_rung import mapped, point
from tests.source_scan import ROOT, assert_none_outside

NAN = math.nan


SPELLINGS = [
    (0, {}, "cache 0"), ("0", {}, "cache 0"), (0.0, {}, "cache 0"),
    (230, {}, "230 MiB"), ("230", {}, "230 MiB"), (230.5, {}, "230.5 MiB"),
    (NAN, {}, "?"), ("", {}, "?"), (None, {}, "?"),
    ("mmap", {}, "mmap"), ("resident", {}, "resident"), ("mmap", {"chose": 5.0}, "mmap"),
    ("auto", {}, "auto"), ("auto", {"ceil_mb": 0}, "auto"), ("auto", {"ceil_mb": "600"}, "auto ceil 600"),
    ("auto", {"ceil_mb": 600, "chose": 412.0}, "auto ceil 600 → 412 MiB"),
    ("auto", {"ceil_mb": 600, "chose": NAN}, "auto ceil 600 → ?"),
    ("planner", {}, "planner"), ("planner", {"chose": 900.0}, "planner → 900 MiB"),
    ("planner", {"chose": "mmap"}, "planner → mmap"), ("planner", {"chose": NAN}, "planner → ?"),
    ("planner", {"chose": 0.0}, "planner → cache 0"),
    (412, {"spec": "cycle*1.2"}, "412 MiB (cycle*1.2)"), (412, {"spec": "knee*1"}, "412 MiB (knee*1)"),
    (412, {"spec": "412"}, "412 MiB"), (None, {"spec": "knee*0.9"}, "knee*0.9 (MiB from the probe)"),
    (1200, {"forced": True}, "1200 MiB forced"), (1200, {"spec": "cycle*2", "forced": True}, "1200 MiB (cycle*2) forced"),
    (0, {"probe_tokens": 64}, "route-trace probe, cache 0, 64 tokens"),
    # upstream's community table, its own vocabulary
    (3000, {"upstream": True}, "3000 MiB"), (0, {"upstream": True}, "0 MiB"), (NAN, {"upstream": True}, "n/a"),
    ("auto", {"upstream": True}, "auto"), ("auto", {"ceil_mb": 4000, "upstream": True}, "auto, cap 4000"),
    ("auto", {"ceil_mb": 4000, "chose": 3000.0, "upstream": True}, "auto, cap 4000 (3000 MiB)"),
    ("auto", {"chose": NAN, "upstream": True}, "auto"), ("mmap", {"upstream": True}, "mmap (baseline)"),
]


@pytest.mark.parametrize(("asked", "kw", "label"), SPELLINGS)
def test_each_budget_is_spelled_one_way(asked, kw, label):
    assert budget_label(asked, **kw) == label


MARK = "<one budget label>"


@pytest.fixture
def marked(monkeypatch):
    """budget_label replaced, in every module that shows a budget, by one that returns MARK."""
    calls = []

    def mark(*args, **kwargs):
        calls.append((args, kwargs))
        return MARK
    for module in (grid, table, analyze, android_app, compare, planner_check):
        monkeypatch.setattr(module, "budget_label", mark)
    return calls


def _cell(**config) -> grid.Cell:
    base = dict(moe_stream=True, no_mmap=False, cache_mb=0, cache_auto=False, cache_ceil_mb=0, dense_weights="anon",
                n_expert_used=2, threads=1, io_threads=2, n_predict=8, budget_spec="0")
    return grid.Cell("c-1", "local", "m", "bmoe-py", CellConfig(**{**base, **config}), 0, 0, 0, ())


PLANNED = [
    (dict(), "cache 0"),
    (dict(cache_mb=412, budget_spec="cycle*1.2"), "412 MiB (cycle*1.2)"),
    (dict(cache_mb=1200, budget_spec="1200", force_cache_auto=True), "1200 MiB forced"),
    (dict(cache_mb=None, budget_spec="knee*0.9"), "knee*0.9 (MiB from the probe)"),
    (dict(probe=True, route_trace=True, n_predict=64), "route-trace probe, cache 0, 64 tokens"),
    (dict(cache_mb=None, cache_auto=True, cache_ceil_mb=600, budget_spec="auto"), "auto ceil 600"),
    (dict(moe_stream=False, cache_mb=None, budget_spec="mmap"), "mmap"),
    (dict(moe_stream=False, no_mmap=True, cache_mb=None, budget_spec="resident"), "resident"),
    (dict(planner=True, cache_mb=None, budget_spec="planner"), "planner"),
]


@pytest.mark.parametrize(("config", "label"), PLANNED)
def test_a_cells_progress_label_shows_the_one_label(marked, config, label):
    assert _cell(**config).label().startswith(f"m {MARK} dense=anon ")


@pytest.mark.parametrize(("config", "label"), PLANNED)
def test_a_cells_progress_label_reads_as_the_function_spells_it(config, label):
    assert _cell(**config).label().startswith(f"m {label} dense=anon ")


@pytest.mark.parametrize(("stream", "auto", "budget", "config", "planner", "label"), [
    (True, False, 0.0, {}, False, "cache 0"), (True, False, 412.0, {}, False, "412 MiB"),
    (True, False, NAN, {}, False, "?"), (None, False, 412.0, {}, False, "412 MiB"),
    (False, False, NAN, {}, False, "mmap"), (False, False, NAN, {"no_mmap": True}, False, "resident"),
    (True, True, 412.0, {"cache_ceil_mb": 600}, False, "auto ceil 600"), (True, True, NAN, {}, False, "auto"),
    (False, None, NAN, {}, True, "planner → mmap"), (True, None, 900.0, {}, True, "planner → 900 MiB"),
    (None, None, NAN, {}, True, "planner → ?"),
])
def test_the_run_tables_budget_label_is_the_functions(marked, stream, auto, budget, config, planner, label):
    assert table._budget_label(stream, auto, budget, CellConfig(**config), planner) == MARK


def test_the_run_tables_budget_label_reads_as_the_function_spells_it():
    assert table._budget_label(True, False, 0.0, CellConfig(), False) == "cache 0"
    assert table._budget_label(False, None, NAN, CellConfig(), True) == "planner → mmap"
    assert table._budget_label(True, True, 412.0, CellConfig(cache_ceil_mb=600), False) == "auto ceil 600"


def _runs() -> pd.DataFrame:
    rows = [dict(moe_stream=False, no_mmap=False), dict(moe_stream=False, no_mmap=True),
            dict(moe_stream=True, cache_auto=True, cache_mb=412.0, cache_ceil_mb=600.0),
            dict(moe_stream=True, cache_auto=True, cache_mb=NAN, cache_ceil_mb=600.0),
            dict(moe_stream=True, cache_mb=0.0), dict(moe_stream=True, cache_mb=412.0)]
    base = dict(moe_stream=True, no_mmap=False, cache_auto=False, cache_mb=NAN, cache_ceil_mb=NAN,
                outcome="ok", killed=False, tok_s=2.0)
    return pd.DataFrame([{**base, **r, "run_id": f"c/r{i}/1"} for i, r in enumerate(rows)])


def test_every_budget_point_is_labelled_by_the_function(marked):
    streamed, baselines = analyze._points(_runs(), [], 100.0)
    assert len(streamed) == 4 and len(baselines) == 2
    assert {p.label for p in streamed + baselines} == {MARK}


def test_the_budget_points_read_as_the_function_spells_them():
    streamed, baselines = analyze._points(_runs(), [], 100.0)
    assert sorted(p.label for p in streamed + baselines) == sorted(
        ["mmap", "resident", "auto ceil 600 → 412 MiB", "auto ceil 600 → ?", "cache 0", "412 MiB"])


def _pick(budget_mib: float, declined: str) -> planner_check.PlannerPick:
    return planner_check.PlannerPick("dense=anon", budget_mib, "fits" if declined else "experts-stream", declined, "",
                                     1, 1, 0, ("c/p/1",), NAN, NAN, "", "", "held")


PICKS = [
    (900.0, "", "planner (dense=anon): 900 MiB (experts-stream) — held"),
    (NAN, "the model fits", "planner (dense=anon): mmap (fits) — held"),
    (NAN, "", "planner (dense=anon): ? (experts-stream) — held"),
]


@pytest.mark.parametrize(("budget", "declined", "text"), PICKS)
def test_the_planners_pick_is_labelled_by_the_function(marked, budget, declined, text):
    assert _pick(budget, declined).text() == text.replace(text.split(": ")[1].split(" (")[0], MARK, 1)


@pytest.mark.parametrize(("budget", "declined", "text"), PICKS)
def test_the_planners_pick_reads_as_the_function_spells_it(budget, declined, text):
    assert _pick(budget, declined).text() == text


def test_the_app_rungs_are_named_by_the_function(marked):
    safe = mapped([point(0, tok_s=2.0), point(1000)], 1200)
    assert safe.reason.startswith(f"app rung {MARK}: ")
    cache0 = mapped([point(0, tok_s=2.0), point(500), point(1000, killed=2)], 1200)
    assert cache0.rung_mb == 0 and cache0.reason.startswith(f"app rung {MARK}: ") and f"{MARK} killed" in cache0.reason
    none = mapped([point(500), point(1000, killed=2)], 1200)
    assert none.rung_mb is None and none.reason.count(MARK) == 3       # 1000 killed, 500 under the cycle, 0 unmeasured


def test_compare_labels_a_cell_by_the_function(marked):
    row = {"device": "local", "model": "m", "n_expert_used": 2.0, "moe_stream": True, "cache_mb": 0.0}
    assert compare._label(row) == f"local m k=2 {MARK}"


# words only a budget label has: a module other than results/read/run_keys.py that writes one spells a
# label of its own (these are the spellings the code had before there was one function). The engine
# is left out: its lines ("mode: expert streaming, cache off") are bmoe-cli's, not labels of ours.
LABEL_WORDS = ("(no stream", "declined streaming)", "(cache off)", "MiB from the probe", "route-trace probe,",
               "auto ceil ", ", cap ", "(baseline)")
SCANNED = ("devices", "harness", "results", "store", "benchmarks")
ONE_HOME = ROOT / "results" / "read" / "run_keys.py"


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """The string constants of a module (f-strings' literal parts too), docstrings left out."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _mib_text(node: ast.AST) -> bool:
    """An f-string that writes a number of MiB (a rate, MiB/s or MiB/token, is not a budget)."""
    return isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.Constant) and re.search(r"MiB(?!/)", str(v.value))
                                                   for v in node.values)


def _zero_special_cases(tree: ast.AST) -> list[int]:
    """Lines of `"off" if b == 0 else f"{b:g} MiB"` (or `f"{b} MiB" if b else "0"`): a word for a
    budget of 0 beside a MiB number."""
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.IfExp) or _mib_text(n.body) == _mib_text(n.orelse):
            continue
        t, mib = n.test, n.body if _mib_text(n.body) else n.orelse
        shown = {ast.unparse(v.value) for v in ast.walk(mib) if isinstance(v, ast.FormattedValue)}
        zero = ast.unparse(t) in shown or (
            isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq))
            and any(isinstance(c, ast.Constant) and c.value in (0, "0") for c in (t.left, *t.comparators)))
        if zero:
            out.append(n.lineno)
    return out


def _spellings(text: str) -> list[str]:
    """Each budget label a module's source spells itself, by line."""
    tree = ast.parse(text)
    return ([f"{line}: {value!r}" for line, value in _strings(tree) if any(w in value for w in LABEL_WORDS)]
            + [f"{line}: a budget of 0 spelled beside a MiB number" for line in _zero_special_cases(tree)])


PLANTS = (  # each spells it a second way: the scan must find every one
    'name = "0 (cache off)" if rung == 0 else f"{rung} MiB"\n',
    'label = "off" if b == 0 else f"{b:g} MiB"\n',
    'skipped.append(f"{rung} MiB {problem}" if rung else f"0 {problem}")\n',
    'budget = "resident (no stream, --no-mmap)" if c.no_mmap else "mmap (no stream)"\n',
    'cache = "auto" + (f", cap {ceil:.0f}" if ceil else "")\n',
    'label = f"auto ceil {ceil:g}"\n',
    'def f(spec):\n    """A docstring may say auto ceil 600."""\n    return f"{spec} (MiB from the probe)"\n',
)


def test_no_module_but_the_one_home_spells_a_budget_label():
    assert_none_outside(ONE_HOME, _spellings, "budget labels spelled, not by budget_label,", PLANTS, SCANNED)


def test_the_words_scanned_for_are_what_the_function_spells():
    spelled = [budget_label(a, **kw) for a, kw, _ in SPELLINGS]
    legacy = ("(no stream", "declined streaming)", "(cache off)")    # spellings there were before, now gone
    assert [w for w in LABEL_WORDS if w not in legacy and not any(w in s for s in spelled)] == []
