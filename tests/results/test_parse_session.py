"""results.read.parse_session: upstream's session captures (scripts/rewarm-ab.sh's .out/.mem pair, its
printed report, JSON lines of BMOE_DONE), read into turns shaped like a live session cell's."""

from __future__ import annotations

from pathlib import Path

import pytest

from results.read.parse_session import (
    ENGINE,
    JSONL,
    REPORT,
    find_sessions,
    gap_record,
    missing_notes,
    read_done_lines,
    read_gap_log,
    read_report,
    session_turns,
)
from results.read.parse_text import ParseError

SESSIONS = Path(__file__).resolve().parents[1] / "fixtures" / "sessions"
REAL = SESSIONS / "upstream-2026-07-15-rewarm"


def test_upstream_gap_logs_read_every_sample_with_the_reclaim_they_show():
    off, on = read_gap_log(REAL / "idle-off.mem"), read_gap_log(REAL / "idle-on.mem")
    assert off.idle_s == on.idle_s == 240.0
    assert [s.t_s for s in off.samples] == list(range(0, 240, 10))
    assert (off.samples[0].vm_swap_kb, off.samples[0].vm_rss_kb) == (337512, 3804932)
    gap_off, gap_on = gap_record(off), gap_record(on)
    # upstream's README: VmSwap 337 MiB -> 1.46 GiB, VmRSS 3.80 -> 1.69 GiB without rewarm; flat at 346 MiB with it
    assert (gap_off["vm_swap_min_kb"], gap_off["vm_swap_max_kb"]) == (337512, 1457640)
    assert (gap_off["vm_rss_min_kb"], gap_off["vm_rss_max_kb"]) == (1688452, 3804932)
    assert gap_on["vm_swap_max_kb"] == 346148 and gap_on["samples"] == 24
    assert gap_off["rss_file_min_kb"] is None and gap_off["start_t_s"] is None
    assert gap_off["series"][-1] == {"t_s": 230, "vm_swap_kb": 1457640, "vm_rss_kb": 1688452}


def test_a_report_of_two_runs_reads_as_two_sessions_with_their_flags_gap_and_cut_summaries():
    off, on = read_report(SESSIONS / "report" / "two-tags.txt")
    assert (off.kind, off.tag, off.pid, off.flags) == (REPORT, "off", "4242", "--no-rewarm --io-threads 2")
    assert on.tag == "on" and on.flags == ""
    # the script's sed cut the text off: the rest parses, the answer is not kept
    assert [d["tok_s"] for d in off.dones] == [1.454, 0.746]
    assert off.dones[1]["majflt_tok"] == 412.1 and "reasoning" not in off.dones[0]
    assert on.dones[0]["rewarm_s"] == 0.0
    assert off.gap is not None and [s.vm_swap_kb for s in off.gap.samples] == [337512, 757224, 1457640]
    assert on.gap is not None and (on.gap.samples[-1].vm_swap_kb, on.gap.samples[-1].vm_rss_kb) == (None, None)
    assert on.console is not None and any("rewarm" in line for line in on.console.lines)
    turns = session_turns(off)
    assert [t["outcome"] for t in turns] == ["done", "done"]
    assert turns[1]["s_per_token"] == round(1 / 0.746, 6) and turns[1]["majflt_per_tok"] == 412.1
    assert "gap" not in turns[0] and turns[1]["gap"]["vm_rss_min_kb"] == 1688452


def test_a_turn_the_script_never_saw_finish_is_unanswered():
    (cut,) = read_report(SESSIONS / "report" / "short.txt")
    assert cut.failures == ("turn 2 never finished",)
    assert [t["outcome"] for t in session_turns(cut)] == ["done", "unanswered"]


def test_json_lines_pair_with_their_gap_log_and_an_older_summary_leaves_its_missing_keys_null():
    found, taken = find_sessions(sorted((SESSIONS / "jsonl").iterdir()))
    (capture,) = found
    assert capture.kind == JSONL and capture.tag == "a"
    assert taken == {SESSIONS / "jsonl" / "turns-a.jsonl", SESSIONS / "jsonl" / "idle-a.mem"}
    turns = session_turns(capture)
    assert turns[0]["read_mib"] == 6599.6 and turns[1]["read_mib"] is None and turns[1]["tokens"] == 40
    assert turns[1]["gap"]["idle_s"] == 5.0 and turns[1]["gap"]["vm_rss_max_kb"] == 5000
    assert all(t["evictions"] is None and t["swap_in_mib"] is None for t in turns)
    notes = " ".join(missing_notes(capture, "x"))
    assert "read_mib" in notes and "evictions" in notes and "RssFile" in notes


