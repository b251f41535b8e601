"""Expert-slice reads that bypass the page cache (O_DIRECT), spread over 1..8 read lanes.

Why O_DIRECT: the expert bank is far larger than RAM and each slice is read once per miss, so a
buffered read only fills the page cache with bytes that evict the model's dense weights and are
never read again from there. Reading around the page cache is what makes the expert-cache budget
the whole of the engine's expert RAM (docs/cache-sizing.md upstream).

An O_DIRECT read must start and end on the filesystem's DIO alignment and land in aligned memory.
Expert slices sit at arbitrary offsets, so each read pulls the covering aligned window into an
aligned buffer and hands back a view of the exact bytes (no copy). Buffered mode reads exactly the
slice. A file falls back to buffered reads, and reports o_direct=0, when the kernel refuses
O_DIRECT (EINVAL at open or at a read), when a direct read of one block disagrees with a buffered
read of it, or when the file lives on a memory filesystem (tmpfs accepts O_DIRECT since Linux 6.6,
but the file *is* page cache there, so there is nothing to bypass).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.errors import BmoeError
from engine.units import KIB, MIB

IO_THREADS_MAX = 8
DEFAULT_ALIGN_BYTES = 4096
# bmoe-cli's FileReader aligns every O_DIRECT window to 4096 bytes whatever the filesystem would
# accept; reading the same windows makes read_bytes / read_MiB the same number in both engines.
ENGINE_ALIGN_BYTES = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)
PAGE_BYTES = mmap.PAGESIZE

# statfs f_type of filesystems whose files live in RAM: O_DIRECT there bypasses nothing.
_MEMORY_FS_MAGIC = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}
_AT_FDCWD = -100
_STATX_DIOALIGN = 0x2000
_STATX_DIO_OFFSET = 152  # offset of stx_dio_mem_align in struct statx (then stx_dio_offset_align)
# The verify read must not itself leave model bytes in the page cache.
POSIX_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)

WRONG_DATA_MESSAGE = "bmoe: O_DIRECT returns wrong data on this storage — using buffered I/O"

_libc = ctypes.CDLL(None, use_errno=True)


class IoError(BmoeError):
    """An expert read failed (open, short read past EOF, I/O error)."""


class SliceLike(Protocol):
    """What a read needs: engine.gguf.model.ExpertSlice satisfies it (read-only attributes)."""

    @property
    def path(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class Slice:
    """A byte range of a file, for callers that have no ExpertSlice (benchmarks, tests)."""

    path: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class IoStats:
    """Demand-read counters. read_s is the wall time the caller waited, not a sum over lanes."""

    o_direct: bool
    io_threads: int
    reads: int
    read_bytes: int  # the payload asked for
    window_bytes: int  # what was pulled from storage (aligned windows under O_DIRECT)
    read_s: float

    @property
    def read_mib_per_s(self) -> float:
        return self.read_bytes / MIB / self.read_s if self.read_s > 0 else 0.0


def read_alignment_bytes(path: str) -> int:
    """The O_DIRECT windows the engine reads `path` in: bmoe-cli's 4096 B, or the filesystem's own
    alignment where that is coarser."""
    return max(ENGINE_ALIGN_BYTES, dio_alignment_bytes(path))


def dio_alignment_bytes(path: str) -> int:
    """The offset/length alignment an O_DIRECT read of `path` needs.

    statx(STATX_DIOALIGN) is the filesystem's own answer (Linux >= 6.1); before that, the logical
    block size of the backing block device; 4096 when neither can be found, which is a multiple of
    every logical block size in use.
    """
    buf = ctypes.create_string_buffer(256)
    statx = getattr(_libc, "statx", None)
    if statx is not None and statx(_AT_FDCWD, os.fsencode(path), 0, _STATX_DIOALIGN, buf) == 0:
        (mask,) = struct.unpack_from("I", buf.raw, 0)
        _mem_align, offset_align = struct.unpack_from("II", buf.raw, _STATX_DIO_OFFSET)
        if mask & _STATX_DIOALIGN and offset_align > 0:
            return int(offset_align)
    st = os.stat(path)
    sysfs = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    # A partition has no queue/ of its own: its disk's is one level up.
    for candidate in (f"{sysfs}/queue/logical_block_size", f"{sysfs}/../queue/logical_block_size"):
        try:
            with open(candidate) as f:
                value = int(f.read().strip())
            if value > 0:
                return value
        except (OSError, ValueError):
            continue
    return DEFAULT_ALIGN_BYTES


def memory_filesystem(path: str) -> str | None:
    """'tmpfs' / 'ramfs' when `path` lives on a memory filesystem, else None."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _libc.statfs(os.fsencode(path), buf) != 0:
        return None
    (f_type,) = struct.unpack_from("l", buf.raw, 0)
    return _MEMORY_FS_MAGIC.get(f_type & 0xFFFFFFFF)


