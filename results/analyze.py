"""Analysis of a run table, per (device, model, top-k): what each budget bought, where the cliff
and the low-memory killer sit, which dense mode wins, and which runs look contaminated.

- Budget points: per series (dense mode and the other non-budget knobs that vary) and budget,
  the median hit % and tok/s of the runs that finished, their spread, the kills. A budget under
  the token cycle is flagged: `--cache-mb 0` gives the same reads with no RAM and no management.
- LMK boundary: the smallest budget ever killed (`lmk_killed` or `killed`), the largest budget
  below it at which every run of every series survived, and the MemAvailable floor it reached.
- Dense modes: tok/s and major faults per token, compared at the budgets every mode ran.
- Contamination tells (method.md rule 6), each naming its runs: compute s/token that rises as
  top-k falls; majflt/token MAJFLT_FACTOR x the same config's other runs; a gate that gave up;
  a config whose result moves with run order between the passes.
- The replayed LRU curve of a route trace of the group (results.replay), with its knee.

Noise: two samples differ only when their ranges do not overlap and their medians differ by more
than noise_threshold() (as max(r, 1/r) - 1 of the median ratio r, so halving and doubling weigh
the same): max(NOISE_MIN, NOISE_CV_FACTOR x the larger coefficient of variation of the two), or
NOISE_DEFAULT when neither side has repeats. docs/results.md explains the numbers.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results.numbers import is_missing, to_float

NOISE_MIN = 0.10
NOISE_CV_FACTOR = 3.0
NOISE_DEFAULT = 0.15
COMPUTE_RISE = 0.10
MAJFLT_FACTOR = 10.0
MAJFLT_MIN_PER_TOK = 1.0
RESULT_OUTCOMES = ("ok", "lmk_killed", "killed", "config_error", "engine_error", "timeout", "invalid")
UNDER_CYCLE_ADVICE = "cache 0 is strictly better here"
# the knobs that make two runs the same configuration besides the budget (and the budget's own)
SERIES_KEYS = ("dense_weights", "io_threads", "overlap", "prefetch", "threads", "engine_flags", "engine_args")
# engine_flags / engine_args: the pass-through flags (results.table renders them canonically), so
# two cells that differ only by a flag never pool
CELL_KEYS = ("device", "model", "n_expert_used", "moe_stream", "no_mmap", "cache_auto", "budget_asked",
             "cache_ceil_mb", "dense_weights", "io_threads", "overlap", "prefetch", "threads", "n_predict",
             "prompt", "source", "engine_flags", "engine_args")
_SERIES_NAMES = {"dense_weights": "dense", "io_threads": "io", "overlap": "overlap", "prefetch": "prefetch",
                 "threads": "threads", "engine_flags": "flags", "engine_args": "args"}


# ── small helpers ────────────────────────────────────────────────────────────────────────────


def _text(value: Any) -> str:
    if is_missing(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index, dtype=object)


def _values(frame: pd.DataFrame, name: str) -> np.ndarray:
    return pd.to_numeric(_col(frame, name), errors="coerce").to_numpy(dtype=np.float64)


def _median(xs: Iterable[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.median(xs)) if xs else math.nan


def cv(xs: Sequence[float]) -> float:
    """Coefficient of variation (sample std / mean) of two or more values, else NaN."""
    xs = [x for x in xs if not math.isnan(x)]
    if len(xs) < 2:
        return math.nan
    mean = float(np.mean(xs))
    return float(np.std(xs, ddof=1)) / abs(mean) if mean else math.nan


def noise_threshold(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT) -> float:
    """The relative change under which two samples of one metric are the same (see the module doc)."""
    cvs = [c for c in (cv(a), cv(b)) if not math.isnan(c)]
    if not cvs:
        return max(NOISE_MIN, fallback)
    return max(NOISE_MIN, NOISE_CV_FACTOR * max(cvs))


def differs(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT) -> tuple[bool, float, float]:
    """(b differs from a beyond noise, median ratio b/a, the threshold used)."""
    a = [x for x in a if not math.isnan(x)]
    b = [x for x in b if not math.isnan(x)]
    if not a or not b:
        return False, math.nan, math.nan
    ma, mb = float(np.median(a)), float(np.median(b))
    ratio = mb / ma if ma else math.nan
    threshold = noise_threshold(a, b, fallback)
    apart = max(b) < min(a) or min(b) > max(a)
    # symmetric: halving and doubling are the same size of change
    change = max(ratio, 1 / ratio) - 1 if ratio and not math.isnan(ratio) else math.nan
    return bool(apart and not math.isnan(change) and change > threshold), ratio, threshold


def budget_asked(row: Mapping[str, Any]) -> str:
    """The budget a run was asked for (what makes two runs the same cell): `auto`, a MiB number, or
    the no-stream mode."""
    if row.get("moe_stream") is False:
        return "resident" if row.get("no_mmap") is True else "mmap"
    if row.get("cache_auto"):
        return "auto"
    asked = to_float(row.get("cache_mb_config"))
    return _text(asked if not math.isnan(asked) else to_float(row.get("cache_mb")))


def cell_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Runs with equal keys are repeats of one configuration (across campaigns too)."""
    out = []
    for k in CELL_KEYS:
        out.append(budget_asked(row) if k == "budget_asked" else _text(row.get(k)))
    return tuple(out)


