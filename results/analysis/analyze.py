"""Analysis of a run table, per (device, model, top-k): what each budget bought, where the cliff
and the low-memory killer sit, which dense mode wins, and which runs look contaminated.

- Budget points: per series (dense mode and the other non-budget knobs that vary) and budget,
  the median hit % and tok/s of the runs that finished, their spread, the kills. A budget under
  the token cycle is flagged: `--cache-mb 0` gives the same reads with no RAM and no management.
- LMK boundary: the smallest budget ever killed (`lmk_killed` or `killed`), the largest budget
  below it at which every run of every series survived, and the MemAvailable floor it reached.
- Dense modes: tok/s and major faults per token, compared at the budgets every mode ran.
- Contamination tells (results.analysis.tells), each naming its runs.
- The replayed LRU curve of a route trace of the group (results.replay.replay), with its knee.

Which runs are the same configuration is results.read.run_keys; when two samples differ beyond noise,
results.analysis.noise.

Long because: it is one analysis, its records, then the building that fills them (points and
their fights, predictions, the boundary, dense modes, the replay, the planner's picks), the later
steps reading the points the earlier ones made; the records (about 290 lines) could move to a
module of their own, taking FILLED_FRACTION with them, and are the split to make if it grows.
"""

from __future__ import annotations

import contextlib
import functools
import math
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.contract.flags import PLANNER_BUDGET
from engine.gguf.model import cycle_price_mib
from engine.units import MIB, is_digits
from results.analysis import planner_check
from results.analysis.noise import differs, median
from results.analysis.planner_check import PlannerPick
from results.analysis.tells import Tell, find_tells
from results.numbers import is_missing, to_float
from results.read.columns import C
from results.read.frames import row_views
from results.read.parse_text import NumberError, ParseError
from results.read.quality import LOSSY_LEVERS, lossy_levers
from results.read.run_keys import (
    AUTO_BUDGET,
    MMAP,
    RESIDENT,
    SERIES_KEYS,
    budget_asked,
    budget_label,
    column_of,
    numbers_of,
    series_label,
    top_k_key,
)
from results.replay.predict import Prediction, PredictionError, predict
from store import names, outcomes
from store.outcomes import CONFIG_ERROR, RESULTS

UNDER_CYCLE_ADVICE = "cache 0 is strictly better here"
# A cache counts as filled when it ends holding this much of its budget (or of the expert bank,
# when that is smaller), or within one entry of it: an LRU cache stops within one entry of its
# budget, and a run that ends further below never had the budget's RAM in use, so surviving it
# proves nothing above what it held.
FILLED_FRACTION = 0.95
# A budget is fought (docs/method.md, "A fought budget is not safe") when its finished runs, at
# the median, made the device swap pages back in at this rate or more (pswpin over the run per
# generated token: the engine's pages, or a neighbour's that the engine's cache pushed out) ...
FOUGHT_SWAP_IN_MIB_PER_TOK = 1.0
# ... or decoded slower than every run at cache 0 of the same series while reclaim touched the
# engine: at least this share of its budget in swap beyond what cache 0 had in swap (and this many
# MiB: a few MiB of a small cache swapped is no war, while a budget just over the cycle can decode
# slower than cache 0 on its own), or major faults per token this many times cache 0's (and over
# one). Not under the cycle: there a cache hits nothing and manages every miss, so it is slower
# than cache 0 with no fight at all (a tight phone's load leaves a few MiB of either in swap).
FOUGHT_VM_SWAP_FRACTION = 0.05
FOUGHT_VM_SWAP_MIN_MIB = 4.0
FOUGHT_MAJFLT_FACTOR = 2.0

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
    held_mib: float = math.nan               # the least cache any finished run held at its end (resident MiB)
    bank_mib: float = math.nan               # the model's whole expert bank (a cache can hold no more)
    entry_mib: float = math.nan              # the model's largest cache entry (one expert of its widest layer)
    swap_in_mib_per_tok: float = math.nan    # the device's swap-in per token (median of finished runs)
    vm_swap_max_mib: float = math.nan        # the most of the engine any finished run had in swap
    fought: str = ""                         # why the budget counts as fought ("" when it is not): fought_reason
    others_killed: str = ""                  # other apps lmkd killed past its soft level while a run finished
    gap_taken: str = ""                      # a session run's cache taken in an idle gap (results.read.turns.gap_taken)
    # the prediction at this budget from the group's probe and cache-0 run (results.replay.predict;
    # NaN where none could be made: no route-traced run, no cache-0 run, or a dense mode without them)
    predicted_s_per_tok: float = math.nan
    predicted_hit_pct: float = math.nan
    predicted_anon_mib: float = math.nan
    anchor: bool = False                     # its runs are the prediction's anchor (an input, not a test)
    # in the app: runs whose replayed verdict (the engine as the app's foreground service, adj 200:
    # harness/run/app_verdict.py) is a kill, of the runs replayed, and lmkd's reason for the first
    app_killed: int = 0
    app_replayed: int = 0
    app_reason: str = ""
    run_as: str = ""                         # its runs' axes.run_as ("shell", or "" before it was kept; "app-…": as the app)
    # the lossy flags its runs had ("" lossless; results.read.quality.lossy_levers without the top-k, which
    # is the group's): a default is never a lossy point (results.analysis.recommend)
    lossy: str = ""

    @property
    def as_app(self) -> bool:
        """Its runs started the engine as the app (a virtual phone's `am run-as-app`), not from the shell."""
        return self.run_as.startswith("app")

    @property
    def filled(self) -> bool:
        """Its finished runs' caches filled (or their residency is unknown): surviving it proves
        the budget. A run that ends holding less than the budget proves only what it held."""
        if math.isnan(self.held_mib) or math.isnan(self.budget_mib) or self.budget_mib <= 0:
            return True
        room = self.budget_mib if math.isnan(self.bank_mib) else min(self.budget_mib, self.bank_mib)
        # an LRU stops short of its budget by less than one entry, however small the budget
        short_by = (1 - FILLED_FRACTION) * room if math.isnan(self.entry_mib) else \
            max((1 - FILLED_FRACTION) * room, self.entry_mib)
        return self.held_mib >= room - short_by - 1e-9

    @staticmethod
    def fillable_mib(working_set_mib: float, entry_mib: float = math.nan) -> float:
        """The largest budget a run whose cache ends holding `working_set_mib` (all it ever looks
        up) still counts as filled at (`filled`): past it, surviving proves nothing."""
        return max(working_set_mib / FILLED_FRACTION, working_set_mib + (0.0 if math.isnan(entry_mib) else entry_mib))

    @property
    def s_per_token(self) -> float:
        """Seconds per token at the median speed."""
        return 1.0 / self.tok_s if self.tok_s and not math.isnan(self.tok_s) else math.nan

    @property
    def prediction_error_pct(self) -> float:
        """(predicted - measured) / measured s/token, in % (NaN without both)."""
        measured = self.s_per_token
        if math.isnan(self.predicted_s_per_tok) or math.isnan(measured) or measured <= 0:
            return math.nan
        return 100.0 * (self.predicted_s_per_tok - measured) / measured


