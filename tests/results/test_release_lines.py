"""The end-of-run lines releases 0.19 to NEXT add, read into their declared fields
(engine/interface/outputs.py) from upstream's own printed examples (tests/fixtures/upstream/release-lines.md)."""

from __future__ import annotations

import re

import pytest

from engine.interface.outputs import line_columns
from results.read.parse_console import parse_console
from tests.conftest import FIXTURES

_BLOCK = re.compile(r"```([\w-]+)\n(.*?)```", re.S)


def blocks() -> dict[str, list[str]]:
    text = (FIXTURES / "upstream" / "release-lines.md").read_text(encoding="utf-8")
    return {name: body.splitlines() for name, body in _BLOCK.findall(text)}


def test_a_speculative_runs_lines_give_acceptance_decodes_and_the_effective_rate():
    run = parse_console(blocks()["ngram"])
    assert run.value("spec-accepted", "spec_source") == "ngram"
    assert (run.value("spec-accepted", "spec_accepted"), run.value("spec-accepted", "spec_drafted")) == (42, 95)
    assert run.value("spec-accepted", "spec_accept_pct") == 44.2 and run.value("spec-accepted", "tokens_per_decode") == 1.2
    assert (run.value("spec-accepted", "spec_decodes"), run.value("spec-accepted", "spec_tokens")) == (214, 256)
    assert run.value("spec-effective", "effective_tok_s") == 5.24 and run.value("spec-effective", "reported_tok_s") == 5.24
    assert run.value("ngram-coverage", "drafted_steps") == 32 and run.value("ngram-coverage", "drafted_steps_pct") == 15.0
    assert run.unparsed == ()
    mtp = parse_console(blocks()["mtp"])
    assert mtp.value("spec-accepted", "spec_source") == "mtp" and mtp.value("spec-accepted", "tokens_per_decode") == 2.31


def test_the_drop_line_gives_the_counts_a_run_traded():
    run = parse_console(blocks()["moe-drop"])
    assert (run.value("moe-drop", "experts_dropped"), run.value("moe-drop", "experts_routed")) == (1183, 2304)
    assert run.value("moe-drop", "drop_pct") == 51.3 and run.value("moe-drop", "drop_threshold") == 1.0


@pytest.mark.parametrize(("block", "mode", "cache"), [("mode-stream", "expert streaming", "cache 230 MiB"),
                                                      ("mode-mmap", "mmap", None)])
def test_the_mode_line_says_whether_the_run_streamed(block, mode, cache):
    run = parse_console(blocks()[block])
    assert run.value("mode", "mode") == mode and run.value("mode", "mode_cache") == cache


def test_every_line_field_with_a_run_table_column_is_read_by_some_pattern():
    from results.read.parse_console import HANDLED_LINES

    assert set(line_columns()) <= HANDLED_LINES


def test_the_planners_reproduce_line_gives_its_flags_and_the_budget_it_chose():
    run = parse_console(["plan: machine host", "plan: reproduce with",
                         "  bmoe-cli -m /m/q.gguf --moe-stream --cache-mb 2300 --io-threads 4 --overlap"])
    assert run.value("plan-reproduce", "plan_flags") == "--moe-stream --cache-mb 2300 --io-threads 4 --overlap"
    assert run.value("plan-reproduce", "plan_cache_mb") == 2300