def series_label(row: Mapping[str, Any], varying: Sequence[str]) -> str:
    # no pass-through flag is a setting of its own ("none"); any other empty knob is unknown
    parts = [f"{_SERIES_NAMES[k]}={_text(row.get(k)) or ('none' if k in ('engine_flags', 'engine_args') else '?')}"
             for k in varying]
    return " ".join(parts) or "all runs"


def top_k_key(value: Any) -> int | None:
    x = to_float(value)
    return None if math.isnan(x) else int(x)


# ── records ──────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class BudgetPoint:
    """The runs of one series at one budget."""

    series: str
    budget_mib: float            # NaN for no-stream baselines
    label: str
    auto: bool
    runs: int
    ok: int
    killed: int
    run_ids: tuple[str, ...]
    killed_run_ids: tuple[str, ...]
    hit_pct: float
    tok_s: float
    tok_s_min: float
    tok_s_max: float
    tok_s_values: tuple[float, ...]
    spread_pct: float
    under_cycle: bool
    advice: str
    mem_avail_floor_kb: float
    majflt_per_tok: float
    compute_s_per_tok: float
    flags: tuple[str, ...] = ()              # the pass-through flags its runs had (one setting per series)

    @property
    def s_per_token(self) -> float:
        return 1.0 / self.tok_s if self.tok_s and not math.isnan(self.tok_s) else math.nan


@dataclass(frozen=True)
class LmkBoundary:
    smallest_killed_mib: float | None
    killed_budgets_mib: tuple[float, ...]
    killed_run_ids: tuple[str, ...]
    largest_safe_mib: float | None          # every run at it (all series, all repeats) finished
    safe_repeats: int                       # how many runs back that
    floor_kb_at_safe: float | None          # lowest MemAvailable any of them reached
    evidence: tuple[str, ...]

    def text(self) -> str:
        parts = []
        if self.smallest_killed_mib is not None:
            parts.append(f"killed at {self.smallest_killed_mib:g} MiB")
        if self.largest_safe_mib is not None:
            floor = f", MemAvailable floor {self.floor_kb_at_safe / 1024:.0f} MiB" \
                if self.floor_kb_at_safe is not None else ""
            parts.append(f"always survived up to {self.largest_safe_mib:g} MiB ({self.safe_repeats} runs{floor})")
        return "; ".join(parts) or "no kills and no fixed budget that always survived"


@dataclass(frozen=True)
class DenseMode:
    mode: str
    runs: int
    ok: int
    tok_s: float
    majflt_per_tok: float
    tok_s_values: tuple[float, ...]