@dataclass(frozen=True)
class LmkBoundary:
    """Where the low-memory killer starts, and the largest budget that always survived."""

    smallest_killed_mib: float | None
    killed_budgets_mib: tuple[float, ...]
    killed_run_ids: tuple[str, ...]
    largest_safe_mib: float | None          # every run at it (all series, all repeats) finished, caches filled
    safe_repeats: int                       # how many runs back that
    floor_kb_at_safe: float | None          # lowest MemAvailable any of them reached
    evidence: tuple[str, ...]
    # budgets over largest_safe_mib (under any kill) whose every run finished without filling its
    # cache: (budget, the least any of them held), ascending
    unfilled: tuple[tuple[float, float], ...] = ()
    # budgets under any kill whose finished runs were fought over: (budget, fought_reason), ascending;
    # the largest safe budget sits under the first of them
    fought: tuple[tuple[float, str], ...] = ()
    # who killed at smallest_killed_mib: "lmkd" (a run the app registered), or "the kernel" (over adb
    # lmkd never considers the engine: a SIGKILL with no lmkd line is the kernel's OOM killer)
    killed_by: str = ""
    # in the app: the smallest budget whose replayed verdict is a kill (None: none, or not replayed),
    # lmkd's reason there, and whether any run was replayed at all
    app_killed_mib: float | None = None
    app_reason: str = ""
    app_replayed: bool = False
    # the engine run as the app (axes.run_as, a virtual phone): the smallest budget lmkd killed it at,
    # and the largest every such run survived (None: none); these runs are kept out of the rest
    app_observed_killed_mib: float | None = None
    app_observed_safe_mib: float | None = None

    def fought_text(self) -> str:
        """'600 MiB fought: 42 MiB/token swapped in; …' for the first fought budget ("" when none)."""
        return f"{self.fought[0][0]:g} MiB {self.fought[0][1]}" if self.fought else ""

    def unfilled_text(self) -> str:
        """'1400 MiB held 638 MiB, …': the least each held (empty when there is none)."""
        return ", ".join(f"{b:g} MiB held {held:.3g} MiB" for b, held in self.unfilled)

    def text(self) -> str:
        """One line for the pages and the recommendations."""
        parts = []
        if self.smallest_killed_mib is not None:
            parts.append(f"killed at {self.smallest_killed_mib:g} MiB")
        if self.largest_safe_mib is not None:
            floor = f", MemAvailable floor {self.floor_kb_at_safe / 1024:.0f} MiB" \
                if self.floor_kb_at_safe is not None else ""
            parts.append(f"always survived up to {self.largest_safe_mib:g} MiB ({self.safe_repeats} runs{floor})")
        if self.fought:
            parts.append(f"survived but not safe: {self.fought_text()}")
        if self.unfilled:
            parts.append(f"survived but never filled, so unproven: {self.unfilled_text()}")
        if self.app_killed_mib is not None:
            parts.append(f"in the app lmkd would kill it at {self.app_killed_mib:g} MiB ({self.app_reason})")
        return "; ".join(parts) or "no kills and no fixed budget that always survived"

    def killed_text(self) -> str:
        """'killed at 600 MiB (by the kernel: …)' for the smallest killed budget ("" when none)."""
        if self.smallest_killed_mib is None:
            return ""
        return f"{self.smallest_killed_mib:g} MiB killed" + (f" by {self.killed_by}" if self.killed_by else "")

    def adb_text(self) -> str:
        """What the runs over adb showed, in one phrase: the kill and who made it, the first fought
        budget (another app lmkd killed past its soft level among the reasons), the largest safe."""
        parts = [self.killed_text()] if self.smallest_killed_mib is not None else ["no kill"]
        if self.fought:
            parts.append(self.fought_text())
        if self.largest_safe_mib is not None:
            parts.append(f"always survived up to {self.largest_safe_mib:g} MiB")
        return "over adb: " + "; ".join(parts)

    def app_text(self) -> str:
        """The app's verdict in one phrase: where lmkd would kill the app, that it holds, or that no run
        was replayed (this host, imports, runs recorded before the replay)."""
        observed = ""
        if self.app_observed_killed_mib is not None or self.app_observed_safe_mib is not None:
            observed = "; run as the app: " + "; ".join(
                ([f"killed at {self.app_observed_killed_mib:g} MiB"] if self.app_observed_killed_mib is not None else [])
                + ([f"survived up to {self.app_observed_safe_mib:g} MiB"] if self.app_observed_safe_mib is not None
                   else []))
        if not self.app_replayed:
            return "in the app: not replayed" + observed
        if self.app_killed_mib is None:
            return "in the app: holds at every replayed budget" + observed
        return f"in the app: lmkd would kill the app at {self.app_killed_mib:g} MiB ({self.app_reason})" + observed


