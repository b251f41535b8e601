"""The recommendation records and how they are published: recommendations.json (version 2), text,
csv, md and jsonl rows.

recommendations.json holds no host path: campaigns are named by label (results.publish). `method`
carries the constants the recommendations were made with, so a reader can tell two versions of
the rules apart.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.safetext import printable
from results import formats
from results.analysis.quality import LossyAlternative
from results.numbers import is_missing
from results.read.columns import C
from results.read.frames import row_views
from results.read.run_keys import load_text
from results.read.tokens import PUBLISHED_MIN_TOKENS
from store.ledger import spent_of
from store.versioned import json_safe

FORMAT = "bmoe-fleet.recommendations"
FORMAT_VERSION = 2
SCHEMA = "results/schemas/recommendations-v2.schema.json"   # in the repository, and installed with results
RESERVE_FRACTION = 0.10
HIGH_SPREAD_PCT = 10.0
MEDIUM_SPREAD_PCT = 25.0
SAME_PHONE_RAM_FRACTION = 0.03        # MemTotal within 3 %: the same phone model with the same RAM
# what a shipped setting rests on (docs/recommendations.md, "Measured or predicted"): runs of it on
# the device, nothing (cache 0 with no run of it), or the model alone (results.replay.predict)
MEASURED, UNMEASURED, PREDICTED = "measured", "unmeasured", "predicted"


@dataclass(frozen=True)
class FixedChoice:
    """The fixed `--cache-mb` recommended: the measured budget, its command line and its numbers."""

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

    @property
    def basis(self) -> str:
        """measured: this argv was run on the device and every run of it finished; unmeasured: cache 0
        recommended without a run of it (never "predicted": a prediction ships no argv)."""
        return MEASURED if self.measured else UNMEASURED


@dataclass(frozen=True)
class AutoChoice:
    """The `--cache-mb auto --cache-ceil-mb N` recommended: the ceiling, its command line and how it was sized."""

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
    # an auto ceiling always rests on a budget measured to hold (the analysis' largest safe one)
    basis: str = MEASURED


@dataclass(frozen=True)
class PredictedChoice:
    """What the model (results.replay.predict) says beside the measured choice: the knee and the
    working set of the probe's trace and the predicted s/token at the measured budgets, each with its
    error. Only ever `basis: predicted`, and it carries no argv: no predicted-only setting ships."""

    dense_weights: str
    probe_run_id: str
    cache0_run_id: str
    knee_mib: float | None
    working_set_mib: float
    s_per_tok_at_fixed: float | None
    error_pct_at_fixed: float | None
    s_per_tok_at_largest_safe: float | None
    error_pct_at_largest_safe: float | None
    basis: str = PREDICTED


@dataclass(frozen=True)
class ReplayCitation:
    """What the replayed LRU curve of a route trace predicts at the recommended budgets."""

    run_id: str
    cycle_mib: float
    knee_mib: float | None
    first_decode_hit_mib: float | None
    predicted_hit_pct_at_fixed: float | None
    predicted_hit_pct_at_ceiling: float | None
    measured_hit_pct_at_fixed: float | None


@dataclass(frozen=True)
class Recommendation:
    """One (device, model, top-k): the command lines, the dense mode, the confidence and the evidence."""

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
    apps: str = ""                    # the other apps open while it was measured ("" none; axes.apps)
    app_rung_mb: int | None = None    # the app's cache rung it maps to (results.analysis.android_app); None: none safe
    app_rung_reason: str = ""
    # the engine's own planner beside the measured boundary (results.analysis.planner_check PlannerPick.to_dict)
    planner: tuple[dict, ...] = ()
    predicted: PredictedChoice | None = None   # the model's view beside it (None: no probe or no cache-0 run)
    # `recommend --max-quality-loss`: a lossy setting within the bound, beside the lossless default
    # (results.analysis.quality); None without a bound, and then absent from recommendations.json
    lossy_alternative: LossyAlternative | None = None
    # what the app's default dropping costs and buys at each budget it was measured (results.analysis.app_drop);
    # () when not measured, and then absent from recommendations.json
    app_drop: tuple[str, ...] = ()

    @property
    def load(self) -> str:
        """Under which load of other apps it holds, in words."""
        return load_text(self.apps)

    @property
    def key(self) -> tuple[str, str, int | None, str]:
        """(device, model, top-k, other apps): its analysis group's key."""
        return (self.device, self.model, self.top_k, self.apps)

    def argvs(self) -> dict[str, tuple[str, ...]]:
        """The command lines this recommendation makes, by name."""
        out = {}
        if self.fixed is not None:
            out["fixed"] = self.fixed.argv
        if self.auto is not None:
            out["auto"] = self.auto.argv
        return out

    def to_dict(self) -> dict[str, Any]:
        """The record as recommendations.json holds it."""
        d = asdict(self)
        d["verification"] = dict(self.verification) if self.verification is not None else None
        if self.fixed is not None:
            d["fixed"]["basis"] = self.fixed.basis
        if not self.app_drop:
            d.pop("app_drop")              # version 2 as it was before the app preset measured it
        else:
            d["app_drop"] = list(self.app_drop)
        if self.lossy_alternative is None:
            d.pop("lossy_alternative")     # version 2 as it was without a bound
        else:
            d["lossy_alternative"] = self.lossy_alternative.to_dict()
        return json_safe(d, 3)


