"""The tidy run table from campaign directories: one row per run, budgets as the engine reports
them, the token cycle from the best source there is, per-token distributions, pressure."""

from __future__ import annotations

import io
import json
import math
import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from results.read.frames import row_digests, row_views
from results.read.parse import read_metrics_csv
from results.read.run_keys import CELL_KEYS, cell_key, cell_keys
from results.read.table import KEY_COLUMNS, build_table, render_table
from store import versioned
from store.cells import CellConfig
from store.run_record import RunRecord
from tests.results.conftest import UPSTREAM


def run_records(out):
    return [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/*/run.json"))]


def test_the_table_command_writes_one_row_per_run_with_the_engine_numbers(local_campaign, cli, tmp_path):
    result = CliRunner().invoke(cli, ["table", str(local_campaign), "-o", str(tmp_path / "runs.csv")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "wrote 20 runs of 1 campaign to" in result.output
    table = pd.read_csv(tmp_path / "runs.csv")
    assert list(table.columns[:len(KEY_COLUMNS)]) == list(KEY_COLUMNS)
    records = {r["cell_id"]: r for r in run_records(local_campaign)}
    assert len(table) == len(records) == 20
    plan = json.loads((local_campaign / "plan.json").read_text())
    cycle = next(c["config"]["cycle_mb"] for c in plan["cells"])
    assert 3.0 < cycle < 3.5
    for row in table.to_dict("records"):
        rec = records[row["cell_id"]]
        m = read_metrics_csv(local_campaign / "runs" / row["cell_id"] / "1" / "metrics.csv")
        assert row["outcome"] == rec["outcome"] == "ok" and row["device"] == "local" and row["model"] == "small"
        assert row["engine"] == "bmoe-py 0.1.0" and row["repeat"] == rec["repeat"]
        # the budget is the engine's own (auto: what it sized; fixed: what it held)
        assert row["cache_mb"] == m.summary["cache_budget_MiB"]
        assert bool(row["cache_auto"]) == rec["config"]["cache_auto"]
        assert row["dense_weights"] == rec["config"]["dense_weights"] and row["n_expert_used"] == 2
        # the cycle from the CSV preamble (to the plan's three decimals), and the flag against it
        assert row["cycle_source"] == "csv" and row["cache_cycle_mb"] == cycle
        assert float(m.preamble["cache_cycle_mb"]) == round(cycle, 1)
        assert bool(row["under_cycle"]) == (0 < row["cache_mb"] < cycle)
        assert bool(row["under_cycle"]) == (rec["config"]["budget_spec"] == "cycle*0.5")
        # distribution: mean = tokens / Σ wall, extremes are single tokens, percentiles in between
        wall = m.rows["wall_ms"].to_numpy()
        assert row["tokens"] == len(wall) == 8
        assert math.isclose(row["tok_s"], len(wall) / (wall.sum() / 1000), rel_tol=1e-9)
        assert math.isclose(row["min_tok_s"], 1000 / wall.max()) and math.isclose(row["max_tok_s"], 1000 / wall.min())
        assert row["min_tok_s"] <= row["p5_tok_s"] <= row["median_tok_s"] <= row["p95_tok_s"] <= row["max_tok_s"]
        assert "probe" in row["flags"].split(",")              # 8 tokens: a probe, not a published number
        # pressure: the engine's own per-token RSS is part of the peak, MemAvailable floor under the start
        assert row["peak_rss_kb"] >= m.rows["rss_mib"].max() * 1024 - 1
        assert row["mem_avail_floor_kb"] <= min(rec["pressure"]["mem_avail_floor_kb"],
                                                m.rows["mem_available_mib"].min() * 1024)
        hit = m.summary["cache_hit_pct"]
        assert (math.isnan(row["cache_hit_pct"]) if hit == -1 else row["cache_hit_pct"] == hit)
        assert row["has_route_trace"] and json.loads(row["argv"]) == rec["argv"]   # the csv: JSON text
        assert json.loads(row["config"]) == rec["config"]
        assert row["budget_spec"] == rec["config"]["budget_spec"] and row["cache_mb_config"] == rec["config"]["cache_mb"]


def test_the_table_holds_config_and_argv_as_objects_and_writes_them_as_json_text(local_campaign, tmp_path):
    """In the frame `config` is the CellConfig and `argv` a tuple; csv and json write the JSON text
    run.json has (json.dumps of its config object and argv list, as the table always wrote)."""
    frame = build_table([local_campaign])
    records = {(r["cell_id"], r["attempt"]): r for r in run_records(local_campaign)}
    for row in frame.to_dict("records"):
        rec = records[row["cell_id"], row["attempt"]]
        assert isinstance(row["config"], CellConfig) and row["config"].to_dict() == rec["config"]
        assert isinstance(row["argv"], tuple) and list(row["argv"]) == rec["argv"]
    texts = pd.read_csv(io.StringIO(str(render_table(frame, "csv"))), dtype=str, keep_default_na=False)
    doc = json.loads(render_table(frame, "json"))
    for i, row in enumerate(frame.to_dict("records")):
        rec = records[row["cell_id"], row["attempt"]]
        for written in (texts.iloc[i], doc["runs"][i]):
            assert written["config"] == json.dumps(rec["config"]) and written["argv"] == json.dumps(rec["argv"])
    assert isinstance(frame["config"].iloc[0], CellConfig)        # the frame itself is not changed by writing


def test_a_run_json_written_through_the_record_is_byte_identical(local_campaign, tmp_path):
    """The suite's campaign's run.json read into a RunRecord and written back: the same bytes."""
    paths = sorted(local_campaign.glob("runs/*/*/run.json"))
    assert paths
    for path in paths:
        record = RunRecord.read(path)
        versioned.write_json(tmp_path / "run.json", record.to_dict())
        assert (tmp_path / "run.json").read_bytes() == path.read_bytes(), path


def test_parquet_needs_pyarrow_and_says_so(local_campaign, cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)      # as on a host without pyarrow: the import fails
    out = tmp_path / "runs.parquet"
    result = CliRunner().invoke(cli, ["table", str(local_campaign), "-o", str(out)])
    assert result.exit_code == 1
    assert "writing parquet needs pyarrow: pip install 'bmoe-fleet[parquet]'" in result.output
    assert "write .csv instead" in result.output
    assert not out.exists() and not list(tmp_path.iterdir())
    bad = CliRunner().invoke(cli, ["table", str(local_campaign), "-o", str(tmp_path / "runs.xlsx")])
    assert bad.exit_code == 1 and "write .csv, .json, .jsonl, .md, .parquet or .txt" in bad.output
    assert not list(tmp_path.iterdir())
    stdout = CliRunner().invoke(cli, ["table", str(local_campaign), "--format", "parquet"])
    assert stdout.exit_code == 1 and "give -o FILE.parquet" in stdout.output


def test_killed_runs_keep_their_budget_evidence_and_pressure(vphone_campaign):
    table = build_table([vphone_campaign])
    # over adb the kernel's OOM killer takes the engine (lmkd never considers it): `killed`, a bare SIGKILL
    killed = table[table["outcome"] == "killed"]
    assert len(killed) == 6 and killed["killed"].all() and "lmk_killed" not in set(table["outcome"])
    assert set(zip(killed["n_expert_used"], killed["cache_mb"])) == {(2, 256), (8, 256), (8, 408)}
    for row in killed.to_dict("records"):
        assert "with no lmkd or kernel kill line" in row["evidence"] and row["exit_status"] == 137
        assert row["collateral"] == "" and row["app_service"] in ("", "holds", "kill")
        assert row["cache_cycle_mb"] == (51.0 if row["n_expert_used"] == 2 else 204.0)
        assert not row["under_cycle"] and math.isnan(row["tok_s"])
    ok = table[table["outcome"] == "ok"]
    ram_kb = json.loads((vphone_campaign / "devices" / "virtual-tight.json").read_text())["ram_total_kb"]
    assert len(ok) == 6 and (ok["ram_total_kb"] == ram_kb).all() and ram_kb < 512 * 1024
    # every run on the phone saw its small RAM: the floor is real and under it; the peak RSS is recorded
    # (it counts shared library pages charged to other cgroups, so it may pass the phone's RAM)
    assert (ok["mem_avail_floor_kb"] < ram_kb).all() and (ok["peak_rss_kb"] > 50 * 1024).all()
    # the killed runs held more than the surviving ones at the same top-k
    for k in (2, 8):
        assert ok[ok["n_expert_used"] == k]["cache_mb"].max() < killed[killed["n_expert_used"] == k]["cache_mb"].min()


def test_imported_runs_take_the_cycle_from_the_best_source_there_is(imported, tmp_path):
    table = build_table([imported])
    assert len(table) == 57
    by_source = {r["source"]: r for r in table.to_dict("records")}
    # bmoe_metrics v1 (2026-07-17) predates cache_cycle_mb: the summary's token_demand_MiB
    gpt = by_source["2026-07-17/gpt_c2000_l4"]
    assert (gpt["cache_cycle_mb"], gpt["cycle_source"], gpt["n_expert_used"]) == (1815.4, "token_demand", 4)
    assert gpt["cache_mb"] == 2000 and not gpt["under_cycle"]
    # pre-preamble CSVs (2026-07-12): no top-k, no cycle; nothing is claimed
    qwen = by_source["2026-07-12/qwen_c2000_l2"]
    assert math.isnan(qwen["cache_cycle_mb"]) and qwen["cycle_source"] == "" and not qwen["under_cycle"]
    # bmoe-cli 0.19.0 (v2) has no cache_cycle_mb either; with the GGUF reachable it is priced from the header
    tiny = by_source["host-v2-0.19.0/tiny_progress"]
    assert (tiny["cache_cycle_mb"], tiny["cycle_source"]) == (1.5, "token_demand")
    priced = build_table([imported], {"tiny": str(UPSTREAM / "host-v2-0.19.0" / "tiny-qwen3moe.gguf")})
    tiny = priced[priced["source"] == "host-v2-0.19.0/tiny_progress"].iloc[0]
    assert (tiny["cache_cycle_mb"], tiny["cycle_source"]) == (1.5, "gguf")
    assert tiny["cache_mb"] == 2.0 and not tiny["under_cycle"] and tiny["cache_hit_pct"] == 14.9
    # the driver's ENTRY STATE and the phone's .state snapshot become entry columns
    gated = by_source["2026-07-17/gpt_c2000_l8"]
    assert gated["gate_waited_s"] == 180 and gated["entry_mem_available_kb"] == 6455532
    traced = by_source["2026-07-15-route-trace/gptoss"]
    assert traced["entry_freq_capped"] is True and "freq_capped" in traced["flags"]
    assert traced["entry_cpu_temp_mc"] == 99600 and traced["has_route_trace"]
    assert np.isnan(table[table["outcome"] == "config_error"]["tok_s"]).all()


def test_row_views_give_what_to_dict_records_gives(local_campaign, imported):
    """results.read.frames.row_views: the values and their types of `to_dict("records")`, key order
    kept, read-only, a missing key a KeyError."""
    table = build_table([local_campaign, imported])
    for frame in (table, table[table["outcome"] == "ok"], table.iloc[:0], table.iloc[:, :3]):
        want = frame.to_dict("records")
        got = row_views(frame)
        assert len(got) == len(want)
        for w, g in zip(want, got, strict=True):
            assert list(g) == list(w) and len(g) == len(w)
            for key, value in w.items():
                mine = g[key]
                assert type(mine) is type(value), key
                assert mine == value or (isinstance(value, float) and math.isnan(value) and math.isnan(mine)), key
    row = row_views(table)[0]
    assert row.get("no such column", "x") == "x" and "run_id" in row
    with pytest.raises(KeyError):
        row["no such column"]
    with pytest.raises(TypeError):
        row["run_id"] = "changed"  # type: ignore[index]


def test_cell_keys_are_each_rows_cell_key(local_campaign, imported):
    """results.read.run_keys.cell_keys (a key column at a time, a text per distinct value) gives
    cell_key of each row view: on real tables, their slices, and a column of values whose equal
    ones differ in type or sign (1, 1.0, True, 0.0, -0.0), NaN, None, pd.NA (a row gives it as None) and a tuple."""
    table = build_table([local_campaign, imported])
    odd = table.iloc[:9].copy()
    odd["threads"] = pd.Series([1, 1.0, True, 0.0, -0.0, math.nan, None, pd.NA, (0.0, -0.0)], index=odd.index,
                               dtype=object)
    odd["prompt"] = [math.nan] * len(odd)
    for frame in (table, table[table["outcome"] == "ok"], table.iloc[:0], table.drop(columns=["apps", "device"]),
                  odd):
        want = [cell_key(r) for r in row_views(frame)]
        assert cell_keys(frame) == want
    assert [k[CELL_KEYS.index("threads")] for k in cell_keys(odd)] == \
        ["1", "1", "True", "0", "0", "", "", "", "(0.0, -0.0)"]


def test_row_digests_are_equal_for_equal_rows_and_differ_when_a_value_name_or_dtype_does(local_campaign, imported):
    """results.read.frames.row_digests (a run page's digest of its row): one per row, the same for the
    same rows made again, different where a value, a column's name or its dtype differs."""
    table = build_table([local_campaign, imported])
    digests = row_digests(table)
    assert len(digests) == len(table) and len(set(digests)) == len(table)      # every run differs (run_id)
    assert row_digests(build_table([local_campaign, imported])) == digests
    assert row_digests(table.iloc[:0]) == [] and len(set(row_digests(table.iloc[:, :0]))) == 1
    for column, value in (("mean_tok_s", 1e-9), ("device", "another phone"), ("tokens", math.nan),
                          ("config", CellConfig.from_dict({"cache_mb": 7}))):
        changed = table.copy()
        changed.at[3, column] = value
        got = row_digests(changed)
        assert got[3] != digests[3] and got[:3] == digests[:3] and got[4:] == digests[4:], column
    assert row_digests(table.rename(columns={"device": "phone"}))[0] != digests[0]
    assert row_digests(table.astype({"attempt": float}))[0] != digests[0]


def test_frame_csv_is_pandas_to_csv_on_every_kind_of_column(local_campaign, imported):
    """results.read.frames.frame_csv: the bytes of `to_csv(index=False, lineterminator="\\n")`, on the
    written run table of real campaigns and on the edge values of each dtype the table holds."""
    from results.read.columns import written_frame
    from results.read.frames import frame_csv

    def pandas(frame: pd.DataFrame) -> str:
        return frame.to_csv(index=False, lineterminator="\n")

    table = written_frame(build_table([local_campaign, imported]))
    assert frame_csv(table) == pandas(table)
    floats = [0.1, 1e-05, 1e16, 1.2345678901234568e+17, -0.0, math.inf, -math.inf, math.nan, 5e-324, 2.0, 123456.789]
    n = len(floats)
    edges = pd.DataFrame({
        "float": floats,
        "int": np.array([0, -1, 2**62, -(2**62), 7, 8, 9, 10, 11, 12, 13], dtype=np.int64)[:n],
        "bool": [True, False] * (n // 2) + [True],
        "text": ["plain", "a,b", 'q"uote', "two\nlines", "é ü 中", "", None, math.nan, " lead", "trail ", "\r"][:n],
        "mixed": [None, math.nan, True, 1.5, np.float64(0.1), 3, "x,y", pd.NA, 1e16, -0.0, "[1, 2]"][:n],
        "nullable": pd.array([1, None, 3, -4, 5, None, 7, 8, 9, 10, 11], dtype="Int64")[:n],
        "string": pd.array(["a", None, "b,c", "d", "e", "f", "g", "h", "i", "j", "k"], dtype="string")[:n],
        "with, comma": ["x"] * n,
    })
    assert frame_csv(edges) == pandas(edges)
    for part in (edges.iloc[:0], edges.iloc[:, :1], table.iloc[:3]):
        assert frame_csv(part) == pandas(part)