@dataclass(frozen=True)
class DenseMode:
    """One --dense-weights mode's runs."""

    mode: str
    runs: int
    ok: int
    tok_s: float
    majflt_per_tok: float
    tok_s_values: tuple[float, ...]


@dataclass(frozen=True)
class DenseComparison:
    """The dense modes compared where all of them ran."""

    modes: tuple[DenseMode, ...]
    compared_at: str             # "budgets 12, 39 MiB" or "all runs"
    best: str | None
    beyond_noise: bool           # the best beats the runner-up beyond noise

    def text(self) -> str:
        """One line: which mode wins, beyond noise or not."""
        if not self.modes:
            return "no dense-mode runs"
        if len(self.modes) == 1:
            return f"only --dense-weights {self.modes[0].mode} was measured"
        word = "beats" if self.beyond_noise else "is within noise of"
        others = ", ".join(m.mode for m in self.modes if m.mode != self.best)
        return f"--dense-weights {self.best} {word} {others} ({self.compared_at})"


@dataclass(frozen=True, eq=False)
class Replay:
    """The exact global-LRU curve of one route trace (results.replay.replay), evaluable at any budget."""

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
        from results.replay.lru_replay import lru_curve

        (point,) = lru_curve(self._seq, [float(budget_mib)], self._cycle_bytes, self._distance)
        return point.hit_pct_cum


@dataclass(frozen=True, eq=False)
class GroupAnalysis:
    """One (device, model, top-k): its budget points, boundary, dense modes, replay and tells."""

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
    apps: str = ""                          # the other apps open beside the engine ("" none; axes.apps)
    planner: tuple[PlannerPick, ...] = ()   # the engine's own planner's picks, by series (results.analysis.planner_check)
    predictions: tuple[Prediction, ...] = ()  # per dense mode, from the probe and cache 0 (results.replay.predict)

    @property
    def key(self) -> tuple[str, str, int | None, str]:
        """(device, model, top-k, other apps)."""
        return (self.device, self.model, self.top_k, self.apps)

    @property
    def under_cycle_points(self) -> tuple[BudgetPoint, ...]:
        """The budget points under the token cycle."""
        return tuple(p for p in self.points if p.under_cycle)

    def series(self) -> list[str]:
        """The series of the budget points, in order."""
        return list(dict.fromkeys(p.series for p in self.points))


@dataclass(frozen=True, eq=False)
class Analysis:
    """Every group of a run table, the tells, and the table with each run's tells."""

    groups: tuple[GroupAnalysis, ...]
    tells: tuple[Tell, ...]
    table: pd.DataFrame = field(repr=False)

    def group(self, device: str, model: str, top_k: int | None, apps: str = "") -> GroupAnalysis:
        """One group by its key (KeyError when there is none)."""
        for g in self.groups:
            if g.key == (device, model, top_k, apps):
                return g
        raise KeyError((device, model, top_k, apps))

    def tells_of(self, run_id: str) -> list[Tell]:
        """The tells that name a run."""
        return list(self._tells_by_run.get(run_id, ()))

    @functools.cached_property
    def _tells_by_run(self) -> dict[str, list[Tell]]:
        """Each run's tells in order, worked out once (a site asks for every run's)."""
        return tells_by_run(self.tells)


# ── building ─────────────────────────────────────────────────────────────────────────────────


def speeds(rows: pd.DataFrame) -> list[float]:
    """Each run's tok/s as a user waits for it: a speculative run's effective rate (decode plus
    drafting, its `mtp:`/`ngram:` line), which the reported tok/s leaves out; else tok/s."""
    spec = column_of(rows, C.spec_source).fillna("").astype(str)
    out = []
    for reported, effective, source in zip(numbers_of(rows, C.tok_s), numbers_of(rows, C.effective_tok_s), spec):
        value = effective if source and not math.isnan(effective) else reported
        if not math.isnan(value):
            out.append(float(value))
    return out


