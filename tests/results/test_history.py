"""History across engine releases from the results database (results/analysis/history.py,
docs/decisions/history.md): `history --db`, `compare --db` with the previous release as its
baseline and the Mann-Whitney U test as its judge, and the site's history page in Chromium.

Real campaigns of one plan on this host (`local`), the small model: bmoe-py at its default claim
(0.19.0) and bmoe-py claiming 0.24.0 (engine.claim, i.e. BMOE_PY_RELEASE), two campaigns of two
repeats each, run in the order old, new, new, old, so that a host whose load drifts (the suite runs
beside them) slows both releases alike and a same-speed pair stays one; then a wrapper engine
claiming 0.24.0 that makes every decode step five times as long and 30 ms longer still (conftest
write_engine), six repeats. Four runs a cell a side are the fewest with which a two-sided U test can
reach p < 0.05 (2/70); the slow side's six keep p under it (4/210) when the loaded host slows one
old run past a slow one, as a CI run once did (p 2/35 with four).
The two releases go into one database (a same-speed pair), the old one and the slow one into
another (a real slowdown of more than 5x).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from results.analysis.analyze import analyze
from results.analysis.history import History, compare_release, engine_release, history
from results.analysis.noise import NOISE_MIN, U_ALPHA, differs, mann_whitney_p, robust_cv, u_differs
from results.analysis.recommend import recommendations_from
from results.db import schema
from results.db.ingest import ingest
from results.read.table import build_table
from results.site.history_view import history_pages, history_url
from results.site.site_format import Urls
from tests.conftest import copied_once
from tests.results import pg
from tests.results.conftest import local_campaign_data, run_local, write_engine
from tests.results.test_results_db import pg_server  # noqa: F401  (the fixture, shared)
from tests.results.test_site import page

PROJECT = Path(__file__).resolve().parents[2]
AXES = {"cache_mb": ["cycle*1.5"]}             # one cell over the token cycle: a ceiling and a hit % to follow
RUN = {"repeats": 2, "n_predict": 8}
OLD, NEW = "bmoe-py 0.1.0", "bmoe-py 0.1.0 (bmoe-cli 0.24.0)"
OLDS, NEWS = ("old-a", "old-b"), ("new-a", "new-b")


@pytest.fixture(scope="module")
def releases(tmp_path_factory, small_model) -> Path:
    def build(root: Path) -> None:
        for name in ("old-a", "new-a", "new-b", "old-b"):          # drift cancels: module doc
            engine = {"claim": "0.24.0"} if name.startswith("new") else None
            run_local(root / name, local_campaign_data("hist", small_model, AXES, RUN, engine=engine))
        run_local(root / "slow", local_campaign_data("hist", small_model, AXES, {**RUN, "repeats": 6},
                                                     engine=write_engine(root / "engines", "slowed", "always", 30,
                                                                         claim="0.24.0")))

    return copied_once(tmp_path_factory, "history", build)


@pytest.fixture(scope="module")
def dbs(releases, tmp_path_factory) -> dict[str, str]:
    """same: old and new (same speed); slowed: old and slow."""
    folder = tmp_path_factory.mktemp("history-db")
    out = {"same": str(folder / "same.sqlite"), "slowed": str(folder / "slowed.sqlite")}
    ingest([releases / n for n in OLDS + NEWS], out["same"])
    ingest([releases / n for n in OLDS + ("slow",)], out["slowed"])
    return out


def _cli(*args: object):
    from harness.cli.main import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_history_gives_each_release_in_order_what_its_runs_recommendation_gives(releases, dbs, tmp_path):
    # from the database alone: the campaign folders are gone when it is asked
    moved = {name: shutil.copytree(releases / name, tmp_path / name) for name in OLDS + NEWS}
    db = str(tmp_path / "moved.sqlite")
    ingest(list(moved.values()), db)
    expected = {engine: recommendations_from(analyze(build_table([moved[n] for n in names]))).devices[0].recommendations
                for engine, names in ((OLD, OLDS), (NEW, NEWS))}
    for folder in moved.values():
        shutil.rmtree(folder)
    result = _cli("history", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [(r["engine"], r["release"]) for r in rows] == [(OLD, "0.19.0"), (NEW, "0.24.0")]
    for row in rows:
        (rec,) = expected[row["engine"]]
        assert (row["device"], row["model"], row["top_k"]) == ("local", "small", 2)
        assert row["cache_off"] == rec.cache_off
        assert row["ceiling_mib"] == (rec.auto.cache_ceil_mb if rec.auto is not None else None)
        assert rec.fixed is not None and row["fixed_mib"] == rec.fixed.cache_mb
        # a host that fights over the cache (the suite beside it swaps) makes it cache 0, never run here
        assert row["tok_s_runs"] == rec.fixed.runs == (4 if rec.fixed.measured else 0)
        for column, value in (("tok_s", rec.fixed.tok_s), ("hit_pct", rec.fixed.hit_pct)):
            assert (row[column] is None) == math.isnan(value), column
            assert row[column] is None or row[column] == pytest.approx(value, abs=1e-4)
        assert row["app_rung_mb"] == rec.app_rung_mb and row["runs"] == 4
        assert row["campaigns"] == [f"hist@{n}" for n in (OLDS if row["engine"] == OLD else NEWS)]
    # the same in a table a person reads, and for one device and model
    for fmt in ("csv", "md"):
        text = _cli("history", "--db", db, "--device", "local", "--model", "small", "--format", fmt).stdout
        assert text.index(OLD) < text.index("0.24.0") and len(text.strip().splitlines()) == 3 + (fmt == "md")


def test_history_refuses_bad_input_in_one_line(dbs, tmp_path):
    empty = tmp_path / "empty.sqlite"
    schema.connect(str(empty)).dispose()                   # the tables made, no campaign ingested
    for args, message in ((["--db", dbs["same"], "--device", "nope"], "device 'nope': no runs of it in "),
                          (["--db", dbs["same"], "--model", "nope"], "model 'nope': no runs of it in "),
                          (["--db", str(empty)], "no runs in the database"),
                          (["--db", str(tmp_path / "none.sqlite")], "no results database there")):
        result = _cli("history", *args)
        assert result.exit_code == 1, result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: ") and message in line, line
    assert "(devices there: local)" in _cli("history", "--db", dbs["same"], "--device", "nope").output
    # compare: one campaign needs the database; a release with none before it has nothing to compare with
    usage = _cli("compare", str(tmp_path))
    assert usage.exit_code == 2 and "--db URL with one campaign" in usage.output
    first = _cli("compare", "--db", dbs["same"], "--device", "local", "--model", "small", "--engine-b", OLD)
    assert first.exit_code == 1 and f"no release before {OLD} in the database" in first.output
    assert os.path.getsize(dbs["same"]) > 0 and engine_release(NEW) > engine_release(OLD)


def test_compare_takes_the_previous_release_and_the_u_test_flags_only_the_real_slowdown(releases, dbs):
    # one campaign: its runs against every run of the release before it on the device and model
    one = json.loads(_cli("compare", releases / "new-b", "--db", dbs["same"], "--json").stdout)
    assert one["test"] == {"name": "mann-whitney-u", "sides": 2, "alpha": U_ALPHA}
    assert one["a"] == f"the previous release ({OLD}: hist@old-a, hist@old-b)"
    cells = [c for c in one["cells"] if c["status"] == "compared"]
    assert len(cells) == 1
    for c in cells:
        assert {r.split("/")[0] for r in c["a_run_ids"]} == {"hist@old-a", "hist@old-b"} and len(c["a_run_ids"]) == 4
        assert len(c["b_run_ids"]) == 2
        assert {r.split("/")[0] for r in c["b_run_ids"]} == {"hist@new-b"}
    # the newest release (both its campaigns) against the one before: the same speed, no verdict either way.
    # Past 30 % only: the two new campaigns run one after the other, and a burst of load from the
    # tests beside them (a forked report, say) can slow both alike by more than their noise, which
    # the U test then rightly calls a difference of this host's; the real slowdown below is 5x.
    same = _cli("compare", "--db", dbs["same"], "--device", "local", "--model", "small", "--json",
                "--fail-on-regression", "--threshold", "30")
    assert same.exit_code == 0, same.output
    for c in json.loads(same.stdout)["cells"]:
        assert len(c["a_run_ids"]) == len(c["b_run_ids"]) == 4
        assert all(m["verdict"] == "same" for m in c["changes"] if m["metric"] == "tok/s"), c["changes"]
    slowed = _cli("compare", releases / "slow", "--db", dbs["slowed"], "--json", "--fail-on-regression")
    assert slowed.exit_code == 4, slowed.output
    (cell,) = [c for c in json.loads(slowed.stdout)["cells"] if c["status"] == "compared"]
    (tok,) = [m for m in cell["changes"] if m["metric"] == "tok/s"]
    assert tok["verdict"] == "regression" and tok["p_value"] < U_ALPHA and tok["ratio"] < 0.5
    # with no campaign named: the newest release on the device and model, against the one before
    text = _cli("compare", "--db", dbs["slowed"], "--device", "local", "--model", "small").stdout
    assert "B = local small: bmoe-py 0.1.0 (bmoe-cli 0.24.0)" in text and "REGRESSION" in text and ", p 0.0" in text
    # two campaigns: the comparison as it always was (the noise rule, no test, no p-values)
    plain = json.loads(_cli("compare", releases / "old-a", releases / "slow", "--json").stdout)
    assert "test" not in plain and all("p_value" not in m for c in plain["cells"] for m in c["changes"])


def test_postgresql_gives_the_history_and_the_comparison_sqlite_gives(releases, dbs, pg_server):  # noqa: F811
    with pg.database(pg_server) as url:
        ingest([releases / n for n in OLDS + NEWS], url)
        assert history(url).to_dict() == history(dbs["same"]).to_dict()
        b = releases / "new-b"
        assert compare_release(url, b).to_dict() == compare_release(dbs["same"], b).to_dict()


def _enumerated_p(a: list[float], b: list[float]) -> float:
    """The exact two-sided p by brute force: U over every split of the pooled values (no ties)."""
    pooled, n1 = a + b, len(a)

    def u(first: tuple[float, ...]) -> int:
        rest = [v for v in pooled if v not in first]
        return sum(x > y for x in first for y in rest)

    us = [u(c) for c in itertools.combinations(pooled, n1)]
    seen = min(u(tuple(a)), n1 * len(b) - u(tuple(a)))
    return min(1.0, 2 * sum(x <= seen for x in us) / len(us))


def test_the_u_test_is_the_exact_distribution_and_its_normal_approximation():
    for a, b in (([1, 2, 3, 4], [5, 6, 7, 8]), ([1, 2, 3], [4, 5, 6]), ([9, 8, 7, 6, 5], [1, 2, 3, 4, 0]),
                 ([1, 3, 5, 7], [2, 4, 6, 8]), ([1.5, 9, 4, 7.25], [2, 3, 10, 11, 12]), ([5.0], [1.0, 2.0, 3.0])):
        assert mann_whitney_p(a, b) == pytest.approx(_enumerated_p([float(x) for x in a], [float(x) for x in b]))
    # ranges apart: 2 / C(8, 4) with four a side, under U_ALPHA; three a side can never get under it
    four, three = mann_whitney_p([1, 2, 3, 4], [5, 6, 7, 8]), mann_whitney_p([1, 2, 3], [4, 5, 6])
    assert four == pytest.approx(2 / math.comb(8, 4)) and four < U_ALPHA
    assert three == pytest.approx(2 / math.comb(6, 3)) and three > U_ALPHA
    # 20 a side: the exact tail and the normal approximation agree (the approximation's textbook accuracy)
    for shift in (3.5, 6.5, 9.5):
        a, b = [float(i) for i in range(20)], [i + shift for i in range(20)]
        exact = mann_whitney_p(a, b)
        assert mann_whitney_p(a, b, exact_max=0) == pytest.approx(exact, abs=0.005)
        assert exact == pytest.approx(mann_whitney_p(b, a))
    assert math.isnan(mann_whitney_p([], [1.0])) and mann_whitney_p([2.0, 2.0], [2.0, 2.0]) == 1.0


def test_one_outlying_run_neither_hides_a_real_slowdown_nor_makes_one():
    # four runs of the old release, one of them six times as fast as the others; six of the new one,
    # 3.2x slower: a CI run's shape (ranges apart, p = 2/210; the CV rule's bar at 330 % called it the same)
    old, slow = [46.2, 46.4, 46.6, 280.0], [14.3, 14.4, 14.5, 14.55, 14.6, 14.45]
    moved, ratio, threshold, p = u_differs(old, slow)
    assert moved and ratio == pytest.approx(14.475 / 46.5) and p == pytest.approx(2 / 210) and threshold < 0.5
    assert differs(old, slow)[2] > 1 / ratio - 1           # the CV's bar is past the change itself
    # the same runs with no real change: the U test and the robust bar both say the same
    moved, ratio, threshold, p = u_differs(old, [46.1, 46.3, 46.5, 46.7, 46.4, 46.2])
    assert not moved and ratio == pytest.approx(46.35 / 46.5)
    # a small shift the U test finds is still under the floor; tied values have no spread
    assert not u_differs([10.0, 10.1, 10.2, 10.3], [10.6, 10.7, 10.8, 10.9])[0]
    assert u_differs([10.0, 10.1, 10.2, 10.3], [10.6, 10.7, 10.8, 10.9])[3] < U_ALPHA
    assert robust_cv([33.3, 33.3, 33.3]) == 0.0 and math.isnan(robust_cv([1.0]))
    assert robust_cv([9.0, 10.0, 11.0, 10.0, 1000.0]) == pytest.approx(1.4826 * 1.0 / 10.0)
    assert NOISE_MIN == 0.10


def test_the_history_page_opens_in_chromium(releases, dbs, tmp_path, browser):
    site = tmp_path / "site"
    result = _cli("report", releases / "new-b", "--db", dbs["same"], "-o", site)
    assert result.exit_code == 0, result.output
    path = site / history_url("local", "small")
    p = page(path)
    (fig,) = p.figures()
    tok = [t for t in fig["data"] if t["name"].startswith("tok/s")]
    assert [x.replace("<br>", " ") for x in tok[0]["x"]] == [OLD, NEW]
    h = history(dbs["same"])
    assert tok[0]["y"] == pytest.approx([r.tok_s for r in h.rows])
    assert [r[1] for r in p.rows if len(r) > 1 and r[1] in (OLD, NEW)] == [OLD, NEW]
    assert OLD in " ".join(p.text) and "small on local across engine releases" in " ".join(p.text)
    assert history_url("local", "small") in (site / "index.html").read_text()
    # the device page links its history page, and the history page links back to it
    device = site / Urls.device("local")
    assert f'<a href="../{history_url("local", "small")}">small across engine releases</a>' in device.read_text()
    back = re.search(r'device <a href="([^"]+)"', path.read_text())
    assert back is not None and (path.parent / back[1]).resolve() == device.resolve()
    info, errors = browser.visit(path.as_uri())
    assert errors == [] and info["charts"] == info["drawn"] == 1 and info["traces"] >= 2
    out = PROJECT / "docs" / "history-page.png" if os.environ.get("BMOE_UPDATE_SCREENSHOT") else tmp_path / "h.png"
    assert browser.screenshot(path.as_uri(), out) == []
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one release of a device and model: no page
    only = History(tuple(r for r in h.rows if r.engine == OLD))
    assert history_pages(only) == [] and len(history_pages(h)) == 1
