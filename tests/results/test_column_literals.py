"""The run table's readers name a column through results/read/columns.py (`C.tok_s`), never as a
string literal of their own, and every `C.<name>` names a declared column.

Covered: the modules tests/results/column_literals.py lists in `READERS` (results/analysis,
results/site, results/db, results/replay, harness/cli, harness/demo.py, harness/run/verify.py)
and results/read/table.py, for the names of every declared column but the configuration columns
(`FIXED`, `AFTER_CONFIG`, `QUALITY`). Not the configuration columns: their names are store.cells
`CellConfig`'s fields, read as attributes, so a literal `"threads"` does not say which it is. Not
the rest of the tree: there the same words are other formats' keys, declared where they belong: a
campaign file's keys and sweep options (harness/campaign/), the engine's output names
(engine/interface/outputs.py), run.json's fields (store/run_record.py), the parsers' own fields
(results/read/parse*.py). A docstring is documentation."""

from __future__ import annotations

from pathlib import Path

import pytest

from results.read import columns as cols
from results.read.columns import C

ROOT = Path(__file__).resolve().parents[2]
NAMES = {c.name for c in cols.FIXED + cols.AFTER_CONFIG + cols.QUALITY}


def test_the_readers_spell_no_column_name_outside_the_declaration():
    from tests.results.column_literals import ALLOWED, literal_columns

    found = literal_columns(ROOT, NAMES)
    unexpected = {where: names - ALLOWED.get(where, set()) for where, names in found.items()}
    unexpected = {where: names for where, names in unexpected.items() if names}
    assert not unexpected, "column names spelled as literals outside results/read/columns.py (name them as " \
        "columns.C.<name>): " + "; ".join(f"{where}: {' '.join(sorted(names))}"
                                          for where, names in sorted(unexpected.items()))
    # an allowed name the file no longer spells is taken off the list
    stale = {where: left for where, names in ALLOWED.items() if (left := names - found.get(where, set()))}
    assert not stale, f"ALLOWED names a file no longer spells: {stale}"


def test_every_attribute_of_c_in_the_tree_is_a_declared_column():
    from tests.results.column_literals import attributes_of_c

    used = attributes_of_c(ROOT, ("results", "harness", "store", "devices", "tests", "benchmarks"))
    assert "results/read/table.py" in used          # the scan sees run_row's own names
    wrong = {where: {a for a in attrs if not hasattr(C, a)} for where, attrs in used.items()}
    assert not any(wrong.values()), "C.<name> that is no declared column: " + "; ".join(
        f"{where}: {' '.join(sorted(attrs))}" for where, attrs in sorted(wrong.items()) if attrs)


def test_c_gives_each_declared_name_and_refuses_any_other():
    assert C.tok_s == "tok_s" and C.pass_ == "pass" and C.cache_mb_config == "cache_mb_config"
    assert all(getattr(C, c.name) == c.name for c in cols.COLUMNS if c.name != "pass")
    for wrong in ("tok_ss", "pass__", "row", "_FIXED"):
        with pytest.raises(AttributeError, match="no column of the run table"):
            getattr(C, wrong)
