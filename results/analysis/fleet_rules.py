"""What an app ships per phone: a measured phone's default ceiling, and the rule for phones never measured.

Per device, the default ceiling an app would ship for that phone is the smallest of its models'
ceilings; models whose cycle sits above it are named (they want `--cache-mb 0` there). Devices
carry the identity the phone reports (manufacturer, model, SoC, ABI, MemTotal), not the fleet's
serial, and `rules` gives a phone never measured its ceiling from its MemTotal: the lower
envelope of the measured phones' defaults (fleet_rules).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from engine.interface.flags import CACHE_MB, MOE_STREAM
from results.analysis.recommend_argv import cache_flags
from results.analysis.recommend_records import (
    MEASURED,
    UNMEASURED,
    DeviceDefault,
    DeviceRecommendations,
    Recommendation,
)

PHONE_KINDS = ("adb", "virtual")      # devices an app could be running on (not this host, not imports)


def cache_off_note(r: Recommendation, ceiling: int | None) -> str | None:
    """Why this model at this top-k ships `--cache-mb 0` on a phone whose default ceiling is
    `ceiling`: its own verdict, or a default under its cycle. None when it takes the cache."""
    k = f" at top-k {r.top_k}" if r.top_k is not None else ""
    if r.cache_off:
        return f"{r.model}{k}: ship --cache-mb 0 ({r.reason.split(':')[0]})"
    if ceiling is not None and not math.isnan(r.cycle_mib) and ceiling < r.cycle_mib:
        return f"{r.model}{k}: the default {ceiling} MiB sits under its {r.cycle_mib:g} MiB cycle; ship --cache-mb 0 for it"
    return None


def device_default(recs: Sequence[Recommendation]) -> DeviceDefault:
    """What an app ships on this phone: the lowest safe ceiling of its models, and which models
    want `--cache-mb 0` under it."""
    autos = [(r, r.auto) for r in recs if r.auto is not None]
    if not autos:
        measured = all(r.fixed is not None and r.fixed.measured for r in recs)
        return DeviceDefault(None, (MOE_STREAM.typed, CACHE_MB.typed, "0"),
                             "--cache-mb 0 (no model has a safe budget over its cycle)",
                             tuple(f"{r.model}: {r.reason}" for r in recs), tuple(r.model for r in recs),
                             MEASURED if measured else UNMEASURED)
    lowest, auto = min(autos, key=lambda pair: pair[1].cache_ceil_mb)
    d = auto.cache_ceil_mb
    notes, off = [], []
    for r in recs:
        note = cache_off_note(r, d)
        if note is not None:
            notes.append(note)
            off.append(r.model)
    text = f"--cache-mb auto --cache-ceil-mb {d} (the lowest safe ceiling of its models: {lowest.model}" \
           + (f" at top-k {lowest.top_k}" if lowest.top_k is not None else "") \
           + (f" {lowest.load}" if lowest.apps else "") + ")"
    notes += _load_notes(recs)
    return DeviceDefault(d, cache_flags(auto.argv), text, tuple(notes), tuple(dict.fromkeys(off)), auto.basis)


def _load_notes(recs: Sequence[Recommendation]) -> list[str]:
    """Per model and top-k measured under more than one load of other apps: the ceiling under each
    ("ceiling 600 MiB with no other apps; --cache-mb 0 with cached:1GiB open")."""
    by: dict[tuple[str, int | None], list[Recommendation]] = {}
    for r in recs:
        by.setdefault((r.model, r.top_k), []).append(r)
    out = []
    for (model, k), rs in by.items():
        if len(rs) < 2:
            continue
        parts = [(f"ceiling {r.auto.cache_ceil_mb} MiB" if r.auto is not None else "--cache-mb 0") + f" {r.load}"
                 + (f" ({r.lmk['fought'][0]['budget_mib']:g} MiB fought)" if r.lmk.get("fought") else "")
                 for r in sorted(rs, key=lambda r: r.apps)]
        out.append(f"{model}" + (f" at top-k {k}" if k is not None else "") + ": " + "; ".join(parts))
    return out


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
    for (m0, c0), (m1, c1) in pairwise(knots):
        if mem_mib < m1:
            return c0 + (mem_mib - m0) * (c1 - c0) / (m1 - m0)
    return last_c


def _min_ram_for(knots: Sequence[Sequence[float]], slope_after: float, ceiling_mib: float) -> float:
    """The smallest MemTotal at which the envelope (non-decreasing) reaches `ceiling_mib`."""
    for (m0, c0), (m1, c1) in pairwise(knots):
        if c1 >= ceiling_mib:
            return m0 + (ceiling_mib - c0) * (m1 - m0) / (c1 - c0) if c1 > c0 else m0
    last_m, last_c = knots[-1]
    return last_m + (ceiling_mib - last_c) / slope_after if slope_after > 0 else math.inf


def not_a_point(kind: str, mem_total_kb: float | None) -> str | None:
    """Why a device can give the rule no point whatever its runs say (None: it can): a point is a
    phone an app runs on, placed by its MemTotal."""
    why = [] if kind in PHONE_KINDS else [f"not a phone an app runs on (kind {kind or 'unknown'})"]
    if not mem_total_kb or (isinstance(mem_total_kb, float) and math.isnan(mem_total_kb)):
        why.append("its record has no MemTotal, which places a point")
    return "; ".join(why) or None


NO_CEILING = "its default is --cache-mb 0 (no safe ceiling): it sets the models' minimum RAM only"


def fleet_rules(devices: Sequence[DeviceRecommendations], floors: Sequence[float] = (),
                provenance: Mapping[str, Mapping[str, Any]] | None = None,
                left_out: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The rule an app applies on a phone never measured, from the phones that were.

    Each measured phone gives a point (MemTotal, its default ceiling). The ceiling for a MemTotal
    is the lower convex hull of those points and the origin: linear between its knots (the
    phones it rests on), at or under every phone measured, rising no faster than the last edge
    (and never faster than MemTotal) past the largest. A model with token cycle C gets a cache
    only where that ceiling reaches C in whole MiB — and never at or under the RAM of a measured
    phone that wanted `--cache-mb 0` for it. Under the smallest such RAM of the fleet's models the
    default is `--cache-mb 0`.

    With `provenance` (by device: where its runs came from; results.analysis.fleet_db), each point
    carries its own, and `left_out` lists every device that gave no point, with why: those given,
    then the devices here that are none.
    """
    points: list[dict[str, Any]] = []
    out_devices = list(left_out)
    for d in devices:
        mem, ceiling = d.identity.get("mem_total_kb"), d.default.cache_ceil_mb
        why = not_a_point(d.kind, mem) or (NO_CEILING if ceiling is None else None)
        if why is not None or not mem or ceiling is None:
            out_devices.append({"device": d.device, "reason": why,
                                "provenance": dict((provenance or {}).get(d.device) or {})})
            continue
        killed = any(r.lmk.get("smallest_killed_mib") is not None for r in d.recommendations)
        points.append({"device": d.device, "model": d.identity.get("model"), "mem_total_mib": mem / 1024,
                       "ceiling_mib": float(ceiling), "kill_observed": killed})
        if provenance is not None:
            points[-1]["provenance"] = dict(provenance.get(d.device) or {})
    drawn = {"left_out": out_devices} if provenance is not None else {}
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
            # off for this model at this top-k, as the device's default says (cache_off_models names
            # a model off at ANY top-k, so it cannot decide one top-k)
            if cache_off_note(r, d.default.cache_ceil_mb) is not None and mem:
                m["cache_off_on"].append({"device": d.device, "mem_total_mib": mem / 1024})
    floor = int(min(floors)) if floors else None
    if not points:
        return {"unmeasured": {"knots_mib": [], "slope_after": None, "min_ram_mib": None, "cache_floor_mb": floor,
                               "rests_on": [], "points": [], "models": [],
                               "why": "no phone with a known MemTotal and a safe ceiling was measured", **drawn}}
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
               "origin): at or under every phone measured", **drawn}}


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

