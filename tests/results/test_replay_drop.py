"""The replay under --drop-cold-experts (results/replay/drop_replay.py) against real bmoe-py runs,
against the lossless replay, and against its own one-budget simulation.

The model is the drop differential's kind: qwen3moe, F32 weights, a skewed router (13 MiB), so a
threshold under the uniform share drops. Two bmoe-py runs, traced: F 1, and F 0.5 in prefill
without renormalising (under a second each, in parallel). A trace of a drop run still holds
every routed expert (a dropped row keeps the router's id and weight), so it serves as the
routing for the lossless comparisons too.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from engine.gguf.model import load_model_shape
from engine.gguf.synth import write_model
from harness.cli.main import _Group
from harness.cli.replay import replay
from results.errors import ReplayError
from results.read.parse import read_metrics_csv
from results.read.route_trace import PHASE_DECODE, read_route_trace
from results.replay.drop_replay import (
    DropLever,
    LossyTrace,
    check_lossy,
    drop_curve,
    drop_curve_from,
    drop_routing,
    simulate_drop,
)
from results.replay.lru_replay import access_sequence, lru_curve, mib_to_bytes
from results.site.charts import _drop_lever, drop_replay_traces
from tests.engine.test_differential_drop import SYNTH
from tests.results.test_replay import GPTOSS, TINY

MODEL = SYNTH           # the drop differential's skewed-router model (tests/engine/test_differential_drop.py)
PROMPT = "The keeper lit the lamp before the boats came home"
BUDGET_MIB = 4          # the token cycle is 3 MiB, the working set 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (csv, trace)} of two traced bmoe-py runs at BUDGET_MIB."""
    root = tmp_path_factory.mktemp("drop-replay")
    model = root / "m.gguf"
    write_model(model, MODEL)
    cases = {"f1": ("--drop-cold-experts", "1.0"),
             "f05-prefill": ("--drop-cold-experts", "0.5", "--drop-in-prefill", "--drop-no-renorm")}
    procs, out = {}, {}
    for name, flags in cases.items():
        csv, trace = root / f"{name}.csv", root / f"{name}.route.csv"
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "engine", "-m", str(model), "-p", PROMPT, "-n", "24", "-t", "1", "--moe-stream",
             "--force-cache", "--cache-mb", str(BUDGET_MIB), "--csv", str(csv), "--route-trace", str(trace), *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        out[name] = (csv, trace)
    for name, p in procs.items():
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, (name, err.decode()[-1000:])
    assert load_model_shape(model).cycle_mib(2) < BUDGET_MIB
    return out


@pytest.mark.parametrize(("name", "lever"), [("f1", DropLever(1.0, traced=True)),
                                             ("f05-prefill", DropLever(0.5, in_prefill=True, traced=True))])
def test_a_drop_runs_own_trace_replays_to_what_it_measured(runs, name, lever):
    """Exact where the routing is the run's own: drops, routed slots, hit % and the bytes it charged."""
    csv, trace_path = runs[name]
    summary = read_metrics_csv(csv).summary
    trace = read_route_trace(trace_path)
    (point,) = drop_curve(trace, lever, [BUDGET_MIB])
    assert point.dropped == int(summary["experts_dropped"]) > 0
    assert point.routed == int(summary["experts_routed"])
    assert f"{point.hit_pct_cum:.1f}" == f"{float(summary['cache_hit_pct']):.1f}"
    rows = trace.rows
    decode = rows.phase == PHASE_DECODE
    assert point.dropped == int(rows.dropped[decode].sum())
    charged = int(rows.expert_bytes[decode].sum())          # the trace charges each read to the row that paid it
    tokens = len(np.unique(rows.step[decode]))
    assert point.decode_read_mib_per_token * tokens * 2**20 == charged
    # a sweep's run is untraced: its first decode only learns, so it drops fewer
    (untraced,) = drop_curve(trace, DropLever(lever.frac, in_prefill=lever.in_prefill), [BUDGET_MIB])
    assert untraced.dropped < point.dropped or lever.in_prefill


