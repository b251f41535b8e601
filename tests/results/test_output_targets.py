"""Where every command's `-o` (and `replay --csv`) writes (docs/decisions/output-formats.md): a FIFO
or a device is refused in one line, at once, and left as it was; a symlink is replaced by the
output, its target left as it was, and the line that says where the output went says so.

The FIFO commands run in a thread with a bounded wait: a command that waits for a reader is given
one at the bound (so it ends) and fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import stat
import threading

from click.testing import CliRunner

from tests.results.conftest import UPSTREAM

TRACE = UPSTREAM / "2026-07-15-route-trace" / "gptoss.route.csv"
WAIT_S = 60


def _commands(campaign, out: str) -> dict[str, list[str]]:
    return {"table": ["table", str(campaign), "--format", "md", "-o", out],
            "recommend": ["recommend", str(campaign), "--format", "json", "-o", out],
            "compare": ["compare", str(campaign), str(campaign), "--format", "csv", "-o", out],
            "community": ["report", str(campaign), "--format", "community", "-o", out],
            "replay": ["replay", str(TRACE), "--csv", out]}


def test_a_fifo_named_by_o_is_refused_at_once_in_one_line(imported, cli, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for name, args in _commands(imported, str(fifo)).items():
        got: list = []
        thread = threading.Thread(target=lambda a=args, g=got: g.append(CliRunner().invoke(cli, a)), daemon=True)
        thread.start()
        thread.join(WAIT_S)
        if thread.is_alive():                # waiting for a reader: give it one, so the thread ends
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            thread.join(WAIT_S)
            raise AssertionError(f"{name} waited for a reader of {fifo}")
        (result,) = got
        assert result.exit_code == 1, (name, result.output)
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: ") and str(fifo) in line and "a named pipe (FIFO), not a file" in line, line
        assert "or - for stdout" in line, line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_a_symlink_named_by_o_is_replaced_and_its_target_kept(imported, cli, tmp_path):
    runner = CliRunner()
    real = tmp_path / "real"
    real.mkdir()
    for name, args in _commands(imported, "").items():
        target = real / f"{name}.out"
        target.write_text("kept\n")
        link = tmp_path / f"{name}.link"
        link.symlink_to(os.path.join("real", target.name))
        args[-1] = str(link)
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, (name, result.output)
        assert not link.is_symlink() and link.stat().st_size > 100, name
        assert target.read_text() == "kept\n", name
        if name != "replay":                # replay prints its report, not a line about the CSV
            assert result.stdout.strip().endswith(
                f"{link} (a file now: it was a symlink to real/{target.name}, left as it was)"), result.stdout
    assert json.loads((tmp_path / "recommend.link").read_text())["format"] == "bmoe-fleet.recommendations"
    assert sorted(os.listdir(real)) == sorted(f"{n}.out" for n in _commands(imported, ""))


def test_a_device_named_by_o_is_refused(imported, cli):
    result = CliRunner().invoke(cli, ["recommend", str(imported), "--format", "json", "-o", "/dev/null"])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line == "Error: /dev/null: cannot write: is a character device, not a file: give a file name, or - for " \
                   "stdout"
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_a_site_named_through_a_symlink_replaces_the_link_not_its_target(imported, cli, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("not a site\n")
    link = tmp_path / "site"
    link.symlink_to("elsewhere")
    result = CliRunner().invoke(cli, ["report", str(imported), "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert not link.is_symlink() and (link / "index.html").is_file()
    assert os.listdir(elsewhere) == ["mine.txt"]
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "site"]        # no temporary folder left
