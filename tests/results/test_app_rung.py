"""A recommendation mapped onto upstream's Android app's cache rungs (docs/decisions/presets.md): the largest rung at
or under the recommended ceiling that was measured and survived every run with its cache filled, never
one that was not measured, was killed, fought over or never filled; null with every rung's reason when
none is; recommendations.json carries it (`app_rung_mb`, schema v2, additive)."""

from __future__ import annotations

import json
import math

import pandas as pd

from results.analysis import android_app as app
from results.analysis.analyze import BudgetPoint, DenseComparison, GroupAnalysis, _boundary, _with_fights
from results.analysis.fleet_rules import device_default, fleet_rules
from results.analysis.recommend import recommend_group
from results.analysis.recommend_records import DeviceRecommendations, Recommendations
from tests.results.test_recommend_v2 import SCHEMA, validate

NO_ROWS = pd.DataFrame({"run_id": [], "evidence": []})


def point(budget: float, *, runs: int = 2, killed: int = 0, held: float | None = None, vm_swap: float = 0.0,
          tok_s: float = 5.0) -> BudgetPoint:
    ids = tuple(f"c/cell{budget:g}/{i + 1}" for i in range(runs))
    return BudgetPoint(series="dense=anon", budget_mib=budget, label=f"{budget:g} MiB", auto=False, runs=runs,
                       ok=runs - killed, killed=killed, run_ids=ids, killed_run_ids=ids[:killed], hit_pct=50.0,
                       tok_s=tok_s, tok_s_min=tok_s * 0.98, tok_s_max=tok_s * 1.02,
                       tok_s_values=(tok_s * 0.98, tok_s * 1.02), spread_pct=4.0, under_cycle=False, advice="",
                       mem_avail_floor_kb=math.nan, majflt_per_tok=0.0, compute_s_per_tok=0.01,
                       held_mib=budget if held is None else held, swap_in_mib_per_tok=0.0, vm_swap_max_mib=vm_swap)


def mapped(points: list[BudgetPoint], ceiling: float, cycle: float = 700.0) -> app.AppRung:
    pts = _with_fights(points)
    return app.app_rung(pts, _boundary(pts, NO_ROWS), ceiling, cycle)


def test_the_largest_safe_rung_under_the_ceiling_is_named_and_never_one_over_it():
    pts = [point(0, tok_s=2.0), point(500), point(1000), point(1500), point(1750)]
    assert mapped(pts, 1800).rung_mb == 1750
    at = mapped(pts, 1600)                                   # 1750 was safe, but over the ceiling
    assert at.rung_mb == 1500 and at.reason.startswith("app rung 1500 MiB: the largest of the app's rungs at or "
                                                        "under the 1600 MiB ceiling measured safe (2 run(s))")
    # under the token cycle a rung only churns: cache off instead
    under = mapped(pts, 900)
    assert under.rung_mb == 0 and "500 MiB under the 700 MiB token cycle" in under.reason


def test_a_rung_that_was_not_measured_is_never_named():
    pts = [point(0, tok_s=2.0), point(1000), point(1750)]        # 1250 and 1500 never ran
    rung = mapped(pts, 1700)
    assert rung.rung_mb == 1000
    assert "above it: 1500 MiB not measured; 1250 MiB not measured" in rung.reason


def test_a_killed_fought_or_unfilled_rung_is_never_named():
    killed = mapped([point(0, tok_s=2.0), point(1000), point(1250, killed=1)], 1300)
    assert killed.rung_mb == 1000 and "1250 MiB killed" in killed.reason
    # 1500 is fought (the engine swapped, slower than cache 0): 1250 above... and 2000 above the fight
    fought = mapped([point(0, tok_s=2.0), point(1250), point(1500, vm_swap=90.0, tok_s=1.0), point(2000)], 2100)
    assert fought.rung_mb == 1250
    assert "1500 MiB fought: 90 MiB of the engine in swap" in fought.reason
    assert "2000 MiB at or over 1500 MiB fought" in fought.reason
    unfilled = mapped([point(0, tok_s=2.0), point(1000), point(2000, held=800.0)], 2000)
    assert unfilled.rung_mb == 1000 and "2000 MiB survived without filling its cache" in unfilled.reason


def test_null_with_every_rungs_reason_when_no_rung_is_safe():
    rung = mapped([point(500), point(1000, killed=2)], 1200)        # no cache-0 run either
    assert rung.rung_mb is None
    assert rung.reason == ("no app rung is measured safe at or under the 1200 MiB ceiling: 1000 MiB killed; "
                           "500 MiB under the 700 MiB token cycle; cache 0 not measured")


def group(points: list[BudgetPoint]) -> GroupAnalysis:
    pts = tuple(_with_fights(points))
    return GroupAnalysis(device="virtual:app", model="m", top_k=2, cycle_mib=700.0, cycle_source="header",
                         points=pts, baselines=(), boundary=_boundary(pts, NO_ROWS),
                         dense=DenseComparison((), "", None, False), replay=None, tells=(),
                         n_runs=sum(p.runs for p in pts), ram_total_kb=math.nan, mem_avail_before_kb=math.nan,
                         tokens_min=128.0, engines=("bmoe-py",), campaigns=("app",))


def test_recommendations_json_names_the_rung_and_validates():
    # 2000 MiB is the largest safe budget; 10 % is kept back (RAM unknown): ceiling 1800, rung 1750
    safe = recommend_group(group([point(0, tok_s=2.0), point(1000), point(1750), point(2000), point(3000, killed=1)]))
    assert safe.auto is not None and safe.auto.cache_ceil_mb == 1800
    assert safe.app_rung_mb == 1750 and "at or under the 1800 MiB ceiling" in safe.app_rung_reason
    # nothing survived: the recommendation is --cache-mb 0, and so is the rung when cache 0 ran
    off = recommend_group(group([point(0, tok_s=2.0), point(1000, killed=2)]))
    assert off.cache_off and off.app_rung_mb == 0
    none = recommend_group(group([point(1000, killed=2)]))
    assert none.app_rung_mb is None and none.app_rung_reason.endswith("0 not measured")
    recs = [safe, off, none]
    device = DeviceRecommendations("virtual:app", {"kind": "virtual", "manufacturer": None, "model": None,
                                                   "soc": None, "abi": None, "mem_total_kb": None},
                                   math.nan, device_default(recs), tuple(recs))
    doc = json.loads(Recommendations((device,), (), fleet_rules([device], [])).to_json())
    validate(doc)
    assert [r["app_rung_mb"] for r in doc["devices"][0]["recommendations"]] == [1750, 0, None]
    assert "app rung 1750 MiB" in Recommendations((device,)).text()
    # the schema lists exactly the app's rungs (and null)
    assert SCHEMA["$defs"]["recommendation"]["properties"]["app_rung_mb"]["enum"] == [None, *app.APP_RUNGS_MB]
