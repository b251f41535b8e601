"""Read bmoe-cli `--route-trace` files (`# route_trace v1`) into numpy arrays.

The engine writes one row per routed (token, slot) of every MoE layer it streams, in the order it
stages them: a comment preamble with the model's shape and one `# layer=` line per streamed layer,
then `turn,phase,step,layer,slot,expert,weight,residency,expert_bytes[,dropped]`
(upstream `core/src/moe/router_hook.cpp`, `flush_pending`). Lenient about what it reads (unknown
preamble keys kept, `dropped` optional, a UTF-8 BOM tolerated), strict about shape: anything that
would make a replay silently wrong is a one-line TraceError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np
import pandas as pd

from engine.errors import BmoeError

SUPPORTED_VERSION = 1
REQUIRED_COLUMNS = ("turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes")
OPTIONAL_COLUMNS = ("dropped",)
SHAPE_KEYS = ("n_layer", "n_expert", "n_expert_used")
PHASE_PREFILL, PHASE_DECODE = 0, 1

_MAGIC_RE = re.compile(r"^# route_trace v(\d+)\s*$")
_FIELDS_RE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


class TraceError(BmoeError):
    """A file is not a usable route trace (wrong format, unknown version, truncated, missing columns)."""


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
    # layer -> bytes of one expert's streamed slices (gate+up+down), i.e. one cache entry
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


def _read_preamble(path: str, f) -> tuple[int, list[dict[str, str]], list[str], int]:
    """Consume the comment preamble and the header line; returns (version, key=value dicts of the
    comment lines, header columns, lines consumed)."""
    head = f.readline(256)  # bounded: the file may be a multi-GiB binary with no newline
    if b"\0" in head:
        raise TraceError(f"{path}: not a route trace (binary data, expected '# route_trace v1')")
    first = head.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
    m = _MAGIC_RE.match(first)
    if not m:
        if first.startswith("# route_trace"):
            raise TraceError(f"{path}: unreadable route-trace version line {first[:60]!r}")
        raise TraceError(f"{path}: not a route trace (first line is {first[:60]!r}, expected '# route_trace v1')")
    version = int(m[1])
    if version != SUPPORTED_VERSION:
        raise TraceError(f"{path}: route_trace v{version} is not supported (bmoe-fleet reads v{SUPPORTED_VERSION})")
    comments: list[dict[str, str]] = []
    n_lines = 1
    while True:
        raw = f.readline()
        if not raw:
            raise TraceError(f"{path}: truncated route trace: no CSV header after the preamble")
        n_lines += 1
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith("#"):
            comments.append(_key_values(line[1:]))
            continue
        return version, comments, [c.strip() for c in line.split(",")], n_lines


def _int_value(path: str, kv: Mapping[str, str], key: str, where: str) -> int:
    try:
        return int(kv[key])
    except KeyError:
        raise TraceError(f"{path}: {where} has no {key}=") from None
    except ValueError:
        raise TraceError(f"{path}: {where} has a non-integer {key}={kv[key]!r}") from None


def read_route_trace(path: str | Path) -> RouteTrace:
    """Parse a route trace file; raises TraceError with a one-line reason if it is not usable."""
    path = str(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot open route trace ({e.strerror or e})") from None
    with f:
        version, comments, columns, n_consumed = _read_preamble(path, f)
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise TraceError(f"{path}: route trace header lacks column(s) {', '.join(missing)}")
        if len(set(columns)) != len(columns):
            raise TraceError(f"{path}: route trace header repeats a column: {','.join(columns)}")
        try:
            frame = pd.read_csv(f, header=None, names=columns, index_col=False, skip_blank_lines=False)
        except pd.errors.EmptyDataError:
            frame = pd.DataFrame(columns=columns)
        except pd.errors.ParserError as e:
            m = _FIELDS_RE.search(str(e))
            where = f"line {int(m[2]) + n_consumed}: row has {m[3]} fields, header has {m[1]}" if m else str(e).strip()
            raise TraceError(f"{path}: malformed route trace, {where}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{path}: route trace rows are not text") from None

    expert_bytes: dict[int, int] = {}
    dense_bytes: dict[int, int] = {}
    meta: dict[str, str] = {}
    for kv in comments:
        if "layer" in kv:
            il = _int_value(path, kv, "layer", "a '# layer=' line")
            expert_bytes[il] = _int_value(path, kv, "expert_bytes", f"'# layer={il}'")
            dense_bytes[il] = int(kv["dense_bytes"]) if kv.get("dense_bytes", "").isdigit() else 0
        else:
            meta.update(kv)
    shape = {key: _int_value(path, meta, key, "the '# model=' preamble line") for key in SHAPE_KEYS}

    rows = _rows(path, frame, n_consumed)
    return RouteTrace(
        path=path, version=version, model=meta.get("model", ""), arch=meta.get("arch", ""),
        expert_bytes_by_layer=MappingProxyType(expert_bytes), dense_bytes_by_layer=MappingProxyType(dense_bytes),
        meta=MappingProxyType(meta), rows=rows, has_dropped_column="dropped" in columns, **shape)


def _rows(path: str, frame: pd.DataFrame, n_consumed: int) -> TraceRows:
    """Columns to typed arrays. A short row (the engine killed mid-write) shows up as a missing
    value in an integer column; the first one is reported with its file line."""
    int_columns = [c for c in REQUIRED_COLUMNS if c != "weight"] + [c for c in OPTIONAL_COLUMNS if c in frame]
    arrays: dict[str, np.ndarray] = {}
    for name in int_columns:
        if pd.api.types.is_integer_dtype(frame[name].dtype):
            arrays[name] = frame[name].to_numpy(dtype=np.int64)
            continue
        values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)))
        if len(bad):
            line = n_consumed + 1 + int(bad[0])
            raw = frame[name].iloc[bad[0]]
            what = f"no {name} value" if pd.isna(raw) else f"bad {name} value {raw!r}"
            raise TraceError(f"{path}: truncated or malformed route-trace row at line {line} ({what})")
        arrays[name] = values.astype(np.int64)
    arrays["weight"] = pd.to_numeric(frame["weight"], errors="coerce").to_numpy(dtype=np.float32, na_value=np.nan)
    if "dropped" not in arrays:
        arrays["dropped"] = np.zeros(len(frame), dtype=np.int64)
    return TraceRows(**arrays)
