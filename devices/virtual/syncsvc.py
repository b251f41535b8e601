"""The `sync:` service (adb push/pull/ls/stat), with every path kept inside the phone's root.

Wire format (AOSP file_sync_protocol.h, daemon/file_sync_service.cpp): requests are
{u32 id, u32 path_length <= 1024, path}. STAT -> {STAT, mode, size, mtime} (zeros when missing);
STA2/LST2 -> sync_stat_v2 (errno in `error`); LIST/LIS2 -> DENT/DNT2 entries then a zeroed entry
with id DONE; SEND "path,mode" -> DATA {u32 size <= 64 KiB, bytes}... DONE {mtime} -> OKAY/FAIL;
RECV -> DATA... DONE; QUIT ends the session. A request arrives split across WRTE payloads however
the server likes, so this reads a byte stream, not packets. Any FAIL ends the session, as in adbd.
"""

from __future__ import annotations

import errno
import logging
import os
import stat as statmod
import struct
from pathlib import Path

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


class PathEscape(Exception):
    """A sync path that would leave the phone's root (`..` above it, or a symlink out of it)."""


class SyncEnd(Exception):
    """The session is over (QUIT, a FAIL sent, or the peer closed the stream)."""


def resolve(root: Path, remote: str) -> Path:
    """Map an absolute phone path to the host path under `root`, refusing escapes."""
    parts: list[str] = []
    for comp in remote.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise PathEscape(remote)
            parts.pop()
        else:
            parts.append(comp)
    host = Path(root, *parts)
    root_real = os.path.realpath(root)
    real = os.path.realpath(host)
    if real != root_real and not real.startswith(root_real + os.sep):
        raise PathEscape(remote)
    return Path(real)


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
    text = text.strip()
    if text.lower().startswith("0x"):
        return int(text, 16)
    if text.startswith("0") and len(text) > 1:
        return int(text, 8)
    return int(text)


class SyncSession:
    def __init__(self, stream: Stream, root: Path):
        self.stream = stream
        self.root = Path(root)
        self.inp = _Input(stream)

    async def fail(self, reason: str) -> None:
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
        path = (await self.inp.exactly(length)).decode("utf-8", "surrogateescape")
        if ident == b"QUIT":
            raise SyncEnd("quit")
        handler = {b"STAT": self.stat_v1, b"STA2": self.stat_v2, b"LST2": self.stat_v2,
                   b"LIST": self.list_v1, b"LIS2": self.list_v2, b"SEND": self.send,
                   b"RECV": self.recv}.get(bytes(ident))
        if handler is None:
            await self.fail(f"unknown command {ident.hex()}")
        await handler(ident, path)

    async def host_path(self, remote: str, remote_for_message: str | None = None) -> Path:
        try:
            return resolve(self.root, remote)
        except PathEscape:
            log.warning("refused path escaping the phone's root: %r", remote)
            await self.fail(f"'{remote_for_message or remote}': path escapes the device root")
            raise  # not reached: fail() raises

    # -- stat / list ------------------------------------------------------------------------
    async def stat_v1(self, ident: bytes, path: str) -> None:
        host = await self.host_path(path)
        try:
            st = os.lstat(host)
            reply = STAT_V1.pack(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime))
        except OSError:
            reply = STAT_V1.pack(b"STAT", 0, 0, 0)
        await self.stream.write(reply)

    async def stat_v2(self, ident: bytes, path: str) -> None:
        host = await self.host_path(path)
        try:
            st = os.stat(host) if ident == b"STA2" else os.lstat(host)
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
        host = await self.host_path(path)
        out = bytearray()
        try:
            names = [".", ".."] + sorted(os.listdir(host))
        except OSError:
            names = []
        for name in names:
            raw = name.encode("utf-8", "surrogateescape")
            try:
                st = os.lstat(host / name)
            except OSError as e:
                if v2:
                    out += DENT_V2.pack(b"DNT2", e.errno or errno.EIO, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, len(raw)) + raw
                continue
            if v2:
                out += DENT_V2.pack(b"DNT2", 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid,
                                    st.st_gid, st.st_size, int(st.st_atime), int(st.st_mtime),
                                    int(st.st_ctime), len(raw)) + raw
            else:
                out += DENT_V1.pack(b"DENT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime), len(raw)) + raw
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
        host = await self.host_path(path)
        if statmod.S_ISLNK(mode):
            await self._send_link(host)
            return
        # adbd copies the user's permission bits to group and other.
        perm = mode & 0o777
        perm |= ((perm >> 3) & 0o070) | ((perm >> 3) & 0o007)
        try:
            if host.is_symlink() or host.is_file():
                host.unlink()
            host.parent.mkdir(parents=True, exist_ok=True)  # fixed_push_mkdir
            host = await self.host_path(path)  # re-check: a parent may be a fresh symlink
            fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, perm)
        except OSError as e:
            await self._drain_data()
            await self.fail(f"couldn't create file: {e.strerror}")
        try:
            mtime = await self._receive_data(fd)
        except BaseException:
            os.close(fd)
            try:
                host.unlink()
            except OSError:
                pass
            raise
        os.fchmod(fd, perm)
        os.close(fd)
        try:
            os.utime(host, (mtime, mtime), follow_symlinks=False)
        except OSError:
            pass
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

    async def _send_link(self, host: Path) -> None:
        ident, size = DATA.unpack(await self.inp.exactly(DATA.size))
        if ident != b"DATA" or size > SYNC_DATA_MAX:
            await self.fail("invalid data message: expected ID_DATA")
        target = (await self.inp.exactly(size)).rstrip(b"\0").decode("utf-8", "surrogateescape")
        ident, _mtime = DATA.unpack(await self.inp.exactly(DATA.size))
        if ident != b"DONE":
            await self.fail("invalid data message: expected ID_DONE")
        try:
            if host.is_symlink() or host.exists():
                host.unlink()
            host.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, host)
        except OSError as e:
            await self.fail(f"symlink failed: {e.strerror}")
        await self.stream.write(DATA.pack(b"OKAY", 0))

    # -- pull -------------------------------------------------------------------------------
    async def recv(self, ident: bytes, path: str) -> None:
        host = await self.host_path(path)
        try:
            fd = os.open(host, os.O_RDONLY | os.O_CLOEXEC)
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


async def serve_sync(stream: Stream, root: Path) -> None:
    await SyncSession(stream, root).run()
