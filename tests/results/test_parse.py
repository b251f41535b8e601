"""Lenient parsers against every upstream bmoe-cli output in tests/fixtures/upstream.

Expected values were taken from the files' text with grep/sed, not with the parsers under test.
Variants the upstream data lacks (7/12-column and 23/25-column CSVs, CRLF, truncations, the cycle
warning, errors) are derived from the real files or written from the engine's printf formats.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.errors import BmoeError
from results.read.parse import (
    ConsoleRun,
    ParseError,
    config_from_command,
    config_from_log,
    config_from_name,
    discover,
    entry_exit,
    parse_console,
    read_console,
    read_console_runs,
    read_driver_log,
    read_metrics_csv,
    read_sidecar,
    read_state,
    run_stem,
    split_runs,
)

UPSTREAM = Path(__file__).parent.parent / "fixtures" / "upstream"
SIDECAR_KEYS = {"peak_rss_kb", "mem_avail_before_kb", "mem_avail_floor_kb", "mem_avail_after_kb",
                "batt_temp_before_dC", "batt_temp_max_dC", "batt_temp_after_dC", "cpu_temp_before_mC",
                "cpu_temp_max_mC"}

# (file, version, columns, rows, tok/s, cache_hit_pct, read_MiB) — from each file's header and trailer
CSVS = [
    ("2026-07-12/gemma_c2000_l2.csv", 0, 8, 256, 2.077, 58.0, 93586.7),
    ("2026-07-12/gemma_c2000_l4.csv", 0, 8, 256, 2.238, 58.0, 93586.7),
    ("2026-07-12/gemma_c2000_l4_ov.csv", 0, 8, 256, 2.776, 58.0, 93562.6),
    ("2026-07-12/gemma_mmap.csv", 0, 8, 256, 0.361, -1.0, 0.0),
    ("2026-07-12/gemma_stream.csv", 0, 8, 256, 1.610, -1.0, 231344.2),
    ("2026-07-12/gemma_stream_ov.csv", 0, 8, 256, 1.812, -1.0, 231344.2),
    ("2026-07-12/qwen_c2000_l2.csv", 0, 8, 256, 2.005, 53.0, 122977.5),
    ("2026-07-12/qwen_c2000_l4.csv", 0, 8, 256, 2.366, 53.0, 122977.5),
    ("2026-07-12/qwen_c4000_l2.csv", 0, 8, 256, 3.123, 76.5, 57509.4),
    ("2026-07-12/qwen_c4000_l4.csv", 0, 8, 256, 3.469, 76.5, 57509.4),
    ("2026-07-12/qwen_c4000_l4_ov.csv", 0, 8, 256, 3.983, 76.5, 57490.8),
    ("2026-07-12/qwen_mmap.csv", 0, 8, 256, 2.000, -1.0, 0.0),
    ("2026-07-12/qwen_stream.csv", 0, 8, 256, 1.709, -1.0, 268992.0),
    ("2026-07-12/qwen_stream_ov.csv", 0, 8, 256, 1.273, -1.0, 268992.0),
    ("2026-07-13/gemma_auto_ov.csv", 0, 9, 256, 1.880, 85.2, 28395.3),
    ("2026-07-13/gemma_autocap_ov.csv", 0, 9, 256, 3.048, 58.0, 93562.6),
    ("2026-07-13/gemma_base_ov.csv", 0, 9, 256, 3.179, 58.0, 93562.6),
    ("2026-07-13/gemma_sg_ov.csv", 0, 9, 256, 2.926, 58.0, 93695.5),
    ("2026-07-13/qwen_auto_ov.csv", 0, 9, 256, 4.367, 81.5, 43391.7),
    ("2026-07-13/qwen_autocap_ov.csv", 0, 9, 256, 5.234, 76.5, 57490.8),
    ("2026-07-13/qwen_base_ov.csv", 0, 9, 256, 5.016, 76.5, 57490.8),
    ("2026-07-13/qwen_sg_ov.csv", 0, 9, 256, 3.175, 77.9, 91563.7),
    ("2026-07-14/gptoss_mmap_k2.csv", 0, 9, 24, 0.089, -1.0, 0.0),
    ("2026-07-14/gptoss_mmap_k4.csv", 0, 9, 24, 0.075, -1.0, 0.0),
    ("2026-07-14/warmup/gemma_k6.csv", 0, 9, 256, 4.789, 82.8, 25142.2),
    ("2026-07-14/warmup/gemma_k8.csv", 0, 9, 256, 4.762, 82.9, 34014.8),
    ("2026-07-14/warmup/gptoss_k2.csv", 0, 9, 24, 0.163, 20.4, 12858.0),
    ("2026-07-14/warmup/gptoss_k4.csv", 0, 9, 24, 0.134, 13.4, 33666.1),
    ("2026-07-14/warmup/qwen_k6.csv", 0, 9, 256, 7.010, 80.0, 35213.8),
    ("2026-07-14/warmup/qwen_k8.csv", 0, 9, 256, 4.917, 77.1, 55721.4),
    ("2026-07-15-route-trace/gptoss.metrics", 0, 11, 64, 0.503, 32.4, 32075.9),
    ("2026-07-17/gemma_k6.csv", 1, 22, 256, 3.792, 82.8, 25127.0),
    ("2026-07-17/gemma_kdef.csv", 1, 22, 256, 2.734, 82.9, 33989.9),
    ("2026-07-17/gpt_c2000_l4.csv", 1, 22, 256, 0.998, 27.1, 330851.6),
    ("2026-07-17/gpt_c2000_l8.csv", 1, 22, 256, 1.300, 27.1, 330851.6),
    ("2026-07-17/gpt_c2000_l8_k2.csv", 1, 22, 256, 2.191, 32.0, 151128.4),
    ("2026-07-17/gpt_k2.csv", 1, 22, 256, 1.790, -1.0, 232581.1),
    ("2026-07-17/gpt_kdef.csv", 1, 22, 256, 0.711, -1.0, 465163.3),
    ("2026-07-17/qwen_k6.csv", 1, 22, 256, 4.168, 80.0, 35205.0),
    ("2026-07-17/qwen_kdef.csv", 1, 22, 256, 4.667, 77.1, 55709.3),
    ("host-v2-0.19.0/tiny_auto.csv", 2, 29, 32, 131.982, 88.7, 1.2),
    ("host-v2-0.19.0/tiny_c0_warm.csv", 2, 29, 32, 126.836, -1.0, 51.0),
    ("host-v2-0.19.0/tiny_mmap.csv", 2, 29, 32, 168.884, -1.0, 0.0),
    ("host-v2-0.19.0/tiny_progress.csv", 2, 29, 32, 115.443, 14.9, 42.6),
]

# (file, generation tok/s, moe-stream read MiB, cache mgmt s/token, hit %, auto budget MiB, load s)
CONSOLES = [
    ("2026-07-12/gemma_c2000_l2.log", 2.077, 93586.7, None, 58.0, None, 24.787),
    ("2026-07-12/gemma_c2000_l4.log", 2.238, 93586.7, None, 58.0, None, 17.859),
    ("2026-07-12/gemma_mmap.log", 0.361, None, None, None, None, 16.641),
    ("2026-07-12/gemma_stream.log", 1.610, 231344.2, None, None, None, 24.419),
    ("2026-07-12/gemma_stream_ov.log", 1.812, 231344.2, None, None, None, 19.077),
    ("2026-07-12/qwen_c2000_l2.log", 2.005, 122977.5, None, 53.0, None, 19.308),
    ("2026-07-12/qwen_c2000_l4.log", 2.366, 122977.5, None, 53.0, None, 18.554),
    ("2026-07-12/qwen_c4000_l2.log", 3.123, 57509.4, None, 76.5, None, 17.327),
    ("2026-07-12/qwen_c4000_l4.log", 3.469, 57509.4, None, 76.5, None, 18.009),
    ("2026-07-12/qwen_c4000_l4_ov.log", 3.983, 57490.8, None, 76.5, None, 16.062),
    ("2026-07-12/qwen_mmap.log", 2.000, None, None, None, None, 9.939),
    ("2026-07-12/qwen_stream.log", 1.709, 268992.0, None, None, None, 14.941),
    ("2026-07-12/qwen_stream_ov.log", 1.273, 268992.0, None, None, None, 15.797),
    ("2026-07-13/gemma_auto_ov.log", 1.880, 28395.3, 0.022, 85.2, 4610, 15.449),
    ("2026-07-13/gemma_autocap_ov.log", 3.048, 93562.6, 0.048, 58.0, 2000, 16.282),
    ("2026-07-13/gemma_base_ov.log", 3.179, 93562.6, 0.045, 58.0, None, 15.493),
    ("2026-07-13/gemma_sg_ov.log", 2.926, 93695.5, 0.052, 58.0, None, 16.686),
    ("2026-07-13/qwen_auto_ov.log", 4.367, 43391.7, 0.024, 81.5, 4675, 11.057),
    ("2026-07-13/qwen_autocap_ov.log", 5.234, 57490.8, 0.028, 76.5, 4000, 12.996),
    ("2026-07-13/qwen_base_ov.log", 5.016, 57490.8, 0.026, 76.5, None, 10.772),
    ("2026-07-13/qwen_sg_ov.log", 3.175, 91563.7, 0.112, 77.9, None, 13.820),
    ("2026-07-15-route-trace/gptoss.log", 0.503, 32075.9, 0.090, 32.4, 3000, 58.738),
    ("2026-07-17/gemma_k6.out", 3.792, 25127.0, 0.014, 82.8, None, 27.322),
    ("2026-07-17/gemma_kdef.out", 2.734, 33989.9, 0.020, 82.9, None, 22.692),
    ("2026-07-17/gpt_c2000_l4.out", 0.998, 330851.6, 0.166, 27.1, None, 60.341),
    ("2026-07-17/gpt_c2000_l8.out", 1.300, 330851.6, 0.183, 27.1, None, 66.752),
    ("2026-07-17/gpt_c2000_l8_k2.out", 2.191, 151128.4, 0.084, 32.0, None, 67.900),
    ("2026-07-17/gpt_k2.out", 1.790, 232581.1, 0.001, None, None, 64.237),
    ("2026-07-17/gpt_kdef.out", 0.711, 465163.3, 0.001, None, None, 59.924),
    ("2026-07-17/qwen_k6.out", 4.168, 35205.0, 0.020, 80.0, None, 25.538),
    ("2026-07-17/qwen_kdef.out", 4.667, 55709.3, 0.027, 77.1, None, 23.108),
    ("host-v2-0.19.0/tiny_auto.out", 131.982, 1.2, 0.000, 88.7, 6, 0.038),
    ("host-v2-0.19.0/tiny_c0_warm.out", 126.836, 51.0, 0.000, None, None, 0.011),
    ("host-v2-0.19.0/tiny_mmap.out", 168.884, None, None, None, None, 0.004),
    ("host-v2-0.19.0/tiny_progress.out", 115.443, 42.6, 0.000, 14.9, None, 0.020),
]
CAPTURES = sorted(str(p.relative_to(UPSTREAM)) for ext in ("*.log", "*.out", "*.err") for p in UPSTREAM.rglob(ext))
SIDECARS = sorted(str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.metrics")
                  if not p.read_bytes().startswith(b"step,"))
MATRIX_TAGS = [f"k{k}_io{io}_pf{pf}" for k in (2, 3, 4) for io in (4, 8) for pf in (0, 4)] + ["mmap_k4", "mmap_k2"]


def copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / Path(name).name
    shutil.copyfile(UPSTREAM / name, target)
    return target


def write_bytes(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_one_line_error(exc: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(exc.value)
    assert isinstance(exc.value, BmoeError)
    assert "\n" not in message and message
    for fragment in fragments:
        assert fragment in message


# ── the upstream files, every one ──────────────────────────────────────────────────────────────


def test_the_tables_cover_every_upstream_file():
    csvs = {str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.csv") if not p.name.endswith(".route.csv")}
    assert csvs | {"2026-07-15-route-trace/gptoss.metrics"} == {row[0] for row in CSVS}
    consoles = {row[0] for row in CONSOLES}
    others = {"host-v2-0.19.0/bad.err", "host-v2-0.19.0/bad.out", "host-v2-0.19.0/tiny_auto.err",
              "host-v2-0.19.0/tiny_c0_warm.err", "host-v2-0.19.0/tiny_mmap.err", "host-v2-0.19.0/tiny_progress.err",
              "2026-07-14/gptoss-matrix.out", "2026-07-17/driver-k2.log", "2026-07-17/driver-lanes.log"}
    assert set(CAPTURES) == consoles | others
    assert len(SIDECARS) == 14 + 8 + 9


@pytest.mark.parametrize("name,version,n_columns,n_rows,tok_s,hit_pct,read_mib", CSVS, ids=[r[0] for r in CSVS])
def test_every_metrics_csv(name, version, n_columns, n_rows, tok_s, hit_pct, read_mib):
    metrics = read_metrics_csv(UPSTREAM / name)
    assert (metrics.version, len(metrics.columns), len(metrics.rows)) == (version, n_columns, n_rows)
    assert metrics.complete and not metrics.empty and not metrics.cut_line
    assert metrics.summary["tok/s"] == tok_s
    assert metrics.summary["cache_hit_pct"] == hit_pct
    assert metrics.summary["read_MiB"] == read_mib
    assert isinstance(metrics.summary["tokens"], int) and metrics.summary["tokens"] == n_rows
    assert list(metrics.rows["step"]) == list(range(1, n_rows + 1))
    # read_bytes per row add up to the trailer's read_MiB (to its 0.1 MiB rounding)
    assert metrics.rows["read_bytes"].sum() / 2**20 == pytest.approx(read_mib, abs=0.06)
    assert (metrics.preamble == {}) == (version == 0)


def test_preamble_values_and_unknown_keys():
    v1 = read_metrics_csv(UPSTREAM / "2026-07-17/gpt_c2000_l8_k2.csv")
    assert v1.preamble["model"] == "gpt-oss-120b-Q4_K_M.gguf"
    assert (v1.preamble["cache_mb"], v1.preamble["io_threads"], v1.preamble["n_expert_used"]) == ("2000", "8", "2")
    assert v1.preamble["dense_weights"] == "anon"
    v2 = read_metrics_csv(UPSTREAM / "host-v2-0.19.0/tiny_auto.csv")
    assert v2.preamble["engine"] == "0.19.0"
    assert (v2.preamble["cache_auto"], v2.preamble["cache_ceil_mb"], v2.preamble["spec"]) == ("1", "3000", "off")
    assert v2.summary["evictions"] == 0 and v2.summary["ra_gemv_ms/tok"] == 0.0
    assert read_metrics_csv(UPSTREAM / "host-v2-0.19.0/tiny_progress.csv").summary["rereads"] == 208


def test_preamble_is_order_free_and_keeps_unknown_keys(tmp_path):
    lines = (UPSTREAM / "host-v2-0.19.0/tiny_auto.csv").read_text().splitlines()
    shuffled = [lines[0], lines[4], "# cache_cycle_mb=1 future_key=x", lines[2], lines[3], lines[1]] + lines[5:]
    metrics = read_metrics_csv(write_bytes(tmp_path, "a.csv", ("\n".join(shuffled) + "\n").encode()))
    original = read_metrics_csv(UPSTREAM / "host-v2-0.19.0/tiny_auto.csv")
    assert dict(metrics.preamble) == {**original.preamble, "cache_cycle_mb": "1", "future_key": "x"}
    assert metrics.version == 2 and metrics.complete


def test_columns_are_read_by_name(tmp_path):
    original = read_metrics_csv(UPSTREAM / "2026-07-17/gpt_k2.csv")
    frame = original.rows[list(reversed(original.columns))]
    lines = (UPSTREAM / "2026-07-17/gpt_k2.csv").read_text().splitlines()
    body = frame.to_csv(index=False, header=True, float_format="%.3f", lineterminator="\n").splitlines()
    reordered = lines[:3] + body + [lines[-1]]
    metrics = read_metrics_csv(write_bytes(tmp_path, "r.csv", ("\n".join(reordered) + "\n").encode()))
    assert metrics.columns == tuple(reversed(original.columns))
    for column in ("step", "wall_ms", "read_bytes", "cache_hit_pct", "swap_free_mib"):
        np.testing.assert_allclose(metrics.rows[column], original.rows[column])


@pytest.mark.parametrize("source,keep,version", [
    ("2026-07-12/qwen_c2000_l4.csv", 7, 0),  # before stall_ms existed
    ("host-v2-0.19.0/tiny_auto.csv", 23, 2),  # v2 as first published, up to loop_overhead_ms
    ("host-v2-0.19.0/tiny_auto.csv", 25, 2),  # … then mtp_batch, mtp_draft_ms
])
def test_column_counts_the_upstream_data_lacks(tmp_path, source, keep, version):
    lines = (UPSTREAM / source).read_text().splitlines()
    cut = [",".join(line.split(",")[:keep]) if not line.startswith("#") else line for line in lines]
    metrics = read_metrics_csv(write_bytes(tmp_path, "c.csv", ("\n".join(cut) + "\n").encode()))
    original = read_metrics_csv(UPSTREAM / source)
    assert (metrics.version, len(metrics.columns)) == (version, keep) and metrics.complete
    assert metrics.columns == original.columns[:keep]
    pd.testing.assert_frame_equal(metrics.rows, original.rows[list(original.columns[:keep])])


def test_twelve_column_resident_frac_variant(tmp_path):
    # upstream's csv_metrics_sink.cpp of mid-July appended `resident_frac` (-1 = unmeasured)
    lines = (UPSTREAM / "2026-07-15-route-trace/gptoss.metrics").read_text().splitlines()
    extended = [line + ",resident_frac" if line.startswith("step,") else
                line if line.startswith("#") else line + (",-1.000" if line.startswith("1,") else ",0.875")
                for line in lines]
    metrics = read_metrics_csv(write_bytes(tmp_path, "g.metrics", ("\n".join(extended) + "\n").encode()))
    assert len(metrics.columns) == 12 and metrics.version == 0
    assert math.isnan(metrics.measured("resident_frac")[0]) and metrics.measured("resident_frac")[1] == 0.875


def test_minus_one_means_not_measured():
    metrics = read_metrics_csv(UPSTREAM / "2026-07-17/gpt_k2.csv")
    assert (metrics.rows["cache_hit_pct"] == -1).all()  # the file's values are kept as written
    assert metrics.measured("cache_hit_pct").isna().all()
    frac = metrics.measured("dense_resident_frac")
    assert frac.isna().sum() == (metrics.rows["dense_resident_frac"] == -1).sum() == 2
    assert frac.iloc[2] == 0.992
    assert (metrics.measured("wall_ms") == metrics.rows["wall_ms"]).all()  # no sentinel there


def test_bom_and_windows_line_endings(tmp_path):
    raw = (UPSTREAM / "2026-07-17/gpt_c2000_l8_k2.csv").read_bytes()
    windows = write_bytes(tmp_path, "w.csv", b"\xef\xbb\xbf" + raw.replace(b"\n", b"\r\n"))
    metrics, original = read_metrics_csv(windows), read_metrics_csv(UPSTREAM / "2026-07-17/gpt_c2000_l8_k2.csv")
    assert metrics.version == 1 and metrics.complete and dict(metrics.summary) == dict(original.summary)
    assert dict(metrics.preamble) == dict(original.preamble)
    pd.testing.assert_frame_equal(metrics.rows, original.rows)


# ── runs killed mid-write ──────────────────────────────────────────────────────────────────────


def test_cut_mid_row_keeps_the_whole_rows(tmp_path):
    raw = (UPSTREAM / "2026-07-17/gpt_k2.csv").read_bytes()
    row_100 = raw.index(b"\n100,256,") + 1
    metrics = read_metrics_csv(write_bytes(tmp_path, "cut.csv", raw[: row_100 + 30]))
    assert not metrics.complete and metrics.cut_line and metrics.summary is None
    assert len(metrics.rows) == 99 and metrics.rows["step"].iloc[-1] == 99
    assert metrics.version == 1 and metrics.preamble["cache_mb"] == "0"


def test_cut_before_the_summary(tmp_path):
    raw = (UPSTREAM / "2026-07-13/qwen_auto_ov.csv").read_bytes()
    metrics = read_metrics_csv(write_bytes(tmp_path, "nosum.csv", raw[: raw.index(b"# summary")]))
    assert not metrics.complete and not metrics.cut_line and metrics.summary is None
    assert len(metrics.rows) == 256 and len(metrics.columns) == 9


def test_cut_inside_the_summary_is_incomplete(tmp_path):
    raw = (UPSTREAM / "2026-07-13/qwen_auto_ov.csv").read_bytes()
    metrics = read_metrics_csv(write_bytes(tmp_path, "halfsum.csv", raw[: raw.index(b" tok/s=")]))
    assert not metrics.complete and metrics.cut_line and metrics.summary is None and len(metrics.rows) == 256


@pytest.mark.parametrize("marker,version", [(b"\n# moe_stream", 1), (b"ps,wall_ms", 1)])
def test_cut_in_preamble_or_header_has_no_rows(tmp_path, marker, version):
    raw = (UPSTREAM / "2026-07-17/qwen_kdef.csv").read_bytes()
    metrics = read_metrics_csv(write_bytes(tmp_path, "load.csv", raw[: raw.index(marker) + 5]))
    assert metrics.version == version and not metrics.complete and not metrics.empty
    assert len(metrics.rows) == 0 and metrics.preamble["n_expert_used"] == "8"


def test_zero_byte_csv_is_empty_not_an_error(tmp_path):
    metrics = read_metrics_csv(write_bytes(tmp_path, "killed.csv", b""))
    assert metrics.empty and not metrics.complete and metrics.version is None
    assert len(metrics.rows) == 0 and metrics.summary is None and metrics.columns == ()


def test_two_generations_keep_both_summaries(tmp_path):
    lines = (UPSTREAM / "host-v2-0.19.0/tiny_auto.csv").read_text().splitlines()
    second = [line.replace("tok/s=131.982", "tok/s=99.000") for line in lines[6:]]
    metrics = read_metrics_csv(write_bytes(tmp_path, "turns.csv", ("\n".join(lines + second) + "\n").encode()))
    assert [s["tok/s"] for s in metrics.summaries] == [131.982, 99.0]
    assert metrics.summary["tok/s"] == 99.0 and len(metrics.rows) == 64 and metrics.complete


# ── what is not a metrics CSV ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name,fragment", [
    ("2026-07-12/qwen_mmap.metrics", "line 1 is 'peak_rss_kb=6152604'"),
    ("2026-07-15-route-trace/gptoss.route.csv", "is a route trace"),
    ("2026-07-17/driver-k2.log", "not a bmoe metrics CSV"),
    ("host-v2-0.19.0/tiny-qwen3moe.gguf", "not a bmoe metrics CSV"),
])
def test_not_a_metrics_csv(name, fragment):
    with pytest.raises(ParseError) as exc:
        read_metrics_csv(UPSTREAM / name)
    assert_one_line_error(exc, str(UPSTREAM / name), fragment)


def test_header_without_the_required_columns(tmp_path):
    path = write_bytes(tmp_path, "x.csv", b"step,turn,phase,layer\n1,0,1,2\n")
    with pytest.raises(ParseError) as exc:
        read_metrics_csv(path)
    assert_one_line_error(exc, "header lacks steps, wall_ms")


def test_a_short_row_inside_the_file_is_an_error(tmp_path):
    lines = (UPSTREAM / "2026-07-12/qwen_mmap.csv").read_text().splitlines()
    lines[10] = "10,256,1.0"
    with pytest.raises(ParseError) as exc:
        read_metrics_csv(write_bytes(tmp_path, "bad.csv", ("\n".join(lines) + "\n").encode()))
    assert_one_line_error(exc, "bad.csv:11:", "3 fields, the header has 8")


def test_a_non_number_in_a_row_is_an_error(tmp_path):
    lines = (UPSTREAM / "2026-07-12/qwen_mmap.csv").read_text().splitlines()
    lines[5] = lines[5].replace("0.000", "fast", 1)
    with pytest.raises(ParseError) as exc:
        read_metrics_csv(write_bytes(tmp_path, "nan.csv", ("\n".join(lines) + "\n").encode()))
    assert_one_line_error(exc, "non-number")


def test_missing_file_is_a_parse_error(tmp_path):
    with pytest.raises(ParseError) as exc:
        read_metrics_csv(tmp_path / "absent.csv")
    assert_one_line_error(exc, "cannot read")


# ── pressure sidecars and device state ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", SIDECARS)
def test_every_sidecar(name):
    values = read_sidecar(UPSTREAM / name)
    assert set(values) == SIDECAR_KEYS
    assert all(isinstance(v, int) for v in values.values())
    text = (UPSTREAM / name).read_text()
    assert f"peak_rss_kb={values['peak_rss_kb']}\n" in text
    assert f"cpu_temp_max_mC={values['cpu_temp_max_mC']}\n" in text
    assert values["mem_avail_floor_kb"] <= values["mem_avail_before_kb"]


def test_sidecar_values():
    assert read_sidecar(UPSTREAM / "2026-07-17/gpt_c2000_l8_k2.metrics") == {
        "peak_rss_kb": 7008188, "mem_avail_before_kb": 6836980, "mem_avail_floor_kb": 2786240,
        "mem_avail_after_kb": 6857464, "batt_temp_before_dC": 420, "batt_temp_max_dC": 423,
        "batt_temp_after_dC": 423, "cpu_temp_before_mC": 46700, "cpu_temp_max_mC": 63700}


def test_sidecar_empty_probe_and_later_keys(tmp_path):
    windows = b"\xef\xbb\xbfpeak_rss_kb=12\r\nbatt_temp_before_dC=\r\ncharge_before_uah=4100000\r\n"
    path = write_bytes(tmp_path, "s.metrics", windows)
    assert read_sidecar(path) == {"peak_rss_kb": 12, "batt_temp_before_dC": None, "charge_before_uah": 4100000}


@pytest.mark.parametrize("name,fragment", [
    ("2026-07-15-route-trace/gptoss.metrics", "is a per-token metrics CSV"),
    ("2026-07-12/qwen_mmap.log", "not a key=value pressure line"),
    ("2026-07-15-route-trace/gptoss.state", "not a key=value pressure line"),
])
def test_not_a_sidecar(name, fragment):
    with pytest.raises(ParseError) as exc:
        read_sidecar(UPSTREAM / name)
    assert_one_line_error(exc, fragment)


def test_state_file_entry_and_exit():
    state = read_state(UPSTREAM / "2026-07-15-route-trace/gptoss.state")
    entry, exit_ = state["entry"], state["exit"]
    assert entry["date"] == "Wed Jul 15 09:09:48 CEST 2026" and exit_["date"] == "Wed Jul 15 09:13:33 CEST 2026"
    assert entry["cpufreq_khz"]["policy0"] == {"scaling_max": 1900800, "hw_max": 3321600, "cur": 806400}
    assert exit_["cpufreq_khz"]["policy0"]["scaling_max"] == 1747200
    assert (entry["mem_free_kb"], entry["mem_available_kb"], entry["cached_kb"]) == (3664856, 6875628, 3360792)
    assert exit_["mem_available_kb"] == 7184292
    assert entry["batt_temp_dC"] is None and entry["thermal_status"] == 2
    assert entry["temperatures_c"] == {"CPU0": 99.6, "CPU1": 97.3, "CPU2": 99.6, "CPU3": 99.6}


def test_not_a_state_file():
    with pytest.raises(ParseError) as exc:
        read_state(UPSTREAM / "2026-07-12/qwen_mmap.metrics")
    assert_one_line_error(exc, "not a device state file")


@pytest.mark.parametrize("folder,n_logs", [("2026-07-12", 13), ("2026-07-13", 8)])
def test_log_pressure_lines_equal_the_sidecar(folder, n_logs):
    # bench-run.sh cats the sidecar after the perf lines, so each log repeats its .metrics file
    logs = sorted((UPSTREAM / folder).glob("*.log"))
    assert len(logs) == n_logs
    for log in logs:
        assert dict(read_console(log).pressure) == read_sidecar(log.with_suffix(".metrics")), log.name


def test_driver_logs_entry_and_exit_state():
    lanes = read_driver_log(UPSTREAM / "2026-07-17/driver-lanes.log")
    assert list(lanes) == ["gpt_c2000_l4", "gpt_c2000_l8"]
    assert lanes["gpt_c2000_l4"]["entry"] == {"batt_temp_dC": 380, "mem_available_kb": 7117868,
                                              "scaling_max_freq_khz": 1900800, "waited_s": 0, "cpu_temp_mC": 52900}
    assert lanes["gpt_c2000_l8"]["entry"]["waited_s"] == 180
    assert lanes["gpt_c2000_l8"]["exit"] == {"mem_available_kb": 6674844, "batt_temp_dC": 417}
    k2 = read_driver_log(UPSTREAM / "2026-07-17/driver-k2.log")
    assert k2["gpt_c2000_l8_k2"]["entry"]["scaling_max_freq_khz"] == 1555200
    assert "waited_s" not in k2["gpt_c2000_l8_k2"]["entry"]  # this driver's gate line has no waited=
    # the sidecar lines in the driver log are the run's .metrics file
    section = read_console_runs(UPSTREAM / "2026-07-17/driver-k2.log")[0]
    assert dict(section.pressure) == read_sidecar(UPSTREAM / "2026-07-17/gpt_c2000_l8_k2.metrics")


def test_entry_exit_of_a_plain_bench_log():
    states = entry_exit(read_console(UPSTREAM / "2026-07-13/qwen_auto_ov.log"))
    assert states == {"entry": {"mem_available_kb": 6355396, "batt_temp_dC": 389, "cpu_temp_mC": 45100},
                      "exit": {"mem_available_kb": 6815688, "batt_temp_dC": 391}}


def test_not_a_driver_log():
    with pytest.raises(ParseError) as exc:
        read_driver_log(UPSTREAM / "2026-07-17/gpt_k2.out")
    assert_one_line_error(exc, "not a driver log")


# ── console captures ───────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name,tok_s,read_mib,mgmt,hit,budget,load_s", CONSOLES, ids=[r[0] for r in CONSOLES])
def test_every_console_capture(name, tok_s, read_mib, mgmt, hit, budget, load_s):
    run = read_console(UPSTREAM / name)
    assert run.finished and run.generation.tok_per_s == tok_s
    assert run.prefill.load_s == load_s
    assert (run.moe_stream and run.moe_stream.read_mib) == read_mib
    assert (run.moe_stream and run.moe_stream.cache_mgmt_s_per_token) == mgmt
    assert (run.moe_cache and run.moe_cache.hit_pct) == hit
    assert (run.moe_cache and run.moe_cache.budget_mib) == budget
    assert run.unparsed == () and run.config_error is None and run.runtime_error is None


def _render(run: ConsoleRun) -> list[str]:
    """The end-of-run and load lines as bmoe-cli's printf formats would print the parsed values."""
    out = []
    if g := run.generation:
        out.append(f"generation: {g.tokens} tokens, {g.s_per_token:.3f} s/token ({g.tok_per_s:.3f} tok/s)")
    if c := run.compute:
        out.append(f"compute: {c.cpu_occupancy_pct:.1f}% CPU occupancy ({c.cpu_s_per_token:.4f} cpu-s/token over "
                   f"{c.threads} threads), {c.majflt_per_token:.2f} major faults/token")
    if p := run.prefill:
        out.append(f"prefill: {p.tokens} tokens, {p.prefill_s:.3f} s ({p.tok_per_s:.1f} tok/s) | model load "
                   f"{p.load_s:.3f} s | TTFT {p.ttft_s:.3f} s")
    if s := run.moe_stream:
        mgmt = "" if s.cache_mgmt_s_per_token is None else f" + cache mgmt {s.cache_mgmt_s_per_token:.3f}"
        out.append(f"moe-stream: read {s.read_mib:.1f} MiB ({s.read_mib_per_token:.2f} MiB/token), decode "
                   f"{s.decode_s_per_token:.3f} s/token (compute {s.compute_s_per_token:.3f}{mgmt} + flash I/O "
                   f"{s.flash_io_s_per_token:.3f} s/token, {s.flash_mib_per_s:.0f} MiB/s)")
    if m := run.moe_cache:
        budget = ""
        if m.budget_mib is not None:
            resized = "" if m.resized_count is None else f", resized {m.resized_count}×"
            budget = f", budget {m.budget_mib:.0f} MiB (auto{resized})"
        out.append(f"moe-cache: {m.hit_pct:.1f}% hit, resident {m.resident_mib:.1f} MiB{budget}")
    if c := run.cache_churn:
        out.append(f"moe-cache: {c.evictions} evictions, {c.rereads} re-reads ({c.rereads_per_token:.1f}/token) "
                   f"— {c.note}")
    if run.overlap_stall_s_per_token is not None:
        out.append(f"moe-overlap: stall {run.overlap_stall_s_per_token:.3f} s/token "
                   "(flash reads overlapped with FFN compute)")
    if p := run.prefetch:
        out.append(f"moe-prefetch: {p.speculative_mib:.1f} MiB speculative, {p.useful_experts}/{p.experts} "
                   f"experts useful ({p.useful_pct:.0f}%)")
    if g := run.spec_gate:
        off = "" if g.auto_disabled_below_pct is None else f" (auto-disabled below {g.auto_disabled_below_pct:.0f}%)"
        out.append(f"moe-spec-gate: {g.recall_pct:.0f}% router prediction recall{off}")
    if a := run.cache_auto:
        out.append(f"bmoe: cache auto — {a.available_mib:.0f} MiB available, leaving {a.free_mib:.0f} MiB free → "
                   f"{a.budget_mib:.0f} MiB budget (cap {a.cap_mib:.0f} MiB)")
    if run.cache_reserve_mib is not None:
        out.append(f"bmoe: cache auto — reserving {run.cache_reserve_mib:.0f} MiB for the dense-weight conversion")
    if w := run.dense_warmup:
        out.append(f"bmoe: dense warm-up — {w.mib:.0f} MiB in {w.seconds:.1f} s")
    if d := run.dense_anon:
        out.append(f"bmoe: dense-weights={d.mode} — {d.mib:.0f} MiB in {d.buffers} anon buffers")
        out.append(f"bmoe: dense-weights={d.mode} — dropped {d.dropped_mib:.0f} MiB of now-unused mmap pages")
    if s := run.streaming:
        shards = "" if s.shards is None else f" shards={s.shards}"
        out.append(f"bmoe: expert streaming ON  n_expert={s.n_expert} o_direct={int(s.o_direct)} "
                   f"io_threads={s.io_threads} cache={s.cache_mib} MiB{shards}")
    if run.config_error is not None:
        out.append(f"config error: {run.config_error}")
    return out


