"""The typed cell config: what a campaign directory holds stays byte for byte what it was.

tests/fixtures/store/ was written by bmoe-fleet before the config was typed (plan.json, and the
configs of a knee cell and its probe as their run.json hold them after resolving on a device);
resolved.json also holds the campaign that made them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.campaign.file import parse_campaign
from harness.plan.grid import make_plan, read_plan, resolve_knee, resolve_threads, write_plan
from store.campaign_dir import CampaignDir
from store.cells import PLANNED_KEYS, CellConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "store"


def _text(config: CellConfig) -> str:
    return json.dumps(config.to_dict())            # key order included


def test_a_plan_written_before_the_typed_config_reads_and_writes_back_byte_for_byte(tmp_path):
    plan = read_plan(CampaignDir(FIXTURES))
    assert plan is not None and len(plan.cells) == 32 and len(plan.probes) == 1
    assert all(isinstance(c.config, CellConfig) for c in plan.cells + plan.probes)
    out = CampaignDir(tmp_path)
    write_plan(out, plan)
    assert out.plan_path.read_bytes() == (FIXTURES / "plan.json").read_bytes()


@pytest.fixture(scope="module")
def golden(tiny_model):
    """The fixture's campaign, planned today on the tests' tiny model (cell ids hash no path)."""
    saved = json.loads((FIXTURES / "resolved.json").read_text())
    data = dict(saved["campaign"], models={"m": str(tiny_model)})
    campaign = parse_campaign(data)
    return saved, campaign, make_plan(campaign)


def test_todays_planner_makes_the_cells_an_older_directory_holds(golden):
    _, _, plan = golden
    old = read_plan(CampaignDir(FIXTURES))
    assert old is not None
    assert [c.cell_id for c in plan.cells] == [c.cell_id for c in old.cells]
    assert [_text(c.config) for c in plan.cells] == [_text(c.config) for c in old.cells]
    assert [(c.cell_id, _text(c.config)) for c in plan.probes] == [(c.cell_id, _text(c.config)) for c in old.probes]


def test_a_config_resolved_on_a_device_is_stored_as_it_was(golden):
    """A knee cell gets its budget from the probe, then `-t auto` the device's cores: run.json's
    config has the new keys after the planned ones, in that order."""
    saved, campaign, plan = golden
    knee = plan.cell(saved["knee"]["cell_id"])
    probe = plan.probe_for(knee)
    resolved = resolve_threads(campaign, resolve_knee(campaign, knee, 37, probe.cell_id), 2)
    assert json.dumps(resolved.config.to_dict()) == json.dumps(saved["knee"]["config"])
    assert resolved.config.threads == 2 and resolved.config.threads_auto is True and resolved.config.knee_mb == 37
    assert resolved.argv[resolved.argv.index("-t") + 1] == "2"
    probe_run = resolve_threads(campaign, probe, 2)
    assert json.dumps(probe_run.config.to_dict()) == json.dumps(saved["probe"]["config"])


def test_planned_configs_have_the_planned_keys_and_the_optional_ones_only_when_set():
    values = dict(moe_stream=True, no_mmap=False, cache_mb=512, cache_auto=False, cache_ceil_mb=0, cache_floor_mb=256,
                  force_cache=True, force_cache_auto=True, dense_weights="anon", n_expert_used=4, io_threads=4,
                  threads="auto", n_predict=32, prompt="p", o_direct=True, route_trace=False, budget_spec="cycle*1.2",
                  cycle_mb=123.4)
    plain = CellConfig.planned(**values)
    assert tuple(plain.to_dict()) == PLANNED_KEYS and plain.engine_args == () and not plain.engine_flags
    full = CellConfig.planned(**values, engine_args=["--ubatch", "512"], engine_flags={"--prefetch": 2})
    assert tuple(full.to_dict()) == (*PLANNED_KEYS, "engine_args", "engine_flags")
    assert full.to_dict()["engine_args"] == ["--ubatch", "512"] and full.engine_flags == {"--prefetch": 2}
    assert plain != full and plain == CellConfig.planned(**values)


def test_an_imported_config_keeps_its_own_keys_and_order():
    stated = {"arch": "qwen3moe", "budget_spec": "imported", "cache_mb": 2000.0, "model": "q", "moe_stream": True,
              "n_expert_used": 8, "o_direct_reported": 1, "overlap": True, "source": "bench/x",
              "unknown_tokens": ["zz"]}
    config = CellConfig.from_dict(stated)
    assert json.dumps(config.to_dict()) == json.dumps(stated)
    assert config.cache_mb == 2000.0 and config.moe_stream is True and config.n_expert_used == 8
    assert config.extra == {"arch": "qwen3moe", "model": "q", "o_direct_reported": 1, "overlap": True,
                            "source": "bench/x", "unknown_tokens": ["zz"]}
    assert config.cache_auto is None and config.prompt == "" and config.engine_args == ()     # absent: empty


def test_a_change_keeps_the_order_a_dict_update_gives():
    config = CellConfig.from_dict({"threads": "auto", "cache_mb": None, "budget_spec": "knee*1"})
    changed = config.with_(cache_mb=40, knee_mb=33, threads=4, source="s")
    assert list(changed.to_dict().items()) == [("threads", 4), ("cache_mb", 40), ("budget_spec", "knee*1"),
                                               ("knee_mb", 33), ("source", "s")]
    assert config.cache_mb is None                                       # frozen: the original is unchanged


def test_configs_compare_as_their_json_objects():
    a = CellConfig.from_dict({"cache_mb": 1, "threads": 2})
    assert a == CellConfig.from_dict({"threads": 2, "cache_mb": 1})      # order does not matter
    assert a != CellConfig.from_dict({"cache_mb": 1, "threads": 2, "probe_cell_id": None})   # a key more does
    assert a != {"cache_mb": 1, "threads": 2}


def test_keys_and_values_must_agree():
    with pytest.raises(ValueError, match="do not match"):
        CellConfig(cache_mb=1, keys=("cache_mb", "nonsense"))
    with pytest.raises(ValueError, match="do not match"):
        CellConfig(extra={"source": "x"}, keys=())