@dataclass(frozen=True)
class DenseComparison:
    modes: tuple[DenseMode, ...]
    compared_at: str             # "budgets 12, 39 MiB" or "all runs"
    best: str | None
    beyond_noise: bool           # the best beats the runner-up beyond noise

    def text(self) -> str:
        if not self.modes:
            return "no dense-mode runs"
        if len(self.modes) == 1:
            return f"only --dense-weights {self.modes[0].mode} was measured"
        word = "beats" if self.beyond_noise else "is within noise of"
        others = ", ".join(m.mode for m in self.modes if m.mode != self.best)
        return f"--dense-weights {self.best} {word} {others} ({self.compared_at})"


@dataclass(frozen=True)
class Tell:
    kind: str
    run_ids: tuple[str, ...]
    message: str


@dataclass(frozen=True, eq=False)
class Replay:
    """The exact global-LRU curve of one route trace (results.replay), evaluable at any budget."""

    trace_path: str
    run_id: str
    cycle_mib: float
    first_decode_hit_mib: float | None
    budgets_mib: tuple[float, ...]
    hit_pct_cum: tuple[float, ...]
    hit_pct_decode: tuple[float, ...]
    knee_mib: float | None
    _seq: Any = field(repr=False, default=None)
    _distance: Any = field(repr=False, default=None)
    _cycle_bytes: int = 0

    def hit_at(self, budget_mib: float) -> float:
        """Predicted cumulative hit % (prefill included, as the engine's cache_hit_pct) at a budget."""
        from results.replay import lru_curve

        (point,) = lru_curve(self._seq, [float(budget_mib)], self._cycle_bytes, self._distance)
        return point.hit_pct_cum


@dataclass(frozen=True, eq=False)
class GroupAnalysis:
    device: str
    model: str
    top_k: int | None
    cycle_mib: float
    cycle_source: str
    points: tuple[BudgetPoint, ...]         # streamed runs, cache 0 included
    baselines: tuple[BudgetPoint, ...]      # no-stream runs (mmap, resident)
    boundary: LmkBoundary
    dense: DenseComparison
    replay: Replay | None
    tells: tuple[Tell, ...]
    n_runs: int
    ram_total_kb: float
    mem_avail_before_kb: float              # highest MemAvailable any run started from
    tokens_min: float
    engines: tuple[str, ...]
    campaigns: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, int | None]:
        return (self.device, self.model, self.top_k)

    @property
    def under_cycle_points(self) -> tuple[BudgetPoint, ...]:
        return tuple(p for p in self.points if p.under_cycle)

    def series(self) -> list[str]:
        return list(dict.fromkeys(p.series for p in self.points))


@dataclass(frozen=True, eq=False)
class Analysis:
    groups: tuple[GroupAnalysis, ...]
    tells: tuple[Tell, ...]
    table: pd.DataFrame = field(repr=False)

    def group(self, device: str, model: str, top_k: int | None) -> GroupAnalysis:
        for g in self.groups:
            if g.key == (device, model, top_k):
                return g
        raise KeyError((device, model, top_k))

    def tells_of(self, run_id: str) -> list[Tell]:
        return [t for t in self.tells if run_id in t.run_ids]


# ── building ─────────────────────────────────────────────────────────────────────────────────


