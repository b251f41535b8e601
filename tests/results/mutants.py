"""Damaged copies of real upstream files, and the results readers they are fed to.

Shared by the property-based fuzz tests (tests/results/test_fuzz_readers.py, hypothesis draws the
choices) and the fuzz benchmark (benchmarks/fuzz_readers.py, random.Random draws them): every
mutation takes `pick(n)`, a choice in 0..n-1, so both drive the same code.

A mutant is a fixture from tests/fixtures/upstream (and the hand-made captures of the newer
releases' lines and of sessions, tests/fixtures/console and tests/fixtures/sessions) with one to
three operations applied: a byte flip, a truncation, a number replaced by a huge one (400 and
5,000 digits, 2^63, 2^64, 1e400), by nan/inf, by its negative or by an edge value, by POISON spelled
in digits no engine prints (other scripts', fullwidth, with `_`: int() reads them), by a JSON
`true`/`false`, a part made larger than its whole (`50/10`, a trailer's `experts_dropped` over its
`experts_routed`), a column duplicated, dropped or swapped, binary junk or an escape sequence
inserted, a line duplicated, dropped or glued to the next, CRLF or a BOM.

Each Reader says what to read and what a parsed result must satisfy (strict JSON, every number
possible for its key, no part over its whole, no bool where a number goes, and never POISON: a
numeral in other digits is refused or not read, never read as the number Python makes of it).
"Parsed, or one clean error": a reader may refuse a mutant only with the project's own error type
(BmoeError) and a one-line, terminal-safe message that names the mutant's file, and its line when
the refusal is a number's (NumberError).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from engine.errors import BmoeError
from harness.importer import import_runs
from results.errors import MESSAGE_CHARS
from results.formats import emit
from results.read.parse import (
    read_console,
    read_console_runs,
    read_driver_log,
    read_metrics_csv,
    read_sidecar,
    read_state,
)
from results.read.parse_session import find_sessions, read_gap_log, session_turns
from results.read.parse_text import NumberError, to_number
from results.read.parse_values import PARTS, bad_in_column, inconsistent, problem
from results.read.route_trace import read_route_trace
from results.read.table import build_table, render_table
from results.replay.replay import replay_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
UPSTREAM = FIXTURES / "upstream"
SESSIONS = FIXTURES / "sessions"
CONSOLE = FIXTURES / "console"
Pick = Callable[[int], int]

_NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?")
_HUGE = (b"9" * 400, b"1" * 5000, str(2 ** 64).encode(), str(2 ** 63).encode(), b"1e400", b"-" + b"9" * 30,
         b"18446744073709551615", b"4294967296")
_NON_FINITE = (b"nan", b"-nan", b"inf", b"-inf", b"NaN", b"Infinity")
_EDGE = (b"101", b"-2", b"-1", b"0", b"999999", b"1.5", b"-0.5", b"65536")
# a number Python reads from each of these spellings and no engine prints: never to be stored
POISON = 7654321
_FOREIGN = tuple(text.encode() for text in ("٧٦٥٤٣٢١", "７６５４３２１", "७६५४३२१", "۷۶۵۴۳۲۱", "7_654_321", "𝟕𝟔𝟓𝟒𝟑𝟐𝟏",
                                            "76_54321.0", "٧٦٥٤٣٢١.٠"))
_BOOLS = (b"true", b"false")
_SLASH_RE = re.compile(rb"([0-9]+)/([0-9]+)")
_JUNK = (b"\x00", b"\x1b]0;pwned\x07", b"\x1b[2J", b"\xff\xfe", b"\r", b"\n", b",", b"=", b"#", b"\"", b"\xe2\x80\xae",
         b"====== X ======\n", b"# summary tokens=1\n", bytes(range(256)))


# ── operations ──────────────────────────────────────────────────────────────────────────────────


def flip_byte(data: bytes, pick: Pick) -> bytes:
    if not data:
        return data
    i = pick(len(data))
    return data[:i] + bytes([data[i] ^ (pick(255) + 1)]) + data[i + 1:]


def truncate(data: bytes, pick: Pick) -> bytes:
    return data[:pick(len(data) + 1)]


def _replace_number(data: bytes, pick: Pick, choices: Sequence[bytes] | None) -> bytes:
    """The first number at or after a random position (wrapping around) replaced."""
    start = pick(len(data) + 1)
    m = _NUMBER_RE.search(data, start) or _NUMBER_RE.search(data)
    if m is None:
        return data
    new = choices[pick(len(choices))] if choices is not None else b"-" + m[0].lstrip(b"-")
    return data[:m.start()] + new + data[m.end():]


def huge_number(data: bytes, pick: Pick) -> bytes:
    return _replace_number(data, pick, _HUGE)


def non_finite(data: bytes, pick: Pick) -> bytes:
    return _replace_number(data, pick, _NON_FINITE)


def negate(data: bytes, pick: Pick) -> bytes:
    return _replace_number(data, pick, None)


def edge_value(data: bytes, pick: Pick) -> bytes:
    return _replace_number(data, pick, _EDGE)


def foreign_digits(data: bytes, pick: Pick) -> bytes:
    return _replace_number(data, pick, _FOREIGN)


def boolean(data: bytes, pick: Pick) -> bytes:
    return _replace_number(data, pick, _BOOLS)


def part_over_whole(data: bytes, pick: Pick) -> bytes:
    """A part made larger than its whole: the A of an `A/B` line (`moe-substitute: 50/10`), or a
    part key of parse_values.PARTS (`experts_dropped=`, `"spec_accepted":`) set above its whole's."""
    spots = [(m.start(1), m.end(1), int(m[2])) for m in _SLASH_RE.finditer(data) if len(m[2]) < 30]
    for part, whole in PARTS:
        found = [re.search(rb'(?<![\w])"?' + key.encode() + rb'"?[=:]([0-9]{1,29})\b', data) for key in (part, whole)]
        if found[0] and found[1]:
            spots.append((found[0].start(1), found[0].end(1), int(found[1][1])))
    if not spots:
        return data
    start, end, whole_value = spots[pick(len(spots))]
    return data[:start] + str(whole_value + 1 + pick(1000)).encode() + data[end:]


