"""Community reports are read as upstream's issue form and bench-report.sh print them, and checked
before they count (results/read/community_report.py, results/read/community_checks.py): each rule
rejects its known-bad report, quoted from upstream's issues, and passes the good one
(tests/fixtures/community/README.md says where each text comes from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from results.analysis.community import COMMUNITY_TOKENS
from results.read.community_checks import (
    ENGINE,
    MODEL_SIZE,
    PROTOCOL_TOKENS,
    RELEASED,
    STORAGE,
    STORAGE_BOUNDS,
    STREAMING,
    TOKENS,
    UNREADABLE,
    check_report,
)
from results.read.community_report import parse_report, report_sha256

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "community"
GOOD = ("good-form.md", "good-bare.txt")


def _text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def _rules(text: str) -> dict[str, str]:
    return {r.rule: r.reason for r in check_report(parse_report(text)).rejections}


def test_the_form_is_read_field_by_field_and_bench_reports_tables_by_column():
    r = parse_report(_text("good-form.md"))
    assert r.fields["engine"] == "0.19.0" and r.fields["attach"].startswith("- [ ]")
    assert "```" not in r.fields["command"] and r.fields["command"].startswith("THREADS=1")
    assert r.machine["Storage read (512 KiB, O_DIRECT)"] == "677 MiB/s" and r.machine["CPU"] == "AMD EPYC"
    assert r.run["Cache"] == "229.5 MiB" and r.run["k"] == "4"
    assert dict(r.run_line) == {"engine": "0.19.0", "rev": "unknown", "arch": "qwen3moe", "tokens": "256",
                                "model_file": "synth-qwen3moe-00001-of-00002.gguf", "model_gib": "0.3"}
    assert r.extra_flags == "none"
    # the engine's own lines go through the importer's console parser
    assert r.console is not None and r.console.generation is not None and r.console.generation.tokens == 256
    assert r.console.streaming is not None and r.console.streaming.o_direct and r.console.streaming.shards == 2
    assert r.sha256 == report_sha256(_text("good-form.md"))


def test_an_empty_optional_field_and_a_report_without_the_form():
    assert parse_report(_text("147-gb10-mmap.md")).fields["notes"] == ""          # `_No response_`
    bare = parse_report(_text("192-bench-report.md"))
    assert bare.fields == {} and bare.machine["Storage read (512 KiB, O_DIRECT)"] == "110752 MiB/s"
    assert bare.run_line["model_gib"] == "0.0" and bare.console is None
    csv = parse_report(_text("mmap-0.19.0-form.md"))
    assert csv.csv_preamble["moe_stream"] == "0" and csv.csv_summary["tokens"] == 256


@pytest.mark.parametrize("name", GOOD)
def test_the_good_report_passes_every_rule(name):
    verdict = check_report(parse_report(_text(name)))
    assert verdict.accepted, verdict.rejections
    assert verdict.facts["storage_mib_s"] == 677 and verdict.facts["engine"] == "0.19.0"
    assert verdict.facts["tokens"] == PROTOCOL_TOKENS and verdict.facts["streamed"] is True


def test_storage_a_page_cache_rate_is_rejected_with_its_bound_and_source():
    reason = _rules(_text("192-bench-report.md"))[STORAGE]
    assert "110,752 MiB/s" in reason and "15,259 MiB/s" in reason and "PCIe 5.0 x4" in reason
    assert "page cache" in reason and "\n" not in reason


def test_storage_bound_follows_the_device_class():
    # the same 6,000 MiB/s: a laptop's NVMe can read it, no phone's UFS can
    text = _text("good-form.md").replace("| 677 MiB/s |", "| 6000 MiB/s |")
    assert STORAGE not in _rules(text)
    phone = text.replace("AMD EPYC, 2 cores (a cloud VM)", "Phone, 12 GB, UFS 4.0")
    reason = _rules(phone)[STORAGE]
    assert f"{STORAGE_BOUNDS['phone'].mib_per_s:,.0f} MiB/s" in reason and "UFS 4.0" in reason
    assert STORAGE not in _rules(text.replace("| 6000 MiB/s |", "| n/a MiB/s |"))   # the script's own n/a


@pytest.mark.parametrize("name, says", [
    ("147-gb10-mmap.md", "no `moe-stream:` line"),        # #147's GB10 numbers: plain mmap
    ("mmap-0.19.0-form.md", "moe_stream=0"),               # the real engine without --moe-stream
])
def test_streaming_a_plain_mmap_run_reported_as_the_engine_is_rejected(name, says):
    reason = _rules(_text(name))[STREAMING]
    assert says in reason and "baseline" in reason


def test_streaming_the_mode_line_and_o_direct_0_are_the_engines_word():
    good = _text("good-form.md")
    assert STREAMING not in _rules(good)
    mode = good.replace("moe-cache: 98.9% hit", "mode: mmap. Expert streaming is OFF on a MoE model (qwen3moe), "
                        "so this run is a baseline, not this engine: add --moe-stream --overlap to stream the routed "
                        "experts from flash.\nmoe-cache: 98.9% hit")
    assert "`mode: mmap` line" in _rules(mode)[STREAMING]
    buffered = good.replace("n_expert=16 o_direct=1", "n_expert=16 o_direct=0")
    assert "o_direct=0" in _rules(buffered)[STREAMING]
    # labelled a baseline, the same run is welcome (upstream #190)
    labelled = _text("mmap-0.19.0-form.md").replace("### Anything unusual\n\n_No response_",
                                                     "### Anything unusual\n\nan mmap baseline, not streaming")
    assert STREAMING not in _rules(labelled)


def test_model_size_zero_and_a_size_short_of_its_shards_are_rejected():
    reason = _rules(_text("192-bench-report.md"))[MODEL_SIZE]
    assert "0.0 GiB" in reason and "split in 5 shards" in reason and "140,352 MiB" in reason
    # one shard's size where the run's expert cache shows the whole model is larger
    short = _text("good-form.md").replace("(0.3 GiB, arch", "(0.1 GiB, arch")
    reason = _rules(short)[MODEL_SIZE]
    assert "0.1 GiB" in reason and "229.5 MiB" in reason and "does not count all its shards" in reason


def test_tokens_under_the_protocols_are_rejected():
    assert PROTOCOL_TOKENS == COMMUNITY_TOKENS
    reason = _rules(_text("147-threads2-128-tokens.md"))[TOKENS]     # #147: a streaming run of 128 tokens
    assert reason == f"128 tokens generated (its end-of-run lines), under the protocol's {COMMUNITY_TOKENS}"
    assert set(_rules(_text("147-threads2-128-tokens.md"))) == {TOKENS}


@pytest.mark.parametrize("version, says", [("0.24.0", "listed as unreleased"), ("0.2.0", "not among its releases"),
                                           ("0.19.7", "not among its releases")])
def test_engine_an_unreleased_version_is_rejected(version, says):
    text = _text("good-bare.txt").replace("engine 0.19.0 (unknown)", f"engine {version} (unknown)")
    assert says in _rules(text)[ENGINE]


def test_engine_a_commit_alone_and_two_versions_are_rejected():
    form = _text("good-form.md")
    commit = form.replace("engine 0.19.0 (unknown)", "engine unknown (7ad04fa)").replace(
        "### Engine version or commit\n\n0.19.0", "### Engine version or commit\n\n7ad04fa")
    assert "names no engine release" in _rules(commit)[ENGINE]
    two = form.replace("### Engine version or commit\n\n0.19.0", "### Engine version or commit\n\n0.23.0")
    assert "2 engine versions" in _rules(two)[ENGINE]
    assert RELEASED[-1] == "0.23.0" and "0.2.0" not in RELEASED


def test_a_damaged_number_is_one_line_not_a_crash():
    text = _text("good-form.md").replace("generation: 256 tokens", "generation: 2" + "5" * 40 + " tokens")
    reasons = _rules(text)
    assert UNREADABLE in reasons and "\n" not in reasons[UNREADABLE]
