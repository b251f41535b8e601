"""`bmoe-fleet import`: upstream bench-data folders become runs of a campaign directory, one per
engine run, with the numbers the files hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.campaign.file import load_campaign
from harness.campaign.model import CampaignError
from harness.importer import import_runs
from harness.run.status import campaign_status

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"
FOLDERS = ("2026-07-12", "2026-07-13", "2026-07-14", "2026-07-15-route-trace", "2026-07-17", "host-v2-0.19.0")
# engine runs per folder: one per CSV/log stem, one per section of the 14-run gptoss-matrix.out (two of
# which also have a CSV), one per 2026-07-17 run (their driver-log sections join their files)
RUNS = {"2026-07-12": 14, "2026-07-13": 8, "2026-07-14": 20, "2026-07-15-route-trace": 1, "2026-07-17": 9,
        "host-v2-0.19.0": 5}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "camp"
    report = import_runs([UPSTREAM / f for f in FOLDERS], out)
    assert report.found == report.added == sum(RUNS.values()) and report.skipped == 0
    assert report.per_source == {str(UPSTREAM / f): n for f, n in RUNS.items()}
    return out


def run_of(out: Path, source: str) -> tuple[dict, Path]:
    for path in out.glob("runs/*/1/run.json"):
        rec = json.loads(path.read_text())
        if rec["config"]["source"] == source:
            return rec, path.parent
    raise AssertionError(f"no run imported from {source}")


def test_one_run_per_engine_run_in_the_campaign_format(imported):
    plan = json.loads((imported / "plan.json").read_text())
    lines = [json.loads(x) for x in (imported / "ledger.jsonl").read_text().splitlines()]
    assert len(plan["cells"]) == len(lines) == len(list(imported.glob("runs/*/1/run.json"))) == sum(RUNS.values())
    assert {c["cell_id"] for c in plan["cells"]} == {x["cell_id"] for x in lines}
    sources = {json.loads(p.read_text())["config"]["source"] for p in imported.glob("runs/*/1/run.json")}
    assert len(sources) == sum(RUNS.values())
    assert {s.split("/")[0] for s in sources} == set(FOLDERS)
    status = campaign_status(imported)
    assert status.complete and status.outcomes == {"ok": sum(RUNS.values()) - 1, "config_error": 1}
    with pytest.raises(CampaignError, match="records runs brought in by `bmoe-fleet import`"):
        load_campaign(imported / "campaign.toml")
    dev = json.loads((imported / "devices" / "imported.json").read_text())
    assert dev["kind"] == "imported"


@pytest.mark.parametrize("source, tok_per_s, hit_pct, budget_mib, tokens", [
    # 2026-07-12: CSV without preamble (8 columns); budget only in the file name (c2000)
    ("2026-07-12/qwen_c2000_l2", 2.005, 53.0, 2000, 256),
    ("2026-07-12/gemma_stream", 1.61, None, 0, 256),          # cache off: the hit column is -1
    ("2026-07-12/qwen_mmap", 2.0, None, None, 256),           # no streaming: no budget
    # 2026-07-13: auto budgets, printed by the engine as `budget N MiB (auto, resized 0x)`
    ("2026-07-13/qwen_auto_ov", 4.367, 81.5, 4675.4, 256),
    # 2026-07-14: runs that exist only as sections of gptoss-matrix.out
    ("2026-07-14/k2_io4_pf0", 0.687, 20.4, 3000.0, 24),
    ("2026-07-14/k3_io8_pf4", 0.295, 18.1, 3000.0, 22),
    # 2026-07-17: `# bmoe_metrics v1` preamble
    ("2026-07-17/gpt_c2000_l8_k2", 2.191, 32.0, 2000.0, 256),
    ("2026-07-17/gpt_k2", 1.79, None, 0.0, 256),
    # host-v2-0.19.0: `# bmoe_metrics v2`, auto sized to 6 MiB
    ("host-v2-0.19.0/tiny_auto", 131.982, 88.7, 6.0, 32),
    ("2026-07-15-route-trace/gptoss", 0.503, 32.4, 3000.0, 64),
])
def test_numbers_equal_the_files(imported, source, tok_per_s, hit_pct, budget_mib, tokens):
    rec, _ = run_of(imported, source)
    assert rec["outcome"] == "ok"
    assert rec["result"]["tok_per_s"] == tok_per_s
    assert rec["result"]["cache_hit_pct"] == hit_pct
    assert rec["result"]["budget_mib"] == budget_mib
    assert rec["result"]["tokens"] == tokens


def test_config_comes_from_the_preamble_or_else_the_name_and_log(imported):
    v2, folder = run_of(imported, "host-v2-0.19.0/tiny_auto")
    c = v2["config"]
    assert (c["cache_auto"], c["cache_ceil_mb"], c["n_expert_used"], c["io_threads"], c["dense_weights"]) == \
        (True, 3000, 2, 4, "anon")
    assert v2["engine"] == {"kind": "native", "version": "0.19.0"} and v2["o_direct"] == 1
    assert (folder / "route.csv").read_bytes() == (UPSTREAM / "host-v2-0.19.0/tiny_auto.route.csv").read_bytes()
    assert (folder / "stderr.txt").read_bytes() == (UPSTREAM / "host-v2-0.19.0/tiny_auto.err").read_bytes()
    old, folder = run_of(imported, "2026-07-12/qwen_c4000_l4_ov")
    c = old["config"]
    assert (c["model"], c["moe_stream"], c["cache_mb"], c["io_threads"], c["overlap"]) == ("qwen", True, 4000, 4, True)
    assert (folder / "metrics.csv").read_bytes() == (UPSTREAM / "2026-07-12/qwen_c4000_l4_ov.csv").read_bytes()
    assert (folder / "run.metrics").read_bytes() == (UPSTREAM / "2026-07-12/qwen_c4000_l4_ov.metrics").read_bytes()
    assert old["pressure"]["peak_rss_kb"] > 0
    section, folder = run_of(imported, "2026-07-14/k4_io8_pf4")
    c = section["config"]
    assert (c["model"], c["n_expert_used"], c["io_threads"], c["prefetch"], c["cache_auto"]) == \
        ("gpt-oss", 4, 8, 4, True)
    assert "generation: " in (folder / "stdout.txt").read_text()
    gated, _ = run_of(imported, "2026-07-17/gpt_c2000_l8")
    assert gated["entry_state"]["waited_s"] == 180      # the driver's cooling gate, from its ENTRY STATE line
    refused, _ = run_of(imported, "host-v2-0.19.0/bad")
    assert refused["outcome"] == "config_error" and "pathological band" in refused["evidence"][0]


def test_importing_again_adds_nothing_and_a_cut_run_is_invalid(imported, tmp_path, cli):
    again = import_runs([UPSTREAM / "2026-07-12"], imported)
    assert again.added == 0 and again.skipped == RUNS["2026-07-12"]
    # a run killed mid-decode: rows, no summary, no end-of-run lines
    src = tmp_path / "cut"
    src.mkdir()
    lines = (UPSTREAM / "2026-07-12/qwen_c2000_l2.csv").read_text().splitlines(keepends=True)
    (src / "qwen_c2000_l2.csv").write_text("".join(lines[:40]))
    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(tmp_path / "out"), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["added"] == 1
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("runs/*/1/run.json")]
    assert rec["outcome"] == "invalid" and "no summary line" in rec["evidence"][0]
    assert rec["result"]["budget_mib"] == 2000 and rec["result"]["tok_per_s"] is None
    not_a_folder = CliRunner().invoke(cli, ["import", str(src / "qwen_c2000_l2.csv"), "-o", str(tmp_path / "x")])
    assert not_a_folder.exit_code != 0 and not (tmp_path / "x").exists()
    shutil.rmtree(src)


# ── impossible values (docs/decisions/impossible-values.md) ────────────────────────────────────────────────────


def _strict(path: Path) -> dict:
    """A stored JSON file, read the way a strict JSON reader would (NaN/Infinity refused)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path}: {constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def _one_run(tmp_path: Path, stem: str = "qwen_c2000_l2", folder: str = "2026-07-12") -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for f in (UPSTREAM / folder).glob(f"{stem}.*"):
        shutil.copyfile(f, src / f.name)
    return src


@pytest.mark.parametrize("file, old, new, where", [
    # 400 digits: imported fine before, then table/report/recommend died of OverflowError
    ("qwen_c2000_l2.metrics", "peak_rss_kb=5284608", "peak_rss_kb=" + "9" * 400,
     "qwen_c2000_l2.metrics:1: peak_rss_kb="),
    # over 4,300 digits: the import itself died of ValueError
    ("qwen_c2000_l2.csv", "tok/s=2.005", "tok/s=" + "1" * 5000, "qwen_c2000_l2.csv:258: tok/s="),
    ("qwen_c2000_l2.csv", "\n1,256,", "\n" + "7" * 45 + ",256,", "qwen_c2000_l2.csv:2: step="),
    ("qwen_c2000_l2.log", "generation: 256 tokens", "generation: " + "2" * 30 + " tokens",
     "qwen_c2000_l2.log:1: generation: "),
])
def test_a_number_no_engine_prints_refuses_the_import_naming_file_line_and_key(tmp_path, cli, file, old, new, where):
    src = _one_run(tmp_path)
    text = (src / file).read_text(encoding="utf-8-sig")
    assert old in text
    (src / file).write_text(text.replace(old, new, 1))
    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert "\n" not in line and where in line and "no engine prints a number" in line, line
    assert len(line) < len(str(src)) + 200                  # an excerpt of the number, not all of it
    assert not (tmp_path / "out").exists()


def test_nan_inf_and_negative_values_are_stored_as_missing_with_notes_and_results_commands_work(tmp_path, cli):
    src = _one_run(tmp_path)
    sidecar = (src / "qwen_c2000_l2.metrics").read_text()
    (src / "qwen_c2000_l2.metrics").write_text(sidecar.replace("peak_rss_kb=5284608", "peak_rss_kb=-5284608")
                                                .replace("mem_avail_floor_kb=", "mem_avail_floor_kb=nan\nx_kb="))
    csv = (src / "qwen_c2000_l2.csv").read_text()
    csv = csv.replace("tok/s=2.005", "tok/s=inf").replace("cache_hit_pct=53.0", "cache_hit_pct=153.0")
    lines = csv.splitlines()
    lines[1] = lines[1].split(",", 2)[0] + ",256,nan," + lines[1].split(",", 3)[3]   # wall_ms of step 1
    lines[2] = lines[2].split(",", 2)[0] + ",256,-5.0," + lines[2].split(",", 3)[3]
    (src / "qwen_c2000_l2.csv").write_text("\n".join(lines) + "\n")
    log = (src / "qwen_c2000_l2.log").read_text(encoding="utf-8-sig")
    (src / "qwen_c2000_l2.log").write_text(log.replace("(2.005 tok/s)", "(nan tok/s)"))

    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "values stored as missing" in result.output
    (path,) = (tmp_path / "out").glob("runs/*/1/run.json")
    rec = _strict(path)
    for json_file in (tmp_path / "out").rglob("*.json"):
        _strict(json_file)
    assert rec["pressure"]["peak_rss_kb"] is None and rec["pressure"]["mem_avail_floor_kb"] is None
    assert rec["summary"]["tok/s"] is None and rec["summary"]["cache_hit_pct"] is None
    assert rec["result"]["tok_per_s"] is None                         # nor from the log, whose tok/s is nan
    assert rec["result"]["cache_hit_pct"] == 53.0                     # the log's moe-cache line still says
    assert rec["result"]["tokens"] == 256 and rec["pressure"]["mem_avail_before_kb"] > 0   # the rest is kept
    notes = "\n".join(rec["notes"])
    for fragment in ("qwen_c2000_l2.metrics:1: peak_rss_kb=-5284608: negative",
                     "qwen_c2000_l2.metrics:3: mem_avail_floor_kb=nan: not a finite number",
                     "qwen_c2000_l2.csv:258: tok/s=inf: not a finite number",
                     "cache_hit_pct=153.0: outside 0..100",
                     "qwen_c2000_l2.csv:2: wall_ms=nan: not a finite number (and 1 more in the column)",
                     "qwen_c2000_l2.log:1: tok_per_s=nan"):
        assert fragment in notes, notes

    table = CliRunner().invoke(cli, ["table", str(tmp_path / "out"), "-o", str(tmp_path / "runs.csv")],
                               catch_exceptions=False)
    assert table.exit_code == 0, table.output
    import pandas as pd

    row = pd.read_csv(tmp_path / "runs.csv").iloc[0]
    assert row["tokens"] == 256 and row["cache_hit_pct"] == 53.0
    assert pd.isna(row["peak_rss_kb"]) and pd.isna(row["mem_avail_floor_kb"])   # missing, not -5284608 or nan
    assert row["tok_s"] > 0          # mean over the 254 measured tokens; the two missing walls left out
    recommend = CliRunner().invoke(cli, ["recommend", str(tmp_path / "out"), "--json"], catch_exceptions=False)
    assert recommend.exit_code == 0, recommend.output
    json.loads(recommend.output, parse_constant=lambda c: pytest.fail(f"{c} in recommendations.json"))
    report = CliRunner().invoke(cli, ["report", str(tmp_path / "out"), "-o", str(tmp_path / "site")],
                                catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert (tmp_path / "site" / "index.html").is_file()


def test_strings_from_the_files_are_stored_escaped(tmp_path):
    src = _one_run(tmp_path, "tiny_auto", "host-v2-0.19.0")
    csv = (src / "tiny_auto.csv").read_text()
    (src / "tiny_auto.csv").write_text(csv.replace("model=tiny.gguf", "model=\x1b]0;pwned\x07.gguf"))
    err = (src / "tiny_auto.err").read_bytes()
    (src / "tiny_auto.err").write_bytes(err + b"error: \x1b[2J boom\n")
    import_runs([src], tmp_path / "out")
    (path,) = (tmp_path / "out").glob("runs/*/1/run.json")
    rec = _strict(path)
    assert rec["model"] == "\\x1b]0;pwned\\x07" and rec["outcome"] == "engine_error"
    assert rec["evidence"] == ["\\x1b[2J boom"]
    assert "\x1b" not in path.read_text()
