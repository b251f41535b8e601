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


# ---- writes go where a user points them (docs/decisions/output-formats.md) -----------------------------------
# Device nodes are made in tmp_path (mknod, as root), so a write that wrongly replaced one replaces
# a scratch node, never the host's /dev; the real /dev paths are tested in a private mount
# namespace (tests/results/test_output_paths.py).

def _chardev(path, major: int, minor: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node (mknod) needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


@pytest.mark.root("makes device nodes (mknod)")
def test_a_device_is_written_through_never_replaced(tmp_path):
    null, full = tmp_path / "null", tmp_path / "full"
    _chardev(null, 1, 3)
    _chardev(full, 1, 7)
    before = {p: os.lstat(p) for p in (null, full)}
    atomic_write(null, "into the void\n", fsync=True, mode=0o755)
    with pytest.raises(OSError) as info:
        atomic_write(full, b"x" * 10)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(full)
    for p, st in before.items():
        now = os.lstat(p)
        assert stat.S_ISCHR(now.st_mode) and (now.st_ino, now.st_rdev) == (st.st_ino, st.st_rdev)
    assert sorted(os.listdir(tmp_path)) == ["full", "null"]          # no temporary file beside them


def test_a_fifo_is_written_through_to_its_reader(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert got == [b"through the pipe\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_to_a_file_replaces_the_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(os.path.join("real", "target.json"))
    atomic_write(link, "new\n", tmp=str(link) + ".partial")
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "target.json")
    assert target.read_text() == "new\n"
    assert os.listdir(tmp_path / "real") == ["target.json"] and sorted(os.listdir(tmp_path)) == ["link.json", "real"]
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to("real/made.json")
    atomic_write(dangling, "made\n")
    assert dangling.is_symlink() and (tmp_path / "real" / "made.json").read_text() == "made\n"


@pytest.mark.root("makes a device node (mknod)")
def test_a_symlink_to_a_device_or_an_open_file_is_written_through(tmp_path, capfd):
    null = tmp_path / "null"
    _chardev(null, 1, 3)
    link = tmp_path / "out"
    link.symlink_to(null)
    atomic_write(link, "gone\n")
    assert link.is_symlink() and stat.S_ISCHR(os.lstat(null).st_mode)
    from engine.fsutil import write_target

    # /dev/stdout-like: a link through /proc/self/fd names an open file, whatever it is
    fd_link = tmp_path / "stdout"
    fd_link.symlink_to("/proc/self/fd/1")
    assert write_target(fd_link) == (str(fd_link), True)
    assert write_target(tmp_path / "missing.json") == (str(tmp_path / "missing.json"), False)


def test_dash_is_stdout_and_a_folder_is_refused_not_replaced(tmp_path, capfd):
    from engine.fsutil import write_output

    write_output("-", "to stdout\n")
    assert capfd.readouterr().out == "to stdout\n" and not os.path.exists("-")
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        write_output(tmp_path / "folder", "x")
    assert (tmp_path / "folder").is_dir()


def test_only_a_full_disk_is_told_to_free_space():
    from harness.run.errors import disk_error

    full = str(disk_error(OSError(errno.ENOSPC, "No space left on device", "/x/run.json")))
    assert full == ("/x/run.json: no space left on device; nothing half-written was kept: free space and rerun "
                    "to resume")
    for code, text in ((errno.EPERM, "Operation not permitted"), (errno.EROFS, "Read-only file system")):
        line = str(disk_error(OSError(code, text, "/x/run.json")))
        assert "free space" not in line and text.lower() in line and "fix it" in line, line
