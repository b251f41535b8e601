"""Per-device cache recommendations from the analysis, with their evidence (docs/results.md).

For each (device, model, top-k):

- the ceiling N for `--cache-mb auto --cache-ceil-mb N`: the largest budget that survived every
  repeat (results.analyze.LmkBoundary), minus the safety margin — the shortfall of the
  MemAvailable floor that budget reached against a reserve of RESERVE_FRACTION of the device's
  RAM — rounded down, and never under the token cycle;
- if no budget that survived clears the cycle, `--cache-mb 0`, with the reason;
- the fixed `--cache-mb`: the fastest measured budget in {0} ∪ [cycle, N], where a budget within
  noise of a faster one loses to the smaller (less RAM, further from the killer);
- the dense mode that measured fastest;
- a confidence word (high / medium / low) with the reasons it is not higher;
- when a route trace of that device and model exists, the replayed LRU curve's prediction at the
  recommended budgets and its knee.

Every command line is the one that was measured (issue 12): the settings of the chosen runs' own
argv — budget as asked, `--force-cache`, floor, top-k, dense mode, lanes, threads, engine
arguments and flags — with only the run's own files, prompt and token count left out, and for
`auto` the ceiling set to N. A fixed budget is always a budget those runs used (never rounded,
so never under the cycle); imported runs, which kept no argv, get theirs rebuilt from their
configuration and say so.

Per device, the default ceiling an app would ship for that phone is the smallest of its models'
ceilings; models whose cycle sits above it are named (they want `--cache-mb 0` there). Devices
carry the identity the phone reports (manufacturer, model, SoC, ABI, MemTotal), not the fleet's
serial, and `rules` gives a phone never measured its ceiling from its MemTotal: the lower
envelope of the measured phones' defaults (see fleet_rules). recommendations.json (version 2)
holds no host path: campaigns are named by label (results.publish).
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.budget import CACHE_MIN_MB
from results.analyze import Analysis, BudgetPoint, GroupAnalysis, _text, analyze, differs
from results.numbers import json_safe
from results.tokens import PUBLISHED_MIN_TOKENS

FORMAT = "bmoe-fleet.recommendations"
FORMAT_VERSION = 2
SCHEMA = "results/schemas/recommendations-v2.schema.json"   # in the repository, and installed with results
RESERVE_FRACTION = 0.10
HIGH_SPREAD_PCT = 10.0
MEDIUM_SPREAD_PCT = 25.0
CONFIDENCE = ("low", "medium", "high")
PHONE_KINDS = ("adb", "virtual")      # devices an app could be running on (not this host, not imports)
SAME_PHONE_RAM_FRACTION = 0.03        # MemTotal within 3 %: the same phone model with the same RAM
# argv elements that belong to one run, not to its settings: its files, prompt and length
RUN_ONLY = frozenset({"-m", "--model", "-p", "--prompt", "-n", "--n-predict", "--csv", "--route-trace"})


def round_down(mib: float) -> int:
    """Whole MiB on a step that reads like a setting: 1 MiB under 200, 10 under 2000, 50 above."""
    step = 1 if mib < 200 else 10 if mib < 2000 else 50
    return int(math.floor(mib / step + 1e-9) * step)


def needs_force(cache_mb: float) -> bool:
    """Both engines refuse a fixed budget in 1..CACHE_MIN_MB-1 without --force-cache."""
    return 0 < cache_mb < CACHE_MIN_MB


# ── command lines ────────────────────────────────────────────────────────────────────────────


def settings_of(argv: Sequence[str]) -> tuple[str, ...]:
    """A run's settings: its argv without the engine, its files, prompt and token count."""
    out: list[str] = []
    i = 1
    while i < len(argv):
        if argv[i] in RUN_ONLY:
            i += 2
            continue
        out.append(str(argv[i]))
        i += 1
    return tuple(out)


