"""Predict a budget's decode s/token, hit % and resident anonymous MiB from one route-traced probe,
the cache-0 runs and, where one was measured, a cached cell (the anchor) of the same device, model,
top-k and dense mode (docs/prediction.md).

The model (docs/prediction.md has each term, where it is measured, and the error it makes):

- misses: the exact LRU replay of the probe's trace (results.replay.lru_replay) gives, at any budget b,
  the decode lookups that miss and their entry bytes; per decode token that is miss_mib(b);
- read rate: the cache-0 run reads every routed expert, so its measured read MiB per token over
  its I/O seconds per token is the device's rate at the run's lanes (`--io-threads`), and its read
  MiB over the replay's miss MiB at 0 is the O_DIRECT alignment factor;
- s/token(0) is the cache-0 runs' own mean. A budget b > 0 costs per token what a measured cached
  cell costs (its mean wall, s_c) less what its missed MiB cost for the MiB b avoids over it:
  s/token(b) = s_c - slope x (miss_mib(c) - miss_mib(b)), the slope being that cell's own visible
  read time and cache management per missed MiB. So every per-miss cost a cached run pays and a
  cache-0 run does not (the LRU's management, reads at a cached run's rate, compute of a cached
  run) is measured where it is paid. The cell is the one nearest the replay's knee (the adaptive
  sweep measures it first). With no cached cell measured: s_c is cache 0's, and the slope its read
  time per replayed miss MiB (visible x alignment / rate; visible is 1 without `--overlap` and the
  engine's reported stall / I/O with it);
- fresh reads: where the group has a cache-0 run that read through the page cache (`--no-odirect`,
  the buffered twin), the compute cache 0 spends over it, per miss MiB, is what computing on experts
  just read with O_DIRECT costs over experts already in memory (on this host's VM, 1-3 ms a token;
  docs/prediction.md); it joins the slope, since a budget's avoided misses avoid it too;
- anon MiB(b) = dense set + min(b, working set the trace reaches) + overhead, the overhead being
  the cache-0 run's peak RssAnon minus its dense set;
- the RAM-meeting budget: the largest b whose anon MiB fits what the phone can give the engine
  (PhoneRam: MemTotal, lmkd's low watermark, what else stays resident, zram with its ratio and
  lmkd's swap-free-low percentage), found exactly since anon MiB is piecewise linear in b.

Pure functions over a campaign's run table (results.read.table.build_table) and its run folders.

Long because: it is one model read top to bottom (the records it returns, the per-token rates
read from the CSVs, the formula, then the choice of each group's inputs from a run table), and its
callers import all of it from here; the run-table section (predict, _inputs, _twin, cell_errors)
is the part a split would take out should it grow, importing CachedRuns and _working_set_bytes
back.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.units import MIB
from results.errors import ResultsError
from results.read.columns import C
from results.read.parse_csv import read_metrics_csv
from results.read.route_trace import PHASE_DECODE, RouteTrace, read_route_trace
from results.read.run_keys import SERIES_KEYS
from results.read.series import Columns, TokenRows, token_rows
from results.read.table import build_table
from results.replay.lru_replay import (
    AccessSequence,
    access_sequence,
    default_budgets_mib,
    first_decode_hit_mib,
    knee_mib,
    lru_curve,
    mib_to_bytes,
    stack_distances,
)
from store import names
from store.outcomes import OK


class PredictionError(ResultsError):
    """The runs a prediction needs are missing or unusable; one line naming what and where."""


@dataclass(frozen=True)
class PhoneRam:
    """What a phone can give the engine's anonymous memory, as inputs (docs/virtual-phones.md,
    devices/lmkd_policy.py): lmkd stays silent while free memory is over its low
    watermark and SwapFree is over swap_free_low_pct of SwapTotal."""

    mem_total_mib: float
    low_watermark_mib: float = 0.0
    others_resident_mib: float = 0.0
    zram_disksize_mib: float = 0.0
    zram_ratio: float = 3.0            # uncompressed / compressed (lz4 on model weights: measure it)
    swap_free_low_pct: float = 10.0

    def __post_init__(self) -> None:
        if not (self.mem_total_mib > 0 and self.low_watermark_mib >= 0 and self.others_resident_mib >= 0
                and self.zram_disksize_mib >= 0 and self.zram_ratio >= 1 and 0 <= self.swap_free_low_pct <= 100):
            raise ValueError(f"impossible phone RAM {self}")

    @property
    def engine_capacity_mib(self) -> float:
        """Anonymous MiB the engine can hold before lmkd acts: RAM over the watermark and the
        others, plus what zram frees (each MiB swapped costs 1/ratio MiB of RAM) until SwapFree
        falls to lmkd's low percentage."""
        ram = self.mem_total_mib - self.low_watermark_mib - self.others_resident_mib
        swappable = self.zram_disksize_mib * (1 - self.swap_free_low_pct / 100)
        return ram + swappable * (1 - 1 / self.zram_ratio)