def _point(rows: pd.DataFrame, series: str, budget: float, cycle: float, auto: bool, label: str) -> BudgetPoint:
    ok = rows[rows[C.outcome] == outcomes.OK]
    killed = rows[rows[C.killed]]
    tok = speeds(ok)
    med = median(tok)
    under = bool(not math.isnan(budget) and budget > 0 and not math.isnan(cycle) and budget < cycle)
    return BudgetPoint(
        series=series, budget_mib=budget, label=label, auto=auto, runs=len(rows), ok=len(ok), killed=len(killed),
        run_ids=tuple(rows[C.run_id]), killed_run_ids=tuple(killed[C.run_id]),
        hit_pct=median(numbers_of(ok, C.cache_hit_pct)), tok_s=med,
        tok_s_min=min(tok) if tok else math.nan, tok_s_max=max(tok) if tok else math.nan,
        tok_s_values=tuple(tok), spread_pct=100 * (max(tok) - min(tok)) / med if len(tok) > 1 and med else 0.0,
        under_cycle=under, advice=UNDER_CYCLE_ADVICE if under else "",
        # the floor of the runs that finished: a killed run's last sample is not the floor it hit
        mem_avail_floor_kb=_least(numbers_of(ok, C.mem_avail_floor_kb)),
        majflt_per_tok=median(numbers_of(ok, C.majflt_per_tok)),
        compute_s_per_tok=median(numbers_of(ok, C.compute_s_per_tok)), flags=_flags_of(rows),
        held_mib=_least(numbers_of(ok, C.cache_resident_mib)), bank_mib=_least(numbers_of(rows, C.expert_bank_mib)),
        entry_mib=_least(numbers_of(rows, C.expert_entry_mib)),
        swap_in_mib_per_tok=median(numbers_of(ok, C.swap_in_mib_per_tok)),
        vm_swap_max_mib=_most(numbers_of(ok, C.vm_swap_max_mib)),
        others_killed=", ".join(dict.fromkeys(x for v in column_of(ok, C.others_hard_killed).dropna()
                                              for x in str(v).split(",") if x)),
        gap_taken=_text_of(ok, C.gap_taken), run_as=_text_of(rows, C.run_as),
        lossy=next((x for r in row_views(rows) if (x := lossy_levers(r, top_k=False))), ""),
        **_app_verdicts(rows))


def _app_verdicts(rows: pd.DataFrame) -> dict[str, Any]:
    """BudgetPoint's app_* fields from the runs' replayed verdicts (the foreground service's, adj 200:
    upstream's app runs the engine in RunService; on top, at adj 0, lmkd takes it no sooner)."""
    verdict = column_of(rows, C.app_service).fillna("").astype(str)
    reasons = column_of(rows, C.app_service_reason).fillna("").astype(str)
    killed = [r for v, r in zip(verdict, reasons) if v == "kill"]
    return {"app_killed": len(killed), "app_replayed": int((verdict != "").sum()), "app_reason": killed[0] if killed else ""}


def _most(values: np.ndarray) -> float:
    """The largest of a column's numbers; NaN when none is finite."""
    return float(np.nanmax(values)) if np.isfinite(values).any() else math.nan


def fought_reason(p: BudgetPoint, cache0: BudgetPoint | None) -> str:
    """Why the budget's finished runs were fought over (FOUGHT_* above), or "": the device swapped
    back in FOUGHT_SWAP_IN_MIB_PER_TOK or more per token, or decode was slower than every cache-0
    run of the same series while the engine was in swap or faulting FOUGHT_MAJFLT_FACTOR times
    cache 0's major faults per token; or lmkd killed another app past its soft level (perceptible or
    in front: others_hard_killed) to make room while it ran; or, in a session run, the cache was
    taken during an idle gap (re-reads, faults or swap-in on the next turn: results.read.turns.gap_taken)."""
    if not p.ok or math.isnan(p.budget_mib) or p.budget_mib <= 0:
        return ""
    parts = []
    if p.others_killed:
        parts.append(f"lmkd killed {p.others_killed} to make room")
    if p.swap_in_mib_per_tok >= FOUGHT_SWAP_IN_MIB_PER_TOK:
        parts.append(f"{p.swap_in_mib_per_tok:.3g} MiB/token swapped in")
    if p.gap_taken:
        parts.append(p.gap_taken)
    if cache0 is not None and cache0.ok and not p.under_cycle and not math.isnan(p.tok_s) \
            and p.tok_s < cache0.tok_s_min:
        base_flt = 0.0 if math.isnan(cache0.majflt_per_tok) else cache0.majflt_per_tok
        faults = not math.isnan(p.majflt_per_tok) and p.majflt_per_tok > max(1.0, FOUGHT_MAJFLT_FACTOR * base_flt)
        base_swap = 0.0 if math.isnan(cache0.vm_swap_max_mib) else cache0.vm_swap_max_mib
        swapped = not math.isnan(p.vm_swap_max_mib) and \
            p.vm_swap_max_mib - base_swap >= max(FOUGHT_VM_SWAP_MIN_MIB, FOUGHT_VM_SWAP_FRACTION * p.budget_mib)
        if parts or faults or swapped:
            if swapped and not parts:
                parts.append(f"{p.vm_swap_max_mib:.3g} MiB of the engine in swap")
            if faults:
                parts.append(f"{p.majflt_per_tok:.3g} major faults/token vs {base_flt:.3g} at cache 0")
            parts.append(f"{p.tok_s:.3g} tok/s vs {cache0.tok_s:.3g} at cache 0")
    return "fought: " + "; ".join(parts) if parts else ""


