"""The run table read back from the results database: the DataFrame `build_table` gives for the
same campaign directories (same columns in the same order, same dtypes, same rows in the same
order), so every output made from it is byte for byte the one made from the files.

Labels (`campaign`, and so `run_id`) are worked out for the campaigns asked, as
`read_campaigns` works them out (two of one name get their folder); the configuration columns
come from each row's `config` object, as `run_row` makes them (results/read/columns.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from results.db import schema
from results.errors import ResultsError
from results.read import columns as cols
from results.read.quality import RunOutput, quality_columns
from results.read.rundir import campaign_labels
from results.read.table import KEY_COLUMNS


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)


def _bool(v: Any) -> bool:
    return bool(v)


def _maybe_bool(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _int(v: Any) -> int:
    return int(v)


def _text(v: Any) -> str:
    return "" if v is None else str(v)


def _decoder(c: cols.Column) -> Callable[[Any], Any]:
    if c.type == "float":
        return _float
    if c.type == "bool":
        return _maybe_bool if c.nullable else _bool
    if c.type == "int":
        return _int
    return _text


_FIXED = [(c.name, _decoder(c)) for c in cols.FIXED]
_AFTER = [(c.name, _decoder(c)) for c in cols.AFTER_CONFIG]
_OUTPUT = " output"              # a run's output while its row is read (no column of the table)


def _row(db: Any, label: str) -> dict[str, Any]:
    """A `runs` row as `run_row` made it."""
    m = db._mapping
    row: dict[str, Any] = {name: decode(m[name]) for name, decode in _FIXED}
    row[_OUTPUT] = m["output"]
    row["campaign"] = label
    row["run_id"] = f"{label}/{row['cell_id']}/{row['attempt']}"
    for key, value in sorted(json.loads(row["config"] or "{}").items()):
        row[cols.config_column(key, row)] = json.dumps(value) if isinstance(value, (list, dict)) else value
    for name, decode in _AFTER:
        row[name] = decode(m[name])
    return row


def run_table(dirs: Sequence[str | Path], db: str | None) -> pd.DataFrame:
    """The run table of campaign directories DIRS, as ingested into the database."""
    if not dirs:
        raise ResultsError("give at least one campaign directory")
    engine = schema.connect(db, create=False)
    c, r = schema.campaigns, schema.runs
    try:
        with engine.connect() as conn:
            found = {row.dir: row for row in conn.execute(select(c))}
            wanted = []
            for d in dirs:
                key = str(Path(d).resolve())
                if key not in found:
                    raise ResultsError(f"{d}: not in the database {schema.shown(str(engine.url))} (bmoe-fleet db "
                                       f"ingest {d} --db URL)")
                wanted.append(found[key])
            labels = campaign_labels([w.name for w in wanted], [w.dir for w in wanted])
            rows: list[dict[str, Any]] = []
            for camp, label in zip(wanted, labels):
                got = sorted(conn.execute(select(r).where(r.c.campaign_id == camp.id)),
                             key=lambda x: (x.cell_id, x.attempt))
                rows += [_row(x, label) for x in got]
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()
    if not rows:
        raise ResultsError("no runs in " + ", ".join(str(w.dir) for w in wanted))
    # each run against a lossless run of the same question, from the outputs the database kept (as
    # results.read.table.build_table does from the run folders)
    outputs = {str(r["run_id"]): RunOutput.from_json(r.pop(_OUTPUT)) for r in rows}
    frame = pd.DataFrame(rows)          # as results.read.table.build_table frames its rows
    frame = quality_columns(frame, {k: v for k, v in outputs.items() if v.known})
    rest = [col for col in frame.columns if col not in KEY_COLUMNS]
    frame = frame[list(KEY_COLUMNS) + rest]
    return frame.sort_values(["campaign", "device", "model", "order", "attempt"], kind="stable").reset_index(drop=True)