@dataclass(frozen=True)
class RunRates:
    """Per decode token, from one cell's metrics CSV rows (means over every token of its runs)."""

    run_ids: tuple[str, ...]
    tokens: int
    wall_s_per_tok: float
    compute_s_per_tok: float
    mgmt_s_per_tok: float
    io_s_per_tok: float
    visible_io_s_per_tok: float    # io without --overlap; the engine's stall with it
    read_mib_per_tok: float
    overlap: bool
    rss_anon_peak_mib: float

    @property
    def run_id(self) -> str:
        return self.run_ids[0]

    @property
    def missed_s_per_tok(self) -> float:
        """What the tokens' misses cost beside compute: visible reads and cache management."""
        return self.visible_io_s_per_tok + self.mgmt_s_per_tok

    @property
    def other_s_per_tok(self) -> float:
        """Wall time that is neither compute, visible I/O nor cache management (sampling, the loop).
        Signed: the columns are rounded to 1 us each, so it may be a hair under 0, and keeping the
        sign makes the prediction at 0 the cache-0 run's own wall time."""
        return self.wall_s_per_tok - self.compute_s_per_tok - self.visible_io_s_per_tok - self.mgmt_s_per_tok

    @property
    def read_mib_per_s(self) -> float:
        return self.read_mib_per_tok / self.io_s_per_tok if self.io_s_per_tok > 0 else math.inf

    @property
    def visible_io_fraction(self) -> float:
        return self.visible_io_s_per_tok / self.io_s_per_tok if self.io_s_per_tok > 0 else 1.0


@dataclass(frozen=True)
class CachedCell:
    """The finished runs of one budget > 0, pooled: the prediction's anchor."""

    budget_mib: float
    rates: RunRates

    @property
    def run_ids(self) -> tuple[str, ...]:
        return self.rates.run_ids


@dataclass(frozen=True)
class CachedRuns:
    """The finished runs of one budget > 0 of the cache-0 runs' series: a candidate anchor, whose
    CSV rows are read only when it is the one chosen (an analysis predicts every group)."""

    budget_mib: float
    metrics_paths: tuple[Path, ...]
    run_ids: tuple[str, ...]

    def read(self) -> CachedCell:
        return CachedCell(self.budget_mib, run_rates(self.metrics_paths, self.run_ids))


@dataclass(frozen=True)
class BudgetPrediction:
    budget_mib: float
    under_cycle: bool
    hit_pct_cum: float
    hit_pct_decode: float
    miss_mib_per_tok: float
    io_s_per_tok: float
    s_per_tok: float
    anon_mib: float

    def __post_init__(self) -> None:
        values = (self.budget_mib, self.hit_pct_cum, self.hit_pct_decode, self.miss_mib_per_tok, self.io_s_per_tok,
                  self.s_per_tok, self.anon_mib)
        if not all(math.isfinite(v) and v >= 0 for v in values) or self.hit_pct_decode > 100:
            raise ValueError(f"impossible prediction {self}")

    @property
    def tok_s(self) -> float:
        return 1 / self.s_per_tok if self.s_per_tok > 0 else math.inf


