"""Read bmoe-cli `--csv` metrics files of every version seen in the wild.

Layout (upstream `core/src/metrics/csv_metrics_sink.cpp`): optional `#` preamble of key=value
lines, a header row starting `step,`, one row per generated token, a `# summary key=value …`
trailer per generation. Versions: no preamble (July 2026 builds; 7, 8, 9, 11 or 12 columns as
`stall_ms`, `mgmt_ms`, `majflt,cpu_ms`, `resident_frac` were appended), `# bmoe_metrics v1`
(22 columns), `# bmoe_metrics v2` (23, 25, 29 columns). Columns are read by name.

The engine truncates the file at open and flushes each line, so a kill leaves a prefix: 0 bytes
(killed during load), rows and no summary (killed during decode), possibly a last line without
its newline. All of those read as incomplete files, never as errors; a file that is not a metrics
CSV at all is a ParseError.

Every number is range-checked here, where it enters (results.read.parse_values): a numeral no engine
prints is refused (NumberError naming file, line and key); nan/inf and values impossible for their
key (a negative time, a hit rate over 100) are stored as missing, and `notes` says which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from results.read.parse_text import (
    MAX_NUMBER_CHARS,
    NUMBER_LIMIT,
    NumberError,
    ParseError,
    excerpt,
    kv_pairs,
    located,
    one_line,
    parse_kv,
    read_lines,
    to_number,
)
from results.read.parse_values import bad_in_column, checked, note, problem

HEADER_START = "step,"
SUMMARY_PREFIX = "# summary"
_MODEL_PREFIX = "# model="
# every version has these; anything after them is optional
REQUIRED_COLUMNS = ("step", "steps", "wall_ms", "io_ms", "compute_ms", "read_bytes", "cache_hit_pct")
# columns where the engine writes -1 for "not measured" (no cache, or a platform without the probe)
NOT_MEASURED = -1
SENTINEL_COLUMNS = ("cache_hit_pct", "dense_resident_frac", "resident_frac")

_MAGIC_RE = re.compile(r"#\s*bmoe_metrics\s+v([0-9]+)\s*")
_ROUTE_TRACE_RE = re.compile(r"#\s*route_trace\s+v[0-9]+")

SummaryValue = int | float | str


@dataclass(frozen=True, eq=False)
class MetricsFile:
    """One metrics CSV. `rows` holds the values as written (-1 sentinels included: see measured()).

    version: 0 = no preamble (July 2026 builds), N = `# bmoe_metrics vN`, None = empty file.
    summary: the last `# summary` trailer (None if the run died first); `summaries` has one per
    generation, in file order (a `--session` run writes one per turn).
    complete: the file ends with a summary trailer, i.e. the engine finished writing it.
    cut_line: the last line had no newline (the process died mid-write); it was left out.
    notes: values stored as missing because no engine could have meant them (nan, a negative
    time …), one line each naming file, line and key.
    """

    path: str
    version: int | None
    preamble: Mapping[str, str]
    columns: tuple[str, ...]
    rows: pd.DataFrame
    summary: Mapping[str, SummaryValue] | None
    complete: bool
    empty: bool = False
    cut_line: bool = False
    summaries: tuple[Mapping[str, SummaryValue], ...] = ()
    notes: tuple[str, ...] = ()

    def measured(self, column: str) -> pd.Series:
        """The column with the engine's -1 "not measured" turned into NaN where -1 means that."""
        values = self.rows[column]
        return values.where(values != NOT_MEASURED) if column in SENTINEL_COLUMNS else values


T = TypeVar("T")
_parsed: ContextVar[dict[tuple[str, str, int, int], Any] | None] = ContextVar("parsed_once", default=None)


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Inside, a metrics CSV or a samples CSV is parsed once: a later read_metrics_csv or
    read_samples_csv of the same file (its path, size and modification time unchanged) gets a copy
    of the first's result (a frame of its own), or the first's error again. results.db.ingest reads
    each run's files for its row of the run table and again for the series it keeps: the parse was
    half of an ingest's time."""
    token = _parsed.set({})
    try:
        yield
    finally:
        _parsed.reset(token)


