"""The one atomic file write: a temporary file beside the target, then os.replace.

Readers of the path see the old bytes or the new ones, never a half-written file, and a write
that fails (a full disk above all) leaves no temporary file behind. It lives in the engine
package because every layer writes files this way and the engine may import no other package
(it is shipped alone to phones as a zipapp); devices, results and harness import it from here.

What callers differ in is a parameter, not a copy: `fsync` (a campaign's records must survive
a power cut; a phone's thermal file need not), `mode` (executables get 0o755), `tmp` (a caller
whose temporary name others see, or clean up, keeps its own), `mkdir` (create the folder).

A path a user points a write at is not always a file to replace (docs/decisions/output-formats.md). Only a regular file,
or no file, gets the temporary file and the rename. A device, a FIFO or a socket (`/dev/full`,
`/dev/stdout` on a pipe or a terminal, a named pipe) is written through, never replaced. A
symlink is followed: its target is replaced atomically when it is a regular file or missing, and
written through otherwise; a link that passes through `/proc/*/fd` or `/dev/fd` (`/dev/stdout`)
always names an open file of this process and is written through. `write_output` adds `-` for
stdout.
"""

from __future__ import annotations

import contextlib
import os
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
        with open(tmp, "wb") as fh:
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
_OPEN_FILE_LINKS = ("/proc/", "/dev/fd/")
_MAX_LINKS = 40                      # the kernel's own limit on symlinks followed in one lookup


def _via_open_file_link(path: str) -> bool:
    """Whether following `path`'s symlinks passes through /proc/*/fd or /dev/fd (an open file)."""
    for _ in range(_MAX_LINKS):
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        if path.startswith(_OPEN_FILE_LINKS):
            return True
    return False


def write_target(path: str | os.PathLike) -> tuple[str, bool]:
    """Where a write of `path` goes: (the path, True) to write it through in place (a device, a
    FIFO, a socket, a folder — whose open then fails — or a link to an open file), or (the path
    to replace, False): `path` itself, or a symlink's resolved target, a regular file or none."""
    text = os.fspath(path)
    try:
        st = os.stat(text)                                       # follows symlinks
    except FileNotFoundError:
        st = None
    if (st is not None and not stat.S_ISREG(st.st_mode)) or _via_open_file_link(text):
        return text, True
    if os.path.islink(text):
        return os.path.realpath(text), False                     # a regular file, or a dangling link's target
    return text, False


def _write_through(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "wb", closefd=True) as fh:
        fh.write(data)
        fh.flush()


def atomic_write(path: str | os.PathLike, data: bytes | str, *, fsync: bool = False, mode: int | None = None,
                 tmp: str | os.PathLike | None = None, mkdir: bool = False) -> None:
    """Write `data` (str as UTF-8) to `path` atomically (a regular file or none; a symlink's such
    target), or through (a device, a FIFO …: `write_target`); an OSError names `path`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if mkdir:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    with naming(path):
        target, through = write_target(path)
        if through:
            _write_through(target, payload)
            return
        if target != os.fspath(path):
            tmp = None                                           # beside the link's target, not the link
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
