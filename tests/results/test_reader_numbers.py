"""What the importer stores of the numbers it reads (docs/decisions/ascii-numbers.md,
docs/decisions/impossible-values.md): a numeral that is no ASCII decimal is refused naming file and
line, a bool or a part larger than its whole is stored as missing with a note, the planner's flags
are the line after `plan: reproduce with` only, a session file with a damaged first summary is
refused, and every refusal names file and line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.importer import import_runs
from results.read.parse import read_metrics_csv, read_state
from results.read.parse_console import parse_console, read_console
from results.read.parse_session import find_sessions, read_gap_log, session_turns
from results.read.parse_text import NumberError
from results.read.table import build_table
from tests.results.mutants import UPSTREAM

HOST = UPSTREAM / "host-v2-0.19.0"
SESSIONS = UPSTREAM.parent / "sessions"
NINES = "9" * 400


def _import(cli, src: Path, out: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["import", str(src), "-o", str(out)])
    return result.exit_code, result.output


def _one_run(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """host-v2's tiny_auto run, `old` replaced by `new` in its file `name`."""
    src = tmp_path / "src"
    src.mkdir()
    for f in HOST.glob("tiny_auto.*"):
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.name == name:
            assert old in text
            text = text.replace(old, new, 1)
        (src / f.name).write_text(text, encoding="utf-8")
    return src


@pytest.mark.parametrize(("old", "new", "where"), [
    ("tokens=32 ", "tokens=١٢٣ ", "tiny_auto.csv:39: tokens="),          # Arabic-Indic digits: int() reads 123
    ("read_MiB=1.2 ", "read_MiB=１２ ", "tiny_auto.csv:39: read_MiB="),  # fullwidth: float() reads 12.0
    ("cache_hit_pct=88.7 ", "cache_hit_pct=1_000 ", "tiny_auto.csv:39: cache_hit_pct="),   # float() reads 1000
    ("n_expert=8 ", "n_expert=٨ ", "tiny_auto.csv:3: n_expert="),
    ("cache_ceil_mb=3000 ", "cache_ceil_mb=3_000 ", "tiny_auto.csv:4: cache_ceil_mb="),
])
def test_a_numeral_python_reads_but_no_engine_prints_refuses_the_import(tmp_path, cli, old, new, where):
    code, output = _import(cli, _one_run(tmp_path, "tiny_auto.csv", old, new), tmp_path / "out")
    assert code == 1 and output.startswith("Error: ") and output.count("\n") == 1, output
    assert where in output and "not an ASCII decimal number" in output, output
    assert not (tmp_path / "out").exists()


def test_a_substitute_line_with_more_substituted_than_reranked_stores_both_as_missing():
    run = parse_console(["moe-substitute: 50/10 reranked slots went to a resident expert (500.0%), margin 0.50 x "
                         "score range"], paths=("x.out",))
    assert run.value("moe-substitute", "experts_substituted") is None
    assert run.value("moe-substitute", "experts_reranked") is None
    assert run.value("moe-substitute", "substituted_pct") is None and run.value("moe-substitute", "substitute_margin") == 0.5
    assert any("x.out:1: experts_substituted=50 > experts_reranked=10" in n for n in run.notes), run.notes
    fine = parse_console(["moe-substitute: 10/50 reranked slots went to a resident expert (20.0%), margin 0.50 x "
                          "score range"])
    assert (fine.value("moe-substitute", "experts_substituted"), fine.value("moe-substitute", "experts_reranked")) == (10, 50)


def test_a_drop_line_and_a_summary_with_a_part_over_its_whole_store_both_as_missing(tmp_path):
    run = parse_console(["moe-drop: 2400/2304 routed experts dropped (104.2%), threshold 1.00 x uniform"])
    assert run.value("moe-drop", "experts_dropped") is None and run.value("moe-drop", "experts_routed") is None
    src = _one_run(tmp_path, "tiny_auto.csv", "experts_routed=0 experts_dropped=0",
                   "experts_routed=10 experts_dropped=20")
    import_runs([src], tmp_path / "out")
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("run.json")]
    assert record["summary"]["experts_dropped"] is None and record["summary"]["experts_routed"] is None
    assert any("experts_dropped=20 > experts_routed=10" in n for n in record["notes"]), record["notes"]
    assert math.isnan(build_table([tmp_path / "out"]).iloc[0]["drop_pct"])


