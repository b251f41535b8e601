"""Per-device cache recommendations from the analysis, with their evidence (docs/results.md).

For each (device, model, top-k):

- the ceiling N for `--cache-mb auto --cache-ceil-mb N`: the largest budget that survived every
  repeat (results.analysis.analyze.LmkBoundary), minus the safety margin — the shortfall of the
  MemAvailable floor that budget reached against a reserve of RESERVE_FRACTION of the device's
  RAM — rounded down, and never under the token cycle;
- if no budget that survived clears the cycle, `--cache-mb 0`, with the reason;
- the fixed `--cache-mb`: the fastest measured budget in {0} ∪ [cycle, N], where a budget within
  noise of a faster one loses to the smaller (less RAM, further from the killer);
- the dense mode that measured fastest;
- a confidence word (high / medium / low) with the reasons it is not higher;
- when a route trace of that device and model exists, the replayed LRU curve's prediction at the
  recommended budgets and its knee.

Every command line is the one that was measured (docs/decisions/recommendations.md): the settings of the
chosen runs' own
argv — budget as asked, `--force-cache`, floor, top-k, dense mode, lanes, threads, engine
arguments and flags — with only the run's own files, prompt and token count left out, and for
`auto` the ceiling set to N. A fixed budget is always a budget those runs used (never rounded,
so never under the cycle); imported runs, which kept no argv, get theirs rebuilt from their
configuration and say so (results.analysis.recommend_argv).

This module decides one (device, model, top-k) group and runs the whole job; the records and
their formats are results.analysis.recommend_records, the per-phone default and the rule for phones never
measured results.analysis.fleet_rules. `recommend --verify` runs each command line on its device: a
harness job (harness.run.verify), passed in as `verify`.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from results.analysis.analyze import Analysis, BudgetPoint, GroupAnalysis, analyze
from results.analysis.android_app import app_rung
from results.analysis.app_drop import app_costs
from results.analysis.fleet_rules import device_default, fleet_rules, identity_of
from results.analysis.noise import differs
from results.analysis.quality import LossyAlternative, QualityBound, candidates, lossy_alternative
from results.analysis.recommend_argv import argv_of_runs
from results.analysis.recommend_records import (
    HIGH_SPREAD_PCT,
    MEDIUM_SPREAD_PCT,
    RESERVE_FRACTION,
    AutoChoice,
    DeviceRecommendations,
    FixedChoice,
    PredictedChoice,
    Recommendation,
    Recommendations,
    ReplayCitation,
    campaign_summaries,
)
from results.publish import Redactor
from results.read.columns import C
from results.read.frames import row_views
from results.read.run_keys import load_text
from results.read.run_keys import text_of as _text
from results.read.rundir import CampaignData, campaign_heads, read_campaigns
from results.read.table import build_table
from results.read.tokens import PUBLISHED_MIN_TOKENS

CONFIDENCE = ("low", "medium", "high")
# the `recommend --verify` step: the recommendations and the campaigns they came from in, the
# recommendations with their verification out (harness.run.verify.verifier makes one)
Verify = Callable[[Recommendations, Sequence[CampaignData]], Recommendations]


def round_down(mib: float) -> int:
    """Whole MiB on a step that reads like a setting: 1 MiB under 200, 10 under 2000, 50 above."""
    step = 1 if mib < 200 else 10 if mib < 2000 else 50
    return int(math.floor(mib / step + 1e-9) * step)


def ceiling_mib(safe_mib: float, margin_mib: float) -> int:
    """The auto ceiling: the budget that survived every run, itself (whole MiB: the argv measured) when
    no margin is kept back, else that budget less the margin, rounded down to a step."""
    return round_down(safe_mib - margin_mib) if margin_mib > 0 else math.floor(safe_mib + 1e-9)


# ── one group ────────────────────────────────────────────────────────────────────────────────


def _reserve_mib(g: GroupAnalysis) -> tuple[float, str]:
    if not math.isnan(g.ram_total_kb):
        return RESERVE_FRACTION * g.ram_total_kb / 1024, f"{RESERVE_FRACTION:.0%} of {g.ram_total_kb / 1024:.0f} MiB RAM"
    if not math.isnan(g.mem_avail_before_kb):
        return (RESERVE_FRACTION * g.mem_avail_before_kb / 1024,
                f"{RESERVE_FRACTION:.0%} of the {g.mem_avail_before_kb / 1024:.0f} MiB available at the runs' start "
                "(device RAM unknown)")
    return math.nan, "device RAM unknown"


def _points_at(g: GroupAnalysis, budget: float) -> list[BudgetPoint]:
    return [p for p in g.points if p.budget_mib == budget]


def _in_dense(points: Sequence[BudgetPoint], dense: str | None) -> list[BudgetPoint]:
    if not dense:
        return list(points)
    mine = [p for p in points if f"dense={dense}" in p.series or "dense=" not in p.series]
    return mine or list(points)


def _fixed(g: GroupAnalysis, ceiling: float | None, dense: str | None,
           rows: Mapping[str, Mapping[str, Any]]) -> FixedChoice | None:
    """The fastest measured budget in {0} ∪ [cycle, ceiling] whose every run finished, with the
    argv its runs had; None when there is none."""
    # never a lossy setting: the default is lossless (a lossy one is named beside it only within a
    # --max-quality-loss bound: _alternative)
    pts = [p for p in g.points if not p.auto and p.ok == p.runs and p.ok > 0 and not math.isnan(p.tok_s) and not p.lossy]
    pts = _in_dense(pts, dense)
    cands = [p for p in pts if p.budget_mib == 0 or (
        ceiling is not None and (math.isnan(g.cycle_mib) or p.budget_mib >= g.cycle_mib)
        and p.budget_mib <= ceiling + 1e-9)]
    if not cands:
        return None
    best = max(cands, key=lambda p: p.tok_s)
    # the smallest budget within noise of the fastest wins: the same speed for less RAM
    near = [p for p in cands if p is best or not differs(list(p.tok_s_values), list(best.tok_s_values))[0]]
    for choice in sorted(near, key=lambda p: p.budget_mib):
        m = argv_of_runs(choice.run_ids, rows)
        asked = m.asked_mib
        mib = int(asked) if asked is not None else int(choice.budget_mib)
        if 0 < mib < g.cycle_mib:
            continue                      # never a fixed budget under the cycle (the engine reported another)
        settings = m.fixed(mib)
        why = (f"fastest measured: {choice.tok_s:.3g} tok/s over {choice.ok} run(s)" if choice is best else
               f"within noise of the fastest ({best.label}, {best.tok_s:.3g} tok/s) with less RAM")
        if choice.flags:                  # the engine flags the fastest series ran with go along
            why += f", with {shlex.join(choice.flags)}"
        return FixedChoice(mib, settings, m.source, True, choice.tok_s, choice.hit_pct, choice.ok, choice.spread_pct,
                           m.run_ids, choice.series, why)
    return None


def _cache_off_choice(g: GroupAnalysis, dense: str | None, rows: Mapping[str, Mapping[str, Any]]) -> FixedChoice:
    """`--cache-mb 0` with the flags measured: a cache-0 run's own argv when there is one."""
    zero = _in_dense([p for p in g.points if p.budget_mib == 0 and not p.auto and not p.lossy], dense)
    zero.sort(key=lambda p: (-(p.ok == p.runs and p.ok > 0), -p.ok))
    if zero:
        p = zero[0]
        m = argv_of_runs(p.run_ids, rows)
        return FixedChoice(0, m.fixed(0), m.source, p.ok > 0, p.tok_s, math.nan, p.ok, p.spread_pct, m.run_ids,
                           p.series, UNDER)
    streamed = _in_dense([p for p in _lossless(g.points) if p.ok or p.killed], dense)
    ids = tuple(r for p in streamed for r in p.run_ids)
    m = argv_of_runs(ids, rows)
    return FixedChoice(0, m.fixed(0), m.source, False, math.nan, math.nan, 0, 0.0, m.run_ids,
                       streamed[0].series if streamed else "",
                       UNDER + " (cache 0 itself was not run: the other flags are the measured runs')")


