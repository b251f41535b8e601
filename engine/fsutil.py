"""The one atomic file write: a temporary file beside the target, then os.replace.

Readers of the path see the old bytes or the new ones, never a half-written file, and a write
that fails (a full disk above all) leaves no temporary file behind. It lives in the engine
package because every layer writes files this way and the engine may import no other package
(it is shipped alone to phones as a zipapp); devices, results and harness import it from here.

What callers differ in is a parameter, not a copy: `fsync` (a campaign's records must survive
a power cut; a phone's thermal file need not), `mode` (executables get 0o755), `tmp` (a caller
whose temporary name others see, or clean up, keeps its own), `mkdir` (create the folder).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
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


def atomic_write(path: str | os.PathLike, data: bytes | str, *, fsync: bool = False, mode: int | None = None,
                 tmp: str | os.PathLike | None = None, mkdir: bool = False) -> None:
    """Write `data` (str as UTF-8) to `path` atomically; an OSError names `path`."""
    if mkdir:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    with naming(path), replacing(path, fsync=fsync, mode=mode, tmp=tmp) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