def _with_fights(points: list[BudgetPoint]) -> list[BudgetPoint]:
    """Each point with its fought reason, judged against cache 0 of its own series."""
    zero = {p.series: p for p in points if p.budget_mib == 0 and not p.auto}
    return [replace(p, fought=fought_reason(p, zero.get(p.series))) for p in points]


def _least(values: np.ndarray) -> float:
    """The smallest of a column's numbers; NaN when none is finite."""
    return float(np.nanmin(values)) if np.isfinite(values).any() else math.nan


def _flags_of(rows: pd.DataFrame) -> tuple[str, ...]:
    """The engine flags every run of a point had (none when they differ, e.g. pooled series)."""
    settings = set(column_of(rows, C.engine_flags).fillna("").astype(str))
    return tuple(shlex.split(settings.pop())) if len(settings) == 1 else ()


def _points(rows: pd.DataFrame, varying: Sequence[str], cycle: float) -> tuple[list[BudgetPoint], list[BudgetPoint]]:
    streamed, baselines = [], []
    rows = rows.assign(_series=[series_label(r, varying) for r in row_views(rows)],
                       _asked=[budget_asked(r) for r in row_views(rows)])
    for (series, asked), sub in rows.groupby(["_series", "_asked"], sort=False):
        if asked in (MMAP, RESIDENT):
            baselines.append(_point(sub, series, math.nan, cycle, False, budget_label(asked)))
            continue
        if asked == AUTO_BUDGET:
            # auto is sized per run: a point per sized budget (a killed run may not know its own)
            for budget, part in sub.groupby(numbers_of(sub, C.cache_mb), dropna=False, sort=True):
                b = float(budget)
                ceil = to_float(part[C.cache_ceil_mb].iloc[0])
                streamed.append(_point(part, series, b, cycle, True, budget_label(asked, ceil_mb=ceil, chose=b)))
            continue
        b = to_float(asked)
        budgets = numbers_of(sub, C.cache_mb)
        if np.isfinite(budgets).any():
            b = float(np.nanmedian(budgets))
        streamed.append(_point(sub, series, b, cycle, False, budget_label(b)))
    streamed.sort(key=lambda p: (p.series, math.inf if math.isnan(p.budget_mib) else p.budget_mib, p.auto))
    return _with_fights(streamed), baselines


def _boundary(points: Sequence[BudgetPoint], rows: pd.DataFrame) -> LmkBoundary:
    cached = [p for p in points if not math.isnan(p.budget_mib) and p.budget_mib > 0 and not p.as_app]
    observed = _observed_in_app([p for p in points if not math.isnan(p.budget_mib) and p.budget_mib > 0 and p.as_app])
    killed = sorted({p.budget_mib for p in cached if p.killed})
    smallest = killed[0] if killed else None
    by_budget: dict[float, list[BudgetPoint]] = {}
    for p in cached:
        by_budget.setdefault(p.budget_mib, []).append(p)
    fought = tuple((b, next(p.fought for p in ps if p.fought)) for b, ps in sorted(by_budget.items())
                   if any(p.fought for p in ps) and (smallest is None or b < smallest))
    first_fought = fought[0][0] if fought else None
    app_killed = sorted(b for b, ps in by_budget.items() if any(p.app_killed for p in ps))
    first_app = app_killed[0] if app_killed else None
    # neither killed nor fought, and not what the app would be killed at: under the smallest budget any happened at
    survived = [b for b, ps in by_budget.items() if all(p.ok == p.runs for p in ps) and (smallest is None or b < smallest)
                and (first_fought is None or b < first_fought) and (first_app is None or b < first_app)]
    safe = [b for b in survived if all(p.filled for p in by_budget[b])]
    largest = max(safe) if safe else None
    unfilled = tuple((b, min(p.held_mib for p in by_budget[b] if not p.filled)) for b in sorted(survived)
                     if b not in safe and (largest is None or b > largest))
    floor = repeats = None
    if largest is not None:
        ps = by_budget[largest]
        repeats = sum(p.runs for p in ps)
        floors = [p.mem_avail_floor_kb for p in ps if not math.isnan(p.mem_avail_floor_kb)]
        floor = min(floors) if floors else None
    killed_ids = tuple(i for p in cached if p.killed for i in p.killed_run_ids)
    evidence = tuple(dict.fromkeys(e for e in rows[rows[C.run_id].isin(killed_ids)][C.evidence] if e))
    killed_by = ""
    if smallest is not None:
        at = rows[rows[C.run_id].isin([i for p in by_budget[smallest] for i in p.killed_run_ids])]
        killed_by = "lmkd" if (column_of(at, C.outcome) == outcomes.LMK_KILLED).any() else \
            "the kernel (SIGKILL with no lmkd line)"
    app_reason = next((p.app_reason for p in by_budget.get(first_app, ()) if p.app_reason), "") \
        if first_app is not None else ""
    return LmkBoundary(smallest, tuple(killed), killed_ids, largest, repeats or 0, floor, evidence, unfilled, fought,
                       killed_by, first_app, app_reason, any(p.app_replayed for p in cached), *observed)