def _auto(g: GroupAnalysis, ceiling: int, series: str | None, dense: str | None, safe: float,
          rows: Mapping[str, Mapping[str, Any]]) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """The argv of `--cache-mb auto --cache-ceil-mb N`: measured auto runs' settings (finished ones
    first) with the ceiling set to N; else the runs at the largest safe budget as auto."""
    def mine(points):
        same = [p for p in points if series is not None and p.series == series]
        return same or _in_dense(points, dense)

    autos = mine([p for p in g.points if p.auto and not p.lossy])
    autos.sort(key=lambda p: (-(p.ok == p.runs and p.ok > 0), -p.ok))
    for p in autos:
        m = argv_of_runs(p.run_ids, rows, prefer_ok=True)
        if m.settings and m.source == "measured":
            return m.auto(ceiling), "measured auto runs", m.run_ids
    at_safe = mine(_lossless(_points_at(g, safe)))
    ids = tuple(r for p in at_safe for r in p.run_ids)
    m = argv_of_runs(ids, rows)
    floors = [_text(rows[r].get("cache_floor_mb")) for r in m.run_ids if r in rows]
    floor = next((int(float(f)) for f in floors if f), None)
    return m.auto(ceiling, floor), ("measured fixed runs" if m.source == "measured" else "rebuilt"), m.run_ids


