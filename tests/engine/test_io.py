"""engine/stream/io.py on real files: O_DIRECT bytes, lanes, fallbacks, and the page cache left alone."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import engine.stream.io as eio
from engine.gguf.model import load_model_shape
from engine.stream.io import (
    ENGINE_ALIGN_BYTES,
    WRONG_DATA_MESSAGE,
    DirectReader,
    IoError,
    Slice,
    dio_alignment_bytes,
    memory_filesystem,
)
from engine.stream.pagecache import drop_page_cache, page_cache_residency

FIXTURE = Path(__file__).parents[1] / "fixtures" / "upstream" / "host-v2-0.19.0" / "tiny-qwen3moe.gguf"
FILE_BYTES = 3 * (1 << 20) + 12345  # not a multiple of any alignment: the last block is partial


@pytest.fixture
def disk_file(tmp_path: Path) -> tuple[str, bytes]:
    path = tmp_path / "blob.bin"
    data = np.random.default_rng(7).integers(0, 256, FILE_BYTES, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    assert memory_filesystem(str(tmp_path)) is None, f"{tmp_path} is on a memory filesystem; these tests need a disk"
    return str(path), data


@pytest.fixture
def shm_file() -> tuple[str, bytes]:
    path = f"/dev/shm/bmoe-io-test-{os.getpid()}-{threading.get_ident()}.bin"
    data = np.random.default_rng(8).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    Path(path).write_bytes(data)
    yield path, data
    os.unlink(path)


def unaligned_slices(path: str) -> list[Slice]:
    rng = np.random.default_rng(3)
    out = [
        Slice(path, 0, 1),
        Slice(path, 1, 4095),
        Slice(path, 4095, 2),  # straddles one block boundary
        Slice(path, 511, 8193),
        Slice(path, FILE_BYTES - 777, 777),  # ends exactly at an unaligned EOF
        Slice(path, FILE_BYTES - 1, 1),
        Slice(path, 4096, 0),
        Slice(path, 12345, (1 << 20) + 3),
    ]
    for _ in range(24):
        n = int(rng.integers(1, 300_000))
        out.append(Slice(path, int(rng.integers(0, FILE_BYTES - n)), n))
    return out


@pytest.mark.parametrize("lanes", range(1, 9))
def test_direct_reads_return_exactly_the_buffered_bytes(disk_file, lanes):
    path, data = disk_file
    slices = unaligned_slices(path)
    with DirectReader(io_threads=lanes) as reader:
        got = reader.read_slices(slices)
        assert reader.o_direct, reader.fallback_reasons()
        stats = reader.stats()
    for s, arr in zip(slices, got):
        assert arr.dtype == np.uint8 and arr.ndim == 1
        assert arr.tobytes() == data[s.offset : s.offset + s.nbytes], s
    assert stats.reads == len(slices) and stats.io_threads == lanes
    assert stats.read_bytes == sum(s.nbytes for s in slices)
    assert stats.window_bytes > stats.read_bytes  # whole aligned windows were pulled
    assert stats.read_s > 0 and stats.o_direct


def test_expert_slices_of_a_real_gguf_match_buffered_reads():
    shape = load_model_shape(FIXTURE)
    raw = FIXTURE.read_bytes()
    slices = [s for layer in shape.moe_layers for e in range(layer.n_expert) for s in layer.slices(e)]
    assert any(s.offset % 4096 for s in slices)  # the point: expert slices are not block-aligned
    with DirectReader(io_threads=4) as reader:
        got = reader.read_slices(slices)
        assert reader.o_direct
    assert all(a.tobytes() == raw[s.offset : s.offset + s.nbytes] for s, a in zip(slices, got))


def test_windows_are_the_engines_4096_bytes_or_the_filesystems_alignment(disk_file):
    path, _ = disk_file
    align = dio_alignment_bytes(path)
    assert align >= 512 and align & (align - 1) == 0
    window = max(ENGINE_ALIGN_BYTES, align)  # bmoe-cli's FileReader aligns to 4096, so read_bytes agree
    with DirectReader(io_threads=1) as reader:
        reader.read_slices([Slice(path, window + 1, 10)])
        assert reader.stats().window_bytes == window  # one aligned window covers it, no more
        reader.read_slices([Slice(path, 2 * window - 5, 10)])
        assert reader.stats().window_bytes == 3 * window  # a slice across a boundary takes two


def test_lanes_read_one_batch_concurrently(disk_file, monkeypatch):
    path, data = disk_file
    in_flight, peak, names = 0, 0, set()
    lock = threading.Lock()
    real = eio._direct_preadv

    def slow_read(fd, view, offset):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
            names.add(threading.current_thread().name)
        time.sleep(0.02)  # long enough that a serial reader could never overlap two
        try:
            return real(fd, view, offset)
        finally:
            with lock:
                in_flight -= 1

    with DirectReader(io_threads=4) as reader:
        reader.open(path)  # the open-time verify read is not part of the batch
        monkeypatch.setattr(eio, "_direct_preadv", slow_read)
        slices = [Slice(path, i * 70_001 + 3, 50_000) for i in range(12)]
        got = reader.read_slices(slices)
    assert peak == 4 and len(names) == 4
    assert all(a.tobytes() == data[s.offset : s.offset + s.nbytes] for s, a in zip(slices, got))


def test_tmpfs_falls_back_to_buffered_and_says_o_direct_0(shm_file):
    path, data = shm_file
    assert memory_filesystem(path) == "tmpfs", "/dev/shm must be tmpfs for this test"
    with DirectReader(io_threads=2) as reader:
        got = reader.read_slices([Slice(path, 5, 150_000), Slice(path, 199_999, 1)])
        assert not reader.o_direct and not reader.stats().o_direct
        assert "tmpfs" in reader.fallback_reasons()[path]
        assert reader.messages() == []  # bmoe-cli prints nothing for a refused O_DIRECT
    assert got[0].tobytes() == data[5:150_005] and got[1].tobytes() == data[199_999:]


def test_one_buffered_file_makes_the_run_not_direct(disk_file, shm_file):
    with DirectReader(io_threads=2) as reader:
        reader.open(disk_file[0])
        assert reader.o_direct
        reader.open(shm_file[0])
        assert not reader.o_direct


def test_einval_at_open_falls_back(disk_file, monkeypatch):
    path, data = disk_file
    real_open = os.open

    def no_direct(p, flags, *args):
        if flags & eio.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    with DirectReader(io_threads=3) as reader:
        got = reader.read_slices(unaligned_slices(path))
        assert not reader.o_direct and reader.fallback_reasons()[path] == "O_DIRECT refused at open (EINVAL)"
    assert all(a.tobytes() == data[s.offset : s.offset + s.nbytes] for s, a in zip(unaligned_slices(path), got))


def test_einval_at_read_falls_back_mid_run(disk_file, monkeypatch):
    path, data = disk_file
    with DirectReader(io_threads=2) as reader:
        reader.open(path)
        assert reader.o_direct

        def refuse(fd, view, offset):
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(eio, "_direct_preadv", refuse)
        got = reader.read_slices([Slice(path, 100, 10_000)])
        assert got[0].tobytes() == data[100:10_100]
        assert not reader.o_direct and "EINVAL" in reader.fallback_reasons()[path]


def test_wrong_bytes_from_o_direct_are_caught_at_open(disk_file, monkeypatch):
    path, data = disk_file
    real = eio._direct_preadv

    def garbage(fd, view, offset):  # storage that accepts O_DIRECT and returns the wrong bytes
        n = real(fd, view, offset)
        view[:n] ^= 0x5A
        return n

    monkeypatch.setattr(eio, "_direct_preadv", garbage)
    with DirectReader(io_threads=2) as reader:
        got = reader.read_slices([Slice(path, 3, 70_000)])
        assert not reader.o_direct
        assert reader.messages() == [WRONG_DATA_MESSAGE]
        assert WRONG_DATA_MESSAGE == "bmoe: O_DIRECT returns wrong data on this storage — using buffered I/O"
    assert got[0].tobytes() == data[3:70_003]


def test_direct_reads_leave_the_page_cache_alone_and_buffered_reads_fill_it(disk_file):
    path, data = disk_file
    span = Slice(path, 40_000, 1 << 20)
    with DirectReader(io_threads=4) as reader:
        reader.open(path)
        drop_page_cache(path)
        assert page_cache_residency(path, span.offset, span.nbytes).resident_pages == 0
        got = reader.read_slices([span])
        assert page_cache_residency(path, span.offset, span.nbytes).resident_pages == 0
    assert got[0].tobytes() == data[span.offset : span.offset + span.nbytes]
    with DirectReader(io_threads=4, o_direct=False) as reader:  # --no-odirect
        got = reader.read_slices([span])
        assert not reader.o_direct and reader.fallback_reasons() == {}
    residency = page_cache_residency(path, span.offset, span.nbytes)
    assert residency.resident_pages == residency.total_pages > 0
    assert got[0].tobytes() == data[span.offset : span.offset + span.nbytes]


def test_refusals(disk_file, tmp_path):
    path, _ = disk_file
    for lanes in (0, 9):
        with pytest.raises(IoError, match="io_threads"):
            DirectReader(io_threads=lanes)
    with DirectReader(io_threads=1) as reader:
        with pytest.raises(IoError, match="past the end"):
            reader.read_slices([Slice(path, FILE_BYTES - 10, 11)])
        with pytest.raises(IoError, match="cannot open"):
            reader.read_slices([Slice(str(tmp_path / "missing.gguf"), 0, 1)])


def test_reused_buffers_recycle_only_what_nobody_holds(disk_file):
    path, data = disk_file
    first, second = Slice(path, 1000, 300_000), Slice(path, 700_001, 300_000)
    with DirectReader(io_threads=2, reuse_buffers=True) as reader:
        kept = reader.read_slices([first])[0]
        kept_owner = kept.base.ctypes.data
        as_f16 = kept[:200_000].view(np.float16)  # a derived view keeps the buffer alive too
        del kept
        owners = set()
        for _ in range(20):  # reads that would love a free buffer of exactly this size
            got = reader.read_slices([second, second])
            assert all(a.base.ctypes.data != kept_owner for a in got)
            owners |= {a.base.ctypes.data for a in got}
            assert got[0].tobytes() == data[second.offset : second.offset + second.nbytes]
        assert as_f16.view(np.uint8).tobytes() == data[first.offset : first.offset + 200_000]
        assert len(owners) <= 4  # 40 reads went through a handful of recycled buffers
        del got
        again = reader.read_slices([first])[0]
        assert again.base.ctypes.data in owners  # dropped by the caller: recycled, no new pages
        assert again.tobytes() == data[first.offset : first.offset + first.nbytes]