ENGINE_LINE = re.compile(r"^(generation|compute|prefill|moe-[a-z-]+|config error):|bmoe: ")


@pytest.mark.parametrize("name", CAPTURES)
def test_every_engine_line_reads_back_to_its_text(name):
    """Re-printing the parsed values with the engine's formats gives back every engine line of the
    capture: each value equals the text, and no engine line was skipped."""
    text = (UPSTREAM / name).read_bytes().decode("utf-8", "replace")
    text_lines = [line.lstrip("\ufeff") for line in text.split("\n")]
    engine_lines = sorted(line for line in text_lines if ENGINE_LINE.search(line))
    rendered = sorted(line for run in read_console_runs(UPSTREAM / name) for line in _render(run))
    assert rendered == engine_lines


def test_matrix_splits_into_its_fourteen_runs():
    runs = read_console_runs(UPSTREAM / "2026-07-14/gptoss-matrix.out")
    assert [run.tag for run in runs] == MATRIX_TAGS
    assert all(run.finished for run in runs)
    assert dict(runs[1].declared_config) == {"top_k": 2, "moe_stream": True, "io_threads": 4, "prefetch": 4}
    assert dict(runs[12].declared_config) == {"moe_stream": False, "top_k": 4}
    # prefetch lines only where the tag says pf4; no stream/cache lines for the mmap baselines
    assert [run.prefetch is not None for run in runs[:12]] == [False, True] * 6
    assert all(run.moe_stream is None and run.moe_cache is None for run in runs[12:])
    assert [run.generation.tok_per_s for run in runs[:4]] == [0.687, 0.532, 0.620, 0.516]
    assert runs[4].generation.tokens == 22 and runs[11].prefetch.experts == 493
    assert all(run.moe_cache.resized_count == 0 and run.moe_cache.budget_mib == 3000.0 for run in runs[:12])