def _point(rows: pd.DataFrame, series: str, budget: float, cycle: float, auto: bool, label: str) -> BudgetPoint:
    ok = rows[rows["outcome"] == "ok"]
    killed = rows[rows["killed"]]
    tok = [x for x in _values(ok, "tok_s") if not math.isnan(x)]
    med = _median(tok)
    under = bool(not math.isnan(budget) and budget > 0 and not math.isnan(cycle) and budget < cycle)
    return BudgetPoint(
        series=series, budget_mib=budget, label=label, auto=auto, runs=len(rows), ok=len(ok), killed=len(killed),
        run_ids=tuple(rows["run_id"]), killed_run_ids=tuple(killed["run_id"]),
        hit_pct=_median(_values(ok, "cache_hit_pct")), tok_s=med,
        tok_s_min=min(tok) if tok else math.nan, tok_s_max=max(tok) if tok else math.nan,
        tok_s_values=tuple(tok), spread_pct=100 * (max(tok) - min(tok)) / med if len(tok) > 1 and med else 0.0,
        under_cycle=under, advice=UNDER_CYCLE_ADVICE if under else "",
        # the floor of the runs that finished: a killed run's last sample is not the floor it hit
        mem_avail_floor_kb=float(np.nanmin(_values(ok, "mem_avail_floor_kb")))
        if np.isfinite(_values(ok, "mem_avail_floor_kb")).any() else math.nan,
        majflt_per_tok=_median(_values(ok, "majflt_per_tok")),
        compute_s_per_tok=_median(_values(ok, "compute_s_per_tok")), flags=_flags_of(rows))


def _flags_of(rows: pd.DataFrame) -> tuple[str, ...]:
    """The engine flags every run of a point had (none when they differ, e.g. pooled series)."""
    settings = set(_col(rows, "engine_flags").fillna("").astype(str))
    return tuple(shlex.split(settings.pop())) if len(settings) == 1 else ()


def _points(rows: pd.DataFrame, varying: Sequence[str], cycle: float) -> tuple[list[BudgetPoint], list[BudgetPoint]]:
    streamed, baselines = [], []
    rows = rows.assign(_series=[series_label(r, varying) for r in rows.to_dict("records")],
                       _asked=[budget_asked(r) for r in rows.to_dict("records")])
    for (series, asked), sub in rows.groupby(["_series", "_asked"], sort=False):
        if asked in ("mmap", "resident"):
            baselines.append(_point(sub, series, math.nan, cycle, False, asked))
            continue
        if asked == "auto":
            # auto is sized per run: a point per sized budget (a killed run may not know its own)
            for budget, part in sub.groupby(_values(sub, "cache_mb"), dropna=False, sort=True):
                b = float(budget)
                ceil = to_float(part["cache_ceil_mb"].iloc[0])
                label = "auto" + (f" ceil {ceil:g}" if ceil and not math.isnan(ceil) else "") + (f" → {b:g} MiB" if not math.isnan(b) else "")
                streamed.append(_point(part, series, b, cycle, True, label))
            continue
        b = to_float(asked)
        budgets = _values(sub, "cache_mb")
        if np.isfinite(budgets).any():
            b = float(np.nanmedian(budgets))
        streamed.append(_point(sub, series, b, cycle, False, "off" if b == 0 else f"{b:g} MiB"))
    streamed.sort(key=lambda p: (p.series, math.inf if math.isnan(p.budget_mib) else p.budget_mib, p.auto))
    return streamed, baselines


def _boundary(points: Sequence[BudgetPoint], rows: pd.DataFrame) -> LmkBoundary:
    cached = [p for p in points if not math.isnan(p.budget_mib) and p.budget_mib > 0]
    killed = sorted({p.budget_mib for p in cached if p.killed})
    smallest = killed[0] if killed else None
    by_budget: dict[float, list[BudgetPoint]] = {}
    for p in cached:
        by_budget.setdefault(p.budget_mib, []).append(p)
    safe = [b for b, ps in by_budget.items() if all(p.ok == p.runs for p in ps) and (smallest is None or b < smallest)]
    largest = max(safe) if safe else None
    floor = repeats = None
    if largest is not None:
        ps = by_budget[largest]
        repeats = sum(p.runs for p in ps)
        floors = [p.mem_avail_floor_kb for p in ps if not math.isnan(p.mem_avail_floor_kb)]
        floor = min(floors) if floors else None
    killed_ids = tuple(i for p in cached if p.killed for i in p.killed_run_ids)
    evidence = tuple(dict.fromkeys(e for e in rows[rows["run_id"].isin(killed_ids)]["evidence"] if e))
    return LmkBoundary(smallest, tuple(killed), killed_ids, largest, repeats or 0, floor, evidence)