def test_without_a_threshold_the_replay_is_the_lossless_curve(runs):
    """F = 0 walks the same cache as the stack-distance curve, at every budget (cache off included)."""
    for path in (runs["f1"][1], runs["f05-prefill"][1], TINY):
        trace = read_route_trace(path)
        budgets = [0.0, 0.5, 1.0, 2.0, 2.9, 3.0, 3.5, 4.0, 6.0, 9.0, 12.0, 50.0]
        lossless = lru_curve(access_sequence(trace), budgets, trace.cycle_bytes)
        dropped = drop_curve(trace, DropLever(0.0), budgets)
        for a, b in zip(lossless, dropped):
            assert (a.hit_pct_cum, a.hit_pct_decode, a.read_mib) == pytest.approx(
                (b.hit_pct_cum, b.hit_pct_decode, b.read_mib), abs=1e-9), (path, a.budget_mib)
            assert b.dropped == 0 and b.decode_read_mib_per_token == b.lossless_decode_read_mib_per_token


def test_the_walk_over_every_budget_is_the_one_budget_simulation(runs):
    """The vectorised walk and the plain per-budget LRU agree on every count, on bmoe-py's traces and
    upstream's gpt-oss one, for each switch that moves a decision."""
    levers = [DropLever(1.0), DropLever(0.5, traced=True), DropLever(0.75, in_prefill=True)]
    for path in (runs["f1"][1], runs["f05-prefill"][1], GPTOSS):
        trace = read_route_trace(path)
        routing = drop_routing(trace)
        cycle = trace.cycle_bytes / 2**20
        budgets = [0.0, cycle * 0.3, cycle - 0.01, cycle, cycle * 1.4, cycle * 2.5, cycle * 40]
        for lever in levers:
            for budget, point in zip(budgets, drop_curve(trace, lever, budgets, routing)):
                want = simulate_drop(routing, lever, mib_to_bytes(budget))
                assert point.dropped == want["dropped"], (path, lever, budget)
                assert point.read_mib * 2**20 == want["read_bytes"], (path, lever, budget)
                hit = 100.0 * want["hits"] / want["lookups"] if want["lookups"] else 0.0
                assert point.hit_pct_cum == pytest.approx(hit, abs=1e-9), (path, lever, budget)


def test_dropping_saves_reads_near_the_cycle(runs):
    """Measured on this trace, not a theorem (a dropped expert routed again soon is read then): near
    the cycle a drop saves reads, and at no budget above it does the replay read more than lossless."""
    trace = read_route_trace(runs["f1"][1])
    points = drop_curve(trace, DropLever(1.0), [3.0, 4.0, 6.0, 9.0])
    assert all(p.dropped > 0 for p in points)
    assert all(p.decode_read_mib_per_token <= p.lossless_decode_read_mib_per_token for p in points)
    assert points[0].decode_read_mib_per_token < 0.7 * points[0].lossless_decode_read_mib_per_token


def test_the_cli_prints_the_drop_table_and_json_and_refuses_bad_levers(runs):
    group = _Group(commands={"replay": replay})
    trace = str(runs["f05-prefill"][1])
    r = CliRunner().invoke(group, ["replay", trace, "--budgets", "0,4", "--drop-cold-experts", "1"])
    assert r.exit_code == 0, r.output
    assert "drop    --drop-cold-experts 1:" in r.output and "the engine refuses the lever" in r.output
    r = CliRunner().invoke(group, ["replay", trace, "--budgets", "4", "--drop-cold-experts", "0.5", "--drop-traced",
                                   "--json"])
    assert r.exit_code == 0, r.output
    drop = json.loads(r.output)["traces"][0]["drop"]
    (want,) = drop_curve(read_route_trace(trace), DropLever(0.5, traced=True), [4.0])
    assert drop["frac"] == 0.5 and drop["traced"] and drop["points"] == [want.to_dict()]
    assert "drop" not in json.loads(CliRunner().invoke(group, ["replay", trace, "--json"]).output)["traces"][0]
    for bad in (["--drop-cold-experts", "1.5"], ["--drop-cold-experts", "nan"], ["--drop-in-prefill"]):
        r = CliRunner().invoke(group, ["replay", trace, *bad])
        assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, (bad, r.output)
    with pytest.raises(ReplayError):
        DropLever(-0.1)