def test_matrix_mmap_sections_match_their_csvs():
    runs = {run.tag: run for run in read_console_runs(UPSTREAM / "2026-07-14/gptoss-matrix.out")}
    for k in (2, 4):
        summary = read_metrics_csv(UPSTREAM / f"2026-07-14/gptoss_mmap_k{k}.csv").summary
        run = runs[f"mmap_k{k}"]
        assert (run.generation.tok_per_s, run.generation.s_per_token) == (summary["tok/s"], summary["s/tok"])
        assert (run.prefill.load_s, run.prefill.prefill_s) == (summary["load_s"], summary["prefill_s"])


def test_console_agrees_with_the_csv_of_the_same_run():
    """Across every folder, the stdout block and the CSV trailer of one run carry the same numbers."""
    checked = 0
    for group in discover(UPSTREAM):
        consoles = [p for p in (group.log, group.out) if p is not None]
        if group.csv is None or not consoles:
            continue
        run, summary = read_console(*consoles), read_metrics_csv(group.csv).summary
        assert run.generation.tok_per_s == summary["tok/s"], group.stem
        assert run.prefill.tokens == summary["n_prompt"] and run.prefill.load_s == summary["load_s"]
        if run.moe_stream is not None:
            assert run.moe_stream.read_mib == summary["read_MiB"]
            assert run.moe_stream.compute_s_per_token == summary["compute_s/tok"]
        if run.moe_cache is not None:
            assert run.moe_cache.hit_pct == summary["cache_hit_pct"]
            assert "cache_resident_MiB" not in summary or run.moe_cache.resident_mib == summary["cache_resident_MiB"]
        if run.compute is not None:
            assert run.compute.cpu_s_per_token == summary["cpu_s/tok"]
        checked += 1
    assert checked == 13 + 8 + 1 + 9 + 4


