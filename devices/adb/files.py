"""Files on a phone: pushed only where the phone lacks the same bytes (atomic there), pulled whole
or not at all, hashed, stamped, sized and read by range."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Callable

from devices.adb.link import WORK_DIR, PhoneLink, int_or_none, lost_or_error
from devices.adb.server import TRANSPORT_ERRORS, AdbServer
from devices.base import (
    RANGE_ALIGN,
    DeviceError,
)
from devices.local import file_sha256
from engine.fsutil import replacing

SYNC_DATA_MAX = 64 * 1024
STAMP_DIR = "/data/local/tmp/.bmoe-sha256"     # PhoneFiles.stamped_sha256: what each pushed file hashed to
SHA256_SILENCE_S = 600.0    # remote_sha256's bound: a whole model read at ~10 MiB/s or better


def read_range_command(remote_path: str, offset: int, nbytes: int) -> str:
    """One shell line printing `nbytes` of a file from `offset` (a multiple of RANGE_ALIGN): `dd`
    where the phone has it (toolbox or toybox: every Android release), else toybox `xxd`, which
    seeks to the offset, with `xxd -r` turning its hex back into bytes (a toybox built without dd,
    as Debian's is on a virtual phone). pipefail keeps the first xxd's failure (a missing file)."""
    q = shlex.quote(remote_path)
    return (f"if command -v dd >/dev/null; then dd if={q} bs={RANGE_ALIGN} skip={offset // RANGE_ALIGN} "
            f"count={nbytes // RANGE_ALIGN} 2>/dev/null; "
            f"else set -o pipefail; xxd -s {offset} -l {nbytes} -p {q} | xxd -r -p; fi")


class _ChunkedReader:
    """A file whose read() ignores adbutils' 4 KiB request and returns up to 64 KiB (sync's
    maximum DATA size): an order of magnitude fewer round trips, and a progress hook."""

    def __init__(self, path: str, progress: Callable[[int, int], None] | None):
        self.fh = open(path, "rb")  # noqa: SIM115 - held across read() calls, closed by close()
        self.total = os.path.getsize(path)
        self.done = 0
        self.progress = progress

    def read(self, _n: int = -1) -> bytes:
        try:
            chunk = self.fh.read(SYNC_DATA_MAX)
        except OSError as e:    # this host's file, not the phone: not a lost device
            raise DeviceError(f"push: cannot read {self.fh.name}: {e.strerror or e}") from None
        self.done += len(chunk)
        if self.progress and chunk:
            self.progress(self.done, self.total)
        return chunk

    def close(self) -> None:
        self.fh.close()


class PhoneFiles(PhoneLink):
    """A phone's files, through its sync service and its shell."""

    def __init__(self, serial: str, server: AdbServer | None = None, work_dir: str = WORK_DIR):
        super().__init__(serial, server, work_dir)
        self._hash_cache: dict[tuple[str, int, int], str] = {}

    def _local_sha(self, path: str) -> str:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
        if key not in self._hash_cache:
            self._hash_cache[key] = file_sha256(path)
        return self._hash_cache[key]

    def remote_sha256(self, remote_path: str) -> str | None:
        """The sha256 of a file on the phone (None when it has none or no sha256sum)."""
        # silent while it reads the whole file: a GiB model on a slow phone's flash takes minutes
        status, out, _ = self.shell(f"sha256sum {shlex.quote(remote_path)} 2>/dev/null", timeout_s=SHA256_SILENCE_S)
        token = out.split()[0].decode() if status == 0 and out.split() else ""
        return token if re.fullmatch(r"[0-9a-f]{64}", token) else None

    def push(self, local_path: str, remote_path: str, progress: Callable[[int, int], None] | None = None) -> bool:
        """Push unless the phone already has a file of the same size and sha256; atomic on the phone."""
        if not os.path.isfile(local_path):
            raise DeviceError(f"push: {local_path}: no such file")
        size = os.path.getsize(local_path)
        try:
            remote = self._device.sync.stat(remote_path)
        except TRANSPORT_ERRORS as e:
            raise lost_or_error(self._device, self.server, "stat", e) from None
        if remote.size == size and remote.mode:
            local = self._local_sha(local_path)
            stamped = self.stamped_sha256(remote_path)
            if stamped == local:
                return False
            if stamped is None and self.remote_sha256(remote_path) == local:
                self._stamp(remote_path, local)
                return False
        folder = remote_path.rsplit("/", 1)[0] or "/"
        self.shell(f"mkdir -p {shlex.quote(folder)}")
        partial = remote_path + ".partial"
        reader = _ChunkedReader(local_path, progress)
        try:
            self._device.sync.push(reader, partial, mode=0o644)
        except TRANSPORT_ERRORS as e:
            raise lost_or_error(self._device, self.server, f"push of {local_path}", e) from None
        finally:
            reader.close()
        status, _, err = self.shell(f"mv -f {shlex.quote(partial)} {shlex.quote(remote_path)}")
        if status != 0:
            raise DeviceError(f"{self.serial}: push could not place {remote_path}: {err.decode(errors='replace')}")
        self._stamp(remote_path, self._local_sha(local_path))
        return True

    # A file's sha256 is kept on the phone (STAMP_DIR, one file per path: "size|mtime|inode sha256"),
    # so the next campaign's check of a model it already holds is one stat, not a whole read (a 60 GB
    # model's sha256sum takes a minute or more; a 1 GiB one on a 300 MiB/s virtual flash, 25 s). A
    # stamp counts only while the file's size, mtime (ns) and inode are the ones it recorded: a push
    # (a new inode) or any write (a new mtime) makes it stale and the file is hashed again. The
    # stamps live in a folder of their own, so no folder the user or the engine reads gains a file.
    @staticmethod
    def _stamp_path(remote_path: str) -> str:
        return f"{STAMP_DIR}/{hashlib.sha256(remote_path.encode()).hexdigest()[:32]}"

    @staticmethod
    def _file_key(remote_path: str) -> str:
        return f"stat -c '%s|%y|%i' -- {shlex.quote(remote_path)}"

    def stamped_sha256(self, remote_path: str) -> str | None:
        """The sha256 the file's stamp records while the stamp is the file's own (None otherwise)."""
        status, out, _ = self.shell(f"{self._file_key(remote_path)} 2>/dev/null && "
                                    f"cat -- {shlex.quote(self._stamp_path(remote_path))} 2>/dev/null")
        lines = out.decode(errors="replace").splitlines()
        if status != 0 or len(lines) != 2:
            return None
        key, _, sha = lines[1].rpartition(" ")
        return sha if key == lines[0] and key.count("|") == 2 and re.fullmatch(r"[0-9a-f]{64}", sha) else None

    def _stamp(self, remote_path: str, sha: str) -> None:
        """Record the file's sha256 in STAMP_DIR (atomically; a phone that refuses is only slower next time)."""
        stamp = self._stamp_path(remote_path)
        tmp = shlex.quote(stamp + ".partial")
        self.shell(f"mkdir -p {STAMP_DIR} && k=$({self._file_key(remote_path)}) && "
                   f"printf '%s %s\\n' \"$k\" {shlex.quote(sha)} > {tmp} && "
                   f"mv -f {tmp} {shlex.quote(stamp)}")

    def pull(self, remote_path: str, local_path: str) -> None:
        """Stream a phone's file into local_path (whole or not at all). The phone's errors and this
        host's are told apart: a write that fails here (a full disk) raises OSError as it is."""
        tmp = local_path + ".partial"
        chunks = self._device.sync.iter_content(remote_path)
        try:
            with replacing(local_path, tmp=tmp) as fh:
                while True:
                    try:
                        chunk = next(chunks, None)
                    except TRANSPORT_ERRORS as e:
                        raise lost_or_error(self._device, self.server, f"pull of {remote_path}", e) from None
                    if chunk is None:
                        break
                    try:
                        fh.write(chunk)
                    except OSError as e:     # this host's disk (full?): said as such, naming the file
                        raise OSError(e.errno, e.strerror, tmp) from None
        except BaseException:
            chunks.close()
            raise

    def file_size(self, remote_path: str) -> int | None:
        """A file's size on the phone in bytes (None when it is not there)."""
        # stat, not sync's STAT: that reply's size field is 32 bits, and models pass 4 GiB
        status, out, _ = self.shell(f"stat -L -c %s {shlex.quote(remote_path)} 2>/dev/null")
        size = int_or_none(out.decode("ascii", "replace").strip())
        return size if status == 0 else None

    def read_range(self, remote_path: str, offset: int, nbytes: int) -> bytes:
        """`nbytes` of a phone's file from `offset` (a multiple of RANGE_ALIGN), in one round trip."""
        if offset % RANGE_ALIGN or offset < 0 or nbytes < 0:
            raise DeviceError(f"read_range: offset {offset} is not a multiple of {RANGE_ALIGN}")
        if nbytes == 0:
            return b""
        blocks = -(-nbytes // RANGE_ALIGN)
        # the shell protocol keeps stdout binary-clean (no pty, no CRLF)
        status, out, err = self.shell(read_range_command(remote_path, offset, blocks * RANGE_ALIGN), timeout_s=300)
        if status != 0:
            raise DeviceError(f"{self.serial}: cannot read {remote_path} (exit status {status}): "
                              f"{err.decode('utf-8', 'replace').strip()[:200]}")
        return out[:nbytes]

