"""The quality-against-speed chart (results/site/quality_view.py, docs/decisions/quality-chart.md) on
a site of the real quality campaign (conftest `quality_campaign`: lossless, the app's default drop and
a top-k under the model's own) and the lossless local campaign, both on this host: the skewed model
gets the chart on its device and model pages, with every setting of the front, the recommended
lossless default and the app's default dropping marked, its cost in words and a table; the small
model, all lossless, gets no section. Opened in headless Chromium, the figure draws its marked points."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from results.analysis.android_app import APP_DROP_COLD
from results.analysis.quality import quality_front
from results.read.table import build_table
from results.site.report import build_site
from tests.results.test_site import Page, page

APP = f"the app's default dropping ({APP_DROP_COLD:g})"
RECOMMENDED = "recommended (the lossless default)"
TITLE = "skewed on local: tok/s against quality loss"


@pytest.fixture(scope="module")
def quality_site(tmp_path_factory, quality_campaign, local_campaign) -> Path:
    out = tmp_path_factory.mktemp("quality-site") / "site"
    build_site([quality_campaign, local_campaign], out)
    return out


def _page_of(site: Path, folder: str, name: str) -> Path:
    (path,) = [p for p in site.glob(f"{folder}/*.html") if page(p).h1.strip() == name]
    return path


def _flat(points) -> list[float]:
    """(x, y) points in order, as one flat list (pytest.approx compares flat sequences only)."""
    return [float(v) for point in sorted(points) for v in point]


def _figure(p: Page) -> dict:
    (fig,) = [f for f in p.figures() if f["layout"]["title"]["text"] == TITLE]
    return fig


def test_the_quality_chart_shows_every_setting_and_marks_the_default_and_the_apps(quality_site, quality_campaign):
    table = build_table([quality_campaign])
    front = quality_front(table).to_dict("records")
    device = page(_page_of(quality_site, "devices", "device local"))
    fig = _figure(device)
    assert "100 × (1 − agreement" in fig["layout"]["xaxis"]["title"]["text"]
    traces = {t["name"]: t for t in fig["data"]}
    drawn = [(x, y) for t in fig["data"] if t["name"] in ("front", "beaten") for x, y in zip(t["x"], t["y"])]
    # one point per setting, at 100 × (1 − its runs' mean agree_frac) and its median tok/s
    expect = []
    for f in front:
        runs = table[table["run_id"].isin(f["run_ids"])]
        expect.append((100 * (1 - runs["agree_frac"].mean()), float(np.median(runs["tok_s"]))))
    assert _flat(drawn) == pytest.approx(_flat(expect))
    on_front = sorted((f["quality_loss"], f["tok_s"]) for f in front if f["on_front"])
    assert _flat(zip(traces["front"]["x"], traces["front"]["y"])) == pytest.approx(_flat(on_front))
    assert traces["front"]["mode"] == "lines+markers" and traces["front"]["x"] == sorted(traces["front"]["x"])
    # the recommended point: the lossless runs recommend measured as its fixed budget (top-k 2, the model's own)
    recs = json.loads((quality_site / "recommendations.json").read_text())
    (rec,) = [r for d in recs["devices"] for r in d["recommendations"] if r["model"] == "skewed" and r["top_k"] == 2]
    fixed = table[table["run_id"].isin(rec["fixed"]["run_ids"])]
    assert set(fixed["lossy_levers"]) == {""} and len(fixed) == 2
    assert (traces[RECOMMENDED]["x"], traces[RECOMMENDED]["y"]) == ([0.0], [pytest.approx(np.median(fixed["tok_s"]))])
    # the app's default: the drop at 0.75 alone, at the model's own top-k
    app = table[(table["lossy_levers"] == f"drop {APP_DROP_COLD:g}") & (table["outcome"] == "ok")]
    assert len(app) == 2 and set(app["n_expert_used"]) == {2.0}
    assert traces[APP]["x"] == [pytest.approx(100 * (1 - app["agree_frac"].mean()))]
    assert {a["text"] for a in fig["layout"]["annotations"]} == {RECOMMENDED, APP}
    # its cost in words: against the lossless setting at the same budget (the recommended one here)
    ratio = np.median(app["tok_s"]) / np.median(fixed["tok_s"])
    text = " ".join(device.text)
    # and what it buys in flash reads: the medians of the runs' own MiB/token, without and with it
    flash = f"flash {np.median(fixed['read_mib_per_tok']):.2f} → {np.median(app['read_mib_per_tok']):.2f} MiB/token"
    assert (f"{APP} at {app['budget_label'].iloc[0]}: {ratio:.2f}× tok/s, {flash}, agreement "
            f"{app['agree_frac'].mean():.2f}, {int(app['agree_identical'].sum())} of 2 outputs identical") in text
    assert math.isfinite(ratio) and ratio > 1            # the wrapper slows every run without a drop five times
    # the table: one row per setting, the marks where the chart puts them
    header = next(r for r in device.rows if r and r[0] == "setting")
    rows = [r for r in device.rows if len(r) == len(header) and r is not header and r[0] != "setting"]
    col = {name: i for i, name in enumerate(header)}
    assert sorted(r[col["setting"]] for r in rows) == sorted(f["lossy_levers"] or "lossless" for f in front)
    marks = {r[col["setting"]]: r[col["marked"]] for r in rows}
    assert marks["lossless"] == "recommended" and marks[f"drop {APP_DROP_COLD:g}"] == "app's default"
    assert sum(r[col["on the front"]] == "yes" for r in rows) == len(on_front)
    # the lossless small model: no quality section, on its device page or its model page
    html = _page_of(quality_site, "devices", "device local").read_text()
    assert html.count('<section class="quality">') == 1 and "small: quality against speed" not in html
    assert '<section class="quality">' not in _page_of(quality_site, "models", "model small").read_text()
    model = page(_page_of(quality_site, "models", "model skewed"))
    assert _figure(model)["data"] == fig["data"]


def test_the_quality_chart_draws_its_marked_points_offline(quality_site, browser):
    for folder, name in (("devices", "device local"), ("models", "model skewed")):
        path = _page_of(quality_site, folder, name)
        assert "http://" not in path.read_text() and "https://" not in path.read_text()
        info, errors = browser.visit(path.as_uri())
        assert not errors and info["drawn"] == info["charts"] > 0, (info, errors)
        drawn = browser.evaluate(
            "(() => { const gd = document.querySelector('section.quality .chart');"
            " return {names: gd.data.map(t => t.name), points: gd.querySelectorAll('g.points path.point').length,"
            " notes: [...gd.querySelectorAll('g.annotation-text-g text')].map(t => t.textContent),"
            " figure: gd.getAttribute('data-figure'), rendered: gd.getAttribute('data-rendered')}; })()")
        figure = _figure(page(path))
        assert drawn["rendered"] == "1" and drawn["names"] == [t["name"] for t in figure["data"]]
        assert sorted(drawn["notes"]) == sorted([APP, RECOMMENDED])
        assert drawn["points"] == sum(len(t["x"]) for t in figure["data"])       # every setting and both marks
