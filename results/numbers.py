"""Numbers as the files hold them: a NaN-safe float and a missing-value test (the one JSON cleaner,
json_safe, is the campaign store's: store.versioned).

Light on purpose (no numpy or pandas import).
"""

from __future__ import annotations

import math
from typing import Any

from engine.units import ascii_float


def to_float(value: Any) -> float:
    """A float from anything the files hold ("", None, "12.5", 3) — NaN when it is not a number: a
    bool (JSON's `true` is no count), text that is not ASCII decimal (`1_000`, `١٢`: float() would
    read them; engine.units)."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, str):
        try:
            return ascii_float(value)
        except ValueError:
            return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def is_missing(value: Any) -> bool:
    """None or a float NaN: a value a page or a table shows as missing."""
    return value is None or (isinstance(value, float) and math.isnan(value))