def flag_value(settings: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(settings[:-1]):
        if a == flag:
            return settings[i + 1]
    return None


def _without(settings: Sequence[str], flag: str, takes_value: bool) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(settings):
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        out.append(a)
    return out


def with_fixed_budget(settings: Sequence[str], cache_mb: int) -> tuple[str, ...]:
    """The settings with a fixed `--cache-mb` (and `--force-cache` exactly when the engines need it)."""
    s = _without(_without(_without(_without(settings, "--force-cache", False), "--cache-floor-mb", True),
                          "--cache-ceil-mb", True), "--cache-mb", True)
    at = s.index("--moe-stream") + 1 if "--moe-stream" in s else 0
    if "--moe-stream" not in s:
        s.insert(0, "--moe-stream")
        at = 1
    budget = ["--cache-mb", str(int(cache_mb))] + (["--force-cache"] if needs_force(cache_mb) else [])
    return tuple(s[:at] + budget + s[at:])


def with_auto(settings: Sequence[str], ceil_mb: int, floor_mb: int | None) -> tuple[str, ...]:
    """The settings as `--cache-mb auto` with this ceiling (and the floor they were measured with)."""
    floor = flag_value(settings, "--cache-floor-mb")
    if floor is None and floor_mb is not None:
        floor = str(int(floor_mb))
    s = _without(_without(_without(_without(settings, "--force-cache", False), "--cache-floor-mb", True),
                          "--cache-ceil-mb", True), "--cache-mb", True)
    if "--moe-stream" not in s:
        s.insert(0, "--moe-stream")
    at = s.index("--moe-stream") + 1
    auto = ["--cache-mb", "auto"] + (["--cache-floor-mb", floor] if floor is not None else []) + \
        ["--cache-ceil-mb", str(int(ceil_mb))]
    return tuple(s[:at] + auto + s[at:])


def rebuilt_settings(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Settings for a run that kept no argv (imported upstream files), from its configuration."""
    s: list[str] = []
    for flag, key in (("-t", "threads"), ("--n-expert-used", "n_expert_used")):
        if _text(row.get(key)):
            s += [flag, _text(row.get(key))]
    if row.get("moe_stream") is not False:
        budget = row.get("cache_mb_config")
        budget = budget if _text(budget) else row.get("cache_mb")
        if row.get("cache_auto"):
            s += ["--moe-stream", "--cache-mb", "auto"]
            for flag, key in (("--cache-floor-mb", "cache_floor_mb"), ("--cache-ceil-mb", "cache_ceil_mb")):
                if _text(row.get(key)):
                    s += [flag, _text(row.get(key))]
        elif _text(budget):
            s = list(with_fixed_budget(s, int(float(budget))))
        if _text(row.get("io_threads")) and _text(row.get("io_threads")) != "0":
            s += ["--io-threads", _text(row.get("io_threads"))]
    if row.get("dense_weights"):
        s += ["--dense-weights", str(row["dense_weights"])]
    for extra in ("engine_args", "engine_flags"):
        if row.get(extra):
            s += shlex.split(str(row[extra]))
    return tuple(s)


def _argv_of_runs(run_ids: Sequence[str], rows: Mapping[str, Mapping[str, Any]],
                  prefer_ok: bool = True) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """(the settings most of these runs had, "measured" or "rebuilt", the runs that had them)."""
    recs = [rows[r] for r in run_ids if r in rows]
    if prefer_ok and any(r.get("outcome") == "ok" for r in recs):
        recs = [r for r in recs if r.get("outcome") == "ok"]
    measured = [(r["run_id"], settings_of(json.loads(r.get("argv") or "[]"))) for r in recs]
    measured = [(rid, s) for rid, s in measured if s]
    if measured:
        common, _ = Counter(s for _, s in measured).most_common(1)[0]
        return common, "measured", tuple(rid for rid, s in measured if s == common)
    if recs:
        return rebuilt_settings(recs[0]), "rebuilt", tuple(r["run_id"] for r in recs)
    return (), "rebuilt", ()


# ── records ──────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class FixedChoice:
    cache_mb: int
    argv: tuple[str, ...]
    argv_source: str                  # "measured": the runs' own settings; "rebuilt": from their config
    measured: bool                    # this budget was run (False: cache 0 recommended without a run of it)
    tok_s: float
    hit_pct: float
    runs: int
    spread_pct: float
    run_ids: tuple[str, ...]
    series: str
    why: str


@dataclass(frozen=True)
class AutoChoice:
    cache_ceil_mb: int
    argv: tuple[str, ...]
    argv_source: str                  # "measured auto runs", "measured fixed runs", "rebuilt"
    run_ids: tuple[str, ...]          # the runs whose settings the argv carries
    largest_safe_mib: float
    floor_mib: float | None
    reserve_mib: float
    margin_mib: float
    clamped_to_cycle: bool
    why: str


@dataclass(frozen=True)
class ReplayCitation:
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
    summary: str                      # the why, in one short clause
    reason: str                       # the why, in full
    fixed: FixedChoice | None         # None: no budget in {0} ∪ [cycle, N] was measured to finish
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
    verification: Mapping[str, Any] | None = None   # `recommend --verify`: per argv, accepted or refused

    def argvs(self) -> dict[str, tuple[str, ...]]:
        """The command lines this recommendation makes, by name."""
        out = {}
        if self.fixed is not None:
            out["fixed"] = self.fixed.argv
        if self.auto is not None:
            out["auto"] = self.auto.argv
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verification"] = dict(self.verification) if self.verification is not None else None
        return json_safe(d, 3)


@dataclass(frozen=True)
class DeviceDefault:
    cache_ceil_mb: int | None
    argv: tuple[str, ...]
    text: str
    notes: tuple[str, ...]
    cache_off_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceRecommendations:
    device: str                        # the fleet's name for it (virtual:NAME, a serial, local)
    identity: Mapping[str, Any]        # what the phone reports: manufacturer, model, soc, abi, mem_total_kb
    ram_total_kb: float
    default: DeviceDefault
    recommendations: tuple[Recommendation, ...]

    @property
    def kind(self) -> str:
        return str(self.identity.get("kind") or "")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"device": self.device, "identity": dict(self.identity), "ram_total_kb": self.ram_total_kb,
                          "default": {"cache_ceil_mb": self.default.cache_ceil_mb, "argv": list(self.default.argv),
                                      "text": self.default.text, "notes": list(self.default.notes),
                                      "cache_off_models": list(self.default.cache_off_models)},
                          "recommendations": [r.to_dict() for r in self.recommendations]}, 3)


@dataclass(frozen=True)
class Recommendations:
    devices: tuple[DeviceRecommendations, ...]
    campaigns: tuple[dict, ...] = field(default=())
    rules: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "schema": SCHEMA,
                "method": {"reserve_fraction_of_ram": RESERVE_FRACTION, "published_min_tokens": PUBLISHED_MIN_TOKENS,
                           "high_spread_pct": HIGH_SPREAD_PCT, "medium_spread_pct": MEDIUM_SPREAD_PCT,
                           "same_phone_ram_fraction": SAME_PHONE_RAM_FRACTION},
                "rules": json_safe(dict(self.rules)),   # exact: already rounded the safe way
                "campaigns": [json_safe(c, 3) for c in self.campaigns], "devices": [d.to_dict() for d in self.devices]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

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
                fixed = shlex.join(r.fixed.argv) if r.fixed else "no fixed budget measured"
                auto = shlex.join(r.auto.argv) if r.auto else "no auto ceiling"
                lines.append(f"  {r.model} ({k}, cycle {_mib(r.cycle_mib)}): {fixed} | {auto} | "
                             f"dense {r.dense_mode or '?'} | {r.confidence}")
                lines.append(f"    {r.reason}")
                for name, v in (r.verification or {}).items():
                    lines.append(f"    verify {name}: {v['status']}" + (f" — {v['line']}" if v.get("line") else ""))
        rule = self.rules.get("unmeasured") if self.rules else None
        if rule and rule.get("knots_mib"):
            knots = ", ".join(f"{m:,.0f} MiB → {c:,.0f}" for m, c in rule["knots_mib"][1:])
            lines.append(f"unmeasured phones: --cache-mb auto --cache-ceil-mb from MemTotal, linear through {knots}, "
                         f"+{rule['slope_after']:.3f} per MiB past it"
                         + (f"; --cache-mb 0 under {rule['min_ram_mib']:,} MiB of RAM"
                            if rule.get("min_ram_mib") is not None else ""))
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


def _in_dense(points: Sequence[BudgetPoint], dense: str | None) -> list[BudgetPoint]:
    if not dense:
        return list(points)
    mine = [p for p in points if f"dense={dense}" in p.series or "dense=" not in p.series]
    return mine or list(points)


def _asked_mib(settings: Sequence[str]) -> float | None:
    value = flag_value(settings, "--cache-mb")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _fixed(g: GroupAnalysis, ceiling: float | None, dense: str | None,
           rows: Mapping[str, Mapping[str, Any]]) -> FixedChoice | None:
    """The fastest measured budget in {0} ∪ [cycle, ceiling] whose every run finished, with the
    argv its runs had; None when there is none."""
    pts = [p for p in g.points if not p.auto and p.ok == p.runs and p.ok > 0 and not math.isnan(p.tok_s)]
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
        settings, source, ids = _argv_of_runs(choice.run_ids, rows)
        asked = _asked_mib(settings)
        mib = int(asked) if asked is not None else int(choice.budget_mib)
        if 0 < mib < g.cycle_mib:
            continue                      # never a fixed budget under the cycle (the engine reported another)
        if source == "rebuilt" or asked is None:
            settings = with_fixed_budget(settings, mib)
        why = (f"fastest measured: {choice.tok_s:.3g} tok/s over {choice.ok} run(s)" if choice is best else
               f"within noise of the fastest ({best.label}, {best.tok_s:.3g} tok/s) with less RAM")
        if choice.flags:                  # the engine flags the fastest series ran with go along
            why += f", with {shlex.join(choice.flags)}"
        return FixedChoice(mib, settings, source, True, choice.tok_s, choice.hit_pct, choice.ok, choice.spread_pct,
                           ids, choice.series, why)
    return None


def _cache_off_choice(g: GroupAnalysis, dense: str | None, rows: Mapping[str, Mapping[str, Any]]) -> FixedChoice:
    """`--cache-mb 0` with the flags measured: a cache-0 run's own argv when there is one."""
    zero = _in_dense([p for p in g.points if p.budget_mib == 0 and not p.auto], dense)
    zero.sort(key=lambda p: (-(p.ok == p.runs and p.ok > 0), -p.ok))
    if zero:
        p = zero[0]
        settings, source, ids = _argv_of_runs(p.run_ids, rows)
        return FixedChoice(0, with_fixed_budget(settings, 0) if source == "rebuilt" else settings, source,
                           p.ok > 0, p.tok_s, math.nan, p.ok, p.spread_pct, ids, p.series, UNDER)
    streamed = _in_dense([p for p in g.points if p.ok or p.killed], dense)
    ids = tuple(r for p in streamed for r in p.run_ids)
    settings, source, used = _argv_of_runs(ids, rows)
    return FixedChoice(0, with_fixed_budget(settings, 0), source, False, math.nan, math.nan, 0, 0.0, used,
                       streamed[0].series if streamed else "",
                       UNDER + " (cache 0 itself was not run: the other flags are the measured runs')")


def _auto(g: GroupAnalysis, ceiling: int, series: str | None, dense: str | None, safe: float,
          rows: Mapping[str, Mapping[str, Any]]) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """The argv of `--cache-mb auto --cache-ceil-mb N`: measured auto runs' settings (finished ones
    first) with the ceiling set to N; else the runs at the largest safe budget as auto."""
    def mine(points):
        same = [p for p in points if series is not None and p.series == series]
        return same or _in_dense(points, dense)

    autos = mine([p for p in g.points if p.auto])
    autos.sort(key=lambda p: (-(p.ok == p.runs and p.ok > 0), -p.ok))
    for p in autos:
        settings, source, ids = _argv_of_runs(p.run_ids, rows, prefer_ok=True)
        if settings and source == "measured":
            return with_auto(settings, ceiling, None), "measured auto runs", ids
    at_safe = mine(_points_at(g, safe))
    ids = tuple(r for p in at_safe for r in p.run_ids)
    settings, source, used = _argv_of_runs(ids, rows)
    floors = [rows[r].get("cache_floor_mb") for r in used if r in rows]
    floor = next((int(float(f)) for f in floors if _text(f)), None)
    return with_auto(settings, ceiling, floor), ("measured fixed runs" if source == "measured" else "rebuilt"), used


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[:limit - 1].rsplit(" ", 1)[0] + "…"


def recommend_group(g: GroupAnalysis, rows: Mapping[str, Mapping[str, Any]] | None = None) -> Recommendation:
    rows = rows or {}
    b = g.boundary
    cycle = g.cycle_mib
    reserve, reserve_text = _reserve_mib(g)
    reasons: list[str] = []
    under = tuple(sorted({p.budget_mib for p in g.points if p.under_cycle}))
    safe = b.largest_safe_mib
    auto = None
    if safe is None:
        cache_off = True
        summary = "no budget survived every run: --cache-mb 0"
        reason = ("no cache budget survived every repeat" + (f" (killed at {b.smallest_killed_mib:g} MiB)"
                                                             if b.smallest_killed_mib is not None else "")
                  + ": recommend --cache-mb 0")
    elif not math.isnan(cycle) and safe < cycle:
        cache_off = True
        summary = f"nothing safe clears the {cycle:g} MiB cycle: --cache-mb 0"
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
            # held at the cycle, rounded up; never above what survived (a safe budget a fraction of a
            # MiB over the cycle keeps its own whole MiB)
            ceiling = int(math.ceil(cycle)) if math.ceil(cycle) <= safe else int(math.floor(safe))
        killed = f", under the {b.smallest_killed_mib:g} MiB that was killed" \
            if b.smallest_killed_mib is not None else ", the largest measured (no kill seen)"
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
            reasons.append("no kill observed: budgets above the largest measured were not tried")
    dense = g.dense.best
    if cache_off:
        fixed = _cache_off_choice(g, dense, rows)
    else:
        fixed = _fixed(g, float(auto.cache_ceil_mb), dense, rows)
        if fixed is None:
            reasons.append("no fixed budget between the cycle and the ceiling finished every run: only the auto "
                           "line is recommended")
        settings, source, ids = _auto(g, auto.cache_ceil_mb, fixed.series if fixed else None, dense, safe, rows)
        auto = replace(auto, argv=settings, argv_source=source, run_ids=ids)

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
             "text": b.text()},
        under_cycle_budgets_mib=under, evidence=evidence, confidence=confidence,
        confidence_reasons=tuple(reasons + why_not), replay=replay)


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


