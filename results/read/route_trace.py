"""Read bmoe-cli `--route-trace` files (`# route_trace v1`) into numpy arrays.

The engine writes one row per routed (token, slot) of every MoE layer it streams, in the order it
stages them: a comment preamble with the model's shape and one `# layer=` line per streamed layer,
then `turn,phase,step,layer,slot,expert,weight,residency,expert_bytes[,dropped]`
(upstream `core/src/moe/router_hook.cpp`, `flush_pending`). Lenient about what it reads (unknown
preamble keys kept, `dropped` optional, a UTF-8 BOM tolerated), strict about shape: anything that
would make a replay silently wrong is a one-line TraceError naming the file and line. That includes
values no engine writes: a shape of 0 layers or experts, top-k above n_expert, a negative entry
size, a layer or expert id outside the header's shape, a phase, residency or `dropped` flag the
writer never uses, a number of 2^63 or more (docs/decisions/impossible-values.md). A
`# layer=` line with `expert_bytes=0` is the engine's way to list a layer it binds no experts in:
that layer is not streamed, and its rows (if any) are not cache lookups.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd

from engine.errors import BmoeError
from results.errors import safe_message
from results.read.parse_text import excerpt

SUPPORTED_VERSION = 1
REQUIRED_COLUMNS = ("turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes")
OPTIONAL_COLUMNS = ("dropped",)
SHAPE_KEYS = ("n_layer", "n_expert", "n_expert_used")
PHASE_PREFILL, PHASE_DECODE = 0, 1

# Bounds of a trace an engine can write. Real MoE GGUFs have tens of layers and up to a few hundred
# experts; these are generous, and they keep a replay's keys and byte sums inside int64.
MAX_LAYERS = 4096
MAX_EXPERTS = 65536
MAX_EXPERT_BYTES = 1 << 40         # one expert's streamed slices: 1 TiB
_INT_LIMIT = 1 << 63
_COUNT_LIMIT = 1 << 62             # turns and steps (compared as float64, where 2^62 is exact)

_MAGIC_RE = re.compile(r"^# route_trace v([0-9]+)\s*$")
_FIELDS_RE = re.compile(r"Expected ([0-9]+) fields in line ([0-9]+), saw ([0-9]+)")


class TraceError(BmoeError):
    """A file is not a usable route trace (wrong format, unknown version, truncated, missing columns,
    impossible values). The message is one terminal-safe line."""

    def __init__(self, message: str = "") -> None:
        super().__init__(safe_message(message))


@dataclass(frozen=True, eq=False)
class TraceRows:
    """One entry per trace row, in file order (= the order the engine staged them).

    Arrays are read-only so the frozen record really is immutable. `dropped` is all zeros when the
    trace predates the column.
    """

    turn: np.ndarray
    phase: np.ndarray
    step: np.ndarray
    layer: np.ndarray
    slot: np.ndarray
    expert: np.ndarray
    weight: np.ndarray
    residency: np.ndarray
    expert_bytes: np.ndarray
    dropped: np.ndarray

    def __post_init__(self) -> None:
        lengths = {len(getattr(self, name)) for name in self.__dataclass_fields__}
        if len(lengths) != 1:
            raise ValueError(f"route-trace columns differ in length: {sorted(lengths)}")
        for name in self.__dataclass_fields__:
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return len(self.turn)


@dataclass(frozen=True, eq=False)
class RouteTrace:
    """A parsed route trace: the preamble's shape, per-layer entry bytes, and the rows."""

    path: str
    version: int
    model: str
    arch: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    # streamed layer -> bytes of one expert's streamed slices (gate+up+down), i.e. one cache entry;
    # a `# layer=` line with expert_bytes=0 (no experts bound there) is not a streamed layer
    expert_bytes_by_layer: Mapping[int, int]
    dense_bytes_by_layer: Mapping[int, int]
    # every preamble key=value outside the `# layer=` lines, unknown ones included
    meta: Mapping[str, str]
    rows: TraceRows
    has_dropped_column: bool

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.expert_bytes_by_layer))

    @property
    def cycle_bytes(self) -> int:
        """Worst-case token cycle: every streamed layer's entry bytes x min(top-k, n_expert)."""
        k = min(self.n_expert_used, self.n_expert)
        return sum(self.expert_bytes_by_layer.values()) * k


def _key_values(text: str) -> dict[str, str]:
    """'model=a b.gguf arch=x' -> {'model': 'a b.gguf', 'arch': 'x'}: a token without '=' continues
    the previous value, so a model path with spaces survives."""
    out: dict[str, str] = {}
    last = None
    for token in text.split():
        key, eq, value = token.partition("=")
        if eq and key:
            out[key] = value
            last = key
        elif last is not None:
            out[last] += " " + token
    return out


