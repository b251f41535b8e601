"""A phone's flash: its /data served through FUSE, every read paced at the phone's read rate.

`virtual up --storage-mbps R` mounts this file system over the phone's /data, inside the phone's
mount namespace only (the host and the phone's daemon keep writing the folder at its host path).
It passes every call through to the phone's data folder on the host, and paces each READ on a
clock that idle time does not advance, as a flash device's bandwidth does:

    start = max(now, next_free);  next_free = start + bytes / R;  the reply leaves at next_free

so a burst after idle time runs at R, where a v1 blk-throttle lets it run at the disk's rate
(docs/decisions/vphone-paced-flash.md). One request at a time: concurrent lanes
share R, as a device's queue does. Writes are not paced (a phone's flash writes are not what a
cache miss costs). The backing file is read O_DIRECT where the request is page aligned (every
buffered read and an O_DIRECT reader's aligned ones), so the host's page cache holds none of it;
what the phone caches is the FUSE inode's page cache, charged to the reading task's memory cgroup
as a phone's page cache is.

The server is a child of the phone's daemon (`python -m devices.virtual.pacedfs`), outside the
phone's memory cgroup: it stands for the flash controller, not for the phone's RAM. A phone with
cores of its own (`--cpus`) runs its server on them: a phone's reads cost its own CPU (its block
layer and driver), never another phone's, whose decode would slow with this phone's traffic
(docs/lab-notes/2026-12-05-adaptive-demo-phones.md: a 2 GiB demo phone's 668 MiB cell ran 20-38 % slow while
the 640 MiB one, fought,
refaulted its model through its server). It dies with the
daemon (PR_SET_PDEATHSIG), and a dead server's connection is aborted by the kernel (its /dev/fuse
is closed): the phone's reads then fail with ENOTCONN instead of hanging, and the mount goes with
the phone's namespace, whose last process the next `up` kills. Its pid is recorded in the phone's
internal folder so that `reclaim` finds one that outlived its daemon.

The protocol is the kernel's (include/uapi/linux/fuse.h), spoken at minor 31 over /dev/fuse with
mount(2): no libfuse. Permissions are the kernel's (`default_permissions`, `allow_other`); what a
caller creates is chowned to its uid and gid.

Long because: it is one protocol's server, the FUSE opcodes answered from one table of nodes and
handles behind one lock, and beside it the small start, stop and reclaim the phone's daemon calls,
which spawn this module's own `__main__` and share its pid file and ready handshake.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import mmap
import os
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.units import KIB, MIB

MAX_IO = MIB                     # max_read / max_write: one 1 MiB request, as bmoe-cli's lane reads are
MAX_PAGES = MAX_IO // 4096
PAGE = 4096
FS_NAME = "bmoe-flash"           # the mount's type and source in mountinfo (source: bmoe-flash:PHONE)
PID_FILE = "pacedfs.pid"
READY = b"ready\n"
WORKERS = 4                      # requests in flight: one is read while another waits out its pacing

# opcodes (fuse.h)
(LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ,
 WRITE, STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, FLUSH, INIT, OPENDIR, READDIR,
 RELEASEDIR, FSYNCDIR, ACCESS, CREATE, INTERRUPT, DESTROY, BATCH_FORGET, RENAME2) = (
    1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 34,
    35, 36, 38, 42, 45)
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
# INIT flags asked for (granted only where the kernel offers them)
ASYNC_READ, ATOMIC_O_TRUNC, BIG_WRITES, AUTO_INVAL_DATA, PARALLEL_DIROPS, MAX_PAGES_FLAG = (
    1 << 0, 1 << 3, 1 << 5, 1 << 12, 1 << 18, 1 << 22)
WANT = ASYNC_READ | ATOMIC_O_TRUNC | BIG_WRITES | AUTO_INVAL_DATA | PARALLEL_DIROPS | MAX_PAGES_FLAG
# an open's reply: keep the file's page cache. Without it the kernel drops the inode's pages (mapped
# ones too) on every open, which a phone's file system never does: the engine opening its expert
# readers would free the model pages its load mapped, and the phone would fight later than a phone
# does. AUTO_INVAL_DATA (attributes never cached) still drops them when the file changes.
FOPEN_KEEP_CACHE = 1 << 1
# setattr valid bits
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE, FATTR_ATIME, FATTR_MTIME = 1, 2, 4, 8, 16, 32
FATTR_ATIME_NOW, FATTR_MTIME_NOW = 128, 256
ROOT_ID = 1

IN_HEADER = struct.Struct("<IIQQIIIHH")        # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("<IiQ")
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")       # fuse_attr (88 bytes)
ENTRY_HEAD = struct.Struct("<QQQQII")           # nodeid generation entry_valid attr_valid (+nsec x2)
ATTR_OUT_HEAD = struct.Struct("<QII")
OPEN_OUT = struct.Struct("<QII")
INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")     # 64 bytes
READ_IN = struct.Struct("<QQII")                # fh offset size read_flags (+ lock_owner, flags: unused)
WRITE_IN = struct.Struct("<QQIIQII")            # 40 bytes, then the data
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
CREATE_IN = struct.Struct("<IIII")              # flags mode umask open_flags
DIRENT_HEAD = struct.Struct("<QQII")
KSTATFS = struct.Struct("<QQQQQIII4x24x")       # 80 bytes
O_STRIP = os.O_CREAT | os.O_EXCL | os.O_NOCTTY | getattr(os, "O_DIRECT", 0)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
PR_SET_PDEATHSIG = 1


class FlashUnavailable(Exception):
    """A paced /data cannot be served here (no /dev/fuse, the mount refused): one line why."""


@dataclass
class Node:
    fd: int            # an O_PATH descriptor of the backing file
    lookups: int


@dataclass
class Handle:
    fd: int            # the backing file, opened as the caller asked (buffered)
    direct: int = -1   # and O_DIRECT for aligned reads, opened on first use (-2: refused)


class Pacer:
    """Each read leaves at start + bytes / rate, start = max(now, when the last one left)."""

    def __init__(self, mib_per_s: float) -> None:
        self.bytes_per_s = mib_per_s * MIB
        self.next_free = 0.0

    def finish_at(self, nbytes: int) -> float:
        start = max(time.monotonic(), self.next_free)
        self.next_free = start + nbytes / self.bytes_per_s
        return self.next_free


class Server:
    def __init__(self, dev_fd: int, backing_fd: int, mib_per_s: float) -> None:
        self.dev = dev_fd
        self.nodes: dict[int, Node] = {ROOT_ID: Node(backing_fd, 1)}
        self.by_inode: dict[tuple[int, int], int] = {self._key(os.fstat(backing_fd)): ROOT_ID}
        self.handles: dict[int, Handle] = {}
        self.dirs: dict[int, list[tuple[int, int, bytes]]] = {}
        self.next_id = ROOT_ID + 1
        self.pacer = Pacer(mib_per_s)
        self.lock = threading.Lock()        # the tables and the pacer; never held over a read or a wait
        self.local = threading.local()      # each worker's page-aligned buffer, for O_DIRECT reads

    @staticmethod
    def _key(st: os.stat_result) -> tuple[int, int]:
        return st.st_dev, st.st_ino

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _path(self, nodeid: int) -> str:
        return f"/proc/self/fd/{self.nodes[nodeid].fd}"

    # ---- replies -------------------------------------------------------------------------------
    def _reply(self, unique: int, error: int = 0, *parts: bytes | memoryview) -> None:
        size = OUT_HEADER.size + sum(len(p) for p in parts)
        with contextlib.suppress(FileNotFoundError):    # ENOENT: the request was interrupted meanwhile
            os.writev(self.dev, [OUT_HEADER.pack(size, -error, unique), *parts])

    @staticmethod
    def _attr(st: os.stat_result) -> bytes:
        return ATTR.pack(st.st_ino, st.st_size, st.st_blocks, int(st.st_atime), int(st.st_mtime), int(st.st_ctime),
                         st.st_atime_ns % 10**9, st.st_mtime_ns % 10**9, st.st_ctime_ns % 10**9, st.st_mode,
                         st.st_nlink, st.st_uid, st.st_gid, st.st_rdev, st.st_blksize, 0)

    def _entry(self, parent: int, name: bytes) -> bytes:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.nodes[parent].fd)
        st = os.fstat(fd)
        key = self._key(st)
        nodeid = self.by_inode.get(key)
        if nodeid is not None and nodeid in self.nodes:
            os.close(fd)
            self.nodes[nodeid].lookups += 1
        else:
            nodeid = self._new_id()
            self.nodes[nodeid] = Node(fd, 1)
            self.by_inode[key] = nodeid
        # no caching of names or attributes: the daemon writes the folder behind the kernel's back
        return ENTRY_HEAD.pack(nodeid, 0, 0, 0, 0, 0) + self._attr(st)

    def _forget(self, nodeid: int, n: int) -> None:
        node = self.nodes.get(nodeid)
        if node is None or nodeid == ROOT_ID:
            return
        node.lookups -= n
        if node.lookups <= 0:
            with contextlib.suppress(OSError):
                self.by_inode.pop(self._key(os.fstat(node.fd)), None)
            os.close(node.fd)
            del self.nodes[nodeid]

    def _chown_new(self, parent: int, name: bytes, uid: int, gid: int) -> None:
        os.chown(name, uid, gid, dir_fd=self.nodes[parent].fd, follow_symlinks=False)

    # ---- the loop ------------------------------------------------------------------------------
    def serve(self, workers: int = WORKERS) -> None:
        """Answer requests on `workers` threads until the file system is unmounted or destroyed."""
        threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(workers - 1)]
        for t in threads:
            t.start()
        self._worker()

    def _worker(self) -> None:
        while True:
            try:
                req = os.read(self.dev, MAX_IO + 64 * KIB)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EAGAIN):
                    continue
                if e.errno == errno.ENODEV:                 # unmounted
                    return
                raise
            length, opcode, unique, nodeid, uid, gid, _pid, _ext, _pad = IN_HEADER.unpack_from(req)
            body = memoryview(req)[IN_HEADER.size:length]
            if opcode == DESTROY:
                self._reply(unique)
                os._exit(0)
            out: list[bytes | memoryview] | None
            try:
                if opcode == READ:
                    out = self._read(*READ_IN.unpack_from(body)[:3])
                else:
                    with self.lock:
                        out = self.handle(opcode, nodeid, uid, gid, body, unique)
            except OSError as e:
                if opcode not in NO_REPLY:
                    self._reply(unique, e.errno or errno.EIO)
                continue
            except KeyError:                                # a node or handle the kernel should not name
                if opcode not in NO_REPLY:
                    self._reply(unique, errno.ESTALE)
                continue
            if out is not None:
                self._reply(unique, 0, *out)

    def handle(self, op: int, nodeid: int, uid: int, gid: int, body: memoryview,
               unique: int) -> list[bytes | memoryview] | None:
        if op == INIT:
            major, minor, max_readahead, flags = struct.unpack_from("<IIII", body)
            if major != 7:
                raise OSError(errno.EPROTO, "FUSE major version")
            return [INIT_OUT.pack(7, min(minor, 31), max_readahead, flags & WANT, 16, 12, MAX_IO, 1, MAX_PAGES, 0, 0)]
        if op == LOOKUP:
            return [self._entry(nodeid, bytes(body).split(b"\0", 1)[0])]
        if op == FORGET:
            self._forget(nodeid, struct.unpack_from("<Q", body)[0])
            return None
        if op == BATCH_FORGET:
            count = struct.unpack_from("<I", body)[0]
            for i in range(count):
                nid, n = struct.unpack_from("<QQ", body, 8 + 16 * i)
                self._forget(nid, n)
            return None
        if op == INTERRUPT:
            return None
        if op == GETATTR:
            return [ATTR_OUT_HEAD.pack(0, 0, 0), self._attr(os.fstat(self.nodes[nodeid].fd))]
        if op == SETATTR:
            return [ATTR_OUT_HEAD.pack(0, 0, 0), self._attr(self._setattr(nodeid, body))]
        if op == READLINK:
            return [os.readlink("", dir_fd=self.nodes[nodeid].fd).encode("utf-8", "surrogateescape")]
        if op in (MKNOD, MKDIR, SYMLINK, LINK, CREATE):
            return self._make(op, nodeid, uid, gid, body)
        if op in (UNLINK, RMDIR):
            name = bytes(body).split(b"\0", 1)[0]
            (os.unlink if op == UNLINK else os.rmdir)(name, dir_fd=self.nodes[nodeid].fd)
            return []
        if op in (RENAME, RENAME2):
            newdir = struct.unpack_from("<Q", body)[0]
            flags = struct.unpack_from("<I", body, 8)[0] if op == RENAME2 else 0
            old, new = bytes(body[16 if op == RENAME2 else 8:]).split(b"\0")[:2]
            if flags:
                if _libc.renameat2(self.nodes[nodeid].fd, old, self.nodes[newdir].fd, new, flags) != 0:
                    raise OSError(ctypes.get_errno(), "renameat2")
            else:
                os.rename(old, new, src_dir_fd=self.nodes[nodeid].fd, dst_dir_fd=self.nodes[newdir].fd)
            return []
        if op == OPEN:
            flags = struct.unpack_from("<I", body)[0]
            return [self._open(nodeid, flags)]
        if op == WRITE:
            fh, offset, size = WRITE_IN.unpack_from(body)[:3]
            n = os.pwrite(self.handles[fh].fd, body[WRITE_IN.size:WRITE_IN.size + size], offset)
            return [struct.pack("<II", n, 0)]
        if op in (RELEASE, RELEASEDIR):
            fh = struct.unpack_from("<Q", body)[0]
            if op == RELEASE:
                h = self.handles.pop(fh)
                os.close(h.fd)
                if h.direct >= 0:
                    os.close(h.direct)
            else:
                self.dirs.pop(fh, None)
            return []
        if op == FLUSH:
            return []
        if op in (FSYNC, FSYNCDIR):
            fh, flags = struct.unpack_from("<QI", body)
            if op == FSYNC:
                (os.fdatasync if flags & 1 else os.fsync)(self.handles[fh].fd)
            return []
        if op == OPENDIR:
            return [self._opendir(nodeid)]
        if op == READDIR:
            fh, offset, size, _ = READ_IN.unpack_from(body)
            return [self._readdir(fh, offset, size)]
        if op == STATFS:
            s = os.statvfs(self._path(ROOT_ID))
            return [KSTATFS.pack(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize, s.f_namemax,
                                 s.f_frsize)]
        # ACCESS (default_permissions decides), xattrs, locks, lseek, fallocate, ioctl ...: the
        # kernel's own fallback, as for a file system without them
        raise OSError(errno.ENOSYS, "not implemented")

    def _setattr(self, nodeid: int, body: memoryview) -> os.stat_result:
        (valid, _p, _fh, size, _lo, atime, mtime, _ct, atimensec, mtimensec, _ctn, mode, _u4, uid, gid,
         _u5) = SETATTR_IN.unpack_from(body)
        path = self._path(nodeid)
        if valid & FATTR_MODE:
            os.chmod(path, stat.S_IMODE(mode))
        if valid & (FATTR_UID | FATTR_GID):
            os.chown(path, uid if valid & FATTR_UID else -1, gid if valid & FATTR_GID else -1)
        if valid & FATTR_SIZE:
            os.truncate(path, size)
        if valid & (FATTR_ATIME | FATTR_MTIME):
            st = os.stat(path)
            now = time.time_ns()
            a = (now if valid & FATTR_ATIME_NOW else atime * 10**9 + atimensec) if valid & FATTR_ATIME else st.st_atime_ns
            m = (now if valid & FATTR_MTIME_NOW else mtime * 10**9 + mtimensec) if valid & FATTR_MTIME else st.st_mtime_ns
            os.utime(path, ns=(a, m))
        return os.fstat(self.nodes[nodeid].fd)

    def _make(self, op: int, parent: int, uid: int, gid: int, body: memoryview) -> list[bytes | memoryview]:
        dfd = self.nodes[parent].fd
        if op == CREATE:
            flags, mode, umask, _ = CREATE_IN.unpack_from(body)
            name = bytes(body[CREATE_IN.size:]).split(b"\0", 1)[0]
            fd = os.open(name, (flags & ~O_STRIP) | os.O_CREAT | os.O_CLOEXEC | (flags & os.O_EXCL),
                         stat.S_IMODE(mode) & ~umask, dir_fd=dfd)
            try:
                os.fchown(fd, uid, gid)
                entry = self._entry(parent, name)
            except OSError:
                os.close(fd)
                raise
            fh = self._new_id()
            self.handles[fh] = Handle(fd)
            return [entry, OPEN_OUT.pack(fh, FOPEN_KEEP_CACHE, 0)]
        if op == MKDIR:
            mode, umask = struct.unpack_from("<II", body)
            name = bytes(body[8:]).split(b"\0", 1)[0]
            os.mkdir(name, stat.S_IMODE(mode) & ~umask, dir_fd=dfd)
        elif op == MKNOD:
            mode, rdev, umask, _ = struct.unpack_from("<IIII", body)
            name = bytes(body[16:]).split(b"\0", 1)[0]
            os.mknod(name, (mode & ~umask) if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) else mode, rdev, dir_fd=dfd)
        elif op == SYMLINK:
            name, target = bytes(body).split(b"\0")[:2]
            os.symlink(target, name, dir_fd=dfd)
        else:   # LINK
            old = struct.unpack_from("<Q", body)[0]
            name = bytes(body[8:]).split(b"\0", 1)[0]
            os.link(self._path(old), name, dst_dir_fd=dfd, follow_symlinks=True)
            return [self._entry(parent, name)]
        self._chown_new(parent, name, uid, gid)
        return [self._entry(parent, name)]

    def _open(self, nodeid: int, flags: int) -> bytes:
        fd = os.open(self._path(nodeid), (flags & ~O_STRIP) | os.O_CLOEXEC)
        fh = self._new_id()
        self.handles[fh] = Handle(fd)
        return OPEN_OUT.pack(fh, FOPEN_KEEP_CACHE, 0)

    def _read(self, fh: int, offset: int, size: int) -> list[bytes | memoryview]:
        size = min(size, MAX_IO)
        with self.lock:
            h = self.handles[fh]
            finish = self.pacer.finish_at(size)
            if h.direct == -1:
                try:
                    h.direct = os.open(f"/proc/self/fd/{h.fd}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
                except OSError:
                    h.direct = -2
            fd, direct = h.fd, h.direct
        view = getattr(self.local, "view", None)
        if view is None:
            view = self.local.view = memoryview(mmap.mmap(-1, MAX_IO + PAGE))
        if direct >= 0 and offset % PAGE == 0:
            n = os.preadv(direct, [view[:-(-size // PAGE) * PAGE]], offset)
            data: bytes | memoryview = view[:min(n, size)]
        else:
            data = os.pread(fd, size, offset)
        if len(data) < size:             # a short read (end of file) took only what it moved
            with self.lock:
                self.pacer.next_free -= (size - len(data)) / self.pacer.bytes_per_s
                finish -= (size - len(data)) / self.pacer.bytes_per_s
        delay = finish - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return [data]

    def _opendir(self, nodeid: int) -> bytes:
        st = os.fstat(self.nodes[nodeid].fd)
        entries = [(st.st_ino, stat.S_IFDIR >> 12, b"."), (st.st_ino, stat.S_IFDIR >> 12, b"..")]
        with os.scandir(self._path(nodeid)) as it:
            for e in it:
                try:
                    mode = e.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                entries.append((e.inode(), stat.S_IFMT(mode) >> 12, os.fsencode(e.name)))
        fh = self._new_id()
        self.dirs[fh] = entries
        return OPEN_OUT.pack(fh, 0, 0)

    def _readdir(self, fh: int, offset: int, size: int) -> bytes:
        out = bytearray()
        entries = self.dirs[fh]
        for i in range(offset, len(entries)):
            ino, kind, name = entries[i]
            rec = DIRENT_HEAD.pack(ino, i + 1, len(name), kind) + name
            rec += b"\0" * (-len(rec) % 8)
            if len(out) + len(rec) > size:
                break
            out += rec
        return bytes(out)


# ---- the phone's side: start, stop, reclaim ----------------------------------------------------

def available() -> str | None:
    """Why a paced /data cannot be served on this host (None: it can)."""
    if not os.path.exists("/dev/fuse"):
        return "this host has no /dev/fuse (FUSE is not available)"
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1] == "fuse" for line in f if line.strip()):
                return "this kernel has no fuse file system"
    except OSError as e:
        return f"cannot read /proc/filesystems: {e}"
    return None


class Flash:
    """The running server of one phone's paced /data."""

    def __init__(self, proc: subprocess.Popen, internal: Path) -> None:
        self.proc = proc
        self.internal = internal

    @classmethod
    def start(cls, data_dir: Path, ns_fd: int, mib_per_s: int, internal: Path, timeout_s: float = 15.0,
              cpus: Sequence[int] = ()) -> Flash:
        """Mount the paced /data in the phone's namespace; with `cpus` (a phone with cores of its
        own), the server runs on those cores only."""
        why = available()
        if why is not None:
            raise FlashUnavailable(why)
        r, w = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-m", "devices.virtual.pacedfs", "--data", str(data_dir), "--ns-fd", str(ns_fd),
             "--mbps", str(mib_per_s), "--ready-fd", str(w), "--parent", str(os.getpid())]
            + (["--cpus", ",".join(map(str, cpus))] if cpus else []),
            pass_fds=(ns_fd, w), stdin=subprocess.DEVNULL, cwd=str(Path(__file__).resolve().parents[2]),
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        os.close(w)
        try:
            import select
            ready, _, _ = select.select([r], [], [], timeout_s)
            got = os.read(r, 64) if ready else b""
        finally:
            os.close(r)
        if got != READY:
            proc.kill()
            proc.wait()
            raise FlashUnavailable(f"the paced /data did not mount ({got.decode(errors='replace').strip() or 'no answer'})")
        (internal / PID_FILE).write_text(f"{proc.pid}\n")
        return cls(proc, internal)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(FileNotFoundError):
            (self.internal / PID_FILE).unlink()