def _session(tmp_path: Path, lines: list[str]) -> Path:
    src = tmp_path / "src"
    shutil.copytree(SESSIONS / "jsonl", src)
    (src / "turns-a.jsonl").write_text("\n".join(lines) + "\n")
    return src


def test_a_bool_where_a_bmoe_done_count_goes_is_stored_as_missing_not_as_1(tmp_path):
    src = _session(tmp_path, ['{"id":1,"tokens":3,"tok_s":9.0}', 'BMOE_DONE {"id":2,"tokens":true,"tok_s":9.0,'
                                                                  '"cache_hit_pct":false,"cancelled":false}'])
    import_runs([src], tmp_path / "out")
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("run.json")]
    done = record["turns"][1]["bmoe_done"]
    assert done["tokens"] is None and done["cache_hit_pct"] is None and done["cancelled"] is False
    assert any("tokens=True: not a number, stored as missing" in n for n in record["notes"]), record["notes"]
    row = build_table([tmp_path / "out"]).iloc[0]
    assert math.isnan(row["tokens"]) and math.isnan(row["cache_hit_pct"])


@pytest.mark.parametrize("first", ["BMOE_DONE null", "[]", "BMOE_DONE [1]", "BMOE_DONE"])
def test_a_session_file_whose_first_summary_is_damaged_is_refused_not_skipped(tmp_path, cli, first):
    src = _session(tmp_path, [first, 'BMOE_DONE {"id":2,"tokens":40,"tok_s":1.9}'])
    code, output = _import(cli, src, tmp_path / "out")
    assert code == 1 and output.startswith("Error: ") and output.count("\n") == 1, output
    assert "turns-a.jsonl:1: " in output, output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("lines", "where"), [
    ([f'{{"id":1,"tokens":{NINES},"tok_s":1.0}}'], "turns-a.jsonl:1: "),
    (['{"id":1,"tokens":3}', 'BMOE_DONE {"id":2,"tokens":18446744073709551616}'], "turns-a.jsonl:2: "),
])
def test_a_number_too_large_inside_bmoe_done_names_file_and_line(tmp_path, cli, lines, where):
    code, output = _import(cli, _session(tmp_path, lines), tmp_path / "out")
    assert code == 1 and where in output and "no engine prints a number this large" in output, output


def test_a_number_too_large_in_a_gap_log_names_file_and_line(tmp_path, cli):
    src = _session(tmp_path, ['{"id":1,"tokens":3}', '{"id":2,"tokens":3}'])
    (src / "idle-a.mem").write_text(f"-- idle {NINES}s from turn 1 done --\nt=0 VmSwap: 1 kB VmRSS: 2 kB\n")
    code, output = _import(cli, src, tmp_path / "out")
    assert code == 1 and "idle-a.mem:1: idle_s=" in output, output
    (src / "idle-a.mem").write_text(f"-- idle 5s from turn 1 done --\nt={NINES} VmSwap: 1 kB VmRSS: 2 kB\n")
    code, output = _import(cli, src, tmp_path / "out")
    assert code == 1 and "idle-a.mem:2: t=" in output, output


@pytest.mark.parametrize("after", [[], ["generation: 5 tokens, 0.100 s/token (10.00 tok/s)"], [""]])
def test_the_plans_flags_are_only_the_indented_command_line_after_reproduce_with(after):
    run = parse_console(["plan: machine host", "plan: reproduce with", *after], paths=("p.err",))
    assert run.value("plan-reproduce", "plan_flags") is None
    assert any("p.err:2: `plan: reproduce with` has no command line after it" in n for n in run.notes), run.notes