@dataclass(frozen=True)
class Prediction:
    """One (device, model, top-k, dense mode): the runs it used and the curve it predicts."""

    device: str
    model: str
    n_expert_used: int
    dense_weights: str
    probe_run_id: str
    cache0_run_id: str               # the first of cache0_run_ids
    cycle_mib: float
    first_decode_hit_mib: float | None
    working_set_mib: float
    dense_mib: float
    overhead_mib: float
    alignment: float                 # cache-0 read MiB / replayed miss MiB at 0
    rates: RunRates                  # the cache-0 runs'
    budgets: tuple[BudgetPrediction, ...]
    ram_capacity_mib: float | None   # PhoneRam.engine_capacity_mib, None without a phone
    ram_budget_mib: float | None     # largest budget that fits; None: no phone, or nothing fits
    ram_fits_every_budget: bool      # even the whole working set fits
    cache0_run_ids: tuple[str, ...] = ()
    knee_mib: int | None = None      # the replay's (lru_replay.knee_mib): the anchor is the cell nearest it
    slope_s_per_mib: float = 0.0     # s/token saved per replayed miss MiB a budget > 0 avoids
    anchor: CachedCell | None = None   # the anchor of budgets > 0 (its cost and slope); None: cache 0
    buffered: RunRates | None = None   # the buffered twin's (cache 0, --no-odirect); None: not measured
    fresh_s_per_mib: float = 0.0     # of the slope: compute on just-read experts per miss MiB (the twin's)

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.device, self.model, self.n_expert_used, self.dense_weights)

    def predicts(self, run_ids: Sequence[str]) -> bool:
        """Whether these runs are a cell the curve is about: not the buffered twin, an input that
        reads through the page cache where the curve's runs use O_DIRECT."""
        return not (self.buffered is not None and set(run_ids) & set(self.buffered.run_ids))

    def ram_budget_for(self, phone: PhoneRam) -> tuple[float | None, bool]:
        """The largest budget whose predicted anon MiB fits what the phone gives the engine (None:
        not even cache 0 fits), and whether the whole working set does."""
        return _ram_budget(phone.engine_capacity_mib, self.rates.rss_anon_peak_mib, self.working_set_mib)

    def at(self, budget_mib: float) -> BudgetPrediction:
        for b in self.budgets:
            if b.budget_mib == budget_mib:
                return b
        raise KeyError(budget_mib)


@dataclass(frozen=True)
class CellError:
    """A measured run beside its prediction."""

    run_id: str
    budget_mib: float
    under_cycle: bool
    measured_s_per_tok: float
    predicted_s_per_tok: float
    measured_hit_pct: float
    predicted_hit_pct: float
    measured_anon_mib: float
    predicted_anon_mib: float
    anchor: bool = False              # an input of the prediction (its anchor), not a test of it

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_s_per_tok - self.measured_s_per_tok) / self.measured_s_per_tok


# ── inputs ───────────────────────────────────────────────────────────────────────────────────


def _column_sum(rows: pd.DataFrame | Columns, column: str) -> float:
    """pandas' sum of a column (NaN left out), 0 without the column."""
    return float(pd.Series(rows[column]).sum()) if column in rows.columns else 0.0


@functools.lru_cache(maxsize=512)
def _parsed(path: str, mtime_ns: int, size: int) -> TokenRows:
    """One metrics CSV, parsed once per version of the file (an analysis predicts each group, and a
    caller analyses one campaign many times: every run of the cache-0 and anchor cells is read)."""
    m = read_metrics_csv(path)
    return TokenRows(Columns.of(m.rows), m.preamble)


def _metrics_file(path: str | Path) -> TokenRows:
    """A metrics CSV's rows: the results database's when it provides them (results.read.series),
    else the file's."""
    kept = token_rows(path)
    if kept is not None:
        return kept
    st = os.stat(path)
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


def _pooled_rows(metrics_paths: Sequence[str | Path]) -> tuple[pd.DataFrame, Mapping[str, Any]]:
    """The token rows of one or more runs of one cell, as one table, and the first run's preamble."""
    files = [_metrics_file(path) for path in metrics_paths]
    for path, m in zip(metrics_paths, files, strict=True):
        if not len(m.rows):
            raise PredictionError(f"{path}: the run has no token rows")
    names_of = {(m.rows.columns, tuple(m.rows[c].dtype for c in m.rows.columns)) for m in files}
    if len(names_of) == 1:          # one layout: pd.concat's columns, without a frame per run
        columns = files[0].rows.columns
        pooled = pd.DataFrame({c: np.concatenate([m.rows[c] for m in files]) for c in columns})
    else:
        pooled = pd.concat([m.rows.frame() for m in files], ignore_index=True)
    return pooled, files[0].preamble
