"""Recommendations from real campaigns: a ceiling under what the phone killed and over the cycle, cache 0
(with the reason) where no safe budget clears the cycle, the per-device default, the evidence and
the replayed LRU citation."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from results.analysis.recommend import ceiling_mib, recommend, recommend_group, round_down
from results.analysis.recommend_argv import flag_value
from results.analysis.recommend_records import FORMAT, FORMAT_VERSION, RESERVE_FRACTION
from tests.results.conftest import UPSTREAM


def test_on_a_phone_that_kills_the_largest_budget_the_ceiling_sits_between_cycle_and_kill(vphone_campaign, cli):
    result = CliRunner().invoke(cli, ["recommend", str(vphone_campaign), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["format"], data["version"]) == (FORMAT, FORMAT_VERSION)
    (device,) = data["devices"]
    ram_mib = device["ram_total_kb"] / 1024
    assert device["device"] == "virtual:tight" and 100 < ram_mib < 512
    recs = {r["top_k"]: r for r in device["recommendations"]}

    k2 = recs[2]
    n = k2["auto"]["cache_ceil_mb"]
    assert k2["cycle_mib"] == 51 < n < k2["lmk"]["smallest_killed_mib"] == 256
    assert n <= k2["lmk"]["largest_safe_mib"] == 102
    assert flag_value(k2["auto"]["argv"], "--cache-mb") == "auto" and flag_value(k2["auto"]["argv"], "--cache-ceil-mb") == str(n)
    assert flag_value(k2["auto"]["argv"], "--n-expert-used") == "2" and "--moe-stream" in k2["auto"]["argv"]
    # the margin rule: the floor reached at 102 MiB against a reserve of 10 % of the phone's RAM
    floor, reserve = k2["auto"]["floor_mib"], k2["auto"]["reserve_mib"]
    assert math.isclose(reserve, RESERVE_FRACTION * ram_mib, abs_tol=1e-3) and 0 < floor < ram_mib
    assert math.isclose(k2["auto"]["margin_mib"], max(0.0, reserve - floor), abs_tol=1e-3)
    assert n == max(ceiling_mib(102, k2["auto"]["margin_mib"]), 51)
    assert not k2["cache_off"] and (51 <= k2["fixed"]["cache_mb"] <= n or k2["fixed"]["cache_mb"] == 0)
    assert k2["evidence"]["runs"] == 6 and k2["evidence"]["repeats_at_largest_safe"] == 2
    # over adb the kernel's OOM killer took the engine (lmkd never considers it): a bare SIGKILL
    assert len(k2["evidence"]["killed_runs"]) == 2 and "with no lmkd or kernel kill line" in k2["evidence"]["kill_evidence"][0]
    assert k2["lmk"]["killed_by"] == "the kernel (SIGKILL with no lmkd line)"
    assert k2["confidence"] in ("low", "medium") and any("probe" in r for r in k2["confidence_reasons"])
    assert k2["under_cycle_budgets_mib"] == [25]

    k8 = recs[8]
    assert k8["cache_off"] and k8["auto"] is None and flag_value(k8["fixed"]["argv"], "--cache-mb") == "0"
    assert "--force-cache" not in k8["fixed"]["argv"] and flag_value(k8["fixed"]["argv"], "--n-expert-used") == "8"
    assert not k8["fixed"]["measured"]            # no cache-0 cell was run: the measured flags with budget 0
    assert "no budget that survived every repeat clears the 204 MiB token cycle" in k8["reason"]
    assert "largest, 102 MiB, is under it" in k8["reason"] and "strictly better" in k8["reason"]
    assert k8["lmk"]["largest_safe_mib"] == 102 and k8["under_cycle_budgets_mib"] == [102]

    # what an app would ship on this phone: the lowest safe ceiling, and which model needs cache 0
    assert device["default"]["cache_ceil_mb"] == n
    assert device["default"]["argv"] == ["--moe-stream", "--cache-mb", "auto", "--cache-floor-mb", "1536",
                                         "--cache-ceil-mb", str(n)]
    assert any(note.startswith("alpha at top-k 8: ship --cache-mb 0") for note in device["default"]["notes"])

    text = CliRunner().invoke(cli, ["recommend", str(vphone_campaign)]).output
    assert f"default --cache-mb auto --cache-ceil-mb {n}" in text and "no auto ceiling" in text


def test_with_no_margin_the_ceiling_is_the_budget_that_survived_not_a_rounder_number():
    # the demo's small phone: 384 MiB survived with MemAvailable above the reserve; 380 was never run
    assert ceiling_mib(384, 0.0) == 384 and ceiling_mib(68.85, 0.0) == 68
    # a margin makes a new number anyway: it reads like a setting, and stays under what survived
    assert ceiling_mib(384, 20.5) == round_down(363.5) == 360 and ceiling_mib(1400, 0.4) == 1390
    assert ceiling_mib(150, 0.4) == 149


def test_a_route_trace_makes_the_recommendation_cite_the_replayed_curve(local_campaign):
    recs = recommend([local_campaign])
    (device,) = recs.devices
    r = recs.find("local", "small", 2)
    assert device.default.cache_ceil_mb == r.auto.cache_ceil_mb
    assert r.cycle_source == "csv" and not r.cache_off
    assert r.auto.cache_ceil_mb >= r.cycle_mib and r.lmk["smallest_killed_mib"] is None
    assert any("no kill observed" in reason for reason in r.confidence_reasons)
    c = r.replay
    assert c is not None and c.run_id.startswith("local-sweep/") and math.isclose(c.cycle_mib, r.cycle_mib, abs_tol=1e-3)
    assert c.knee_mib is not None and c.predicted_hit_pct_at_ceiling is not None
    if r.fixed.cache_mb > 0:
        # the measured hit at the recommended fixed budget lies on the replayed curve
        assert abs(c.predicted_hit_pct_at_fixed - c.measured_hit_pct_at_fixed) <= 0.05 + 1e-9
    assert r.dense_mode in ("anon", "warm") and {m["mode"] for m in r.dense_modes} == {"anon", "warm"}
    assert r.evidence["runs"] == 20 and r.confidence in ("low", "medium", "high")


def test_upstream_runs_recommend_with_their_evidence(imported):
    recs = recommend([imported], {"tiny": str(UPSTREAM / "host-v2-0.19.0" / "tiny-qwen3moe.gguf")})
    gpt = recs.find("<script>alert(1)</script>", "gpt-oss-120b-Q4_K_M", 4)
    # 2000 MiB (over the 1815.4 MiB cycle at top-k 4) beat streaming without a cache on the phone
    assert gpt.cycle_mib == 1815.4 and gpt.cycle_source == "token_demand"
    assert gpt.fixed.cache_mb == 2000 and gpt.fixed.measured and gpt.fixed.tok_s > 1.2
    assert gpt.confidence != "high" and any("token_demand_MiB" in r for r in gpt.confidence_reasons)
    # the phone's RAM is not in upstream's files: the reserve comes from what was free at the start
    assert gpt.auto.reserve_mib < 1000 and "device RAM unknown" in gpt.auto.why
    # the route-trace run: replayed at 3000 MiB the curve gives the 32.4 % the phone measured
    traced = recs.find("<script>alert(1)</script>", "gpt-oss", 2)
    assert traced.replay is not None and math.isclose(traced.replay.cycle_mib, 907.69, abs_tol=0.01)
    assert traced.replay.first_decode_hit_mib < 907.7 < traced.replay.knee_mib
    tiny = recs.find("<script>alert(1)</script>", "tiny", 2)
    assert tiny.cycle_source == "gguf" and tiny.cycle_mib == 1.5
    # imported runs kept no argv: theirs is a typed configuration rebuilt from their columns, put
    # through the function that writes every measured argv (same order, nothing edited as a string)
    from results.analysis.recommend_argv import rebuilt_config
    from results.read.table import build_table
    from store.engine_argv import settings_argv

    rows = {r["run_id"]: r for r in build_table([imported]).to_dict("records")}
    (run,) = [rows[i] for i in gpt.fixed.run_ids[:1]]
    assert gpt.fixed.argv_source == "rebuilt"
    assert gpt.fixed.argv == tuple(settings_argv(rebuilt_config(run).with_(cache_mb=2000, force_cache=False)))
    assert gpt.fixed.argv[:4] == ("-t", "4", "--n-expert-used", "4") and gpt.fixed.argv.count("--moe-stream") == 1
    # a run the engine refused is no evidence for or against any budget: no recommendation from it
    with pytest.raises(KeyError):
        recs.find("<script>alert(1)</script>", "bad", None)


def test_a_largest_safe_budget_under_1_mib_recommends_cache_off_not_a_ceiling_of_0():
    """--cache-ceil-mb takes whole MiB and 0 there means no ceiling: a tiny model whose 0.5 MiB
    survived (cycle 0.4 MiB) and whose 2 MiB was killed must not get `--cache-ceil-mb 0`."""
    import dataclasses

    from tests.results.test_app_rung import group, point

    g = dataclasses.replace(group([point(0, tok_s=2.0), point(0.5), point(2, killed=2)]), cycle_mib=0.4)
    rec = recommend_group(g)
    assert rec.cache_off and rec.auto is None, rec
    assert "0.5 MiB, is under 1 MiB" in rec.reason and rec.reason.endswith("recommend --cache-mb 0")


def test_every_runs_stored_argv_is_its_typed_config_and_recommendations_are_built_from_it(vphone_campaign,
                                                                                          local_campaign):
    """The recommended argv is the chosen runs' CellConfig put through the function
    that built the argv they ran (store.engine_argv); the stored argv stays the record, and on
    every run of a real campaign the two agree."""
    from results.analysis.recommend_argv import argv_of_runs, config_of, settings_of
    from results.read.table import build_table
    from store.engine_argv import settings_argv

    for camp in (vphone_campaign, local_campaign):
        rows = {r["run_id"]: r for r in build_table([camp]).to_dict("records")}
        assert rows
        for r in rows.values():
            assert settings_of(list(r["argv"])) == tuple(settings_argv(config_of(r))), r["run_id"]
        for device in recommend([camp]).devices:
            for rec in device.recommendations:
                m = argv_of_runs(rec.fixed.run_ids, rows)
                assert m.source == "measured" and rec.fixed.argv == m.fixed(rec.fixed.cache_mb)
                c = m.config.with_(moe_stream=True, cache_auto=False, cache_mb=rec.fixed.cache_mb,
                                   force_cache=0 < rec.fixed.cache_mb < 1500)
                assert rec.fixed.argv == tuple(settings_argv(c))