def test_progress_lines_with_raw_bytes():
    run = read_console(UPSTREAM / "host-v2-0.19.0/tiny_progress.out", UPSTREAM / "host-v2-0.19.0/tiny_progress.err")
    assert len(run.load_events) == 32 and [p["step"] for p in run.progress] == list(range(1, 33))
    assert run.load_events[0] == {"mb": 1.2, "ms": 1.8}
    assert run.progress[1]["wall_ms"] == 10.0 and run.progress[1]["delta_text"] == "\ufffd"  # raw 0xad
    assert run.progress[30]["dense_resident_frac"] == 1.0
    assert run.answer is not None and run.answer.startswith("-\ufffd")
    assert run.cache_churn.evictions == 230 and run.cache_churn.rereads_per_token == 6.5
    assert run.moe_cache.budget_mib is None and not run.moe_cache.auto  # forced cache: no budget printed
    assert run.streaming.cache_mib == 2 and run.streaming.shards == 1
    assert run.dense_anon.buffers == 39 and run.dense_anon.dropped_mib == 0.0


def test_a_cut_progress_line_keeps_its_numbers(tmp_path):
    raw = (UPSTREAM / "host-v2-0.19.0/tiny_progress.out").read_bytes()
    cut = raw[: raw.index(b'"read_mb":1.39', raw.index(b'"step":5,'))]
    run = read_console(write_bytes(tmp_path, "cut.out", cut))
    assert not run.finished and len(run.progress) == 5
    assert run.progress[-1]["_cut"] is True and run.progress[-1]["step"] == 5 and run.progress[-1]["stall_ms"] == 0.0