def _csv_lines(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.count(b",") >= 2 and not line.startswith(b"#")]


def column_change(data: bytes, pick: Pick) -> bytes:
    """Duplicate, drop or swap a column: in the header only (it no longer matches the rows) or in
    every comma-separated line (a consistent file with a strange header)."""
    lines = data.split(b"\n")
    rows = _csv_lines(lines)
    if not rows:
        return data
    header = rows[0]
    targets = [header] if pick(2) == 0 else rows
    width = lines[header].count(b",") + 1
    col, other, kind = pick(width), pick(width), pick(3)
    for i in targets:
        fields = lines[i].split(b",")
        if col >= len(fields) or other >= len(fields):
            continue
        if kind == 0:
            fields.insert(col, fields[col])
        elif kind == 1:
            del fields[col]
        else:
            fields[col], fields[other] = fields[other], fields[col]
        lines[i] = b",".join(fields)
    return b"\n".join(lines)


def junk(data: bytes, pick: Pick) -> bytes:
    i = pick(len(data) + 1)
    return data[:i] + _JUNK[pick(len(_JUNK))] + data[i:]


def line_change(data: bytes, pick: Pick) -> bytes:
    """Duplicate a line, drop it, or glue it to the next (a lost newline)."""
    lines = data.split(b"\n")
    i, kind = pick(len(lines)), pick(3)
    if kind == 0:
        lines.insert(i, lines[i])
    elif kind == 1:
        del lines[i]
    elif i + 1 < len(lines):
        lines[i:i + 2] = [lines[i] + lines[i + 1]]
    return b"\n".join(lines)


