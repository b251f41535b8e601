"""What makes runs of a run table (results.read.table) the same configuration: the budget a run asked
for, the cell key that pools repeats across campaigns, and the series a budget curve is drawn
per; with the small column readers the analyses share.

The keys are run-table columns: a cell config's keys (store.cells.CellConfig, and an import's own
`overlap`, `prefetch`, `source`) under the names the table gives them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from engine.contract.flags import PLANNER_BUDGET
from results.numbers import is_missing, to_float

# the knobs that make two runs the same configuration besides the budget (and the budget's own)
SERIES_KEYS = ("dense_weights", "io_threads", "overlap", "prefetch", "threads", "engine_flags", "engine_args",
               "config_o_direct", "run_as")
# engine_flags / engine_args: the pass-through flags (results.read.table renders them canonically), so
# two cells that differ only by a flag never pool; config_o_direct: `run.o_direct` as asked (a
# `--no-odirect` run reads through the page cache, another speed); run_as: the engine started as the app
# (a virtual phone's `am run-as-app`), which lmkd may kill, apart from the shell's runs, which it never does
CELL_KEYS = ("device", "model", "n_expert_used", "moe_stream", "no_mmap", "cache_auto", "budget_asked",
             "cache_ceil_mb", "dense_weights", "io_threads", "overlap", "prefetch", "threads", "n_predict",
             "prompt", "source", "engine_flags", "engine_args", "apps", "config_o_direct", "run_as")
_SERIES_NAMES = {"dense_weights": "dense", "io_threads": "io", "overlap": "overlap", "prefetch": "prefetch",
                 "threads": "threads", "engine_flags": "flags", "engine_args": "args", "config_o_direct": "o_direct",
                 "run_as": "as"}


# what an empty knob means where empty is a setting of its own: no pass-through flag, the shell
_UNSET = {"engine_flags": "none", "engine_args": "none", "run_as": "shell"}


def text_of(value: Any) -> str:
    """A value as a key holds it: "" for missing, whole floats without ".0"."""
    if is_missing(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def column_of(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column, or one of Nones when the table has none by that name."""
    return frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index, dtype=object)


def numbers_of(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats (NaN where not a number)."""
    return pd.to_numeric(column_of(frame, name), errors="coerce").to_numpy(dtype=np.float64)


def budget_asked(row: Mapping[str, Any]) -> str:
    """The budget a run was asked for (what makes two runs the same cell): `auto`, a MiB number, or
    the no-stream mode; `planner` where the engine's planner chose)."""
    if row.get("planner") is True:
        return PLANNER_BUDGET
    if row.get("moe_stream") is False:
        return "resident" if row.get("no_mmap") is True else "mmap"
    if row.get("cache_auto"):
        return "auto"
    asked = to_float(row.get("cache_mb_config"))
    return text_of(asked if not math.isnan(asked) else to_float(row.get("cache_mb")))


def asked_label(asked: str) -> str:
    """A budget_asked value as a person reads it: "cache 0", "230 MiB", or the word (auto, planner,
    mmap, resident)."""
    if asked in ("auto", PLANNER_BUDGET, "mmap", "resident"):
        return asked
    return "cache 0" if asked == "0" else f"{asked} MiB"


def cell_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Runs with equal keys are repeats of one configuration (across campaigns too)."""
    out = []
    for k in CELL_KEYS:
        out.append(budget_asked(row) if k == "budget_asked" else text_of(row.get(k)))
    return tuple(out)


ALL_RUNS = "all runs"       # the series of a group in which no knob varies


def series_label(row: Mapping[str, Any], varying: Sequence[str]) -> str:
    """The series a run belongs to on a budget curve: its values of the knobs that vary."""
    # no pass-through flag is a setting of its own ("none"); any other empty knob is unknown
    parts = [f"{_SERIES_NAMES[k]}={text_of(row.get(k)) or _UNSET.get(k, '?')}" for k in varying]
    return " ".join(parts) or ALL_RUNS


def load_text(apps: str) -> str:
    """A load of other apps (axes.apps) in words: "open:com.example.maps+cached:1GiB" is "with
    com.example.maps and cached:1GiB ballast open" (an app opened through ActivityManager by its
    package, shell allocators as ballast: devices/coapps.py); "" is "with no other apps"."""
    if not apps:
        return "with no other apps"
    items = apps.split("+")
    opened = [i.removeprefix("open:") for i in items if i.startswith("open:")]
    ballast = [i for i in items if not i.startswith("open:")]
    return f"with {' and '.join(opened + ([' and '.join(ballast) + ' ballast'] if ballast else []))} open"


def top_k_key(value: Any) -> int | None:
    """A top-k as a group key (None when unknown)."""
    x = to_float(value)
    return None if math.isnan(x) else int(x)
