"""Analysis per (device, model, top-k) of real campaigns: the cliff, the LMK boundary, dense modes,
the replayed LRU curve against the measured hits, and contamination tells provoked for real."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from results.analysis.analyze import UNDER_CYCLE_ADVICE, analyze
from results.read.table import build_table
from tests.results.conftest import local_campaign_data, run_local, write_engine


def test_budgets_under_the_cycle_are_flagged_and_really_hit_nothing(vphone_campaign, local_campaign):
    a = analyze(build_table([vphone_campaign, local_campaign]))
    k2 = a.group("virtual:tight", "alpha", 2)
    assert k2.cycle_mib == 51.0 and k2.cycle_source == "csv"
    by_budget = {p.budget_mib: p for p in k2.points}
    assert sorted(by_budget) == [25, 102, 256]
    assert by_budget[25].under_cycle and by_budget[25].advice == UNDER_CYCLE_ADVICE
    assert by_budget[25].hit_pct == 0.0                      # the cliff: zero, not low
    assert not by_budget[102].under_cycle and by_budget[102].hit_pct > 20
    k8 = a.group("virtual:tight", "alpha", 8)
    assert k8.cycle_mib == 204.0
    (under,) = k8.under_cycle_points
    assert under.budget_mib == 102 and under.hit_pct == 0.0 and under.ok == 2
    local = a.group("local", "small", 2)
    for p in local.points:
        if p.under_cycle:
            assert p.budget_mib < local.cycle_mib and p.hit_pct == 0.0 and p.advice == UNDER_CYCLE_ADVICE
        elif p.budget_mib > 0:
            assert p.hit_pct > 0 and p.advice == ""
    assert {p.under_cycle for p in local.points} == {True, False}


def test_the_lmk_boundary_brackets_the_kills_with_the_floor_reached(vphone_campaign):
    a = analyze(build_table([vphone_campaign]))
    g = a.group("virtual:tight", "alpha", 2)
    k2 = g.boundary
    assert (k2.smallest_killed_mib, k2.killed_budgets_mib, k2.largest_safe_mib) == (256, (256,), 102)
    assert k2.safe_repeats == 2 and 0 < k2.floor_kb_at_safe < g.ram_total_kb
    # over adb lmkd never considers the engine: the kernel's OOM killer took it, a bare SIGKILL to a
    # user build's shell (docs/decisions/app-verdict.md)
    assert len(k2.killed_run_ids) == 2 and any("with no lmkd or kernel kill line" in e for e in k2.evidence)
    assert k2.killed_by == "the kernel (SIGKILL with no lmkd line)" and "256 MiB killed by the kernel" in k2.adb_text()
    assert "killed at 256 MiB; always survived up to 102 MiB (2 runs, MemAvailable floor" in k2.text()
    k8 = a.group("virtual:tight", "alpha", 8).boundary
    assert (k8.smallest_killed_mib, k8.killed_budgets_mib, k8.largest_safe_mib) == (256, (256, 408), 102)


def test_a_budget_whose_cache_never_filled_proves_only_what_it_held(local_campaign, small_model):
    from engine.gguf.model import load_model_shape
    from engine.units import MIB
    from results.analysis.analyze import FILLED_FRACTION
    from results.analysis.recommend import recommend

    shape = load_model_shape(small_model)
    table = build_table([local_campaign])
    assert set(table["expert_bank_mib"]) == {shape.expert_bytes / MIB}
    assert set(table["expert_entry_mib"]) == {shape.widest_expert_bytes / MIB}
    g = analyze(table).group("local", "small", 2)
    cached = [p for p in g.points if p.budget_mib > 0]
    for p in cached:
        room = min(p.budget_mib, p.bank_mib)
        assert p.filled == (p.held_mib >= room - max((1 - FILLED_FRACTION) * room, p.entry_mib) - 1e-9), p
    # 8 tokens of uniform routing touch most, not all, of the bank: auto (sized to the whole bank)
    # survived holding less than it, the fixed budgets filled
    autos = [p for p in cached if p.auto]             # one per dense mode, each sized to the bank
    assert len(autos) == 2 and len({p.budget_mib for p in autos}) == 1
    assert all(not p.filled and p.held_mib < FILLED_FRACTION * shape.expert_bytes / MIB for p in autos)
    assert all(p.filled for p in cached if not p.auto)
    b = g.boundary
    budget, held = autos[0].budget_mib, min(p.held_mib for p in autos)
    assert b.largest_safe_mib == max(p.budget_mib for p in cached if p.filled) < budget
    assert b.unfilled == ((budget, held),)
    assert f"survived but never filled, so unproven: {budget:g} MiB held {held:.3g} MiB" in b.text()
    r = recommend([local_campaign]).find("local", "small", 2)
    assert r.auto is not None and r.auto.cache_ceil_mb <= b.largest_safe_mib
    assert any(reason.startswith(f"not counted as safe: {b.unfilled_text()}; those caches never filled in 8 tokens")
               for reason in r.confidence_reasons)


def test_dense_modes_are_compared_at_the_budgets_both_ran(local_campaign):
    g = analyze(build_table([local_campaign])).group("local", "small", 2)
    modes = {m.mode: m for m in g.dense.modes}
    assert set(modes) == {"anon", "warm"} and g.dense.compared_at.startswith("budgets ")
    for m in modes.values():
        assert m.runs == 10 and m.ok == 10 and len(m.tok_s_values) == 10 and m.majflt_per_tok >= 0
    assert g.dense.best == max(modes.values(), key=lambda m: m.tok_s).mode
    # one series per dense mode on the chart
    assert sorted(g.series()) == ["dense=anon", "dense=warm"]


def test_the_replayed_lru_curve_predicts_every_measured_hit(local_campaign, vphone_campaign):
    a = analyze(build_table([local_campaign, vphone_campaign]))
    checked = 0
    for key in (("local", "small", 2), ("virtual:tight", "alpha", 2), ("virtual:tight", "alpha", 8)):
        g = a.group(*key)
        assert g.replay is not None and math.isclose(g.replay.cycle_mib, g.cycle_mib, abs_tol=0.001)
        for p in g.points:
            if p.ok and p.budget_mib > 0:
                # the engine prints hit % to 0.1: the exact replay sits within its rounding
                assert abs(g.replay.hit_at(p.budget_mib) - p.hit_pct) <= 0.05 + 1e-9, (key, p.label)
                checked += 1
        assert g.replay.knee_mib is not None and g.replay.knee_mib >= g.replay.first_decode_hit_mib
        assert all(h == 0.0 for b, h in zip(g.replay.budgets_mib, g.replay.hit_pct_decode)
                   if b < g.replay.first_decode_hit_mib)
    assert checked >= 8


def own_tells(a):
    """The tells a campaign earned itself. An `oversubscribed` run that shared this host with engines
    outside the campaign (other work on the machine while the tests ran) names them and is the
    host's doing, not the campaign's; on a quiet host there are none."""
    outside = set(a.table[a.table["cpu_engines"].str.contains("outside the campaign")]["run_id"])
    return [t for t in a.tells if not (t.kind == "oversubscribed" and set(t.run_ids) <= outside)]


def test_a_clean_campaign_has_no_contamination_tells(local_campaign):
    a = analyze(build_table([local_campaign]))
    assert own_tells(a) == []
    told = a.table[a.table["tells"] != ""]
    assert set(told["tells"]) <= {"oversubscribed"} and told["cpu_engines"].str.contains("outside the campaign").all()


@pytest.fixture(scope="module")
def tell_campaigns(tmp_path_factory, small_model, router_model):
    """Four small campaigns, each contaminated one way on purpose (the wrapper engines of conftest)."""
    root = tmp_path_factory.mktemp("tells")
    engines = root / "engines"
    return {
        # a device that is slower during the top-k 1 runs (sleeps in every decode step)
        "topk": run_local(root / "topk", local_campaign_data(
            "topk", small_model, {"cache_mb": [0], "n_expert_used": [1, 2]}, {"repeats": 2},
            engine=write_engine(engines, "topk", slow_when="topk:1", slow_ms=100))),
        # the second of three repeats has its model mapping paged out while it decodes
        "majflt": run_local(root / "majflt", local_campaign_data(
            "majflt", router_model, {"cache_mb": [0], "dense_weights": ["mmap"]}, {"repeats": 3},
            engine=write_engine(engines, "majflt", squeeze_when="call:2"))),
        # the device slows down after the first pass (calls 3 and 4 are the reversed second pass)
        "order": run_local(root / "order", local_campaign_data(
            "order", small_model, {"cache_mb": [0]}, {"repeats": 2, "reverse_pass": True},
            engine=write_engine(engines, "order", slow_when="after:2", slow_ms=200))),
        # a gate that cannot be met: the run starts anyway and says so
        "gate": run_local(root / "gate", local_campaign_data(
            "gate", small_model, {"cache_mb": [0]}, gate={"mem_available_min_mb": 1 << 30, "max_wait_s": 0.1,
                                                          "poll_s": 0.05})),
    }


def _kinds(folder):
    full = analyze(build_table([folder]))
    a = dataclasses.replace(full, tells=tuple(own_tells(full)))
    return a, sorted({t.kind for t in a.tells})


def test_compute_rising_as_top_k_falls_is_a_tell(tell_campaigns):
    a, kinds = _kinds(tell_campaigns["topk"])
    assert kinds == ["compute_rises_as_topk_falls"]
    (tell,) = a.tells
    slow = a.table[a.table["n_expert_used"] == 1]
    assert set(slow["run_id"]) <= set(tell.run_ids) and "top-k 1" in tell.message
    assert all(a.table[a.table["run_id"] == r]["tells"].iloc[0].split(",")[0] == "compute_rises_as_topk_falls"
               for r in tell.run_ids)


def test_major_faults_ten_times_the_configs_norm_is_a_tell(tell_campaigns):
    a, kinds = _kinds(tell_campaigns["majflt"])
    assert kinds == ["majflt_outlier"]
    (tell,) = a.tells
    (squeezed,) = a.table[a.table["order"] == 1]["run_id"]     # the engine's second call
    assert tell.run_ids == (squeezed,)
    faults = dict(zip(a.table["run_id"], a.table["majflt_per_tok"]))
    assert faults[squeezed] > 10 * max(1.0, max(v for r, v in faults.items() if r != squeezed))


def test_results_that_move_with_run_order_are_a_tell(tell_campaigns):
    a, kinds = _kinds(tell_campaigns["order"])
    assert kinds == ["moves_with_order"]
    (tell,) = a.tells
    assert len(tell.run_ids) == 4 and "pass 1" in tell.message
    plan = json.loads((tell_campaigns["order"] / "plan.json").read_text())
    assert sorted(c["pass"] for c in plan["cells"]) == [0, 0, 1, 1]


def test_a_gate_that_gave_up_is_a_tell_and_a_flag(tell_campaigns):
    a, kinds = _kinds(tell_campaigns["gate"])
    assert kinds == ["gate_gave_up"]
    row = a.table.iloc[0]
    assert bool(row["gate_gave_up"]) and "gate_gave_up" in row["flags"] and row["tells"].split(",")[0] == "gate_gave_up"
    assert row["outcome"] == "ok"                       # the run is a result; the tell says how far to trust it
