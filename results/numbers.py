"""Numbers as the files hold them: a NaN-safe float and a missing-value test (the one JSON cleaner,
json_safe, is the campaign store's: store.versioned).

Light on purpose (no numpy or pandas import).
"""

from __future__ import annotations

import math
from typing import Any


def to_float(value: Any) -> float:
    """A float from anything the files hold ("", None, "12.5", 3, True) — NaN when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def is_missing(value: Any) -> bool:
    """None or a float NaN: a value a page or a table shows as missing."""
    return value is None or (isinstance(value, float) and math.isnan(value))
