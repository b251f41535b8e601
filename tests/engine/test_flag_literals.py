"""No module outside engine/interface/ spells an engine flag: it names it through the table."""

from __future__ import annotations

from pathlib import Path

from engine.interface import flags as table

ROOT = Path(__file__).resolve().parents[2]


def test_flag_names_are_written_in_the_table_alone():
    """Outside tests, docs and engine/interface/, no module spells a flag of the table as a
    string literal: it names the flag through the table (engine.interface.flags)."""
    from tests.engine.flag_literals import ALLOWED, literal_flags

    found = literal_flags(ROOT, set(table.by_name()))
    unexpected = {where: names for where, names in found.items() if names - ALLOWED.get(where, set())}
    assert not unexpected, "flag names spelled outside engine/interface/flags.py: " + "; ".join(
        f"{where}: {' '.join(sorted(names - ALLOWED.get(where, set())))}" for where, names in sorted(unexpected.items()))
