"""`bmoe-fleet import REPORT… -o DIR` (harness/community_import.py): community reports are checked,
the accepted ones written as runs with their provenance, the rejected ones listed one line per
reason; the import exits 1 only when no report was accepted (docs/decisions/community-import.md)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from harness.community_import import import_reports
from results.read.rundir import read_campaigns
from results.read.table import build_table
from store import names

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "community"
BAD = ("192-bench-report.md", "147-gb10-mmap.md", "147-threads2-128-tokens.md", "mmap-0.19.0-form.md")
ISSUE = "https://github.com/Helldez/BigMoeOnEdge/issues/192"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_good_report_becomes_a_run_with_its_provenance(tmp_path, cli):
    good = FIXTURES / "good-form.md"
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["import", str(good), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["rejected"] == [] and len(doc["accepted"]) == 1
    cell = doc["accepted"][0]["cell_id"]
    run = out / names.run_dir_rel(cell, 1)
    record = json.loads((run / names.RUN_JSON).read_text())
    assert record["outcome"] == "ok" and record["engine"]["version"] == "0.19.0"
    assert record["summary"]["tok/s"] == 67.24 and record["summary"]["tokens"] == 256
    prov = record["provenance"]
    text = good.read_text(encoding="utf-8")
    assert prov["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert (run / names.REPORT_MD).read_text(encoding="utf-8") == text        # the text the hash is of
    assert prov["source"] == str(good) and prov["fields"]["engine"] == "0.19.0" and "report" not in prov["fields"]
    assert prov["machine"]["Storage read (512 KiB, O_DIRECT)"] == "677 MiB/s"
    assert prov["checks"]["read"]["storage_bound_mib_s"] == 15259 and prov["imported_at"]
    # the engine lines it quoted are the run's stdout, read by the run table like any capture
    assert (run / names.STDOUT_TXT).read_text().startswith("bmoe: cache auto")
    table = build_table(read_campaigns([out]))
    row = table.iloc[0]
    assert row["outcome"] == "ok" and row["tok_s_summary"] == 67.24 and row["cache_hit_pct"] == 98.9
    # the same report again adds nothing
    again = CliRunner().invoke(cli, ["import", str(good), "-o", str(out)])
    assert again.exit_code == 0 and "(already there)" in again.output
    assert len(list((out / names.RUNS_DIR).iterdir())) == 1


def test_rejected_reports_write_nothing_and_exit_1_with_one_line_per_reason(tmp_path, cli):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["import", *[str(FIXTURES / n) for n in BAD], "-o", str(out)])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "community reports: 0 accepted, 4 rejected"
    rejected = [line for line in lines[1:] if line.startswith("  rejected ")]
    assert len(rejected) == len(lines) - 1 == 6        # 192: storage and size; GB10: mmap and tokens
    assert not out.exists()


def test_one_accepted_report_among_rejected_ones_exits_0_and_json_lists_both(tmp_path, cli):
    out = tmp_path / "out"
    args = [str(FIXTURES / "192-bench-report.md"), str(FIXTURES / "good-bare.txt")]
    result = CliRunner().invoke(cli, ["import", *args, "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [a["source"] for a in doc["accepted"]] == [args[1]]
    (bad,) = doc["rejected"]
    assert bad["source"] == args[0] and [r["rule"] for r in bad["reasons"]] == ["storage", "model-size"]


def test_an_exported_issue_gives_its_url_reporter_and_date(tmp_path):
    issue = {"url": "https://github.com/Helldez/BigMoeOnEdge/issues/999", "title": "[bench] a VM / synth",
             "author": {"login": "someone"}, "createdAt": "2026-08-31T10:00:00Z",
             "body": (FIXTURES / "good-bare.txt").read_text(encoding="utf-8")}
    path = tmp_path / "issue.json"
    path.write_text(json.dumps(issue), encoding="utf-8")
    result = import_reports([path], tmp_path / "out")
    (acc,) = result.accepted
    assert acc["device"] == "community:Helldez/BigMoeOnEdge#999"
    record = json.loads((tmp_path / "out" / names.run_dir_rel(acc["cell_id"], 1) / names.RUN_JSON).read_text())
    prov = record["provenance"]
    assert prov["issue"] == {"repo": "Helldez/BigMoeOnEdge", "number": 999}
    assert prov["reporter"] == "someone" and prov["reported_at"] == "2026-08-31T10:00:00Z"
    assert record["started_at"] == 1788170400.0 and record["config"]["source"] == issue["url"]


def test_url_names_a_text_reports_source_and_a_rejection_keeps_it(tmp_path, cli):
    src = tmp_path / "192.md"
    shutil.copyfile(FIXTURES / "192-bench-report.md", src)
    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(tmp_path / "out"), "--url", ISSUE, "--json"])
    assert result.exit_code == 1
    assert json.loads(result.output)["rejected"][0]["source"] == ISSUE


def test_a_file_that_is_no_report_is_one_line_and_nothing_written(tmp_path, cli):
    bad = tmp_path / "x.json"
    bad.write_text('{"title": "no body"}')
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["import", str(bad), "-o", str(out)])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "has none" in result.output
    binary = tmp_path / "x.md"
    binary.write_bytes(b"\xff\xfe\x00junk")
    result = CliRunner().invoke(cli, ["import", str(binary), "-o", str(out)])
    assert result.exit_code == 1 and "not UTF-8" in result.output and not out.exists()


def test_reports_extend_an_earlier_import_of_upstream_folders(tmp_path, cli):
    upstream = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "2026-07-12"
    src = tmp_path / "src"
    src.mkdir()
    for f in upstream.glob("qwen_c2000_l2.*"):
        shutil.copyfile(f, src / f.name)
    out = tmp_path / "out"
    first = CliRunner().invoke(cli, ["import", str(src), "-o", str(out)])
    assert first.exit_code == 0, first.output
    before = _files(out / names.RUNS_DIR)
    result = CliRunner().invoke(cli, ["import", str(FIXTURES / "good-bare.txt"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    after = _files(out / names.RUNS_DIR)
    assert before.items() <= after.items() and len(after) == len(before) + 2     # run.json, report.md