def _once(kind: str, path: str | Path, parse: Callable[[], T], errors: tuple[type[Exception], ...],
          copy: Callable[[T], T]) -> T:
    """parse(), or inside parsed_once a copy of what it gave this file first (its error again)."""
    seen = _parsed.get()
    if seen is None:
        return parse()
    try:
        st = os.stat(path)
    except OSError:
        return parse()                          # (its own error, as the parser gives it)
    key = (kind, os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in seen:
        try:
            seen[key] = parse()
        except errors as e:
            seen[key] = e
    first = seen[key]
    if isinstance(first, Exception):
        raise type(first)(*first.args)
    return copy(first)


def read_metrics_csv(path: str | Path) -> MetricsFile:
    """One metrics CSV (MetricsFile), or a ParseError naming the file and the line."""
    return _once("metrics", path, lambda: _read_metrics_csv(path), (ParseError,),
                 lambda m: dataclasses.replace(m, rows=m.rows.copy()))


def read_samples_csv(path: str | Path) -> pd.DataFrame:
    """A run's pressure samples CSV as pandas reads it (pandas' ValueError or OSError when it does not)."""
    return _once("samples", path, lambda: pd.read_csv(path), (ValueError, OSError), pd.DataFrame.copy)


def _read_metrics_csv(path: str | Path) -> MetricsFile:
    lines, ends_with_newline = read_lines(path)
    name = str(path)
    if not any(line.strip() for line in lines):
        return _empty(name, version=None, preamble={}, empty=True)
    # a last line without its newline was cut by a kill: its last value may be cut too, so drop it
    cut = None if ends_with_newline else lines.pop()

    # the header is the first line that is not a comment: columns are read by name, in any order
    header_at = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), None)
    # the engine prints the model's file name as it is: a newline in it continues `# model=` on a
    # line of its own, which is that name's rest, not the header (the run is not invalid for it)
    model_lines: list[str] = []
    while (header_at is not None and header_at > 0 and lines[header_at - 1].startswith(_MODEL_PREFIX)
           and not lines[header_at].startswith(HEADER_START)):
        model_lines = model_lines or [lines[header_at - 1][len(_MODEL_PREFIX):]]
        model_lines.append(lines.pop(header_at))
        lines[header_at - 1] = _MODEL_PREFIX + model_lines[-1]
        header_at = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), None)
    head = lines if header_at is None else lines[:header_at]
    version = _version(name, head)
    preamble: dict[str, str] = {}
    notes: list[str] = []
    for number, line in enumerate(head, start=1):
        if not _MAGIC_RE.fullmatch(line):
            preamble.update(_preamble_values(f"{name}:{number}", line, notes))
    if model_lines:
        *first, last = model_lines
        preamble["model"] = "\n".join([*first, last.split(" arch=", 1)[0]])
    if header_at is None:
        if cut is not None and not (cut.startswith(("#", HEADER_START)) or HEADER_START.startswith(cut)):
            raise _not_a_csv(name, len(lines) + 1, cut)     # a cut line that is no header and no comment
        # killed after the preamble, before the header was whole: no rows yet
        return _empty(name, version=version, preamble=preamble, empty=False, cut_line=cut is not None)

    columns = tuple(c.strip() for c in lines[header_at].split(","))
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if len(set(columns)) != len(columns) and not missing:
        twice = next(c for c in columns if columns.count(c) > 1)
        raise ParseError(f"{name}:{header_at + 1}: not a bmoe metrics CSV: the header names column "
                         f"{one_line(twice, 40)} twice")
    if missing and len(columns) > 1:
        raise ParseError(f"{name}: not a bmoe metrics CSV: header lacks {', '.join(missing)}")
    if missing:
        raise _not_a_csv(name, header_at + 1, lines[header_at])

    data: list[tuple[int, str]] = []  # (file line, text)
    summaries: list[Mapping[str, SummaryValue]] = []
    for number, line in enumerate(lines[header_at + 1:], start=header_at + 2):
        where = f"{name}:{number}"
        if line.startswith(SUMMARY_PREFIX):
            values: dict[str, SummaryValue] = {}
            for key, text in kv_pairs(line[len(SUMMARY_PREFIX):]):
                if key in values:  # the engine writes each key once: keep the first, and say so
                    notes.append(f"{where}: summary key {excerpt(key, 40)} repeated, the first value kept")
                    continue
                try:
                    values[key] = to_number(text, key)
                except NumberError as e:
                    raise located(e, where) from None
            summaries.append(MappingProxyType(checked(values, where, notes)))
        elif line.startswith("#"):
            preamble.update(_preamble_values(where, line, notes))
        elif line.strip():
            if line.count(",") + 1 != len(columns):
                raise ParseError(f"{where}: {line.count(',') + 1} fields, the header has {len(columns)}")
            data.append((number, line))
    last = next((line for line in reversed(lines) if line.strip()), "")
    return MetricsFile(
        path=name, version=version, preamble=MappingProxyType(preamble), columns=columns,
        rows=_frame(name, columns, data, notes), summary=summaries[-1] if summaries else None,
        complete=cut is None and last.startswith(SUMMARY_PREFIX), cut_line=cut is not None,
        summaries=tuple(summaries), notes=tuple(notes))


def looks_like_metrics_csv(lines: list[str]) -> bool:
    """True when the first non-blank line opens a metrics CSV (used to sniff `.metrics` files,
    which upstream also used as a name for per-token CSVs)."""
    first = next((line for line in lines if line.strip()), "")
    return first.startswith(HEADER_START) or bool(_MAGIC_RE.fullmatch(first))


def _version(name: str, head: list[str]) -> int:
    """The `# bmoe_metrics vN` number from the comment lines above the header; 0 without one."""
    at, first = next(((i, line) for i, line in enumerate(head) if line.strip()), (0, ""))
    if magic := _MAGIC_RE.fullmatch(first):
        try:   # `v` and 5,000 digits: int() itself refuses past 4,300
            return int(to_number(magic.group(1), "bmoe_metrics"))
        except NumberError as e:
            raise located(e, f"{name}:{at + 1}") from None
    if _ROUTE_TRACE_RE.match(first):
        raise ParseError(f"{name}: is a route trace, not a metrics CSV")
    return 0