def _dense(rows: pd.DataFrame) -> DenseComparison:
    rows = rows[(rows["moe_stream"] != False) & (rows["dense_weights"] != "")]  # noqa: E712
    modes = list(dict.fromkeys(rows["dense_weights"]))
    if not modes:
        return DenseComparison((), "", None, False)
    ok = rows[rows["outcome"] == "ok"]
    asked = ok.apply(budget_asked, axis=1) if len(ok) else pd.Series(dtype=object)
    common = None
    for m in modes:
        have = set(asked[ok["dense_weights"] == m]) if len(ok) else set()
        common = have if common is None else common & have
    use = ok[asked.isin(common)] if common and len(modes) > 1 else ok
    where = ("budgets " + ", ".join(sorted(common, key=lambda s: (not s.replace('.', '').isdigit(), s)))
             if common and len(modes) > 1 else "all runs")
    out = []
    for m in modes:
        mine = use[use["dense_weights"] == m]
        tok = tuple(x for x in _values(mine, "tok_s") if not math.isnan(x))
        out.append(DenseMode(m, int((rows["dense_weights"] == m).sum()), len(mine), _median(tok),
                             _median(_values(mine, "majflt_per_tok")), tok))
    ranked = sorted((m for m in out if not math.isnan(m.tok_s)), key=lambda m: -m.tok_s)
    best = ranked[0].mode if ranked else None
    beyond = False
    if len(ranked) > 1:
        beyond, _, _ = differs(ranked[1].tok_s_values, ranked[0].tok_s_values)
    return DenseComparison(tuple(out), where, best, beyond)


def _replay(rows: pd.DataFrame, cycle: float, top_k: int | None, extra_budgets: Sequence[float]) -> Replay | None:
    from results.replay import (
        ReplayError,
        access_sequence,
        default_budgets_mib,
        first_decode_hit_mib,
        knee_mib,
        lru_curve,
        stack_distances,
    )
    from results.route_trace import TraceError, read_route_trace

    candidates = rows[(rows["has_route_trace"]) & (rows["outcome"] == "ok")]
    candidates = candidates.sort_values(["tokens", "run_id"], ascending=[False, True])
    for rec in candidates.to_dict("records"):
        path = Path(rec["run_dir"]) / "route.csv"
        try:
            trace = read_route_trace(path)
        except (TraceError, OSError):
            continue
        if top_k is not None and trace.n_expert_used != top_k:
            continue
        seq = access_sequence(trace)
        if len(seq) == 0:
            continue
        try:
            distance = stack_distances(seq)
        except ReplayError:
            continue
        cycle_mib = trace.cycle_bytes / (1 << 20)
        top = max([2 * cycle_mib] + [b * 1.1 for b in extra_budgets if not math.isnan(b)])
        budgets = sorted({round(b, 3) for b in default_budgets_mib(cycle_mib)} |
                         {round(b, 3) for b in extra_budgets if not math.isnan(b) and b >= 0} |
                         {round(top * i / 40, 3) for i in range(41)})
        points = lru_curve(seq, budgets, trace.cycle_bytes, distance)
        hits = [p.hit_pct_cum for p in points]
        return Replay(str(path), rec["run_id"], cycle_mib, first_decode_hit_mib(seq, distance), tuple(budgets),
                      tuple(hits), tuple(p.hit_pct_decode for p in points), knee_mib(seq, distance), seq, distance,
                      trace.cycle_bytes)
    return None


