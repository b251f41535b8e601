"""The `sync:` service (adb push/pull/ls/stat) on the phone's folder as its `/`, as the shell user.

Wire format (AOSP file_sync_protocol.h, daemon/file_sync_service.cpp): requests are
{u32 id, u32 path_length <= 1024, path}. STAT -> {STAT, mode, size, mtime} (zeros when missing);
STA2/LST2 -> sync_stat_v2 (errno in `error`); LIST/LIS2 -> DENT/DNT2 entries then a zeroed entry
with id DONE; SEND "path,mode" -> DATA {u32 size <= 64 KiB, bytes}... DONE {mtime} -> OKAY/FAIL;
RECV -> DATA... DONE; QUIT ends the session. A request arrives split across WRTE payloads however
the server likes, so this reads a byte stream, not packets. Any FAIL ends the session, as in adbd.

Refusals are adbd's: paths are walked with the phone's folder as `/` (`..` stops there, absolute
symlinks restart there), files are touched as the shell user (setfsuid), and what that user may not
do fails the way it fails on a phone: STAT/STA2/LST2 answer zeros or the errno, LIST answers no
entries, only RECV and SEND answer FAIL ("open failed: …", "couldn't create file: …"). A FAIL to a
stat request is a protocol fault to the adb client (it aborts), so none is ever sent there.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import stat as statmod
import struct
from pathlib import Path
from typing import NoReturn

from .adbd import Stream

log = logging.getLogger("bmoe.vphone.sync")

SYNC_DATA_MAX = 64 * 1024
MAX_PATH = 1024
REQUEST = struct.Struct("<4sI")
STAT_V1 = struct.Struct("<4sIII")
STAT_V2 = struct.Struct("<4sIQQIIIIQqqq")
DENT_V1 = struct.Struct("<4sIIII")
DENT_V2 = struct.Struct("<4sIQQIIIIQqqqI")
DATA = struct.Struct("<4sI")


MAX_SYMLINKS = 40          # the kernel's limit (ELOOP)
HIDDEN_TOP = ".vphone"     # the daemon's own folder inside the phone's: not part of the phone


class SyncEnd(Exception):
    """The session is over (QUIT, a FAIL sent, or the peer closed the stream)."""


def resolve(root: Path, remote: str, follow_last: bool = True) -> Path:
    """The host path of a phone path, walked as the kernel walks it with the phone's folder `root`
    as `/` (a /proc/self/fd/N path of the folder, so the host folders above it need not be
    searchable by the shell user):
    `..` at `/` stays at `/`, and a symlink's absolute target starts again at the phone's `/`, so
    no path leaves the folder (as no path leaves a chroot). Raises OSError (ELOOP, ENOENT)."""
    root_real = str(root)
    todo = [c for c in reversed(remote.split("/")) if c not in ("", ".")]
    parts: list[str] = []
    links = 0
    while todo:
        comp = todo.pop()
        if comp == "..":
            if parts:
                parts.pop()
            continue
        if not parts and comp == HIDDEN_TOP:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), remote)
        candidate = os.path.join(root_real, *parts, comp)
        if (todo or follow_last) and os.path.islink(candidate):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), remote)
            target = os.readlink(candidate)
            if target.startswith("/"):
                parts = []
            todo.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
            continue
        parts.append(comp)
    return Path(root_real, *parts)


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@contextlib.contextmanager
def filesystem_user(uid: int | None, gid: int | None):
    """File access as `uid`/`gid` (setfsuid: this thread only, and root's file capabilities drop
    while it lasts), the way adbd (running as shell) touches files; None: as the daemon."""
    if uid is None:
        yield
        return
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(os.geteuid())
        _libc.setfsgid(os.getegid())


class _Input:
    """Exact-size reads over the stream's WRTE payloads."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.buf = bytearray()
        self.pos = 0

    async def exactly(self, n: int) -> bytes:
        while len(self.buf) - self.pos < n:
            data = await self.stream.read()
            if not data:
                raise SyncEnd("peer closed")
            if self.pos:
                del self.buf[:self.pos]
                self.pos = 0
            self.buf += data
        # A copy, not a view: a live view would pin the bytearray and forbid the compaction above.
        with memoryview(self.buf) as view:
            out = bytes(view[self.pos:self.pos + n])
        self.pos += n
        return out


