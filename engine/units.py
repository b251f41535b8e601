"""Byte sizes written by people ("2GiB", "512MiB", "1.5G", "300M") to integers and back, and
numbers from text: ASCII decimal only, the one reading every layer uses (ascii_int, ascii_float,
is_digits).

Python's int() and float() read more than any engine, kernel or phone prints: other scripts' digits
(`int("١٢٣")` is 123, `float("１２")` is 12.0), underscores (`int("1_000")` is 1000) and Unicode
spaces; `str.isdigit()` also takes `²`, which int() then refuses, and `re`'s `\\d` matches every
script's digits. Text from a file, a flag or a device holding them is damaged or mistyped, never a
number: these functions refuse it (docs/decisions/ascii-numbers.md), and the regexes of the project
spell digits `[0-9]` (tests/engine/test_ascii_numbers.py checks the tree).
"""

from __future__ import annotations

import math
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
_SIZE_RE = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*([a-zA-Z]*)[ \t]*")
# a size no file, memory or device has: 2^63 bytes is past what a file offset (off_t) can hold
MAX_SIZE_BYTES = 1 << 63

# C's isspace() in the "C" locale: what int() and float() may strip around a numeral here
ASCII_SPACE = " \t\n\r\f\v"
# an ASCII decimal integer, and the float spellings printf and strtod share (no hex, no `_`)
INT_TEXT = r"[-+]?[0-9]+"
FLOAT_TEXT = r"[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
_INT_RE = re.compile(INT_TEXT)
_FLOAT_RE = re.compile(FLOAT_TEXT)


def is_digits(text: str) -> bool:
    """One or more ASCII digits and nothing else (what `str.isdigit()` is taken to mean: it also
    takes `٣`, `３` and `²`)."""
    return text.isascii() and text.isdigit()


def ascii_int(text: str) -> int:
    """int(text) for an ASCII decimal integer (a sign, digits, ASCII space around them) only;
    ValueError for anything else: other scripts' digits, `_`, a fraction, past 4,300 digits."""
    core = text.strip(ASCII_SPACE) if isinstance(text, str) else None
    if core is None or not _INT_RE.fullmatch(core):
        raise ValueError(f"not an ASCII decimal integer: {text!r:.60}")
    return int(core)


def ascii_float(text: str) -> float:
    """float(text) for an ASCII decimal numeral (`12`, `-1.5`, `.5`, `2e3`, nan, inf) only;
    ValueError for anything else, and for a numeral too large for a float (`1e400`, 400 nines:
    float() makes it infinite, which nobody wrote)."""
    core = text.strip(ASCII_SPACE) if isinstance(text, str) else None
    if core is None or not _FLOAT_RE.fullmatch(core):
        raise ValueError(f"not an ASCII decimal number: {text!r:.60}")
    value = float(core)
    if math.isinf(value) and core.lstrip("+-")[:1] not in "iI":
        raise ValueError(f"too large for a number: {text!r:.60}")
    return value


def parse_bytes(text: str) -> int:
    """'2GiB' -> 2147483648. Bare numbers are bytes; K/M/G/T alone are binary (like dd)."""
    m = _SIZE_RE.fullmatch(str(text))
    if not m or m[2].lower() not in _UNITS:
        raise BmoeError(f"cannot read {text!r:.60} as a size (try 512MiB, 2GiB, 1.5G)")
    try:
        n_bytes = ascii_float(m[1]) * _UNITS[m[2].lower()]
    except ValueError:
        n_bytes = math.inf
    if not n_bytes < MAX_SIZE_BYTES:
        raise BmoeError(f"{text!r:.60} is too large for a size (at most 8 EiB)")
    return int(n_bytes)


def format_mib(n_bytes: int | float) -> str:
    return f"{n_bytes / MIB:.1f} MiB"


def format_bytes(n_bytes: int | float) -> str:
    if n_bytes >= GIB:
        return f"{n_bytes / GIB:.2f} GiB"
    return format_mib(n_bytes)


def parse_number(text: Any, default: Any = None) -> Any:
    """A telemetry value as an int, else a float, else `default` (values arrive as text or as
    numbers; a bool is not one, nor text that is not ASCII decimal)."""
    if isinstance(text, bool):
        return default
    if isinstance(text, (int, float)):
        return text
    try:
        return ascii_int(text)
    except ValueError:
        try:
            return ascii_float(text)
        except ValueError:
            return default