def encoding_change(data: bytes, pick: Pick) -> bytes:
    return b"\xef\xbb\xbf" + data if pick(2) == 0 else data.replace(b"\n", b"\r\n")


OPERATIONS = (flip_byte, truncate, huge_number, non_finite, negate, edge_value, column_change, junk, line_change,
              encoding_change, foreign_digits, boolean, part_over_whole)
# the operations on a number's grammar alone (tests/results/test_fuzz_readers.py runs them apart too)
NUMBER_OPERATIONS = (huge_number, foreign_digits, boolean, part_over_whole, negate)


def mutate(data: bytes, pick: Pick, n_ops: int, operations: Sequence[Callable[[bytes, Pick], bytes]] = OPERATIONS
           ) -> bytes:
    for _ in range(n_ops):
        data = operations[pick(len(operations))](data, pick)
    return data


def poisoned(mutant: bytes) -> bool:
    """The mutant spells POISON in digits no engine prints."""
    return any(spelling in mutant for spelling in _FOREIGN)


# ── what a parsed result must satisfy ───────────────────────────────────────────────────────────


def strict_json(obj: object) -> None:
    json.dumps(obj, allow_nan=False, default=str)


def plausible(values: Mapping[str, object]) -> None:
    """Every number possible for its key (results.read.parse_values: no bool where a number goes),
    no part over its whole, nested mappings included."""
    for key, value in values.items():
        if isinstance(value, Mapping):
            plausible(value)
        else:
            assert problem(key, value) is None, (key, value)
    assert inconsistent(values, "", []) == [], dict(values)