def test_the_budget_chart_draws_the_drop_curve_beside_the_measured_drop_points(runs):
    """A group whose series ran --drop-cold-experts gets the replay under it and its measured points,
    from the group's trace; a group without drop runs or without a readable trace gets none."""
    summary = read_metrics_csv(runs["f1"][0]).summary
    measured = SimpleNamespace(flags=("--drop-cold-experts", "1.0"), ok=1, budget_mib=float(BUDGET_MIB),
                               hit_pct=float(summary["cache_hit_pct"]), label=f"{BUDGET_MIB} MiB",
                               run_ids=("c/drop/1",))
    lossless = SimpleNamespace(flags=(), ok=1, budget_mib=float(BUDGET_MIB), hit_pct=50.0, label="4 MiB",
                               run_ids=("c/lossless/1",))
    group = SimpleNamespace(replay=SimpleNamespace(trace_path=str(runs["f05-prefill"][1]), budgets_mib=(0.0, 2.0, 6.0),
                                                   run_id="c/lossless/1"),
                            points=(lossless, measured))
    line, marks = drop_replay_traces(group)
    want = {p.budget_mib: p for p in drop_curve(read_route_trace(runs["f05-prefill"][1]), DropLever(1.0),
                                                [0.0, 2.0, 4.0, 6.0])}
    assert line["x"] == [0.0, 2.0, 4.0, 6.0]
    assert line["y"] == [None, *(want[b].hit_pct_cum for b in (2.0, 4.0, 6.0))]
    assert marks["x"] == [4.0] and marks["y"] == [measured.hit_pct] and "predicted" in marks["text"][0]
    assert "lower bound" in marks["text"][0]       # no drop run's trace beside it: the lossless routing
    assert drop_replay_traces(SimpleNamespace(replay=group.replay, points=(lossless,))) == []
    gone = SimpleNamespace(replay=SimpleNamespace(trace_path=str(runs["f05-prefill"][1]) + ".gone", budgets_mib=(2.0,),
                                                  run_id="c/lossless/1"),
                           points=(measured,))
    assert drop_replay_traces(gone) == []
    assert _drop_lever(("--drop-cold-experts=0.5", "--drop-in-prefill")) == DropLever(0.5, in_prefill=True)
    assert _drop_lever(("--drop-cold-experts", "0")) is None and _drop_lever(("--drop-cold-experts", "2")) is None


def test_every_budget_is_replayed_from_the_drop_trace_taken_at_the_lowest_budget(runs):
    """drop_curve_from: every budget above 0 takes the lossy trace of the lowest budget, wherever it
    stands among those given, and re-simulates residency and drops there (not the trace's own
    columns); budget 0 (cache off, lossless) and no lossy trace take the trace asked of; the
    lossless column stays that trace's; of two at the lowest budget, the first given."""
    base, f1 = read_route_trace(runs["f05-prefill"][1]), read_route_trace(runs["f1"][1])
    lever = DropLever(1.0, traced=True)
    budgets = [0.0, 2.0, 4.0, 5.5, 6.0, 12.0]
    points = drop_curve_from(base, lever, budgets, [LossyTrace(base, 8.0), LossyTrace(f1, 4.0)])
    from_f1, from_base = drop_curve(f1, lever, budgets), drop_curve(base, lever, budgets)
    for i, budget in enumerate(budgets):
        want, routing = (from_base, "") if budget == 0 else (from_f1, str(runs["f1"][1]))
        p = points[i]
        assert (p.decode_read_mib_per_token, p.dropped, p.hit_pct_cum) == (
            want[i].decode_read_mib_per_token, want[i].dropped, want[i].hit_pct_cum), budget
        assert p.lossless_decode_read_mib_per_token == from_base[i].lossless_decode_read_mib_per_token
        assert p.routing_path == routing and (p.to_dict().get("routing") is None) == (routing == "")
        assert p.routing_budget_mib == 4.0 or (budget == 0 and math.isnan(p.routing_budget_mib))
    # at 12 MiB the replay is not the one from the trace taken at 8 MiB (the nearest), and at 2 MiB
    # the f1 run's own residency (4 MiB) would be wrong: the walk re-simulated it
    assert points[5].decode_read_mib_per_token != from_base[5].decode_read_mib_per_token
    assert points[1].decode_read_mib_per_token != from_f1[2].decode_read_mib_per_token
    assert drop_curve_from(base, lever, budgets) == from_base
    (tie,) = drop_curve_from(base, lever, [2.0], [LossyTrace(base, 4.0), LossyTrace(f1, 4.0)])
    assert tie.routing_path == str(runs["f05-prefill"][1])