def _lossless(points: Sequence[BudgetPoint]) -> list[BudgetPoint]:
    """The points without lossy flags; all of them when every one has some (the argv then says so)."""
    return [p for p in points if not p.lossy] or list(points)


def _alternative(g: GroupAnalysis, bound: QualityBound, fixed: FixedChoice | None, auto: AutoChoice | None,
                 dense: str | None, lower: Sequence[GroupAnalysis],
                 rows: Mapping[str, Mapping[str, Any]]) -> LossyAlternative:
    """The lossy setting `--max-quality-loss` names beside the default (results.analysis.quality.candidates:
    the fixed budgets the default could have used, with a lossy flag or at a lower top-k)."""
    base = next((p for p in g.points if fixed is not None and fixed.measured and fixed.run_ids
                 and set(fixed.run_ids) <= set(p.run_ids)), None)
    ceiling = float(auto.cache_ceil_mb) if auto is not None else None
    found = candidates(g, lower, lambda points: _in_dense(points, dense), ceiling, rows)
    return lossy_alternative(bound, base.tok_s_values if base is not None else (), found, rows)


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[:limit - 1].rsplit(" ", 1)[0] + "…"


def recommend_group(g: GroupAnalysis, rows: Mapping[str, Mapping[str, Any]] | None = None,
                    bound: QualityBound | None = None, lower: Sequence[GroupAnalysis] = ()) -> Recommendation:
    """The recommendation of one (device, model, top-k) group; `rows` are the run table's rows by
    run id (for the runs' own argv). With a quality `bound`, a lossy setting within it may be named
    beside the default (`lossy_alternative`), from this group's lossy points and the `lower` top-k
    groups of the same device, model and apps."""
    rows = rows or {}
    b = g.boundary
    cycle = g.cycle_mib
    reserve, reserve_text = _reserve_mib(g)
    reasons: list[str] = []
    under = tuple(sorted({p.budget_mib for p in g.points if p.under_cycle}))
    safe = b.largest_safe_mib
    auto: AutoChoice | None = None
    if b.fought:
        reasons.append(f"not counted as safe: {b.fought_text()} (a budget the device fights over is "
                       "swapped out and faulted back, or its dense weights re-read, during the decode)")
    if b.app_killed_mib is not None:
        reasons.append(f"not counted as safe: at {b.app_killed_mib:g} MiB and over, lmkd would kill the app "
                       f"({b.app_reason}): replayed from the runs' samples, since over adb lmkd never "
                       "considers the engine")
    if b.unfilled:
        reasons.append(f"not counted as safe: {b.unfilled_text()}; those caches never filled in "
                       f"{g.tokens_min:.0f} tokens, so surviving them proves only what they held "
                       "(more tokens, e.g. --preset publish, fill them)")
    if safe is None:
        cache_off = True
        summary = ("no budget survived every run: --cache-mb 0" if not b.unfilled else
                   "no budget survived with its cache filled: --cache-mb 0")
        killed_at = (f" (killed at {b.smallest_killed_mib:g} MiB)" if b.smallest_killed_mib is not None else "") + (
            f" ({b.fought_text()})" if b.fought else "")
        reason = (f"no cache budget survived every repeat{killed_at}: recommend --cache-mb 0" if not b.unfilled else
                  f"no cache budget was proven safe{killed_at}: {b.unfilled_text()}, surviving every repeat without "
                  "filling, which proves nothing over what it held: recommend --cache-mb 0")
    elif not math.isnan(cycle) and safe < cycle:
        cache_off = True
        summary = f"nothing safe clears the {cycle:g} MiB cycle: --cache-mb 0"
        reason = (f"no budget that survived every repeat clears the {cycle:g} MiB token cycle (the largest, "
                  f"{safe:g} MiB, is under it"
                  + (f"; {b.smallest_killed_mib:g} MiB was killed" if b.smallest_killed_mib is not None else "")
                  + f"): below the cycle the LRU evicts what it needs next, so {UNDER}")
    elif safe < 1:
        cache_off = True
        summary = f"the largest safe budget, {safe:g} MiB, is under 1 MiB: --cache-mb 0"
        reason = (f"the largest budget that survived every repeat, {safe:g} MiB, is under 1 MiB: --cache-ceil-mb "
                  "takes whole MiB and 0 there means no ceiling at all, so no auto line can hold it: "
                  "recommend --cache-mb 0")
    else:
        cache_off = False
        floor = b.floor_kb_at_safe / 1024 if b.floor_kb_at_safe is not None else None
        if math.isnan(reserve):
            margin = 0.1 * safe
            margin_why = "device RAM unknown: 10% of the budget kept back"
        elif floor is None:
            margin = reserve
            margin_why = f"MemAvailable floor unknown: the whole reserve ({reserve_text}) kept back"
        else:
            margin = max(0.0, reserve - floor)
            margin_why = (f"MemAvailable fell to {floor:.0f} MiB at {safe:g} MiB, "
                          + (f"{margin:.0f} MiB short of the reserve ({reserve_text})" if margin > 0 else
                             f"above the reserve ({reserve_text}): no margin needed"))
        ceiling = ceiling_mib(safe, margin)
        clamped = not math.isnan(cycle) and ceiling < cycle
        if clamped:
            # held at the cycle, rounded up; never above what survived (a safe budget a fraction of a
            # MiB over the cycle keeps its own whole MiB)
            ceiling = math.ceil(cycle) if math.ceil(cycle) <= safe else math.floor(safe)
        unfilled = f"; {b.unfilled_text()}: survived without filling, unproven" if b.unfilled else ""
        killed = (f", under {b.app_killed_mib:g} MiB, where in the app lmkd would kill the app{unfilled}"
                  if b.app_killed_mib is not None and (not b.fought or b.app_killed_mib <= b.fought[0][0]) and
                  (b.smallest_killed_mib is None or b.app_killed_mib <= b.smallest_killed_mib) else
                  f", under {b.fought_text()}{unfilled}" if b.fought else
                  f", under the {b.killed_text()}{unfilled}"
                  if b.smallest_killed_mib is not None else
                  f", the largest whose cache filled (no kill seen{unfilled})" if b.unfilled else
                  ", the largest measured (no kill seen)")
        why = (f"{safe:g} MiB survived all {b.safe_repeats} run(s){killed}; {margin_why}"
               + (f"; held at the {cycle:g} MiB cycle ({'the margin' if margin > 0 else 'rounding down'} would "
                  "cross it)" if clamped else ""))
        auto = AutoChoice(ceiling, (), "", (), safe, floor, reserve, margin, clamped, why)
        summary = f"{safe:g} MiB survived every run" + (
            f" ({b.smallest_killed_mib:g} was killed)" if b.smallest_killed_mib is not None else "") + (
            f"; {margin:.0f} MiB kept back" if margin > 0.5 else "")
        reason = f"ceiling {ceiling} MiB: {why}"
        if clamped:
            reasons.append("the safety margin was squeezed by the token cycle")
        if b.smallest_killed_mib is None:
            reasons.append("no kill observed: " + ("the budgets above the largest filled one never filled"
                                                   if b.unfilled else "budgets above the largest measured were not tried"))
    dense = g.dense.best
    fixed: FixedChoice | None
    if auto is None:                      # cache off
        fixed = _cache_off_choice(g, dense, rows)
    else:
        fixed = _fixed(g, float(auto.cache_ceil_mb), dense, rows)
        if fixed is None:
            reasons.append("no fixed budget between the cycle and the ceiling finished every run: only the auto "
                           "line is recommended")
        settings, source, ids = _auto(g, auto.cache_ceil_mb, fixed.series if fixed else None, dense,
                                      auto.largest_safe_mib, rows)
        auto = replace(auto, argv=settings, argv_source=source, run_ids=ids)

    if g.apps:                             # the load it was measured under is part of the answer
        reason = f"{load_text(g.apps)}: {reason}"
        summary = f"{load_text(g.apps)}: {summary}"
    confidence, why_not = _confidence(g, fixed, auto)
    replay = None
    if g.replay is not None:
        r = g.replay
        replay = ReplayCitation(
            r.run_id, r.cycle_mib, r.knee_mib, r.first_decode_hit_mib,
            (r.hit_at(fixed.cache_mb) if fixed.cache_mb > 0 else 0.0) if fixed is not None else None,
            r.hit_at(auto.cache_ceil_mb) if auto is not None else None,
            None if fixed is None or math.isnan(fixed.hit_pct) else fixed.hit_pct)
    pts_safe = _points_at(g, safe) if safe is not None else []
    rung = app_rung(g.points, b, float(auto.cache_ceil_mb) if auto is not None else 0.0, cycle)
    evidence = {
        "runs": g.n_runs, "campaigns": list(g.campaigns), "engines": list(g.engines),
        "budgets_mib": sorted({p.budget_mib for p in g.points if not math.isnan(p.budget_mib)}),
        "repeats_at_largest_safe": b.safe_repeats,
        "spread_pct_at_largest_safe": max([p.spread_pct for p in pts_safe], default=0.0),
        "spread_pct_at_fixed": fixed.spread_pct if fixed is not None else None, "tokens_min": g.tokens_min,
        "killed_runs": list(b.killed_run_ids), "kill_evidence": list(b.evidence[:3]),
        "tells": [t.message for t in g.tells],
    }
    return Recommendation(
        device=g.device, model=g.model, top_k=g.top_k, cycle_mib=cycle, cycle_source=g.cycle_source,
        cache_off=cache_off, summary=_short(summary), reason=reason, fixed=fixed, auto=auto, dense_mode=dense,
        dense_text=g.dense.text(),
        dense_modes=tuple({"mode": m.mode, "tok_s": m.tok_s, "majflt_per_tok": m.majflt_per_tok, "runs": m.runs,
                           "ok": m.ok} for m in g.dense.modes),
        lmk={"smallest_killed_mib": b.smallest_killed_mib, "largest_safe_mib": b.largest_safe_mib,
             "floor_mib_at_safe": b.floor_kb_at_safe / 1024 if b.floor_kb_at_safe is not None else None,
             "unfilled": [{"budget_mib": budget, "held_mib": held} for budget, held in b.unfilled],
             "fought": [{"budget_mib": budget, "reason": why} for budget, why in b.fought],
             "killed_by": b.killed_by, "app_killed_mib": b.app_killed_mib, "app_reason": b.app_reason,
             "app_replayed": b.app_replayed, "adb_text": b.adb_text(), "app_text": b.app_text(), "text": b.text()},
        under_cycle_budgets_mib=under, evidence=evidence, confidence=confidence,
        confidence_reasons=tuple(reasons + why_not), replay=replay, apps=g.apps, app_rung_mb=rung.rung_mb,
        app_rung_reason=rung.reason, planner=tuple(p.to_dict() for p in g.planner),
        predicted=_predicted(g, dense, fixed, b.largest_safe_mib),
        lossy_alternative=_alternative(g, bound, fixed, auto, dense, lower, rows) if bound is not None else None)