def numbers_in(obj: object) -> list[float]:
    """Every number a parsed result holds: records, mappings, sequences, frames and arrays."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, bytes)):
        return []
    if isinstance(obj, (int, float, np.integer, np.floating)):
        return [float(obj)]
    if isinstance(obj, pd.DataFrame):
        return [x for column in obj.columns for x in numbers_in(obj[column])]
    if isinstance(obj, (pd.Series, np.ndarray)):
        values = pd.to_numeric(pd.Series(np.asarray(obj).ravel()), errors="coerce").to_numpy(dtype=np.float64)
        return [float(x) for x in values[~np.isnan(values)]]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [x for f in dataclasses.fields(obj) for x in numbers_in(getattr(obj, f.name))]
    if isinstance(obj, Mapping):
        return [x for v in obj.values() for x in numbers_in(v)]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [x for v in obj for x in numbers_in(v)]
    return []


def not_poisoned(obj: object) -> None:
    assert float(POISON) not in numbers_in(obj), f"{POISON}, spelled in other digits, was read as a number"


def _check_metrics(m) -> None:
    plausible({k: to_number(v) for k, v in m.preamble.items()})
    for summary in m.summaries:
        strict_json(dict(summary))
        plausible(summary)
    for column in m.columns:
        assert not bad_in_column(column, m.rows[column]).any(), column


def _check_console(runs) -> None:
    for run in runs if isinstance(runs, list) else [runs]:
        for f in dataclasses.fields(run):
            value = getattr(run, f.name)
            if dataclasses.is_dataclass(value):
                plausible({g.name: getattr(value, g.name) for g in dataclasses.fields(value)})
            elif isinstance(value, (int, float)):
                plausible({f.name: value})
        for mapping in (run.pressure or {}, run.entry_state or {}, *run.values.values()):
            strict_json(dict(mapping))
            plausible(mapping)


def _read_sessions(path: Path):
    """The session captures of a folder holding this one file (find_sessions, as the importer)."""
    return find_sessions([path])[0]


def _check_sessions(captures) -> None:
    for capture in captures:
        for mapping in (*capture.dones, *capture.errors, capture.ready or {}):
            strict_json(dict(mapping))
            plausible(mapping)
        if capture.gap is not None:
            _check_gap(capture.gap)
        if capture.console is not None:
            _check_console(capture.console)
        for turn in session_turns(capture):
            strict_json(turn)
            plausible({k: v for k, v in turn.items() if k != "bmoe_done"})


def _check_gap(gap) -> None:
    assert math.isfinite(gap.idle_s) and gap.idle_s >= 0
    for sample in gap.samples:
        plausible(dataclasses.asdict(sample))


def _check_mapping(values) -> None:
    strict_json(values)
    plausible(values)


def _check_trace(trace) -> None:
    assert trace.n_layer >= 1 and trace.n_expert >= 1 and 1 <= trace.n_expert_used <= trace.n_expert
    assert all(0 <= il < trace.n_layer and b > 0 for il, b in trace.expert_bytes_by_layer.items())
    r = trace.rows
    if len(r):
        assert r.layer.min() >= 0 and r.layer.max() < trace.n_layer
        assert r.expert.min() >= 0 and r.expert.max() < trace.n_expert


def _replay(path: Path):
    trace = read_route_trace(path)
    cycle_mib = trace.cycle_bytes / (1 << 20)
    return replay_trace(trace, [0, 1, cycle_mib, 2 * cycle_mib, 1e30], ("lru", "lfu"))


def _check_replay(replay) -> None:
    for p in replay.points:
        assert 0 <= p.hit_pct_cum <= 100 and 0 <= p.hit_pct_decode <= 100 and math.isfinite(p.read_mib)


# ── the importer on a folder ────────────────────────────────────────────────────────────────────


def import_folder(files: Sequence[Path], mutant_index: int, mutant: bytes, work: Path) -> Path:
    """Import a folder of these fixture files, file `mutant_index` replaced by `mutant`, into
    `work`/out; returns that campaign directory."""
    src = work / "src"
    src.mkdir()
    for i, f in enumerate(files):
        (src / f.name).write_bytes(mutant if i == mutant_index else f.read_bytes())
    import_runs([src], work / "out")
    return work / "out"


def check_import(out: Path, poison: bool = False) -> None:
    """Every JSON file written is strict JSON, every stored number possible for its key, and the
    run table builds from the directory (table, report and recommend all start from its rows);
    with `poison`, POISON is in neither."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in stored JSON")

    for path in out.rglob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
        if path.name == "run.json":
            for key in ("summary", "pressure", "entry_state", "exit_state", "result", "config"):
                plausible(data.get(key) or {})
            for turn in data.get("turns") or ():
                plausible(turn)
        if poison:
            not_poisoned(data)
    ledger = out / "ledger.jsonl"
    if not ledger.exists():                # the folder held no run (a capture cut to nothing)
        return
    for line in ledger.read_text().splitlines():
        json.loads(line, parse_constant=refuse)
    table = build_table([out])
    if poison:
        not_poisoned(table)
    emit(render_table(table, "csv"), str(out.parent / "runs.csv"))


# ── readers ─────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Reader:
    name: str
    seeds: tuple[Path, ...]
    read: Callable[[Path], object]          # raises BmoeError to refuse
    check: Callable[[object], None]         # what a parsed result must satisfy


def _files(*patterns: str) -> tuple[Path, ...]:
    found = sorted({p for pattern in patterns for p in UPSTREAM.glob(pattern)})
    assert found, patterns
    return tuple(found)


_METRICS_CSVS = tuple(p for p in _files("*/*.csv", "*/*/*.csv", "2026-07-15-route-trace/gptoss.metrics")
                      if not p.name.endswith(".route.csv"))
_SIDECARS = tuple(p for p in _files("*/*.metrics") if p.parent.name != "2026-07-15-route-trace")
_NEXT_RUN = (CONSOLE / "next-run.out", CONSOLE / "next-run.err")    # the newer releases' lines
_SESSION_FILES = (SESSIONS / "jsonl" / "turns-a.jsonl", SESSIONS / "report" / "two-tags.txt",
                  SESSIONS / "report" / "short.txt", SESSIONS / "engine" / "rewarm-ab-x.out")