def _observed_in_app(points: Sequence[BudgetPoint]) -> tuple[float | None, float | None]:
    """The engine run as the app: the smallest budget any such run was killed at, and the largest
    under it whose every such run finished."""
    killed = [p.budget_mib for p in points if p.killed]
    smallest = min(killed) if killed else None
    held = [p.budget_mib for p in points if p.ok == p.runs and (smallest is None or p.budget_mib < smallest)]
    return smallest, (max(held) if held else None)


def _dense(rows: pd.DataFrame) -> DenseComparison:
    rows = rows[(rows[C.moe_stream] != False) & (rows[C.dense_weights] != "")]  # noqa: E712
    modes = list(dict.fromkeys(rows[C.dense_weights]))
    if not modes:
        return DenseComparison((), "", None, False)
    ok = rows[rows[C.outcome] == outcomes.OK]
    asked = ok.apply(budget_asked, axis=1) if len(ok) else pd.Series(dtype=object)
    common = None
    for m in modes:
        have = set(asked[ok[C.dense_weights] == m]) if len(ok) else set()
        common = have if common is None else common & have
    use = ok[asked.isin(common)] if common and len(modes) > 1 else ok
    where = ("budgets " + ", ".join(sorted(common, key=lambda s: (not is_digits(s.replace('.', '')), s)))
             if common and len(modes) > 1 else "all runs")
    out = []
    for m in modes:
        mine = use[use[C.dense_weights] == m]
        tok = tuple(speeds(mine))
        out.append(DenseMode(m, int((rows[C.dense_weights] == m).sum()), len(mine), median(tok),
                             median(numbers_of(mine, C.majflt_per_tok)), tok))
    ranked = sorted((m for m in out if not math.isnan(m.tok_s)), key=lambda m: -m.tok_s)
    best = ranked[0].mode if ranked else None
    beyond = False
    if len(ranked) > 1:
        beyond, _, _ = differs(ranked[1].tok_s_values, ranked[0].tok_s_values)
    return DenseComparison(tuple(out), where, best, beyond)


def _replay(rows: pd.DataFrame, cycle: float, top_k: int | None, extra_budgets: Sequence[float]) -> Replay | None:
    from results.errors import ReplayError
    from results.read.route_trace import TraceError, read_route_trace
    from results.replay.lru_replay import (
        access_sequence,
        default_budgets_mib,
        first_decode_hit_mib,
        knee_mib,
        lru_curve,
        stack_distances,
    )

    candidates = rows[(rows[C.has_route_trace]) & (rows[C.outcome] == outcomes.OK)]
    if LOSSY_LEVERS in candidates.columns:   # a lossy run's trace routes as its drops made it: not the LRU curve's
        candidates = candidates[candidates[LOSSY_LEVERS] == ""]
    candidates = candidates.sort_values([C.tokens, C.run_id], ascending=[False, True])
    for rec in row_views(candidates):
        path = Path(rec[C.run_dir]) / names.ROUTE_CSV
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
        cycle_mib = trace.cycle_bytes / MIB
        top = max([2 * cycle_mib] + [b * 1.1 for b in extra_budgets if not math.isnan(b)])
        budgets = sorted({round(b, 3) for b in default_budgets_mib(cycle_mib)} |
                         {round(b, 3) for b in extra_budgets if not math.isnan(b) and b >= 0} |
                         {round(top * i / 40, 3) for i in range(41)})
        points = lru_curve(seq, budgets, trace.cycle_bytes, distance)
        hits = [p.hit_pct_cum for p in points]
        return Replay(str(path), rec[C.run_id], cycle_mib, first_decode_hit_mib(seq, distance), tuple(budgets),
                      tuple(hits), tuple(p.hit_pct_decode for p in points), knee_mib(seq, distance), seq, distance,
                      trace.cycle_bytes)
    return None


def _predictions(results: pd.DataFrame, probes: pd.DataFrame | None) -> dict[str, Prediction]:
    """The group's predictions by dense mode (results.replay.predict), from its own runs and probes;
    {} where none can be made (a prediction that cannot be made never stops the analysis)."""
    rows = results if probes is None or not len(probes) else pd.concat([results, probes])
    try:
        made = predict(rows)
    except (PredictionError, ParseError, NumberError, OSError, ValueError, KeyError):
        return {}
    return {key[3]: p for key, p in made.items()}


def _predicted(points: list[BudgetPoint], rows: pd.DataFrame, predictions: Mapping[str, Prediction]) -> list[BudgetPoint]:
    """Each point with its dense mode's prediction at its budget, where there is one."""
    if not predictions:
        return points
    dense = dict(zip(rows[C.run_id], rows[C.dense_weights].astype(str)))
    out = []
    for p in points:
        modes = {dense.get(r, "") for r in p.run_ids}
        pred = predictions.get(modes.pop()) if len(modes) == 1 else None
        pred = pred if pred is not None and pred.predicts(p.run_ids) else None
        at = next((b for b in pred.budgets if b.budget_mib == p.budget_mib), None) if pred is not None else None
        anchor = pred is not None and pred.anchor is not None and \
            bool(set(p.run_ids) & set(pred.anchor.run_ids))
        out.append(replace(p, predicted_s_per_tok=at.s_per_tok, predicted_hit_pct=at.hit_pct_cum,
                           predicted_anon_mib=at.anon_mib, anchor=anchor) if at is not None else p)
    return out