def run_rates(metrics_paths: str | Path | Sequence[str | Path], run_ids: Sequence[str]) -> RunRates:
    """One cell's per-token means over all its runs' CSV rows (the summary's are rounded to 1 ms):
    every repeat counts, so one run's disk does not stand for the device's."""
    paths = [metrics_paths] if isinstance(metrics_paths, (str, Path)) else list(metrics_paths)
    if not paths:
        raise PredictionError(f"{', '.join(run_ids)}: no run to read")
    rows, preamble = _pooled_rows(paths)
    n = len(rows)
    overlap = str(preamble.get("overlap", "0")) == "1"
    io_s = _column_sum(rows, "io_ms") / 1000 / n
    visible = _column_sum(rows, "stall_ms") / 1000 / n if overlap else io_s
    anon = float(rows["rss_anon_mib"].max()) if "rss_anon_mib" in rows.columns else math.nan
    return RunRates(
        run_ids=tuple(run_ids), tokens=n, wall_s_per_tok=_column_sum(rows, "wall_ms") / 1000 / n,
        compute_s_per_tok=_column_sum(rows, "compute_ms") / 1000 / n,
        mgmt_s_per_tok=_column_sum(rows, "mgmt_ms") / 1000 / n, io_s_per_tok=io_s, visible_io_s_per_tok=visible,
        read_mib_per_tok=_column_sum(rows, "read_bytes") / MIB / n, overlap=overlap, rss_anon_peak_mib=anon)


def measured_s_per_tok(metrics_path: str | Path) -> float:
    """Mean wall s per generated token from the CSV rows (the same mean the prediction models)."""
    rows = _metrics_file(metrics_path).rows
    return _column_sum(rows, "wall_ms") / 1000 / len(rows) if len(rows) else math.nan


def _decode_tokens(trace: RouteTrace) -> int:
    rows = trace.rows
    decode = rows.phase == PHASE_DECODE
    if not decode.any():
        return 0
    return len(np.unique(rows.turn[decode].astype(np.int64) * (1 << 32) + rows.step[decode].astype(np.int64)))


def _working_set_bytes(seq: AccessSequence) -> int:
    keys, first = np.unique(seq.key, return_index=True)
    return int(seq.entry_bytes[first].sum()) if len(keys) else 0


def _decode_miss_bytes(seq: AccessSequence, distance: np.ndarray, budget_mib: float) -> int:
    b = mib_to_bytes(budget_mib)
    miss = seq.decode & ((distance > b) if b > 0 else np.ones(len(seq), dtype=bool))
    return int(seq.entry_bytes[miss].sum())


def _anchor(cells: Sequence[CachedRuns], miss_at, miss0_mib: float, knee: int | None) -> CachedCell | None:
    """The cached cell budgets > 0 are predicted from: the one nearest the replay's knee (by ratio)
    among those whose misses read at least a tenth of what cache 0 reads (fewer give no rate) and
    took time to (visible reads or management)."""
    usable = sorted((c for c in cells if c.budget_mib > 0 and miss_at(c.budget_mib) >= miss0_mib / 10 > 0),
                    key=lambda c: (abs(math.log(c.budget_mib / knee)) if knee else c.budget_mib, c.budget_mib))
    for candidate in usable:
        cell = candidate.read()
        if cell.rates.missed_s_per_tok > 0:
            return cell
    return None


def _ram_budget(capacity_mib: float, base_mib: float, working_set_mib: float) -> tuple[float | None, bool]:
    """anon(b) = base + min(b, ws): the largest b with anon(b) <= capacity (None if even 0 does not fit)."""
    if base_mib > capacity_mib:
        return None, False
    if base_mib + working_set_mib <= capacity_mib:
        return working_set_mib, True
    return capacity_mib - base_mib, False


# ── the model ────────────────────────────────────────────────────────────────────────────────


