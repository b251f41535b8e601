"""The bmoe-fleet CLI driven in-process with click's CliRunner."""

from __future__ import annotations

import json
import math
import re

import click
import pytest
from click.testing import CliRunner

from harness.cli.main import main


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _all_commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


def test_every_command_has_help_text():
    commands = list(_all_commands(main))
    assert len(commands) >= 3
    for path, cmd in commands:
        assert cmd.help and cmd.help.strip(), f"{' '.join(path)} has no help text"
        for param in cmd.params:
            if isinstance(param, click.Option):
                assert param.help, f"{' '.join(path)} {param.opts[0]} has no help text"


def test_inspect_prints_the_cycle_lines(small_qwen):
    result = _invoke("model", "inspect", small_qwen)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    # model top-k 2, plus 4 (2 is the model's own): token cycle = 3 layers x 19584 B x k
    assert f"top-k 2: token cycle {3 * 19584 * 2 / 2**20:.1f} MiB, widest layer {19584 * 2 / 2**20:.1f} MiB" in lines
    assert f"top-k 4: token cycle {3 * 19584 * 4 / 2**20:.1f} MiB, widest layer {19584 * 4 / 2**20:.1f} MiB" in lines
    assert not any(line.startswith("top-k 8") for line in lines)


def test_inspect_json_and_explicit_top_ks(small_qwen):
    result = _invoke("model", "inspect", small_qwen, "--top-k", 1, "--top-k", 8, "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["format"] == "bmoe-fleet.model-shape" and data["version"] == 1
    assert [p["top_k"] for p in data["prices"]] == [1, 8]
    assert data["prices"][1]["cycle_bytes"] == 3 * 19584 * 8
    assert data["layers"][0]["tensors"][0]["expert_stride_bytes"] * 3 == 19584
    assert data["n_expert"] == 8 and data["moe_layers"] == [0, 1, 2]


@pytest.mark.parametrize("setup, args, message", [
    ("text", ["model", "inspect", "{p}"], "not a GGUF file"),
    ("model", ["model", "inspect", "{p}", "--top-k", "9"], "top-k 9 is above this model's n_expert of 8"),
    ("none", ["model", "synth", "{p}", "--preset", "gpt-oss", "--quant", "Q4_0"], "not offered for gpt-oss"),
    ("none", ["model", "synth", "{p}", "--size", "lots"], "cannot read 'lots' as a size"),
])
def test_errors_are_one_line_and_exit_1(tmp_path, small_qwen, setup, args, message):
    p = tmp_path / "x.gguf"
    if setup == "text":
        p.write_text("not a model")
    elif setup == "model":
        p = small_qwen
    result = CliRunner().invoke(main, [a.format(p=p) for a in args])
    assert result.exit_code == 1
    assert message in result.output
    assert result.output.strip().count("\n") == 0 and result.output.startswith("Error: ")


def test_synth_then_inspect_round_trip(tmp_path):
    out = tmp_path / "m.gguf"
    result = _invoke("model", "synth", out, "--preset", "gpt-oss", "--layers", 3, "--experts", 8, "--top-k", 2,
                     "--hidden", 64, "--expert-ffn", 32, "--vocab", 300, "--json")
    assert result.exit_code == 0
    written = json.loads(result.output)
    assert written["paths"] == [str(out)] and written["options"]["quant"] == "MXFP4"
    shape = json.loads(_invoke("model", "inspect", out, "--json").output)
    assert (shape["arch"], shape["n_layer"], shape["n_expert"], shape["top_k"]) == ("gpt-oss", 3, 8, 2)
    assert shape["layers"][0]["expert_bytes"] == 3 * (64 * 32 // 32 * 17)


def test_synth_size_and_split(tmp_path):
    out = tmp_path / "m.gguf"
    result = _invoke("model", "synth", out, "--size", "12MiB", "--split", 2, "--quiet")
    assert result.exit_code == 0
    shards = sorted(p.name for p in tmp_path.iterdir())
    assert shards == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert abs(total - 12 * 2**20) <= 0.05 * 12 * 2**20
    assert "target 12.0 MiB" in result.output
    inspected = _invoke("model", "inspect", tmp_path / shards[1])
    assert "2 files" in inspected.output


def test_demo_writes_and_prices_a_model(tmp_path):
    result = _invoke("demo", "--out", tmp_path / "demo")
    assert result.exit_code == 0, result.output[-2000:]
    assert (tmp_path / "demo" / "demo-qwen3moe.gguf").stat().st_size > 60 * 2**20
    assert "top-k 4: token cycle" in result.output
    # each phone ran one route-traced probe, and its knee cell ran at the knee the probe replays to
    from harness.plan.probe import knee_of_trace
    from results.read.route_trace import read_route_trace
    from results.replay.lru_replay import access_sequence, lru_curve, stack_distances

    recs = [json.loads(p.read_text()) for p in (tmp_path / "demo" / "campaign").glob("runs/*/*/run.json")]
    probes = {r["device"]: r for r in recs if r["probe"]}
    assert set(probes) == {"virtual:small", "virtual:large"}
    checked = 0
    for r in recs:
        if r["probe"] or r["outcome"] != "ok" or r["config"]["cache_auto"] or not r["config"]["cache_mb"]:
            continue
        trace = tmp_path / "demo" / "campaign" / "runs" / probes[r["device"]]["cell_id"] / "1" / "route.csv"
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

    all_recs = recommend([tmp_path / "demo" / "campaign"]).all()
    assert sorted((r.device, r.apps) for r in all_recs) == sorted((d, a) for d in probes for a in APPS)
    for r in all_recs:                 # one recommendation per phone and load of other apps, named
        trace = tmp_path / "demo" / "campaign" / "runs" / probes[r.device]["cell_id"] / "1" / "route.csv"
        assert r.replay.knee_mib == knee_of_trace(trace).knee_mib
        assert r.reason.startswith(f"with {r.apps} open: ")
        if r.device == "virtual:large":
            # the 1400 MiB cache survived without filling (the prompt routes to ~640 MiB of the bank):
            # it proves nothing, so the ceiling is the largest budget whose cache filled, 600
            assert 1400 in [u["budget_mib"] for u in r.lmk["unfilled"]]
            assert all(u["held_mib"] < 0.95 * 1032 for u in r.lmk["unfilled"])
            assert r.auto.cache_ceil_mb == 600
        else:
            # the small phone swaps (zram) beside the app: a budget past the RAM left survives while
            # swapped back in (or while lmkd kills the perceptible app), is fought, and the ceiling
            # sits under it and under any kill
            unsafe = [f["budget_mib"] for f in r.lmk["fought"]] + [r.lmk["smallest_killed_mib"] or math.inf]
            assert r.lmk["fought"] and r.auto.cache_ceil_mb < min(unsafe), r.lmk
    # the session cells: three turns on each phone, each turn's hit % and reads recorded
    from results.read.rundir import read_campaigns
    from results.read.table import build_table

    turns = build_table(read_campaigns([tmp_path / "demo" / "turns"]))
    assert sorted(turns["device"]) == sorted(probes) and set(turns["outcome"]) == {"ok"}
    assert all(len(json.loads(v)) == 3 for v in turns["turn_demand_hit_pct"])
    assert all(len(json.loads(v)) == 3 for v in turns["turn_read_mib"])
    assert "session cells (3 turns" in result.output
    index = (tmp_path / "demo" / "site" / "index.html").read_text()
    assert len(re.findall(r"knee \d+ MiB", index)) >= 2
    # issue 12: every recommended command line ran once on its phone and was accepted; none is under the cycle
    published = json.loads((tmp_path / "demo" / "site" / "recommendations.json").read_text())
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
    assert verified >= 3 and "verify fixed: accepted" in result.output
    # issue 26 item 5: the engine's own planner ran on each phone beside each load, its plan recorded
    # (the budget it chose is the one its run had) and set beside the boundary the sweep measured
    from results.read.parse import read_metrics_csv

    planned = {(r["device"], r["config"].get("apps")): r for r in recs if r["config"].get("planner")}
    assert set(planned) == {(d, a) for d in probes for a in APPS}
    for r in all_recs:
        (pick,) = r.planner
        run = planned[(r.device, r.apps)]
        folder = tmp_path / "demo" / "campaign" / "runs" / run["cell_id"] / "1"
        assert "plan: reproduce with" in (folder / "stderr.txt").read_text()
        assert pick["regime"] == "experts-stream" and pick["runs"] == 1, pick   # the bank is larger than RAM
        if run["outcome"] == "ok":
            assert int(read_metrics_csv(folder / "metrics.csv").preamble["cache_mb"]) == pick["budget_mib"]
        assert pick["budget_mib"] >= r.cycle_mib and pick["verdict"], pick
        safe = r.lmk["largest_safe_mib"]
        if run["outcome"] == "ok" and not pick["fought"] and safe is not None:
            assert ("within the measured boundary" in pick["verdict"]) == (pick["budget_mib"] <= safe), pick
        assert f"planner: {pick['budget_mib']:g} MiB (experts-stream) — {pick['verdict']}" in result.output
    pages = "".join(p.read_text() for p in (tmp_path / "demo" / "site").glob("devices/*.html"))
    assert pages.count("the engine&#39;s own planner") + pages.count("the engine's own planner") >= 4
