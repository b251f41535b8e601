"""`bmoe-fleet demo` start to finish, and every claim the README makes of it checked on what it wrote.

This was the suite's longest test (about four minutes on 2 cores, alone: the demo is 44 cells, two
probes, the planner and two session cells on two virtual phones, then `recommend --verify`); the
suite keeps a cheap check of the demo's plan (tests/harness/test_cli.py), and this script runs the
demo itself. The checks: a model of the demo's size, priced; one route-traced probe per phone and
its knee cell at the knee the probe replays to; every fixed budget's measured hit % equal to the
replay of its phone's trace; one recommendation per phone and load of other apps, citing the
replayed curve; on the large phone the 1400 MiB cache that survived without filling proves nothing
(the ceiling is 600); on the small phone a budget past the RAM left beside its app is fought and the
ceiling sits under it and under any kill; three turns per session cell; the site's knee; every
recommended command line accepted on its phone and none under the cycle; the planner's pick on
each phone beside each load, recorded and set beside the measured boundary. Needs root (virtual
phones). Prints `demo check: every claim holds`, or the failed claim with its values, and exits 1.

    .venv/bin/python benchmarks/demo_check.py [--out /var/tmp/demo-check]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.units import MIB
from harness.cli.main import main as cli
from store.outcomes import OK


def check(out: Path, output: str) -> None:
    """Every claim of the demo, on the folder it wrote and what it printed (AssertionError names the first that fails)."""
    assert (out / "demo-qwen3moe.gguf").stat().st_size > 60 * MIB
    assert "top-k 4: token cycle" in output
    # each phone ran one route-traced probe, and its knee cell ran at the knee the probe replays to
    from harness.plan.probe import knee_of_trace
    from results.read.route_trace import read_route_trace
    from results.replay.lru_replay import access_sequence, lru_curve, stack_distances

    recs = [json.loads(p.read_text()) for p in (out / "campaign").glob("runs/*/*/run.json")]
    probes = {r["device"]: r for r in recs if r["probe"]}
    assert set(probes) == {"virtual:small", "virtual:large"}
    checked = 0
    for r in recs:
        if r["probe"] or r["outcome"] != OK or r["config"]["cache_auto"] or not r["config"]["cache_mb"]:
            continue
        trace = out / "campaign" / "runs" / probes[r["device"]]["cell_id"] / "1" / "route.csv"
        if r["config"]["budget_spec"] == "knee*1":
            assert r["config"]["cache_mb"] == knee_of_trace(trace).knee_mib
        # the probe runs the sweep's n_predict: its replay is every fixed-budget run's measured hit %
        t = read_route_trace(trace)
        seq = access_sequence(t)
        (point,) = lru_curve(seq, [r["config"]["cache_mb"]], t.cycle_bytes, stack_distances(seq))
        assert point.hit_pct_cum == pytest.approx(r["summary"]["cache_hit_pct"], abs=0.05)
        checked += 1
    assert checked >= 8
    # both phones' recommendations cite their probe's replayed curve, and the site shows it
    from harness.demo import APPS
    from results.analysis.recommend import recommend
    from results.read.run_keys import load_text

    all_recs = recommend([out / "campaign"]).all()
    fought_small = False
    assert sorted((r.device, r.apps) for r in all_recs) == sorted((d, a) for d in probes for a in APPS)
    for r in all_recs:                 # one recommendation per phone and load of other apps, named
        trace = out / "campaign" / "runs" / probes[r.device]["cell_id"] / "1" / "route.csv"
        assert r.replay.knee_mib == knee_of_trace(trace).knee_mib
        assert r.reason.startswith(f"{load_text(r.apps)}: ")
        if r.device == "virtual:large":
            # the 1400 MiB cache survived without filling (the prompt routes to ~640 MiB of the bank):
            # it proves nothing, so the ceiling is the largest budget whose cache filled, 600
            assert 1400 in [u["budget_mib"] for u in r.lmk["unfilled"]]
            assert all(u["held_mib"] < 0.95 * 1032 for u in r.lmk["unfilled"])
            assert r.auto.cache_ceil_mb == 600
        else:
            # the small phone swaps (zram) beside its ballast: a budget past the RAM left survives while
            # swapped back in, is fought (beside the opened apps lmkd takes them instead: no fight
            # needed there), and the ceiling sits under any fought budget and under any kill
            unsafe = [f["budget_mib"] for f in r.lmk["fought"]] + [r.lmk["smallest_killed_mib"] or math.inf]
            assert r.auto.cache_ceil_mb < min(unsafe), r.lmk
            fought_small = fought_small or bool(r.lmk["fought"])
    assert fought_small, "no budget fought on the small phone under either load"
    # the session cells: three turns on each phone, each turn's hit % and reads recorded
    from results.read.rundir import read_campaigns
    from results.read.table import build_table

    turns = build_table(read_campaigns([out / "turns"]))
    assert sorted(turns["device"]) == sorted(probes) and set(turns["outcome"]) == {OK}
    assert all(len(json.loads(v)) == 3 for v in turns["turn_demand_hit_pct"])
    assert all(len(json.loads(v)) == 3 for v in turns["turn_read_mib"])
    assert "session cells (3 turns" in output
    index = (out / "site" / "index.html").read_text()
    assert len(re.findall(r"knee [0-9]+ MiB", index)) >= 2
    # every recommended command line ran once on its phone and was accepted; none is under the cycle
    published = json.loads((out / "site" / "recommendations.json").read_text())
    verified = 0
    for d in published["devices"]:
        for r in d["recommendations"]:
            for name in ("fixed", "auto"):
                if r[name] is None:
                    continue
                assert r["verification"][name]["status"] == "accepted", (d["device"], name, r["verification"])
                budget = r[name]["cache_mb"] if name == "fixed" else r[name]["cache_ceil_mb"]
                assert budget == 0 or budget >= r["cycle_mib"], (d["device"], name, budget, r["cycle_mib"])
                verified += 1
    assert verified >= 3 and "verify fixed: accepted" in output
    # the engine's own planner ran on each phone beside each load, its plan recorded
    # (the budget it chose is the one its run had) and set beside the boundary the sweep measured
    from results.read.parse import read_metrics_csv

    planned = {(r["device"], r["config"].get("apps")): r for r in recs if r["config"].get("planner")}
    assert set(planned) == {(d, a) for d in probes for a in APPS}
    for r in all_recs:
        (pick,) = r.planner
        run = planned[(r.device, r.apps)]
        folder = out / "campaign" / "runs" / run["cell_id"] / "1"
        assert "plan: reproduce with" in (folder / "stderr.txt").read_text()
        assert pick["regime"] == "experts-stream" and pick["runs"] == 1, pick   # the bank is larger than RAM
        if run["outcome"] == OK:
            assert int(read_metrics_csv(folder / "metrics.csv").preamble["cache_mb"]) == pick["budget_mib"]
        assert pick["budget_mib"] >= r.cycle_mib and pick["verdict"], pick
        safe = r.lmk["largest_safe_mib"]
        if run["outcome"] == OK and not pick["fought"] and safe is not None:
            assert ("within the measured boundary" in pick["verdict"]) == (pick["budget_mib"] <= safe), pick
        assert f"planner: {pick['budget_mib']:g} MiB (experts-stream) — {pick['verdict']}" in output
    pages = "".join(p.read_text() for p in (out / "site").glob("devices/*.html"))
    assert pages.count("the engine&#39;s own planner") + pages.count("the engine's own planner") >= 4
    check_drop(out, output, set(probes))


def check_drop(out: Path, output: str, phones: set[str]) -> None:
    """The app's dropping on the demo's phones: drop × budget × top-k, a quality value for every ok
    cell, its cost printed per phone, and recommend naming a lossy setting only within a bound."""
    from results.analysis.app_drop import APP_NAME
    from results.analysis.quality import parse_bound
    from results.analysis.recommend import recommend
    from results.analysis.recommend_argv import settings_of
    from results.read.rundir import read_campaigns
    from results.read.table import build_table

    table = build_table(read_campaigns([out / "drop"]))
    assert set(table["device"]) == phones and len(table) == 8 * len(phones), len(table)
    ok = table[table["outcome"] == OK]
    assert len(ok) >= 6 * len(phones), table[["device", "cache_mb", "outcome"]]
    # every ok cell has a quality value: its reference, and the tokens it shares with it
    assert (ok["quality_ref_run"].str.len() > 0).all() and ok["agree_tokens"].notna().all()
    assert ok["agree_identical"].notna().all()
    lossless = ok[ok["lossy_levers"] == ""]
    assert len(lossless) and lossless["agree_identical"].all()       # greedy and lossless: the same answer
    assert set(ok["lossy_levers"]) >= {"", "drop 0.75", "top-k 2 of 4", "drop 0.75, top-k 2 of 4"}
    for phone in sorted(phones):
        assert f"  {phone}: {APP_NAME} at " in output, phone
    rows = {r["run_id"]: r for r in table.to_dict("records")}
    # lossless by default; with a bound, a lossy setting only within it, at an argv its own runs ran
    for r in recommend([out / "drop"]).all():
        assert r.lossy_alternative is None
        assert all("--drop-cold-experts" not in argv for argv in r.argvs().values())
    named = 0
    for bound in ("agreement>=0.5", "agreement>=0"):
        parsed = parse_bound(bound)
        for r in recommend([out / "drop"], max_quality_loss=parsed).all():
            alt = r.lossy_alternative
            assert alt is not None
            if alt.argv is None:
                continue
            mine = [rows[i] for i in alt.run_ids]
            assert alt.agreement >= parsed.agreement and alt.speedup > 1, alt
            assert alt.argv in {settings_of(json.loads(x["argv"])) for x in mine}, alt
            assert f"{alt.identical} of {alt.compared} outputs identical" in alt.text
            named += 1
    print(f"demo check: recommend named a lossy setting {named} time(s) over two bounds on {len(phones)} phones")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/var/tmp/demo-check", help="the demo's folder (emptied first)")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    result = CliRunner().invoke(cli, ["demo", "--out", str(out)], catch_exceptions=False)
    print(result.output)
    if result.exit_code != 0:
        sys.exit(f"demo check: the demo exited {result.exit_code}")
    try:
        check(out, result.output)
    except AssertionError:
        traceback.print_exc()
        sys.exit("demo check: a claim does not hold (above)")
    print("demo check: every claim holds")


if __name__ == "__main__":
    main()