def predict_from_runs(trace: RouteTrace, rates: RunRates, budgets_mib: Sequence[float], *,
                      device: str = "", model: str = "", dense_weights: str = "anon", probe_run_id: str = "",
                      phone: PhoneRam | None = None, cached: Sequence[CachedRuns] = (),
                      buffered: RunRates | None = None) -> Prediction:
    """The prediction at every budget from a parsed trace, the cache-0 runs' rates and, where there
    are any, the cached cells measured (one of them is the anchor of budgets > 0: _anchor) and the
    buffered twin of cache 0 (the fresh-read term)."""
    seq = access_sequence(trace)
    distance = stack_distances(seq)
    n_tokens = _decode_tokens(trace)
    if n_tokens == 0:
        raise PredictionError(f"{trace.path}: the route trace has no decode tokens to replay")
    cycle = trace.cycle_bytes
    first_hit = first_decode_hit_mib(seq, distance)
    miss0_mib = _decode_miss_bytes(seq, distance, 0) / MIB / n_tokens
    alignment = rates.read_mib_per_tok / miss0_mib if miss0_mib > 0 else 1.0
    ws_mib = _working_set_bytes(seq) / MIB
    dense_mib = sum(trace.dense_bytes_by_layer.values()) / MIB if dense_weights == "anon" else 0.0
    overhead_mib = rates.rss_anon_peak_mib - dense_mib

    def miss_at(b: float) -> float:
        return _decode_miss_bytes(seq, distance, b) / MIB / n_tokens

    knee = knee_mib(seq, distance)
    anchor = _anchor(cached, miss_at, miss0_mib, knee)
    if anchor is not None:      # its own cost, and its own visible reads and management per missed MiB
        s_anchor, miss_anchor = anchor.rates.wall_s_per_tok, miss_at(anchor.budget_mib)
        slope = anchor.rates.missed_s_per_tok / miss_anchor
    else:                       # cache 0's, and its read time per replayed miss MiB
        s_anchor, miss_anchor = rates.wall_s_per_tok, miss0_mib
        slope = rates.visible_io_fraction * alignment / rates.read_mib_per_s if math.isfinite(rates.read_mib_per_s) \
            else 0.0
    # never negative: a twin that computed slower says the host's O_DIRECT costs compute nothing
    fresh = max(0.0, rates.compute_s_per_tok - buffered.compute_s_per_tok) / miss0_mib \
        if buffered is not None and miss0_mib > 0 else 0.0
    slope += fresh
    budgets = sorted({float(b) for b in budgets_mib} | {0.0})
    points = lru_curve(seq, budgets, cycle, distance)
    out = []
    for b, point in zip(budgets, points, strict=True):
        # the seed's rule, which the replay gives: no decode lookup hits under the first reuse distance
        # (at most one cycle), so a budget under it reads exactly what cache 0 reads
        if (first_hit is None or b < first_hit) and point.hit_pct_decode != 0.0:
            raise AssertionError(f"replay hit {point.hit_pct_decode} % at {b} MiB, under its first decode hit")
        miss_mib = miss_at(b)
        io_s = miss_mib * alignment / rates.read_mib_per_s if math.isfinite(rates.read_mib_per_s) else 0.0
        out.append(BudgetPrediction(
            budget_mib=b, under_cycle=point.under_cycle, hit_pct_cum=point.hit_pct_cum,
            hit_pct_decode=point.hit_pct_decode, miss_mib_per_tok=miss_mib, io_s_per_tok=io_s,
            s_per_tok=rates.wall_s_per_tok if b == 0 else max(0.0, s_anchor - slope * (miss_anchor - miss_mib)),
            anon_mib=max(0.0, dense_mib + min(b, ws_mib) + overhead_mib)))
    capacity = phone.engine_capacity_mib if phone else None
    ram_budget, fits_all = _ram_budget(capacity, rates.rss_anon_peak_mib, ws_mib) if capacity is not None \
        else (None, False)
    return Prediction(
        device=device, model=model, n_expert_used=trace.n_expert_used, dense_weights=dense_weights,
        probe_run_id=probe_run_id, cache0_run_id=rates.run_id, cycle_mib=cycle / MIB, first_decode_hit_mib=first_hit,
        working_set_mib=ws_mib, dense_mib=dense_mib, overhead_mib=overhead_mib, alignment=alignment, rates=rates,
        budgets=tuple(out), ram_capacity_mib=capacity, ram_budget_mib=ram_budget, ram_fits_every_budget=fits_all,
        cache0_run_ids=rates.run_ids, knee_mib=knee, slope_s_per_mib=slope, anchor=anchor, buffered=buffered,
        fresh_s_per_mib=fresh)