def _not_a_csv(name: str, number: int, line: str) -> ParseError:
    return ParseError(f"{name}: not a bmoe metrics CSV: expected a '{HEADER_START}…' header or "
                      f"'# bmoe_metrics vN', line {number} is {one_line(line)}")


def _preamble_values(where: str, line: str, notes: list[str]) -> dict[str, str]:
    """A preamble line's key=value pairs, kept as text; a numeric value impossible for its key is
    left out (missing) with a note, one no engine prints is refused."""
    values = parse_kv(line[1:])
    for key, text in list(values.items()):
        try:
            reason = problem(key, to_number(text, key))
        except NumberError as e:
            raise located(e, where) from None
        if reason is not None:
            notes.append(note(where, key, text, reason))
            del values[key]
    return values


def _frame(name: str, columns: tuple[str, ...], data: list[tuple[int, str]], notes: list[str]) -> pd.DataFrame:
    """The rows as numbers. pandas parses the block at once; only a column that holds something
    other than plain finite numerals (nan, inf, a blank, text, a huge value) is looked at cell by
    cell, with its raw text, to refuse it or to store values as missing with a note."""
    if not data:
        return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in columns})
    numbers = [number for number, _ in data]
    # no NA guessing and no quoting: "nan", "" and a stray quote stay text for _column to judge
    parsed = pd.read_csv(io.StringIO("\n".join(line for _, line in data)), header=None,
                         names=list(range(len(columns))), quoting=3, na_filter=False, low_memory=False)
    cells: pd.DataFrame | None = None
    frame: dict[str, pd.Series] = {}
    for i, column in enumerate(columns):
        values, shown = parsed[i], parsed[i]
        bad = np.zeros(len(data), dtype=bool)
        if not _plain(values):
            if cells is None:  # split by hand: the field count was checked per line
                cells = pd.DataFrame([line.split(",") for _, line in data], dtype=object)
            shown = cells[i].str.strip()
            values, bad = _column(name, column, shown, numbers)
        bad = bad | bad_in_column(column, values)
        if bad.any():
            at = int(np.argmax(bad))
            more = int(bad.sum()) - 1
            notes.append(note(f"{name}:{numbers[at]}", column, shown.iloc[at],
                              f"{problem(column, float(values.iloc[at])) or 'not a finite number'}"
                              + (f" (and {more} more in the column)" if more else "")))
            values = values.mask(pd.Series(bad, index=values.index))
        frame[column] = values
    return pd.DataFrame(frame)


def _plain(values: pd.Series) -> bool:
    """Plain finite numbers under NUMBER_LIMIT, as pandas read them (no text, nan, inf or huge)."""
    if values.dtype.kind not in "iuf":
        return False
    v = values.to_numpy(dtype=np.float64)
    return bool(np.isfinite(v).all() and (np.abs(v) < NUMBER_LIMIT).all())


def _column(name: str, column: str, raw: pd.Series, numbers: list[int]) -> tuple[pd.Series, np.ndarray]:
    """One column from its raw text: a numeral no engine prints or a non-number is refused (file,
    line, column). Returns the values (blanks and a spelled nan as NaN) and where nan was spelled
    (the engine printed it: the caller notes it; inf is caught by its range check)."""
    long = raw.str.len().to_numpy() > MAX_NUMBER_CHARS
    if long.any():
        at = int(np.argmax(long))
        raise NumberError(f"{name}:{numbers[at]}: {column}={excerpt(raw.iloc[at], 24)} "
                          f"({len(raw.iloc[at])} characters): no engine prints a number this long")
    blank = raw == ""
    values = pd.to_numeric(raw.mask(blank), errors="coerce")
    spelled = raw.str.lower().str.lstrip("+-")
    not_number = (values.isna() & ~blank & (spelled != "nan")).to_numpy()
    if not_number.any():
        at = int(np.argmax(not_number))
        raise ParseError(f"{name}:{numbers[at]}: column {column} holds a non-number {one_line(raw.iloc[at], 40)}")
    as_float = values.to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        huge = np.isfinite(as_float) & (np.abs(as_float) >= NUMBER_LIMIT)
        huge |= np.isinf(as_float) & ~spelled.str.startswith("inf").to_numpy()  # `1e400`: printf writes `inf`
    if huge.any():
        at = int(np.argmax(huge))
        raise NumberError(f"{name}:{numbers[at]}: {column}={excerpt(raw.iloc[at], 24)}: "
                          f"no engine prints a number this large")
    return values, (spelled == "nan").to_numpy()


def _empty(name: str, version: int | None, preamble: dict[str, str], empty: bool,
           cut_line: bool = False) -> MetricsFile:
    return MetricsFile(path=name, version=version, preamble=MappingProxyType(preamble), columns=(),
                       rows=pd.DataFrame(), summary=None, complete=False, empty=empty, cut_line=cut_line)
