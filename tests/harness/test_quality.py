"""Quality runs (docs/decisions/quality-runs.md): `run.quality` resolved against the plan's lossy
levers, every cell's answer written (`--progress`), a lossless reference where a group has none,
and at bmoe-cli 0.24 a `--ppl` scoring run after each cell, recorded beside it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

from devices.local import LocalDevice
from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.campaign.options import campaign_from_options
from harness.plan.adaptive import adaptive_plan
from harness.plan.grid import make_plan, read_plan
from harness.run import quality
from harness.run.runner import run_campaign
from store import names
from store.campaign_dir import CampaignDir
from store.quality import TOP_K, lossy_levers, quality_group

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "store" / "quality-off"


def data(model: Path, axes: dict, run: dict | None = None, **sections) -> dict:
    return {"version": 1, "name": "q", "fleet": {"devices": ["local"]}, "models": {"m": str(model)},
            "gate": {"max_wait_s": 1}, "axes": axes, "run": {"n_predict": 4, "threads": 1, **(run or {})},
            **sections}


def _text(cell) -> str:
    return json.dumps(cell.config.to_dict())        # key order included


# ── the plan ─────────────────────────────────────────────────────────────────────────────────


def test_quality_off_plans_the_cells_the_code_before_it_planned(tiny_model):
    """tests/fixtures/store/quality-off/plan.json was planned by the code before run.quality, from a
    campaign whose every cell is lossy (a drop axis, a top-k below the model's, a drop companion in
    engine_args): with quality off today's planner makes the same cells, ids and config bytes, but for
    the cache-off cells, which leave the drop out; with the default ("auto") every cell changes."""
    saved = json.loads((GOLDEN / "campaign.json").read_text())
    old = read_plan(CampaignDir(GOLDEN))
    assert old is not None and len(old.cells) == 12 and len(old.probes) == 2
    off = make_plan(parse_campaign(dict(saved, models={"m": str(tiny_model)},
                                        run={**saved["run"], "quality": "off"})))
    on_cache = [(c.cell_id, _text(c)) for c in old.cells if c.config.cache_mb != 0]
    assert len(on_cache) == 8 and [(c.cell_id, _text(c)) for c in off.cells if c.config.cache_mb != 0] == on_cache
    # the cache-off cells alone changed: the drop axis' value is left out there, as the engine refuses it
    # without the LRU cache (harness.plan.grid.without_cache); everything else as the code before planned it
    zero_old = [c.config for c in old.cells if c.config.cache_mb == 0]
    zero_new = [c.config for c in off.cells if c.config.cache_mb == 0]
    assert len(zero_new) == len(zero_old) == 4
    assert [c.with_(engine_flags={**c.engine_flags, "--drop-cold-experts": False}) for c in zero_old] == zero_new
    assert [(c.cell_id, _text(c)) for c in off.probes] == [(c.cell_id, _text(c)) for c in old.probes]
    assert all("--progress" not in c.argv for c in off.cells) and not off.quality

    auto = make_plan(parse_campaign(dict(saved, models={"m": str(tiny_model)})))
    assert auto.quality and not {c.cell_id for c in auto.cells} & {c.cell_id for c in old.cells}
    # the cache-0 cells at the model's own top-k run without a lever (the drop is left out there): each
    # --prefetch setting's group has its lossless cells, so no reference joins
    lossless = [c for c in auto.cells if not lossy_levers(c.config, 2)]
    assert len(auto.cells) == 12 and not any(c.config.quality_reference for c in auto.cells)
    assert {(c.config.cache_mb, c.config.n_expert_used) for c in lossless} == {(0, 2)}
    assert {c.config.engine_flags.get("--prefetch") for c in lossless} == {False, 1}
    assert all("--drop-cold-experts" not in c.argv for c in lossless)
    for cell in auto.cells:
        assert cell.config.progress is True and cell.argv[-1] == "--progress" and cell.argv.count("--progress") == 1
    # probes are no quality cells: they keep their ids
    assert [p.cell_id for p in auto.probes] == [p.cell_id for p in old.probes]


def test_auto_adds_a_reference_only_where_a_group_has_no_lossless_cell(tiny_model):
    # the drop axis has 0: every group already has its lossless cells
    plan = make_plan(parse_campaign(data(tiny_model, {"cache_mb": [0, "cycle*3"],
                                                      "flags": {"--drop-cold-experts": [0, 0.5]}})))
    # (cache 0 runs once, without the drop: the engine refuses it without the cache)
    assert plan.quality and len(plan.cells) == 3 and not any(c.config.quality_reference for c in plan.cells)
    assert all(c.config.progress for c in plan.cells)
    # a top-k below the model's own (2): the reference at the model's top-k and the smallest budget
    plan = make_plan(parse_campaign(data(tiny_model, {"cache_mb": [2000, 1600], "n_expert_used": [1]})))
    (ref,) = [c for c in plan.cells if c.config.quality_reference]
    assert (ref.config.n_expert_used, ref.config.cache_mb, len(plan.cells)) == (2, 1600, 3)
    assert ref.argv[ref.argv.index("--n-expert-used") + 1] == "2" and "quality-reference" in ref.label()
    assert [lossy_levers(c.config, 2) for c in plan.cells] == [(TOP_K,), (TOP_K,), ()]
    # levers in engine_args go, with their values and the drop's companions; the other args stay
    plan = make_plan(parse_campaign(data(tiny_model, {"cache_mb": [0]}, run={
        "engine_args": ["--drop-cold-experts", "0.25", "--drop-in-prefill", "--ubatch", "8"]})))
    (ref,) = [c for c in plan.cells if c.config.quality_reference]
    assert ref.config.engine_args == ("--ubatch", "8") and quality_group(ref.config) == quality_group(plan.cells[0].config)
    # nothing lossy: auto is off and the configs keep their keys; "on" writes the answers, adds no reference
    plain = data(tiny_model, {"cache_mb": [0], "flags": {"--drop-cold-experts": [0]}})
    assert "progress" not in make_plan(parse_campaign(plain)).cells[0].config.keys
    on = make_plan(parse_campaign(data(tiny_model, {"cache_mb": [0]}, run={"quality": "on"})))
    assert on.quality and [c.config.progress for c in on.cells] == [True]
    assert "quality: on" in on.text() and "0 lossless reference" in on.text()


def test_the_setting_reads_writes_back_and_is_a_sweep_option(tiny_model):
    with pytest.raises(CampaignError, match=r'^q.toml: run.quality: expected one of auto, on, off, got "yes"$'):
        parse_campaign(data(tiny_model, {"cache_mb": [0]}, run={"quality": "yes"}), source="q.toml")
    default = parse_campaign(data(tiny_model, {"cache_mb": [0]}))
    assert default.run.quality == "auto" and "quality" not in tomllib.loads(default.to_toml())["run"]
    off = campaign_from_options(["local"], [str(tiny_model)], ["0"], quality="off", flags=("--drop-cold-experts=1",))
    assert off.run.quality == "off" and tomllib.loads(off.to_toml())["run"]["quality"] == "off"
    assert not make_plan(off).quality


def test_an_adaptive_plan_runs_the_reference_as_the_grid_has_it(tiny_model):
    campaign = parse_campaign(data(tiny_model, {"cache_mb": ["cycle*3", 64], "flags": {
        "--drop-cold-experts": [1]}}, plan={"adaptive": True}))
    grid = make_plan(campaign)
    (ref,) = [c for c in grid.cells if c.config.quality_reference]
    first = adaptive_plan(campaign, grid, None).plan
    assert ref.cell_id in {c.cell_id for c in first.cells}
    # the lossy series is searched (its cache-0 traced cell, with --progress, runs without the drop: the
    # engine refuses it without the cache); the reference is not a series
    assert [c.config.quality_reference for c in first.cells].count(True) == 1
    traced = [c for c in first.cells if c.config.route_trace]
    assert traced and all(c.config.progress and c.config.engine_flags == {"--drop-cold-experts": False} and
                          "--drop-cold-experts" not in c.argv for c in traced)


# ── runs on this host ────────────────────────────────────────────────────────────────────────


def _attempts(out: Path) -> dict[str, tuple[dict, Path]]:
    found = {}
    for p in sorted(out.glob("runs/*/*/run.json")):
        record = json.loads(p.read_text())
        found[record["cell_id"]] = (record, p.parent)
    return found


LOSSY = {"cache_mb": ["cycle*3"], "flags": {"--drop-cold-experts": [1]}}


def test_a_quality_campaign_writes_each_answer_and_runs_its_reference(tmp_path, tiny_model):
    """bmoe-py as 0.19.0 (no --ppl): each cell writes its answer token by token, the reference runs
    without the lever, and no scoring run is made."""
    campaign = parse_campaign(data(tiny_model, LOSSY, run={"n_predict": 6}))
    status = run_campaign(campaign, tmp_path / "out", progress_stream=io.StringIO())
    assert status.complete
    runs = _attempts(tmp_path / "out")
    assert len(runs) == 2
    for record, folder in runs.values():
        assert record["outcome"] == "ok" and record["argv"][-1] == "--progress"
        stdout = (folder / names.STDOUT_TXT).read_bytes()
        # one line per token, its raw bytes in delta_text (not always UTF-8: read as bytes)
        tokens = [line for line in stdout.splitlines() if line.startswith(b"BMOE_PROGRESS {")]
        assert [int(re.search(rb'"step":([0-9]+),', t)[1]) for t in tokens] == [1, 2, 3, 4, 5, 6]
        assert all(b'"delta_text":"' in t for t in tokens)
        assert b"=== answer ===" in stdout and b"=== perf ===" in stdout
        assert "quality" not in record and not (folder / names.PPL_TXT).exists()
    (ref,) = [r for r, _ in runs.values() if r["config"].get("quality_reference")]
    (lossy,) = [r for r, _ in runs.values() if not r["config"].get("quality_reference")]
    assert "--drop-cold-experts" not in ref["argv"] and "--drop-cold-experts" in lossy["argv"]
    assert lossy["summary"]["experts_dropped"] > 0 and ref["summary"].get("experts_dropped", 0) == 0


def test_at_a_claim_of_0_24_each_cell_is_scored_after_its_run(tmp_path, tiny_model):
    campaign = parse_campaign(data(tiny_model, LOSSY, engine={"claim": "0.24.0"}))
    status = run_campaign(campaign, tmp_path / "out", progress_stream=io.StringIO())
    assert status.complete
    runs = _attempts(tmp_path / "out")
    sha = hashlib.sha256(quality.QUALITY_TEXT.read_bytes()).hexdigest()
    policies = {}
    for record, folder in runs.values():
        assert record["outcome"] == "ok"
        q = record["quality"]
        assert (q["ppl_text"], q["ppl_text_sha256"], q["ppl_exit_status"]) == ("quality-en.txt", sha, 0)
        argv = q["ppl_argv"]
        assert argv[-2:] == ["--ppl", str(quality.QUALITY_TEXT)]
        assert not {"-p", "-n", "--csv", "--route-trace", "--progress"} & set(argv)
        # the rest is the cell's own command line, its lever included
        cell = record["argv"]
        dropped = {j for flag in ("-p", "-n", "--csv") for j in (cell.index(flag), cell.index(flag) + 1)}
        assert [a for j, a in enumerate(cell[:-1]) if j not in dropped] == argv[:-2]     # [-1]: --progress
        ppl = (folder / names.PPL_TXT).read_text()
        assert ppl.startswith("ppl: ") and float(ppl.split()[1]) > 1
        policies[bool(record["config"].get("quality_reference"))] = ppl.splitlines()[1]
        assert (folder / names.PPL_STDERR_TXT).is_file()
    assert policies[True].startswith("ppl-policy: 0/0 routed") and not policies[False].startswith("ppl-policy: 0/")


def test_a_scoring_run_that_fails_is_recorded_and_never_raised(tmp_path, tiny_model):
    """The text does not fit a 64-token context: the engine refuses it (exit 1), and score() keeps
    what it said; a run that could not start at all is recorded too."""
    argv = [sys.executable, "-m", "engine", "-m", str(tiny_model), "-p", "x", "-n", "2", "-c", "64", "--progress"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}, "PYTHONPATH": str(ROOT),
           "BMOE_PY_RELEASE": "0.24.0"}
    record = quality.score(LocalDevice(), "local", argv, env, 60.0, tmp_path)
    assert record["ppl_exit_status"] == 1 and "exceeds the session n_ctx (64)" in \
        (tmp_path / names.PPL_STDERR_TXT).read_text()
    assert record["ppl_argv"][-4:] == ["-c", "64", "--ppl", str(quality.QUALITY_TEXT)]
    gone = quality.score(LocalDevice(), "local", [str(tmp_path / "no-engine")], env, 60.0, tmp_path / "x")
    assert gone["ppl_exit_status"] is None and gone["ppl_error"].startswith("the scoring run did not end: cannot start")


def test_the_release_an_engine_speaks_decides_the_scoring_run():
    assert quality.scores("python", "bmoe-py 0.1.0 (bmoe-cli 0.24.0)")
    assert not quality.scores("python", "bmoe-py 0.1.0")
    assert quality.scores("native", "0.24.1") and quality.scores("native", "bmoe-cli 0.25.0")
    assert not quality.scores("native", "0.19.0") and not quality.scores("native", "unknown (--version exit status 1)")