# ── from a run table ─────────────────────────────────────────────────────────────────────────

GROUP_KEYS = (C.device, C.model, C.n_expert_used, C.dense_weights)
# runs pooled into one input must differ in nothing else that sets their speed: the analysis' series
# keys, and what it keeps apart in other ways (the engine build, the apps open, the planner, --no-mmap)
MATCH_KEYS = SERIES_KEYS + (C.engine, C.apps, C.planner, "no_mmap")


def _usable(table: pd.DataFrame) -> pd.DataFrame:
    ok = table[(table[C.outcome] == OK) & (table[C.moe_stream] != False)]  # noqa: E712 (None: unknown, streamed)
    return ok[ok[C.cache_mb].notna()]


def _same_series(rows: pd.DataFrame, ref: Mapping[str, Any], keys: Sequence[str] = MATCH_KEYS) -> pd.DataFrame:
    keep = np.ones(len(rows), dtype=bool)
    for k in keys:
        if k in rows.columns:
            keep &= rows[k].astype(str).to_numpy() == str(ref.get(k))
    return rows[keep]


def _buffered(rows: pd.DataFrame, buffered: bool) -> pd.DataFrame:
    """The runs that read through the page cache (`--no-odirect`), or the others."""
    if "config_o_direct" not in rows.columns:
        return rows.iloc[:0] if buffered else rows
    is_buffered = (rows["config_o_direct"].astype(str) == "False").to_numpy()
    return rows[is_buffered if buffered else ~is_buffered]


def _twin(group: pd.DataFrame, ref: Mapping[str, Any]) -> pd.DataFrame:
    """The buffered twin of an O_DIRECT cache-0 series: its cache-0 sweep runs with `--no-odirect`
    and nothing else changed."""
    if str(ref.get("config_o_direct")) == "False":
        return group.iloc[:0]
    zero = _buffered(group[(group[C.cache_mb] == 0) & ~group[C.probe]], True)
    return _same_series(zero, ref, [k for k in MATCH_KEYS if k != "config_o_direct"])


def _metrics(rows: pd.DataFrame) -> list[Path]:
    return [Path(d) / names.METRICS_CSV for d in rows[C.run_dir]]


def predict(table: pd.DataFrame | Sequence[str | Path], phones: Mapping[str, PhoneRam] | None = None,
            extra_budgets_mib: Sequence[float] = ()) -> dict[tuple[str, str, int, str], Prediction]:
    """Per (device, model, top-k, dense mode) of a run table (or campaign dirs): the prediction
    from its probe (a route-traced run, the knee probe first), its cache-0 sweep runs (every repeat
    of the first one's series, O_DIRECT ones first), that series' cached cells (the anchor:
    predict_from_runs) and its buffered twin where one was measured (`_twin`), at
    every measured budget, the replay's default budgets, the working set (whole MiB) and
    `extra_budgets_mib`. Groups without a probe and a cache-0 run are left out (`missing_inputs`
    says which and why)."""
    if not isinstance(table, pd.DataFrame):
        table = build_table(list(table))
    out: dict[tuple[str, str, int, str], Prediction] = {}
    for key, group in _usable(table).groupby(list(GROUP_KEYS), sort=True, dropna=False):
        inputs = _inputs(group)
        if isinstance(inputs, str):
            continue
        probe, zero = inputs
        series = _same_series(group, zero.iloc[0].to_dict())
        zero = _same_series(zero, zero.iloc[0].to_dict())
        trace = read_route_trace(Path(probe[C.run_dir]) / names.ROUTE_CSV)
        rates = run_rates(_metrics(zero), [str(r) for r in zero[C.run_id]])
        twin = _twin(group, zero.iloc[0].to_dict())
        buffered = run_rates(_metrics(twin), [str(r) for r in twin[C.run_id]]) if len(twin) else None
        cached = [CachedRuns(float(b), tuple(_metrics(runs)), tuple(str(r) for r in runs[C.run_id]))
                  for b, runs in series[(series[C.cache_mb] > 0) & ~series[C.probe]].groupby(C.cache_mb, sort=True)]
        measured = [float(b) for b in group[C.cache_mb]]
        budgets = measured + default_budgets_mib(trace.cycle_bytes / MIB) + list(extra_budgets_mib)
        budgets.append(math.ceil(_working_set_bytes(access_sequence(trace)) / MIB))   # where anon goes flat
        device, model, k, dense = key
        out[(str(device), str(model), int(k), str(dense))] = predict_from_runs(
            trace, rates, budgets, device=str(device), model=str(model), dense_weights=str(dense),
            probe_run_id=str(probe[C.run_id]), phone=(phones or {}).get(str(device)), cached=cached,
            buffered=buffered)
    return out


