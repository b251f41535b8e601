"""Recommendations an app can ship (docs/decisions/recommendations.md): every command line is the one
measured, never under the
cycle, accepted by its engine (`recommend --verify`, bmoe-py and the real bmoe-cli); recommendations.json
version 2 validates against its schema, keys phones by what they report, carries no host path, and its
rule gives an unmeasured phone a ceiling; the docs' app-side lookup runs as written."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from engine.stream.budget import CACHE_MIN_MB
from harness.campaign.file import load_campaign
from harness.run.session import DeviceSession
from results.analysis.fleet_rules import rule_ceiling
from results.analysis.recommend import recommend
from results.analysis.recommend_argv import flag_value, settings_of
from results.analysis.recommend_records import FORMAT, FORMAT_VERSION
from results.read.rundir import read_campaigns
from tests.results.conftest import PROJECT

SCHEMA = json.loads((PROJECT / "results" / "schemas" / "recommendations-v2.schema.json").read_text())


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(doc)


def run_argvs(campaign_dir: Path) -> dict[str, tuple[str, ...]]:
    """Every run's settings as its run.json recorded the command line, by run id."""
    (camp,) = read_campaigns([campaign_dir])
    return {r.run_id: settings_of(list(r.record.argv)) for r in camp.runs}


def assert_measured(rec, measured: dict[str, tuple[str, ...]]) -> None:
    """The fixed argv is exactly its runs' settings; the auto argv is its runs' settings with only the
    ceiling changed; neither is under the cycle; --force-cache exactly in 1..1499."""
    if rec.fixed is not None:
        assert rec.fixed.argv_source == "measured" and rec.fixed.run_ids
        for rid in rec.fixed.run_ids:
            assert measured[rid] == rec.fixed.argv
        budget = int(flag_value(rec.fixed.argv, "--cache-mb"))
        assert budget == rec.fixed.cache_mb and (budget == 0 or budget >= rec.cycle_mib)
        assert ("--force-cache" in rec.fixed.argv) == (0 < budget < CACHE_MIN_MB)
    if rec.auto is not None:
        assert rec.auto.cache_ceil_mb >= rec.cycle_mib
        ceiling_at = rec.auto.argv.index("--cache-ceil-mb")
        for rid in rec.auto.run_ids:
            ran = measured[rid]
            assert flag_value(ran, "--cache-mb") == "auto" and "--cache-floor-mb" in ran
            mine = list(rec.auto.argv)
            del mine[ceiling_at:ceiling_at + 2]
            theirs = list(ran)
            at = theirs.index("--cache-ceil-mb")
            del theirs[at:at + 2]
            assert mine == theirs                                   # only the ceiling differs