def test_a_lossy_trace_must_be_a_drop_run_of_no_larger_f(runs):
    f1, f05 = read_route_trace(runs["f1"][1]), read_route_trace(runs["f05-prefill"][1])
    check_lossy(LossyTrace(f05, 4.0), DropLever(0.5), like=f1)
    check_lossy(LossyTrace(f05, 4.0), DropLever(1.0))              # a smaller F passes: the trace cannot tell
    bad = [(LossyTrace(f1, 4.0), DropLever(0.25), None, "larger --drop-cold-experts"),
           (LossyTrace(read_route_trace(TINY), 4.0), DropLever(1.0), None, "no dropped routings"),
           (LossyTrace(f1, 4.0), DropLever(1.0), read_route_trace(TINY), "not the model"),
           (LossyTrace(f1, 0.0), DropLever(1.0), None, "more than 0 MiB")]
    for lossy, lever, like, words in bad:
        with pytest.raises(ReplayError, match=words):
            check_lossy(lossy, lever, like=like)


def test_the_cli_replays_from_a_drop_runs_trace_and_says_which(runs):
    group = _Group(commands={"replay": replay})
    trace, lossy = str(runs["f05-prefill"][1]), str(runs["f1"][1])
    r = CliRunner().invoke(group, ["replay", trace, "--budgets", "0,4", "--drop-cold-experts", "1"])
    assert "drop run's" in r.output and "--drop-trace" in r.output        # its own trace has drops: it says so
    r = CliRunner().invoke(group, ["replay", trace, "--budgets", "0,2,4", "--drop-cold-experts", "1",
                                   "--drop-trace", f"4:{lossy}"])
    assert r.exit_code == 0, r.output
    assert f"{lossy} at 4 MiB" in r.output and "drop run at 4 MiB" in r.output
    r = CliRunner().invoke(group, ["replay", trace, "--budgets", "2", "--drop-cold-experts", "1", "--json",
                                   "--drop-trace", f"4:{lossy}"])
    (point,) = json.loads(r.output)["traces"][0]["drop"]["points"]
    (want,) = drop_curve(read_route_trace(lossy), DropLever(1.0), [2.0])
    assert point["routing"] == {"path": lossy, "budget_mib": 4.0}
    assert point["decode_read_mib_per_token"] == want.decode_read_mib_per_token
    for bad in (["--drop-trace", f"4:{lossy}"], ["--drop-cold-experts", "1", "--drop-trace", lossy],
                ["--drop-cold-experts", "1", "--drop-trace", f"0:{lossy}"],
                ["--drop-cold-experts", "0.25", "--drop-trace", f"4:{lossy}"],
                ["--drop-cold-experts", "1", "--drop-trace", f"4:{TINY}"]):
        r = CliRunner().invoke(group, ["replay", trace, *bad])
        assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, (bad, r.output)


def test_the_chart_takes_the_groups_traced_drop_run(runs, tmp_path):
    """A traced drop run of the group's F in the replay trace's campaign directory is the routing the
    chart replays (its hover says so), the one at the lowest budget that has one when several do;
    without its trace the chart falls back to the lossless one."""
    for cell, name in (("lossless", "f05-prefill"), ("drop", "f1"), ("drop-high", "f05-prefill")):
        (tmp_path / "runs" / cell / "1").mkdir(parents=True)
        shutil.copy(runs[name][1], tmp_path / "runs" / cell / "1" / "route.csv")
    measured = SimpleNamespace(flags=("--drop-cold-experts", "1.0"), ok=1, budget_mib=float(BUDGET_MIB), hit_pct=60.0,
                               label="4 MiB", run_ids=("c/drop/1",))
    higher = SimpleNamespace(**{**vars(measured), "budget_mib": 6.0, "label": "6 MiB", "run_ids": ("c/drop-high/1",)})
    replayed = SimpleNamespace(trace_path=str(tmp_path / "runs" / "lossless" / "1" / "route.csv"),
                               budgets_mib=(2.0, 6.0), run_id="c/lossless/1")
    line, marks = drop_replay_traces(SimpleNamespace(replay=replayed, points=(higher, measured)))
    want = drop_curve(read_route_trace(runs["f1"][1]), DropLever(1.0), [2.0, 4.0, 6.0])
    assert line["y"] == [p.hit_pct_cum for p in want]
    assert all("from the drop run's trace at 4 MiB" in text for text in marks["text"])
    other = SimpleNamespace(**{**vars(measured), "run_ids": ("elsewhere/drop/1",)})   # another campaign's run
    _, marks = drop_replay_traces(SimpleNamespace(replay=replayed, points=(other,)))
    assert "lower bound" in marks["text"][0]
