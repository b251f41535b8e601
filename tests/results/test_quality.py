"""Quality as a run-table value and an axis, and `recommend --max-quality-loss` (results/read/quality.py,
results/analysis/quality.py, docs/decisions/quality-measure.md), on a campaign really run.

The campaign (conftest `quality_campaign`): bmoe-py (through a wrapper engine) with --progress on a
skewed-router synthetic model, one budget, top-k 2 (the model's own) and 1, `--drop-cold-experts` 0 and
0.75 (the app's default), two repeats. The wrapper makes every run without a drop five times as slow and
40 ms a token slower (conftest `without:` condition), so the drop runs are faster beyond noise whatever this host's load:
without the lossless rule the default would be a drop setting.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from results.analysis.android_app import APP_DROP_COLD
from results.analysis.noise import differs
from results.analysis.quality import parse_bound, quality_front
from results.analysis.recommend import recommend
from results.analysis.recommend_argv import settings_of
from results.errors import ResultsError
from results.read.quality import PPL_TXT, RunOutput, agreement
from results.read.table import build_table
from tests.results.test_recommend_v2 import validate

DROP = "--drop-cold-experts"
DROP_LEVERS = f"drop {APP_DROP_COLD:g}"      # the campaign's drop, as lossy_levers words it


@pytest.fixture(scope="session")
def quality_table(quality_campaign):
    return build_table([quality_campaign])


def _deltas(run_dir: str) -> list[bytes]:
    """The test's own reading of a run's tokens: each BMOE_PROGRESS line's JSON through json.loads, the
    line read as latin-1 so that the raw bytes >= 0x80 the engine prints come back as they were."""
    out = []
    for line in (Path(run_dir) / "stdout.txt").read_bytes().split(b"\n"):
        if line.startswith(b"BMOE_PROGRESS "):
            payload = json.loads(line[len(b"BMOE_PROGRESS "):].decode("latin-1"), strict=False)
            out.append(payload["delta_text"].encode("latin-1"))
    return out


def _rows(table, **where):
    sel = table
    for column, value in where.items():
        sel = sel[sel[column] == value]
    return sel.to_dict("records")


def test_identical_outputs_agree_in_every_token(quality_table):
    lossless = _rows(quality_table, outcome="ok", lossy_levers="")
    assert len(lossless) == 2
    ref = {r["quality_ref_run"] for r in lossless}
    assert len(ref) == 1 and ref <= {r["run_id"] for r in lossless}
    ref_dir = next(r["run_dir"] for r in lossless if r["run_id"] in ref)
    for r in lossless:
        tokens = _deltas(r["run_dir"])
        assert tokens == _deltas(ref_dir) and len(tokens) == 16
        assert r["agree_tokens"] == r["output_tokens"] == len(tokens) == r["tokens"]
        assert r["agree_frac"] == 1.0 and r["agree_identical"] is True and r["quality_ref_conflict"] == ""
        assert r["quality_ref_cell"] == next(x["cell_id"] for x in lossless if x["run_id"] in ref)


def test_a_drop_diverges_at_the_first_token_whose_bytes_differ(quality_table):
    drops = _rows(quality_table, outcome="ok", lossy_levers=DROP_LEVERS)
    assert len(drops) == 2
    for r in drops:
        assert r["drop_pct"] > 0
        mine, theirs = _deltas(r["run_dir"]), _deltas(_rows(quality_table, run_id=r["quality_ref_run"])[0]["run_dir"])
        first = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
        assert 0 < first < len(mine) == len(theirs) == 16
        assert r["agree_tokens"] == first and r["agree_identical"] is False
        assert r["agree_frac"] == first / 16
    # a top-k under the model's own is a lever of its own, set against the same top-k 2 reference
    lower = _rows(quality_table, outcome="ok", n_expert_used=1.0)
    assert lower and all(r["lossy_levers"].endswith("top-k 1 of 2") for r in lower)
    assert {r["quality_ref_run"] for r in lower} == {r["quality_ref_run"] for r in drops}


def test_without_progress_lines_only_identity_is_known(quality_table):
    ok = _rows(quality_table, outcome="ok")
    answers = {r["run_id"]: b"".join(_deltas(r["run_dir"])) for r in ok}
    a, b = ok[0]["run_id"], next(r["run_id"] for r in ok if r["agree_identical"] is False)
    tokens, frac, identical = agreement(RunOutput(None, answers[a]), RunOutput(None, answers[a]))
    assert math.isnan(tokens) and math.isnan(frac) and identical is True
    assert agreement(RunOutput(None, answers[b]), RunOutput(None, answers[a]))[2] is False
    assert agreement(RunOutput(None, None), RunOutput(None, answers[a])) [2] is None


def test_a_ppl_txt_beside_the_runs_gives_the_perplexity_loss(quality_campaign, skewed_model, tmp_path, quality_table):
    """Real scoring runs of bmoe-py claiming 0.24: the reference's flags, and a drop's (stepped, so the
    drop acts while scoring), kept as ppl.txt beside a reference and a drop run of a copy."""
    camp = tmp_path / "camp"
    shutil.copytree(quality_campaign, camp)
    text = tmp_path / "text.txt"
    text.write_bytes(b"Every token visits its experts; the cache keeps them warm for the next one.\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}, "BMOE_PY_RELEASE": "0.24"}
    base = [sys.executable, "-m", "engine", "-m", str(skewed_model), "-t", "1", "--moe-stream", "--cache-mb", "1",
            "--force-cache", "--ppl", str(text), "--ppl-step"]
    ref_row = _rows(quality_table, run_id=_rows(quality_table, lossy_levers=DROP_LEVERS)[0]["quality_ref_run"])[0]
    drop_row = _rows(quality_table, outcome="ok", lossy_levers=DROP_LEVERS)[0]
    ppl = {}
    for row, extra in ((ref_row, []), (drop_row, [DROP, f"{APP_DROP_COLD:g}"])):
        done = subprocess.run(base + extra, capture_output=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        folder = camp / Path(row["run_dir"]).relative_to(quality_campaign)
        (folder / PPL_TXT).write_bytes(done.stdout)
        ppl[row["run_id"]] = float(re.search(rb"^ppl: ([0-9.]+) ", done.stdout, re.M)[1])
    table = build_table([camp])
    got = {r["run_id"]: r for r in table.to_dict("records")}
    ref_id = ref_row["run_id"].replace(ref_row["campaign"], got[ref_row["run_id"]]["campaign"])
    assert got[ref_id]["ppl"] == ppl[ref_row["run_id"]] and got[ref_id]["ppl_loss_pct"] == 0
    expect = 100 * (ppl[drop_row["run_id"]] / ppl[ref_row["run_id"]] - 1)
    assert got[drop_row["run_id"]]["ppl_loss_pct"] == pytest.approx(expect, abs=1e-9)
    other_drop = next(r for r in _rows(table, lossy_levers=DROP_LEVERS) if r["run_id"] != drop_row["run_id"])
    assert math.isnan(other_drop["ppl_loss_pct"])          # no ppl.txt of its own: unknown, not zero


def test_recommend_without_a_bound_never_names_a_lossy_setting(quality_campaign, quality_table):
    # the drop runs are faster beyond noise (the wrapper's doing): a default ranked by speed alone would be one
    k2 = _rows(quality_table, outcome="ok", n_expert_used=2.0)
    beyond, ratio, _ = differs([r["tok_s"] for r in k2 if not r["lossy_levers"]], [r["tok_s"] for r in k2 if r["lossy_levers"]])
    assert beyond and ratio > 1
    recs = recommend([quality_campaign])
    rec = next(r for r in recs.all() if r.top_k == 2)
    for argv in rec.argvs().values():
        assert argv[argv.index("--n-expert-used") + 1] == "2"
        assert DROP not in argv or argv[argv.index(DROP) + 1] in ("0", "0.0")
    assert all(r.lossy_alternative is None for r in recs.all())
    doc = json.loads(recs.to_json())
    validate(doc)
    assert not any("lossy_alternative" in r for d in doc["devices"] for r in d["recommendations"])
    # the app's default dropping is not shipped, but what it costs is said, at the model's own top-k only
    app = _rows(quality_table, outcome="ok", lossy_levers=f"drop {APP_DROP_COLD:g}")
    base = [r for r in k2 if not r["lossy_levers"]]
    (said,) = rec.app_drop
    assert said.startswith(f"the app's default dropping ({APP_DROP_COLD:g}) at {app[0]['budget_label']}: ")
    assert f"agreement {statistics.mean(r['agree_frac'] for r in app):.2f}" in said
    assert (f"flash {statistics.median(r['read_mib_per_tok'] for r in base):.2f} → "
            f"{statistics.median(r['read_mib_per_tok'] for r in app):.2f} MiB/token") in said
    assert said in recs.text() and not next(r for r in recs.all() if r.top_k == 1).app_drop
    assert [r["app_drop"] for d in doc["devices"] for r in d["recommendations"] if "app_drop" in r] == [[said]]


@pytest.mark.parametrize("bound", ["agreement>=0", "agreement>=0.2", "agreement>=0.5", "agreement>=1", "ppl+5%"])
def test_recommend_with_a_bound_names_a_lossy_setting_only_within_it(quality_campaign, quality_table, bound):
    parsed = parse_bound(bound)
    recs = recommend([quality_campaign], max_quality_loss=parsed)
    alt = next(r for r in recs.all() if r.top_k == 2).lossy_alternative
    assert alt is not None and alt.bound == bound
    validate(json.loads(recs.to_json()))
    rows = {r["run_id"]: r for r in quality_table.to_dict("records")}
    lossy = [r for r in rows.values() if r["outcome"] == "ok" and r["lossy_levers"]]
    best = max(r["agree_frac"] for r in lossy)
    if parsed.agreement is not None and parsed.agreement <= best:
        assert alt.argv is not None, alt.why
        mine = [rows[r] for r in alt.run_ids]
        assert alt.agreement == pytest.approx(sum(r["agree_frac"] for r in mine) / len(mine))
        assert alt.agreement >= parsed.agreement and alt.speedup > 1
        assert all(r["lossy_levers"] == alt.levers for r in mine)
        # the argv is one that was measured: the chosen runs' own
        assert alt.argv in {settings_of(list(r["argv"])) for r in mine}
        assert f"{alt.identical} of {alt.compared} outputs identical" in alt.text
        # the fastest setting within the bound, by its runs' median tok/s (a setting's speed)
        within: dict[str, list[float]] = {}
        for r in lossy:
            within.setdefault(r["lossy_levers"], []).append(r["tok_s"])
        within = {k: v for k, v in within.items()
                  if sum(rows[x]["agree_frac"] for x in rows if rows[x]["lossy_levers"] == k and rows[x]["outcome"] == "ok")
                  / len(v) >= parsed.agreement}
        assert alt.levers == max(within, key=lambda k: statistics.median(within[k]))
    else:
        assert alt.argv is None and alt.why.startswith("none qualifies")
        if parsed.ppl_pct is not None:
            assert "no perplexity measured" in alt.why


def test_the_front_keeps_what_no_other_setting_beats(quality_table):
    front = quality_front(quality_table).to_dict("records")
    assert len(front) == 4 and {f["budget"] for f in front} == {front[0]["budget"]}
    lossless = next(f for f in front if not f["lossy_levers"])
    assert lossless["quality_loss"] == 0 and lossless["quality_basis"] == "agreement" and lossless["on_front"]
    for f in front:
        beaten = any(g is not f and g["tok_s"] >= f["tok_s"] and g["quality_loss"] <= f["quality_loss"]
                     and g["peak_rss_mib"] <= f["peak_rss_mib"] and (g["tok_s"], -g["quality_loss"], -g["peak_rss_mib"])
                     != (f["tok_s"], -f["quality_loss"], -f["peak_rss_mib"]) for g in front)
        assert f["on_front"] is not beaten
        assert f["quality_loss"] == pytest.approx(100 * (1 - f["agreement"]))


@pytest.mark.parametrize("text", ["ppl+2", "ppl 2%", "agreement>0.9", "agreement>=1.5", "ppl+2%,ppl+1%", "",
                                  "agreement>=.9", "ppl+-1%", "ppl+2%,", "ppl+١%"])
def test_a_bad_bound_is_one_line_and_no_work(text, tmp_path):
    from harness.cli.main import main as cli

    with pytest.raises(ResultsError):
        parse_bound(text)
    result = CliRunner().invoke(cli, ["recommend", str(tmp_path), "--max-quality-loss", text])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "--max-quality-loss" in lines[0]


def test_good_bounds_parse():
    assert (parse_bound("ppl+2%").ppl_pct, parse_bound("ppl+2%").agreement) == (2.0, None)
    both = parse_bound("agreement>=0.95,ppl+0.5%")
    assert (both.ppl_pct, both.agreement) == (0.5, 0.95)