def _inputs(group: pd.DataFrame) -> tuple[Mapping[str, Any], pd.DataFrame] | str:
    """The probe and the cache-0 runs (sweep runs; the knee probe, itself a cache-0 run, when
    there are none), or why not."""
    traced = group[group[C.has_route_trace]]
    if not len(traced):
        return "no route-traced run"
    probes = traced[traced[C.probe]]
    probe = (probes if len(probes) else traced).iloc[0]
    zero = group[(group[C.cache_mb] == 0) & ~group[C.probe]]
    if len(_buffered(zero, False)):
        zero = _buffered(zero, False)               # a buffered twin is no cache-0 input of its own
    if not len(zero):
        zero = group[group[C.cache_mb] == 0]        # the knee probe is a cache-0 run too
    if not len(zero):
        return "no cache-0 run"
    return probe.to_dict(), zero


def missing_inputs(table: pd.DataFrame) -> dict[tuple[str, str, int, str], str]:
    """The groups predict leaves out, each with the reason."""
    out = {}
    for key, group in _usable(table).groupby(list(GROUP_KEYS), sort=True, dropna=False):
        reason = _inputs(group)
        if isinstance(reason, str):
            device, model, k, dense = key
            out[(str(device), str(model), int(k), str(dense))] = reason
    return out


def cell_errors(table: pd.DataFrame, predictions: Mapping[tuple[str, str, int, str], Prediction]) -> list[CellError]:
    """Every measured ok sweep run (not the probe, not the buffered twin) beside the prediction of its group."""
    out = []
    for row in _usable(table).itertuples(index=False):
        r = row._asdict()
        p = predictions.get((str(r[C.device]), str(r[C.model]), int(r[C.n_expert_used]), str(r[C.dense_weights])))
        if p is None or r[C.probe] or not p.predicts([str(r[C.run_id])]):
            continue
        b = p.at(float(r[C.cache_mb]))
        path = Path(r[C.run_dir]) / names.METRICS_CSV
        rows = _metrics_file(path).rows
        anon = float(pd.Series(rows["rss_anon_mib"]).max()) if "rss_anon_mib" in rows.columns and len(rows) \
            else math.nan
        hit = float(r[C.cache_hit_pct]) if not pd.isna(r[C.cache_hit_pct]) else 0.0
        out.append(CellError(
            run_id=str(r[C.run_id]), budget_mib=b.budget_mib, under_cycle=b.under_cycle,
            measured_s_per_tok=measured_s_per_tok(path), predicted_s_per_tok=b.s_per_tok,
            measured_hit_pct=hit, predicted_hit_pct=b.hit_pct_cum, measured_anon_mib=anon,
            predicted_anon_mib=b.anon_mib,
            anchor=p.anchor is not None and str(r[C.run_id]) in p.anchor.run_ids))
    return out


__all__ = ["BudgetPrediction", "CachedCell", "CachedRuns", "CellError", "PhoneRam", "Prediction", "PredictionError", "RunRates",
           "cell_errors", "measured_s_per_tok", "missing_inputs", "predict", "predict_from_runs", "run_rates"]
