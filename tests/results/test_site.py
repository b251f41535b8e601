"""The static site: every page opened in headless Chromium (no console errors, every plotly chart
drawn), device strings rendered as text, published upstream cells reproduced, and the device page
screenshot for the README."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests.results.conftest import PROJECT, SCRIPT_TAG


class Page(HTMLParser):
    """The parts of a page the tests look at: scripts, text, table rows, links, JSON figures."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.scripts: list[dict] = []
        self.text: list[str] = []
        self.rows: list[list[str]] = []
        self.links: list[tuple[str, str]] = []
        self.h1 = ""
        self._stack: list[str] = []
        self._script: dict | None = None
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._link: tuple[str, list[str]] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._stack.append(tag)
        if tag == "script":
            self._script = {"attrs": attrs, "body": ""}
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self._link = (attrs.get("href", ""), [])

    def handle_endtag(self, tag):
        if self._stack:
            self._stack.pop()
        if tag == "script" and self._script is not None:
            self.scripts.append(self._script)
            self._script = None
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        elif tag == "a" and self._link is not None:
            self.links.append((self._link[0], "".join(self._link[1]).strip()))
            self._link = None

    def handle_data(self, data):
        if self._script is not None:
            self._script["body"] += data
            return
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._link is not None:
            self._link[1].append(data)
        if self._stack and self._stack[-1] == "h1":
            self.h1 += data

    def figures(self) -> list[dict]:
        return [json.loads(s["body"]) for s in self.scripts if s["attrs"].get("type") == "application/json"]

    def kv(self, key: str) -> str:
        return next(r[1] for r in self.rows if len(r) == 2 and r[0] == key)


def page(path: Path) -> Page:
    return Page(path.read_text(encoding="utf-8"))


def test_every_page_loads_without_console_errors_and_draws_its_charts(site, browser):
    pages = sorted(site.rglob("*.html"))
    runs = list(site.glob("runs/*/*.html"))
    assert len(runs) == 12 + 20 + 57 and (site / "index.html") in pages and len(list(site.glob("devices/*"))) == 3
    problems = []
    charts = 0
    for path in pages:
        info, errors = browser.visit(path.as_uri())
        charts += info["charts"]
        if errors or info["done"] != str(info["charts"]) or info["drawn"] != info["charts"] \
                or info["svgs"] < info["charts"] or (info["charts"] and not info["traces"]):
            problems.append((path.relative_to(site), info, errors[:3]))
    assert not problems, problems
    assert charts > len(runs)                          # run pages carry two charts each when they have a CSV
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    for path in pages:                                 # offline: nothing is fetched from the network
        assert "https://cdn" not in path.read_text() and "http://" not in path.read_text()