def test_invalid_utf8_text_and_merged_streams():
    out = read_console(UPSTREAM / "host-v2-0.19.0/tiny_auto.out", UPSTREAM / "host-v2-0.19.0/tiny_auto.err")
    assert "\ufffd" in out.lines[0] and out.generation.tokens == 32
    assert out.moe_cache.auto and out.moe_cache.resized_count is None  # 0.19.0 dropped `resized N×`
    assert out.cache_auto.available_mib == 23807 and out.cache_auto.budget_mib == 6 and out.cache_reserve_mib == 1
    merged = read_console(UPSTREAM / "2026-07-15-route-trace/gptoss.log")
    assert merged.streaming.shards is None and merged.streaming.io_threads == 4  # pre-0.19.0 shape
    assert merged.dense_warmup.mib == 1768 and merged.dense_warmup.seconds == 0.9
    assert merged.compute.majflt_per_token == 6038.16


def test_windows_capture_reads_like_the_original(tmp_path):
    raw = (UPSTREAM / "2026-07-17/gpt_c2000_l4.out").read_bytes()
    windows = read_console(write_bytes(tmp_path, "w.out", b"\xef\xbb\xbf" + raw.replace(b"\n", b"\r\n")))
    original = read_console(UPSTREAM / "2026-07-17/gpt_c2000_l4.out")
    assert windows.lines == original.lines and windows.moe_stream == original.moe_stream
    assert _render(windows) == _render(original)


def test_refused_config():
    run = read_console(UPSTREAM / "host-v2-0.19.0/bad.out", UPSTREAM / "host-v2-0.19.0/bad.err")
    assert not run.finished and run.generation is None
    assert run.config_error.startswith("moe.cache_mb=1000 is in the pathological band (< 1500 MiB)")
    assert run.arg_error is None and run.runtime_error is None