# ── per device ───────────────────────────────────────────────────────────────────────────────


def _cache_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """The cache part of an auto argv: what an app's per-phone default sets."""
    out = ["--moe-stream", "--cache-mb", "auto"]
    for flag in ("--cache-floor-mb", "--cache-ceil-mb"):
        v = flag_value(argv, flag)
        if v is not None:
            out += [flag, v]
    return tuple(out)


def _device_default(recs: Sequence[Recommendation]) -> DeviceDefault:
    ceilings = [r for r in recs if r.auto is not None]
    if not ceilings:
        return DeviceDefault(None, ("--moe-stream", "--cache-mb", "0"),
                             "--cache-mb 0 (no model has a safe budget over its cycle)",
                             tuple(f"{r.model}: {r.reason}" for r in recs), tuple(r.model for r in recs))
    lowest = min(ceilings, key=lambda r: r.auto.cache_ceil_mb)
    d = lowest.auto.cache_ceil_mb
    notes, off = [], []
    for r in recs:
        k = f" at top-k {r.top_k}" if r.top_k is not None else ""
        if r.cache_off:
            notes.append(f"{r.model}{k}: ship --cache-mb 0 ({r.reason.split(':')[0]})")
            off.append(r.model)
        elif not math.isnan(r.cycle_mib) and d < r.cycle_mib:
            notes.append(f"{r.model}{k}: the default {d} MiB sits under its {r.cycle_mib:g} MiB cycle; ship "
                         "--cache-mb 0 for it")
            off.append(r.model)
    text = f"--cache-mb auto --cache-ceil-mb {d} (the lowest safe ceiling of its models: {lowest.model}" \
           + (f" at top-k {lowest.top_k}" if lowest.top_k is not None else "") + ")"
    return DeviceDefault(d, _cache_flags(lowest.auto.argv), text, tuple(notes), tuple(dict.fromkeys(off)))


