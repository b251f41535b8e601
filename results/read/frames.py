"""A run table's rows as mappings, with the values `DataFrame.to_dict("records")` gives, without
its cost.

pandas builds each record through `itertuples`, taking every column again on each call and
boxing every cell; the run table is some 250 columns wide, and the analysis and the site ask for
the rows of the table and its slices hundreds of times, mostly to read a few keys of each (at
1,000 runs, 7 of a report's 10 s of analysis under cProfile:
docs/lab-notes/2026-12-06-report-speed.md). `row_views` gives read-only mappings over the frame's
columns, each column turned into Python values once, when a row first asks for it (`tolist`:
the scalars `to_dict` boxes; object columns through pandas' own `maybe_box_native`, as
`to_dict` does). tests/results/test_table.py holds them to `to_dict("records")`. `row_digests`
gives each row's digest, for a page that shows it. `frame_csv` gives `to_csv`'s text.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
from pandas.core.dtypes.cast import maybe_box_native


class _Columns:
    """The frame's columns as Python lists, each made on first use."""

    __slots__ = ("at", "frame", "lists", "names")

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self.names = frame.columns.tolist()
        self.at = {name: i for i, name in enumerate(self.names)}      # a repeated name: its last, as to_dict
        self.lists: dict[Any, list[Any]] = {}

    def column(self, key: Any) -> list[Any]:
        values = self.lists.get(key)
        if values is None:
            column = self.frame.iloc[:, self.at[key]]
            values = [maybe_box_native(v) for v in column.to_numpy()] if column.dtype == object \
                else column.tolist()
            self.lists[key] = values
        return values


class Row(Mapping[Any, Any]):
    """One row of a frame: a read-only mapping, column name → the value `to_dict` gives."""

    __slots__ = ("_columns", "_i")

    def __init__(self, columns: _Columns, i: int) -> None:
        self._columns = columns
        self._i = i

    def __getitem__(self, key: Any) -> Any:
        if key not in self._columns.at:
            raise KeyError(key)
        return self._columns.column(key)[self._i]

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self._columns.at else default

    def __contains__(self, key: object) -> bool:
        return key in self._columns.at

    def __iter__(self) -> Iterator[Any]:
        return iter(dict.fromkeys(self._columns.names))

    def __len__(self) -> int:
        return len(self._columns.at)

    def __repr__(self) -> str:
        return f"Row({dict(self)!r})"


def row_views(frame: pd.DataFrame) -> list[Row]:
    """The frame's rows in order (module doc): `to_dict("records")` for readers of a few keys."""
    columns = _Columns(frame)
    return [Row(columns, i) for i in range(len(frame))]


def column_values(frame: pd.DataFrame, name: Any) -> list[Any]:
    """A column's values as the rows of `row_views` give them (None for each row when the frame has
    no such column, as a row's `get` gives)."""
    columns = _Columns(frame)
    return columns.column(name) if name in columns.at else [None] * len(frame)


def row_digests(frame: pd.DataFrame) -> list[str]:
    """Each row's digest (hex text): equal digests, equal rows, for results.site.report's digest of a
    page's inputs. The column names and dtypes, then every value, hashed a column at a time
    (pandas' `hash_pandas_object`, 64 bits a row: a changed row keeps its digest by chance once in
    2**64; 0.0 and -0.0 hash alike); an object column's values by their JSON text (a value JSON
    cannot hold by its str, made once per object: runs of one configuration share its CellConfig,
    results.db.load). Over the 10,028 runs of the report's benchmark a fifth of the CPU of a JSON
    text of every row (docs/decisions/report-speed.md)."""
    head = hashlib.sha256(json.dumps([[str(name), str(dtype)] for name, dtype in frame.dtypes.items()],
                                     ensure_ascii=False).encode()).hexdigest()[:16]
    if not len(frame.columns):
        return [head] * len(frame)
    columns: dict[int, Any] = {}
    for i, dtype in enumerate(frame.dtypes):
        column = frame.iloc[:, i]
        if isinstance(dtype, np.dtype) and dtype.kind == "O":       # (not pandas' str: hashed as it is)
            shown: dict[int, str] = {}         # id → text (the column keeps each object alive meanwhile)
            texts = []
            for value in column.to_numpy():
                text = shown.get(id(value))
                if text is None:
                    text = shown[id(value)] = json.dumps(maybe_box_native(value), ensure_ascii=False, default=str)
                texts.append(text)
            columns[i] = texts
        else:
            columns[i] = column.array
    hashed = pd.util.hash_pandas_object(pd.DataFrame(columns), index=False)
    return [f"{head}{h:016x}" for h in hashed.tolist()]


def frame_csv(frame: pd.DataFrame) -> str:
    """`frame.to_csv(index=False, lineterminator="\\n")`'s text (tests/results/test_table.py holds
    it to pandas' on every kind of column the run table has), in half its time: each column turned
    into its cells' text at once, then the csv module's writer, which pandas' writer uses too, over
    the rows. A float is its shortest repr, as numpy's str gives it; a missing value (NaN, None,
    pandas' NA) nothing; anything else its str. The run table of a report at 10,028 runs (241
    columns): 0.84 s against 1.71 s (docs/decisions/report-speed.md)."""
    cells: list[list[str]] = []
    for i, dtype in enumerate(frame.dtypes):
        column = frame.iloc[:, i]
        if isinstance(dtype, np.dtype) and dtype.kind in "iub":
            cells.append([str(v) for v in column.tolist()])
        elif isinstance(dtype, np.dtype) and dtype.kind == "f":
            cells.append(["" if v != v else repr(v) for v in column.tolist()])
        else:
            missing = pd.isna(column.to_numpy()).tolist()
            cells.append(["" if gone else str(v) for v, gone in zip(column.tolist(), missing)])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([str(name) for name in frame.columns])
    writer.writerows(zip(*cells))
    return out.getvalue()
