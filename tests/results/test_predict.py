"""results.replay.predict on real runs: bmoe-py on this host (-t 1), a knee probe, cache 0 and budgets under
and over the token cycle of the small model (cycle 3.2 MiB, working set 10.8 MiB), and cache 0's
buffered twin (`--no-odirect`)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from results.read.route_trace import read_route_trace
from results.read.table import build_table
from results.replay.lru_replay import access_sequence, knee_mib, lru_curve, stack_distances
from results.replay.predict import (
    PhoneRam,
    PredictionError,
    cell_errors,
    measured_s_per_tok,
    missing_inputs,
    predict,
    predict_from_runs,
    run_rates,
)
from store import names
from tests.results.conftest import local_campaign_data, run_local


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, small_model):
    out = tmp_path_factory.mktemp("predict") / "predict-sweep"
    return run_local(out, local_campaign_data(
        "predict-sweep", small_model,
        {"cache_mb": [0, "cycle*0.5", "cycle*1.5", "cycle*3", "knee"]},
        run={"route_trace": True, "threads": 1}))


@pytest.fixture(scope="module")
def twin(tmp_path_factory, small_model):
    """Cache 0 again, reading through the page cache: the same group, another series."""
    out = tmp_path_factory.mktemp("predict") / "predict-twin"
    return run_local(out, local_campaign_data("predict-twin", small_model, {"cache_mb": [0]},
                                              run={"threads": 1, "o_direct": False}))


@pytest.fixture(scope="module")
def table(campaign):
    return build_table([campaign])


@pytest.fixture(scope="module")
def prediction(table):
    predictions = predict(table, phones={"local": PhoneRam(mem_total_mib=36.0, low_watermark_mib=1.0)},
                          extra_budgets_mib=(16, 32))
    assert list(predictions) == [("local", "small", 2, "anon")]
    return next(iter(predictions.values()))


def test_the_probe_and_a_cache0_sweep_run_are_the_inputs(prediction, table):
    probe = table[table["run_id"] == prediction.probe_run_id].iloc[0]
    cache0 = table[table["run_id"] == prediction.cache0_run_id].iloc[0]
    assert bool(probe["probe"]) and probe["has_route_trace"]
    assert cache0["cache_mb"] == 0 and not cache0["probe"]


def test_every_measured_cell_has_a_finite_prediction(prediction, table):
    errors = cell_errors(table, {prediction.key: prediction})
    sweep = table[(table["outcome"] == "ok") & ~table["probe"]]
    assert sorted(e.run_id for e in errors) == sorted(sweep["run_id"])
    assert len(errors) >= 4
    for e in errors:
        assert math.isfinite(e.predicted_s_per_tok) and e.predicted_s_per_tok > 0
        assert math.isfinite(e.error_pct)
        assert math.isfinite(e.predicted_anon_mib)


def test_budgets_under_the_first_reuse_predict_exactly_zero_decode_hits(prediction):
    under = [b for b in prediction.budgets if b.budget_mib < prediction.cycle_mib * 0.8]
    assert len(under) >= 3
    assert prediction.first_decode_hit_mib is not None and prediction.first_decode_hit_mib <= prediction.cycle_mib
    for b in prediction.budgets:
        if b.budget_mib < prediction.first_decode_hit_mib:
            assert b.hit_pct_decode == 0.0 and b.under_cycle
            assert b.miss_mib_per_tok == prediction.at(0.0).miss_mib_per_tok
            # every budget > 0 there misses all cache 0 misses, at a cached run's cost per miss
            assert b.budget_mib == 0 or b.s_per_tok == under[-1].s_per_tok
    assert prediction.at(0.0).hit_pct_cum == 0.0


def test_predicted_hit_equals_the_replay_and_the_engine(prediction, table, campaign):
    probe = table[table["run_id"] == prediction.probe_run_id].iloc[0]
    trace = read_route_trace(f"{probe['run_dir']}/{names.ROUTE_CSV}")
    budgets = [b.budget_mib for b in prediction.budgets]
    replayed = lru_curve(access_sequence(trace), budgets, trace.cycle_bytes)
    assert [b.hit_pct_cum for b in prediction.budgets] == [p.hit_pct_cum for p in replayed]
    assert [b.hit_pct_decode for b in prediction.budgets] == [p.hit_pct_decode for p in replayed]
    # the probe runs the sweep's prompt and tokens, so the engine's own hit % is the replay's too
    for e in cell_errors(table, {prediction.key: prediction}):
        assert e.measured_hit_pct == pytest.approx(e.predicted_hit_pct, abs=0.05)


def test_io_falls_with_misses_and_compute_is_the_floor(prediction):
    # over 0 (a cached run may cost more per token than cache 0: it manages what it misses)
    s = [b.s_per_tok for b in prediction.budgets if b.budget_mib > 0]
    assert all(a >= b for a, b in itertools.pairwise(s))
    rates = prediction.rates
    assert rates.io_s_per_tok > 0 and rates.read_mib_per_s > 0
    assert prediction.budgets[-1].s_per_tok > 0
    assert prediction.at(0.0).s_per_tok == pytest.approx(rates.wall_s_per_tok)
    assert 1.0 <= prediction.alignment < 1.2     # O_DIRECT reads round entries up to 4 KiB pages


def test_anon_is_monotone_and_flat_past_the_working_set(prediction):
    anon = [b.anon_mib for b in prediction.budgets]
    assert all(a <= b for a, b in itertools.pairwise(anon))
    ws = prediction.working_set_mib
    past = [b.anon_mib for b in prediction.budgets if b.budget_mib >= ws]
    assert len(past) >= 2 and len(set(past)) == 1
    assert prediction.at(0.0).anon_mib == pytest.approx(prediction.rates.rss_anon_peak_mib)
    assert past[0] == pytest.approx(prediction.rates.rss_anon_peak_mib + ws)


def test_the_ram_budget_is_where_anon_meets_the_phone(prediction, table):
    capacity = 36.0 - 1.0
    assert prediction.ram_capacity_mib == capacity
    b = prediction.ram_budget_mib
    assert b is not None and not prediction.ram_fits_every_budget
    assert prediction.rates.rss_anon_peak_mib + b == pytest.approx(capacity)
    roomy = predict(table, phones={"local": PhoneRam(mem_total_mib=4096)})[prediction.key]
    assert roomy.ram_fits_every_budget and roomy.ram_budget_mib == roomy.working_set_mib
    tiny = predict(table, phones={"local": PhoneRam(mem_total_mib=8)})[prediction.key]
    assert tiny.ram_budget_mib is None and not tiny.ram_fits_every_budget
    # zram: what it frees is counted at (1 - 1/ratio) of what can be swapped before lmkd's low swap
    zram = PhoneRam(mem_total_mib=36.0, low_watermark_mib=1.0, zram_disksize_mib=10, zram_ratio=2.0)
    assert zram.engine_capacity_mib == pytest.approx(capacity + 10 * 0.9 * 0.5)
    assert predict(table, phones={"local": PhoneRam(mem_total_mib=36)})[prediction.key].ram_budget_mib > b


def test_a_group_without_its_inputs_is_named(table):
    no_zero = table[table["cache_mb"] != 0]
    assert missing_inputs(no_zero) == {("local", "small", 2, "anon"): "no cache-0 run"}
    assert predict(no_zero) == {}


def test_a_cache0_run_without_tokens_is_one_line(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(PredictionError, match="no token rows"):
        run_rates(path, ["r"])


def test_budgets_over_0_are_predicted_from_the_cached_cell_nearest_the_knee(prediction, table):
    probe = table[table["run_id"] == prediction.probe_run_id].iloc[0]
    seq = access_sequence(read_route_trace(f"{probe['run_dir']}/{names.ROUTE_CSV}"))
    anchor = prediction.anchor
    zero = prediction.at(0.0)
    # of the measured budgets whose misses read at least a tenth of cache 0's, the one nearest the knee
    knee = knee_mib(seq, stack_distances(seq))
    sweep = sorted({float(b) for b in table.loc[~table["probe"], "cache_mb"] if b > 0})
    eligible = [b for b in sweep if prediction.at(b).miss_mib_per_tok >= zero.miss_mib_per_tok / 10]
    assert len(eligible) >= 2
    assert anchor is not None and anchor.budget_mib == min(eligible, key=lambda b: abs(math.log(b / knee)))
    runs = table[(table["cache_mb"] == anchor.budget_mib) & ~table["probe"]]
    assert sorted(anchor.run_ids) == sorted(runs["run_id"])
    at = prediction.at(anchor.budget_mib)
    # its own cost there, and its own visible reads and management per missed MiB as the slope
    assert at.s_per_tok == pytest.approx(anchor.rates.wall_s_per_tok)
    assert prediction.slope_s_per_mib == pytest.approx(
        (anchor.rates.visible_io_s_per_tok + anchor.rates.mgmt_s_per_tok) / at.miss_mib_per_tok)
    for b in prediction.budgets:
        if b.budget_mib > 0:
            assert b.s_per_tok == pytest.approx(max(0.0, at.s_per_tok - prediction.slope_s_per_mib * (
                at.miss_mib_per_tok - b.miss_mib_per_tok)))
    assert zero.s_per_tok == pytest.approx(prediction.rates.wall_s_per_tok)
    marked = {e.run_id for e in cell_errors(table, {prediction.key: prediction}) if e.anchor}
    assert marked == set(anchor.run_ids)


def test_without_a_cached_cell_budgets_are_predicted_from_cache0s_read_time(prediction, table):
    bare = table[(table["cache_mb"] == 0) | table["probe"]]
    alone = predict(bare)[prediction.key]
    rates = alone.rates
    assert alone.anchor is None
    assert alone.slope_s_per_mib == pytest.approx(rates.visible_io_fraction * alone.alignment / rates.read_mib_per_s)
    for b in alone.budgets:
        assert b.s_per_tok == pytest.approx(rates.wall_s_per_tok - rates.visible_io_fraction * (
            alone.at(0.0).io_s_per_tok - b.io_s_per_tok))


@pytest.mark.parametrize(("key", "other"), [("engine_args", "['--no-think']"), ("engine_flags", "--overlap")])
def test_cached_cells_of_another_series_are_no_anchor(prediction, table, key, other):
    """The analysis' series keys (results.read.run_keys) keep inputs apart too: cached cells run with
    other engine arguments than cache 0 do not set its slope."""
    moved = table.copy()
    cached = (moved["cache_mb"] > 0) & ~moved["probe"]
    assert key in moved.columns and str(other) not in set(moved[key].astype(str))
    moved[key] = moved[key].astype(object)
    moved.loc[cached, key] = other
    apart = predict(moved)[prediction.key]
    assert prediction.anchor is not None and apart.anchor is None
    assert apart.cache0_run_ids == prediction.cache0_run_ids


def test_every_cache0_repeat_is_pooled(local_campaign):
    table = build_table([local_campaign])          # two repeats of every cell
    p = predict(table)[("local", "small", 2, "anon")]
    zero = table[(table["cache_mb"] == 0) & ~table["probe"] & (table["outcome"] == "ok")
                 & (table["dense_weights"] == "anon")]
    assert len(zero) == 2 and sorted(p.cache0_run_ids) == sorted(zero["run_id"])
    walls = [measured_s_per_tok(f"{d}/{names.METRICS_CSV}") for d in zero["run_dir"]]
    tokens = [int(t) for t in zero["tokens"]]
    assert p.rates.tokens == sum(tokens)
    assert p.rates.wall_s_per_tok == pytest.approx(sum(w * n for w, n in zip(walls, tokens, strict=True)) / sum(tokens))


def test_a_buffered_twin_adds_what_cache0_computes_over_it_per_miss_mib_to_the_slope(prediction, campaign, twin):
    table = build_table([campaign, twin])
    with_twin = predict(table)[prediction.key]
    buffered = table[table["config_o_direct"].astype(str) == "False"]
    assert len(buffered) == 1 and with_twin.buffered is not None
    assert with_twin.buffered.run_ids == tuple(buffered["run_id"])
    # the curve's own inputs are still the O_DIRECT runs
    assert with_twin.cache0_run_ids == prediction.cache0_run_ids
    assert prediction.anchor is not None and with_twin.anchor is not None
    assert with_twin.anchor.run_ids == prediction.anchor.run_ids
    zero, anchor = with_twin.at(0.0), with_twin.at(with_twin.anchor.budget_mib)
    fresh = max(0.0, with_twin.rates.compute_s_per_tok - with_twin.buffered.compute_s_per_tok) / zero.miss_mib_per_tok
    assert with_twin.fresh_s_per_mib == pytest.approx(fresh)
    assert with_twin.slope_s_per_mib == pytest.approx(prediction.slope_s_per_mib + fresh)
    for b in with_twin.budgets:
        if b.budget_mib > 0:
            assert b.s_per_tok == pytest.approx(max(0.0, anchor.s_per_tok - with_twin.slope_s_per_mib * (
                anchor.miss_mib_per_tok - b.miss_mib_per_tok)))
    assert zero.s_per_tok == pytest.approx(prediction.at(0.0).s_per_tok)
    # without one there is no term
    assert prediction.buffered is None and prediction.fresh_s_per_mib == 0.0
    # the twin is an input: no cell of the curve, in the errors or in the analysis
    errors = cell_errors(table, {prediction.key: with_twin})
    assert errors and not {e.run_id for e in errors} & set(buffered["run_id"])
    from results.analysis.analyze import analyze

    runs = analyze(table).table.set_index("run_id")
    assert math.isnan(runs.loc[buffered["run_id"].iloc[0], "predicted_s_per_tok"])
    assert runs.loc[list(prediction.cache0_run_ids), "predicted_s_per_tok"].notna().all()


def test_a_twin_that_computed_slower_adds_nothing(prediction, campaign, twin):
    table = build_table([campaign, twin])
    probe = table[table["run_id"] == prediction.probe_run_id].iloc[0]
    trace = read_route_trace(f"{probe['run_dir']}/{names.ROUTE_CSV}")
    rates = predict(table)[prediction.key].buffered
    assert rates is not None
    slower = dataclasses.replace(rates, compute_s_per_tok=prediction.rates.compute_s_per_tok * 1.5)
    faster = dataclasses.replace(rates, compute_s_per_tok=prediction.rates.compute_s_per_tok / 2)
    alone = predict_from_runs(trace, prediction.rates, [0, 8, 16])
    assert predict_from_runs(trace, prediction.rates, [0, 8, 16], buffered=slower).budgets == alone.budgets
    quicker = predict_from_runs(trace, prediction.rates, [0, 8, 16], buffered=faster)
    assert quicker.fresh_s_per_mib > 0
    # a budget that misses less is predicted faster by that much more; cache 0 is its own runs' mean
    assert quicker.at(0.0).s_per_tok == alone.at(0.0).s_per_tok
    fewer = [(q, a) for q, a in zip(quicker.budgets, alone.budgets, strict=True)
             if a.miss_mib_per_tok < alone.at(0.0).miss_mib_per_tok]
    assert fewer and all(q.s_per_tok < a.s_per_tok for q, a in fewer)
