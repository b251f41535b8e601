"""Planning: the matrix, run order (interleaved repeats, reversed second pass), budgets relative to
the token cycle, automatic --force-cache, stable cell ids, and the dry run's exact argv."""

from __future__ import annotations

import json
import shlex

from click.testing import CliRunner

from engine.gguf.model import load_model_shape
from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import fleet_home
from harness.plan.grid import make_plan
from tests.harness.conftest import write_campaign

# gpt-oss-120b per the engine contract: 13,219,200 B per expert, 36 MoE layers.
EXPERT_BYTES, LAYERS = 13_219_200, 36


def cycle_mib(k: int) -> float:
    return EXPERT_BYTES * LAYERS * k / 2**20


def campaign(model, **sections):
    data = {"version": 1, "name": "p", "fleet": {"devices": ["local"]}, "models": {"m": str(model)}}
    data.update(sections)
    return parse_campaign(data, source="p.toml")


def test_repeats_interleave_across_configs_and_the_second_pass_reverses_the_first(tiny_model):
    c = campaign(tiny_model, axes={"cache_mb": [0, "auto", 1500], "dense_weights": ["anon", "warm"]},
                 run={"repeats": 3, "reverse_pass": True})
    plan = make_plan(c)
    cells = plan.for_device("local")
    configs = 3 * 2
    assert len(cells) == configs * 3 * 2
    assert [c.order for c in cells] == list(range(len(cells)))
    first, second = cells[: configs * 3], cells[configs * 3:]
    assert {c.pass_no for c in first} == {0} and {c.pass_no for c in second} == {1}
    # pass 0: every config's repeat r before any config's repeat r+1
    assert [c.repeat for c in first] == [r for r in range(3) for _ in range(configs)]
    keys = [json.dumps(c.config.to_dict(), sort_keys=True) for c in first]
    assert keys[:configs] == keys[configs: 2 * configs] == keys[2 * configs:]
    assert len(set(keys[:configs])) == configs
    # pass 1 runs the same (config, repeat) sequence backwards
    assert [(json.dumps(c.config.to_dict(), sort_keys=True), c.repeat) for c in second] == \
        [(k, c.repeat) for k, c in reversed(list(zip(keys, first)))]
    assert len({c.cell_id for c in cells}) == len(cells)


def test_cycle_relative_budgets_are_priced_at_the_applied_top_k(gptoss_120b_shape):
    c = campaign(gptoss_120b_shape, axes={"cache_mb": ["cycle*0.9", "cycle*1.2"], "n_expert_used": [0, 2]})
    cells = make_plan(c).cells
    got = {(cell.config.budget_spec, cell.config.n_expert_used): cell for cell in cells}
    assert set(got) == {("cycle*0.9", 4), ("cycle*0.9", 2), ("cycle*1.2", 4), ("cycle*1.2", 2)}
    for (spec, k), cell in got.items():
        factor = float(spec.split("*")[1])
        raw = cycle_mib(k) * factor
        expected = int(raw) if factor < 1 else int(raw) + 1
        assert cell.config.cache_mb == expected
        assert abs(cell.config.cycle_mb - cycle_mib(k)) < 1e-3
        assert cell.argv[cell.argv.index("--cache-mb") + 1] == str(expected)
        assert cell.argv[cell.argv.index("--n-expert-used") + 1] == str(k)
    assert got[("cycle*0.9", 4)].config.cache_mb == 1633 and got[("cycle*1.2", 2)].config.cache_mb == 1090
    # under 1500 MiB the harness adds --force-cache and says so on the cell
    for key, forced in ((("cycle*0.9", 4), False), (("cycle*1.2", 4), False), (("cycle*0.9", 2), True),
                        (("cycle*1.2", 2), True)):
        cell = got[key]
        assert cell.config.force_cache is forced and cell.config.force_cache_auto is forced
        assert ("--force-cache" in cell.argv) is forced


def test_budgets_in_the_pathological_band_get_force_cache(tiny_model):
    cells = make_plan(campaign(tiny_model, axes={"cache_mb": [0, 1, 1499, 1500, 4000, "auto", "mmap"]})).cells
    forced = {c.config.budget_spec: "--force-cache" in c.argv for c in cells}
    assert forced == {"0": False, "1": True, "1499": True, "1500": False, "4000": False, "auto": False, "mmap": False}
    mmap = next(c for c in cells if c.config.budget_spec == "mmap")
    assert "--moe-stream" not in mmap.argv and "--cache-mb" not in mmap.argv and "--io-threads" not in mmap.argv
    auto = next(c for c in cells if c.config.cache_auto)
    assert auto.argv[auto.argv.index("--cache-mb") + 1] == "auto"


def test_auto_takes_each_ceiling_and_numbers_ignore_them(tiny_model):
    cells = make_plan(campaign(tiny_model, axes={"cache_mb": ["auto", 2000], "cache_ceil_mb": [0, 3000, 6000]})).cells
    autos = [c for c in cells if c.config.cache_auto]
    assert sorted(c.config.cache_ceil_mb for c in autos) == [0, 3000, 6000]
    for c in autos:
        assert c.argv[c.argv.index("--cache-ceil-mb") + 1] == str(c.config.cache_ceil_mb)
    fixed = [c for c in cells if not c.config.cache_auto]
    assert len(fixed) == 1 and "--cache-ceil-mb" not in fixed[0].argv