def aligned_empty(nbytes: int, align_bytes: int = PAGE_BYTES) -> np.ndarray:
    """A uint8 array of nbytes whose first byte is align_bytes-aligned.

    Over-allocated from numpy's heap and sliced: a fresh mmap per read cost ~30 % of throughput
    in page-fault and munmap work (docs/engine-io.md).
    """
    raw = np.empty(nbytes + align_bytes, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align_bytes
    return raw[shift : shift + nbytes]


Allocator = Callable[[int, int], np.ndarray]  # (nbytes, align_bytes) -> aligned uint8 array


class ReusedBuffers:
    """Aligned read buffers handed out again once nothing outside still holds them.

    With the cache off every fetch allocates k slices that the caller drops one layer later, and
    fresh allocations pay page faults and zeroing each time (glibc hands big frees straight back
    to the kernel): measured ~20 % of single-lane throughput. A buffer is reused only when its
    reference count shows that no array, view or memoryview of it survives anywhere, so bytes a
    caller still holds are never overwritten. Only the most recent buffers are tracked.
    """

    _TRACKED = 64
    _GRAIN_BYTES = 64 * KIB  # round capacities up so same-tensor slices fit each other's buffers

    def __init__(self) -> None:
        self._owners: deque[np.ndarray] = deque()
        self._lock = threading.Lock()

    def __call__(self, nbytes: int, align_bytes: int) -> np.ndarray:
        need = nbytes + align_bytes
        with self._lock:
            owners = self._owners
            raw = None
            for i in range(len(owners)):
                # 2 = the deque's reference and getrefcount's argument: nobody else has it.
                if owners[i].size >= need and sys.getrefcount(owners[i]) == 2:
                    raw = owners[i]
                    del owners[i]
                    break
            if raw is None:
                raw = np.empty(-(-need // self._GRAIN_BYTES) * self._GRAIN_BYTES, dtype=np.uint8)
            owners.append(raw)  # `raw` is held by this frame now, so no other lane can claim it
            if len(owners) > self._TRACKED:
                owners.popleft()
        shift = (-raw.ctypes.data) % align_bytes
        return raw[shift : shift + nbytes]


def _direct_preadv(fd: int, view: np.ndarray, offset: int) -> int:
    """One direct read. A module function so tests can stand in for storage that misbehaves."""
    return os.preadv(fd, [view.data], offset)


class _File:
    """One model file: its fds, size and whether reads of it still bypass the page cache."""

    def __init__(self, path: str, want_direct: bool, alloc: Allocator = aligned_empty) -> None:
        self.path = path
        self._alloc = alloc
        self.fallback_reason: str | None = None
        self.buffered_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size_bytes = os.fstat(self.buffered_fd).st_size
        self.align_bytes = DEFAULT_ALIGN_BYTES
        self.direct_fd: int | None = None
        # A direct fd given up mid-run stays open until close(): another lane may be inside a
        # read on it, and closing it would let a new open() reuse the number under that read.
        self._retired_fds: list[int] = []
        self._lock = threading.Lock()
        try:
            if want_direct:
                self._open_direct()
        except BaseException:
            self.close()
            raise

    def _open_direct(self) -> None:
        path = self.path
        if not O_DIRECT:
            self.fallback_reason = "O_DIRECT is not available on this platform"
            return
        fs = memory_filesystem(path)
        if fs is not None:
            self.fallback_reason = f"{fs}: the file is already in RAM, O_DIRECT bypasses nothing"
            return
        try:
            self.direct_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.fallback_reason = "O_DIRECT refused at open (EINVAL)"
            return
        # The engine's 4096-byte windows, or the filesystem's own alignment where that is coarser.
        self.align_bytes = read_alignment_bytes(path)
        self._verify()

    @property
    def direct(self) -> bool:
        return self.direct_fd is not None

    def _verify(self) -> None:
        """Compare one aligned block read direct against the same block read buffered.

        Some storage (FUSE-backed Android app dirs) accepts O_DIRECT and returns garbage; the
        bytes would silently corrupt every expert. Upstream checks the middle block at open.
        """
        align = self.align_bytes
        if self.size_bytes < align or self.direct_fd is None:
            return
        offset = (self.size_bytes // 2) // align * align
        direct = aligned_empty(align, max(align, PAGE_BYTES))
        try:
            got = _direct_preadv(self.direct_fd, direct, offset)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._fall_back("O_DIRECT refused at read (EINVAL)")
            return
        buffered = os.pread(self.buffered_fd, align, offset)
        os.posix_fadvise(self.buffered_fd, offset, align, POSIX_FADV_DONTNEED)
        if got != align or len(buffered) != align or direct.tobytes() != buffered:
            self._fall_back("O_DIRECT returned wrong data")

    def _fall_back(self, reason: str) -> None:
        with self._lock:
            if self.direct_fd is not None:
                self._retired_fds.append(self.direct_fd)
                self.direct_fd = None
                self.fallback_reason = reason

    def read(self, offset: int, nbytes: int) -> tuple[np.ndarray, int]:
        """(exact bytes, bytes pulled from storage)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size_bytes:
            raise IoError(f"{self.path}: read {offset}+{nbytes} runs past the end of the {self.size_bytes}-byte file")
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8), 0
        fd = self.direct_fd
        if fd is not None:
            try:
                return self._read_direct(fd, offset, nbytes)
            except OSError as e:
                # EINVAL mid-run: a filesystem that refuses some direct reads. The buffered path
                # below is still correct, and every later read of this file takes it.
                if e.errno != errno.EINVAL:
                    raise IoError(f"{self.path}: read at {offset} failed: {e.strerror}") from e
                self._fall_back("O_DIRECT refused at read (EINVAL)")
        return self._read_buffered(offset, nbytes)

    def _read_direct(self, fd: int, offset: int, nbytes: int) -> tuple[np.ndarray, int]:
        align = self.align_bytes
        a0 = offset // align * align
        a1 = -(-(offset + nbytes) // align) * align
        window = self._alloc(a1 - a0, max(align, PAGE_BYTES))
        need_end = offset + nbytes
        pos = a0
        while pos < need_end:
            if pos % align:
                # A short read stopped mid-block (only at EOF): the direct fd would refuse an
                # unaligned offset, so the sub-block tail comes from the buffered fd.
                tail = os.preadv(self.buffered_fd, [window[pos - a0 :].data], pos)
                if tail <= 0:
                    break
                pos += tail
                continue
            got = _direct_preadv(fd, window[pos - a0 :], pos)
            if got <= 0:
                break
            pos += got
        if pos < need_end:
            raise IoError(f"{self.path}: short read at {pos} (wanted up to {need_end})")
        return window[offset - a0 : offset - a0 + nbytes], pos - a0

    def _read_buffered(self, offset: int, nbytes: int) -> tuple[np.ndarray, int]:
        out = self._alloc(nbytes, 64)
        pos = 0
        while pos < nbytes:
            try:
                got = os.preadv(self.buffered_fd, [out[pos:].data], offset + pos)
            except OSError as e:
                raise IoError(f"{self.path}: read at {offset + pos} failed: {e.strerror}") from e
            if got <= 0:
                raise IoError(f"{self.path}: short read at {offset + pos} (wanted up to {offset + nbytes})")
            pos += got
        return out, nbytes

    def close(self) -> None:
        for fd in (self.direct_fd, self.buffered_fd, *self._retired_fds):
            if fd is not None:
                os.close(fd)
        self.direct_fd = None
        self._retired_fds.clear()


class DirectReader:
    """Reads slices of any number of files over `io_threads` lanes.

    Demand reads (read_slices) block the caller and are counted in stats(); background reads
    (submit_slices, for prefetch) run on the same lanes; the bytes they pull are counted apart
    (background_window_bytes) the moment each one lands, as upstream's reader counts every read.
    """

    def __init__(self, io_threads: int = 4, o_direct: bool = True, reuse_buffers: bool = False) -> None:
        """reuse_buffers: recycle read buffers the caller has dropped (see ReusedBuffers). Worth it
        when nothing keeps what is read (the cache is off); a cache keeps everything it reads."""
        if not 1 <= io_threads <= IO_THREADS_MAX:
            raise IoError(f"io_threads must be in [1, {IO_THREADS_MAX}], got {io_threads}")
        self.io_threads = io_threads
        self.want_direct = o_direct
        self._alloc: Allocator = ReusedBuffers() if reuse_buffers else aligned_empty
        self._files: dict[str, _File] = {}
        self._open_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="bmoe-io")
        self._reads = 0
        self._read_bytes = 0
        self._window_bytes = 0
        self._read_s = 0.0
        self._background_window_bytes = 0
        self._background_lock = threading.Lock()

    # ---- files ---------------------------------------------------------------------------
    def open(self, path: str) -> None:
        self._file(path)

    def _file(self, path: str) -> _File:
        f = self._files.get(path)
        if f is None:
            with self._open_lock:
                f = self._files.get(path)
                if f is None:
                    try:
                        f = _File(path, self.want_direct, self._alloc)
                    except OSError as e:
                        raise IoError(f"{path}: cannot open: {e.strerror}") from e
                    self._files[path] = f
        return f

    @property
    def o_direct(self) -> bool:
        """The run-level fact: every opened file really bypasses the page cache.

        The weakest file decides, as upstream does across shards: a mixed run must not be
        advertised as direct. Before any file is open it is what was asked for.
        """
        return self.want_direct and all(f.direct for f in self._files.values())

    def fallback_reasons(self) -> dict[str, str]:
        return {p: f.fallback_reason for p, f in self._files.items() if f.fallback_reason}

    def messages(self) -> list[str]:
        """stderr lines bmoe-cli prints for what happened at open (wrong-data fallback only)."""
        return [WRONG_DATA_MESSAGE for f in self._files.values() if f.fallback_reason == "O_DIRECT returned wrong data"]

    # ---- reads ---------------------------------------------------------------------------
    def _read(self, s: SliceLike) -> tuple[np.ndarray, int]:
        return self._file(s.path).read(s.offset, s.nbytes)

    def read_slices(self, slices: Sequence[SliceLike]) -> list[np.ndarray]:
        """The exact bytes of every slice, in order, read concurrently across the lanes. An empty
        batch still adds its (tiny) wall time to read_s, as the engine's read window does."""
        for s in slices:  # open on the caller's thread: an open error is reported here, once
            self._file(s.path)
        t0 = time.perf_counter()
        if not slices:
            self._read_s += time.perf_counter() - t0
            return []
        if self.io_threads == 1 or len(slices) == 1:
            results = [self._read(s) for s in slices]
        else:
            results = list(self._pool.map(self._read, slices))
        self._read_s += time.perf_counter() - t0
        self._reads += len(slices)
        self._read_bytes += sum(s.nbytes for s in slices)
        self._window_bytes += sum(pulled for _, pulled in results)
        return [data for data, _ in results]

    def submit_slices(self, slices: Sequence[SliceLike]) -> Future[list[tuple[np.ndarray, int]]]:
        """Read slices in the background on one lane; the future yields (bytes, pulled) pairs."""
        for s in slices:
            self._file(s.path)

        def read_all() -> list[tuple[np.ndarray, int]]:
            out = []
            for s in slices:
                data, pulled = self._read(s)
                with self._background_lock:
                    self._background_window_bytes += pulled
                out.append((data, pulled))
            return out

        return self._pool.submit(read_all)

    @property
    def background_window_bytes(self) -> int:
        """Storage bytes pulled by submit_slices reads so far, whether or not anyone used them."""
        with self._background_lock:
            return self._background_window_bytes

    def stats(self) -> IoStats:
        return IoStats(
            o_direct=self.o_direct,
            io_threads=self.io_threads,
            reads=self._reads,
            read_bytes=self._read_bytes,
            window_bytes=self._window_bytes,
            read_s=self._read_s,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> DirectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
