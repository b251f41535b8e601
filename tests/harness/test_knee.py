"""`cache_mb = "knee*F"` budgets come from one route-traced probe per device and
model, replayed; the probe's trace then draws the predicted curve and the recommendation cites it."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.plan.grid import make_plan
from harness.plan.probe import knee_of_trace
from harness.run.runner import run_campaign
from results.analysis.analyze import analyze
from results.analysis.recommend import recommendations_from
from results.read.table import build_table
from results.site.report import build_site
from results.site.site_format import Urls


def knee_campaign(model: Path, name: str, cache_mb: list, devices=("local",), run: dict | None = None):
    data = {"version": 1, "name": name, "fleet": {"devices": list(devices)}, "models": {"mid": str(model)},
            "axes": {"cache_mb": cache_mb}, "run": {"n_predict": 8, **(run or {})},
            "gate": {"max_wait_s": 1}}
    return parse_campaign(data, source=f"{name}.toml")


def run_records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/*/run.json"))]


@pytest.mark.parametrize("value, problem", [
    ("knee*0", 'axes.cache_mb[1]: "knee*0": a knee budget needs a factor above 0'),
    ("knee*x", 'axes.cache_mb[1]: "knee*x" is not a budget'),
    ("knee1.5", 'axes.cache_mb[1]: "knee1.5" is not a budget'),
])
def test_bad_knee_values_name_the_key(mid_model, value, problem):
    with pytest.raises(CampaignError) as e:
        knee_campaign(mid_model, "bad", [0, value])
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_the_plan_has_one_probe_per_device_model_and_top_k_and_prints_it(mid_model):
    c = parse_campaign(
        {"version": 1, "name": "plan", "fleet": {"devices": ["local"]}, "models": {"mid": str(mid_model)},
         "axes": {"cache_mb": ["knee", "knee*1.5", "cycle*1.2"], "n_expert_used": [2, 4]},
         "run": {"repeats": 2, "probe_tokens": 12}}, "plan.toml")
    plan = make_plan(c)
    assert len(plan.cells) == 3 * 2 * 2
    assert sorted(p.config.n_expert_used for p in plan.probes) == [2, 4]
    for p in plan.probes:
        assert p.config.probe and p.config.route_trace and p.config.cache_mb == 0
        assert p.config.n_predict == 12 and "--route-trace" in p.argv and p.cell_id.startswith("p-")
    knee = [cell for cell in plan.cells if cell.config.budget_spec == "knee*1.5"]
    assert all(cell.config.cache_mb is None and "<knee*1.5>" in cell.argv for cell in knee)
    text = plan.text()
    assert text.count("route-trace probe, cache 0, 12 tokens") == 2 and "knee*1.5 (MiB from the probe)" in text
    # no knee budget, no probe; by default the probe is the sweep's n_predict, at most 64 tokens
    assert make_plan(knee_campaign(mid_model, "noknee", [0, "cycle*1.2"])).probes == ()
    for n, probe_n in ((8, 8), (256, 64)):
        (p,) = make_plan(knee_campaign(mid_model, "dflt", ["knee"], run={"n_predict": n})).probes
        assert p.config.n_predict == probe_n


def test_knee_budgets_are_placed_from_the_probe_and_the_pages_draw_its_curve(tmp_path, mid_model):
    c = knee_campaign(mid_model, "knee", [0, "knee", "knee*0.5", "cycle*1.2"])
    out = tmp_path / "out"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete and status.outcomes == {"ok": 4} and status.attempts == 5     # the probe is one
    recs = run_records(out)
    (probe,) = [r for r in recs if r["probe"]]
    # by default the probe runs the sweep's own n_predict: its trace is the sweep runs' trace
    assert probe["outcome"] == "ok" and probe["config"]["cache_mb"] == 0 and probe["config"]["n_predict"] == 8
    trace = out / "runs" / probe["cell_id"] / "1" / "route.csv"
    knee = knee_of_trace(trace)
    assert knee.knee_mib > knee.first_decode_hit_mib > 0          # the knee is past the cliff
    by_spec = {r["config"]["budget_spec"]: r for r in recs if not r["probe"]}
    assert by_spec["knee*1"]["config"]["cache_mb"] == knee.knee_mib
    assert by_spec["knee*0.5"]["config"]["cache_mb"] == math.floor(knee.knee_mib * 0.5)
    for spec in ("knee*1", "knee*0.5"):
        r = by_spec[spec]
        assert r["config"]["knee_mb"] == knee.knee_mib and r["config"]["probe_cell_id"] == probe["cell_id"]
        argv = r["argv"]
        assert argv[argv.index("--cache-mb") + 1] == str(r["config"]["cache_mb"])
        assert ("--force-cache" in argv) == (r["config"]["cache_mb"] < 1500)
        assert r["summary"]["cache_budget_MiB"] == pytest.approx(r["config"]["cache_mb"])
    # a rerun finds everything done: the probe is not run again
    again = run_campaign(c, out, progress_stream=io.StringIO())
    assert again.attempts == 5 and len(run_records(out)) == 5

    table = build_table([out])
    assert table["probe"].sum() == 1
    analysis = analyze(table)
    (g,) = analysis.groups
    assert g.n_runs == 4 and g.replay is not None                 # the probe is no sweep point...
    assert g.replay.run_id.endswith(f"/{probe['cell_id']}/1")     # ...but its trace is the curve
    assert g.replay.knee_mib == knee.knee_mib
    # ...so the replay predicts each measured hit %, under the cycle and at the knee alike
    for r in recs:
        if not r["probe"] and r["config"]["cache_mb"]:
            assert g.replay.hit_at(r["config"]["cache_mb"]) == pytest.approx(r["summary"]["cache_hit_pct"], abs=0.05)
    rec = recommendations_from(analysis).find("local", "mid", g.top_k)
    assert rec.replay is not None and rec.replay.knee_mib == knee.knee_mib
    site = build_site([out], tmp_path / "site")
    device_page = (Path(site.out_dir) / Urls.device("local")).read_text()
    model_page = (Path(site.out_dir) / Urls.model("mid")).read_text()
    for page in (device_page, model_page):                        # the curve, with the measured points on it
        assert f"replayed LRU from run knee/{probe['cell_id']}/1: knee {knee.knee_mib}" in page
        figures = [json.loads(block) for block in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>',
                                                              page, re.S)]
        traces = {t["name"]: t for f in figures for t in f["data"] if t["name"].startswith(("hit %", "replayed"))}
        assert knee.knee_mib in traces["hit % (measured)"]["x"]
        assert len(traces["replayed LRU (predicted hit %)"]["x"]) > 10


def test_a_failed_probe_leaves_knee_cells_with_the_reason_and_rerun_failed_retries_it(tmp_path, mid_model):
    c = knee_campaign(mid_model, "slow", ["knee", 0], run={"timeout_s": 0.3})
    out = tmp_path / "out"
    run_campaign(c, out, progress_stream=io.StringIO())
    recs = run_records(out)
    (probe,) = [r for r in recs if r["probe"]]
    (knee,) = [r for r in recs if r["config"].get("budget_spec") == "knee*1"]
    assert probe["outcome"] == "timeout"
    assert knee["outcome"] == "engine_error" and knee["attempted"] is False and knee["config"]["cache_mb"] is None
    assert knee["evidence"] == [f"no knee: the route-trace probe {probe['cell_id']} attempt 1 ended timeout"]
    # with time enough, --rerun-failed runs the probe again and then the knee cell
    relaxed = knee_campaign(mid_model, "slow", ["knee", 0], run={"timeout_s": 600})
    status = run_campaign(relaxed, out, rerun_failed=True, progress_stream=io.StringIO())
    assert status.complete and status.outcomes == {"ok": 2}
    latest = {(r["cell_id"]): r for r in sorted(run_records(out), key=lambda r: r["attempt"])}
    assert latest[probe["cell_id"]]["attempt"] == 2 and latest[probe["cell_id"]]["outcome"] == "ok"
    assert latest[knee["cell_id"]]["attempt"] == 2 and latest[knee["cell_id"]]["config"]["cache_mb"] > 0
