"""Outputs for people and CI (docs/decisions/output-formats.md): `table`, `recommend` and `compare` in text,
csv, json, jsonl and
md (a GitHub table), to stdout with `-o -` or to a file written atomically; `compare --threshold` and
`--fail-on-regression` (exit 4), with newly failing cells always counted as regressions."""

from __future__ import annotations

import csv
import io
import json
import math

from click.testing import CliRunner

from results.analysis.compare import FAIL_EXIT_STATUS, compare, comparison_rows


def md_table(text: str) -> list[list[str]]:
    """The rows of the first GitHub table in `text` (header first), its separator checked."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) >= 2 and set(lines[1].replace("|", "").replace(":", "")) == {"-"}, lines[:2]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in [lines[0]] + lines[2:]]


def test_the_run_table_in_every_format_to_stdout_or_a_file(local_campaign, cli, tmp_path):
    runner = CliRunner()
    jsonl = runner.invoke(cli, ["table", str(local_campaign), "--format", "jsonl"], catch_exceptions=False)
    assert jsonl.exit_code == 0
    records = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert len(records) == 20 and all(r["device"] == "local" for r in records)
    assert all(r["tok_s"] > 0 and r["cache_cycle_mb"] > 3 for r in records)
    md = runner.invoke(cli, ["table", str(local_campaign), "--format", "md", "-o", "-"])
    rows = md_table(md.stdout)
    assert rows[0][:5] == ["device", "model", "engine", "cache", "dense"] and len(rows) == 21
    assert {r[8] for r in rows[1:]} == {"ok"} and {r[3] for r in rows[1:]} >= {"cache 0", "auto"}
    text = runner.invoke(cli, ["table", str(local_campaign)]).stdout       # the default: text on stdout
    assert text.splitlines()[0].split()[:3] == ["device", "model", "engine"] and len(text.splitlines()) == 22
    out = tmp_path / "deep" / "runs.json"
    wrote = runner.invoke(cli, ["table", str(local_campaign), "-o", str(out)])
    assert wrote.exit_code == 0 and wrote.stdout.strip() == f"wrote 20 runs of 1 campaign to {out}"
    data = json.loads(out.read_text())
    assert (data["format"], data["version"], len(data["runs"])) == ("bmoe-fleet.table", 1, 20)
    assert sorted(p.name for p in out.parent.iterdir()) == ["runs.json"]       # no temporary file left


def test_recommendations_as_csv_md_and_jsonl(local_campaign, cli, tmp_path):
    runner = CliRunner()
    rows = md_table(runner.invoke(cli, ["recommend", str(local_campaign), "--format", "md"]).stdout)
    assert rows[0] == ["device", "phone", "RAM MiB", "model", "k", "cycle MiB", "fixed", "auto", "dense",
                       "confidence", "why", "verified"]
    (row,) = rows[1:]
    assert row[0] == "local" and row[3] == "small" and "--cache-mb auto" in row[7] and "--cache-ceil-mb" in row[7]
    out = tmp_path / "recs.csv"
    assert runner.invoke(cli, ["recommend", str(local_campaign), "-o", str(out)]).exit_code == 0
    (parsed,) = list(csv.DictReader(io.StringIO(out.read_text())))
    assert parsed["fixed"] == row[6] and parsed["auto"] == row[7] and parsed["confidence"] in ("low", "medium", "high")
    (line,) = runner.invoke(cli, ["recommend", str(local_campaign), "--format", "jsonl"]).stdout.splitlines()
    rec = json.loads(line)
    assert rec["identity"]["kind"] == "local" and rec["auto"]["argv"] == parsed["auto"].split()


def test_compare_prints_a_github_table_and_fails_ci_on_a_regression(compare_pair, cli):
    a, b = compare_pair
    runner = CliRunner()
    result = runner.invoke(cli, ["compare", str(a), str(b), "--format", "md", "--fail-on-regression"])
    assert result.exit_code == FAIL_EXIT_STATUS == 4, result.output
    assert result.stdout.startswith("**2 cells: ")
    rows = md_table(result.stdout)
    assert rows[0][:7] == ["device", "model", "k", "budget", "settings", "status", "metric"]
    slowed = [r for r in rows[1:] if r[3] == "cache 0" and r[6] == "tok/s"]
    assert len(slowed) == 1 and slowed[0][-1] == "regression" and float(slowed[0][9]) < -50   # change %
    # without the flag the same comparison exits 0; with a threshold past the slowdown nothing regressed
    assert runner.invoke(cli, ["compare", str(a), str(b), "--format", "md"]).exit_code == 0
    # the bar past this slowdown, measured as the noise rule measures it (B/A, or A/B for a drop):
    # twice what it took on this run, as the slowed engine's tok/s depends on the host's load
    ratio = 1 + float(slowed[0][9]) / 100
    bar = math.ceil((1 / ratio - 1) * 100 * 2)
    lenient = runner.invoke(cli, ["compare", str(a), str(b), "--threshold", str(bar), "--fail-on-regression"])
    assert lenient.exit_code == 0, lenient.output
    assert "0 regressed" in lenient.stdout and f"threshold {bar} % over noise" in lenient.stdout
    assert compare(a, b, threshold_pct=bar).regressions == []
    assert len(compare(a, b, threshold_pct=bar / 4).regressions) == 1       # a bar under it still catches it
    bad = runner.invoke(cli, ["compare", str(a), str(b), "--threshold", "-5"])
    assert bad.exit_code == 1 and "--threshold -5: give a percentage of 0 or more" in bad.output


def test_a_newly_failing_cell_is_a_regression_whatever_the_threshold(compare_pair, failing_twin, cli):
    a, _ = compare_pair
    result = CliRunner().invoke(cli, ["compare", str(a), str(failing_twin), "--threshold", "1000",
                                      "--fail-on-regression", "--format", "csv"])
    assert result.exit_code == 4, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    (failing,) = [r for r in rows if r["status"] == "newly failing"]
    assert failing["budget"] == "cache 0" and failing["verdict"] == "regression"
    assert (failing["a"], failing["b"]) == ("3/3 ok", "0/3 ok")
    report = compare(a, failing_twin, threshold_pct=1000)
    assert [c.status for c in report.regressions] == ["newly_failing"]
    assert json.loads(report.to_json())["summary"]["regressions"] == 1
    assert [r["verdict"] for r in comparison_rows(report) if r["status"] == "newly failing"] == ["regression"]


def test_the_run_table_carries_each_runs_reclaim(local_campaign):
    """The engine's own RssAnon/RssFile lows and highs per run, the device's swap
    MiB per token as numbers (0 without swap activity), and the refused files named."""
    from results.read.table import build_table

    table = build_table([local_campaign])
    ok = table[(table["outcome"] == "ok")]
    assert (ok["swap_in_mib_per_tok"] >= 0).all()       # from the states around the run: every run has it
    ok = ok[ok["reclaim_samples"] >= 1]                 # a run that ended before its first sample has no RSS
    assert len(ok) >= 10 and (ok["rss_anon_min_mib"] > 0).all() and (ok["rss_anon_min_mib"] <= ok["rss_anon_max_mib"]).all()
    assert (ok["rss_file_max_mib"] > 0).all()
    assert (ok["swap_in_mib_per_tok"] >= 0).all() and (ok["swap_out_mib_per_tok"] >= 0).all()
    assert not ok["reclaim_refused"].str.contains("/proc/vmstat").any()


# ---- Markdown is read where GitHub renders it: data shows as text, never as markup -------------------------
def render_md(text: str) -> str:
    """`text` as a CommonMark renderer with GitHub's tables and raw HTML on makes it (markdown-it-py,
    which rich brings): what a reader's browser would be handed before GitHub's sanitizer."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable("table").render(text)


