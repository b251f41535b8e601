"""`bmoe-fleet compare` on campaigns of one plan: a deliberately slowed engine is flagged, and nothing
else is; a cell that starts failing is called out."""

from __future__ import annotations

import json

from click.testing import CliRunner

from results.compare import compare


def _cells(a, b):
    return [c["cell_id"] for c in json.loads((a / "plan.json").read_text())["cells"]], \
        [c["cell_id"] for c in json.loads((b / "plan.json").read_text())["cells"]]


def test_a_slowed_engine_is_flagged_and_nothing_else(compare_pair, cli):
    a, b = compare_pair
    plan_a, plan_b = _cells(a, b)
    assert plan_a == plan_b and len(plan_a) == 6           # the same plan, cell for cell
    result = CliRunner().invoke(cli, ["compare", str(a), str(b), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["format"] == "bmoe-fleet.compare" and data["version"] == 1
    assert data["summary"] == {"cells": 2, "regressions": 1, "improvements": 0, "newly_failing": 0, "only_a": 0,
                               "only_b": 0}
    cells = {c["key"]["budget_asked"]: c for c in data["cells"]}
    slowed = cells["0"]
    assert slowed["status"] == "compared" and slowed["a_runs"] == slowed["b_runs"] == 3
    verdicts = {m["metric"]: m for m in slowed["changes"]}
    assert verdicts["tok/s"]["verdict"] == "regression" and verdicts["tok/s"]["ratio"] < 0.5
    assert verdicts["flash MiB/token"]["verdict"] == "same"
    (cached,) = [c for k, c in cells.items() if k != "0"]
    assert all(m["verdict"] == "same" for m in cached["changes"])
    assert {m["metric"] for m in cached["changes"]} == {"tok/s", "hit %", "flash MiB/token"}
    text = CliRunner().invoke(cli, ["compare", str(a), str(b)]).output
    assert "1 regressed, 0 improved, 0 newly failing" in text and "REGRESSION" in text and "cache 0" in text


def test_two_engine_versions_are_told_apart_by_name(compare_pair, cli):
    a, b = compare_pair
    report = compare(a, b, "bmoe-py 0.1.0 (plain)", "bmoe-py 0.1.0 (slowed)")
    assert sorted(len(c.regressions) for c in report.cells) == [0, 1] and not report.improvements
    wrong = CliRunner().invoke(cli, ["compare", str(a), str(b), "--engine-b", "bmoe-cli 9"])
    assert wrong.exit_code == 1
    assert "B: no runs of engine 'bmoe-cli 9' (engines there: bmoe-py 0.1.0 (slowed))" in wrong.output


def test_a_cell_that_starts_failing_is_called_out(compare_pair, failing_twin):
    a, _ = compare_pair
    report = compare(a, failing_twin)
    (failing,) = report.newly_failing
    assert failing.key[6] == "0" and (failing.a_ok, failing.b_ok, failing.b_runs) == (3, 0, 3)
    assert failing.changes == ()                 # nothing to compare: no run finished in B
    assert report.regressions == [] and report.improvements == []
    assert "NEWLY FAILING" in report.text() and "0/3 ok in B" in report.text()
