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
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np
import pandas as pd

from results.parse_text import ParseError, one_line, parse_kv, read_lines, to_number

HEADER_START = "step,"
SUMMARY_PREFIX = "# summary"
# every version has these; anything after them is optional
REQUIRED_COLUMNS = ("step", "steps", "wall_ms", "io_ms", "compute_ms", "read_bytes", "cache_hit_pct")
# columns where the engine writes -1 for "not measured" (no cache, or a platform without the probe)
NOT_MEASURED = -1
SENTINEL_COLUMNS = ("cache_hit_pct", "dense_resident_frac", "resident_frac")

_MAGIC_RE = re.compile(r"#\s*bmoe_metrics\s+v(\d+)\s*")
_ROUTE_TRACE_RE = re.compile(r"#\s*route_trace\s+v\d+")

SummaryValue = int | float | str


@dataclass(frozen=True, eq=False)
class MetricsFile:
    """One metrics CSV. `rows` holds the values as written (-1 sentinels included: see measured()).

    version: 0 = no preamble (July 2026 builds), N = `# bmoe_metrics vN`, None = empty file.
    summary: the last `# summary` trailer (None if the run died first); `summaries` has one per
    generation, in file order (a `--session` run writes one per turn).
    complete: the file ends with a summary trailer, i.e. the engine finished writing it.
    cut_line: the last line had no newline (the process died mid-write); it was left out.
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

    def measured(self, column: str) -> pd.Series:
        """The column with the engine's -1 "not measured" turned into NaN where -1 means that."""
        values = self.rows[column]
        return values.where(values != NOT_MEASURED) if column in SENTINEL_COLUMNS else values


def read_metrics_csv(path: str | Path) -> MetricsFile:
    lines, ends_with_newline = read_lines(path)
    name = str(path)
    if not any(line.strip() for line in lines):
        return _empty(name, version=None, preamble={}, empty=True)
    # a last line without its newline was cut by a kill: its last value may be cut too, so drop it
    cut = None if ends_with_newline else lines.pop()

    # the header is the first line that is not a comment: columns are read by name, in any order
    header_at = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), None)
    head = lines if header_at is None else lines[:header_at]
    version = _version(name, head)
    preamble: dict[str, str] = {}
    for line in head:
        if not _MAGIC_RE.fullmatch(line):
            preamble.update(parse_kv(line[1:]))
    if header_at is None:
        header_or_comment = cut is None or cut.startswith(("#", HEADER_START)) or HEADER_START.startswith(cut)
        if not header_or_comment:
            raise _not_a_csv(name, len(lines) + 1, cut)
        # killed after the preamble, before the header was whole: no rows yet
        return _empty(name, version=version, preamble=preamble, empty=False, cut_line=cut is not None)

    columns = tuple(c.strip() for c in lines[header_at].split(","))
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing and len(columns) > 1:
        raise ParseError(f"{name}: not a bmoe metrics CSV: header lacks {', '.join(missing)}")
    if missing:
        raise _not_a_csv(name, header_at + 1, lines[header_at])

    data: list[str] = []
    summaries: list[Mapping[str, SummaryValue]] = []
    for number, line in enumerate(lines[header_at + 1:], start=header_at + 2):
        if line.startswith(SUMMARY_PREFIX):
            values = {k: to_number(v) for k, v in parse_kv(line[len(SUMMARY_PREFIX):]).items()}
            summaries.append(MappingProxyType(values))
        elif line.startswith("#"):
            preamble.update(parse_kv(line[1:]))
        elif line.strip():
            if line.count(",") + 1 != len(columns):
                raise ParseError(f"{name}:{number}: {line.count(',') + 1} fields, the header has {len(columns)}")
            data.append(line)
    last = next((line for line in reversed(lines) if line.strip()), "")
    return MetricsFile(
        path=name, version=version, preamble=MappingProxyType(preamble), columns=columns,
        rows=_frame(name, columns, data), summary=summaries[-1] if summaries else None,
        complete=cut is None and last.startswith(SUMMARY_PREFIX), cut_line=cut is not None,
        summaries=tuple(summaries))


def looks_like_metrics_csv(lines: list[str]) -> bool:
    """True when the first non-blank line opens a metrics CSV (used to sniff `.metrics` files,
    which upstream also used as a name for per-token CSVs)."""
    first = next((line for line in lines if line.strip()), "")
    return first.startswith(HEADER_START) or bool(_MAGIC_RE.fullmatch(first))


def _version(name: str, head: list[str]) -> int:
    """The `# bmoe_metrics vN` number from the comment lines above the header; 0 without one."""
    first = next((line for line in head if line.strip()), "")
    if magic := _MAGIC_RE.fullmatch(first):
        return int(magic.group(1))
    if _ROUTE_TRACE_RE.match(first):
        raise ParseError(f"{name}: is a route trace, not a metrics CSV")
    return 0


def _not_a_csv(name: str, number: int, line: str) -> ParseError:
    return ParseError(f"{name}: not a bmoe metrics CSV: expected a '{HEADER_START}…' header or "
                      f"'# bmoe_metrics vN', line {number} is {one_line(line)}")


def _frame(name: str, columns: tuple[str, ...], data: list[str]) -> pd.DataFrame:
    if not data:
        return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in columns})
    frame = pd.read_csv(io.StringIO("\n".join(data)), header=None, names=list(columns), dtype=str)
    for column in columns:
        try:
            frame[column] = pd.to_numeric(frame[column])
        except (ValueError, TypeError) as exc:
            raise ParseError(f"{name}: column {column} holds a non-number ({exc})") from exc
    return frame


def _empty(name: str, version: int | None, preamble: dict[str, str], empty: bool,
           cut_line: bool = False) -> MetricsFile:
    return MetricsFile(path=name, version=version, preamble=MappingProxyType(preamble), columns=(),
                       rows=pd.DataFrame(), summary=None, complete=False, empty=empty, cut_line=cut_line)
