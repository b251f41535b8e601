"""What a value of each key can be: the range check every reader applies where numbers enter.

Three kinds of impossible number, three rules (docs/decisions/impossible-values.md):

- too large: a numeral over MAX_NUMBER_CHARS characters or a magnitude of 2^64 or more. No engine
  prints one (its counters are 64-bit), so the file is damaged: the reader refuses it with a
  NumberError naming the file, line and key (results.read.parse_text.to_number).
- not finite: `nan`, `inf`. printf writes them for a division by zero, so an engine can print them;
  they are stored as missing (None, NaN in a column), with a note.
- impossible for its key: a negative count, size, time or rate; a percentage outside 0..100 or a
  fraction outside 0..1 other than -1 (the engine's "not measured", kept as written); a JSON
  `true`/`false` where a number goes (a bool is no count); a part larger than its whole
  (`moe-substitute: 50/10`: more slots substituted than reranked, PARTS). Stored as missing, with
  a note.

A key's kind comes from its name, the way the engine and this project name things: a unit suffix
(`_ms`, `_s`, `/tok`, `_mib`, `_kb`, `_bytes`, …), `_pct`, `_frac`, or a known count. Temperatures,
overheads (a difference of two clocks) and unknown keys are only checked for being finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from engine.interface.outputs import count_keys
from results.read.parse_text import NumberError, check_magnitude, excerpt, located

NOT_MEASURED = -1
# names (lower case) that are counts; everything else is judged by its suffix
COUNTS = frozenset({
    "step", "steps", "turn", "tokens", "n_prompt", "majflt", "evictions", "rereads", "n_layer", "n_expert",
    "n_expert_used", "threads", "n_ctx", "n_ubatch", "io_threads", "prefetch", "n_predict", "top_k", "shards",
    "cache_resizes", "spec_experts", "spec_useful", "experts_routed", "experts_dropped", "mtp_batch",
    "mtp_drafted", "mtp_accepted", "mtp_decodes", "drafted_steps", "ra_committed", "ra_passthrough", "cache_cuts",
    "experts", "useful_experts", "buffers", "resized_count", "mib", "seconds", "repeat", "attempt",
}) | count_keys()     # and every key and line field engine/interface/outputs.py declares a count
NON_NEGATIVE_SUFFIXES = ("_ms", "_s", "/tok", "/s", "_tps", "_token", "_bytes", "_mib", "_mb", "_kb", "_khz",
                         "_uah", "_count")
# Engine settings bmoe-cli reads into a C int, with its own ranges (docs/engine-contract.md): a
# value outside them is no run's setting (4294967296 experts, 1000 I/O lanes), so stored as missing.
INT_MAX = 2**31 - 1
IO_THREADS_MAX = 8     # bmoe-cli: --io-threads [1..8]; 0 is what a non-streaming run reports
ENGINE_INTS: dict[str, tuple[int, int]] = {
    "io_threads": (0, IO_THREADS_MAX),
    **dict.fromkeys(("top_k", "n_expert_used", "n_expert", "threads", "n_ctx", "n_ubatch", "n_predict",
                     "n_prompt", "prefetch", "cache_mb", "cache_mib", "budget_mib", "cache_floor_mib",
                     "cache_ceil_mib"), (0, INT_MAX)),
}
# counts that are a part of another count of the same line or record: (part, whole)
PARTS = (("experts_substituted", "experts_reranked"), ("experts_dropped", "experts_routed"),
         ("spec_accepted", "spec_drafted"), ("mtp_accepted", "mtp_drafted"), ("drafted_steps", "spec_decodes"),
         ("ppl_hits", "ppl_scored"), ("useful_experts", "experts"))
# a clock difference, temperatures, the planner's signed error against what it measured: below 0 is real
SIGNED_MARKS = ("overhead", "temp", "_dc", "_mc", "_error_pct")
_FREE = (-math.inf, math.inf, None)


def value_range(key: str) -> tuple[float, float, float | None]:
    """(lowest, highest, sentinel) a value of `key` can take; the sentinel is allowed outside them."""
    name = key.lower()
    if name in ENGINE_INTS:
        low, high = ENGINE_INTS[name]
        return float(low), float(high), None
    if any(mark in name for mark in SIGNED_MARKS):
        return _FREE
    if name.endswith("_pct"):
        # CPU occupancy sums threads, so it is a percentage without a ceiling
        return (0.0, math.inf, None) if "occupancy" in name else (0.0, 100.0, NOT_MEASURED)
    if name.endswith("_frac"):
        return 0.0, 1.0, NOT_MEASURED
    if name in COUNTS or name.endswith(NON_NEGATIVE_SUFFIXES):
        return 0.0, math.inf, None
    return _FREE


def problem(key: str, value: Any) -> str | None:
    """Why `value` cannot be a value of `key` (None when it can, and for non-numbers but a bool
    where a number goes). Raises NumberError for a magnitude no engine prints."""
    if isinstance(value, bool):
        return "not a number" if value_range(key) != _FREE else None
    if not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    check_magnitude(key, value)
    low, high, sentinel = value_range(key)
    if value == sentinel or low <= value <= high:
        return None
    def shown(bound: float) -> str:
        return str(int(bound)) if math.isfinite(bound) and bound == int(bound) else f"{bound:g}"

    return "negative" if value < 0 <= low else f"outside {shown(low)}..{shown(high)}"


def note(where: str, key: str, value: Any, reason: str) -> str:
    return f"{where}: {excerpt(key, 40)}={excerpt(str(value), 40)}: {reason}, stored as missing"


def checked(values: Mapping[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """`values` with every impossible number replaced by None and a note appended for it; nested
    mappings (a .state file's cpufreq policies) are checked key by key. A part larger than its
    whole (PARTS) stores both as missing: which of the two is wrong, the line does not say."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out[key] = checked(value, where, notes)
            continue
        try:
            reason = problem(key, value)
        except NumberError as e:
            raise located(e, where) from None
        if reason is not None:
            notes.append(note(where, key, value, reason))
            value = None
        out[key] = value
    for part, whole in inconsistent(out, where, notes):
        out[part] = out[whole] = None
    return out


def inconsistent(values: Mapping[str, Any], where: str, notes: list[str]) -> list[tuple[str, str]]:
    """The (part, whole) pairs of PARTS whose part is larger than its whole in `values`, a note
    appended for each: the caller stores both as missing."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    pairs = [(part, whole) for part, whole in PARTS
             if number(values.get(part)) and number(values.get(whole)) and values[part] > values[whole]]
    notes += [f"{where}: {part}={values[part]} > {whole}={values[whole]}: a part larger than its whole, both "
              f"stored as missing" for part, whole in pairs]
    return pairs


def bad_in_column(column: str, values: pd.Series) -> np.ndarray:
    """Boolean mask of the values a column cannot hold (not finite, or out of the key's range)."""
    v = values.to_numpy(dtype=np.float64, na_value=np.nan)
    low, high, sentinel = value_range(column)
    present = ~np.isnan(v)
    with np.errstate(invalid="ignore"):
        bad = present & (~np.isfinite(v) | (v < low) | (v > high))
    if sentinel is not None:
        bad &= v != sentinel
    return bad