def _parse_mode(text: str) -> int:
    """A SEND mode as adbd reads it (an unsigned 32-bit mode_t); anything else is ValueError."""
    text = text.strip()
    if text.lower().startswith("0x"):
        mode = int(text, 16)
    elif text.startswith("0") and len(text) > 1:
        mode = int(text, 8)
    else:
        mode = int(text)
    if not 0 <= mode <= 0xFFFFFFFF:
        raise ValueError(f"mode {text} out of range")
    return mode


class SyncSession:
    """One sync: stream. `as_user` (uid, gid): every file is touched as that user (the phone's
    shell, as adbd does on a user build); None: as the daemon (the fallback without a namespace)."""

    def __init__(self, stream: Stream, root: Path, as_user: tuple[int, int] | None = None):
        self.stream = stream
        self.root = Path(root)
        self.inp = _Input(stream)
        self.uid: int | None = as_user[0] if as_user is not None else None
        self.gid: int | None = as_user[1] if as_user is not None else None

    def fs(self):
        return filesystem_user(self.uid, self.gid)

    async def fail(self, reason: str) -> NoReturn:
        """Answer FAIL with `reason` and end the session."""
        msg = reason.encode("utf-8", "replace")
        await self.stream.write(DATA.pack(b"FAIL", len(msg)) + msg)
        raise SyncEnd(reason)

    async def run(self) -> None:
        try:
            while True:
                await self.one_request()
        except SyncEnd as e:
            log.info("sync session ended: %s", e)

    async def one_request(self) -> None:
        ident, length = REQUEST.unpack(await self.inp.exactly(REQUEST.size))
        if length > MAX_PATH:
            await self.fail("path too long")
        # adbd hands the path to the kernel as a C string: it ends at the first NUL
        path = (await self.inp.exactly(length)).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if ident == b"QUIT":
            raise SyncEnd("quit")
        handler = {b"STAT": self.stat_v1, b"STA2": self.stat_v2, b"LST2": self.stat_v2,
                   b"LIST": self.list_v1, b"LIS2": self.list_v2, b"SEND": self.send,
                   b"RECV": self.recv}.get(bytes(ident))
        if handler is None:
            await self.fail(f"unknown command {ident.hex()}")
        await handler(ident, path)

    # -- stat / list: never FAIL (the adb client aborts on a FAIL here); errors are in the reply
    async def stat_v1(self, ident: bytes, path: str) -> None:
        try:
            with self.fs():
                st = os.lstat(resolve(self.root, path, follow_last=False))
            reply = STAT_V1.pack(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime))
        except OSError:
            reply = STAT_V1.pack(b"STAT", 0, 0, 0)
        await self.stream.write(reply)

    async def stat_v2(self, ident: bytes, path: str) -> None:
        follow = ident == b"STA2"
        try:
            with self.fs():
                host = resolve(self.root, path, follow_last=follow)
                st = os.stat(host) if follow else os.lstat(host)
            reply = STAT_V2.pack(ident, 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid,
                                 st.st_gid, st.st_size, int(st.st_atime), int(st.st_mtime), int(st.st_ctime))
        except OSError as e:
            reply = STAT_V2.pack(ident, e.errno or errno.EIO, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        await self.stream.write(reply)

    async def list_v1(self, ident: bytes, path: str) -> None:
        await self._list(path, v2=False)

    async def list_v2(self, ident: bytes, path: str) -> None:
        await self._list(path, v2=True)

    async def _list(self, path: str, v2: bool) -> None:
        out = bytearray()
        with self.fs():
            try:
                host = resolve(self.root, path)
                names = [".", ".."] + sorted(os.listdir(host))
            except OSError:
                names = []   # adbd: an unreadable folder lists nothing, then DONE
            for name in names:
                raw = name.encode("utf-8", "surrogateescape")
                try:
                    st = os.lstat(host / name)
                except OSError as e:
                    if v2:
                        out += DENT_V2.pack(b"DNT2", e.errno or errno.EIO, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            len(raw)) + raw
                    continue
                if v2:
                    out += DENT_V2.pack(b"DNT2", 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid,
                                        st.st_gid, st.st_size, int(st.st_atime), int(st.st_mtime),
                                        int(st.st_ctime), len(raw)) + raw
                else:
                    out += DENT_V1.pack(b"DENT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime),
                                        len(raw)) + raw
        out += (DENT_V2.pack(b"DONE", *([0] * 12)) if v2 else DENT_V1.pack(b"DONE", 0, 0, 0, 0))
        await self.stream.write(out)

    # -- push -------------------------------------------------------------------------------
    async def send(self, ident: bytes, spec: str) -> None:
        path, comma, mode_text = spec.rpartition(",")
        if not comma:
            await self.fail("missing , in ID_SEND_V1")
        try:
            mode = _parse_mode(mode_text)
        except ValueError:
            await self.fail("bad mode")
        if statmod.S_ISLNK(mode):
            await self._send_link(path)
            return
        # adbd copies the user's permission bits to group and other.
        perm = mode & 0o777
        perm |= ((perm >> 3) & 0o070) | ((perm >> 3) & 0o007)
        try:
            with self.fs():
                host = resolve(self.root, path, follow_last=False)
                if host.is_symlink() or host.is_file():
                    host.unlink()
                host.parent.mkdir(parents=True, exist_ok=True)  # fixed_push_mkdir
                host = resolve(self.root, path, follow_last=False)  # a parent may be a fresh symlink
                fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, perm)
        except OSError as e:
            await self._drain_data()
            await self.fail(f"couldn't create file: {e.strerror}")
        try:
            mtime = await self._receive_data(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError), self.fs():
                host.unlink()
            raise
        os.fchmod(fd, perm)
        with contextlib.suppress(OSError):
            os.utime(fd, (mtime, mtime))
        os.close(fd)
        await self.stream.write(DATA.pack(b"OKAY", 0))

    async def _receive_data(self, fd: int) -> int:
        while True:
            ident, size = DATA.unpack(await self.inp.exactly(DATA.size))
            if ident == b"DONE":
                return size
            if ident != b"DATA":
                await self.fail("invalid data message")
            if size > SYNC_DATA_MAX:
                await self.fail("oversize data message")
            chunk = await self.inp.exactly(size)
            try:
                os.write(fd, chunk)
            except OSError as e:
                await self._drain_data()
                await self.fail(f"write failed: {e.strerror}")

    async def _drain_data(self) -> None:
        """After a failure adbd keeps reading DATA until DONE so the client sees the FAIL."""
        while True:
            ident, size = DATA.unpack(await self.inp.exactly(DATA.size))
            if ident != b"DATA" or size > SYNC_DATA_MAX:
                return
            await self.inp.exactly(size)

    async def _send_link(self, path: str) -> None:
        ident, size = DATA.unpack(await self.inp.exactly(DATA.size))
        if ident != b"DATA" or size > SYNC_DATA_MAX:
            await self.fail("invalid data message: expected ID_DATA")
        target = (await self.inp.exactly(size)).rstrip(b"\0").decode("utf-8", "surrogateescape")
        ident, _mtime = DATA.unpack(await self.inp.exactly(DATA.size))
        if ident != b"DONE":
            await self.fail("invalid data message: expected ID_DONE")
        try:
            with self.fs():
                host = resolve(self.root, path, follow_last=False)
                if host.is_symlink() or host.exists():
                    host.unlink()
                host.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, host)
        except OSError as e:
            await self.fail(f"symlink failed: {e.strerror}")
        await self.stream.write(DATA.pack(b"OKAY", 0))

    # -- pull -------------------------------------------------------------------------------
    async def recv(self, ident: bytes, path: str) -> None:
        try:
            with self.fs():
                fd = os.open(resolve(self.root, path), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            await self.fail(f"open failed: {e.strerror}")
        try:
            # Pack as many 64 KiB DATA messages as fit one WRTE: one OKAY round trip per MiB.
            budget = max(self.stream.conn.max_payload, SYNC_DATA_MAX + DATA.size)
            per_chunk = SYNC_DATA_MAX
            while True:
                out = bytearray()
                eof = False
                while len(out) + DATA.size + per_chunk <= budget:
                    try:
                        chunk = os.read(fd, per_chunk)
                    except OSError as e:
                        await self.fail(f"read failed: {e.strerror}")
                    if not chunk:
                        eof = True
                        break
                    out += DATA.pack(b"DATA", len(chunk))
                    out += chunk
                if eof:
                    out += DATA.pack(b"DONE", 0)
                    await self.stream.write(out)
                    return
                await self.stream.write(out)
        finally:
            os.close(fd)


def root_handle(root: Path) -> Path:
    """A path to the phone's folder that the shell user can walk: /proc/self/fd/N of a descriptor
    the daemon opened as root (its ancestors, e.g. a 0700 home, are never searched again)."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return Path(f"/proc/self/fd/{fd}")


async def serve_sync(stream: Stream, root: Path, as_user: tuple[int, int] | None = None) -> None:
    await SyncSession(stream, root, as_user).run()
