"""A session run's page (docs/decisions/session-cells.md, on the site): the turns table (per turn: s/token, hit %,
reads, the re-read after each gap, faults, swap-in, and the gap's VmSwap / VmRSS / RssFile), the
session chart with each gap shaded, opened in headless Chromium; and a run whose gap took the cache
says so on its page."""

from __future__ import annotations

import json
import shutil

import pytest

from results.site.report import build_site
from tests.results.conftest import local_campaign_data, run_local
from tests.results.test_site import page


@pytest.fixture(scope="module")
def session_campaign(tmp_path_factory, small_model):
    out = tmp_path_factory.mktemp("turns") / "session-sweep"
    return run_local(out, local_campaign_data(
        "session-sweep", small_model, {"cache_mb": [0, "cycle*3"], "dense_weights": ["anon"]},
        run={"n_predict": 6, "threads": 1, "turns": 3, "idle_s": 1.5, "retries": 0}))


def _runs(campaign):
    recs = [json.loads(p.read_text()) for p in sorted(campaign.glob("runs/*/*/run.json"))]
    return {(r["cell_id"], r["attempt"]): r for r in recs}


def _page_of(site, rec):
    (path,) = list(site.glob(f"runs/*/{rec['cell_id']}-*-{rec['attempt']}.html"))
    return path


def test_a_session_run_page_shows_its_turns_and_gaps(session_campaign, tmp_path, browser):
    site = tmp_path / "site"
    build_site([session_campaign], site)
    runs = _runs(session_campaign)
    assert len(runs) == 2
    for rec in runs.values():
        path = _page_of(site, rec)
        p = page(path)
        header = next(r for r in p.rows if r and r[0] == "turn")
        rows = [r for r in p.rows if len(r) == len(header) and r is not header and r[0] != "turn"]
        assert [r[0] for r in rows] == ["1", "2", "3"], rows
        col = {name: i for i, name in enumerate(header)}
        for row, turn in zip(rows, rec["turns"], strict=True):
            assert row[col["outcome"]] == turn["outcome"] == "done"
            assert row[col["hit % (session)"]].startswith(f"{turn['cache_hit_pct']:g}"), (row, turn)
            assert row[col["read"]] == f"{turn['read_mib']:g} MiB"
        assert rows[0][col["gap before it (s)"]] == "" and rows[1][col["gap before it (s)"]] == "1.5"
        assert rows[2][col["VmRSS min in the gap"]].endswith(" MiB")
        session = next(f for f in p.figures() if "session" in f["layout"]["title"]["text"])
        gaps = [s for s in session["layout"]["shapes"] if s["type"] == "rect"]
        assert [(g["x0"], g["x1"]) for g in gaps] == [(t["gap"]["start_t_s"], t["gap"]["end_t_s"])
                                                       for t in rec["turns"][1:]]
        assert {d["name"] for d in session["data"]} >= {"VmRSS", "RssFile"}
        assert "no gap took the cache" in " ".join(p.text)
        info, errors = browser.visit(path.as_uri())
        assert not errors and info["charts"] >= 2 and info["drawn"] == info["charts"], (info, errors)


def test_a_run_whose_gap_took_the_cache_says_so(session_campaign, tmp_path):
    """The same rule as the analysis (results.read.turns.gap_taken): a copy of the campaign whose turn 2
    re-read 5 MiB more than a first turn that evicted nothing."""
    copy = tmp_path / "copy"
    shutil.copytree(session_campaign, copy)
    path = next(p for p in sorted(copy.glob("runs/*/*/run.json")) if json.loads(p.read_text())["config"]["cache_mb"])
    rec = json.loads(path.read_text())
    rec["turns"][0]["evictions"] = 0
    rec["turns"][1]["read_mib"] = rec["turns"][0]["read_mib"] + 5.0
    rec["turns"][2]["read_mib"] = 0.0
    path.write_text(json.dumps(rec))
    site = tmp_path / "site"
    build_site([copy], site)
    text = " ".join(page(_page_of(site, rec)).text)
    assert f"taken in the gap: turn 2 re-read {rec['turns'][1]['read_mib']:.3g} MiB" in text, text[-2000:]
    assert "no gap took the cache" not in text
