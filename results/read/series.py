"""What the report reads of a run's per-token metrics CSV and its pressure samples, as plain columns.

A run page charts the metrics CSV's per-token rows and the ~1 Hz samples (results.site.page_views),
and a prediction sums the CSV rows of its cache-0 and anchor cells (results.replay.predict). Both
read them here, as `Columns` (each column a numpy array, as pandas parsed it: same dtype, same
values), so the results database can keep them at ingest (`encode` / `decode`) and `report --db`
reads no CSV: inside `provided(store)`, a run folder the store holds is answered from it, with the
outcome reading its files would have had (the rows, the parser's error, no file); any other folder
is read from its files, as before.

Everything kept is kept whole (every column, every row): a page that charts another column later
needs no new ingest format.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from results.read.parse_text import ParseError
from results.read.provided import Provided
from store import names

FORMAT = 1                    # the layout `encode` writes


class Columns(Mapping[str, np.ndarray]):
    """A table's columns in order, each a numpy array of one length (`columns`, `len` and `[]`
    as a DataFrame's)."""

    def __init__(self, data: Mapping[str, np.ndarray], length: int | None = None) -> None:
        self._data = dict(data)
        self._len = length if length is not None else len(next(iter(self._data.values()), ()))

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Columns:
        """A DataFrame's columns, their values and dtypes as they are."""
        return cls({str(c): frame[c].to_numpy() for c in frame.columns}, len(frame))

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._data)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return self._len

    def frame(self) -> pd.DataFrame:
        """As a DataFrame (a RangeIndex, the columns' dtypes)."""
        return pd.DataFrame(self._data, index=pd.RangeIndex(self._len)) if self._data else pd.DataFrame()


@dataclass(frozen=True)
class TokenRows:
    """A metrics CSV's per-token rows and its preamble (results.read.parse_csv.MetricsFile's)."""

    rows: Columns
    preamble: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class RunSeries:
    """A run folder's metrics CSV and samples as reading them gave: `metrics` None with
    `metrics_error` "" when the run left no CSV, with the parser's message when it did not read;
    `samples` None when there is none or it did not read (the page charts neither then)."""

    metrics: TokenRows | None
    metrics_error: str
    samples: Columns | None


def read_series(folder: str | Path) -> RunSeries:
    """A run folder's series from its files."""
    from results.read.parse_csv import read_metrics_csv, read_samples_csv

    folder = Path(folder)
    metrics, error = None, ""
    if (folder / names.METRICS_CSV).is_file():
        try:
            m = read_metrics_csv(folder / names.METRICS_CSV)
            metrics = TokenRows(Columns.of(m.rows), m.preamble)
        except ParseError as e:
            error = str(e)
    samples = None
    if (folder / names.SAMPLES_CSV).is_file():
        try:
            samples = Columns.of(read_samples_csv(folder / names.SAMPLES_CSV))
        except (ValueError, OSError):
            samples = None
    return RunSeries(metrics, error, samples)


# ── the store a caller provides ──────────────────────────────────────────────────────────────

_provided: Provided[RunSeries] = Provided("provided_series")


def provided(store: Mapping[str, RunSeries]) -> contextlib.AbstractContextManager[None]:
    """Answer the run folders of `store` (its keys: str(folder)) from it, while inside."""
    return _provided.providing(store)


def stored(folder: str | Path) -> RunSeries | None:
    """The provided series of a run folder, or None when no store holds it."""
    return _provided.of(folder)


def run_series(folder: str | Path) -> RunSeries:
    """A run folder's series: from the provided store when it holds it, else from its files."""
    found = stored(folder)
    return found if found is not None else read_series(folder)


def token_rows(path: str | Path) -> TokenRows | None:
    """A metrics CSV's rows from the provided store (its ParseError raised again, a missing file a
    FileNotFoundError), or None when no store holds its folder (the caller reads the file)."""
    path = Path(path)
    found = stored(path.parent) if path.name == names.METRICS_CSV else None
    if found is None:
        return None
    if found.metrics is not None:
        return found.metrics
    if found.metrics_error:
        raise ParseError(found.metrics_error)
    raise FileNotFoundError(f"{path}: no such file")


def fingerprint(folder: str | Path) -> str:
    """A digest of a run folder's series, equal for equal series whether the provided store or
    the files give them (a store keeps `encode`'s bytes: results.db.load)."""
    raw = getattr(_provided.store(), "raw", None)
    data = raw(str(folder)) if raw is not None else None
    return hashlib.sha256(data if data is not None else encode(run_series(folder))).hexdigest()


# ── bytes for the database ───────────────────────────────────────────────────────────────────


def _encode_columns(cols: Columns | None, parts: list[bytes]) -> Any:
    if cols is None:
        return None
    out = []
    for name, values in cols.items():
        if values.dtype.kind in "biuf":
            raw = np.ascontiguousarray(values).tobytes()
            out.append([name, values.dtype.str, len(raw)])
            parts.append(raw)
        else:                          # text or mixed: JSON, NaN as JSON's NaN
            out.append([name, "json", [v.item() if hasattr(v, "item") else v for v in values]])
    return {"len": len(cols), "columns": out}


def _decode_columns(doc: Any, blob: memoryview, at: int) -> tuple[Columns | None, int]:
    if doc is None:
        return None, at
    data: dict[str, np.ndarray] = {}
    for name, dtype, extra in doc["columns"]:
        if dtype == "json":
            values = np.empty(len(extra), dtype=object)
            values[:] = extra
            data[name] = values
        else:
            data[name] = np.frombuffer(blob[at:at + extra], dtype=np.dtype(dtype)).copy()
            at += extra
    return Columns(data, int(doc["len"])), at


def encode(series: RunSeries) -> bytes:
    """The series as bytes (zlib of a JSON head and the numeric columns' raw values: exact)."""
    parts: list[bytes] = []
    head = {"format": FORMAT, "error": series.metrics_error,
            "preamble": dict(series.metrics.preamble) if series.metrics is not None else None,
            "metrics": _encode_columns(series.metrics.rows if series.metrics is not None else None, parts),
            "samples": _encode_columns(series.samples, parts)}
    text = json.dumps(head).encode()
    return zlib.compress(struct.pack("<I", len(text)) + text + b"".join(parts), 1)


def decode(data: bytes) -> RunSeries:
    """`encode`'s bytes back as the series."""
    raw = memoryview(zlib.decompress(data))
    (n,) = struct.unpack("<I", raw[:4])
    head = json.loads(bytes(raw[4:4 + n]))
    if head.get("format") != FORMAT:
        raise ValueError(f"series format {head.get('format')}, this bmoe-fleet reads {FORMAT}")
    at = 4 + n
    metrics, at = _decode_columns(head["metrics"], raw, at)
    samples, at = _decode_columns(head["samples"], raw, at)
    rows = TokenRows(metrics, MappingProxyType(head["preamble"] or {})) if metrics is not None else None
    return RunSeries(rows, str(head["error"]), samples)
