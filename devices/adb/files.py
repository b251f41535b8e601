"""Files on a phone: pushed only where the phone lacks the same bytes (atomic there, after a check
of the room it has, verified before use), pulled whole or not at all, hashed, stamped, sized and
read by range.

A push (PhoneFiles.push), in order:

1. One shell call reads the phone's copy: its size, mtime and inode (`stat -c`, 64-bit: sync's
   STAT v1 answers a 32-bit size, so a model of 4 GiB or more never matched and was pushed again
   every time; adbutils has no STAT v2), the sha256 stamp that copy was given (STAMP_DIR), a
   leftover `.partial`, and `df -k` of the folder. The same size and sha256 (stamped, else hashed on
   the phone and stamped) is no push at all.
2. Room: the folder's free space (`df`'s Available column; toybox shows the shell user f_bavail,
   toys/posix/df.c), plus the stale copy and the leftover `.partial` it replaces, must hold the
   file; else a PushRefused naming the phone, the file, the need and the free space.
3. The bytes go over the sync service's SEND (our own client, not adbutils': its push reads only the
   four bytes `FAIL`, never adbd's reason, and sends with send() instead of sendall()); a FAIL is
   read whole, and one that arrives mid-stream ends the send at once. A FAIL a retry cannot
   change (adbd's `couldn't create file: …` / `write failed: …` with ENOSPC, EDQUOT, EACCES,
   EPERM, EROFS, ENOTDIR, EISDIR, ENAMETOOLONG, EFBIG: packages/modules/adb
   daemon/file_sync_service.cpp `SendSyncFailErrno`) is a PushRefused, which the runner does not retry.
4. The `.partial` is verified on the phone (its size, and its sha256 where the phone has
   sha256sum) against the host file, then renamed into place and stamped. A mismatch is a
   DeviceError naming both sums; nothing is renamed.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import shlex
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from devices.adb.link import MARK, WORK_DIR, PhoneLink, int_or_none, lost_or_error, sections_of
from devices.adb.server import TRANSPORT_ERRORS, AdbServer
from devices.base import (
    RANGE_ALIGN,
    DeviceError,
    DeviceLost,
    PushRefused,
)
from devices.local import file_sha256
from engine.fsutil import replacing
from engine.safetext import one_line
from engine.units import KIB, MIB

SYNC_DATA_MAX = 64 * KIB
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


@dataclass(frozen=True)
class _RemoteCopy:
    """What a push found on the phone before sending (PhoneFiles._remote_copy)."""

    size: int | None                 # the copy's size in bytes (None: no copy)
    stamped_sha256: str | None       # its stamp's sha256, while the stamp is the copy's own
    partial_size: int | None         # a leftover `.partial`'s size
    free_bytes: int | None           # free space of its folder (None: df said nothing readable)
    key: str = ""                    # the copy's "size|mtime|inode" as read (PhoneFiles._file_key)


# adbd's sync FAIL answers that another try cannot change (strerror's text, bionic's and glibc's:
# "Quota exceeded" / "Disk quota exceeded" are EDQUOT)
_FINAL_FAIL = re.compile(r"No space left on device|[Qq]uota exceeded|Permission denied|Operation not permitted|"
                         r"Read-only file system|Not a directory|Is a directory|File name too long|File too large")


def recv_exactly(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"Expected {n} bytes, got {len(buf)}")
        buf += chunk
    return buf


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:,.1f} MiB"


_DF_UNITS = {"1k-blocks": 1024, "1024-blocks": 1024, "512-blocks": 512}
_HUMAN = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)B?", re.I)


def parse_df_free(text: str) -> int | None:
    """The free bytes `df -k FOLDER` printed (the last row's Available). Toybox (Android 6+):
    `Filesystem 1K-blocks Used Available Use% Mounted on`, the unit in the header (1K-, 1024- or
    512-blocks, toys/posix/df.c), Available being the column before the `N%` one (a mount point may
    hold spaces); toolbox before it: `Filesystem Size Used Free Blksize` with `12.5G`-style sizes.
    None when neither."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    header, row = lines[0].split(), lines[-1].split()
    names = [h.lower() for h in header]
    if "free" in names and "blksize" in names and len(row) > names.index("free"):   # toolbox
        m = _HUMAN.fullmatch(row[names.index("free")])
        return int(float(m[1]) * 1024 ** (" KMGTP".index(m[2].upper()) if m[2] else 0)) if m else None
    unit = next((_DF_UNITS[n] for n in names if n in _DF_UNITS), None)
    pct = next((i for i, f in enumerate(row) if re.fullmatch(r"[0-9]{1,3}%", f)), None)
    if unit is None or pct is None or pct < 1:
        return None
    avail = int_or_none(row[pct - 1])
    return None if avail is None else avail * unit


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
        """Push unless the phone already has a file of the same size and sha256 (module docstring:
        the room checked first, the copy verified before it is renamed into place); False when
        nothing was sent. PushRefused when the phone refuses for good (no room, no permission)."""
        if not os.path.isfile(local_path):
            raise DeviceError(f"push: {local_path}: no such file")
        size = os.path.getsize(local_path)
        folder = remote_path.rsplit("/", 1)[0] or "/"
        partial = remote_path + ".partial"
        have = self._remote_copy(remote_path, partial, folder)
        if have.size == size:
            local = self._local_sha(local_path)
            if have.stamped_sha256 == local:
                return False
            if have.stamped_sha256 is None and self.remote_sha256(remote_path) == local:
                self._stamp(remote_path, local)
                return False
        if have.free_bytes is not None:
            room = have.free_bytes + (have.size or 0) + (have.partial_size or 0)   # both go before the push
            if room < size:
                raise PushRefused(f"{self.serial}: no room for {os.path.basename(local_path)} in {folder}: it needs "
                                  f"{_mib(size)}, the phone has {_mib(have.free_bytes)} free there"
                                  + (f" (+{_mib(room - have.free_bytes)} of the copy it replaces)"
                                     if room > have.free_bytes else ""))
        # a leftover partial and the stale copy (not these bytes) go first: their room is the push's.
        # The copy only while it is the file looked at (its size, mtime and inode), never a newer one
        stale = (f"; [ \"$({self._file_key(remote_path)} 2>/dev/null)\" = {shlex.quote(have.key)} ] && "
                 f"rm -f -- {shlex.quote(remote_path)}") if have.key else ""
        self.shell(f"mkdir -p -- {shlex.quote(folder)}; rm -f -- {shlex.quote(partial)}{stale}")
        self.send_file(local_path, partial, progress)
        self.verify_copy(local_path, partial)
        status, _, err = self.shell(f"mv -f -- {shlex.quote(partial)} {shlex.quote(remote_path)}")
        if status != 0:
            raise DeviceError(f"{self.serial}: push could not place {remote_path}: {err.decode(errors='replace')}")
        self._stamp(remote_path, self._local_sha(local_path))
        return True

    def _remote_copy(self, remote_path: str, partial: str, folder: str) -> _RemoteCopy:
        """What the phone holds at `remote_path` (size, its stamp), at `partial`, and the free space of
        `folder` (or of its nearest existing parent), in one shell call."""
        q_folder = shlex.quote(folder)
        text = self._text(
            f"{self._file_key(remote_path)} 2>/dev/null && cat -- {shlex.quote(self._stamp_path(remote_path))} "
            f"2>/dev/null; echo {MARK}PARTIAL; stat -c %s -- {shlex.quote(partial)} 2>/dev/null; "
            f"echo {MARK}DF; d={q_folder}; while [ ! -d \"$d\" ]; do d=${{d%/*}}; [ -n \"$d\" ] || d=/; done; "
            "df -k \"$d\" 2>/dev/null")
        parts = sections_of(text)
        lines = parts.get("", "").splitlines()
        key = lines[0].split("|") if lines else []
        size = int_or_none(key[0]) if len(key) == 3 else None
        stamped = None
        if size is not None and len(lines) >= 2:
            stamp_key, _, sha = lines[1].rpartition(" ")
            stamped = sha if stamp_key == lines[0] and re.fullmatch(r"[0-9a-f]{64}", sha) else None
        return _RemoteCopy(size, stamped, int_or_none(parts.get("PARTIAL", "").strip()),
                           parse_df_free(parts.get("DF", "")), lines[0] if size is not None else "")

    def send_file(self, local_path: str, remote_path: str, progress: Callable[[int, int], None] | None = None) -> int:
        """The sync service's SEND of a host file to `remote_path` (mode 0644; the bytes sent are
        returned). adbd's FAIL is read whole, also one that comes mid-stream (it then ends the
        send); PushRefused when a retry cannot change it, DeviceError for any other."""
        what = f"push of {os.path.basename(local_path)}"
        reader = _ChunkedReader(local_path, progress)
        conn = None
        sent = 0
        try:
            conn = self._device.open_transport(timeout=self.device_timeout_s)
            conn.send_command("sync:")
            conn.check_okay()
            sock = conn.conn
            spec = f"{remote_path},{0o100644}".encode()       # S_IFREG | 0644, as `adb push` sends it
            sock.sendall(b"SEND" + struct.pack("<I", len(spec)) + spec)
            while True:
                chunk = reader.read()
                if not chunk:
                    break
                sock.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
                sent += len(chunk)
                if select.select([sock], [], [], 0)[0]:     # adbd answers before DONE only to refuse
                    break
            if not select.select([sock], [], [], 0)[0]:
                sock.sendall(b"DONE" + struct.pack("<I", int(time.time())))
            reply = recv_exactly(sock, 8)
            if reply[:4] == b"OKAY":
                return sent
            if reply[:4] != b"FAIL":
                raise DeviceLost(f"{self.serial}: device lost during {what} (sync answered {reply[:4]!r})")
            reason = recv_exactly(sock, min(struct.unpack("<I", reply[4:])[0], 4096)).decode("utf-8", "replace")
        except TRANSPORT_ERRORS as e:
            raise lost_or_error(self._device, self.server, what, e) from None
        finally:
            reader.close()
            if conn is not None:
                conn.close()
        reason = one_line(reason, 200)
        where = f"{self.serial}: {what} to {remote_path} refused: {reason}"
        if _FINAL_FAIL.search(reason):
            raise PushRefused(f"{where} (not retried: another try cannot change it)")
        raise DeviceError(where)

    def verify_copy(self, local_path: str, remote_path: str) -> None:
        """The pushed copy's size, and its sha256 where the phone has sha256sum, against the host
        file's; a mismatch removes the copy and raises DeviceError naming both."""
        size, sha = os.path.getsize(local_path), self._local_sha(local_path)
        q = shlex.quote(remote_path)
        status, out, _ = self.shell(f"stat -c %s -- {q} && {{ sha256sum -- {q} 2>/dev/null || echo none; }}",
                                    timeout_s=SHA256_SILENCE_S)
        lines = out.decode("utf-8", "replace").split()
        got_size = int_or_none(lines[0]) if status == 0 and lines else None
        got_sha = lines[1] if len(lines) >= 2 and re.fullmatch(r"[0-9a-f]{64}", lines[1]) else None
        if got_size == size and (got_sha == sha or (got_sha is None and lines[1:2] == ["none"])):
            return                  # the same bytes (or the same size, on a phone without sha256sum)
        self.shell(f"rm -f -- {q}")
        said = f"{got_size} bytes" if got_size is not None else "no file"
        if got_sha is not None:
            said += f", sha256 {got_sha}"
        raise DeviceError(f"{self.serial}: the phone's copy of {os.path.basename(local_path)} is not the file sent "
                          f"({remote_path}: {said}; this host's: {size} bytes, sha256 {sha}); removed, nothing used")

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

