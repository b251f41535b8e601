"""Per-device cache recommendations from the analysis, with their evidence (docs/results.md).

For each (device, model, top-k):

- the ceiling N for `--cache-mb auto --cache-ceil-mb N`: the largest budget that survived every
  repeat (results.analyze.LmkBoundary), minus the safety margin — the shortfall of the
  MemAvailable floor that budget reached against a reserve of RESERVE_FRACTION of the device's
  RAM — rounded down, and never under the token cycle;
- if no budget that survived clears the cycle, `--cache-mb 0`, with the reason;
- the fixed `--cache-mb`: the fastest measured budget at or under N (0 included), where a budget
  within noise of a faster one loses to the smaller (less RAM, further from the killer);
- the dense mode that measured fastest;
- a confidence word (high / medium / low) with the reasons it is not higher;
- when a route trace of that device and model exists, the replayed LRU curve's prediction at the
  recommended budgets and its knee.

Per device, the default ceiling an app would ship for that phone is the smallest of its models'
ceilings; models whose cycle sits above it are named (they want `--cache-mb 0` there).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from results.analyze import Analysis, BudgetPoint, GroupAnalysis, analyze, differs
from results.tokens import PUBLISHED_MIN_TOKENS

FORMAT = "bmoe-fleet.recommendations"
FORMAT_VERSION = 1
RESERVE_FRACTION = 0.10
HIGH_SPREAD_PCT = 10.0
MEDIUM_SPREAD_PCT = 25.0
CONFIDENCE = ("low", "medium", "high")


def round_down(mib: float) -> int:
    """Whole MiB on a step that reads like a setting: 1 MiB under 200, 10 under 2000, 50 above."""
    step = 1 if mib < 200 else 10 if mib < 2000 else 50
    return int(math.floor(mib / step + 1e-9) * step)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN becomes null, tuples lists, floats rounded for reading."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 3)
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


@dataclass(frozen=True)
class FixedChoice:
    cache_mb: int
    argv: tuple[str, ...]
    measured: bool
    tok_s: float
    hit_pct: float
    runs: int
    spread_pct: float
    why: str


@dataclass(frozen=True)
class AutoChoice:
    cache_ceil_mb: int
    argv: tuple[str, ...]
    largest_safe_mib: float
    floor_mib: float | None
    reserve_mib: float
    margin_mib: float
    clamped_to_cycle: bool
    why: str


@dataclass(frozen=True)
class ReplayCitation:
    trace: str
    run_id: str
    cycle_mib: float
    knee_mib: float | None
    first_decode_hit_mib: float | None
    predicted_hit_pct_at_fixed: float | None
    predicted_hit_pct_at_ceiling: float | None
    measured_hit_pct_at_fixed: float | None


@dataclass(frozen=True)
class Recommendation:
    device: str
    model: str
    top_k: int | None
    cycle_mib: float
    cycle_source: str
    cache_off: bool
    reason: str
    fixed: FixedChoice
    auto: AutoChoice | None
    dense_mode: str | None
    dense_text: str
    dense_modes: tuple[dict, ...]
    lmk: dict
    under_cycle_budgets_mib: tuple[float, ...]
    evidence: dict
    confidence: str
    confidence_reasons: tuple[str, ...]
    replay: ReplayCitation | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fixed"]["argv"] = list(self.fixed.argv)
        if self.auto is not None:
            d["auto"]["argv"] = list(self.auto.argv)
        return _clean(d)


@dataclass(frozen=True)
class DeviceDefault:
    cache_ceil_mb: int | None
    argv: tuple[str, ...]
    text: str
    notes: tuple[str, ...]


@dataclass(frozen=True)
class DeviceRecommendations:
    device: str
    ram_total_kb: float
    default: DeviceDefault
    recommendations: tuple[Recommendation, ...]

    def to_dict(self) -> dict[str, Any]:
        return _clean({"device": self.device, "ram_total_kb": self.ram_total_kb,
                       "default": {"cache_ceil_mb": self.default.cache_ceil_mb, "argv": list(self.default.argv),
                                   "text": self.default.text, "notes": list(self.default.notes)},
                       "recommendations": [r.to_dict() for r in self.recommendations]})


@dataclass(frozen=True)
class Recommendations:
    devices: tuple[DeviceRecommendations, ...]
    campaigns: tuple[dict, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION,
                "rules": {"reserve_fraction_of_ram": RESERVE_FRACTION, "published_min_tokens": PUBLISHED_MIN_TOKENS,
                          "high_spread_pct": HIGH_SPREAD_PCT, "medium_spread_pct": MEDIUM_SPREAD_PCT},
                "campaigns": list(self.campaigns), "devices": [d.to_dict() for d in self.devices]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    def all(self) -> list[Recommendation]:
        return [r for d in self.devices for r in d.recommendations]

    def find(self, device: str, model: str, top_k: int | None) -> Recommendation:
        for r in self.all():
            if (r.device, r.model, r.top_k) == (device, model, top_k):
                return r
        raise KeyError((device, model, top_k))

    def text(self) -> str:
        lines = []
        for d in self.devices:
            ram = f", {d.ram_total_kb / 1024 / 1024:.1f} GiB RAM" if not math.isnan(d.ram_total_kb) else ""
            lines.append(f"{d.device}{ram}: default {d.default.text}")
            for note in d.default.notes:
                lines.append(f"  note: {note}")
            for r in d.recommendations:
                k = f"top-k {r.top_k}" if r.top_k is not None else "default top-k"
                auto = " ".join(r.auto.argv) if r.auto else "no auto ceiling"
                lines.append(f"  {r.model} ({k}, cycle {_mib(r.cycle_mib)}): {' '.join(r.fixed.argv)} | {auto} | "
                             f"dense {r.dense_mode or '?'} | {r.confidence}")
                lines.append(f"    {r.reason}")
        return "\n".join(lines)


def _mib(x: float) -> str:
    return "unknown" if x is None or math.isnan(x) else f"{x:g} MiB"


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


def _fixed(g: GroupAnalysis, ceiling: float | None, dense: str | None) -> FixedChoice:
    """The fastest measured budget in {0} ∪ [cycle, ceiling] whose every run finished."""
    pts = [p for p in g.points if p.ok == p.runs and p.ok > 0 and not math.isnan(p.tok_s)]
    if dense:
        mine = [p for p in pts if f"dense={dense}" in p.series or "dense=" not in p.series]
        pts = mine or pts
    cands = [p for p in pts if p.budget_mib == 0 or (
        ceiling is not None and (math.isnan(g.cycle_mib) or p.budget_mib >= g.cycle_mib)
        and p.budget_mib <= ceiling + 1e-9)]
    if not cands:
        if ceiling is not None:
            return FixedChoice(int(ceiling), ("--cache-mb", str(int(ceiling))), False, math.nan, math.nan, 0, 0.0,
                               "no fixed budget at or under the ceiling was measured: use the ceiling itself")
        return FixedChoice(0, ("--cache-mb", "0"), False, math.nan, math.nan, 0, 0.0,
                           "no budget that survived clears the token cycle")
    best = max(cands, key=lambda p: p.tok_s)
    # the smallest budget within noise of the fastest wins: the same speed for less RAM
    near = [p for p in cands if p is best or not differs(list(p.tok_s_values), list(best.tok_s_values))[0]]
    choice = min(near, key=lambda p: p.budget_mib)
    mib = round_down(choice.budget_mib) if choice.budget_mib > 0 else 0
    why = (f"fastest measured: {choice.tok_s:.3g} tok/s over {choice.ok} run(s)" if choice is best else
           f"within noise of the fastest ({best.label}, {best.tok_s:.3g} tok/s) with less RAM")
    if choice.flags:                          # the engine flags the fastest series ran with go along
        why += f", with {shlex.join(choice.flags)}"
    return FixedChoice(mib, ("--cache-mb", str(mib)) + choice.flags, True, choice.tok_s, choice.hit_pct, choice.ok,
                       choice.spread_pct, why)


def recommend_group(g: GroupAnalysis) -> Recommendation:
    b = g.boundary
    cycle = g.cycle_mib
    reserve, reserve_text = _reserve_mib(g)
    reasons: list[str] = []
    under = tuple(sorted({p.budget_mib for p in g.under_cycle_points}))
    safe = b.largest_safe_mib
    auto = None
    if safe is None:
        cache_off = True
        reason = ("no cache budget survived every repeat" + (f" (killed at {b.smallest_killed_mib:g} MiB)"
                                                             if b.smallest_killed_mib is not None else "")
                  + ": recommend --cache-mb 0")
    elif not math.isnan(cycle) and safe < cycle:
        cache_off = True
        reason = (f"no budget that survived every repeat clears the {cycle:g} MiB token cycle (the largest, "
                  f"{safe:g} MiB, is under it"
                  + (f"; {b.smallest_killed_mib:g} MiB was killed" if b.smallest_killed_mib is not None else "")
                  + f"): below the cycle the LRU evicts what it needs next, so {UNDER}")
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
        ceiling = round_down(safe - margin)
        clamped = not math.isnan(cycle) and ceiling < cycle
        if clamped:
            ceiling = int(math.ceil(cycle))
        killed = f", under the {b.smallest_killed_mib:g} MiB that was killed" \
            if b.smallest_killed_mib is not None else ", the largest measured (no kill seen)"
        why = (f"{safe:g} MiB survived all {b.safe_repeats} run(s){killed}; {margin_why}"
               + (f"; held at the {cycle:g} MiB cycle (the margin would cross it)" if clamped else ""))
        auto = AutoChoice(ceiling, ("--cache-mb", "auto", "--cache-ceil-mb", str(ceiling)), safe, floor,
                          reserve, margin, clamped, why)
        reason = f"ceiling {ceiling} MiB: {why}"
        if clamped:
            reasons.append("the safety margin was squeezed by the token cycle")
        if b.smallest_killed_mib is None:
            reasons.append("no kill observed: budgets above the largest measured were not tried")
    fixed = _fixed(g, None if cache_off else float(auto.cache_ceil_mb), g.dense.best) if not cache_off else \
        FixedChoice(0, ("--cache-mb", "0"), any(p.budget_mib == 0 for p in g.points),
                    next((p.tok_s for p in g.points if p.budget_mib == 0), math.nan), math.nan,
                    next((p.ok for p in g.points if p.budget_mib == 0), 0), 0.0, UNDER)

    confidence, why_not = _confidence(g, fixed, auto)
    replay = None
    if g.replay is not None:
        r = g.replay
        replay = ReplayCitation(
            r.trace_path, r.run_id, r.cycle_mib, r.knee_mib, r.first_decode_hit_mib,
            r.hit_at(fixed.cache_mb) if fixed.cache_mb > 0 else 0.0,
            r.hit_at(auto.cache_ceil_mb) if auto is not None else None,
            None if math.isnan(fixed.hit_pct) else fixed.hit_pct)
    pts_safe = _points_at(g, safe) if safe is not None else []
    evidence = {
        "runs": g.n_runs, "campaigns": list(g.campaigns), "engines": list(g.engines),
        "budgets_mib": sorted({p.budget_mib for p in g.points if not math.isnan(p.budget_mib)}),
        "repeats_at_largest_safe": b.safe_repeats,
        "spread_pct_at_largest_safe": max([p.spread_pct for p in pts_safe], default=0.0),
        "spread_pct_at_fixed": fixed.spread_pct, "tokens_min": g.tokens_min,
        "killed_runs": list(b.killed_run_ids), "kill_evidence": list(b.evidence[:3]),
        "tells": [t.message for t in g.tells],
    }
    return Recommendation(
        device=g.device, model=g.model, top_k=g.top_k, cycle_mib=cycle, cycle_source=g.cycle_source,
        cache_off=cache_off, reason=reason, fixed=fixed, auto=auto, dense_mode=g.dense.best, dense_text=g.dense.text(),
        dense_modes=tuple({"mode": m.mode, "tok_s": m.tok_s, "majflt_per_tok": m.majflt_per_tok, "runs": m.runs,
                           "ok": m.ok} for m in g.dense.modes),
        lmk={"smallest_killed_mib": b.smallest_killed_mib, "largest_safe_mib": b.largest_safe_mib,
             "floor_mib_at_safe": b.floor_kb_at_safe / 1024 if b.floor_kb_at_safe is not None else None,
             "text": b.text()},
        under_cycle_budgets_mib=under, evidence=evidence, confidence=confidence,
        confidence_reasons=tuple(reasons + why_not), replay=replay)


UNDER = "--cache-mb 0 is strictly better: the same reads with no RAM and no cache management"


def _confidence(g: GroupAnalysis, fixed: FixedChoice, auto: AutoChoice | None) -> tuple[str, list[str]]:
    level = 2
    why: list[str] = []

    def cap(to: int, reason: str) -> None:
        nonlocal level
        if to < level:
            level = to
        why.append(reason)

    b = g.boundary
    repeats = b.safe_repeats if auto is not None else fixed.runs
    if repeats < 2:
        cap(0, f"{repeats} run(s) behind the recommended budget")
    elif repeats < 3:
        cap(1, f"only {repeats} runs behind the recommended budget")
    at = _points_at(g, b.largest_safe_mib) if auto is not None and b.largest_safe_mib is not None else []
    spread = max([p.spread_pct for p in at] + [fixed.spread_pct])
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


# ── per device ───────────────────────────────────────────────────────────────────────────────


def _device_default(recs: Sequence[Recommendation]) -> DeviceDefault:
    ceilings = [r for r in recs if r.auto is not None]
    if not ceilings:
        return DeviceDefault(None, ("--cache-mb", "0"), "--cache-mb 0 (no model has a safe budget over its cycle)",
                             tuple(f"{r.model}: {r.reason}" for r in recs))
    lowest = min(ceilings, key=lambda r: r.auto.cache_ceil_mb)
    d = lowest.auto.cache_ceil_mb
    notes = []
    for r in recs:
        k = f" at top-k {r.top_k}" if r.top_k is not None else ""
        if r.cache_off:
            notes.append(f"{r.model}{k}: ship --cache-mb 0 ({r.reason.split(':')[0]})")
        elif not math.isnan(r.cycle_mib) and d < r.cycle_mib:
            notes.append(f"{r.model}{k}: the default {d} MiB sits under its {r.cycle_mib:g} MiB cycle; ship "
                         "--cache-mb 0 for it")
    text = f"--cache-mb auto --cache-ceil-mb {d} (the lowest safe ceiling of its models: {lowest.model}" \
           + (f" at top-k {lowest.top_k}" if lowest.top_k is not None else "") + ")"
    return DeviceDefault(d, ("--cache-mb", "auto", "--cache-ceil-mb", str(d)), text, tuple(notes))


def recommendations_from(analysis: Analysis, campaigns: Sequence[dict] = ()) -> Recommendations:
    by_device: dict[str, list[Recommendation]] = {}
    ram: dict[str, float] = {}
    for g in analysis.groups:
        if not any(p.ok or p.killed for p in g.points):
            continue                      # no streamed run finished or was killed: nothing to size from
        by_device.setdefault(g.device, []).append(recommend_group(g))
        ram[g.device] = g.ram_total_kb
    devices = tuple(DeviceRecommendations(d, ram[d], _device_default(recs), tuple(recs))
                    for d, recs in sorted(by_device.items()))
    return Recommendations(devices, tuple(campaigns))


def recommend(dirs: Sequence[str | Path], model_files: Mapping[str, str] | None = None) -> Recommendations:
    """`bmoe-fleet recommend`: campaign directories in, recommendations out."""
    from results.rundir import read_campaigns
    from results.table import build_table

    camps = read_campaigns(list(dirs))
    table = build_table(camps, model_files)
    return recommendations_from(analyze(table), [{"label": c.label, "dir": str(c.root)} for c in camps])