def _group(rows: pd.DataFrame, device: str, model: str, top_k: int | None, tells: Sequence[Tell],
           probes: pd.DataFrame | None = None) -> GroupAnalysis:
    results = rows[rows["outcome"].isin(RESULT_OUTCOMES)]
    cycles = _values(results, "cache_cycle_mb")
    cycle = float(np.nanmax(cycles)) if np.isfinite(cycles).any() else math.nan
    sources = [s for s in results["cycle_source"] if s]
    budgets = _values(results, "cache_mb")
    traced = results if probes is None or not len(probes) else pd.concat([results, probes])
    replay = _replay(traced, cycle, top_k, [float(b) for b in budgets if np.isfinite(b)])
    if math.isnan(cycle) and replay is not None:
        # a route trace's preamble prices the cycle from the model's own expert bytes
        cycle, sources = round(replay.cycle_mib, 3), ["route-trace"]
    varying = [k for k in SERIES_KEYS if k in results.columns and results[k].astype(str).nunique() > 1]
    points, baselines = _points(results, varying, cycle)
    ids = set(results["run_id"])
    ram = _values(rows, "ram_total_kb")
    before = _values(rows, "mem_avail_before_kb")
    tokens = _values(results[results["outcome"] == "ok"], "tokens")
    return GroupAnalysis(
        device=device, model=model, top_k=top_k, cycle_mib=cycle,
        cycle_source=max(set(sources), key=sources.count) if sources else "",
        points=tuple(points), baselines=tuple(baselines), boundary=_boundary(points, results), dense=_dense(results),
        replay=replay,
        tells=tuple(t for t in tells if ids & set(t.run_ids)), n_runs=len(results),
        ram_total_kb=float(np.nanmax(ram)) if np.isfinite(ram).any() else math.nan,
        mem_avail_before_kb=float(np.nanmax(before)) if np.isfinite(before).any() else math.nan,
        tokens_min=float(np.nanmin(tokens)) if np.isfinite(tokens).any() else math.nan,
        engines=tuple(sorted(set(results["engine"]))), campaigns=tuple(sorted(set(results["campaign"]))))


# ── contamination tells ──────────────────────────────────────────────────────────────────────


def _tells(table: pd.DataFrame) -> list[Tell]:
    ok = table[table["outcome"] == "ok"].copy()
    out: list[Tell] = []
    if not len(ok):
        return out
    records = ok.to_dict("records")
    keys = [cell_key(r) for r in records]
    ok["_cell"] = keys

    # compute s/token that rises as top-k falls (same device, model, budget, dense, knobs)
    k_index = CELL_KEYS.index("n_expert_used")
    ok["_nok"] = [key[:k_index] + key[k_index + 1:] for key in keys]
    for _, sub in ok.groupby("_nok", sort=False):
        per_k = {}
        for k, part in sub.groupby(_values(sub, "n_expert_used"), sort=True):
            c = _median(_values(part, "compute_s_per_tok"))
            if not math.isnan(k) and not math.isnan(c):
                per_k[float(k)] = (c, tuple(part["run_id"]))
        ks = sorted(per_k)
        for lo, hi in zip(ks, ks[1:]):
            c_lo, ids_lo = per_k[lo]
            c_hi, ids_hi = per_k[hi]
            if c_lo > c_hi * (1 + COMPUTE_RISE):
                out.append(Tell("compute_rises_as_topk_falls", ids_lo + ids_hi,
                                f"compute {c_lo:.4g} s/token at top-k {lo:g} is above {c_hi:.4g} at top-k {hi:g}: "
                                "fewer experts cannot cost more compute — the device was not in the same state"))

    # majflt/token an order of magnitude above the same config's other runs
    for _, sub in ok.groupby("_cell", sort=False):
        if len(sub) < 2:
            continue
        faults = _values(sub, "majflt_per_tok")
        for i, rid in enumerate(sub["run_id"]):
            others = np.delete(faults, i)
            others = others[np.isfinite(others)]
            if not len(others) or math.isnan(faults[i]):
                continue
            norm = float(np.median(others))
            if faults[i] > MAJFLT_FACTOR * max(norm, MAJFLT_MIN_PER_TOK):
                out.append(Tell("majflt_outlier", (rid,),
                                f"{faults[i]:.1f} major faults/token against {norm:.2f} in the same config's other "
                                f"{len(others)} run(s): something else took the page cache"))

    # a gate that gave up (the device was not cool or not free when the run started)
    for rec in table[table["gate_gave_up"] == True].to_dict("records"):  # noqa: E712
        out.append(Tell("gate_gave_up", (rec["run_id"],),
                        f"the cooling gate gave up before this run ({rec.get('gate_reason') or 'no reason recorded'})"))

    # engines sharing the cores ran more compute threads than there were cores (harness.cpushare)
    for rec in table[_col(table, "oversubscribed") == True].to_dict("records"):  # noqa: E712
        others = rec.get("cpu_engines") or ""
        out.append(Tell("oversubscribed", (rec["run_id"],),
                        f"{_text(rec.get('threads_sum'))} compute threads on {_text(rec.get('cores'))} cores (this "
                        f"run {_text(rec.get('cpu_threads')) or '?'}" + (f"; with {others}" if others else ", alone")
                        + "): threads waited for cores (ggml's pool spins), so its speed measured the contention, not "
                        "its configuration"))

    # a result that moves with run order between the passes
    fallback = _fallback_noise(ok)
    for _, sub in ok.groupby("_cell", sort=False):
        passes = sorted(set(sub["pass"]))
        if len(passes) < 2:
            continue
        first = sub[sub["pass"] == passes[0]]
        for p in passes[1:]:
            later = sub[sub["pass"] == p]
            moved, ratio, threshold = differs(list(_values(first, "tok_s")), list(_values(later, "tok_s")), fallback)
            if moved:
                out.append(Tell("moves_with_order", tuple(first["run_id"]) + tuple(later["run_id"]),
                                f"tok/s in pass {p} is {ratio:.2f}x pass {passes[0]} (noise {threshold:.0%}): the "
                                "result depends on when it ran, not only on its config"))
    return out


