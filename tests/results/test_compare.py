"""`bmoe-fleet compare` on campaigns of one plan: a deliberately slowed engine is flagged, and nothing
else is; a cell that starts failing is called out."""

from __future__ import annotations

import json

from click.testing import CliRunner

from results.analysis.compare import compare


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
    summary = data["summary"]
    assert {k: summary[k] for k in ("cells", "newly_failing", "only_a", "only_b")} == {
        "cells": 2, "newly_failing": 0, "only_a": 0, "only_b": 0}
    cells = {c["key"]["budget_asked"]: c for c in data["cells"]}
    slowed = cells["0"]
    assert slowed["status"] == "compared" and slowed["a_runs"] == slowed["b_runs"] == 3
    verdicts = {m["metric"]: m for m in slowed["changes"]}
    assert verdicts["tok/s"]["verdict"] == "regression" and verdicts["tok/s"]["ratio"] < 0.5
    assert verdicts["flash MiB/token"]["verdict"] == "same"
    (cached,) = [c for k, c in cells.items() if k != "0"]
    cached_verdicts = {m["metric"]: m for m in cached["changes"]}
    assert set(cached_verdicts) == {"tok/s", "hit %", "flash MiB/token"}
    # what does not depend on the machine's load is unchanged; the cached cell's speed may drift with
    # load between the two campaigns (CI hosts are shared), either way, but never as far as the 5x
    # slowdown
    assert cached_verdicts["hit %"]["verdict"] == cached_verdicts["flash MiB/token"]["verdict"] == "same"
    assert cached_verdicts["tok/s"]["ratio"] > 2 * verdicts["tok/s"]["ratio"]
    assert summary["regressions"] == 1 + (cached_verdicts["tok/s"]["verdict"] == "regression")
    drift = int(cached_verdicts["tok/s"]["verdict"] == "improvement")
    assert summary["improvements"] == drift
    text = CliRunner().invoke(cli, ["compare", str(a), str(b)]).output
    assert f"{drift} improved, 0 newly failing" in text
    assert any(line.lstrip().startswith("REGRESSION") and " cache 0 " in line and ": tok/s " in line
               for line in text.splitlines())


def test_two_engine_versions_are_told_apart_by_name(compare_pair, cli):
    a, b = compare_pair
    report = compare(a, b, "bmoe-py 0.1.0 (plain)", "bmoe-py 0.1.0 (slowed)")
    assert len(report.cells) == 2
    # the slowed cell regresses in tok/s; load may also move the cached cell's speed, nothing else
    assert all(c.key[6] != "0" and [m.metric for m in c.improvements] == ["tok/s"] for c in report.improvements)
    by_budget = {c.key[6]: c for c in report.cells}
    assert [m.metric for m in by_budget["0"].regressions] == ["tok/s"]
    (cached,) = [c for k, c in by_budget.items() if k != "0"]
    assert {m.metric for m in cached.regressions} <= {"tok/s"}
    wrong = CliRunner().invoke(cli, ["compare", str(a), str(b), "--engine-b", "bmoe-cli 9"])
    assert wrong.exit_code == 1
    assert "B: no runs of engine 'bmoe-cli 9' (engines there: bmoe-py 0.1.0 (slowed))" in wrong.output


def test_a_cell_that_starts_failing_is_called_out(compare_pair, failing_twin):
    a, _ = compare_pair
    report = compare(a, failing_twin)
    (failing,) = report.newly_failing
    assert failing.key[6] == "0" and (failing.a_ok, failing.b_ok, failing.b_runs) == (3, 0, 3)
    assert failing.changes == ()                 # nothing to compare: no run finished in B
    (other,) = [c for c in report.cells if c is not failing]
    assert other.status == "compared" and report.newly_failing == [failing]
    # the other cell's load-independent numbers are unchanged (its speed may drift with the host's load)
    assert {m.metric: m.verdict for m in other.changes if m.metric != "tok/s"} == {"hit %": "same",
                                                                                   "flash MiB/token": "same"}
    assert "NEWLY FAILING" in report.text() and "0/3 ok in B" in report.text()