_GAP_LOGS = tuple(sorted(SESSIONS.glob("*/*.mem")))

READERS = (
    Reader("metrics-csv", _METRICS_CSVS, read_metrics_csv, _check_metrics),
    Reader("sidecar", _SIDECARS, read_sidecar, _check_mapping),
    Reader("console", _files("*/*.log", "*/*.out", "*/*.err") + _NEXT_RUN, read_console, _check_console),
    Reader("console-runs", _files("2026-07-14/gptoss-matrix.out", "2026-07-17/driver-*.log"), read_console_runs,
           _check_console),
    Reader("driver-log", _files("2026-07-17/driver-*.log"), read_driver_log, _check_mapping),
    Reader("state", _files("*/*.state"), read_state, _check_mapping),
    Reader("route-trace", _files("*/*.route.csv"), read_route_trace, _check_trace),
    Reader("replay", _files("*/*.route.csv"), _replay, _check_replay),
    Reader("session", _SESSION_FILES, _read_sessions, _check_sessions),
    Reader("gap-log", _GAP_LOGS, read_gap_log, _check_gap),
)

# folders for the importer: one engine run's files each (the mutant replaces one of them)
IMPORT_SEEDS = (
    _files("2026-07-12/qwen_c2000_l2.*"),
    _files("2026-07-13/gemma_auto_ov.*"),
    _files("2026-07-17/gpt_c2000_l8_k2.*", "2026-07-17/driver-lanes.log"),
    _files("2026-07-15-route-trace/gptoss.*"),
    _files("host-v2-0.19.0/tiny_auto.*", "host-v2-0.19.0/bad.*"),
    _NEXT_RUN,
    (SESSIONS / "jsonl" / "turns-a.jsonl", SESSIONS / "jsonl" / "idle-a.mem"),
    (SESSIONS / "engine" / "rewarm-ab-x.out", SESSIONS / "engine" / "rewarm-ab-x.mem"),
    (SESSIONS / "report" / "two-tags.txt",),
)


def check_refusal(error: BaseException, name: str = "") -> None:
    """A clean refusal: the project's own error type, one terminal-safe line of bounded length,
    naming the file `name` (and its line, for a number's refusal)."""
    assert isinstance(error, BmoeError), f"{type(error).__name__}: {error}"
    message = str(error)
    assert message and "\n" not in message and len(message) <= MESSAGE_CHARS + 1, message
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", message), message
    if name:
        assert name in message, f"the refusal names no file: {message}"
        if isinstance(error, NumberError):
            assert re.search(re.escape(name) + r":[0-9]+", message), f"the refusal names no line: {message}"


def read_mutant(reader: Reader, seed: Path, mutant: bytes, folder: Path) -> tuple[str, str]:
    """Feed one mutant to a reader: ("accepted", "") or ("refused", message); anything else raises."""
    path = folder / seed.name
    path.write_bytes(mutant)
    try:
        result = reader.read(path)
    except BmoeError as e:
        check_refusal(e, seed.name)
        return "refused", str(e)
    reader.check(result)
    if poisoned(mutant):
        not_poisoned(result)
    return "accepted", ""


def import_mutant(files: Sequence[Path], index: int, mutant: bytes) -> tuple[str, str]:
    """The importer on a folder holding one mutant: ("accepted", "") or ("refused", message). A
    refused import must have written nothing."""
    work = Path(tempfile.mkdtemp(prefix="fuzz-import-"))
    try:
        try:
            out = import_folder(files, index, mutant, work)
        except BmoeError as e:
            check_refusal(e, files[index].name)
            assert not (work / "out").exists(), "a refused import wrote its output folder"
            return "refused", str(e)
        check_import(out, poisoned(mutant))
        return "accepted", ""
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["IMPORT_SEEDS", "NUMBER_OPERATIONS", "OPERATIONS", "READERS", "Reader", "check_refusal", "import_mutant",
           "mutate", "read_mutant"]