def test_an_engine_capture_is_told_from_a_one_shot_progress_capture(tmp_path):
    engine = tmp_path / "rewarm-ab-x.out"
    engine.write_text('bmoe: expert streaming ON  n_expert=8 o_direct=1 io_threads=4 cache=4 MiB shards=1\n'
                      'BMOE_READY {"load_s":0.01,"arch":"qwen3moe","n_ctx":2048,"think_ctl":"template","n_expert_used":2}\n'
                      'BMOE_BEGIN {"id":1}\nBMOE_DONE {"id":1,"tokens":3,"tok_s":9.0,"text":"hi"}\nBMOE_BEGIN {"id":2}\n')
    one_shot = tmp_path / "plain.out"
    one_shot.write_text('BMOE_PROGRESS {"step":1,"steps":1,"delta_text":"-"}\ngeneration: 1 tokens, 0.1 s/token (10 tok/s)\n')
    found, taken = find_sessions([engine, one_shot])
    (capture,) = found
    assert capture.kind == ENGINE and taken == {engine}
    assert capture.ready is not None and capture.ready["arch"] == "qwen3moe"
    assert [t["outcome"] for t in session_turns(capture)] == ["done", "unanswered"]   # two BEGINs, one DONE


@pytest.mark.parametrize("name, text, message", [
    ("turns-b.jsonl", '{"id":1,"tokens":3,"tok_s":9.0}\n{"id":2,"tokens":3,"tok_s":9.\n',
     r"turns-b.jsonl:2: BMOE_DONE is not JSON \(cut short\?\)"),
    ("turns-c.jsonl", '{"id":1,"tokens":3}\nnot a summary\n', r"turns-c.jsonl:2: not a BMOE_DONE summary"),
    ("idle-d.mem", "-- idle 5s from turn 1 done --\nt=0 VmSwap:\t 1 kB VmRSS:\t 2 kB\nVmSwap: 3 kB\n",
     r"idle-d.mem:3: not a status sample"),
    ("idle-e.mem", "-- idle 5s from turn 1 done --\nt=0 VmSwap:\t 1 kB VmRSS:\t 2 kB\nt=10 VmSwap:\t 14",
     r"idle-e.mem:3: not a status sample"),
    ("idle-f.mem", "-- idle 5s from turn 1 done --\nt=0 VmSwap:\t 1 kB VmRSS:\t 2 kB\nt=10 VmSwap:\t 1 kB",
     r"idle-f.mem:3: the last line is cut short"),
    ("rewarm-ab-g.out", 'BMOE_READY {"load_s":0.01}\nBMOE_DONE {"id":1,"tokens":3,"tok_s":9.0,"text":"a',
     r"rewarm-ab-g.out:2: the last BMOE_DONE is cut short"),
    ("rewarm-ab-h.out", 'BMOE_READY {"load_s":0.01}\nBMOE_DONE {"id":1,"tokens":3,"tok_s":9.0,"te\nBMOE_BEGIN {"id":2}\n',
     r"rewarm-ab-h.out:2: BMOE_DONE is not JSON"),
    ("report.txt", "== z: engine pid 1, flags: \n== z turns:\nBMOE_DONE {\"id\":1}\nsomething else\n",
     r"report.txt:4: in the turns section, neither a BMOE_DONE nor a rewarm line"),
])
def test_bad_input_is_refused_naming_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    files = [path]
    if name.startswith("idle-"):   # a gap log is read when it has turns beside it
        (tmp_path / f"turns-{name[5:-4]}.jsonl").write_text('{"id":1,"tokens":1,"tok_s":1.0}\n')
        files.append(tmp_path / f"turns-{name[5:-4]}.jsonl")
    with pytest.raises(ParseError, match=message):
        find_sessions(files)


def test_a_gap_log_without_turns_is_refused(tmp_path):
    mem = tmp_path / "idle-x.mem"
    mem.write_text("-- idle 5s from turn 1 done --\nt=0 VmSwap:\t 1 kB VmRSS:\t 2 kB\n")
    with pytest.raises(ParseError, match=r"idle-x.mem: a gap log with no turns beside it"):
        find_sessions([mem])


def test_the_json_lines_reader_keeps_unknown_keys_and_stores_impossible_values_as_missing(tmp_path):
    path = tmp_path / "turns-k.jsonl"
    path.write_text('{"id":1,"tokens":3,"tok_s":-2.0,"history_dropped":4}\n{"id":2,"tokens":3,"tok_s":2.0}\n')
    capture = read_done_lines(path)
    assert capture.dones[0]["history_dropped"] == 4 and capture.dones[0]["tok_s"] is None
    assert any("turns-k.jsonl:1: tok_s=-2.0" in n for n in capture.notes)
    assert session_turns(capture)[0]["s_per_token"] is None