@dataclass(frozen=True)
class DeviceDefault:
    """What an app ships on one phone for every model: the lowest safe ceiling, and the models it turns off."""

    cache_ceil_mb: int | None
    argv: tuple[str, ...]
    text: str
    notes: tuple[str, ...]
    cache_off_models: tuple[str, ...] = ()
    # measured: its ceiling rests on a budget measured to hold (or every model's cache 0 was run);
    # unmeasured: cache 0 for a model with no run of it
    basis: str = MEASURED


@dataclass(frozen=True)
class DeviceRecommendations:
    """One device: its identity, its default and its recommendations."""

    device: str                        # the fleet's name for it (virtual:NAME, a serial, local)
    identity: Mapping[str, Any]        # what the phone reports: manufacturer, model, soc, abi, mem_total_kb
    ram_total_kb: float
    default: DeviceDefault
    recommendations: tuple[Recommendation, ...]

    @property
    def kind(self) -> str:
        """How the device is reached (adb, virtual, local; unknown for imports)."""
        return str(self.identity.get("kind") or "")

    def to_dict(self) -> dict[str, Any]:
        """The record as recommendations.json holds it."""
        return json_safe({"device": self.device, "identity": dict(self.identity), "ram_total_kb": self.ram_total_kb,
                          "default": {"cache_ceil_mb": self.default.cache_ceil_mb, "argv": list(self.default.argv),
                                      "text": self.default.text, "notes": list(self.default.notes),
                                      "cache_off_models": list(self.default.cache_off_models),
                                      "basis": self.default.basis},
                          "recommendations": [r.to_dict() for r in self.recommendations]}, 3)


