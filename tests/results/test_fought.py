"""The fought rule (docs/method.md): a budget that survived while the device swapped
it back in, or that decoded slower than cache 0 under reclaim, is not safe; the ceiling sits under it."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from results.analysis.analyze import FOUGHT_SWAP_IN_MIB_PER_TOK, BudgetPoint, _boundary, _with_fights, fought_reason


def point(budget: float, tok_s: float, *, swap_in: float = 0.0, vm_swap: float = 0.0, majflt: float = 0.0,
          runs: int = 2, killed: int = 0, under_cycle: bool = False) -> BudgetPoint:
    ok = runs - killed
    return BudgetPoint(series="dense=mmap", budget_mib=budget, label=f"{budget:g} MiB", auto=False, runs=runs, ok=ok,
                       killed=killed, run_ids=tuple(f"c/cell{budget:g}/{i + 1}" for i in range(runs)),
                       killed_run_ids=tuple(f"c/cell{budget:g}/{i + 1}" for i in range(killed)), hit_pct=50.0, tok_s=tok_s,
                       tok_s_min=tok_s * 0.97, tok_s_max=tok_s * 1.03, tok_s_values=(tok_s * 0.97, tok_s * 1.03),
                       spread_pct=6.0, under_cycle=under_cycle, advice="", mem_avail_floor_kb=100_000.0,
                       majflt_per_tok=majflt, compute_s_per_tok=0.01, swap_in_mib_per_tok=swap_in,
                       vm_swap_max_mib=vm_swap)


def test_swap_in_past_the_rate_is_a_fight_whatever_the_speed():
    zero = point(0, 2.0)
    assert fought_reason(point(300, 5.0, swap_in=FOUGHT_SWAP_IN_MIB_PER_TOK * 0.9), zero) == ""
    why = fought_reason(point(300, 5.0, swap_in=42.0), zero)
    assert why == "fought: 42 MiB/token swapped in"
    assert fought_reason(point(0, 2.0, swap_in=42.0), zero) == ""          # cache 0 itself is never fought


def test_slower_than_cache_0_is_a_fight_only_with_reclaim_evidence():
    zero = point(0, 2.1, majflt=3.0)
    assert fought_reason(point(400, 0.9), zero) == ""                     # slower, nothing reclaimed: no fight
    assert fought_reason(point(400, 0.9, vm_swap=120.0), zero) == \
        "fought: 120 MiB of the engine in swap; 0.9 tok/s vs 2.1 at cache 0"
    assert fought_reason(point(400, 0.9, majflt=7.0), zero) == \
        "fought: 7 major faults/token vs 3 at cache 0; 0.9 tok/s vs 2.1 at cache 0"
    assert fought_reason(point(400, 2.05, vm_swap=120.0), zero) == ""     # within cache 0's runs: no fight
    assert fought_reason(point(400, 0.9, vm_swap=120.0), None) == ""      # no cache 0 to compare with
    # a few MiB of a cache in swap is no war (5 % of the budget, at least 4 MiB): a budget just over
    # the cycle may decode slower than cache 0 by itself (a contended host: 1 MiB of 24 swapped)
    assert fought_reason(point(24, 0.9, vm_swap=1.04), zero) == ""
    assert fought_reason(point(400, 0.9, vm_swap=19.0), zero) == ""
    assert fought_reason(point(400, 0.9, vm_swap=20.0), zero).startswith("fought: 20 MiB of the engine in swap")


def test_under_the_cycle_or_within_cache_0s_own_swap_slower_is_no_fight():
    # the 640 MiB demo phone, paced: its load left 5.2 MiB of the engine in swap at cache 0 and 9.3
    # at 51 MiB, under the 57 MiB cycle, which decoded slower than every cache-0 run (0 % hit, every
    # miss managed)
    zero = point(0, 4.67, vm_swap=5.2)
    assert fought_reason(point(51, 4.3, vm_swap=9.3, under_cycle=True), zero) == ""
    assert fought_reason(point(51, 4.3, vm_swap=9.3, under_cycle=True, swap_in=1.5), zero).startswith(
        "fought: 1.5 MiB/token swapped in")                                  # a swap-in rate still counts
    # over the cycle, what counts is the swap beyond cache 0's: 9.0 - 5.2 is under the 4 MiB floor
    assert fought_reason(point(69, 4.3, vm_swap=9.0), zero) == ""
    assert fought_reason(point(69, 4.3, vm_swap=9.3), zero).startswith("fought: 9.3 MiB of the engine in swap")


def test_the_largest_safe_budget_sits_under_the_first_fought_one():
    pts = _with_fights([point(0, 2.0), point(200, 3.0), point(300, 3.5), point(400, 0.8, vm_swap=90.0),
                        point(500, 3.6), point(600, 1.0, killed=1)])
    b = _boundary(pts, pd.DataFrame({"run_id": [], "evidence": []}))
    assert b.fought == ((400.0, "fought: 90 MiB of the engine in swap; 0.8 tok/s vs 2 at cache 0"),)
    assert b.largest_safe_mib == 300 and b.smallest_killed_mib == 600      # 500 survived, above a fight: not safe
    assert "survived but not safe: 400 MiB fought" in b.text()
    # the rule of the last release (no fights) took 500
    plain = [replace(p, fought="") for p in pts]
    assert _boundary(plain, pd.DataFrame({"run_id": [], "evidence": []})).largest_safe_mib == 500
    assert not math.isnan(pts[3].vm_swap_max_mib)


def test_the_device_page_tags_a_fought_row():
    from results.site.page_views import _point_row

    pts = _with_fights([point(0, 2.0), point(300, 3.5), point(400, 0.8, vm_swap=90.0)])
    table = pd.DataFrame({"run_id": [r for p in pts for r in p.run_ids], "outcome": "ok", "tokens": 64, "pass": 0})
    rows = [_point_row(p, "", table) for p in pts]
    assert [r.fought for r in rows] == ["", "", f"{pts[2].fought}: not counted as safe"]