def test_error_and_warning_lines():
    run = parse_console([
        "bmoe: WARNING expert cache 1500 MiB is below this model's worst-case token cycle of 1815 MiB "
        "at top-k 4 — no entry can survive to the next token, so expect a hit rate near zero.",
        "unknown arg: --cache-mib",
        "warning: could not open csv /x/y.csv",
        "error: n_expert_used=9 exceeds n_expert=8",
    ])
    assert (run.cycle_warning.budget_mib, run.cycle_warning.cycle_mib, run.cycle_warning.top_k) == (1500, 1815, 4)
    assert run.arg_error == "unknown arg: --cache-mib" and run.warnings == ("could not open csv /x/y.csv",)
    assert run.runtime_error == "n_expert_used=9 exceeds n_expert=8" and not run.finished
    assert config_from_log(run) == {"cache_cycle_mib": 1815, "top_k": 4}


def test_wrapped_cycle_warning_and_bad_dense_weights():
    run = parse_console([
        "bmoe: WARNING expert cache 1500 MiB is below this model's worst-case token cycle of 907 MiB",
        "at top-k 2 — no entry can survive to the next token, so expect a hit rate near zero.",
        "bmoe: --dense-weights expects mmap|warm|anon|ahwb, got 'fast'",
    ])
    assert run.cycle_warning.top_k == 2 and run.cycle_warning.cycle_mib == 907
    assert run.config_error == "--dense-weights expects mmap|warm|anon|ahwb, got 'fast'"


def test_lenient_shapes_and_unknown_lines():
    run = parse_console([
        "the answer ends here without a newlinebmoe: dense warm-up — 12 MiB in 0.5 s",
        "bmoe: expert streaming ON  n_expert=8 o_direct=0 io_threads=2 cache=0 MiB shards=3 lanes=odd",
        "moe-cache: 50.0% hit, resident 10.0 MiB, budget 12 MiB (auto, resized 2x)",
        "moe-waits: drain 0.004 s/token (inside compute), adopt 0.001 s/token (inside mgmt)",
        "moe-stream: read lots",
        "bmoe: something new",
    ])
    assert run.dense_warmup.mib == 12 and not run.streaming.o_direct and run.streaming.shards == 3
    assert dict(run.streaming.extra) == {"lanes": "odd"}
    assert run.moe_cache.resized_count == 2  # a capture that lost the × to its code page
    assert run.unparsed == ("moe-stream: read lots", "bmoe: something new")
    # moe-waits: is a line upstream declares after 0.24 (engine/interface/outputs.py): read, not kept unparsed
    assert run.value("moe-waits", "drain_s_per_token") == 0.004 and run.value("moe-waits", "adopt_s_per_token") == 0.001
    assert run.moe_stream is None


def test_runs_one_after_another_without_separators_split_into_runs(tmp_path):
    """An A/B driver's log: one run's output after the other, no `==== TAG ====` between them."""
    gpt = (UPSTREAM / "2026-07-17/gpt_k2.out").read_bytes()
    qwen = (UPSTREAM / "2026-07-17/qwen_k6.out").read_bytes()
    a = b"+ ./bmoe-cli -m /m/gpt-oss.gguf -n 256 --moe-stream --cache-mb 2000 --n-expert-used 2 --io-threads 4\n"
    b = b"+ ./bmoe-cli -m /m/qwen.gguf -n 256 --moe-stream --cache-mb auto --n-expert-used 6 --io-threads 8\n"
    path = write_bytes(tmp_path, "ab.log", a + gpt + b + qwen)
    first, second = read_console_runs(path)
    assert (first.tag, second.tag) == ("ab#1", "ab#2")
    assert first.declared_config["top_k"] == 2 and first.declared_config["cache_mib"] == 2000
    assert second.declared_config["top_k"] == 6 and second.declared_config["cache_auto"] is True
    assert (first.generation, second.generation) == (read_console(UPSTREAM / "2026-07-17/gpt_k2.out").generation,
                                                     read_console(UPSTREAM / "2026-07-17/qwen_k6.out").generation)
    # without the echoed commands the second run starts right after the first run's end-of-run block
    plain = read_console_runs(write_bytes(tmp_path, "twice.out", gpt + gpt))
    assert [r.tag for r in plain] == ["twice#1", "twice#2"] and plain[0].lines == plain[1].lines
    # a stdout/stderr pair read as one run cannot be split: the refusal says what to do, in user terms
    with pytest.raises(ParseError) as exc:
        read_console(path)
    assert_one_line_error(exc, "second run", "import its folder")
    assert "read_console" not in str(exc.value) and "split_runs" not in str(exc.value)


def test_a_capture_of_several_runs_imports_as_that_many_runs(tmp_path, cli):
    from click.testing import CliRunner

    src = tmp_path / "ab"
    src.mkdir()
    gpt = (UPSTREAM / "2026-07-17/gpt_k2.out").read_bytes()
    qwen = (UPSTREAM / "2026-07-17/qwen_k6.out").read_bytes()
    (src / "ab.log").write_bytes(b"+ ./bmoe-cli -m /m/gpt-oss.gguf --n-expert-used 2 --cache-mb 2000\n" + gpt +
                                 b"+ ./bmoe-cli -m /m/qwen.gguf --n-expert-used 6 --cache-mb auto\n" + qwen)
    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["added"] == 2
    records = sorted((json.loads(p.read_text()) for p in (tmp_path / "out").glob("runs/*/1/run.json")),
                     key=lambda r: r["config"]["source"])
    assert [r["config"]["source"] for r in records] == ["ab/ab#1", "ab/ab#2"]
    assert [r["config"]["n_expert_used"] for r in records] == [2, 6]
    assert [r["result"]["tok_per_s"] for r in records] == [1.79, read_console(UPSTREAM / "2026-07-17/qwen_k6.out")
                                                           .generation.tok_per_s]
    assert all(r["outcome"] == "ok" for r in records)


def test_warm_only_separators_and_command_lines():
    lines = [
        "==================== gptoss_k4 (k=4 io=8 n=24) ====================",
        "start batt=380dC",
        "+ LD_LIBRARY_PATH=/data/local/tmp ./bmoe-cli -m /m/gpt-oss.gguf --chatml -n 24 --moe-stream --cache-mb auto "
        "--cache-ceil-mb 3000 --io-threads 8 -t 4 --overlap --n-expert-used 4 --csv /x.csv -p \"What is 17 × 23?\"",
        "generation: 24 tokens, 0.870 s/token (1.150 tok/s)",
        "--- cooldown 90s ---",
        "==================== qwen_k8 (k=8 io=4 n=256) ====================",
        "generation: 256 tokens, 0.219 s/token (4.570 tok/s)",
        "ALL DONE",
    ]
    first, second = split_runs(lines)
    assert (first.tag, second.tag) == ("gptoss_k4", "qwen_k8")
    assert dict(first.declared_config) == {
        "model": "gpt-oss", "top_k": 4, "io_threads": 8, "n_predict": 24, "model_path": "/m/gpt-oss.gguf",
        "chatml": True, "moe_stream": True, "cache_auto": True, "cache_ceil_mib": 3000, "threads": 4, "overlap": True}
    assert second.declared_config["top_k"] == 8 and second.generation.tok_per_s == 4.57


def test_config_from_command():
    assert config_from_command("echo nothing to see") == {}
    assert config_from_command("./bmoe-cli -m a.gguf --cache-mb 2000 --force-cache --no-odirect --dense-weights warm "
                               "--prefetch 2 --progress --route-trace r.csv -p 'unbalanced") == {
        "model_path": "a.gguf", "cache_auto": False, "cache_mib": 2000, "force_cache": True, "o_direct": False,
        "dense_weights": "warm", "prefetch": 2, "progress": True}


