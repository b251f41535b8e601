"""engine.fsutil: the one atomic write every layer uses."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from engine.fsutil import atomic_write, naming, replacing


def test_writes_bytes_and_text_and_replaces_what_was_there(tmp_path):
    path = tmp_path / "f.json"
    atomic_write(path, "é\n")
    assert path.read_bytes() == "é\n".encode()
    atomic_write(path, b"\x00\x01", fsync=True)
    assert path.read_bytes() == b"\x00\x01"
    assert os.listdir(tmp_path) == ["f.json"]           # no temporary file left behind


def test_mode_mkdir_and_a_given_temporary_name(tmp_path):
    path = tmp_path / "a" / "b" / "tool"
    atomic_write(path, "#!/bin/sh\n", mode=0o755, mkdir=True, tmp=str(path) + ".partial")
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert sorted(os.listdir(path.parent)) == ["tool"]


def test_a_failed_stream_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "pulled"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), replacing(path, tmp=str(path) + ".partial") as fh:
        fh.write(b"half of the new")
        raise RuntimeError("the phone went away")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["pulled"]


def test_an_error_without_a_file_name_names_the_file_written(tmp_path):
    with pytest.raises(OSError) as info, naming(tmp_path / "run.json"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "run.json")
    with pytest.raises(OSError) as info:
        atomic_write(tmp_path / "missing" / "x", "data")  # no mkdir: open fails, naming the file it opened
    assert "missing" in info.value.filename and not (tmp_path / "missing").exists()
