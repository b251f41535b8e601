"""Progress output: on a terminal one rich line per device, fitted to the terminal's width; in a
pipe or a log one plain line per event, no control characters (tests and logs parse them)."""

from __future__ import annotations

import io
import re

from click.testing import CliRunner
from rich.cells import cell_len
from rich.console import Console

from harness.cli.main import _ProgressLine
from harness.run.progress import Progress

# what rich writes to move and colour: SGR, cursor up, erase line, cursor hide/show
_RICH_CONTROL = re.compile(r"\x1b\[(?:\?25[lh]|[0-9;]*m|[0-9]*[AK])")
LONG_PHONE = "virtual:pixel-9-pro-xl-with-a-name-far-longer-than-any-terminal-column-budget-allows"


def _terminal(width: int) -> tuple[Console, io.StringIO]:
    screen = io.StringIO()
    return Console(file=screen, width=width, force_terminal=True), screen


def _drawn_lines(screen: str) -> list[str]:
    """Every line the terminal shows at some point: rich's control sequences removed, split at the
    newlines and carriage returns that end a drawing."""
    plain = _RICH_CONTROL.sub("", screen)
    assert "\x1b" not in plain, f"a control sequence besides rich's own: {plain!r}"
    return [line for line in re.split(r"[\r\n]", plain) if line]


def _last_drawing(screen: str, n_devices: int) -> list[str]:
    return _drawn_lines(screen)[-n_devices:]


def _campaign_events(p: Progress) -> None:
    p.start_cell("local", "qwen3-30b 0 MiB warm r0", 1)
    p.end_cell("local", "qwen3-30b 0 MiB warm r0", "ok", 2.0)
    p.start_cell(LONG_PHONE, "qwen3-30b cycle*1.2 = 1843 MiB anon r0 " + "with a very long label " * 4, 2)
    p.note(LONG_PHONE, "gate: waiting for the CPU to cool under 40.0 °C (now 47.5 °C) and MemAvailable over 512 MiB")
    p.end_cell(LONG_PHONE, "qwen3-30b cycle*1.2 = 1843 MiB anon r0", "lmk_killed", 1.0)
    p.start_cell(LONG_PHONE, "qwen3-30b auto anon r0", 1)


def test_each_device_line_fits_an_80_column_terminal_and_keeps_name_and_count():
    console, screen = _terminal(80)
    p = Progress({"local": 2, LONG_PHONE: 3}, console=console)
    _campaign_events(p)
    p.close()
    lines = _drawn_lines(screen.getvalue())
    assert len(lines) >= 8                                      # redrawn on each of the 6 events
    too_wide = [line for line in lines if cell_len(line) > 80]
    assert not too_wide, too_wide
    local, phone = _last_drawing(screen.getvalue(), 2)
    assert local.startswith("local ") and " 1/2 " in local and "ok 1 ETA 2s" in local
    # the long name is cut with an ellipsis; its count, outcome and what runs now stay on the line
    assert phone.startswith("virtual:pixel-9-pro") and "…" in phone.split()[0]
    assert " 1/3 " in phone and "lmk_killed 1" in phone and " qwen3-30b " in phone
    # one drawing per event, in place: the block moves the cursor up over the previous one
    assert screen.getvalue().count("\x1b[1A") >= 5


def test_a_device_with_every_cell_done_shows_idle_then_why_it_finished():
    console, screen = _terminal(80)
    p = Progress({"local": 1, "virtual:a": 2}, console=console)
    p.start_cell("local", "m 0 MiB r0", 1)
    p.end_cell("local", "m 0 MiB r0", "ok", 2.0)
    assert _last_drawing(screen.getvalue(), 2)[0].split()[1:] == ["━" * 12, "1/1", "idle", "|", "ok", "1", "ETA", "0s"]
    p.finish_device("local", "done")
    p.start_cell("virtual:a", "m auto r0", 1)
    p.close()
    local, phone = _last_drawing(screen.getvalue(), 2)
    assert " 1/1 done | ok 1 ETA 0s" in local and " 0/2 m auto r0 | no results yet" in phone
    assert screen.getvalue().endswith("\x1b[?25h")                 # the cursor is shown again


def test_lines_follow_the_terminal_width():
    """A narrow terminal: no bar, the label cut harder, still within the width."""
    for width in (40, 120):
        console, screen = _terminal(width)
        p = Progress({"local": 2, LONG_PHONE: 3}, console=console)
        _campaign_events(p)
        p.close()
        lines = _drawn_lines(screen.getvalue())
        assert max(cell_len(line) for line in lines) <= width
        local, phone = _last_drawing(screen.getvalue(), 2)
        assert "local" in local and "1/2" in local and "1/3" in phone
        assert ("━" in local) == (width >= 60)
    # the wide terminal shows what the narrow one cut
    assert "qwen3-30b auto anon r0" in phone and LONG_PHONE[:35] in phone


def test_a_pipe_or_log_gets_one_plain_line_per_event():
    log = io.StringIO()
    p = Progress({"local": 2, LONG_PHONE: 3}, log, tty=False)
    _campaign_events(p)
    p.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 6 and not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", log.getvalue())
    assert re.fullmatch(r"\d\d:\d\d:\d\d local: start qwen3-30b 0 MiB warm r0 \[0/2\]", lines[0])
    assert lines[1].endswith("local: qwen3-30b 0 MiB warm r0 -> ok (2.0 s) [1/2 ok=1 ETA 2s]")
    assert lines[2].endswith(f"{LONG_PHONE}: start qwen3-30b cycle*1.2 = 1843 MiB anon r0 "
                             + "with a very long label " * 4 + " (attempt 2) [0/3]")
    assert lines[4].endswith(f"{LONG_PHONE}: qwen3-30b cycle*1.2 = 1843 MiB anon r0 -> lmk_killed (1.0 s) "
                             "[1/3 lmk_killed=1 ETA 2s]")
    # a stream that is no terminal gets the log without being told
    p = Progress({"local": 1}, io.StringIO())
    assert p.tty is False


def test_the_synth_line_fits_the_terminal_and_is_plain_in_a_pipe():
    label = "writing /data/models/" + "deep/" * 30 + "m.gguf"
    console, screen = _terminal(80)
    line = _ProgressLine(label, console)
    for mib in range(0, 101, 5):
        line(mib << 20, 100 << 20)
    line.done()
    drawn = _drawn_lines(screen.getvalue())
    assert len(drawn) == 21 and max(cell_len(d) for d in drawn) < 80     # off the last column
    assert drawn[-1].startswith("writing /data/models/deep/") and drawn[-1].endswith(" 100 / 100 MiB (100%)")
    assert screen.getvalue().endswith("\n")
    # not a terminal: a line at each quarter, nothing else
    plain = io.StringIO()
    line = _ProgressLine("writing m.gguf", Console(file=plain, width=80))
    for mib in range(0, 101, 5):
        line(mib << 20, 100 << 20)
    line.done()
    assert plain.getvalue().splitlines() == [f"writing m.gguf: {p} / 100 MiB ({p}%)" for p in (0, 25, 50, 75, 100)]


def test_model_synth_through_the_cli_logs_plain_progress_lines(tmp_path, cli):
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(cli, ["model", "synth", str(out), "--preset", "qwen3moe", "--layers", "2",
                                      "--experts", "4", "--top-k", "2", "--hidden", "64", "--expert-ffn", "32",
                                      "--vocab", "260"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith(f"writing {out}: ")]
    assert progress and progress[-1].endswith("(100%)") and "\x1b" not in result.stderr
