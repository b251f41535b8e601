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

Every path is opened by the kernel relative to a descriptor of the phone's folder with openat2's
RESOLVE_IN_ROOT (Linux 5.6+): the walk and the open are one system call, so a phone-side process
that swaps a folder for a symlink mid-request cannot send it out of the phone (resolving first and
opening the host path after, as this once did, lost that race). Creating, unlinking and linking
are done relative to the already-opened parent folder, one component at a time; chmod and utime
on the open file. Without openat2 the service refuses every path (ENOSYS), it never falls back
to walking host paths.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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

from devices.virtual.adbd import Stream
from engine.units import KIB

log = logging.getLogger("bmoe.vphone.sync")
# the threads that drop a pushed file's pages (None: asyncio's default pool); a daemon whose
# thread forks into the phone's pid namespace can start no thread, so it sets pre-started ones
# (devices.virtual.run.started_executor)
EXECUTOR: concurrent.futures.Executor | None = None


def leave_page_cache(fd: int) -> None:
    """Write a pushed file's pages out and drop them from the page cache: the phone's first read
    then faults them in under the phone's memory cgroup. memcg v1 charges a page-cache page to the
    group whose task first brings it in, and this daemon runs outside the phone's group, so a file
    left cached by its push would cost the phone's RAM nothing (a mapped model's dense weights
    never reclaimed or re-read under the phone's pressure, as a phone's are). On a phone adbd's
    writes are the phone's own RAM; a freshly pushed file there is also soon written back and
    reclaimable, which is what the dropped pages stand in for."""
    os.fdatasync(fd)                                        # dirty pages cannot be dropped
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

SYNC_DATA_MAX = 64 * KIB
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


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long

SYS_OPENAT2 = 437             # one number on every architecture (the asm-generic table)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
EAGAIN_RETRIES = 64           # openat2 answers EAGAIN when a rename raced the walk: walk again


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2_in_root(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """open(2) of `path` walked with the folder `root_fd` as `/` (`..` stays there, absolute
    symlink targets restart there, /proc magic links refused): no result is outside that folder.
    Raises OSError with the kernel's errno."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    for _ in range(EAGAIN_RETRIES):
        fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(root_fd), ctypes.c_char_p(raw),
                           ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def _split(path: str) -> tuple[str, str]:
    """(parent, last component) of a phone path; the parent of a bare name is `/`."""
    parent, _, name = path.rpartition("/")
    return parent or "/", name


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
        self.root_fd = -1
        self.root_id = (0, 0)
        self.hidden = ""

    def fs(self):
        return filesystem_user(self.uid, self.gid)

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """A descriptor of the phone's `path` (see openat2_in_root); the daemon's own folder at
        the top is not the phone's: ENOENT there, however the path got to it."""
        fd = openat2_in_root(self.root_fd, path, flags, mode)
        where = os.readlink(f"/proc/self/fd/{fd}")
        if where == self.hidden or where.startswith(self.hidden + "/"):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return fd

    def is_root(self, fd: int) -> bool:
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino) == self.root_id

    def parent(self, path: str, make: bool) -> tuple[int, str]:
        """(a descriptor of the folder `path` names its last component in, that component);
        `make`: create the missing folders on the way first, as adbd's mkdirs does (each one
        relative to its opened parent). The component is never `.vphone` at the top."""
        parent, name = _split(path)
        if make:
            comps = parent.split("/")
            for i in range(1, len(comps) + 1):
                if comps[i - 1] in ("", ".", ".."):
                    continue
                try:
                    os.close(self.open("/".join(comps[:i]) or "/", os.O_PATH | os.O_DIRECTORY))
                    continue
                except FileNotFoundError:
                    pass
                up = self.open("/".join(comps[:i - 1]) or "/", os.O_PATH | os.O_DIRECTORY)
                try:
                    if comps[i - 1] == HIDDEN_TOP and self.is_root(up):
                        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(comps[i - 1], 0o777, dir_fd=up)
                finally:
                    os.close(up)
        fd = self.open(parent, os.O_PATH | os.O_DIRECTORY)
        if name in ("", ".", ".."):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if name == HIDDEN_TOP and self.is_root(fd):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return fd, name

    async def fail(self, reason: str) -> NoReturn:
        """Answer FAIL with `reason` and end the session."""
        msg = reason.encode("utf-8", "replace")
        await self.stream.write(DATA.pack(b"FAIL", len(msg)) + msg)
        raise SyncEnd(reason)

    async def run(self) -> None:
        self.root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(self.root_fd)
            self.root_id = (st.st_dev, st.st_ino)
            self.hidden = os.path.join(os.readlink(f"/proc/self/fd/{self.root_fd}"), HIDDEN_TOP)
            while True:
                await self.one_request()
        except SyncEnd as e:
            log.info("sync session ended: %s", e)
        finally:
            os.close(self.root_fd)

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
                fd = self.open(path, os.O_PATH | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            reply = STAT_V1.pack(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime))
        except OSError:
            reply = STAT_V1.pack(b"STAT", 0, 0, 0)
        await self.stream.write(reply)

    async def stat_v2(self, ident: bytes, path: str) -> None:
        follow = ident == b"STA2"
        try:
            with self.fs():
                fd = self.open(path, os.O_PATH | (0 if follow else os.O_NOFOLLOW))
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
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
        fd = -1
        at_root = False
        with self.fs():
            try:
                fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
                names = [".", ".."] + sorted(os.listdir(fd))
                at_root = self.is_root(fd)   # the phone's `/`: its `..` is itself, the daemon's folder is not there
                if at_root and HIDDEN_TOP in names:
                    names.remove(HIDDEN_TOP)
            except OSError:
                names = []   # adbd: an unreadable folder lists nothing, then DONE
            for name in names:
                raw = name.encode("utf-8", "surrogateescape")
                try:
                    st = os.stat("." if at_root and name == ".." else name, dir_fd=fd, follow_symlinks=False)
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
        if fd >= 0:
            os.close(fd)
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
        dir_fd = -1
        try:
            with self.fs():
                dir_fd, name = self.parent(path, make=True)   # fixed_push_mkdir
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if statmod.S_ISLNK(st.st_mode) or statmod.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=dir_fd)
                # O_NOFOLLOW: a symlink put there since is refused (ELOOP), never followed
                # O_NONBLOCK: a FIFO put there by the phone fails (ENXIO) instead of hanging the daemon
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, perm, dir_fd=dir_fd)
        except OSError as e:
            if dir_fd >= 0:
                os.close(dir_fd)
            await self._drain_data()
            await self.fail(f"couldn't create file: {e.strerror}")
        try:
            mtime = await self._receive_data(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError), self.fs():
                os.unlink(name, dir_fd=dir_fd)
            raise
        finally:
            os.close(dir_fd)
        os.fchmod(fd, perm)
        with contextlib.suppress(OSError):
            os.utime(fd, (mtime, mtime))
        try:
            await asyncio.get_running_loop().run_in_executor(EXECUTOR, leave_page_cache, fd)
        finally:
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
                dir_fd, name = self.parent(path, make=True)
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=dir_fd)
                    os.symlink(target, name, dir_fd=dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as e:
            await self.fail(f"symlink failed: {e.strerror}")
        await self.stream.write(DATA.pack(b"OKAY", 0))

    # -- pull -------------------------------------------------------------------------------
    async def recv(self, ident: bytes, path: str) -> None:
        try:
            with self.fs():
                fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO must not hang the daemon
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