def reclaim(internal: Path) -> None:
    """A server a killed daemon of this phone left (its death signal should have taken it)."""
    path = internal / PID_FILE
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(OSError):
        if b"devices.virtual.pacedfs" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _serve_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="devices.virtual.pacedfs")
    p.add_argument("--data", required=True)
    p.add_argument("--ns-fd", type=int, required=True)
    p.add_argument("--mbps", type=float, required=True)
    p.add_argument("--ready-fd", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--cpus", default="", help="the phone's own cores, comma-separated (none: any core)")
    a = p.parse_args(argv)
    if a.cpus:
        os.sched_setaffinity(0, [int(c) for c in a.cpus.split(",")])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != a.parent:        # the daemon died before the death signal was set
        return 1
    try:
        # opened at their host paths, before entering the phone's namespace
        dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        backing = os.open(a.data, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        host_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        from devices.virtual.namespace import MS_NODEV, MS_NOSUID, NamespaceUnavailable, _mount, setns
    except OSError as e:
        os.write(a.ready_fd, f"{e}".encode()[:60])
        return 1
    try:
        setns(a.ns_fd)
        os.close(a.ns_fd)
        st = os.fstat(backing)
        _mount(f"{FS_NAME}:{Path(a.data).parent.name}", "/data", f"fuse.{FS_NAME}", MS_NOSUID | MS_NODEV,
               f"fd={dev},rootmode={stat.S_IFMT(st.st_mode) | 0o755:o},user_id=0,group_id=0,allow_other,"
               f"default_permissions,max_read={MAX_IO}")
        # back to the host's namespace to serve: the server names its files /proc/self/fd/N, and
        # the phone's /proc is its own pid namespace's, where this process is not (namespace.py)
        setns(host_ns)
        os.close(host_ns)
    except (OSError, NamespaceUnavailable) as e:
        os.write(a.ready_fd, f"{e}".encode()[:60])
        return 1
    os.write(a.ready_fd, READY)
    os.close(a.ready_fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Server(dev, backing, a.mbps).serve()
    return 0


if __name__ == "__main__":
    sys.exit(_serve_main())