@dataclass(frozen=True)
class Recommendations:
    """Every device's recommendations, the campaigns they came from and the rule for unmeasured phones."""

    devices: tuple[DeviceRecommendations, ...]
    campaigns: tuple[dict, ...] = field(default=())
    rules: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as recommendations.json holds it."""
        return {"format": FORMAT, "version": FORMAT_VERSION, "schema": SCHEMA,
                "method": {"reserve_fraction_of_ram": RESERVE_FRACTION, "published_min_tokens": PUBLISHED_MIN_TOKENS,
                           "high_spread_pct": HIGH_SPREAD_PCT, "medium_spread_pct": MEDIUM_SPREAD_PCT,
                           "same_phone_ram_fraction": SAME_PHONE_RAM_FRACTION},
                "rules": json_safe(dict(self.rules)),   # exact: already rounded the safe way
                "campaigns": [json_safe(c, 3) for c in self.campaigns], "devices": [d.to_dict() for d in self.devices]}

    def to_json(self) -> str:
        """recommendations.json (version 2), strict JSON."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

    def all(self) -> list[Recommendation]:
        """Every recommendation, device by device."""
        return [r for d in self.devices for r in d.recommendations]

    def find(self, device: str, model: str, top_k: int | None, apps: str = "") -> Recommendation:
        """The recommendation of one (device, model, top-k, other apps); KeyError when there is none."""
        for r in self.all():
            if r.key == (device, model, top_k, apps):
                return r
        raise KeyError((device, model, top_k, apps))

    def text(self) -> str:
        """The recommendations as lines for a person."""
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
                load = f", {r.load}" if r.apps else ""
                lines.append(f"  {r.model} ({k}{load}, cycle {_mib(r.cycle_mib)}): {fixed} | {auto} | "
                             f"dense {r.dense_mode or '?'} | {r.confidence}")
                lines.append(f"    {r.reason}")
                if r.lmk.get("adb_text") and r.lmk.get("app_replayed"):   # the two answers side by side
                    lines.append(f"    {r.lmk['adb_text']}  |  {r.lmk['app_text']}")
                if r.app_rung_reason:
                    lines.append(f"    {r.app_rung_reason}")
                lines += [f"    {x}" for x in r.app_drop]
                for p in r.planner:
                    lines.append(f"    {p['text']}")
                alt = r.lossy_alternative
                if alt is not None:
                    lines.append(f"    lossy, within {alt.bound}: " + (f"{alt.text} — {shlex.join(alt.argv)}"
                                                                      if alt.argv is not None else alt.why))
                for name, v in (r.verification or {}).items():
                    lines.append(f"    verify {name}: {v['status']}" + (f" — {v['line']}" if v.get("line") else ""))
        rule = self.rules.get("unmeasured") if self.rules else None
        if rule and rule.get("knots_mib"):
            knots = ", ".join(f"{m:,.0f} MiB → {c:,.0f}" for m, c in rule["knots_mib"][1:])
            lines.append(f"unmeasured phones: --cache-mb auto --cache-ceil-mb from MemTotal, linear through {knots}, "
                         f"+{rule['slope_after']:.3f} per MiB past it"
                         + (f"; --cache-mb 0 under {rule['min_ram_mib']:,} MiB of RAM"
                            if rule.get("min_ram_mib") is not None else ""))
        if rule and "left_out" in rule:       # drawn from the results database (results.analysis.fleet_db)
            drawn = rule.get("drawn_from") or {}
            lines.append(f"the rule is drawn from the results database: {drawn.get('devices', '?')} device(s) of "
                         f"{drawn.get('campaigns', '?')} campaign(s)" + ("" if rule.get("knots_mib") else
                                                                         f"; no rule: {rule['why']}"))
            for p in rule["points"]:
                lines.append(printable(f"  point {p['device']}: MemTotal {p['mem_total_mib']:,.0f} MiB, ceiling "
                                       f"{p['ceiling_mib']:,.0f} MiB — ") + provenance_text(p.get("provenance")))
            for o in rule["left_out"]:
                lines.append(printable(f"  left out {o['device']}: {o['reason']} — ") + provenance_text(o["provenance"]))
        return "\n".join(lines)


def provenance_text(p: Mapping[str, Any] | None) -> str:
    """Where a device of the rule came from (results.analysis.fleet_db.provenance), in one line."""
    if not p:
        return "provenance unknown"
    reports = list(p.get("reports") or [])
    shown = reports[:2] + ([f"{len(reports) - 2} more"] if len(reports) > 2 else [])
    return printable(f"{p['runs']} run(s) of campaign {', '.join(p['campaigns'])}; {', '.join(p['engines'])}"
                     + (f" (release {', '.join(p['releases'])})" if p["releases"] else "")
                     + (f"; report {', '.join(shown)}" if shown else ""))


def _mib(x: float) -> str:
    return "unknown" if x is None or math.isnan(x) else f"{x:g} MiB"


# ── rows: csv, md, jsonl, text ─────────────────────────────────────────────────────────────────

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
    """The recommendations as `fmt` (json, jsonl, csv, md, else text)."""
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


def campaign_summaries(table) -> list[dict[str, Any]]:
    """Per campaign: its label, engines, dates, outcomes and what it spent (the cells run and their
    device time, store.ledger.spent_of over its attempts; no folder: labels only)."""
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for r in row_views(table):         # one pass over the table's rows, not a frame per campaign
        by_label.setdefault(r[C.campaign], []).append(r)
    out = []
    for label in sorted(by_label):
        mine = by_label[label]
        starts = [x for r in mine if isinstance(x := r[C.started_at], (int, float)) and not math.isnan(x)]
        spent = spent_of(mine)
        outcomes = Counter(r[C.outcome] for r in mine if not is_missing(r[C.outcome]))
        out.append({"label": str(label), "imported": any(bool(r[C.imported]) for r in mine),
                    "engines": sorted({str(e) for r in mine if (e := r[C.engine])}), "runs": len(mine),
                    "first_run": _iso(min(starts)) if starts else None,
                    "last_run": _iso(max(starts)) if starts else None,
                    "outcomes": {str(k): int(v) for k, v in sorted(outcomes.items())},
                    "spent": spent.to_dict()})
    return out


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
