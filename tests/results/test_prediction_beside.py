"""Prediction beside measurement (docs/prediction.md): the analysis carries, for every
measured streamed budget of a group with a probe and a cache-0 run, the predicted s/token, hit %
and anon MiB (results.replay.predict), the run table each run's, with the error; the device page
shows them and the budget chart draws the predicted curve."""

from __future__ import annotations

import math

from results.analysis.analyze import analyze
from results.read.table import build_table
from results.replay.predict import predict


def test_every_measured_streamed_budget_has_a_finite_prediction_and_its_error(local_campaign):
    table = build_table([local_campaign])
    analysis = analyze(table)
    predictions = predict(table)
    assert predictions, "the campaign has route-traced runs and cache-0 runs"
    checked = 0
    for g in analysis.groups:
        assert {p.dense_weights for p in g.predictions} == {k[3] for k in predictions if k[:3] == (g.device, g.model,
                                                                                                  g.top_k)}
        for p in g.points:
            if not p.ok or math.isnan(p.budget_mib):
                continue
            assert math.isfinite(p.predicted_s_per_tok) and p.predicted_s_per_tok > 0, p
            assert 0 <= p.predicted_hit_pct <= 100 and p.predicted_anon_mib > 0, p
            assert math.isfinite(p.prediction_error_pct), p
            # the same number the prediction module gives at that budget
            (dense,) = {table.set_index("run_id").loc[r, "dense_weights"] for r in p.run_ids}
            assert p.predicted_s_per_tok == predictions[(g.device, g.model, g.top_k, dense)].at(p.budget_mib).s_per_tok
            checked += 1
    assert checked >= 8
    runs = analysis.table
    streamed = runs[(runs["outcome"] == "ok") & runs["moe_stream"].astype(bool) & ~runs["probe"].astype(bool)]
    assert streamed["predicted_s_per_tok"].notna().all() and streamed["prediction_error_pct"].notna().all()
    # under the first decode hit every budget > 0 misses what cache 0 misses (the replay's hit is 0 %
    # there), so each series predicts them alike; cache 0 is its own runs' mean
    under = {}
    for g in analysis.groups:
        for p in g.points:
            if p.under_cycle and p.ok and 0 < p.budget_mib < (g.replay.first_decode_hit_mib if g.replay else 0):
                assert p.predicted_hit_pct == 0.0
                under.setdefault((g.device, g.model, g.top_k, p.series), set()).add(p.predicted_s_per_tok)
    assert under and all(len(v) == 1 for v in under.values()), under


def test_the_device_page_shows_the_prediction_and_the_chart_draws_its_curve(local_campaign, tmp_path):
    from results.site.report import build_site

    build_site([local_campaign], tmp_path / "site")
    page = next((tmp_path / "site" / "devices").glob("*.html")).read_text()
    assert "predicted s/token (error)" in page
    # a predicted value with its error in each measured row; the anchor's row says it is an input
    assert page.count(" %)</td>") + page.count(" %), the prediction&#39;s anchor</td>") >= 8
    assert page.count("the prediction&#39;s anchor") == 2       # one anchor per dense mode
    assert '"name": "predicted tok/s' in page or '"name":"predicted tok/s' in page


def test_recommendations_say_measured_and_set_the_prediction_beside_without_an_argv(local_campaign):
    """recommendations.json: each shipped argv says it was measured; the model's
    view is beside it, `basis: predicted`, with no argv, its numbers those of the analysis."""
    import json

    from results.analysis.recommend import recommend

    recs = recommend([local_campaign])
    doc = json.loads(recs.to_json())
    analysis = analyze(build_table([local_campaign]))
    assert doc["devices"]
    for d, device in zip(doc["devices"], recs.devices):
        assert d["default"]["basis"] == "measured" and device.default.basis == "measured"
        for r, rec in zip(d["recommendations"], device.recommendations):
            for choice in (r["fixed"], r["auto"]):
                if choice is not None:
                    assert choice["basis"] == "measured"
            pred = r["predicted"]
            assert pred["basis"] == "predicted" and "argv" not in pred and pred["working_set_mib"] > 0
            # the analysis' own predicted s/token at the measured budgets the recommendation rests on
            points = analysis.group(rec.device, rec.model, rec.top_k).points
            for key, budget in (("s_per_tok_at_fixed", rec.fixed.cache_mb if rec.fixed else None),
                                ("s_per_tok_at_largest_safe", rec.auto.largest_safe_mib if rec.auto else None)):
                at = [p.predicted_s_per_tok for p in points if p.budget_mib == budget
                      and not math.isnan(p.predicted_s_per_tok)]
                if not at:
                    assert pred[key] is None
                    continue
                assert any(math.isclose(pred[key], x, rel_tol=1e-3, abs_tol=5e-4) for x in at), (key, pred, at)
            assert rec.fixed is None or pred["s_per_tok_at_fixed"] is not None     # a measured, streamed budget