def _planner_picks(rows: pd.DataFrame, measured: pd.DataFrame, boundary: LmkBoundary,
                   varying: Sequence[str], cycle: float) -> tuple[PlannerPick, ...]:
    """The planner cells of a group, one pick per series, judged like a budget point (fought
    against the cache-0 runs of its series) and set against the boundary the sweep measured."""
    if rows is None or not len(rows):
        return ()
    # the planner chooses the lanes itself (a planner cell writes no --io-threads): not its series
    varying = [k for k in varying if k != "io_threads"]
    rows = rows.assign(_series=[series_label(r, varying) for r in row_views(rows)])
    cache0 = measured[[budget_asked(r) == "0" for r in row_views(measured)]] if len(measured) else measured
    cache0 = cache0.assign(_series=[series_label(r, varying) for r in row_views(cache0)])
    zero = {str(s): _point(sub, str(s), 0.0, cycle, False, budget_label(0)) for s, sub in cache0.groupby("_series", sort=True)}
    picks = []
    for series, sub in rows.groupby("_series", sort=True):
        budgets = numbers_of(sub, C.cache_mb)
        budget = float(np.nanmedian(budgets)) if np.isfinite(budgets).any() else math.nan
        point = _point(sub, str(series), budget, cycle, False, budget_label(PLANNER_BUDGET))
        point = replace(point, fought=fought_reason(point, zero.get(str(series))))
        predicted = median(numbers_of(sub, C.plan_predicted_s_per_tok))
        if math.isnan(predicted):
            predicted = median(numbers_of(sub, C.plan_cost_ms_per_tok)) / 1000
        picks.append(planner_check.pick(
            point, boundary.largest_safe_mib, _text_of(sub, C.plan_regime), _text_of(sub, C.plan_declined), _text_of(sub, C.plan_flags),
            predicted, refused=bool(len(sub)) and bool((sub[C.outcome] == CONFIG_ERROR).all())))
    return tuple(picks)


def _text_of(rows: pd.DataFrame, column: str) -> str:
    """The first non-empty text of a column ("" when it has none)."""
    return next((str(v) for v in column_of(rows, column).dropna() if str(v)), "")


def _group(rows: pd.DataFrame, device: str, model: str, top_k: int | None, tells: Sequence[Tell],
           probes: pd.DataFrame | None = None, apps: str = "", planner: pd.DataFrame | None = None,
           predictions_made: bool = True) -> GroupAnalysis:
    results = rows[rows[C.outcome].isin(RESULTS)]
    cycles = numbers_of(results, C.cache_cycle_mb)
    cycle = float(np.nanmax(cycles)) if np.isfinite(cycles).any() else math.nan
    sources = [s for s in results[C.cycle_source] if s]
    budgets = numbers_of(results, C.cache_mb)
    traced = results if probes is None or not len(probes) else pd.concat([results, probes])
    replay = _replay(traced, cycle, top_k, [float(b) for b in budgets if np.isfinite(b)])
    if math.isnan(cycle) and replay is not None:
        # a route trace's preamble prices the cycle from the model's own expert bytes
        cycle, sources = cycle_price_mib(replay.cycle_mib * MIB), ["route-trace"]
    varying = [k for k in SERIES_KEYS if k in results.columns and results[k].astype(str).nunique() > 1]
    points, baselines = _points(results, varying, cycle)
    predictions = _predictions(results, probes) if predictions_made else {}
    points = _predicted(points, results, predictions)
    boundary = _boundary(points, results)
    # runs of the engine as the app answer the app's verdict (the boundary has them), not a budget
    # of the phone's own: no point, fixed budget or auto line of the group is made of them
    points = [p for p in points if not p.as_app]
    ids = set(results[C.run_id])
    ram = numbers_of(rows, C.ram_total_kb)
    before = numbers_of(rows, C.mem_avail_before_kb)
    tokens = numbers_of(results[results[C.outcome] == outcomes.OK], C.tokens)
    return GroupAnalysis(
        device=device, model=model, top_k=top_k, cycle_mib=cycle,
        cycle_source=max(set(sources), key=sources.count) if sources else "",
        points=tuple(points), baselines=tuple(baselines), boundary=boundary, dense=_dense(results),
        replay=replay,
        tells=tuple(t for t in tells if ids & set(t.run_ids)), n_runs=len(results),
        ram_total_kb=float(np.nanmax(ram)) if np.isfinite(ram).any() else math.nan,
        mem_avail_before_kb=float(np.nanmax(before)) if np.isfinite(before).any() else math.nan,
        tokens_min=_least(tokens),
        engines=tuple(sorted(set(results[C.engine]))), campaigns=tuple(sorted(set(results[C.campaign]))), apps=apps,
        planner=_planner_picks(planner, results, boundary, varying, cycle) if planner is not None else (),
        predictions=tuple(predictions[m] for m in sorted(predictions)))


# ── entry point ──────────────────────────────────────────────────────────────────────────────


_shared: ContextVar[list[tuple[pd.DataFrame, bool, tuple[GroupAnalysis, ...], tuple[Tell, ...]]] | None] = \
    ContextVar("shared_analyses", default=None)


@contextlib.contextmanager
def shared_analyses() -> Iterator[None]:
    """Inside, `analyze` of a table equal to one it analysed already (same columns, dtypes, index and
    values: DataFrame.equals), with predictions made alike, reuses that one's groups and tells:
    `report --db` analyses the site's runs once for the history of their release and once for the
    site (results.site.report)."""
    token = _shared.set([])
    try:
        yield
    finally:
        _shared.reset(token)