def identity_of(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A device as it reports itself (getprop / /proc): what an app can read on a phone."""
    r = dict(record or {})
    ram = r.get("ram_total_kb")
    return {"kind": str(r.get("kind") or "unknown"), "manufacturer": r.get("manufacturer") or None,
            "model": r.get("model") or None, "soc": r.get("soc") or None, "abi": r.get("abi") or None,
            "android_release": r.get("android_release") or None, "sdk": r.get("sdk"),
            "mem_total_kb": int(ram) if isinstance(ram, (int, float)) and ram and not math.isnan(ram) else None}


def lower_hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull of (x, y) points, left to right (Andrew's monotone chain)."""
    hull: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if hull and hull[-1][0] == x:
            continue                     # same x: the lower one came first
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (y - hull[-2][1])
                                  - (hull[-1][1] - hull[-2][1]) * (x - hull[-2][0])) <= 0:
            hull.pop()
        hull.append((x, y))
    return hull


def envelope_mib(knots: Sequence[Sequence[float]], slope_after: float, mem_mib: float) -> float:
    """The rule's ceiling at a MemTotal: linear between the knots, `slope_after` past the last."""
    last_m, last_c = knots[-1]
    if mem_mib >= last_m:
        return last_c + (mem_mib - last_m) * slope_after
    for (m0, c0), (m1, c1) in zip(knots, knots[1:]):
        if mem_mib < m1:
            return c0 + (mem_mib - m0) * (c1 - c0) / (m1 - m0)
    return last_c


