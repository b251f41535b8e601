"""Every release's lines land in the run table, read from a run's own stdout (docs/decisions/flag-table.md),
and the planner's runs sit beside the boundary, off the curve (docs/decisions/planner.md): a real local campaign of
bmoe-py claiming 0.25, with `planner` and `mmap` cells; one run's stdout then gets the newer
releases' lines upstream's docs print (tests/fixtures/upstream/release-lines.md), as that engine
would have written them."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from results.analysis.analyze import analyze
from results.analysis.recommend import recommend
from results.read.table import build_table
from tests.results.conftest import local_campaign_data, run_local

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "release-lines.md"


def _blocks() -> dict[str, list[str]]:
    text = FIXTURE.read_text(encoding="utf-8")
    return {m[1]: m[2].strip("\n").splitlines() for m in re.finditer(r"```([\w-]+)\n(.*?)```", text, re.S)}


@pytest.fixture(scope="module")
def planned(tmp_path_factory, small_model) -> Path:
    out = tmp_path_factory.mktemp("release-table") / "planned"
    return run_local(out, local_campaign_data(
        "planned", small_model, {"cache_mb": [0, "cycle*2", "mmap", "planner"]}, run={"n_predict": 4},
        engine={"claim": "0.25"}))


def _run_dir(root: Path, budget_spec: str) -> Path:
    for rec in root.glob("runs/*/*/run.json"):
        if json.loads(rec.read_text())["config"]["budget_spec"] == budget_spec:
            return rec.parent
    raise AssertionError(f"no {budget_spec} run in {root}")


def test_the_newer_releases_lines_in_a_runs_stdout_are_run_table_columns(planned, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(planned, copy)
    blocks = _blocks()
    folder = _run_dir(copy, "cycle*2")
    stdout = folder / "stdout.txt"
    stdout.write_bytes(stdout.read_bytes() + ("\n".join(blocks["ngram"] + blocks["moe-drop"]) + "\n").encode())
    table = build_table([copy])
    row = table[table["run_dir"] == str(folder)].iloc[0]
    assert row["spec_source"] == "ngram" and row["effective_tok_s"] == 5.24 and row["drafted_steps_pct"] == 15.0
    # the line fills what the CSV trailer left empty; where the trailer has the key (bmoe-py writes
    # experts_dropped=0: it drops nothing) the trailer is the run's own record and stays
    assert row["drop_pct"] == 51.3 and row["experts_dropped"] == 0
    # claimed 0.25: the engine's own `mode:` line says what ran, and the release is the claim
    assert row["mode"] == "expert streaming" and row["engine_release"] == "0.25.0"
    others = table[table["run_dir"] != str(folder)]
    assert others["drop_pct"].isna().all()           # nobody else printed one
    # the budget curve's speed for a speculative run is the effective one, drafting included
    (group,) = analyze(table).groups
    (point,) = [p for p in group.points if row["run_id"] in p.run_ids]
    assert point.tok_s_values == (5.24,) and row["tok_s"] != 5.24


def test_a_run_whose_mode_line_says_mmap_is_a_baseline_wherever_its_config_pointed(planned, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(planned, copy)
    folder = _run_dir(copy, "cycle*2")
    stdout = folder / "stdout.txt"
    text = re.sub(rb"^mode: .*$", _blocks()["mode-mmap"][0].encode(), stdout.read_bytes(), flags=re.M)
    stdout.write_bytes(text)
    table = build_table([copy])
    row = table[table["run_dir"] == str(folder)].iloc[0]
    assert row["moe_stream"] is False or row["moe_stream"] == False  # noqa: E712 (a numpy bool)
    assert row["budget_label"] == "mmap" and math.isnan(row["cache_mb"])
    (group,) = analyze(table).groups
    assert row["run_id"] in {i for p in group.baselines for i in p.run_ids}
    assert row["run_id"] not in {i for p in group.points for i in p.run_ids}


def test_the_planners_run_is_read_for_its_plan_and_kept_off_the_budget_curve(planned):
    table = build_table([planned])
    (row,) = table[table["planner"]].to_dict("records")
    # the host holds this 13 MiB model many times over: the plan declines and the run is a baseline
    assert row["plan_regime"] == "fits" and row["plan_declined"].startswith("what is left on the host fits")
    assert row["budget_label"] == "planner → mmap" and row["mode"] == "mmap"
    assert row["plan_flags"] == "# streaming declined; run without --moe-stream"
    (group,) = analyze(table).groups
    assert all(row["run_id"] not in p.run_ids for p in (*group.points, *group.baselines))
    (pick,) = group.planner
    assert pick.declined and pick.regime == "fits" and pick.run_ids == (row["run_id"],)
    assert "ran as a baseline" in pick.verdict
    (rec,) = recommend([planned]).all()
    assert rec.planner[0]["text"] == pick.text() and "planner: mmap (fits)" in pick.text()