def _read_preamble(path: str, f) -> tuple[int, list[tuple[int, dict[str, str]]], list[str], int]:
    """Consume the comment preamble and the header line; returns (version, (line number, key=value
    dict) of each comment line, header columns, lines consumed)."""
    head = f.readline(256)  # bounded: the file may be a multi-GiB binary with no newline
    if b"\0" in head:
        raise TraceError(f"{path}: not a route trace (binary data, expected '# route_trace v1')")
    first = head.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
    m = _MAGIC_RE.match(first)
    if not m:
        if first.startswith("# route_trace"):
            raise TraceError(f"{path}: unreadable route-trace version line {first[:60]!r}")
        raise TraceError(f"{path}: not a route trace (first line is {first[:60]!r}, expected '# route_trace v1')")
    if len(m[1]) > 9:
        raise TraceError(f"{path}: unreadable route-trace version line {first[:60]!r}")
    version = int(m[1])
    if version != SUPPORTED_VERSION:
        raise TraceError(f"{path}: route_trace v{version} is not supported (bmoe-fleet reads v{SUPPORTED_VERSION})")
    comments: list[tuple[int, dict[str, str]]] = []      # (line number, its key=value pairs)
    n_lines = 1
    while True:
        raw = f.readline()
        if not raw:
            raise TraceError(f"{path}: truncated route trace: no CSV header after the preamble")
        n_lines += 1
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith("#"):
            comments.append((n_lines, _key_values(line[1:])))
            continue
        return version, comments, [c.strip() for c in line.split(",")], n_lines


def _int_value(path: str, kv: Mapping[str, str], key: str, where: str, low: int, high: int,
               default: int | None = None) -> int:
    """kv[key] as an integer in [low, high]; a one-line TraceError naming `where` otherwise."""
    if key not in kv:
        if default is not None:
            return default
        raise TraceError(f"{path}: {where} has no {key}=")
    text = kv[key]
    if not re.fullmatch(r"-?[0-9]{1,30}", text):
        raise TraceError(f"{path}: {where} has a non-integer {key}={excerpt(text, 40)!r}")
    value = int(text)
    if not low <= value <= high:
        raise TraceError(f"{path}: {where}: {key}={excerpt(text, 40)} is impossible (must be {low}..{high})")
    return value


def read_route_trace(path: str | Path) -> RouteTrace:
    """Parse a route trace file; raises TraceError with a one-line reason if it is not usable."""
    path = str(path)
    with contextlib.ExitStack() as stack:
        try:
            f = stack.enter_context(open(path, "rb"))
        except OSError as e:                  # only the open: a read error below is the parser's
            raise TraceError(f"{path}: cannot open route trace ({e.strerror or e})") from None
        version, comments, columns, n_consumed = _read_preamble(path, f)
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise TraceError(f"{path}: route trace header lacks column(s) {', '.join(missing)}")
        if len(set(columns)) != len(columns):
            raise TraceError(f"{path}: route trace header repeats a column: {excerpt(','.join(columns), 200)}")
        try:
            with warnings.catch_warnings():
                # rows wider than the header from the first one on: pandas would drop fields and warn
                warnings.simplefilter("error", pd.errors.ParserWarning)
                # no NA guessing and no quoting: a column of whole numbers under 2^63 reads as int64,
                # and anything else ("", "nan", 2^64, a stray quote) stays visible for _rows to refuse
                frame = pd.read_csv(f, header=None, names=columns, index_col=False, skip_blank_lines=False,
                                    quoting=3, na_filter=False, low_memory=False)
        except pd.errors.ParserWarning:
            raise TraceError(f"{path}: malformed route trace, line {n_consumed + 1}: rows have more fields than "
                             f"the header's {len(columns)}") from None
        except pd.errors.EmptyDataError:
            frame = pd.DataFrame(columns=columns)
        except pd.errors.ParserError as e:
            m = _FIELDS_RE.search(str(e))
            where = f"line {int(m[2]) + n_consumed}: row has {m[3]} fields, header has {m[1]}" if m else str(e).strip()
            raise TraceError(f"{path}: malformed route trace, {where}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{path}: route trace rows are not text") from None

    meta: dict[str, str] = {}
    layer_lines: list[tuple[int, dict[str, str]]] = []
    for number, kv in comments:
        if "layer" in kv:
            layer_lines.append((number, kv))
        else:
            meta.update(kv)
    where = "the '# model=' preamble line"
    n_layer = _int_value(path, meta, "n_layer", where, 1, MAX_LAYERS)
    n_expert = _int_value(path, meta, "n_expert", where, 1, MAX_EXPERTS)
    n_expert_used = _int_value(path, meta, "n_expert_used", where, 1, n_expert)
    expert_bytes: dict[int, int] = {}
    dense_bytes: dict[int, int] = {}
    for number, kv in layer_lines:
        at = f"line {number} ('# layer=' line)"
        il = _int_value(path, kv, "layer", at, 0, n_layer - 1)
        if il in dense_bytes:
            raise TraceError(f"{path}: {at}: layer {il} is described twice")
        entry_bytes = _int_value(path, kv, "expert_bytes", at, 0, MAX_EXPERT_BYTES)
        dense_bytes[il] = _int_value(path, kv, "dense_bytes", at, 0, _INT_LIMIT - 1, default=0)
        if entry_bytes:
            expert_bytes[il] = entry_bytes
        # expert_bytes=0: the engine binds no experts there (a dense layer): not streamed, never looked up

    rows = _rows(path, frame, n_consumed, n_layer, n_expert)
    return RouteTrace(
        path=path, version=version, model=meta.get("model", ""), arch=meta.get("arch", ""),
        expert_bytes_by_layer=MappingProxyType(expert_bytes), dense_bytes_by_layer=MappingProxyType(dense_bytes),
        meta=MappingProxyType(meta), rows=rows, has_dropped_column="dropped" in columns, n_layer=n_layer,
        n_expert=n_expert, n_expert_used=n_expert_used)