def _min_ram_for(knots: Sequence[Sequence[float]], slope_after: float, ceiling_mib: float) -> float:
    """The smallest MemTotal at which the envelope (non-decreasing) reaches `ceiling_mib`."""
    for (m0, c0), (m1, c1) in zip(knots, knots[1:]):
        if c1 >= ceiling_mib:
            return m0 + (ceiling_mib - c0) * (m1 - m0) / (c1 - c0) if c1 > c0 else m0
    last_m, last_c = knots[-1]
    return last_m + (ceiling_mib - last_c) / slope_after if slope_after > 0 else math.inf


def fleet_rules(devices: Sequence[DeviceRecommendations], floors: Sequence[float] = ()) -> dict[str, Any]:
    """The rule an app applies on a phone never measured, from the phones that were.

    Each measured phone gives a point (MemTotal, its default ceiling). The ceiling for a MemTotal
    is the lower convex hull of those points and the origin: linear between its knots (the
    phones it rests on), at or under every phone measured, rising no faster than the last edge
    (and never faster than MemTotal) past the largest. A model with token cycle C gets a cache
    only where that ceiling reaches C in whole MiB — and never at or under the RAM of a measured
    phone that wanted `--cache-mb 0` for it. Under the smallest such RAM of the fleet's models the
    default is `--cache-mb 0`.
    """
    points = []
    for d in devices:
        mem = d.identity.get("mem_total_kb")
        if d.kind not in PHONE_KINDS or not mem or d.default.cache_ceil_mb is None:
            continue
        killed = any(r.lmk.get("smallest_killed_mib") is not None for r in d.recommendations)
        points.append({"device": d.device, "model": d.identity.get("model"), "mem_total_mib": mem / 1024,
                       "ceiling_mib": float(d.default.cache_ceil_mb), "kill_observed": killed})
    models: dict[tuple[str, int | None], dict[str, Any]] = {}
    for d in devices:
        if d.kind not in PHONE_KINDS:
            continue
        for r in d.recommendations:
            if math.isnan(r.cycle_mib):
                continue
            m = models.setdefault((r.model, r.top_k), {"model": r.model, "top_k": r.top_k, "cycle_mib": r.cycle_mib,
                                                       "cache_off_on": []})
            m["cycle_mib"] = max(m["cycle_mib"], r.cycle_mib)
            mem = d.identity.get("mem_total_kb")
            # off for this model at this top-k: its own verdict, or the device default under its cycle
            # (cache_off_models names a model off at ANY top-k, so it cannot decide one top-k)
            ceil = d.default.cache_ceil_mb
            if (r.cache_off or (ceil is not None and ceil < r.cycle_mib)) and mem:
                m["cache_off_on"].append({"device": d.device, "mem_total_mib": mem / 1024})
    floor = int(min(floors)) if floors else None
    if not points:
        return {"unmeasured": {"knots_mib": [], "slope_after": None, "min_ram_mib": None, "cache_floor_mb": floor,
                               "rests_on": [], "points": [], "models": [],
                               "why": "no phone with a known MemTotal and a safe ceiling was measured"}}
    hull = lower_hull([(0.0, 0.0)] + [(p["mem_total_mib"], p["ceiling_mib"]) for p in points])
    knots = [[round(m, 3), c] for m, c in hull]
    if len(knots) > 1:
        (m0, c0), (m1, c1) = knots[-2], knots[-1]
        slope_after = min(1.0, (c1 - c0) / (m1 - m0))
    else:
        slope_after = 0.0
    slope_after = math.floor(slope_after * 1e6) / 1e6      # rounded down: never over the envelope
    rests = [p["device"] for p in points if [round(p["mem_total_mib"], 3), p["ceiling_mib"]] in knots]
    out_models = []
    for m in models.values():
        # whole MiB of cycle: the ceiling is a whole number, and one under the cycle hits nothing
        need = _min_ram_for(knots, slope_after, math.ceil(m["cycle_mib"] - 1e-9))
        for off in m["cache_off_on"]:
            need = max(need, math.floor(off["mem_total_mib"]) + 1)
        out_models.append({"model": m["model"], "top_k": m["top_k"], "cycle_mib": m["cycle_mib"],
                           "min_ram_mib": math.ceil(need + 1e-6) if math.isfinite(need) else None,
                           "cache_off_on": [o["device"] for o in m["cache_off_on"]]})
    known = [m["min_ram_mib"] for m in out_models if m["min_ram_mib"] is not None]
    return {"unmeasured": {
        "knots_mib": knots, "slope_after": slope_after, "min_ram_mib": min(known) if known else None,
        "cache_floor_mb": floor, "rests_on": rests, "points": points, "models": out_models,
        "formula": "ceiling_mib = floor(linear interpolation of knots_mib [[mem_total_mib, ceiling_mib], …] at "
                   "MemTotal; past the last knot: last ceiling + slope_after x the MiB past it); --cache-mb 0 when "
                   "mem_total_mib < min_ram_mib (per model and top-k: models[].min_ram_mib)",
        "why": "the lower convex hull of the measured phones' default ceilings against their MemTotal (and the "
               "origin): at or under every phone measured"}}


