"""Recommendations that see the reclaim war, end to end on virtual phones with zram (issue 25,
done-when points 1 and 2), with bmoe-py and with the real bmoe-cli, through the real adb server,
the campaign runner, the analysis and `recommend --verify`.

- A sweep past the RAM left beside an app in use: a budget survives while the phone swaps it back
  in during the decode. The rule of the last release (survived, cache filled) takes it as the
  ceiling; this one calls it fought, says why, and sits the ceiling under it. Every recommended
  argv is still accepted by the engine on the phone.
- The same sweep with other apps as an axis (`axes.apps`, started by the harness through adb for
  each run): beside a cached app, lmkd kills the app at its soft level and the engine keeps the
  budget; beside a perceptible app, which lmkd spares until the min watermark breaks, the same
  budget is fought (swapped back in, or the app killed past lmkd's soft level). The ceilings differ
  in lmkd's order, and each recommendation names its load.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pandas as pd
import pytest

from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from harness.run.verify import verifier
from results.analysis.analyze import _boundary, analyze
from results.analysis.recommend import recommend
from results.read.rundir import read_campaigns
from results.read.table import build_table
from tests.devices.conftest import needs_zram

MIB = 1 << 20
# ro.lmk.thrashing_limit 1000 (AOSP 100): a scale phone's file LRU is a few MiB, so refaults of the
# engine's mapped model read as over 100 % thrashing at any budget and lmkd's thrashing kills came
# at random budgets (bmoe-cli: killed at 24 MiB, ok at 48); its kills are left to low swap
LMK = {"kill_heaviest_task": True, "thrashing_limit": 1000}
TOKENS = 256                  # uniform routing: enough for a cache near the whole bank to fill
TOP_K = 2                      # the model's cycle is 14.2 MiB at top-k 2: every budget below clears it
# The phone has a quarter more RAM than the model has bytes, zram of half that. An app in use
# beside the engine holds 30 % of the RAM (its pages touched in turn, so they stay resident or
# fault back). Budgets go past the RAM left beside it: at the top ones lmkd, with the min
# watermark breached and swap low, kills the app (adj 900 or 200, above the engine's 0).
RAM = 160 * MIB


def phone_of(make_phone, name: str):
    """A zram phone, and its two loads: a cached and a perceptible app of 30 % of its RAM."""
    app_mib = RAM * 30 // 100 // MIB
    return make_phone(name, RAM, zram_bytes=RAM // 2, lmk=LMK), (f"cached:{app_mib}MiB:active",
                                                               f"perceptible:{app_mib}MiB:active")


BUDGETS = [0, 24, 48, 72, 96, 104, 112]

@pytest.fixture(scope="module")
def model(uniform_model) -> Path:
    return uniform_model


def sweep(out: Path, adb_server, phone_home, phone, model: Path, engine: dict, budgets: list[int],
          apps: list[str] | None = None, dense: str = "anon") -> Path:
    data = {"version": 1, "name": out.name,
            "fleet": {"devices": [f"virtual:{phone.name}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_server.port}]},
            "models": {"bank": str(model)}, "engine": engine,
            "axes": {"cache_mb": budgets, "dense_weights": [dense], "n_expert_used": [TOP_K],
                     **({"apps": apps} if apps else {})},
            "run": {"n_predict": TOKENS, "threads": 1, "retries": 0}, "gate": {"max_wait_s": 2}}
    run_campaign(parse_campaign(data, source=f"{out.name}.toml"), out, progress_stream=io.StringIO())
    return out


def seen(analysis) -> list[tuple]:
    return [(g.apps, p.budget_mib, p.ok, p.killed, round(p.tok_s, 2), round(p.swap_in_mib_per_tok, 2),
             round(p.vm_swap_max_mib, 1), p.others_killed, p.fought) for g in analysis.groups for p in g.points]


@needs_zram
def test_a_fought_budget_is_rejected_and_other_apps_give_ceilings_in_lmkds_order(tmp_path, adb_server, make_phone,
                                                                                 phone_home, model, engine):
    """One sweep with other apps as an axis (a cached and a perceptible app): beside the perceptible
    one a budget survives while swapping and is rejected (done-when point 1); the two loads' ceilings
    differ in lmkd's order (point 2)."""
    phone, (cached, perceptible) = phone_of(make_phone, "loads")
    loads = [cached, perceptible]
    out = sweep(tmp_path / "loads", adb_server, phone_home, phone, model, engine, BUDGETS, loads)
    analysis = analyze(build_table(read_campaigns([out])))
    print(seen(analysis))

    # point 1, beside the perceptible app
    (g,) = [g for g in analysis.groups if g.apps == perceptible]
    fought = [p for p in g.points if p.fought]
    assert fought, seen(analysis)
    survived = [p for p in fought if p.ok == p.runs and p.filled]                 # survived, cache filled
    assert survived, seen(analysis)
    # the last release's rule: no fights, so the largest budget that survived with its cache filled
    old = _boundary([dataclasses.replace(p, fought="") for p in g.points], pd.DataFrame({"run_id": [], "evidence": []}))
    assert old.largest_safe_mib is not None and old.largest_safe_mib >= survived[0].budget_mib
    recs = recommend([out], verify=verifier())
    by_load = {r.apps: r for r in recs.all()}
    assert set(by_load) == set(loads), seen(analysis)
    r = by_load[perceptible]

    def ceiling(r):
        return r.auto.cache_ceil_mb if r.auto is not None else 0

    assert ceiling(r) < fought[0].budget_mib, (r.reason, seen(analysis))
    assert r.lmk["fought"] and r.lmk["fought"][0]["budget_mib"] == fought[0].budget_mib
    assert "fought: " in r.lmk["fought"][0]["reason"] and "fought" in " ".join(r.confidence_reasons + (r.reason,))
    for rec in recs.all():
        assert rec.verification and all(v["status"] == "accepted" for v in rec.verification.values()), rec.verification

    # point 2: the ceilings in lmkd's order, each recommendation naming its load
    beside_cached, beside_perceptible = (by_load[x] for x in loads)
    assert ceiling(beside_cached) > ceiling(beside_perceptible), (
        beside_cached.reason, beside_perceptible.reason, seen(analysis))
    assert beside_cached.reason.startswith(f"with {loads[0]} open: ")
    assert beside_perceptible.reason.startswith(f"with {loads[1]} open")
    (device,) = recs.devices
    assert any(loads[0] in n and loads[1] in n for n in device.default.notes), device.default.notes
