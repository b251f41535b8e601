"""A run whose engines' threads exceed its cores carries the `oversubscribed` tell in the table, the
analysis, the recommendations and every page; runs that differ only by an engine flag never pool,
in the analysis, in compare and on the pages.

The campaign runs a wrapper engine as native bmoe-cli (conftest.write_engine: the real bmoe-py
in-process, counted by its -t like bmoe-cli), so `-t cores+1` oversubscribes this host by the
harness's own accounting without a thread pool spinning."""

from __future__ import annotations

import pytest

from harness.run.cpushare import local_cpu
from results.analysis.analyze import analyze
from results.analysis.compare import compare
from results.analysis.recommend import recommendations_from
from results.read.table import build_table
from results.site.report import build_site
from results.site.site_format import Urls
from tests.results.conftest import local_campaign_data, run_local, write_engine
from tests.results.test_site import page

CORES = local_cpu().cores


@pytest.fixture(scope="module")
def crowded(tmp_path_factory, small_model):
    root = tmp_path_factory.mktemp("crowded")
    return run_local(root / "crowded", local_campaign_data(
        "crowded", small_model, {"cache_mb": [0], "flags": {"-t": [1, CORES + 1], "-c": [256, 512]}},
        {"n_predict": 4}, engine=write_engine(root / "engines", "crowded")))


def test_the_tell_is_in_the_table_the_analysis_and_the_recommendation(crowded):
    table = build_table([crowded])
    assert len(table) == 4 and set(table["outcome"]) == {"ok"}
    over = table[table["threads"] == CORES + 1]
    assert len(over) == 2 and over["oversubscribed"].all() and (over["cores"] == CORES).all()
    assert all("oversubscribed" in f.split(",") for f in over["flags"])
    a = analyze(table)
    told = {t.run_ids[0]: t.message for t in a.tells if t.kind == "oversubscribed"}
    assert set(over["run_id"]) <= set(told)
    for rid in over["run_id"]:
        assert f"on {CORES} cores (this run {CORES + 1}" in told[rid]
        assert "oversubscribed" in a.table[a.table["run_id"] == rid]["tells"].iloc[0].split(",")
    fit = table[table["threads"] == 1]
    for row in fit.to_dict("records"):       # alone on this host, -t 1 fits; another engine here would be named
        assert row["oversubscribed"] is (row["threads_sum"] > CORES)
        assert (row["run_id"] in told) is row["oversubscribed"]
        if not row["cpu_engines"]:
            assert row["threads_sum"] == 1 and not row["oversubscribed"]
    (rec,) = recommendations_from(a).devices[0].recommendations
    assert rec.confidence == "low" and any("oversubscribed" in r for r in rec.confidence_reasons)

    # the four cells differ by -t and -c only: four series, four compare cells, never pooled
    (group,) = a.groups
    assert sorted(p.series for p in group.points) == sorted(
        f"threads={t} flags=-c {c}" for t in (1, CORES + 1) for c in (256, 512))
    report = compare(crowded, crowded)
    assert len(report.cells) == 4 and all(c.a_runs == 1 for c in report.cells)
    assert sorted(c.label.split("[")[1] for c in report.cells) == ["-c 256]", "-c 256]", "-c 512]", "-c 512]"]


def test_the_tell_and_the_cores_are_on_the_pages(crowded, tmp_path):
    site = tmp_path / "site"
    build_site([crowded], site)
    table = analyze(build_table([crowded])).table
    over = table[table["threads"] == CORES + 1]
    for row in over.to_dict("records"):
        p = page(site / Urls.run(row["run_id"]))
        text = " ".join(p.text)
        assert "oversubscribed" in text.split() and "Contamination tells" in text
        assert f"on {CORES} cores (this run {CORES + 1}" in text
        assert p.kv("cores") == str(CORES) and p.kv("this engine's compute threads") == str(CORES + 1)
        assert p.kv("oversubscribed").startswith("yes")
        assert "-c" in p.kv("engine_flags")                      # the run's own flags, in its configuration
    index = page(site / "index.html")
    assert sum("oversubscribed: " in text for text in index.text) >= len(over)
    device = " ".join(page(site / Urls.device("local")).text)
    assert f"threads={CORES + 1} flags=-c 256" in device and "compute threads on" in device
