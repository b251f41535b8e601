"""Byte sizes written by people ("2GiB", "512MiB", "1.5G", "300M") to integers and back, and
telemetry numbers from text."""

from __future__ import annotations

import re
from typing import Any

from engine.errors import BmoeError

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

_UNITS = {
    "": 1, "b": 1,
    "k": KIB, "kb": 1000, "kib": KIB,
    "m": MIB, "mb": 1000**2, "mib": MIB,
    "g": GIB, "gb": 1000**3, "gib": GIB,
    "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """'2GiB' -> 2147483648. Bare numbers are bytes; K/M/G/T alone are binary (like dd)."""
    m = _SIZE_RE.match(str(text))
    if not m or m[2].lower() not in _UNITS:
        raise BmoeError(f"cannot read {text!r} as a size (try 512MiB, 2GiB, 1.5G)")
    return int(float(m[1]) * _UNITS[m[2].lower()])


def format_mib(n_bytes: int | float) -> str:
    return f"{n_bytes / MIB:.1f} MiB"


def format_bytes(n_bytes: int | float) -> str:
    if n_bytes >= GIB:
        return f"{n_bytes / GIB:.2f} GiB"
    return format_mib(n_bytes)


def parse_number(text: Any, default: Any = None) -> Any:
    """A telemetry value as an int, else a float, else `default` (values arrive as text)."""
    try:
        return int(text)
    except (TypeError, ValueError):
        try:
            return float(text)
        except (TypeError, ValueError):
            return default