def _predicted(g: GroupAnalysis, dense: str | None, fixed: FixedChoice | None,
               safe: float | None) -> PredictedChoice | None:
    """The model's view beside the measured choice: its prediction at the measured budgets the
    recommendation rests on, with the error against the measured median (docs/prediction.md)."""
    pred = next((p for p in g.predictions if p.dense_weights == dense), g.predictions[0] if g.predictions else None)
    if pred is None:
        return None

    def at(budget: float | None) -> tuple[float | None, float | None]:
        points = [p for p in _in_dense(_points_at(g, budget), dense) if not math.isnan(p.predicted_s_per_tok)] \
            if budget is not None else []
        if not points:
            return None, None
        error = points[0].prediction_error_pct
        return points[0].predicted_s_per_tok, None if math.isnan(error) else error

    at_fixed = at(float(fixed.cache_mb)) if fixed is not None and fixed.measured else (None, None)
    at_safe = at(safe)
    return PredictedChoice(pred.dense_weights, pred.probe_run_id, pred.cache0_run_id,
                           g.replay.knee_mib if g.replay is not None else None, pred.working_set_mib,
                           *at_fixed, *at_safe)


UNDER = "--cache-mb 0 is strictly better: the same reads with no RAM and no cache management"


def _confidence(g: GroupAnalysis, fixed: FixedChoice | None, auto: AutoChoice | None) -> tuple[str, list[str]]:
    level = 2
    why: list[str] = []

    def cap(to: int, reason: str) -> None:
        nonlocal level
        if to < level:
            level = to
        why.append(reason)

    b = g.boundary
    repeats = b.safe_repeats if auto is not None else (fixed.runs if fixed is not None else 0)
    if repeats < 2:
        cap(0, f"{repeats} run(s) behind the recommended budget")
    elif repeats < 3:
        cap(1, f"only {repeats} runs behind the recommended budget")
    at = _points_at(g, b.largest_safe_mib) if auto is not None and b.largest_safe_mib is not None else []
    spread = max([p.spread_pct for p in at] + [fixed.spread_pct if fixed is not None else 0.0])
    if spread > MEDIUM_SPREAD_PCT:
        cap(0, f"tok/s spread {spread:.0f}% between repeats")
    elif spread > HIGH_SPREAD_PCT:
        cap(1, f"tok/s spread {spread:.0f}% between repeats")
    if not math.isnan(g.tokens_min) and g.tokens_min < PUBLISHED_MIN_TOKENS:
        cap(1, f"probe runs ({g.tokens_min:.0f} tokens < {PUBLISHED_MIN_TOKENS}): the cache may not be in steady state")
    if math.isnan(g.cycle_mib):
        cap(0, "the token cycle is unknown (no preamble key, no reachable GGUF, no token_demand_MiB)")
    elif g.cycle_source == "token_demand":
        cap(1, "the cycle is the measured token_demand_MiB, not the worst case priced from the model")
    if auto is not None and auto.floor_mib is None:
        cap(1, "no MemAvailable floor recorded at the largest safe budget")
    if g.tells:
        cap(0, "contamination tells: " + "; ".join(sorted({t.kind for t in g.tells})))
    return CONFIDENCE[level], why