def test_duplicate_configs_collapse_and_cell_ids_are_stable(tiny_model, mid_model):
    shape = load_model_shape(tiny_model)
    # 0 means the model's own top-k: listing it explicitly too gives the same config once
    c = campaign(tiny_model, axes={"cache_mb": [0, "mmap", "resident"], "n_expert_used": [0, shape.top_k],
                                   "io_threads": [2, 4]})
    cells = make_plan(c).cells
    # streamed: 2 io values; mmap/resident ignore io_threads: one each
    assert len(cells) == 2 + 1 + 1
    again = make_plan(campaign(tiny_model, axes={"cache_mb": [0, "mmap", "resident"],
                                                 "n_expert_used": [0, shape.top_k], "io_threads": [2, 4]}))
    assert [x.cell_id for x in again.cells] == [x.cell_id for x in cells]
    longer = make_plan(campaign(tiny_model, axes={"cache_mb": [0, "mmap", "resident"], "io_threads": [2, 4]},
                                run={"n_predict": 64}))
    assert not {x.cell_id for x in longer.cells} & {x.cell_id for x in cells}
    resident = next(x for x in cells if x.config.budget_spec == "resident")
    assert "--no-mmap" in resident.argv and "--moe-stream" not in resident.argv


def test_dry_run_prints_each_cells_exact_argv_and_writes_nothing(tmp_path, tiny_model, cli):
    path = write_campaign(tmp_path, f"""
version = 1
name = "dry"
[fleet]
devices = ["local"]
[models]
tiny = "{tiny_model}"
[axes]
cache_mb = [0, "cycle*1.2"]
[run]
n_predict = 4
repeats = 2
route_trace = true
prompt = "It's a test; $HOME stays literal"
""")
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    plan = make_plan(load_campaign(path))
    assert len(plan.cells) == 4
    lines = result.output.splitlines()
    for cell in plan.cells:
        at = next(i for i, line in enumerate(lines) if cell.cell_id in line)
        assert shlex.split(lines[at + 1]) == list(cell.argv)
    first = plan.cells[0]
    work = str(fleet_home() / "local")
    assert list(first.argv) == [
        f"{work}/bmoe-py", "-m", str(tiny_model), "-p", "It's a test; $HOME stays literal", "-n", "4", "-t", "<auto>",
        "--n-expert-used", "2", "--moe-stream", "--cache-mb", "0", "--io-threads", "4", "--dense-weights", "anon",
        "--csv", f"{work}/out/{first.cell_id}.csv", "--route-trace", f"{work}/out/{first.cell_id}.route.csv"]
    # -t auto is the device's cores, read right before each run: the plan says so instead of guessing
    assert any(line.startswith("-t <auto>: each device's online cores, at most 4") for line in lines)
    as_json = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--json"], catch_exceptions=False)
    data = json.loads(as_json.output)
    assert data["format"] == "bmoe-fleet.plan" and data["version"] == 1
    assert [c["argv"] for c in data["cells"]] == [list(c.argv) for c in plan.cells]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["camp.toml"]


def test_sweep_dry_run_plans_every_device_and_model(tmp_path, tiny_model, mid_model, cli):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["sweep", "--device", "local", "--model", str(tiny_model), "--model",
                                      str(mid_model), "--cache-mb", "0,auto,cycle*1.2,4000", "--dense-weights",
                                      "anon,warm", "--repeats", "2", "-n", "4", "-o", str(out), "--dry-run", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cells = json.loads(result.output)["cells"]
    assert len(cells) == 2 * 4 * 2 * 2
    assert {c["model"] for c in cells} == {"tiny", "mid"}
    mid_cycle = load_model_shape(mid_model).cycle_mib(load_model_shape(mid_model).top_k)
    mid_cycle_cells = [c for c in cells if c["model"] == "mid" and c["config"]["budget_spec"] == "cycle*1.2"]
    assert {c["config"]["cache_mb"] for c in mid_cycle_cells} == {int(mid_cycle * 1.2) + 1}
    assert not out.exists()


def test_other_apps_are_an_axis_whose_none_keeps_the_cell_ids(tmp_path, tiny_model):
    """`apps = ["none", "cached:64MiB + perceptible:32MiB"]`: each load its own cells, recorded in
    the cell's config and label; the value without apps plans the cells a campaign without the axis
    plans (same ids), and the resolved file reads back as the same campaign."""
    def on_a_phone(**axes):
        data = {"version": 1, "name": "p", "fleet": {"devices": ["R58N12345"]}, "models": {"m": str(tiny_model)},
                "axes": {"cache_mb": [0, 1500], **axes}}
        return parse_campaign(data, source="p.toml")

    with_axis, without = on_a_phone(apps=["none", "cached:64MiB + perceptible:32MiB"]), on_a_phone()
    assert with_axis.axes.apps == ("", "cached:64MiB+perceptible:32MiB")
    path = write_campaign(tmp_path, with_axis.to_toml(), "campaign.toml")
    assert load_campaign(path) == with_axis
    cells, plain = make_plan(with_axis).cells, make_plan(without).cells
    loaded = [c for c in cells if c.config.apps]
    assert {c.config.apps for c in loaded} == {"cached:64MiB+perceptible:32MiB"} and len(loaded) == len(plain) == 2
    assert {c.cell_id for c in cells} - {c.cell_id for c in loaded} == {c.cell_id for c in plain}
    assert all(c.label().endswith(" apps=cached:64MiB+perceptible:32MiB r0 p0") for c in loaded), \
        [c.label() for c in loaded]
    assert not any("apps" in c.config.to_dict() for c in cells if not c.config.apps)