def _column_bounds(n_layer: int, n_expert: int) -> dict[str, tuple[int, int]]:
    """What each integer column can hold ([low, high]), by the writer's own rules."""
    return {"turn": (0, _COUNT_LIMIT), "phase": (PHASE_PREFILL, PHASE_DECODE), "step": (0, _COUNT_LIMIT),
            "layer": (0, n_layer - 1), "slot": (0, n_expert - 1), "expert": (0, n_expert - 1),
            "residency": (0, 2), "expert_bytes": (0, MAX_EXPERT_BYTES), "dropped": (0, 1)}


def _exact_integers(path: str, name: str, column: pd.Series, n_consumed: int) -> np.ndarray:
    """A column pandas did not read as int64: the first value that is no whole number is refused
    with its line; whole numbers past int64 come back as Python ints (object array), for the range
    check to refuse."""
    raw = column.astype(str).str.strip()
    ok = raw.str.fullmatch(r"-?[0-9]+").to_numpy(dtype=bool)
    if not ok.all():
        bad = int(np.argmax(~ok))
        text = raw.iloc[bad]
        what = f"no {name} value" if not text else f"bad {name} value {excerpt(text, 40)!r}"
        raise TraceError(f"{path}: truncated or malformed route-trace row at line {n_consumed + 1 + bad} ({what})")
    long = (raw.str.len() > 20).to_numpy(dtype=bool)  # past int64 (and int() refuses 4,300 digits)
    if long.any():
        bad = int(np.argmax(long))
        raise TraceError(f"{path}: impossible route-trace row at line {n_consumed + 1 + bad}: "
                         f"{name}={excerpt(raw.iloc[bad], 24)} ({len(raw.iloc[bad])} digits)")
    return np.array([int(t) for t in raw], dtype=object)


def _rows(path: str, frame: pd.DataFrame, n_consumed: int, n_layer: int, n_expert: int) -> TraceRows:
    """Columns to typed arrays. A short row (the engine killed mid-write) shows up as a missing
    value in an integer column; the first one is reported with its file line, as is the first
    value outside its column's range."""
    int_columns = [c for c in REQUIRED_COLUMNS if c != "weight"] + [c for c in OPTIONAL_COLUMNS if c in frame]
    bounds = _column_bounds(n_layer, n_expert)
    arrays: dict[str, np.ndarray] = {}
    for name in int_columns:
        column = frame[name]
        values = column.to_numpy() if column.dtype == np.int64 else _exact_integers(path, name, column, n_consumed)
        low, high = bounds[name]
        outside = (values < low) | (values > high)
        if outside.any():
            bad = int(np.argmax(outside))
            shape = " for the header's shape" if name in ("layer", "slot", "expert") else ""
            raise TraceError(f"{path}: impossible route-trace row at line {n_consumed + 1 + bad}: "
                             f"{name}={values[bad]} (must be {low}..{high}{shape})")
        arrays[name] = values.astype(np.int64)
    weight = pd.to_numeric(frame["weight"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(over="ignore"):  # a weight past float32 is inf: weights are kept, never replayed
        arrays["weight"] = weight.astype(np.float32)
    if "dropped" not in arrays:
        arrays["dropped"] = np.zeros(len(frame), dtype=np.int64)
    return TraceRows(**arrays)
