"""Read a GGUF file's header (metadata and tensor infos) without touching tensor data.

Why not gguf.GGUFReader: it memory-maps the whole file and indexes past the end of a truncated
header without saying where; we need bounded reads and a precise one-line error for a file that
is not GGUF, a header cut short, or tensor data that runs past the end of the file.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.errors import ModelError
from engine.safetext import one_line
from engine.units import MIB

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays of arrays nest this deep at most (llama.cpp writes one level); deeper is damage, and
# an unbounded depth would exhaust Python's stack before the bytes run out.
MAX_ARRAY_DEPTH = 4
NAME_CHARS = 60      # a key or tensor name quoted in an error: a damaged length can make it 54 KB

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it.

    `ne` is in ggml order (ne[0] is the contiguous row length); `offset` is absolute in `path`.
    """

    name: str
    ne: tuple[int, ...]
    qtype: GGMLQuantizationType
    path: str
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_bytes: int

    @property
    def header_bytes(self) -> int:
        return self.data_offset


class _Cursor:
    """Buffered sequential reader that turns a short read into a 'truncated header' error."""

    def __init__(self, fh: BinaryIO, path: str, file_bytes: int):
        self.fh = fh
        self.path = path
        self.file_bytes = file_bytes
        self.pos = 0

    def read(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.file_bytes:
            raise ModelError(
                f"{self.path}: truncated GGUF header: {what} at byte {self.pos} needs {n} bytes "
                f"but the file is {self.file_bytes} bytes"
            )
        data = self.fh.read(n)
        if len(data) != n:
            raise ModelError(f"{self.path}: truncated GGUF header while reading {what} at byte {self.pos}")
        self.pos += n
        return data

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what + " length")
        raw = self.read(n, what)
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        try:
            vt = GGUFValueType(vtype)
        except ValueError:
            raise ModelError(f"{self.path}: corrupt GGUF header: unknown value type {vtype} for {what}") from None
        if vt == GGUFValueType.STRING:
            return self.string(what)
        if vt == GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise ModelError(f"{self.path}: corrupt GGUF header: {what} nests arrays more than "
                                 f"{MAX_ARRAY_DEPTH} deep at byte {self.pos}")
            item_type = self.scalar("<I", what + " item type")
            count = self.scalar("<Q", what + " item count")
            if item_type in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[GGUFValueType(item_type)]
                size = struct.calcsize(fmt)
                raw = self.read(size * count, what)
                return list(struct.unpack(f"<{count}{fmt[1]}", raw)) if count else []
            return [self.value(item_type, what, depth + 1) for _ in range(count)]
        return self.scalar(_SCALAR_FORMATS[vt], what)


def _name(text: str) -> str:
    """A key or tensor name as an error quotes it: short, control characters escaped."""
    return one_line(text, NAME_CHARS)


def _ggml_nbytes(name: str, ne: tuple[int, ...], qtype: GGMLQuantizationType, path: str) -> int:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if ne and ne[0] % block_elems:
        raise ModelError(
            f"{path}: corrupt GGUF header: tensor {_name(name)} row of {ne[0]} elements is not a multiple of "
            f"{qtype.name}'s block of {block_elems}"
        )
    n = 1
    for d in ne:
        n *= d
    return n // block_elems * block_bytes


GGML_MAX_DIMS = 4                    # ggml.h: llama.cpp refuses a tensor of more dimensions
_INT64_MAX = 2 ** 63 - 1