def analyze(table: pd.DataFrame, predictions_made: bool = True, tells: Sequence[Tell] | None = None) -> Analysis:
    """Group a run table by (device, model, top-k) and analyse each group. Without
    `predictions_made`, no group's speed is predicted (results.replay.predict reads every run's
    per-token data): what bounds a ceiling does not use it (results.analysis.fleet_db). `tells`: the
    table's `measured_tells`, when the caller has them already."""
    shared = _shared.get()
    for seen, made, seen_groups, seen_tells in shared or ():
        if made == predictions_made and seen.shape == table.shape and list(seen.columns) == list(table.columns) \
                and seen.equals(table):
            return _analysis(table, seen_groups, seen_tells)
    groups, found = _groups(table, predictions_made, tells)
    if shared is not None:
        shared.append((table, predictions_made, groups, found))
    return _analysis(table, groups, found)


def _groups(table: pd.DataFrame, predictions_made: bool,
            tells: Sequence[Tell] | None = None) -> tuple[tuple[GroupAnalysis, ...], tuple[Tell, ...]]:
    # knee probes (harness.plan.probe) lend their route traces to the replay, never a sweep point; the
    # planner's own picks are set beside the boundary (results.analysis.planner_check), never on the curve
    is_probe, is_planner = _is_probe(table), _is_planner_pick(table)
    tells = measured_tells(table) if tells is None else list(tells)
    groups = []
    keys = table.assign(_k=[top_k_key(v) for v in table[C.n_expert_used]], _probe=is_probe, _planner=is_planner)
    for (device, model), sub in keys.groupby([C.device, C.model], sort=True):
        ks = {None if is_missing(k) else int(k) for k in sub["_k"]}
        for k in sorted(ks, key=lambda v: (v is None, v or 0)):
            part = sub[sub["_k"].isna()] if k is None else sub[sub["_k"] == k]
            runs = part[~part["_probe"] & ~part["_planner"]]
            probes, picked = part[part["_probe"]], part[part["_planner"]]
            # each load of other apps is a phone of its own: its own boundary and recommendation
            loads = column_of(runs, C.apps).fillna("").astype(str)
            picked_loads = column_of(picked, C.apps).fillna("").astype(str)
            for load in sorted(set(loads)):
                these = runs[loads == load]
                if len(these[these[C.outcome].isin(RESULTS)]):
                    groups.append(_group(these, device, model, k, tells, probes, load, picked[picked_loads == load],
                                         predictions_made))
    return tuple(groups), tuple(tells)


def _is_probe(table: pd.DataFrame) -> pd.Series:
    return table[C.probe].astype(bool) if C.probe in table.columns else pd.Series(False, index=table.index)


def _is_planner_pick(table: pd.DataFrame) -> pd.Series:
    return column_of(table, C.planner).map(lambda v: str(v).lower() == "true").astype(bool)


def measured_tells(table: pd.DataFrame) -> list[Tell]:
    """The tells of a run table's measured runs (its knee probes and the planner's picks left out):
    `analyze(table).tells`, without the groups' analysis (the report's run pages start before it;
    it hands them to `analyze`)."""
    return find_tells(table[~_is_probe(table) & ~_is_planner_pick(table)])


def tells_by_run(tells: Sequence[Tell]) -> dict[str, list[Tell]]:
    """Each run's tells, in order: what `Analysis.tells_of` gives."""
    out: dict[str, list[Tell]] = {}
    for t in tells:
        for run_id in dict.fromkeys(t.run_ids):
            out.setdefault(run_id, []).append(t)
    return out


def _analysis(table: pd.DataFrame, groups: Sequence[GroupAnalysis], tells: Sequence[Tell]) -> Analysis:
    """The analysis of `table`: its groups and tells, and the table with each run's tells and prediction."""
    run_tells: dict[str, list[str]] = {}
    for t in tells:
        for rid in t.run_ids:
            run_tells.setdefault(rid, []).append(t.kind)
    table = table.assign(tells=[",".join(dict.fromkeys(run_tells.get(r, []))) for r in table[C.run_id]])
    return Analysis(tuple(groups), tuple(tells), _with_predictions(table, groups))


def _with_predictions(table: pd.DataFrame, groups: Sequence[GroupAnalysis]) -> pd.DataFrame:
    """The table with each measured run's prediction at its budget, and the error against its own
    s/token (docs/prediction.md): NaN where its group has no prediction."""
    at = {rid: p for g in groups for p in g.points for rid in p.run_ids if not math.isnan(p.predicted_s_per_tok)}
    measured = numbers_of(table, C.s_per_tok)
    predicted = [at[r].predicted_s_per_tok if r in at else math.nan for r in table[C.run_id]]
    return table.assign(
        predicted_s_per_tok=predicted,
        predicted_hit_pct=[at[r].predicted_hit_pct if r in at else math.nan for r in table[C.run_id]],
        predicted_anon_mib=[at[r].predicted_anon_mib if r in at else math.nan for r in table[C.run_id]],
        prediction_error_pct=[100.0 * (p - m) / m if not math.isnan(p) and m > 0 else math.nan
                              for p, m in zip(predicted, measured)])
