"""The formats of a campaign directory's JSON files, their versions, and the one reader and writer.

Every JSON document bmoe-fleet keeps carries `"format"` and `"version"`. The registry below maps
each format name to the version this bmoe-fleet writes and, per older version, the function that
upgrades a document of that version to the next: a reader gets every document at the current
version (upgraded in memory, never rewritten behind the user's back), and a newer one is refused
with one line that says to upgrade bmoe-fleet. A format's version 2 is one `register` call with an
`upgrades={1: v1_to_v2}` entry, and nothing else changes for the readers.

What is written is strict JSON (`json_safe`: NaN and infinities as null, never bare NaN), through
the one atomic write (engine.fsutil), fsync'd, so a record survives a power cut.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from engine import fsutil
from engine.gguf.model import SHAPE_FORMAT, SHAPE_VERSION
from store.errors import StoreError

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Format:
    """One document format: its name, the version written, and the upgrade from each older one."""

    name: str
    version: int
    upgrades: Mapping[int, Upgrade] = field(default_factory=dict)   # version v -> a v document made v+1

    def stamp(self) -> dict[str, Any]:
        """The `format` and `version` keys a new document of this format starts with."""
        return {"format": self.name, "version": self.version}


_REGISTRY: dict[str, Format] = {}


def register(name: str, version: int = 1, upgrades: Mapping[int, Upgrade] | None = None) -> Format:
    """Make a format known (its name, the version written, the upgrade from each older version)."""
    if version < 1 or any(not 1 <= v < version for v in upgrades or {}):
        raise ValueError(f"{name}: upgrades must be from versions 1..{version - 1}")
    fmt = Format(name, version, MappingProxyType(dict(upgrades or {})))
    _REGISTRY[name] = fmt
    return fmt


def format_of(name: str) -> Format:
    """A registered format by name."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise StoreError(f"{name}: not a format this bmoe-fleet knows") from None


RUN = register("bmoe-fleet.run")
LEDGER = register("bmoe-fleet.ledger")
DEVICE = register("bmoe-fleet.device")
MODEL = register(SHAPE_FORMAT, SHAPE_VERSION)       # the engine writes it (engine.gguf.model.ModelShape.to_dict)
PLAN = register("bmoe-fleet.plan")
COMMUNITY = register("bmoe-fleet.community")
APP = register("bmoe-fleet.app")
STORAGE = register("bmoe-fleet.storage")
# campaign.toml carries a `version` too: the campaign file's own (harness.campaign.model.FORMAT_VERSION)


def upgrade(doc: Any, fmt: str, where: str | os.PathLike) -> dict[str, Any]:
    """A document of format `fmt` at the current version: older ones upgraded step by step, a
    newer one (or one no upgrade reaches) refused with one line naming `where`."""
    spec = format_of(fmt)
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise StoreError(f"{where}: not a {fmt} file")
    version = doc.get("version", 1)      # written by every version; a document without one is v1
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreError(f"{where}: {fmt} version {version!r} is not a version number")
    if version > spec.version:
        raise StoreError(f"{where}: {fmt} version {version} is newer than this bmoe-fleet reads "
                         f"({spec.version}); upgrade bmoe-fleet")
    while version < spec.version:
        step = spec.upgrades.get(version)
        if step is None:
            raise StoreError(f"{where}: {fmt} version {version} is older than any this bmoe-fleet reads "
                             f"({spec.version})")
        doc = {**step(dict(doc)), "format": fmt, "version": version + 1}
        version += 1
    return doc


def read_json(path: str | os.PathLike, fmt: str) -> dict[str, Any]:
    """One JSON file of format `fmt`, at the current version (see upgrade)."""
    return parse_json(file_bytes(path), fmt, path)


def file_bytes(path: str | os.PathLike) -> bytes:
    """A file's bytes (a StoreError naming it when it cannot be read)."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise StoreError(f"{path}: cannot read: {e}") from None


def parse_json(data: bytes, fmt: str, where: str | os.PathLike) -> dict[str, Any]:
    """A JSON file's bytes (UTF-8) of format `fmt`, at the current version; `where`: the file they
    are of, for messages."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise StoreError(f"{where}: cannot read: {e}") from None
    return upgrade(doc, fmt, where)


def _float(value: float, digits: int | None) -> float | None:
    """A float as strict JSON holds it: null when not finite, rounded to `digits` when asked."""
    if not math.isfinite(value):
        return None
    return value if digits is None else round(value, digits)


def json_safe(value: Any, digits: int | None = None) -> Any:
    """A copy strict JSON can hold: NaN and infinities become null, numpy scalars plain Python,
    arrays, Series and tuples lists, mapping keys strings; `digits` rounds every float (for reading;
    None keeps them exact)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return _float(value, digits)
    if kind is dict:                  # the plain containers first: a chart's figure is mostly these
        return {str(k): json_safe(v, digits) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [json_safe(v, digits) for v in value]
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(getattr(value, "dtype", None), np.dtype) and value.ndim == 1 and value.dtype.kind in "fiub":
        # a numeric numpy array or Series: its plain values at once, not one call each (the site's charts)
        values = value.tolist()
        if value.dtype.kind != "f" or (digits is None and np.isfinite(value).all()):
            return values
        return [_float(v, digits) for v in values]
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) >= 1:   # numpy arrays, pandas Series
        return [json_safe(v, digits) for v in value]
    if hasattr(value, "item"):                                               # numpy scalars
        with contextlib.suppress(TypeError, ValueError):
            value = value.item()
    if isinstance(value, float):
        return _float(value, digits)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, digits) for k, v in value.items()}
    return value


def json_line(obj: Any) -> str:
    """One compact strict-JSON line (the ledger's)."""
    return json.dumps(json_safe(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """A campaign directory's file: its folder made, fsync'd before the rename (a record survives
    a power cut), an OSError naming the file."""
    fsutil.atomic_write(path, data, fsync=True, mkdir=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Strict JSON (NaN and infinities stored as null, never as bare NaN), written atomically."""
    atomic_write(path, json.dumps(json_safe(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