def rule_ceiling(rules: Mapping[str, Any], mem_total_kb: float, model: str | None = None,
                 top_k: int | None = None) -> int | None:
    """What `rules` gives a phone with this MemTotal (for this model and top-k, if given): a
    ceiling in MiB, 0 for `--cache-mb 0`, or None when the fleet has no rule.
    (docs/recommendations.md shows the same in a few lines, app side.)"""
    rule = rules.get("unmeasured") or {}
    if not rule.get("knots_mib"):
        return None
    mem_mib = mem_total_kb / 1024
    need = next((m["min_ram_mib"] for m in rule["models"] if (m["model"], m["top_k"]) == (model, top_k)),
                rule["min_ram_mib"])
    ceiling = int(envelope_mib(rule["knots_mib"], rule["slope_after"], mem_mib))
    if ceiling < 1 or (need is not None and mem_mib < need):
        return 0
    return ceiling


def campaign_summaries(table) -> list[dict[str, Any]]:
    """Per campaign: its label, engines, dates and outcomes (no folder: labels only)."""
    out = []
    for label, mine in table.groupby("campaign", sort=True):
        starts = [x for x in mine["started_at"] if isinstance(x, (int, float)) and not math.isnan(x)]
        out.append({"label": str(label), "imported": bool(mine["imported"].any()),
                    "engines": sorted({str(e) for e in mine["engine"] if e}), "runs": len(mine),
                    "first_run": _iso(min(starts)) if starts else None,
                    "last_run": _iso(max(starts)) if starts else None,
                    "outcomes": {str(k): int(v) for k, v in sorted(mine["outcome"].value_counts().items())}})
    return out


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def recommendations_from(analysis: Analysis, campaigns: Sequence[dict] | None = None,
                         identities: Mapping[str, Mapping[str, Any]] | None = None) -> Recommendations:
    rows = {r["run_id"]: r for r in analysis.table.to_dict("records")}
    by_device: dict[str, list[Recommendation]] = {}
    ram: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for g in analysis.groups:
        if not any(p.ok or p.killed for p in g.points):
            continue                      # no streamed run finished or was killed: nothing to size from
        by_device.setdefault(g.device, []).append(recommend_group(g, rows))
        ram[g.device] = g.ram_total_kb
    for r in rows.values():
        kinds.setdefault(r["device"], str(r.get("device_kind") or ""))
    devices = []
    for d, recs in sorted(by_device.items()):
        ident = identity_of((identities or {}).get(d) or {"kind": kinds.get(d), "ram_total_kb": ram[d]})
        if ident["mem_total_kb"] is None and not math.isnan(ram[d]):
            ident["mem_total_kb"] = int(ram[d])
        devices.append(DeviceRecommendations(d, ident, ram[d], _device_default(recs), tuple(recs)))
    floors = [float(v) for v in (rows[r].get("cache_floor_mb") for d in devices for rec in d.recommendations
                                 if rec.auto is not None for r in rec.auto.run_ids if r in rows) if _text(v)]
    return Recommendations(tuple(devices), tuple(campaigns if campaigns is not None else
                                                 campaign_summaries(analysis.table)),
                           fleet_rules(devices, floors))