def recommendations_from(analysis: Analysis, campaigns: Sequence[dict] | None = None,
                         identities: Mapping[str, Mapping[str, Any]] | None = None,
                         bound: QualityBound | None = None) -> Recommendations:
    """Every group's recommendation, per device with its default, and the fleet's rule for phones
    never measured (`identities`: what each device reports, by name); with a quality `bound`, each
    names a lossy alternative within it where one was measured faster (recommend_group)."""
    rows = {r[C.run_id]: r for r in row_views(analysis.table)}
    # what the app's default dropping costs where it was measured (the app preset runs it: results.analysis.app_drop)
    costs = app_costs(analysis.table)
    by_device: dict[str, list[Recommendation]] = {}
    ram: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for g in analysis.groups:
        if not any(p.ok or p.killed for p in g.points):
            continue                      # no streamed run finished or was killed: nothing to size from
        lower = [o for o in analysis.groups if (o.device, o.model, o.apps) == (g.device, g.model, g.apps)
                 and o.top_k is not None and g.top_k is not None and o.top_k < g.top_k]
        rec = recommend_group(g, rows, bound, lower)
        drop = tuple(c.text for c in costs if (c.device, c.model, c.apps, c.top_k) == (g.device, g.model, g.apps, g.top_k))
        by_device.setdefault(g.device, []).append(replace(rec, app_drop=drop) if drop else rec)
        ram[g.device] = g.ram_total_kb
    for r in rows.values():
        kinds.setdefault(r[C.device], str(r.get(C.device_kind) or ""))
    devices = []
    for d, recs in sorted(by_device.items()):
        ident = identity_of((identities or {}).get(d) or {"kind": kinds.get(d), "ram_total_kb": ram[d]})
        if ident["mem_total_kb"] is None and not math.isnan(ram[d]):
            ident["mem_total_kb"] = int(ram[d])
        devices.append(DeviceRecommendations(d, ident, ram[d], device_default(recs), tuple(recs)))
    return Recommendations(tuple(devices), tuple(campaigns if campaigns is not None else
                                                 campaign_summaries(analysis.table)),
                           fleet_rules(devices, rule_floors(devices, rows)))


