"""Recommendations that see the reclaim war, end to end on virtual phones with zram
(docs/method.md, the fought rules), with bmoe-py and with the real bmoe-cli, through the real adb server,
the campaign runner, the analysis and `recommend --verify`.

- On the reclaim war's phone (tests/devices/test_vphone_swapping.py: a foreground app in use, the
  dense weights page cache, zram as large as the RAM) a budget survives with its cache filled while
  the phone swaps it back in during the decode. The rule of the last release (survived, cache
  filled) takes it as the ceiling; this one calls it fought, says why, and sits the ceiling under
  it. Every recommended argv is still accepted by the engine on the phone.
- The same sweep with other apps as an axis (`axes.apps`, started by the harness through adb for
  each run): beside apps the user opened (`open:PKG`: cached apps, registered with lmkd by the
  phone's ActivityManager, their memory cold and compressible, so reclaim swaps them to zram at
  ~3:1 and lmkd may kill them) the engine keeps budgets that beside as much ballast in use (an
  active shell allocator, resident, which lmkd never considers) the kernel kills. The ceilings
  differ in that order, each recommendation names its load, and lmkd never takes the engine.
  (That lmkd takes an opened app over adb, the run's collateral: tests/devices/test_app_verdict_phone.py.)
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pandas as pd
import pytest

from engine.units import MIB
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from harness.run.verify import verifier
from results.analysis.analyze import _boundary, analyze
from results.analysis.recommend import recommend
from results.read.run_keys import load_text
from results.read.rundir import read_campaigns
from results.read.table import build_table
from tests.devices.conftest import needs_zram
from tests.devices.test_vphone_swapping import WAR_APP, WAR_CACHE_MB, WAR_RAM, WAR_TOKENS, WAR_ZRAM

# ro.lmk.thrashing_limit 1000 (AOSP 100): a scale phone's file LRU is a few MiB, so refaults of the
# engine's mapped model read as over 100 % thrashing at any budget and lmkd's thrashing kills came
# at random budgets (bmoe-cli: killed at 24 MiB, ok at 48); its kills are left to low swap
LMK = {"kill_heaviest_task": True, "thrashing_limit": 1000}
TOKENS = 96                   # uniform routing: 1,360 MiB of expert reads, the bank (~115 MiB) many times over
TOP_K = 2                      # the model's cycle is 14.2 MiB at top-k 2: every budget below clears it
# The loads' phone has a quarter more RAM than the model has bytes, zram of half that; each load
# holds 30 % of the RAM: two installed apps opened through ActivityManager (devices/virtual/am.py
# INSTALLED: chat's 32 MiB, then upstream's example app's 16 MiB in front), and ballast of the same
# size at a perceptible adj, in use
RAM = 160 * MIB
OPENED = "open:com.bmoe.app.chat+open:io.bigmoeonedge.example"
BALLAST = f"perceptible:{RAM * 30 // 100 // MIB}MiB:active"
# Beside the ballast the kernel killed the engine from 62 to 96 MiB on different runs (at 56 it ran,
# 14 MiB in swap, faster than cache 0); beside the opened apps it ran to the whole bank (128), and on a
# loaded host lmkd's kill of the app in front made 96 fought: 72 holds the ceilings apart
LOAD_BUDGETS = [0, 48, 72, 96, 128]
# the reclaim war's phone (tests/devices/test_vphone_swapping.py): cache 0, a budget under its cycle,
# and its fought budget
WAR_BUDGETS = [0, 48, WAR_CACHE_MB]


def phone_of(make_phone, name: str):
    """A zram phone, and its two loads: apps lmkd may kill, and ballast it cannot see."""
    return make_phone(name, RAM, zram_bytes=RAM // 2, lmk=LMK), (OPENED, BALLAST)


@pytest.fixture(scope="module")
def model(uniform_model) -> Path:
    return uniform_model


def sweep(out: Path, adb_server, phone_home, phone, model: Path, engine: dict, budgets: list[int],
          apps: list[str] | None = None, dense: str = "anon", tokens: int = TOKENS, top_k: int | None = TOP_K) -> Path:
    data = {"version": 1, "name": out.name,
            "fleet": {"devices": [f"virtual:{phone.name}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_server.port}]},
            "models": {"bank": str(model)}, "engine": engine,
            "axes": {"cache_mb": budgets, "dense_weights": [dense], **({"n_expert_used": [top_k]} if top_k else {}),
                     **({"apps": apps} if apps else {})},
            # a top-k under the model's own for the memory it leaves, not for its answers: no quality runs
            "run": {"n_predict": tokens, "threads": 1, "retries": 0, "quality": "off"}, "gate": {"max_wait_s": 2}}
    run_campaign(parse_campaign(data, source=f"{out.name}.toml"), out, progress_stream=io.StringIO())
    return out


def seen(analysis) -> list[tuple]:
    return [(g.apps, p.budget_mib, p.ok, p.killed, round(p.tok_s, 2), round(p.swap_in_mib_per_tok, 2),
             round(p.vm_swap_max_mib, 1), p.others_killed, p.fought) for g in analysis.groups for p in g.points]


def ceiling(r) -> float:
    return r.auto.cache_ceil_mb if r.auto is not None else 0


@needs_zram
def test_a_budget_that_survives_fought_over_is_rejected(tmp_path, adb_server, make_phone, phone_home, war_model,
                                                        engine):
    """On the reclaim war's phone the war's budget survives, cache filled, swapped back in: fought,
    and the ceiling sits under it."""
    phone = make_phone("fought", WAR_RAM, zram_bytes=WAR_ZRAM, apps=(WAR_APP,), lmk=LMK)
    out = sweep(tmp_path / "fought", adb_server, phone_home, phone, war_model, engine, WAR_BUDGETS, dense="warm",
                tokens=WAR_TOKENS, top_k=None)
    analysis = analyze(build_table(read_campaigns([out])))
    print(seen(analysis))
    (g,) = analysis.groups
    fought = [p for p in g.points if p.fought]
    # bmoe-py: the war's budget (18 MiB/token swapped back in, 5x slower than cache 0); bmoe-cli: 48
    # MiB (1.6-2 MiB/token), and on one run of two the war's budget too (1.14 MiB/token)
    survived = [p for p in fought if p.ok == p.runs and p.filled]                     # survived, cache filled
    assert survived, seen(analysis)
    # the last release's rule: no fights and no app verdicts, so the largest budget that survived filled
    old = _boundary([dataclasses.replace(p, fought="", app_killed=0, app_replayed=0) for p in g.points],
                    pd.DataFrame({"run_id": [], "evidence": []}))
    assert old.largest_safe_mib is not None and old.largest_safe_mib >= survived[0].budget_mib, (old, seen(analysis))
    recs = recommend([out], verify=verifier())
    (r,) = recs.all()
    assert ceiling(r) < fought[0].budget_mib, (r.reason, seen(analysis))
    assert r.lmk["fought"] and r.lmk["fought"][0]["budget_mib"] == fought[0].budget_mib
    assert "fought: " in r.lmk["fought"][0]["reason"] and "fought" in " ".join(r.confidence_reasons + (r.reason,))
    assert r.verification and all(v["status"] == "accepted" for v in r.verification.values()), r.verification


@needs_zram
def test_other_apps_give_ceilings_in_their_order_and_each_recommendation_names_its_load(
        tmp_path, adb_server, make_phone, phone_home, model, real_engine):
    """One sweep with the loads as an axis: beside the opened apps the engine keeps budgets that
    beside the ballast the kernel kills; lmkd never takes the engine."""
    phone, loads = phone_of(make_phone, "loads")
    out = sweep(tmp_path / "loads", adb_server, phone_home, phone, model, real_engine, LOAD_BUDGETS, list(loads))
    analysis = analyze(build_table(read_campaigns([out])))
    print(seen(analysis))
    by_group = {g.apps: {p.budget_mib: p for p in g.points} for g in analysis.groups}
    assert set(by_group) == set(loads), seen(analysis)
    kept = [b for b in LOAD_BUDGETS if by_group[BALLAST][b].killed and by_group[OPENED][b].ok == by_group[OPENED][b].runs]
    assert kept, seen(analysis)

    recs = recommend([out], verify=verifier())
    by_load = {r.apps: r for r in recs.all()}
    assert set(by_load) == set(loads), seen(analysis)
    beside_opened, beside_ballast = by_load[OPENED], by_load[BALLAST]
    assert ceiling(beside_opened) > ceiling(beside_ballast), (beside_opened.reason, beside_ballast.reason, seen(analysis))
    assert ceiling(beside_ballast) < kept[0], (beside_ballast.reason, seen(analysis))
    assert beside_opened.reason.startswith(f"{load_text(OPENED)}: ")
    assert beside_ballast.reason.startswith(f"{load_text(BALLAST)}: ")
    (device,) = recs.devices
    assert any(load_text(OPENED) in n and load_text(BALLAST) in n for n in device.default.notes), device.default.notes
    for rec in recs.all():
        assert rec.verification and all(v["status"] == "accepted" for v in rec.verification.values()), rec.verification
    # over adb lmkd never took the engine, beside either load
    table = build_table(read_campaigns([out]))
    assert "lmk_killed" not in set(table["outcome"]), seen(analysis)
