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
# namespace (tests/results/test_output_paths.py). A write that wrongly blocks on a FIFO runs in a
# thread the test waits a bounded time for, then releases by opening the FIFO's other end.

def _chardev(path, major: int, minor: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node (mknod) needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def _bounded(call, release=None, timeout_s: float = 10.0):
    """call() in a thread: what it raised (None: returned), or "blocked" after timeout_s (then
    release() lets it finish)."""
    import threading

    got: list = []

    def run():
        try:
            call()
            got.append(None)
        except BaseException as e:            # handed to the test
            got.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if release is not None:
            release()
        thread.join(timeout_s)
        return "blocked"
    return got[0]


@pytest.mark.root("makes device nodes (mknod)")
def test_a_device_is_refused_never_written_nor_replaced(tmp_path):
    null, full = tmp_path / "null", tmp_path / "full"
    _chardev(null, 1, 3)
    _chardev(full, 1, 7)
    before = {p: os.lstat(p) for p in (null, full)}
    for node in (null, full):
        with pytest.raises(OSError) as info:
            atomic_write(node, "into the void\n", fsync=True, mode=0o755)
        assert info.value.filename == str(node) and "a character device, not a file" in info.value.strerror
    for p, st in before.items():
        now = os.lstat(p)
        assert stat.S_ISCHR(now.st_mode) and (now.st_ino, now.st_rdev) == (st.st_ino, st.st_rdev)
    assert sorted(os.listdir(tmp_path)) == ["full", "null"]          # no temporary file beside them


def test_a_fifo_is_refused_without_waiting_for_a_reader(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def release():                           # a reader, so a write that waited for one finishes
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)

    got = _bounded(lambda: atomic_write(fifo, "into the pipe\n"), release)
    assert isinstance(got, OSError), got
    assert got.filename == str(fifo) and "a named pipe (FIFO), not a file" in got.strerror
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_a_symlink_is_replaced_and_its_target_left_as_it_was(tmp_path):
    from engine.fsutil import replaced_link

    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(os.path.join("real", "target.json"))
    assert replaced_link(link) == os.path.join("real", "target.json")
    atomic_write(link, "new\n", tmp=str(link) + ".partial")
    assert not link.is_symlink() and link.read_text() == "new\n" and replaced_link(link) is None
    assert target.read_text() == "old"
    assert os.listdir(tmp_path / "real") == ["target.json"] and sorted(os.listdir(tmp_path)) == ["link.json", "real"]
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to("real/made.json")
    atomic_write(dangling, "made\n")
    assert not dangling.is_symlink() and dangling.read_text() == "made\n"
    assert not (tmp_path / "real" / "made.json").exists()


@pytest.mark.root("makes a device node (mknod)")
def test_a_symlink_to_a_device_is_replaced_the_device_untouched(tmp_path):
    null = tmp_path / "null"
    _chardev(null, 1, 3)
    before = os.lstat(null)
    link = tmp_path / "out"
    link.symlink_to(null)
    atomic_write(link, "a file\n")
    assert not link.is_symlink() and link.read_text() == "a file\n"
    assert (os.lstat(null).st_ino, os.lstat(null).st_rdev) == (before.st_ino, before.st_rdev)


def test_a_temporary_name_planted_as_a_symlink_is_not_followed(tmp_path):
    from engine.fsutil import temp_path

    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "out.json"
    os.symlink(victim, temp_path(out))          # someone else's link under the name the write will use
    atomic_write(out, "new\n")
    assert victim.read_text() == "keep" and out.read_text() == "new\n" and not out.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["out.json", "victim"]


def test_a_link_to_an_open_descriptor_is_written_through_and_a_readerless_pipe_refused(tmp_path):
    from engine.fsutil import names_open_file, replaced_link, write_target

    r, w = os.pipe()
    try:
        fd_link = tmp_path / "stdout"
        fd_link.symlink_to(f"/proc/self/fd/{w}")          # /dev/stdout's kind: a descriptor of ours
        assert names_open_file(fd_link) and names_open_file(f"/dev/fd/{w}") and replaced_link(fd_link) is None
        assert write_target(fd_link) == (str(fd_link), True)
        atomic_write(fd_link, "through\n")
        assert os.read(r, 100) == b"through\n" and fd_link.is_symlink()
        os.close(r)
        r = -1
        got = _bounded(lambda: atomic_write(f"/proc/self/fd/{w}", "nobody reads\n"))
        assert isinstance(got, OSError) and got.errno in (errno.EPIPE, errno.ENXIO), got   # an error, not a wait
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
    # another process's descriptors, and /proc's other files, are not stdout: a link there is replaced
    assert not names_open_file("/proc/1/fd/1") and not names_open_file("/proc/sys/vm/swappiness")
    sysctl = tmp_path / "swappiness"
    sysctl.symlink_to("/proc/sys/vm/swappiness")
    assert write_target(sysctl) == (str(sysctl), False) and replaced_link(sysctl) == "/proc/sys/vm/swappiness"
    assert write_target(tmp_path / "missing.json") == (str(tmp_path / "missing.json"), False)


def test_dash_is_stdout_and_a_folder_is_refused_not_replaced(tmp_path, capfd):
    from engine.fsutil import write_output

    write_output("-", "to stdout\n")
    assert capfd.readouterr().out == "to stdout\n" and not os.path.exists("-")
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError, match="a folder, not a file"):
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