def check_as_llama(path: str, keys: list[str], infos: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]],
                   alignment: int) -> None:
    """Refuse what llama.cpp's gguf_init_from_reader refuses, in its order and with its words (so
    bmoe-py refuses each file bmoe-cli does: tests/engine/test_header_classes.py): a key stored twice; a
    tensor name stored
    twice; more than GGML_MAX_DIMS dimensions; an element count past int64; a row that is not a
    whole number of its type's blocks; and any tensor whose offset is not the running end of the
    ones before it, each padded to `alignment` (which catches overlapping, misaligned, reversed and
    all-zero offsets, and a type relabelled to one of another size). `infos` are (name, ne, type,
    offset relative to the data section)."""
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            # sic: llama.cpp's message says "tensors" for two keys' indices
            raise ModelError(f"{path}: duplicate key '{_name(key)}' for tensors {seen[key]} and {i}")
        seen[key] = i
    names: dict[str, int] = {}
    for i, (name, ne, qtype, _rel) in enumerate(infos):
        shown = _name(name)
        if name in names:
            raise ModelError(f"{path}: duplicate tensor name '{shown}' for tensors {names[name]} and {i}")
        names[name] = i
        if len(ne) > GGML_MAX_DIMS:
            raise ModelError(f"{path}: tensor '{shown}' has invalid number of dimensions: {len(ne)} > {GGML_MAX_DIMS}")
        if any(d > _INT64_MAX for d in ne):
            raise ModelError(f"{path}: tensor '{shown}' has invalid number of elements: {list(ne)}")
        n = 1
        for d in ne:
            n *= d
        if n > _INT64_MAX:
            raise ModelError(f"{path}: total number of elements in tensor '{shown}' with shape {list(ne)} is >= "
                             f"{_INT64_MAX}")
        block_elems, _ = GGML_QUANT_SIZES[qtype]
        if ne and ne[0] % block_elems:
            raise ModelError(f"{path}: tensor '{shown}' of type {int(qtype)} ({qtype.name.lower()}) has {ne[0]} "
                             f"elements per row, not a multiple of block size ({block_elems})")
    expected = 0
    for name, ne, qtype, rel in infos:
        if rel != expected:
            raise ModelError(f"{path}: tensor '{_name(name)}' has offset {rel}, expected {expected}")
        nbytes = _ggml_nbytes(name, ne, qtype, path)
        expected += -(-nbytes // alignment) * alignment


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse one GGUF file's header; raise ModelError with a one-line reason if it is unusable."""
    path = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO opens without waiting for a writer, and is refused by its fstat below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ModelError(f"{path}: cannot open model: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # a FIFO would hang the read, /dev/zero never ends, a folder is none
        os.close(fd)
        raise ModelError(f"{path}: not a regular file (a model is a .gguf file)")
    file_bytes = st.st_size
    # opened here, used in the `with` below (the flag only matters for a FIFO, refused above)
    fh = os.fdopen(fd, "rb", buffering=MIB)
    with fh:
        cur = _Cursor(fh, path, file_bytes)
        if file_bytes < 4 or fh.read(4) != GGUF_MAGIC:
            raise ModelError(f"{path}: not a GGUF file (no GGUF magic at byte 0)")
        cur.pos = 4
        version = cur.scalar("<I", "version")
        if version not in (2, 3):
            raise ModelError(f"{path}: unsupported GGUF version {version} (this reader knows 2 and 3)")
        n_tensors = cur.scalar("<Q", "tensor count")
        n_kv = cur.scalar("<Q", "metadata count")
        # A wild count needs no guard: every entry reads bytes, so the cursor hits the end first.
        metadata: dict[str, Any] = {}
        keys: list[str] = []
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            keys.append(key)
            vtype = cur.scalar("<I", f"type of {_name(key)}")
            metadata[key] = cur.value(vtype, _name(key))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
                or alignment & (alignment - 1):
            raise ModelError(f"{path}: corrupt GGUF header: general.alignment={one_line(str(alignment))} is not a "
                             "power of two")
        raw_infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor name #{i}")
            shown = _name(name)
            n_dims = cur.scalar("<I", f"dims of {shown}")
            if n_dims > 8:
                raise ModelError(f"{path}: corrupt GGUF header: tensor {shown} has {n_dims} dimensions")
            ne = tuple(cur.scalar("<Q", f"shape of {shown}") for _ in range(n_dims))
            qtype_raw = cur.scalar("<I", f"type of {shown}")
            try:
                qtype = GGMLQuantizationType(qtype_raw)
            except ValueError:
                raise ModelError(f"{path}: corrupt GGUF header: tensor {shown} has unknown type {qtype_raw}") from None
            rel = cur.scalar("<Q", f"offset of {shown}")
            raw_infos.append((name, ne, qtype, rel))
        data_offset = (cur.pos + alignment - 1) // alignment * alignment
        check_as_llama(path, keys, raw_infos, alignment)
        tensors = []
        for name, ne, qtype, rel in raw_infos:
            nbytes = _ggml_nbytes(name, ne, qtype, path)
            offset = data_offset + rel
            if offset + nbytes > file_bytes:
                raise ModelError(
                    f"{path}: truncated GGUF: tensor {_name(name)} ends at byte {offset + nbytes} "
                    f"but the file is {file_bytes} bytes"
                )
            tensors.append(TensorInfo(name, ne, qtype, path, offset, nbytes))
    return GGUFHeader(path, version, metadata, tuple(tensors), alignment, data_offset, file_bytes)