def test_a_number_too_large_in_the_plans_command_line_names_file_and_line(tmp_path):
    capture = tmp_path / "p.err"
    capture.write_text(f"plan: reproduce with\n  bmoe-cli -m /m/q.gguf --moe-stream --cache-mb {NINES}\n")
    with pytest.raises(NumberError, match=r"p\.err:2: plan_cache_mb=") as error:
        read_console(capture)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("line", "where"), [
    ("moe-stream: read ١٢.٥ MiB (1.0 MiB/token), decode 0.3 s/token (compute 0.1 + flash I/O 0.2 s/token, 5.0 MiB/s)",
     "x.out:2: ١٢.٥"),
    ("moe-cache: 61.5% hit, resident 2296.0 MiB, budget ２３００ MiB (fixed)", "x.out:2: ２３００"),
    ("the answer bmoe: expert streaming ON  n_expert=1_28 o_direct=1 io_threads=4 cache=4 MiB", "x.out:2: bmoe: 1_28"),
    ("peak_rss_kb=٥٠٠", "x.out:2: peak_rss_kb=٥٠٠"),
    ("print_info: n_expert_used = ٤", "x.out:2: n_expert_used=٤"),
])
def test_an_engine_line_with_digits_no_engine_prints_is_refused_with_its_line(tmp_path, line, where):
    capture = tmp_path / "x.out"
    capture.write_text(f"generation: 5 tokens, 0.100 s/token (10.00 tok/s)\n{line}\n", encoding="utf-8")
    with pytest.raises(NumberError, match="not an ASCII decimal number") as error:
        read_console(capture)
    assert where in str(error.value), error.value


def test_other_digits_in_generated_text_and_an_engines_error_words_are_text(tmp_path):
    capture = tmp_path / "x.out"
    capture.write_text("٣ + ٤ = ٧ bmoe: expert streaming ON  n_expert=8 o_direct=1 io_threads=4 cache=4 MiB\n"
                       "config error: moe.cache_mb=١٢ is below 32\nBMOE_PROGRESS {\"id\":1,\"delta_text\":\"٣\"}\n",
                       encoding="utf-8")
    run = read_console(capture)
    assert run.streaming is not None and run.streaming.n_expert == 8
    assert run.config_error == "moe.cache_mb=١٢ is below 32" and run.events[0][1]["delta_text"] == "٣"


def test_a_metrics_version_of_5000_digits_is_refused_with_its_line(tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text("# bmoe_metrics v" + "1" * 5000 + "\nstep,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct\n")
    with pytest.raises(NumberError, match=r"m\.csv:1: bmoe_metrics="):
        read_metrics_csv(csv)


def test_a_state_files_meminfo_in_other_digits_is_refused_not_left_out(tmp_path):
    state = tmp_path / "s.state"
    state.write_text("--- BEFORE ---\nmeminfo: MemFree: ٣٠٠ kB MemAvailable: 7184292 kB\n", encoding="utf-8")
    with pytest.raises(NumberError, match=r"s\.state:2: "):
        read_state(state)


def test_a_refused_turns_error_and_the_plans_budget_are_range_checked(tmp_path):
    run = parse_console(["plan: reproduce with", "  bmoe-cli -m /m/q.gguf --cache-mb -5"], paths=("p.err",))
    assert run.value("plan-reproduce", "plan_cache_mb") is None
    assert any("p.err:2: plan_cache_mb=-5: negative" in n for n in run.notes), run.notes
    capture = tmp_path / "rewarm-ab-y.out"
    capture.write_text('BMOE_READY {"load_s":1.0}\nBMOE_BEGIN {"id":1}\nBMOE_ERROR {"id":-2,"fatal":false,"msg":"x"}\n')
    (found,), _ = find_sessions([capture])
    assert found.errors[0]["id"] is None and any("id=-2: negative" in n for n in found.notes), found.notes
    assert [t["id"] for t in session_turns(found)] == [1]


def test_a_huge_top_k_in_llamas_load_log_is_refused_where_its_line_is_known(tmp_path):
    """config_from_log reads the digits a `print_info:` value starts with; the console reader checks
    those same digits, with the file and line (junk after them included)."""
    capture = tmp_path / "x.out"
    capture.write_text("generation: 5 tokens, 0.100 s/token (10.00 tok/s)\n"
                       f"print_info: n_expert_used = {'1' * 50}\ufffd1\n", encoding="utf-8")
    with pytest.raises(NumberError, match=r"x\.out:2: n_expert_used=1+… \(50 digits\)"):
        read_console(capture)


def test_a_gap_of_2_to_the_64_minus_1_seconds_is_kept_as_written_not_rounded_up(tmp_path):
    (tmp_path / "idle-a.mem").write_text(f"-- idle {2 ** 64 - 1}s from turn 1 done --\nt=0 VmSwap: 1 kB VmRSS: 2 kB\n")
    assert read_gap_log(tmp_path / "idle-a.mem").idle_s == 2 ** 64 - 1