# ── configuration from names and logs ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("name,expected", [
    ("2026-07-12/qwen_c2000_l4_ov.csv",
     {"model": "qwen", "moe_stream": True, "cache_mib": 2000, "io_threads": 4, "overlap": True}),
    ("gemma_mmap.log", {"model": "gemma", "moe_stream": False}),
    ("gemma_stream.metrics", {"model": "gemma", "moe_stream": True, "cache_mib": 0}),
    ("gemma_stream_ov.csv", {"model": "gemma", "moe_stream": True, "cache_mib": 0, "overlap": True}),
    ("gemma_auto_ov.csv", {"model": "gemma", "moe_stream": True, "cache_auto": True, "overlap": True}),
    ("gemma_autocap_ov.csv",
     {"model": "gemma", "moe_stream": True, "cache_auto": True, "cache_capped": True, "overlap": True}),
    ("qwen_base_ov.csv", {"model": "qwen", "moe_stream": True, "cache_auto": False, "overlap": True}),
    ("qwen_sg_ov.csv", {"model": "qwen", "moe_stream": True, "spec_gate": True, "overlap": True}),
    ("qwen5k_pf1.csv", {"model": "qwen", "moe_stream": True, "cache_mib": 5000, "prefetch": 1}),
    ("gpt_c2000_l8_k2.out", {"model": "gpt-oss", "moe_stream": True, "cache_mib": 2000, "io_threads": 8, "top_k": 2}),
    ("gpt_kdef.csv", {"model": "gpt-oss", "top_k": 0}),
    ("gptoss_mmap_k4.csv", {"model": "gpt-oss", "moe_stream": False, "top_k": 4}),
    ("gptoss.route.csv", {"model": "gpt-oss"}),
    ("k3_io8_pf4", {"top_k": 3, "moe_stream": True, "io_threads": 8, "prefetch": 4}),
    ("tiny_c0_warm.err", {"model": "tiny", "moe_stream": True, "cache_mib": 0, "dense_weights": "warm"}),
    ("reserve_gemma_k8.csv", {"model": "reserve", "unknown_tokens": ("gemma",), "top_k": 8}),
])
def test_config_from_name(name, expected):
    assert config_from_name(name) == expected


def test_run_stem():
    assert [run_stem(n) for n in ("a/gptoss.route.csv", "x.metrics", "y.err", "z.txt")] == ["gptoss", "x", "y", "z"]


@pytest.mark.parametrize("name", sorted(p.name for p in (UPSTREAM / "2026-07-17").glob("*.csv")))
def test_names_agree_with_the_v1_preambles(name):
    config, preamble = config_from_name(name), read_metrics_csv(UPSTREAM / "2026-07-17" / name).preamble
    assert config["model"] in preamble["model"].lower()
    if "cache_mib" in config:
        assert config["cache_mib"] == int(preamble["cache_mb"])
    if "io_threads" in config:
        assert config["io_threads"] == int(preamble["io_threads"])
    if config.get("top_k"):
        assert config["top_k"] == int(preamble["n_expert_used"])


def test_config_from_log_variants():
    auto = config_from_log(read_console(UPSTREAM / "2026-07-13/gemma_auto_ov.log"))
    assert auto == {"moe_stream": True, "cache_auto": True, "budget_mib": 4610.0, "overlap": True}
    assert config_from_log(read_console(UPSTREAM / "2026-07-12/qwen_mmap.log")) == {"moe_stream": False}
    trace = config_from_log(read_console(UPSTREAM / "2026-07-15-route-trace/gptoss.log"))
    assert trace == {"moe_stream": True, "n_expert": 128, "o_direct": True, "io_threads": 4, "budget_mib": 3000.0,
                     "cache_auto": True, "cache_floor_mib": 1536.0, "budget_cap_mib": 3000.0, "overlap": True,
                     "dense_weights": "warm", "threads": 4, "top_k": 2,
                     "model_path": "/data/local/tmp/shardllm/gpt-oss-120b-Q4_K_M.gguf"}
    host = config_from_log(read_console(UPSTREAM / "host-v2-0.19.0/tiny_c0_warm.out",
                                        UPSTREAM / "host-v2-0.19.0/tiny_c0_warm.err"))
    assert host["budget_mib"] == 0 and host["dense_weights"] == "warm" and host["shards"] == 1
    assert host["top_k"] == 2 and host["model_path"] == "tiny.gguf" and "cache_auto" not in host
    assert config_from_log(read_console(UPSTREAM / "host-v2-0.19.0/bad.err")) == {}


def test_driver_sections_top_k_matches_their_tags():
    for log in ("driver-k2.log", "driver-lanes.log"):
        for run in read_console_runs(UPSTREAM / "2026-07-17" / log):
            from_log = config_from_log(run)
            assert from_log["top_k"] == run.declared_config.get("top_k", 4)  # gpt-oss default is 4
            assert from_log["io_threads"] == run.declared_config["io_threads"]
            assert from_log["budget_mib"] == run.declared_config["cache_mib"] and from_log["o_direct"]


# ── discovery ──────────────────────────────────────────────────────────────────────────────────


def test_discover_groups_the_upstream_folders():
    groups = discover(UPSTREAM)
    by_key = {(g.folder.relative_to(UPSTREAM).as_posix(), g.stem): g for g in groups}
    counts = {}
    for folder, _ in by_key:
        counts[folder] = counts.get(folder, 0) + 1
    assert counts == {"2026-07-12": 14, "2026-07-13": 8, "2026-07-14": 14, "2026-07-14/warmup": 6,
                      "2026-07-15-route-trace": 1, "2026-07-17": 9, "host-v2-0.19.0": 5}
    trace = by_key["2026-07-15-route-trace", "gptoss"]
    assert trace.csv.name == "gptoss.metrics" and trace.sidecar is None  # the content decided
    assert (trace.log.name, trace.route_trace.name, trace.state.name) == ("gptoss.log", "gptoss.route.csv",
                                                                          "gptoss.state")
    qwen = by_key["2026-07-12", "qwen_c2000_l4"]
    assert (qwen.csv.name, qwen.sidecar.name, qwen.log.name) == ("qwen_c2000_l4.csv", "qwen_c2000_l4.metrics",
                                                                 "qwen_c2000_l4.log")
    assert by_key["2026-07-12", "gemma_c2000_l4_ov"].log is None
    mmap = by_key["2026-07-14", "gptoss_mmap_k2"]
    assert (mmap.capture.name, mmap.section) == ("gptoss-matrix.out", "mmap_k2")
    cell = by_key["2026-07-14", "k3_io8_pf4"]
    assert cell.csv is None and cell.section == "k3_io8_pf4"
    lanes = by_key["2026-07-17", "gpt_c2000_l8"]
    assert (lanes.capture.name, lanes.out.name, lanes.sidecar.name) == ("driver-lanes.log", "gpt_c2000_l8.out",
                                                                        "gpt_c2000_l8.metrics")
    assert by_key["2026-07-17", "qwen_k6"].capture is None
    bad = by_key["host-v2-0.19.0", "bad"]
    assert (bad.out.name, bad.err.name, bad.csv) == ("bad.out", "bad.err", None)
    assert not any(key[1].startswith(("driver", "gptoss-matrix")) for key in by_key)


def test_discover_zero_byte_csv_and_conflicts(tmp_path):
    copy("2026-07-17/gpt_k2.metrics", tmp_path)
    write_bytes(tmp_path, "gpt_k2.csv", b"")
    (group,) = discover(tmp_path)
    assert group.csv.name == "gpt_k2.csv" and group.sidecar.name == "gpt_k2.metrics"
    assert read_metrics_csv(group.csv).empty
    shutil.copyfile(UPSTREAM / "2026-07-15-route-trace/gptoss.metrics", tmp_path / "gpt_k2.metrics")
    with pytest.raises(ParseError) as exc:
        discover(tmp_path)
    assert_one_line_error(exc, "already has a csv file")
    with pytest.raises(ParseError) as exc:
        discover(tmp_path / "gpt_k2.csv")
    assert_one_line_error(exc, "not a folder")


# ── impossible values, refused or stored as missing (docs/decisions/impossible-values.md) ─────────────────

HUGE = "9" * 400
HUGEST = "1" * 5000            # past Python's 4,300-digit int() limit


def _edited(tmp_path: Path, name: str, old: str, new: str, *, encoding: str = "utf-8") -> Path:
    text = (UPSTREAM / name).read_bytes().decode(encoding, errors="surrogateescape")
    assert old in text, old
    path = tmp_path / Path(name).name
    path.write_bytes(text.replace(old, new, 1).encode(encoding, errors="surrogateescape"))
    return path


