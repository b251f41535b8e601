"""The bmoe-fleet CLI driven in-process with click's CliRunner."""

from __future__ import annotations

import json

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


def test_inspect_prints_the_cycle_lines(tiny_model):
    result = _invoke("model", "inspect", tiny_model)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    # model top-k 2, plus 4 (2 is the model's own): token cycle = 3 layers x 19584 B x k
    assert f"top-k 2: token cycle {3 * 19584 * 2 / 2**20:.1f} MiB, widest layer {19584 * 2 / 2**20:.1f} MiB" in lines
    assert f"top-k 4: token cycle {3 * 19584 * 4 / 2**20:.1f} MiB, widest layer {19584 * 4 / 2**20:.1f} MiB" in lines
    assert not any(line.startswith("top-k 8") for line in lines)


def test_inspect_json_and_explicit_top_ks(tiny_model):
    result = _invoke("model", "inspect", tiny_model, "--top-k", 1, "--top-k", 8, "--json")
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
def test_errors_are_one_line_and_exit_1(tmp_path, tiny_model, setup, args, message):
    p = tmp_path / "x.gguf"
    if setup == "text":
        p.write_text("not a model")
    elif setup == "model":
        p = tiny_model
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


def test_the_demo_plans_each_phones_probe_budgets_loads_planner_and_turns(tmp_path, tiny_model):
    """The demo's two campaigns as `bmoe-fleet demo` builds them (harness.demo), planned, not run: on
    each phone one route-traced probe, budgets under and over the cycle, at the knee, past the small
    phone's RAM and `auto` under each ceiling, all beside each load of other apps, the engine's own
    planner beside each load, and a session of three turns. The demo run itself, and what its phones
    show (about four minutes), is benchmarks/demo_check.py."""
    from harness.demo import APPS, GAP_APP, PHONES, TURNS, _campaign, _turns_campaign
    from harness.plan.grid import make_plan

    devices = [f"virtual:{name}" for name in PHONES]
    plan = make_plan(_campaign(tiny_model, devices, 15037, tmp_path))
    assert sorted(c.device for c in plan.probes) == sorted(devices)
    assert all(c.config.probe and c.config.route_trace and c.config.cache_mb == 0 for c in plan.probes)
    for device in devices:
        cells = [c for c in plan.cells if c.device == device]
        for apps in APPS:
            beside = [c.config for c in cells if c.config.apps == apps]
            assert {c.budget_spec for c in beside} >= {"0", "cycle*0.9", "cycle*1.2", "cycle*4", "knee*1", "1400"}
            assert sorted(c.cache_ceil_mb for c in beside if c.cache_auto) == [0, 384, 480, 600]
            (planner,) = [c for c in beside if c.planner]
            assert planner.n_predict == 12
        assert {c.config.apps for c in cells} == set(APPS)
    (small,) = [ram for ram, _, _ in PHONES.values() if ram < 1 << 30]
    assert small < 1400 << 20                  # past the small phone's RAM
    turns = make_plan(_turns_campaign(tiny_model, devices, 15037, tmp_path))
    assert sorted(c.device for c in turns.cells) == sorted(devices)
    assert {(c.config.turns, c.config.gap_apps, c.config.budget_spec) for c in turns.cells} == {
        (TURNS, GAP_APP, "cycle*4")} and TURNS == 3