def rule_floors(devices: Sequence[DeviceRecommendations], rows: Mapping[str, Mapping[str, Any]]) -> list[float]:
    """The --cache-floor-mb of the runs the devices' auto lines carry (the rule's cache_floor_mb is
    the smallest); `rows`: the run table's rows by run id."""
    return [float(v) for v in (rows[r].get("cache_floor_mb") for d in devices for rec in d.recommendations
                               if rec.auto is not None for r in rec.auto.run_ids if r in rows)
            if v is not None and _text(v)]


def recommend(dirs: Sequence[str | Path], model_files: Mapping[str, str] | None = None,
              verify: Verify | None = None, max_quality_loss: QualityBound | None = None,
              table: pd.DataFrame | None = None) -> Recommendations:
    """`bmoe-fleet recommend`: campaign directories in, recommendations out; `verify` (harness.run.verify's
    `recommend --verify`) then gets them with the campaigns they came from; `max_quality_loss`
    (results.analysis.quality.parse_bound) lets each name a lossy alternative within it. `table`: their
    run table as the results database gave it (then no run folder is listed: the campaigns' own
    records are what the recommendations read of them)."""
    camps = read_campaigns(list(dirs)) if table is None else campaign_heads(list(dirs))
    table = build_table(camps, model_files) if table is None else table
    recs = recommendations_for(camps, analyze(table), max_quality_loss)
    return verify(recs, camps) if verify is not None else recs


