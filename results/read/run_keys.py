"""What makes runs of a run table (results.read.table) the same configuration: the budget a run asked
for (and budget_label, the one spelling of a budget a person reads: docs/decisions/budget-labels.md),
the cell key that pools repeats across campaigns, and the series a budget curve is drawn per; with
the small column readers the analyses share.

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
from results.read.frames import column_values, row_views
from store.run_record import SCALARS

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


# budget_asked's words besides PLANNER_BUDGET, as the cache_mb axis writes them: the two no-stream
# baselines and the engine's own sizing; and budget_label's spellings of a budget of 0 and of one unknown
MMAP, RESIDENT, AUTO_BUDGET = "mmap", "resident", "auto"
ZERO_BUDGET, UNKNOWN_BUDGET = "cache 0", "?"


def budget_asked(row: Mapping[str, Any]) -> str:
    """The budget a run was asked for (what makes two runs the same cell): `auto`, a MiB number, or
    the no-stream mode; `planner` where the engine's planner chose)."""
    if row.get("planner") is True:
        return PLANNER_BUDGET
    if row.get("moe_stream") is False:
        return RESIDENT if row.get("no_mmap") is True else MMAP
    if row.get("cache_auto"):
        return AUTO_BUDGET
    asked = to_float(row.get("cache_mb_config"))
    return text_of(asked if not math.isnan(asked) else to_float(row.get("cache_mb")))


def _mib(x: float) -> str:
    """A MiB number as a label writes it: whole ones without ".0"."""
    return str(int(x)) if x.is_integer() else f"{x:g}"


def budget_label(asked: Any, *, ceil_mb: Any = None, chose: Any = None, spec: str = "", forced: bool = False,
                 probe_tokens: int | None = None, upstream: bool = False) -> str:
    """A budget as a person reads it: the one spelling of each, for the plan's progress lines and
    dry run, the run table's `budget_label`, the analysis's budget points, compare, the planner's
    pick, the app's rungs, the community rows and the benchmarks.

    `asked` is the budget as the campaign's cache_mb axis and budget_asked() write it (a MiB
    number, "auto", "planner", "mmap", "resident"; "", None or NaN when unknown):

    - 0 is "cache 0": streamed with no expert cache (the engine's own line says "cache off");
      N is "N MiB"; unknown is "?";
    - "mmap" and "resident" are the two no-stream baselines, as the axis writes them: mmap, the
      weights mapped from the file; resident, every weight in anonymous memory (--no-mmap);
    - "auto" is "auto", or "auto ceil 600" with a ceiling (`ceil_mb`);
    - "planner" is "planner": the engine's own planner picks (--auto).

    `chose` is what the engine sized or picked (a MiB number, or "mmap": the planner declined
    streaming), shown after an arrow: "auto ceil 600 → 412 MiB", "planner → mmap", "planner → ?"
    (not known: a run killed before it said); None shows no arrow.

    A plan's cell, before it runs, may add: `spec`, a budget relative to the token cycle or the
    knee ("412 MiB (cycle*1.2)"; a knee cell before its probe has no MiB yet: "knee*0.9 (MiB from
    the probe)"); `forced`, the harness added --force-cache ("412 MiB forced"); `probe_tokens`, the
    knee's route-traced probe ("route-trace probe, cache 0, 64 tokens").

    `upstream` spells the Cache column of upstream's community table, a vocabulary of its own: "N
    MiB" (0 too), "auto" or "auto, cap 600" (and the sized budget in brackets, "auto, cap 600 (412
    MiB)"), "mmap (baseline)", "n/a" when unknown."""
    if probe_tokens is not None:
        return f"route-trace probe, {ZERO_BUDGET}, {probe_tokens} tokens"
    word = asked if isinstance(asked, str) and asked in (AUTO_BUDGET, PLANNER_BUDGET, MMAP, RESIDENT) else None
    ceil = to_float(ceil_mb)
    has_ceil = bool(ceil) and not math.isnan(ceil)
    sized = math.nan if chose is None or chose == MMAP else to_float(chose)
    if upstream:
        if word in (MMAP, RESIDENT):
            return f"{word} (baseline)"
        if word == AUTO_BUDGET:
            return (AUTO_BUDGET + (f", cap {_mib(ceil)}" if has_ceil else "")
                    + (f" ({_mib(sized)} MiB)" if not math.isnan(sized) else ""))
        mib = to_float(asked)
        return "n/a" if math.isnan(mib) else f"{_mib(mib)} MiB"
    if word is not None:
        head = f"{AUTO_BUDGET} ceil {_mib(ceil)}" if word == AUTO_BUDGET and has_ceil else word
        if chose is None or word not in (AUTO_BUDGET, PLANNER_BUDGET):
            return head
        return f"{head} → {MMAP if chose == MMAP else budget_label(sized)}"
    mib = to_float(asked)
    if math.isnan(mib):
        return f"{spec} (MiB from the probe)" if spec else UNKNOWN_BUDGET
    label = ZERO_BUDGET if mib == 0 else f"{_mib(mib)} MiB"
    if spec.startswith(("cycle", "knee")):
        label += f" ({spec})"
    return label + (" forced" if forced else "")


def cell_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Runs with equal keys are repeats of one configuration (across campaigns too)."""
    out = []
    for k in CELL_KEYS:
        out.append(budget_asked(row) if k == "budget_asked" else text_of(row.get(k)))
    return tuple(out)


def cell_keys(frame: pd.DataFrame) -> list[tuple[str, ...]]:
    """Each row's cell_key, in order, a key column at a time: a scalar's text made once per distinct
    value (a table of 10,000 runs holds a few dozen of each; tells and the quality front key every run)."""
    columns = []
    for k in CELL_KEYS:
        if k == "budget_asked":
            columns.append([budget_asked(row) for row in row_views(frame)])
            continue
        made: dict[tuple[type, Any], str] = {}
        texts = []
        for value in column_values(frame, k):
            kind = type(value)
            if kind not in SCALARS:    # JSON's scalars memoised: equal ones of one type have one text (0.0, -0.0: "0")
                texts.append(text_of(value))
                continue
            text = made.get((kind, value))
            if text is None:                   # (a NaN is never equal to itself: its text made again, "")
                text = made[kind, value] = text_of(value)
            texts.append(text)
        columns.append(texts)
    return list(zip(*columns))


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
