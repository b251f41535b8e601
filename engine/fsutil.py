"""The one atomic file write: a temporary file beside the target, then os.replace.

Readers of the path see the old bytes or the new ones, never a half-written file, and a write
that fails (a full disk above all) leaves no temporary file behind. It lives in the engine
package because every layer writes files this way and the engine may import no other package
(it is shipped alone to phones as a zipapp); devices, results and harness import it from here.

What callers differ in is a parameter, not a copy: `fsync` (a campaign's records must survive
a power cut; a phone's thermal file need not), `mode` (executables get 0o755), `tmp` (a caller
whose temporary name others see, or clean up, keeps its own), `mkdir` (create the folder).

A path a write is pointed at is not always a file to replace (docs/decisions/output-formats.md).
`atomic_write` writes the path it is given, nothing else: a regular file or no file gets the
temporary file and the rename, and so does a symlink, which the rename replaces (its target is
left as it was: a link never carries a write somewhere else). A FIFO, a device, a socket or a
folder is refused, in one line (an OSError naming the path): a FIFO with no reader would block the
write forever, and a device is no output file (`-o /dev/sda`). The one exception is stdout's kind:
a path naming an open descriptor of this process (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`,
or a link that leads there) is written through, opened without blocking (a pipe with no reader
is an error, not a hang). `write_output` adds `-` for stdout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def temp_path(path: str | os.PathLike) -> str:
    """The default temporary name: hidden, beside the target, unique per process and thread, so
    two writers of one path never share a temporary file."""
    head, name = os.path.split(os.fspath(path))
    return os.path.join(head, f".{name}.tmp-{os.getpid()}-{threading.get_ident()}")


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """An OSError inside names the file written: `path` (a failed write() or fsync() names no
    file by itself), or a copy's target (a copy names its source first)."""
    try:
        yield
    except OSError as e:
        if e.filename is None or e.filename2 is not None:
            raise OSError(e.errno, e.strerror, str(e.filename2 or path)) from None
        raise


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, fsync: bool = False, mode: int | None = None,
              tmp: str | os.PathLike | None = None) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new bytes into (streamed, for copies and pulls); it replaces
    `path` when the block ends without an error and is removed when it does not."""
    tmp = os.fspath(tmp) if tmp is not None else temp_path(path)
    try:
        # a new file of our own, never one planted under the temporary name (a symlink): O_EXCL
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with open(fd, "wb") as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


STDOUT = "-"
_MAX_LINKS = 40                      # the kernel's own limit on symlinks followed in one lookup
_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _fd_link_re() -> re.Pattern[str]:
    # this process's descriptors: /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N, /proc/PID/fd/N
    return re.compile(rf"/dev/fd/[0-9]+|/proc/(?:self|thread-self|{os.getpid()})/fd/[0-9]+", re.ASCII)


def names_open_file(path: str | os.PathLike) -> bool:
    """Whether `path`, or a symlink on the way to its file, is one of this process's descriptors
    (`/dev/stdout` is a link to /proc/self/fd/1): stdout's kind of output, written through."""
    fd_link = _fd_link_re()
    text = os.path.abspath(os.fspath(path))
    for _ in range(_MAX_LINKS):
        if fd_link.fullmatch(os.path.normpath(text)):
            return True
        try:
            to = os.readlink(text)
        except OSError:                                          # no link, or not ours to read
            return False
        text = os.path.normpath(os.path.join(os.path.dirname(text), to))
    return False


def replaced_link(path: str | os.PathLike) -> str | None:
    """What the symlink `path` points to when a write of `path` replaces the link (it is not a
    descriptor's link), else None: for the line that says where a write went."""
    text = os.fspath(path)
    if text == STDOUT or not os.path.islink(text) or names_open_file(text):
        return None
    return os.readlink(text)


def write_target(path: str | os.PathLike) -> tuple[str, bool]:
    """Where a write of `path` goes: (the path, True) to write it through (one of this process's
    descriptors: names_open_file), or (the path, False) to replace by a rename (a regular file, a
    symlink, or nothing there). Anything else raises an OSError naming it, with the reason."""
    text = os.fspath(path)
    if names_open_file(text):
        return text, True
    try:
        st = os.lstat(text)                                      # the name itself: a link is replaced
    except FileNotFoundError:
        return text, False
    for is_kind, what in _KINDS:
        if is_kind(st.st_mode):
            raise OSError(errno.EISDIR if what == "a folder" else errno.EINVAL,
                          f"is {what}, not a file: give a file name, or - for stdout", text)
    return text, False


def _write_through(path: str, data: bytes) -> None:
    # O_NONBLOCK: opening a pipe with no reader fails (ENXIO) instead of waiting for one forever
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | nonblock | getattr(os, "O_CLOEXEC", 0))
    if nonblock:
        os.set_blocking(fd, True)                                # writes wait for a slow reader
    with open(fd, "wb", closefd=True) as fh:
        fh.write(data)
        fh.flush()


def atomic_write(path: str | os.PathLike, data: bytes | str, *, fsync: bool = False, mode: int | None = None,
                 tmp: str | os.PathLike | None = None, mkdir: bool = False) -> None:
    """Write `data` (str as UTF-8) to `path` atomically (a regular file, a symlink or nothing
    there, replaced), through (one of this process's descriptors), or not at all (a FIFO, a
    device …: an OSError naming `path`; see `write_target`)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if mkdir:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    with naming(path):
        target, through = write_target(path)
        if through:
            _write_through(target, payload)
            return
        with replacing(target, fsync=fsync, mode=mode, tmp=tmp) as fh:
            fh.write(payload)


def write_output(path: str | os.PathLike, data: bytes | str, *, mkdir: bool = False) -> None:
    """A file a user named on a command line: `-` is stdout; anything else is `atomic_write`."""
    if os.fspath(path) == STDOUT:
        sys.stdout.flush()
        sys.stdout.buffer.write(data.encode("utf-8") if isinstance(data, str) else data)
        sys.stdout.buffer.flush()
        return
    atomic_write(path, data, mkdir=mkdir)


def fleet_home() -> Path:
    """Where bmoe-fleet keeps its own state on this host (locks, staged engines, adb-server
    records, virtual phones, the local device's work folder): $BMOE_FLEET_HOME, else ~/.bmoe-fleet."""
    return Path(os.environ.get("BMOE_FLEET_HOME") or Path.home() / ".bmoe-fleet")