def _fallback_noise(ok: pd.DataFrame) -> float:
    """The typical repeat-to-repeat variation of this table's cells, for cells without repeats."""
    cvs = [cv(list(_values(sub, "tok_s"))) for _, sub in ok.groupby("_cell", sort=False) if len(sub) > 1]
    cvs = [c for c in cvs if not math.isnan(c)]
    return max(NOISE_MIN, NOISE_CV_FACTOR * float(np.median(cvs))) if cvs else NOISE_DEFAULT


# ── entry point ──────────────────────────────────────────────────────────────────────────────


def analyze(table: pd.DataFrame) -> Analysis:
    """Group a run table by (device, model, top-k) and analyse each group."""
    # knee probes (harness.probe) lend their route traces to the replay, never a sweep point
    is_probe = table["probe"].astype(bool) if "probe" in table.columns else pd.Series(False, index=table.index)
    tells = _tells(table[~is_probe])
    groups = []
    keys = table.assign(_k=[top_k_key(v) for v in table["n_expert_used"]], _probe=is_probe)
    for (device, model), sub in keys.groupby(["device", "model"], sort=True):
        ks = {None if is_missing(k) else int(k) for k in sub["_k"]}
        for k in sorted(ks, key=lambda v: (v is None, v or 0)):
            part = sub[sub["_k"].isna()] if k is None else sub[sub["_k"] == k]
            runs, probes = part[~part["_probe"]], part[part["_probe"]]
            if len(runs[runs["outcome"].isin(RESULT_OUTCOMES)]):
                groups.append(_group(runs, device, model, k, tells, probes))
    run_tells: dict[str, list[str]] = {}
    for t in tells:
        for rid in t.run_ids:
            run_tells.setdefault(rid, []).append(t.kind)
    table = table.assign(tells=[",".join(dict.fromkeys(run_tells.get(r, []))) for r in table["run_id"]])
    return Analysis(tuple(groups), tuple(tells), table)
