"""Which pages of a file or of this process's memory sit in RAM (mincore), and dropping a file's
pages from the page cache: the probes the weights' residency column, the tests and the
benchmarks use to see what a run really read from storage."""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

from engine.stream.io import PAGE_BYTES, POSIX_FADV_DONTNEED, IoError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass(frozen=True)
class PageCacheResidency:
    resident_pages: int
    total_pages: int

    @property
    def fraction(self) -> float:
        return self.resident_pages / self.total_pages if self.total_pages else 0.0


def resident_pages(addr: int, nbytes: int) -> PageCacheResidency:
    """mincore over this process's memory [addr, addr+nbytes), widened to whole pages: how many
    are in RAM. Works for anonymous memory (a numpy buffer) and file mappings alike."""
    if nbytes <= 0:
        return PageCacheResidency(0, 0)
    start = addr // PAGE_BYTES * PAGE_BYTES
    length = addr + nbytes - start
    n_pages = -(-length // PAGE_BYTES)
    vec = (ctypes.c_ubyte * n_pages)()
    if _libc.mincore(ctypes.c_void_p(start), length, vec) != 0:
        err = ctypes.get_errno()
        raise IoError(f"mincore failed: {os.strerror(err)}")
    return PageCacheResidency(sum(b & 1 for b in vec), n_pages)


def page_cache_residency(path: str, offset: int, nbytes: int) -> PageCacheResidency:
    """How many pages of [offset, offset+nbytes) of `path` sit in the page cache (mincore).

    Mapping the file without touching it faults nothing in, so the probe does not disturb what
    it measures.
    """
    if nbytes <= 0:
        return PageCacheResidency(0, 0)
    start = offset // PAGE_BYTES * PAGE_BYTES
    length = offset + nbytes - start
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        if addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise IoError(f"{path}: mmap for mincore failed: {os.strerror(err)}")
        try:
            return resident_pages(addr, length)
        finally:
            _libc.munmap(addr, length)
    finally:
        os.close(fd)


def drop_page_cache(path: str) -> None:
    """Write back and drop this file's cached pages, so the next read really goes to storage."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)  # dirty pages are not dropped by DONTNEED
        os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