@pytest.mark.parametrize("name, old, new, read, where", [
    ("2026-07-17/gpt_k2.csv", "tok/s=1.790", f"tok/s={HUGEST}", read_metrics_csv, "gpt_k2.csv:261: tok/s="),
    ("2026-07-17/gpt_k2.csv", "cache_mb=0", f"cache_mb={HUGE}", read_metrics_csv, "gpt_k2.csv:3: cache_mb="),
    ("2026-07-17/gpt_k2.csv", "\n1,256,", f"\n1,{2 ** 64},", read_metrics_csv, "gpt_k2.csv:5: steps="),
    ("2026-07-17/gpt_k2.csv", "\n1,256,", "\n1,1e400,", read_metrics_csv, "gpt_k2.csv:5: steps=1e400"),
    ("2026-07-12/qwen_stream.metrics", "peak_rss_kb=", f"peak_rss_kb={HUGE}", read_sidecar,
     "qwen_stream.metrics:1: peak_rss_kb="),
    ("2026-07-12/qwen_stream.log", "generation: 256", f"generation: {HUGEST}", read_console,
     "qwen_stream.log:1: generation: "),
    ("2026-07-12/qwen_stream.log", "peak_rss_kb=", f"peak_rss_kb={HUGE}", read_console,
     "qwen_stream.log:4: peak_rss_kb="),
    ("2026-07-15-route-trace/gptoss.state", "MemFree:         3664856", f"MemFree: {HUGE}", read_state,
     "gptoss.state:5: MemFree="),
    ("2026-07-17/driver-k2.log", "memavail=6837980", f"memavail={HUGEST}", read_driver_log,
     "driver-k2.log:2: mem_available_kb="),
    ("2026-07-17/driver-k2.log", "gpt_c2000_l8_k2 =", f"gpt_c{HUGEST}_l8_k2 =", read_driver_log,
     "driver-k2.log:1: cache_mib="),
    ("host-v2-0.19.0/tiny_progress.out", '"step":1,', f'"step":{HUGEST},', read_console,
     "tiny_progress.out:2: "),
])
def test_a_number_no_engine_prints_is_refused_naming_file_line_and_key(tmp_path, name, old, new, read, where):
    encoding = "utf-8-sig" if name.endswith(".log") and "2026-07-12" in name else "utf-8"
    path = _edited(tmp_path, name, old, new, encoding=encoding)
    with pytest.raises(ParseError) as exc:
        read(path)
    assert_one_line_error(exc, where, "no engine prints a number")
    assert len(str(exc.value)) < len(str(path)) + 120      # an excerpt of the number, not the number


def test_nan_inf_and_impossible_values_are_missing_with_a_note(tmp_path):
    path = _edited(tmp_path, "2026-07-17/gpt_k2.csv", "tok/s=1.790", "tok/s=nan")
    text = path.read_text().replace("cache_hit_pct=-1.0", "cache_hit_pct=250.0").replace(" n_layer=36", " n_layer=-36")
    lines = text.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("1,256,")))
    cells = lines[first].split(",")
    cells[2], cells[6] = "-inf", "-1.00"      # a negative wall time; the -1 "not measured" hit is kept
    lines[first] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    m = read_metrics_csv(path)
    assert m.summary["tok/s"] is None and m.summary["cache_hit_pct"] is None and m.summary["tokens"] == 256
    assert "n_layer" not in m.preamble and m.preamble["n_expert"] == "128"
    assert math.isnan(m.rows["wall_ms"].iloc[0]) and m.rows["cache_hit_pct"].iloc[0] == -1
    assert m.rows["wall_ms"].iloc[1:].notna().all()
    assert list(m.notes) == [
        f"{path}:2: n_layer=-36: negative, stored as missing",
        f"{path}:261: tok/s=nan: not a finite number, stored as missing",
        f"{path}:261: cache_hit_pct=250.0: outside 0..100, stored as missing",
        f"{path}:5: wall_ms=-inf: not a finite number, stored as missing",
    ]

    notes: list[str] = []
    sidecar = _edited(tmp_path, "2026-07-12/qwen_stream.metrics", "peak_rss_kb=", "peak_rss_kb=-")
    values = read_sidecar(sidecar, notes)
    assert values["peak_rss_kb"] is None and values["cpu_temp_max_mC"] > 0 and len(notes) == 1
    assert notes[0].startswith(f"{sidecar}:1: peak_rss_kb=-") and notes[0].endswith("negative, stored as missing")
    cold = _edited(tmp_path, "2026-07-12/qwen_stream.metrics", "batt_temp_before_dC=", "batt_temp_before_dC=-")
    assert read_sidecar(cold)["batt_temp_before_dC"] < 0          # below 0 °C is a real temperature

    run = read_console(_edited(tmp_path, "2026-07-12/qwen_stream.log", "(1.709 tok/s)", "(inf tok/s)",
                               encoding="utf-8-sig"))
    assert run.generation.tok_per_s is None and run.generation.tokens == 256
    assert run.notes == (f"{tmp_path / 'qwen_stream.log'}:1: tok_per_s=inf: not a finite number, stored as missing",)

    notes = []
    state = read_state(_edited(tmp_path, "2026-07-15-route-trace/gptoss.state", "mValue=97.3", "mValue=nan"), notes)
    assert state["entry"]["temperatures_c"]["CPU1"] is None and state["entry"]["temperatures_c"]["CPU0"] == 99.6
    assert notes == [f"{tmp_path / 'gptoss.state'}:9: CPU1=nan: not a finite number, stored as missing"]


def test_errors_escape_control_characters_and_quote_a_short_excerpt(tmp_path):
    junk = "\x1b]0;pwned\x07" + "\x1b[2J" + "\u202e" + "x" * 54_000
    lines = (UPSTREAM / "2026-07-12/qwen_mmap.csv").read_text().splitlines()
    lines[5] = lines[5].replace("0.000", junk, 1)
    path = write_bytes(tmp_path, "esc\x1b[31m.csv", ("\n".join(lines) + "\n").encode())
    with pytest.raises(ParseError) as exc:
        read_metrics_csv(path)
    message = str(exc.value)
    assert "\x1b" not in message and "\x07" not in message and "\u202e" not in message
    assert "\\x1b]0;pwned\\x07" in message and "esc\\x1b[31m.csv:6:" in message
    assert len(message) < len(str(tmp_path)) + 200
    sidecar = write_bytes(tmp_path, "s.metrics", b"peak_rss_kb=1\n\x1b]0;x\x07\x00" + b"\xff" * 54_000 + b"\n")
    with pytest.raises(ParseError) as exc:
        read_sidecar(sidecar)
    assert "\x1b" not in str(exc.value) and "\x00" not in str(exc.value) and len(str(exc.value)) < 300


def test_parsed_once_parses_a_file_once_and_hands_out_copies(tmp_path, monkeypatch):
    """results.read.parse_csv.parsed_once (results.db.ingest: a run's CSVs for its row and its kept
    series): inside, a second read of an unchanged file is the first's result, its frame a copy of its
    own, without parsing again; a changed file is parsed again; an error is raised again; outside,
    every read parses."""
    from results.read import parse_csv

    path = copy("2026-07-12/qwen_c4000_l4.csv", tmp_path)
    samples = write_bytes(tmp_path, "samples.csv", b"t_s,mem_available_kb\n0,100\n1,90\n")
    bad = write_bytes(tmp_path, "x.csv", b"step,turn,phase,layer\n1,0,1,2\n")
    empty = write_bytes(tmp_path, "empty.csv", b"")
    calls: list[str] = []
    real_metrics, real_pandas = parse_csv._read_metrics_csv, pd.read_csv
    monkeypatch.setattr(parse_csv, "_read_metrics_csv", lambda p: calls.append(str(p)) or real_metrics(p))
    # (the metrics parser hands pandas its text in memory: only files are counted)
    monkeypatch.setattr(parse_csv.pd, "read_csv", lambda p, *a, **k: (calls.append(str(p)) if isinstance(p, Path) else None)
                        or real_pandas(p, *a, **k))
    with parse_csv.parsed_once():
        first, second = read_metrics_csv(path), read_metrics_csv(path)
        assert calls == [str(path)]
        assert first.rows is not second.rows and first.rows.equals(second.rows) and first.summary == second.summary
        second.rows.loc[0, "wall_ms"] = -5.0
        assert read_metrics_csv(path).rows.equals(first.rows)          # a copy each: one changed, not the kept one
        s1, s2 = parse_csv.read_samples_csv(samples), parse_csv.read_samples_csv(samples)
        assert calls.count(str(samples)) == 1 and s1 is not s2 and s1.equals(s2)
        for _ in range(2):
            with pytest.raises(ParseError, match="header lacks steps, wall_ms"):
                read_metrics_csv(bad)
            with pytest.raises(ValueError, match="No columns to parse"):
                parse_csv.read_samples_csv(empty)
        assert calls.count(str(bad)) == 1 and calls.count(str(empty)) == 1
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))     # changed (its size): parsed again
        assert len(read_metrics_csv(path).rows) == len(first.rows) and calls.count(str(path)) == 2
    read_metrics_csv(path), read_metrics_csv(path)
    assert calls.count(str(path)) == 4
