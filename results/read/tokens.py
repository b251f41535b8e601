"""Per-token distributions of one run (docs/method.md rule 7): report distributions, not means.

From the metrics CSV's per-token `wall_ms` (one decode step each), as upstream's
`scripts/bench-analyze.py` computes them, so the published tables reproduce:

- mean tok/s = tokens / Σ wall (the throughput a user sees);
- min / max = slowest / fastest single token (1000 / max|min wall_ms);
- median, p5, p95 of the per-token rates 1000 / wall_ms (linear interpolation between ranks).

Nothing is discarded: warm-up tokens stay in every statistic (a wall_ms the parser stored as
missing, NaN, is left out of the sums and rates rather than counted as 0). The steady state is
*marked*: it starts at the first step from which a short rolling median of wall_ms stays within
STEADY_TOLERANCE of the median of the run's second half. A run under PUBLISHED_MIN_TOKENS tokens
is a probe (rule 8), and one under STEADY_MIN_TOKENS has no steady state to mark.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

PUBLISHED_MIN_TOKENS = 256
PUBLISH_MIN_REPEATS = 3      # a published number reports a distribution (docs/method.md rule 7; sweep --preset publish)
STEADY_MIN_TOKENS = 16
STEADY_TOLERANCE = 0.25


@dataclass(frozen=True)
class TokenStats:
    tokens: int
    mean_tok_s: float
    median_tok_s: float
    p5_tok_s: float
    p95_tok_s: float
    min_tok_s: float
    max_tok_s: float
    steady_from_step: int | None       # first step of the steady state (None: too short to tell)
    steady_tokens: int
    steady_mean_tok_s: float
    wall_ms_mean: float
    io_ms_mean: float
    compute_ms_mean: float
    mgmt_ms_mean: float
    majflt_per_tok: float
    rss_max_mib: float
    mem_available_min_mib: float

    def to_dict(self) -> dict:
        return asdict(self)


def _mean(rows: pd.DataFrame, column: str) -> float:
    return float(rows[column].mean()) if column in rows.columns and len(rows) else math.nan


def _measured(rows: pd.DataFrame, column: str) -> pd.Series:
    """A column with values the engine marks as not measured (negative) dropped."""
    if column not in rows.columns:
        return pd.Series(dtype=np.float64)
    values = rows[column].astype(np.float64)
    return values[values >= 0]


def percentile(sorted_values: np.ndarray, q: float) -> float:
    """bench-analyze.py's pct(): linear interpolation between ranks of sorted values."""
    if len(sorted_values) == 0:
        return math.nan
    i = q * (len(sorted_values) - 1)
    lo = int(i)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo))


def steady_from(wall_ms: np.ndarray) -> int | None:
    """Index of the first token of the steady state, or None for a run too short to tell."""
    n = len(wall_ms)
    if n < STEADY_MIN_TOKENS:
        return None
    reference = float(np.median(wall_ms[n // 2:]))
    window = max(3, n // 16)
    rolling = pd.Series(wall_ms).rolling(window, min_periods=window).median().to_numpy()
    inside = np.abs(rolling - reference) <= STEADY_TOLERANCE * reference
    # the window ending at i starts at i - window + 1; steady once every later window is inside
    ok_from = n
    for i in range(n - 1, window - 2, -1):
        if not inside[i]:
            break
        ok_from = i - window + 1
    return ok_from if ok_from < n else None


def _step(rows: pd.DataFrame, start: int | None) -> int | None:
    """The `step` of row `start` (None when there is none, or the parser stored it as missing)."""
    if start is None or "step" not in rows.columns:
        return None
    step = float(rows["step"].iloc[start])
    return int(step) if math.isfinite(step) else None


def token_stats(rows: pd.DataFrame) -> TokenStats | None:
    """Statistics of a metrics CSV's per-token rows (None when it has none)."""
    if rows is None or len(rows) == 0 or "wall_ms" not in rows.columns:
        return None
    wall = rows["wall_ms"].astype(np.float64).to_numpy()
    n = len(wall)
    measured = np.isfinite(wall)
    total_s = float(wall[measured].sum()) / 1000.0
    rates = np.sort(1000.0 / wall[measured & (wall > 0)])
    start = steady_from(wall) if measured.all() else None
    steady = wall[start:] if start is not None else wall[:0]
    steady_s = float(steady.sum()) / 1000.0
    majflt = _measured(rows, "majflt")
    rss = _measured(rows, "rss_mib")
    avail = _measured(rows, "mem_available_mib")
    avail = avail[avail > 0]
    return TokenStats(
        tokens=n,
        mean_tok_s=int(measured.sum()) / total_s if total_s > 0 else math.nan,
        median_tok_s=float(np.median(rates)) if len(rates) else math.nan,
        p5_tok_s=percentile(rates, 0.05),
        p95_tok_s=percentile(rates, 0.95),
        min_tok_s=float(rates[0]) if len(rates) else math.nan,
        max_tok_s=float(rates[-1]) if len(rates) else math.nan,
        steady_from_step=_step(rows, start),
        steady_tokens=len(steady),
        steady_mean_tok_s=len(steady) / steady_s if steady_s > 0 else math.nan,
        wall_ms_mean=float(wall[measured].mean()) if measured.any() else math.nan,
        io_ms_mean=_mean(rows, "io_ms"),
        compute_ms_mean=_mean(rows, "compute_ms"),
        mgmt_ms_mean=_mean(rows, "mgmt_ms"),
        majflt_per_tok=float(majflt.sum()) / n if len(majflt) else math.nan,
        rss_max_mib=float(rss.max()) if len(rss) else math.nan,
        mem_available_min_mib=float(avail.min()) if len(avail) else math.nan,
    )
