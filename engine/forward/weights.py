"""Dense (non-expert) tensors by name.

Each shard is memory-mapped read-only. Matrices the forward pass multiplies are handed out as
they are stored (`matrix()`: a RawMatrix of the tensor's blocks, for engine.kernels.matmul), so a
quantized output head is never expanded. `get()` gives a tensor's values float32-shaped
numpy-style (ggml's `ne` reversed, so a weight stored as ne=(n_in, n_out) reads as W[n_out, n_in]
and `x @ W.T` is ggml_mul_mat): F16/F32 tensors as views of their bytes (no copy, and the page
cache holds them once however many Models share a file), other types dequantized once and kept
(norms, biases, sinks; matrices only in tests).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from engine.errors import ModelError
from engine.gguf.header import TensorInfo
from engine.gguf.model import ModelShape
from engine.kernels.matmul import RawMatrix, raw_matrix
from engine.stream.io import PAGE_BYTES
from engine.stream.pagecache import resident_pages

# Probes per residency sample, spread evenly over the dense bytes (one page each).
DENSE_SAMPLE_PAGES = 64


def numpy_shape(info: TensorInfo) -> tuple[int, ...]:
    """The numpy shape of a ggml tensor: `ne` reversed (ne[0], the contiguous row, is last)."""
    return tuple(reversed(info.ne))


def dequantize_bytes(raw: np.ndarray, info: TensorInfo, ne: tuple[int, ...] | None = None) -> np.ndarray:
    """Dequantize `raw` (1-D uint8, exactly the tensor's bytes) to float32 in numpy shape.

    `ne` overrides the tensor's own shape, for a slice of it (one expert of an expert tensor).
    """
    ne = tuple(info.ne if ne is None else ne)
    block_elems, block_bytes = GGML_QUANT_SIZES[info.qtype]
    row_bytes = ne[0] // block_elems * block_bytes
    n_rows = 1
    for d in ne[1:]:
        n_rows *= d
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size != row_bytes * n_rows:
        raise ModelError(
            f"{info.name}: expected {row_bytes * n_rows} raw bytes for shape {ne} {info.qtype.name}, "
            f"got {raw.size} ({raw.dtype}, {raw.ndim}-D)"
        )
    rows = raw.reshape(n_rows, row_bytes)
    try:
        out = quants.dequantize(rows, info.qtype)
    except NotImplementedError:
        raise ModelError(f"{info.name}: gguf cannot dequantize {info.qtype.name}") from None
    if out.dtype != np.float32:
        out = out.astype(np.float32)
    return out.reshape(tuple(reversed(ne)))


class DenseWeights:
    """Named access to every non-expert tensor of a model, each dequantized on first use."""

    def __init__(self, shape: ModelShape, buffers: Mapping[str, np.ndarray] | None = None):
        """`buffers`: each tensor's raw bytes already in memory (--dense-weights anon reads them
        with O_DIRECT into anonymous buffers); tensors not in it are read from a memory map."""
        self.shape = shape
        self._infos = {t.name: t for t in shape.dense_tensors}
        self._buffers = dict(buffers or {})
        self._maps: dict[str, np.memmap] = {}
        self._cache: dict[str, np.ndarray] = {}
        self._matrices: dict[str, RawMatrix] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise ModelError(f"{self.shape.paths[0]}: model has no tensor {name}") from None

    def qtype(self, name: str) -> GGMLQuantizationType:
        return self.info(name).qtype

    def get(self, name: str) -> np.ndarray:
        """The tensor as read-only float32 in numpy shape; raises ModelError if it is absent."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        info = self.info(name)
        if info.qtype in (GGMLQuantizationType.F16, GGMLQuantizationType.F32):
            # A view of the bytes, not a float32 copy: mul_mat widens chunks to float64 exactly
            # either way, and a copy would double the dense set's RSS (what a phone's LMK judges).
            dtype = np.float16 if info.qtype == GGMLQuantizationType.F16 else np.float32
            out = self._raw(info).view(dtype).reshape(numpy_shape(info))
            if out.flags.writeable:
                out = out.view()
                out.flags.writeable = False
            self._cache[name] = out
            return out
        out = dequantize_bytes(self._raw(info), info)
        out.flags.writeable = False
        self._cache[name] = out
        return out

    def matrix(self, name: str) -> RawMatrix:
        """A 2-D tensor as stored: rows of ne[0] values in its own blocks (no conversion)."""
        got = self._matrices.get(name)
        if got is None:
            info = self.info(name)
            if len(info.ne) != 2:
                raise ModelError(f"{name}: a matrix needs a 2-D tensor, this one has ne={info.ne}")
            got = self._matrices[name] = raw_matrix(self._raw(info), info.qtype, info.ne[0], info.ne[1], name)
        return got

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D tensor (ggml_get_rows), dequantizing only those rows unless the
        whole tensor is already cached — a 150k-token embedding table need not be expanded."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached[ids]
        info = self.info(name)
        if len(info.ne) != 2:
            raise ModelError(f"{name}: get_rows needs a 2-D tensor, this one has ne={info.ne}")
        block_elems, block_bytes = GGML_QUANT_SIZES[info.qtype]
        row_bytes = info.ne[0] // block_elems * block_bytes
        table = self._raw(info).reshape(info.ne[1], row_bytes)
        picked = np.ascontiguousarray(table[np.asarray(ids, dtype=np.int64)]).reshape(-1)
        return dequantize_bytes(picked, info, (info.ne[0], len(ids)))

    def optional(self, name: str) -> np.ndarray | None:
        return self.get(name) if name in self._infos else None

    def _raw(self, info: TensorInfo) -> np.ndarray:
        buffer = self._buffers.get(info.name)
        if buffer is not None:
            return buffer
        return self._map(info.path)[info.offset:info.offset + info.nbytes]

    def _map(self, path: str) -> np.memmap:
        mm = self._maps.get(path)
        if mm is None:
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            self._maps[path] = mm
        return mm

    def residency(self) -> DenseResidency:
        """The dense-residency sensor for these weights: their anon buffers when they were read
        into some (--dense-weights anon), else the file mapping's dense byte ranges (mmap/warm).
        Mapping a file to probe it faults nothing in."""
        if self._buffers:
            return DenseResidency([(b.ctypes.data, b.nbytes) for b in self._buffers.values()])
        regions = []
        for path, ranges in self.shape.dense_ranges().items():
            base = self._map(path).ctypes.data
            regions += [(base + lo, hi - lo) for lo, hi in ranges]
        return DenseResidency(regions)


class DenseResidency:
    """bmoe-cli's dense-residency sensor (`dense_resident_frac`): the fraction of
    DENSE_SAMPLE_PAGES probe pages, spread evenly over the dense weights, that are in RAM
    (mincore). Under memory pressure it falls as the kernel reclaims the model's dense pages."""

    def __init__(self, regions: list[tuple[int, int]]):
        self._regions = [(addr, n) for addr, n in regions if n > 0]
        self._total = sum(n for _, n in self._regions)

    def sample(self) -> float:
        """Resident fraction now, or -1.0 when there is nothing to probe."""
        sampled = resident = 0
        for k in range(DENSE_SAMPLE_PAGES if self._total else 0):
            target = self._total * k // DENSE_SAMPLE_PAGES
            for addr, n in self._regions:
                if target < n:
                    page = (addr + target) // PAGE_BYTES * PAGE_BYTES
                    r = resident_pages(page, PAGE_BYTES)
                    sampled += r.total_pages
                    resident += r.resident_pages
                    break
                target -= n
        return resident / sampled if sampled else -1.0
