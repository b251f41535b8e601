"""Numbers as the files hold them: a NaN-safe float, a missing-value test, and the one JSON cleaner.

Light on purpose (no numpy or pandas import): the harness writes its JSON through `json_safe` too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


def json_safe(value: Any, digits: int | None = None) -> Any:
    """A copy strict JSON can hold: NaN and infinities become null, numpy scalars plain Python,
    arrays, Series and tuples lists, mapping keys strings; `digits` rounds every float (for reading;
    None keeps them exact)."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) >= 1:   # numpy arrays, pandas Series
        return [json_safe(v, digits) for v in value]
    if hasattr(value, "item"):                                               # numpy scalars
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return value if digits is None else round(value, digits)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, digits) for k, v in value.items()}
    return value