def test_a_broken_chart_is_caught_by_the_same_check(site, browser, tmp_path):
    """The check above can fail: a page whose plotly.min.js is missing reports its error."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "assets").mkdir()
    for name in ("site.js", "site.css"):
        (broken / "assets" / name).write_bytes((site / "assets" / name).read_bytes())
    (broken / "index.html").write_text((site / "devices").glob("virtual*").__next__().read_text()
                                       .replace('href="../', 'href="').replace('src="../', 'src="'))
    info, errors = browser.visit((broken / "index.html").as_uri(), timeout=3)
    assert errors and info["drawn"] == 0 and info["charts"] > 0


def test_the_device_page_draws_cycle_kills_and_the_replayed_curve(site, browser, tmp_path):
    device_page = next(site.glob("devices/virtual-tight-*.html"))
    p = page(device_page)
    figures = p.figures()
    assert len(figures) == 2                                # alpha at top-k 2 and at top-k 8
    k2 = figures[0]
    names = [t["name"] for t in k2["data"]]
    assert "replayed LRU (predicted hit %)" in names and "killed (LMK)" in names
    notes = [a["text"] for a in k2["layout"]["annotations"]]
    assert "token cycle 51 MiB" in notes and "killed at 256 MiB" in notes and "always survived 102 MiB" in notes
    killed = next(t for t in k2["data"] if t["name"] == "killed (LMK)")
    assert killed["x"] == [256, 256]
    measured = next(t for t in k2["data"] if t["name"] == "hit % (measured)")
    predicted = next(t for t in k2["data"] if t["name"] == "replayed LRU (predicted hit %)")
    for x, y in zip(measured["x"], measured["y"]):         # measured points sit on the predicted line
        assert abs(dict(zip(predicted["x"], predicted["y"]))[x] - y) <= 0.05 + 1e-9
    # the README's screenshot is refreshed only on request: a test run never dirties the checkout
    out = PROJECT / "docs" / "device-page.png" if os.environ.get("BMOE_UPDATE_SCREENSHOT") else tmp_path / "device.png"
    assert browser.screenshot(device_page.as_uri(), out) == []
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


def test_device_strings_render_as_text(site):
    index = page(site / "index.html")
    device_href = next(h for h, t in index.links if t == SCRIPT_TAG)
    assert device_href.startswith("devices/") and "<" not in device_href and ">" not in device_href
    for path in [site / "index.html", site / device_href, next(site.glob("devices/virtual-tight-*.html")),
                 next(site.glob("runs/upstream-*/*.html"))]:
        html = path.read_text()
        assert SCRIPT_TAG not in html                       # never as markup
        p = Page(html)
        for s in p.scripts:                                 # only our own code, and data that is not code
            assert s["attrs"].get("src") or s["attrs"].get("type") == "application/json", s
            assert SCRIPT_TAG not in s["body"]
    assert page(site / device_href).h1.strip() == f"device {SCRIPT_TAG}"
    # the virtual phone's getprop model is data too
    assert page(next(site.glob("devices/virtual-tight-*.html"))).kv("model") == SCRIPT_TAG


def test_a_group_with_nothing_to_draw_says_so_instead_of_an_empty_chart(site):
    # the <script> device's "bad" model has runs, none of them finished or killed at a budget
    device = next(site.glob("devices/script-alert-1-script-*.html"))
    html = device.read_text()
    assert "nothing to draw: no run of this group finished or was killed at a known budget" in html
    for figure in Page(html).figures():
        if "against the cache budget" in figure["layout"]["title"]["text"]:
            assert any(t.get("x") for t in figure["data"])


# benchmarks.md (upstream, 2026-07-12 matrix): mean, min, max, median, p5, p95 tok/s and hit %
PUBLISHED = {
    "2026-07-12/qwen_stream": (1.71, 0.50, 1.81, 1.78, 1.62, 1.80, None),
    "2026-07-12/qwen_c2000_l2": (2.01, 1.17, 4.66, 2.04, 1.42, 3.17, 53),
    "2026-07-12/qwen_c2000_l4": (2.37, 1.45, 4.88, 2.40, 1.73, 3.57, 53),
    "2026-07-12/qwen_c4000_l2": (3.12, 1.24, 6.66, 3.30, 2.01, 5.46, 76),
    "2026-07-12/qwen_c4000_l4": (3.47, 1.09, 7.62, 3.64, 2.15, 6.00, 76),
    "2026-07-12/qwen_c4000_l4_ov": (3.98, 1.26, 8.43, 4.89, 2.00, 7.37, 76),
    "2026-07-12/gemma_mmap": (0.36, 0.12, 4.47, 0.44, 0.15, 3.41, None),
    "2026-07-12/gemma_c2000_l2": (2.08, 1.21, 4.02, 2.14, 1.49, 2.98, 58),
    "2026-07-12/gemma_c2000_l4_ov": (2.78, 1.78, 4.04, 2.82, 2.24, 3.58, 58),
}
LABELS = ("mean tok/s (tokens / Σ wall)", "min tok/s (slowest token)", "max tok/s (fastest token)", "median tok/s",
          "p5 tok/s", "p95 tok/s")


@pytest.fixture(scope="module")
def run_pages(site) -> dict[str, Page]:
    out = {}
    for path in site.glob("runs/upstream-*/*.html"):
        p = page(path)
        source = next((r[1] for r in p.rows if len(r) == 2 and r[0] == "source"), None)
        if source:
            out[source] = p
    return out


@pytest.mark.parametrize("source", sorted(PUBLISHED))
def test_the_report_reproduces_upstreams_published_cells(site, run_pages, source):
    runs = pd.read_csv(site / "runs.csv")
    row = runs[runs["source"] == source].iloc[0]
    *published, hit = PUBLISHED[source]
    columns = ("mean_tok_s", "min_tok_s", "max_tok_s", "median_tok_s", "p5_tok_s", "p95_tok_s")
    assert [f"{row[c]:.2f}" for c in columns] == [f"{v:.2f}" for v in published]
    assert (np.isnan(row["cache_hit_pct"]) if hit is None else round(row["cache_hit_pct"]) == hit)
    # and the run's page shows the same distribution (3 significant digits)
    p = run_pages[source]
    assert [float(p.kv(label)) for label in LABELS] == [float(f"{row[c]:.3g}") for c in columns]


def test_gemmas_killed_4000_mib_cache_is_absent_from_its_passing_runs(site):
    """Upstream left the cache-4000 Gemma rows out of the 2026-07-12 matrix (the LMK took them);
    the report shows exactly the runs that finished: Gemma tops out at 2000 MiB, Qwen at 4000."""
    runs = pd.read_csv(site / "runs.csv")
    session = runs[runs["source"].fillna("").str.startswith("2026-07-12/") & (runs["outcome"] == "ok")]

    def budgets(model):
        return sorted(session[session["model"] == model]["cache_mb"].dropna().unique())
    assert budgets("gemma") == [0, 2000] and budgets("qwen") == [0, 2000, 4000]
    assert len(session[session["model"] == "gemma"]) == 6          # the six Gemma rows of the published table


def test_the_upstream_gpt_oss_trace_shows_the_cliff(site):
    device = page(next(p for p in site.glob("devices/*.html") if SCRIPT_TAG in p.read_text()
                       .replace("&lt;", "<").replace("&gt;", ">")))
    fig = next(f for f in device.figures() if f["layout"]["title"]["text"].startswith("gpt-oss (top-k 2)"))
    predicted = next(t for t in fig["data"] if t["name"] == "replayed LRU (predicted hit %)")
    curve = dict(zip(predicted["x"], predicted["y"]))
    assert all(h == 0.0 for b, h in curve.items() if b < 890)         # under the ~908 MiB cycle: nothing hits
    assert curve[3000.0] == pytest.approx(32.4, abs=0.05)              # the phone measured 32.4 % at 3000 MiB
    # upstream's CSVs of these runs carry no cycle: the trace's own expert bytes price it
    assert "token cycle 907.69 MiB" in [a["text"] for a in fig["layout"]["annotations"]]


def test_the_site_carries_the_versioned_recommendations_and_refuses_other_folders(site, cli, local_campaign, tmp_path):
    recs = json.loads((site / "recommendations.json").read_text())
    assert recs["format"] == "bmoe-fleet.recommendations" and recs["version"] == 2
    assert {d["device"] for d in recs["devices"]} == {"local", "virtual:tight", SCRIPT_TAG}
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    result = CliRunner().invoke(cli, ["report", str(local_campaign), "-o", str(taken)])
    assert result.exit_code == 1 and "is not a bmoe-fleet site" in result.output
    assert (taken / "notes.txt").read_text() == "mine\n"
    fresh = CliRunner().invoke(cli, ["report", str(local_campaign), "-o", str(tmp_path / "s"), "--json"])
    # stdout alone: on a build past a second the progress line ("report: run pages N/M") is on stderr
    assert fresh.exit_code == 0 and json.loads(fresh.stdout)["runs"] == 20
    again = CliRunner().invoke(cli, ["report", str(local_campaign), "-o", str(tmp_path / "s")])
    assert again.exit_code == 0 and "wrote 23 pages" in again.output      # a previous site is replaced


# ── the site where it hurt ───────────────────────────────────────────────────────


def test_budget_charts_draw_the_recommended_ceiling_and_fixed_budget(site):
    recs = json.loads((site / "recommendations.json").read_text())
    checked = 0
    for d in recs["devices"]:
        figures = {f["layout"]["title"]["text"]: f for path in site.glob("devices/*.html") for f in page(path).figures()}
        for r in d["recommendations"]:
            k = f"top-k {r['top_k']}" if r["top_k"] is not None else "default top-k"
            fig = figures.get(f"{r['model']} ({k}) on {d['device']}: hit % and tok/s against the cache budget")
            if fig is None:
                continue                                   # nothing to draw (no run finished at a budget)
            notes = [a["text"] for a in fig["layout"]["annotations"]]
            lines = {a["text"]: a["x"] for a in fig["layout"]["annotations"]}
            if r["auto"]:
                assert lines[f"recommended ceiling {r['auto']['cache_ceil_mb']} MiB"] == r["auto"]["cache_ceil_mb"]
            if r["fixed"]:
                assert lines[f"recommended --cache-mb {r['fixed']['cache_mb']}"] == r["fixed"]["cache_mb"], notes
            checked += 1
    assert checked >= 3


def test_a_budget_whose_cache_never_filled_is_tagged_on_its_row(site):
    """The local campaign's auto runs (sized to the whole bank) end holding less than it: their rows
    say so and why they do not count; no other row does."""
    recs = json.loads((site / "recommendations.json").read_text())
    (local,) = [r for d in recs["devices"] if d["device"] == "local" for r in d["recommendations"]
                if r["model"] == "small"]
    unfilled = local["lmk"]["unfilled"]
    assert len(unfilled) == 1 and unfilled[0]["held_mib"] < unfilled[0]["budget_mib"]
    (path,) = [p for p in site.glob("devices/*.html") if page(p).h1.strip() == "device local"]
    rows = [r for r in page(path).rows if len(r) == 9 and r[1] != "budget"]     # …, predicted, floor, notes
    tagged = [r for r in rows if "cache never filled" in r[8]]
    assert tagged and all(r[1].startswith("auto") for r in tagged)
    assert all(f"(held {unfilled[0]['held_mib']:.3g} MiB): not counted as safe" in r[8] for r in tagged)
    assert any(r[1].endswith("MiB") and not r[1].startswith("auto") for r in rows if r not in tagged)


def test_a_killed_auto_run_sits_at_the_budget_it_was_sized_to(killed_auto_campaign, tmp_path):
    from results.read.table import build_table
    from results.site.report import build_site

    table = build_table([killed_auto_campaign])
    (killed,) = table[table["cache_auto"]].to_dict("records")
    assert killed["outcome"] == "killed" and killed["exit_status"] == 137 and killed["tokens"] != killed["tokens"]
    stderr = (killed_auto_campaign / "runs" / killed["cell_id"] / "1" / "stderr.txt").read_text()
    sized = float(re.search(r"→ (\d+) MiB budget", stderr)[1])
    assert killed["cache_mb"] == sized > 0                 # from the engine's load line: no token was written
    out = build_site([killed_auto_campaign], tmp_path / "site")
    (fig,) = page(next(Path(out.out_dir).glob("devices/local-*.html"))).figures()
    marks = next(t for t in fig["data"] if t["name"] == "killed (LMK)")
    assert marks["x"] == [sized] and "auto" in marks["text"][0]
    assert f"killed at {sized:g} MiB" in [a["text"] for a in fig["layout"]["annotations"]]


def test_plotly_is_loaded_only_by_pages_that_draw(site):
    index = page(site / "index.html")
    assert not any("plotly" in s["attrs"].get("src", "") for s in index.scripts)
    assert not index.figures()
    for path in [next(site.glob("devices/local-*.html")), next(site.glob("runs/local-sweep-*/*.html"))]:
        p = page(path)
        assert p.figures() and any(s["attrs"].get("src", "").endswith("assets/plotly.min.js") for s in p.scripts)
    quiet = [path for path in site.rglob("*.html") if not page(path).figures()]
    assert quiet and all("plotly" not in path.read_text() for path in quiet)


def test_the_site_holds_no_host_path(site, local_campaign, vphone_campaign, imported, small_model, fleet_home):
    forbidden = [str(p) for p in (local_campaign, vphone_campaign, imported, small_model.parent, fleet_home,
                                  PROJECT, Path.home())]
    hits = []
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".json", ".csv"):
            text = path.read_text(encoding="utf-8")
            hits += [(path.relative_to(site), f) for f in forbidden if f in text]
    assert not hits, hits[:5]
    runs = pd.read_csv(site / "runs.csv")
    assert "run_dir" not in runs.columns and "campaign_dir" not in runs.columns
    local = runs[runs["device"] == "local"].iloc[0]
    argv = json.loads(local["argv"])
    assert argv[0] == "bmoe-py" and argv[argv.index("-m") + 1] == "small.gguf"
    phone = runs[runs["device"] == "virtual:tight"].iloc[0]       # a phone's paths are the phone's
    assert json.loads(phone["argv"])[0] == "/data/local/tmp/bmoe/bmoe-py"


def test_run_pages_speak_celsius_local_time_and_mib(site):
    # a run that ran to the end (a killed run's evidence quotes lmkd's lines verbatim, epoch stamps and all)
    p = page(next(f for f in sorted(site.glob("runs/vphone-lmk-*/*.html")) if "outcome-ok" in f.read_text()))
    text = " ".join(p.text)
    assert "m°C" not in text and "d°C" not in text and re.search(r"\d+\.\d °C", text)
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", p.kv("taken at"))
    assert p.kv("mem available").endswith(" MiB") and not re.search(r"\b1[6-9]\d{8}\b", text)   # no epoch seconds


def test_the_index_names_engines_and_dates_and_keeps_the_why_short(site):
    p = page(site / "index.html")
    text = " ".join(p.text)
    assert "engines: " in text and "bmoe-py 0.1.0" in text
    campaigns = {r[0].split()[0]: r for r in p.rows if len(r) == 5 and r[0] != "campaign"}
    assert set(campaigns) == {"local-sweep", "vphone-lmk", "upstream"}
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d", r[1]) for r in campaigns.values())
    assert "bmoe-py 0.1.0" in campaigns["local-sweep"][2]
    html = (site / "index.html").read_text()
    whys = re.findall(r'<td data-label="why">(.*?)<details>', html, re.S)
    assert whys and all(len(re.sub(r"<[^>]+>|\s+", " ", w).strip()) <= 200 for w in whys)
    assert html.count("<summary>evidence</summary>") == len(whys)


@pytest.mark.parametrize("width", [1400, 412])
def test_index_device_and_run_pages_fit_the_screen(site, browser, width):
    pages = [site / "index.html", next(site.glob("devices/virtual-tight-*.html")), next(site.glob("runs/local-sweep-*/*.html"))]
    browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": width < 600})
    try:
        for path in pages:
            info, errors = browser.visit(path.as_uri())
            assert not errors and info["drawn"] == info["charts"]
            assert browser.evaluate("document.documentElement.scrollWidth") <= width, path.name
        browser.visit((site / "index.html").as_uri())
        cards = browser.evaluate("[...document.querySelectorAll('article.card')].map(c => c.getBoundingClientRect().width)")
        assert len(cards) == 3 and all(0 < w <= width for w in cards)
        display = browser.evaluate("getComputedStyle(document.querySelector('table.recs td')).display")
        assert display == ("block" if width < 600 else "table-cell")   # a stacked card on a phone
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride")


def test_no_tells_is_not_shown_as_an_alarm(browser, tmp_path):
    from results.site.environment import make_environment, templates_dir
    from results.site.pages import IndexPage

    (tmp_path / "assets").mkdir()
    for name in ("site.css", "site.js"):
        (tmp_path / "assets" / name).write_bytes((templates_dir() / name).read_bytes())
    index = IndexPage(title="t", root="", campaigns=(), devices=(), models=(), cards=(), rule="", engines="",
                      tells=(), runs=0)
    (tmp_path / "index.html").write_text(make_environment().get_template("index.html").render(page=index))
    browser.visit((tmp_path / "index.html").as_uri())
    color = browser.evaluate("getComputedStyle(document.querySelector('p.none')).color")
    assert color == "rgb(46, 125, 50)"                        # green, not the red of a tell


def test_a_build_runs_without_the_cyclic_collector_and_leaves_it_as_it_was(killed_auto_campaign, tmp_path,
                                                                           monkeypatch):
    import gc

    from results.site import report

    during: list[bool] = []
    analyze = report.analyze
    monkeypatch.setattr(report, "analyze", lambda *a, **k: during.append(gc.isenabled()) or analyze(*a, **k))
    assert gc.isenabled()
    report.build_site([killed_auto_campaign], tmp_path / "on")
    assert during == [False] and gc.isenabled()
    gc.disable()
    try:
        report.build_site([killed_auto_campaign], tmp_path / "off")
        assert during == [False, False] and not gc.isenabled()        # a caller's own choice is kept
    finally:
        gc.enable()