def recommendations_for(camps: Sequence[CampaignData], analysis: Analysis,
                        bound: QualityBound | None = None) -> Recommendations:
    """Recommendations of campaigns already read and analysed, with the devices' own identities,
    every string redacted for publishing (results.publish)."""
    identities: dict[str, dict[str, Any]] = {}
    for c in camps:
        for name, record in c.devices.items():
            identities.setdefault(name, dict(record))
    recs = recommendations_from(analysis, None, identities, bound)
    return redact(recs, Redactor(camps))


def redact(recs: Recommendations, redactor: Redactor) -> Recommendations:
    """Every string a recommendation publishes with this host's paths replaced."""
    devices = []
    for d in recs.devices:
        out = []
        for r in d.recommendations:
            out.append(replace(r, reason=redactor.text(r.reason), evidence=redactor.value(r.evidence),
                               app_rung_reason=redactor.text(r.app_rung_reason),
                               app_drop=tuple(redactor.text(x) for x in r.app_drop),
                               confidence_reasons=tuple(redactor.text(x) for x in r.confidence_reasons),
                               lmk=redactor.value(r.lmk), planner=tuple(redactor.value(p) for p in r.planner)))
        devices.append(replace(d, recommendations=tuple(out),
                               default=replace(d.default, notes=tuple(redactor.text(n) for n in d.default.notes))))
    return replace(recs, devices=tuple(devices))
