"""A run table's rows as mappings, with the values `DataFrame.to_dict("records")` gives, without
its cost.

pandas builds each record through `itertuples`, taking every column again on each call and
boxing every cell; the run table is some 250 columns wide, and the analysis and the site ask for
the rows of the table and its slices hundreds of times, mostly to read a few keys of each (at
1,000 runs, 7 of a report's 10 s of analysis under cProfile:
docs/lab-notes/2026-12-06-report-speed.md). `row_views` gives read-only mappings over the frame's
columns, each column turned into Python values once, when a row first asks for it (`tolist`:
the scalars `to_dict` boxes; object columns through pandas' own `maybe_box_native`, as
`to_dict` does). tests/results/test_table.py holds them to `to_dict("records")`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

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


def row_texts(frame: pd.DataFrame) -> list[str]:
    """Each row's column names and values as one JSON text (a value JSON cannot hold as its str):
    equal texts, equal rows (results.site.report's digest of a run page's inputs)."""
    texts = RowTexts(frame)
    return [texts[i] for i in range(len(frame))]


class RowTexts:
    """row_texts, each made when asked for by its row's position: the report's forked children
    make their own runs' (results.site.report)."""

    __slots__ = ("lists", "names", "shown")

    def __init__(self, frame: pd.DataFrame) -> None:
        columns = _Columns(frame)
        self.names = json.dumps([str(n) for n in columns.names], ensure_ascii=False)
        self.lists = [columns.column(n) for n in columns.names]
        self.shown: dict[int, str] = {}        # id → str of a value JSON cannot hold (the lists keep it alive)

    def __getitem__(self, i: int) -> str:
        return self.names + json.dumps([values[i] for values in self.lists], ensure_ascii=False, default=self._str)

    def _str(self, value: Any) -> str:
        # runs of one configuration share its (immutable) CellConfig: its str is made once (results.db.load)
        text = self.shown.get(id(value))
        if text is None:
            text = self.shown[id(value)] = str(value)
        return text