def recommend(dirs: Sequence[str | Path], model_files: Mapping[str, str] | None = None, verify: bool = False,
              echo=None) -> Recommendations:
    """`bmoe-fleet recommend`: campaign directories in, recommendations out; with `verify`, every
    recommended command line run once on its device (results.verify), progress to `echo`."""
    from results.publish import Redactor
    from results.rundir import read_campaigns
    from results.table import build_table

    camps = read_campaigns(list(dirs))
    table = build_table(camps, model_files)
    recs = recommendations_for(camps, analyze(table))
    if verify:
        from results.verify import verify as run_each

        recs = run_each(recs, camps, Redactor(camps).text, echo)
    return recs


def recommendations_for(camps: Sequence[Any], analysis: Analysis) -> Recommendations:
    """Recommendations of campaigns already read and analysed, with the devices' own identities,
    every string redacted for publishing (results.publish)."""
    from results.publish import Redactor

    identities: dict[str, dict[str, Any]] = {}
    for c in camps:
        for name, record in c.devices.items():
            identities.setdefault(name, dict(record))
    recs = recommendations_from(analysis, None, identities)
    return redact(recs, Redactor(camps))


def redact(recs: Recommendations, redactor) -> Recommendations:
    """Every string a recommendation publishes with this host's paths replaced."""
    devices = []
    for d in recs.devices:
        out = []
        for r in d.recommendations:
            out.append(replace(r, reason=redactor.text(r.reason), evidence=redactor.value(r.evidence),
                               confidence_reasons=tuple(redactor.text(x) for x in r.confidence_reasons),
                               lmk=redactor.value(r.lmk)))
        devices.append(replace(d, recommendations=tuple(out),
                               default=replace(d.default, notes=tuple(redactor.text(n) for n in d.default.notes))))
    return replace(recs, devices=tuple(devices))