def test_markdown_cells_show_html_pipes_and_backticks_as_text():
    from results import formats

    argv = "-m x.gguf --prompt <img src=y onerror=alert(1)> | `a` [t](http://e/) & \\"
    md = formats.to_md([{"device": "<script>alert(1)</script>", "auto": argv}], ["device", "auto"])
    cells = md.splitlines()[2]
    assert cells == ("| &lt;script&gt;alert(1)&lt;/script&gt; | -m x.gguf --prompt &lt;img src=y onerror=alert(1)&gt; "
                     "\\| \\`a\\` \\[t\\](http://e/) &amp; \\\\ |")
    html = render_md(md)
    assert "<img" not in html and "<script" not in html and "<a " not in html and "<code>" not in html, html
    assert html.count("<td>") == 2 and "&lt;img src=y onerror=alert(1)&gt; | `a` [t](http://e/) &amp; \\" in html
    line = formats.md_text("run <b>x</b>\n# not a heading")
    assert line == "run &lt;b&gt;x&lt;/b&gt; # not a heading" and "<b>" not in render_md(line)
    assert formats.md_code("A`` b") == "```A`` b```" and render_md(formats.md_code("<i>`x`")).strip() == \
        "<p><code>&lt;i&gt;`x`</code></p>"


def test_every_markdown_output_shows_a_device_named_like_a_script_tag_as_text(imported, cli, tmp_path):
    """The imported campaign's device label is `<script>alert(1)</script>` (tests/results/conftest.py)."""
    runner = CliRunner()
    outputs = {
        "table": runner.invoke(cli, ["table", str(imported), "--format", "md"]),
        "recommend": runner.invoke(cli, ["recommend", str(imported), "--format", "md"]),
        "compare": runner.invoke(cli, ["compare", str(imported), str(imported), "--format", "md"]),
        "community": runner.invoke(cli, ["report", str(imported), "--format", "community"]),
    }
    for name, result in outputs.items():
        assert result.exit_code == 0, (name, result.output)
        assert "<script" not in result.stdout and "&lt;script&gt;alert(1)&lt;/script&gt;" in result.stdout, name
        html = render_md(result.stdout)
        assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html, name
    assert md_table(outputs["recommend"].stdout)[1][0] == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert "- row 1 (&lt;script&gt;alert(1)&lt;/script&gt;, run " in outputs["community"].stdout