def test_on_a_native_campaign_the_fixed_budget_is_the_measured_one_at_the_cycle_and_bmoe_cli_accepts_both(
        native_campaign, cli):
    result = CliRunner().invoke(cli, ["recommend", str(native_campaign), "--verify", "--format", "json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate(doc)
    recs = recommend([native_campaign])
    rec = recs.find("local", "alpha", 8)
    assert rec.cycle_mib == 204.0 and rec.cycle_source in ("csv", "gguf")
    # a rounded step would say 200, under the 204 MiB cycle, where the hit rate is exactly 0
    assert rec.fixed.cache_mb == 204 and rec.fixed.argv[rec.fixed.argv.index("--cache-mb") + 1] == "204"
    assert "--force-cache" in rec.fixed.argv and flag_value(rec.fixed.argv, "-t") == "1"
    assert flag_value(rec.auto.argv, "--cache-floor-mb") == "1536" and rec.auto.cache_ceil_mb == 204
    assert_measured(rec, run_argvs(native_campaign))
    (d,) = doc["devices"]
    (r,) = d["recommendations"]
    for name in ("fixed", "auto"):
        v = r["verification"][name]
        assert v["status"] == "accepted" and v["engine"] == "0.19.0" and v["exit_status"] == 0, v
        assert re.search(r"bmoe: expert streaming ON .* cache=204 MiB", v["line"]), v
    assert r["fixed"]["argv"] == list(rec.fixed.argv) and r["auto"]["argv"] == list(rec.auto.argv)


def test_on_bmoe_py_every_argv_is_measured_accepted_and_published_without_host_paths(local_campaign, cli,
                                                                                      small_model, fleet_home):
    result = CliRunner().invoke(cli, ["recommend", str(local_campaign), "--verify", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "verifying 2 command line(s) on local (python engine of local-sweep)" in result.stderr
    doc = json.loads(result.stdout)
    assert (doc["format"], doc["version"]) == (FORMAT, FORMAT_VERSION) == ("bmoe-fleet.recommendations", 2)
    validate(doc)
    text = json.dumps(doc)
    for host_path in (str(local_campaign), str(small_model.parent), str(fleet_home)):
        assert host_path not in text
    assert [c["label"] for c in doc["campaigns"]] == ["local-sweep"]
    (d,) = doc["devices"]
    assert d["identity"]["kind"] == "local" and d["identity"]["mem_total_kb"] == d["ram_total_kb"]
    (r,) = d["recommendations"]
    assert {name: v["status"] for name, v in r["verification"].items()} == {"fixed": "accepted", "auto": "accepted"}
    assert all(v["engine"] == "bmoe-py 0.1.0" for v in r["verification"].values())
    rec = recommend([local_campaign]).find("local", "small", 2)
    assert_measured(rec, run_argvs(local_campaign))
    # the budget under the cycle (cycle*0.5) was measured and is never the fixed answer
    assert rec.under_cycle_budgets_mib and rec.fixed.cache_mb not in rec.under_cycle_budgets_mib
    assert d["default"]["argv"][:3] == ["--moe-stream", "--cache-mb", "auto"]
    assert flag_value(d["default"]["argv"], "--cache-ceil-mb") == str(rec.auto.cache_ceil_mb)


def test_verify_reports_a_refusal_with_the_engines_own_line(local_campaign):
    campaign = load_campaign(local_campaign / "campaign.toml")
    with DeviceSession(campaign, "local") as session:
        refused = session.run("small", ["--moe-stream", "--cache-mb", "137", "--dense-weights", "anon"])
        accepted = session.run("small", ["--moe-stream", "--cache-mb", "137", "--force-cache"])
    assert refused.status == "refused" and refused.exit_status == 1
    assert refused.line.startswith("config error: moe.cache_mb=137 is in the pathological band")
    assert accepted.status == "accepted" and "cache=137 MiB" in accepted.line
    assert accepted.argv[accepted.argv.index("-n") + 1] == "1" and accepted.engine == "bmoe-py 0.1.0"


def test_a_phone_is_keyed_by_what_it_reports_and_an_unmeasured_one_gets_the_rule(vphone_campaign, imported):
    recs = recommend([vphone_campaign, imported])
    doc = json.loads(recs.to_json())
    validate(doc)
    phone = next(d for d in doc["devices"] if d["device"] == "virtual:tight")
    ident = phone["identity"]
    record = json.loads((vphone_campaign / "devices" / "virtual-tight.json").read_text())
    assert (ident["kind"], ident["model"], ident["soc"], ident["abi"]) == (
        "virtual", record["model"], record["soc"], record["abi"])
    assert ident["mem_total_kb"] == record["ram_total_kb"] and ident["model"] == "<script>alert(1)</script>"
    # the imported phone knows no RAM: it cannot be a point of the rule; the virtual phone is the only one
    rule = doc["rules"]["unmeasured"]
    (point,) = rule["points"]
    mem_mib = ident["mem_total_kb"] / 1024
    ceiling = phone["default"]["cache_ceil_mb"]
    assert point["device"] == "virtual:tight" and point["ceiling_mib"] == ceiling
    # one phone: the hull runs from the origin through it, and on past it along the same line
    assert rule["knots_mib"] == [[0.0, 0.0], [round(mem_mib, 3), ceiling]] and rule["rests_on"] == ["virtual:tight"]
    assert 0 <= ceiling / mem_mib - rule["slope_after"] < 1e-6
    assert ceiling - 1 <= rule_ceiling(doc["rules"], ident["mem_total_kb"]) <= ceiling
    for factor in (0.5, 0.8, 1.5, 3.0):                    # under the line through the point everywhere
        c = rule_ceiling(doc["rules"], ident["mem_total_kb"] * factor)
        assert c == 0 or c <= ceiling * factor
    # per model and top-k: the RAM under which the cycle no longer fits under the ceiling, or the
    # phone said cache 0 (its own cache-off recommendation, or the default under the model's cycle)
    for m in rule["models"]:
        rec = next(r for r in phone["recommendations"] if (r["model"], r["top_k"]) == (m["model"], m["top_k"]))
        off = rec["cache_off"] or phone["default"]["cache_ceil_mb"] < rec["cycle_mib"]   # at THIS top-k
        assert m["cache_off_on"] == (["virtual:tight"] if off else [])
        cycle = math.ceil(m["cycle_mib"])
        need = max(cycle * mem_mib / ceiling if cycle <= ceiling else mem_mib + (cycle - ceiling) / rule["slope_after"],
                   math.floor(mem_mib) + 1 if off else 0)
        assert abs(m["min_ram_mib"] - math.ceil(need)) <= 1
        assert rule_ceiling(doc["rules"], (m["min_ram_mib"] - 1) * 1024, m["model"], m["top_k"]) == 0
        assert rule_ceiling(doc["rules"], m["min_ram_mib"] * 1024, m["model"], m["top_k"]) >= cycle
    assert rule["min_ram_mib"] == min(m["min_ram_mib"] for m in rule["models"])


def test_the_rule_is_the_lower_hull_of_the_phones_it_rests_on():
    from results.analysis.fleet_rules import envelope_mib, lower_hull

    # two phones: 640 MiB safe at 380, 2 GiB at 1400; a third over the line between them
    hull = lower_hull([(0, 0), (640, 380), (2048, 1400), (1024, 900)])
    assert hull == [(0, 0), (640, 380), (2048, 1400)]
    knots, slope = [list(k) for k in hull], (1400 - 380) / (2048 - 640)
    assert envelope_mib(knots, slope, 640) == 380 and envelope_mib(knots, slope, 2048) == 1400
    assert envelope_mib(knots, slope, 1024) < 900 and envelope_mib(knots, slope, 320) == 190
    assert envelope_mib(knots, slope, 4096) == pytest.approx(1400 + 2048 * slope)


def _doc_lookup():
    """The app-side lookup exactly as docs/recommendations.md shows it."""
    doc = (PROJECT / "docs" / "recommendations.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", doc, re.S) if "def cache_args" in block]
    namespace: dict = {}
    exec(compile(code, "docs/recommendations.md", "exec"), namespace)
    return namespace["cache_args"]


def test_the_documented_lookup_finds_a_measured_phone_and_applies_the_rule_elsewhere(vphone_campaign):
    cache_args = _doc_lookup()
    doc = json.loads(recommend([vphone_campaign]).to_json())
    (phone,) = doc["devices"]
    ident = phone["identity"]
    mem = ident["mem_total_kb"]
    # the measured phone, by ro.product.model and MemTotal (a slightly different MemTotal is the same phone)
    assert cache_args(doc, ident["model"], mem) == phone["default"]["argv"]
    assert cache_args(doc, ident["model"], int(mem * 1.02)) == phone["default"]["argv"]
    # the same name with twice the RAM is another phone: the rule, which grows with MemTotal
    rule = doc["rules"]["unmeasured"]
    bigger = cache_args(doc, ident["model"], mem * 2, "alpha", 2)
    assert bigger[:3] == ["--moe-stream", "--cache-mb", "auto"] and bigger[-2] == "--cache-ceil-mb"
    assert int(bigger[-1]) == rule_ceiling(doc["rules"], mem * 2, "alpha", 2) > phone["default"]["cache_ceil_mb"]
    assert flag_value(bigger, "--cache-floor-mb") == str(rule["cache_floor_mb"])
    # an unmeasured phone under the model's minimum RAM: cache off; at it: a ceiling over the cycle
    k2 = next(m for m in rule["models"] if (m["model"], m["top_k"]) == ("alpha", 2))
    below = cache_args(doc, "Pixel 9", (k2["min_ram_mib"] - 1) * 1024, "alpha", 2)
    assert below == ["--moe-stream", "--cache-mb", "0"]
    at = cache_args(doc, "Pixel 9", k2["min_ram_mib"] * 1024, "alpha", 2)
    assert flag_value(at, "--cache-mb") == "auto" and int(at[-1]) >= k2["cycle_mib"]
    # no model named: the fleet's smallest minimum, under which no model gets a cache
    assert cache_args(doc, "Pixel 9", (rule["min_ram_mib"] - 1) * 1024) == ["--moe-stream", "--cache-mb", "0"]


def test_the_schema_refuses_what_version_2_rules_out(local_campaign):
    doc = json.loads(recommend([local_campaign]).to_json())
    validate(doc)
    for broken in (
            lambda d: d["campaigns"][0].update(dir="/home/me/camp"),           # a host folder
            lambda d: d["devices"][0]["recommendations"][0]["fixed"]["argv"].extend(["-m", "x.gguf"]),
            lambda d: d["devices"][0]["identity"].pop("model"),
            lambda d: d.update(version=1)):
        copy = json.loads(json.dumps(doc))
        broken(copy)
        with pytest.raises(jsonschema.ValidationError):
            validate(copy)