# ── output ───────────────────────────────────────────────────────────────────────────────────

ROW_COLUMNS = ("device", "phone", "ram_mib", "model", "top_k", "cycle_mib", "fixed", "auto", "dense", "confidence",
               "why", "verified")
_ROW_HEADERS = ("device", "phone", "RAM MiB", "model", "k", "cycle MiB", "fixed", "auto", "dense", "confidence",
                "why", "verified")
_NUMERIC = ("ram_mib", "top_k", "cycle_mib")


def recommendation_rows(recs: Recommendations) -> list[dict[str, Any]]:
    """One flat row per recommendation (csv, md, text)."""
    rows = []
    for d in recs.devices:
        ident = d.identity
        phone = " ".join(str(x) for x in (ident.get("manufacturer"), ident.get("model")) if x)
        mem = ident.get("mem_total_kb")
        for r in d.recommendations:
            verified = "; ".join(f"{name} {v['status']}" for name, v in (r.verification or {}).items())
            rows.append({"device": d.device, "phone": phone, "ram_mib": round(mem / 1024) if mem else None,
                         "model": r.model, "top_k": r.top_k, "cycle_mib": r.cycle_mib,
                         "fixed": shlex.join(r.fixed.argv) if r.fixed else "",
                         "auto": shlex.join(r.auto.argv) if r.auto else "",
                         "dense": r.dense_mode or "", "confidence": r.confidence, "why": r.summary,
                         "verified": verified})
    return rows


def render(recs: Recommendations, fmt: str) -> str:
    from results import formats

    if fmt == "json":
        return recs.to_json()
    if fmt == "jsonl":
        return formats.to_jsonl([{"device": d.device, "identity": dict(d.identity), **r.to_dict()}
                                 for d in recs.devices for r in d.recommendations])
    rows = recommendation_rows(recs)
    if fmt == "csv":
        return formats.to_csv(rows, ROW_COLUMNS)
    if fmt == "md":
        return formats.to_md(rows, ROW_COLUMNS, _ROW_HEADERS, _NUMERIC)
    return recs.text() + "\n"


def recommend_command(dirs: Sequence[str | Path], fmt: str | None = None, out: str | None = None,
                      model_files: Mapping[str, str] | None = None, verify: bool = False, echo=None) -> str:
    """`bmoe-fleet recommend`: the recommendations rendered in `fmt`, to `out` or stdout."""
    from results import formats

    fmt = formats.choose_format(fmt, out)
    return formats.emit(render(recommend(dirs, model_files, verify, echo), fmt), out, "the recommendations")
