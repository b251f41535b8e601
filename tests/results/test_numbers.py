"""results.numbers: the NaN-safe float and the missing-value test; store.versioned.json_safe, the one JSON
cleaner."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from results.numbers import is_missing, to_float
from store.versioned import json_safe


def test_to_float_reads_what_files_hold_and_nan_for_the_rest():
    assert [to_float(v) for v in ("12.5", 3, " 7 ", np.int64(4))] == [12.5, 3.0, 7.0, 4.0]
    assert all(math.isnan(to_float(v)) for v in (None, "", "n/a", [1], float("nan")))


def test_to_float_takes_no_bool_and_no_numeral_float_alone_would_read():
    """JSON's `true` is no count, and `1_000`, `١٢`, `１２` are no engine's numerals (engine.units):
    a run table cell of them is missing, never 1, 1000 or 12."""
    assert all(math.isnan(to_float(v)) for v in (True, False, "1_000", "١٢", "１２", "9" * 400, 10 ** 400))


def test_is_missing_is_none_or_nan_only():
    assert is_missing(None) and is_missing(math.nan) and is_missing(np.float64("nan"))
    assert not is_missing(0) and not is_missing("") and not is_missing("nan")


def test_json_safe_gives_strict_json():
    value = {"a": np.float32(1.5), "b": (math.nan, np.int64(3), np.bool_(True)), "c": np.array([1.0, np.inf]),
             "d": pd.Series([1, 2]), 4: -math.inf, "e": "NaN"}
    clean = json_safe(value)
    assert clean == {"a": 1.5, "b": [None, 3, True], "c": [1.0, None], "d": [1, 2], "4": None, "e": "NaN"}
    assert type(clean["b"][1]) is int and type(clean["b"][2]) is bool
    json.dumps(clean, allow_nan=False)                      # raises on anything not strict JSON


def test_json_safe_rounds_only_when_asked():
    assert json_safe([1 / 3, 2], 3) == [0.333, 2]
    assert json_safe([1 / 3]) == [1 / 3]


def test_json_safe_gives_arrays_and_series_as_plain_lists_as_it_gives_their_values_one_by_one():
    import numpy as np
    import pandas as pd

    from store.versioned import json_safe

    floats = np.array([1.5, np.nan, np.inf, -np.inf, 2.0 / 3.0])
    for digits in (None, 2):
        for value in (floats, pd.Series(floats), np.arange(4), pd.Series([True, False]), np.array([3], dtype=np.uint8)):
            got = json_safe(value, digits)
            assert got == [json_safe(v, digits) for v in list(value)]
            assert all(v is None or type(v) in (int, float, bool) for v in got), got
    assert json_safe(floats, 2) == [1.5, None, None, None, 0.67] and json_safe(floats)[4] == 2.0 / 3.0
    assert json_safe(np.array(["a", None], dtype=object)) == ["a", None]
    assert json_safe({"x": np.zeros((2, 2))}) == {"x": [[0.0, 0.0], [0.0, 0.0]]}
