"""engine.contract.telemetry writes what bmoe-cli 0.19.0 writes (checked against its real output)."""

from __future__ import annotations

import re

from engine.contract.telemetry import (
    CSV_COLUMNS,
    CsvSink,
    RouteTraceSink,
    RunSummary,
    TokenRow,
    csv_preamble,
    progress_lines,
)
from tests.conftest import UPSTREAM_HOST


def _shape(line: str) -> str:
    """A line with every number replaced, to compare formats rather than values."""
    return re.sub(r"-?\d+(\.\d+)?", "N", line)


def _upstream_rows(name: str) -> list[str]:
    lines = (UPSTREAM_HOST / name).read_text().splitlines()
    return [line for line in lines if line and line[0].isdigit()]


def test_columns_are_the_engines():
    header = next(line for line in (UPSTREAM_HOST / "tiny_auto.csv").read_text().splitlines()
                  if line.startswith("step,"))
    assert ",".join(CSV_COLUMNS) == header


def test_token_rows_reproduce_the_engines_bytes():
    rows = _upstream_rows("tiny_auto.csv") + _upstream_rows("tiny_c0_warm.csv")
    assert len(rows) == 64
    for line in rows:
        values = dict(zip(CSV_COLUMNS, line.split(",")))
        kwargs = {k: (int(v) if k in ("step", "steps", "read_bytes", "majflt", "turn", "mtp_batch") else float(v))
                  for k, v in values.items()}
        assert TokenRow(**kwargs).csv_line() == line


def _summary_values(name: str) -> dict[str, str]:
    line = (UPSTREAM_HOST / name).read_text().splitlines()[-1]
    assert line.startswith("# summary ")
    return dict(kv.split("=", 1) for kv in line[len("# summary "):].split())


def _summary_from(v: dict[str, str], **extra) -> RunSummary:
    return RunSummary(
        tokens=int(v["tokens"]), s_per_tok=1 / float(v["tok/s"]), read_mib=float(v["read_MiB"]),
        io_s=float(v["io_s"]), compute_s_per_tok=float(v["compute_s/tok"]), io_s_per_tok=float(v["io_s/tok"]),
        cache_hit_pct=float(v["cache_hit_pct"]), n_prompt=int(v["n_prompt"]), load_s=float(v["load_s"]),
        prefill_s=int(v["n_prompt"]) / float(v["prefill_tps"]), mgmt_s_per_tok=float(v["mgmt_s/tok"]),
        cache_resident_mib=float(v["cache_resident_MiB"]), cache_budget_mib=float(v["cache_budget_MiB"]),
        majflt_per_tok=float(v["majflt/tok"]), cpu_s_per_tok=float(v["cpu_s/tok"]),
        token_demand_mib=float(v["token_demand_MiB"]), layer_demand_mib=float(v["layer_demand_MiB"]),
        loop_overhead_s_per_tok=float(v["loop_overhead_s/tok"]), evictions=int(v["evictions"]),
        rereads=int(v["rereads"]), **extra)


def test_summary_line_reproduces_the_engines_bytes():
    for name in ("tiny_auto.csv", "tiny_progress.csv", "tiny_c0_warm.csv"):
        v = _summary_values(name)
        s = _summary_from(v, threads=4, moe_stream=True, cache_auto=False)
        assert s.csv_line() == (UPSTREAM_HOST / name).read_text().splitlines()[-1]


def test_stdout_lines_have_the_engines_format():
    cases = [("tiny_auto", dict(moe_stream=True, cache_auto=True)),
             ("tiny_c0_warm", dict(moe_stream=True, cache_auto=False)),
             ("tiny_mmap", dict(moe_stream=False, cache_auto=False))]
    for name, flags in cases:
        upstream = (UPSTREAM_HOST / f"{name}.out").read_bytes().decode("utf-8", "replace").splitlines()
        tail = upstream[upstream.index("") + 1:]
        ours = _summary_from(_summary_values(f"{name}.csv"), threads=4, **flags).stdout_lines()
        assert [_shape(x) for x in ours] == [_shape(x) for x in tail]
    # the progress run also printed the evictions line
    upstream = (UPSTREAM_HOST / "tiny_progress.out").read_bytes().decode("utf-8", "replace").splitlines()
    ours = _summary_from(_summary_values("tiny_progress.csv"), threads=4, moe_stream=True,
                         cache_auto=False).stdout_lines()
    assert [_shape(x) for x in ours] == [_shape(x) for x in upstream[-len(ours):]]


def test_csv_file_round_trip(tmp_path):
    path = tmp_path / "m.csv"
    sink = CsvSink(path)
    sink.preamble(csv_preamble("0.1.0", {"model": "m.gguf", "arch": "qwen3moe"},
                               {"moe_stream": 1, "cache_mb": 6, "cache_cycle_mb": "1.5"}, {"temp": 0}))
    sink.token(TokenRow(1, 1, 1.0, 0.5, 0.5, 4096, 50.0, 0.0, 0, 1.0, 6.0, 30, 10, 20, 0, 1000, 900, 0, 0.01))
    sink.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "# bmoe_metrics v2"
    assert "cache_mb=6 cache_cycle_mb=1.5" in lines[3]
    assert lines[5].startswith("step,") and lines[6].startswith("1,1,1.000,0.500,0.500,4096,50.00,")
    assert len(lines[6].split(",")) == 29


def test_progress_lines_match_the_engines_bytes():
    upstream = (UPSTREAM_HOST / "tiny_progress.out").read_bytes().splitlines()
    row = TokenRow(1, 32, 8.1, 1.8, 6.2, 1258291, 5.9, 0.1, 0, 6.8, 2.0, 26, 9, 17, 0, 23000, 23000, 0, 0.01)
    ours = progress_lines(row, delta_text=b"-")
    assert ours[0] == b'BMOE_LOAD {"mb":1.20,"ms":1.8}' == upstream[0]
    assert ours[1] == upstream[1]
    # the second token is a raw byte that is not valid UTF-8 on its own: passed through as is
    raw_delta = upstream[3].rsplit(b'"delta_text":"', 1)[1][:-2]
    assert len(raw_delta) == 1 and raw_delta[0] >= 0x80
    assert progress_lines(row, raw_delta)[1].endswith(b'"delta_text":"' + raw_delta + b'"}')
    assert progress_lines(row, b'a"b\\\n\x01')[1].endswith(b'"delta_text":"a\\"b\\\\\\n\\u0001"}')


def test_route_trace_header_matches_the_engines(tmp_path):
    path = tmp_path / "r.csv"
    sink = RouteTraceSink(path)
    assert path.read_text() == ""  # truncated at open, before the model is known
    sink.write_static("tiny.gguf", "qwen3moe", 4, 8, 2, [(i, 196608, 201984) for i in range(4)])
    sink.row(0, 0, 0, 0, 0, 0, 0.501306, 0, 196608)
    sink.close()
    upstream = (UPSTREAM_HOST / "tiny_auto.route.csv").read_text().splitlines()
    assert path.read_text().splitlines() == upstream[:8]


def test_route_trace_weights_are_printf_g6(tmp_path):
    """bmoe-cli writes weights with %.6g: six significant digits, no trailing zeros, nan kept."""
    path = tmp_path / "r.csv"
    sink = RouteTraceSink(path)
    for w in (1.0, 0.0123456789, 0.5, float("nan"), 1e-7):
        sink.row(0, 1, 40, 2, 0, 5, w, 1, 0)
    sink.close()
    assert [line.split(",")[6] for line in path.read_text().splitlines()] == ["1", "0.0123457", "0.5", "nan", "1e-07"]
