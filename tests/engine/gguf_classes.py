"""The malformed-header classes llama.cpp's gguf loader refuses (docs/decisions/gguf-header-reader.md), made from a real
synthetic model: its header parsed into fields, one field changed, and the header written again
in front of the model's own tensor data (re-padded to the alignment, so an untouched rebuild is the
model byte for byte). Shared by the differential test (bmoe-cli and bmoe-py on each class) and the
property test (hypothesis picks the tensor, the value, the class).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass
class Tensor:
    name: bytes
    ne: list[int]
    qtype: int
    offset: int


@dataclass
class Parsed:
    version: int
    kvs: list[tuple[bytes, bytes]]          # key, then its type and value exactly as stored
    tensors: list[Tensor]
    data: bytes                             # the tensor data section
    alignment: int = 32
    n_tensors: int | None = None            # the count written; None: len(tensors)
    extra: dict = field(default_factory=dict)


def _value_end(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _SCALAR:
        return pos + _SCALAR[vtype]
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item in _SCALAR:
        return pos + _SCALAR[item] * count
    for _ in range(count):
        pos = _value_end(buf, pos, item)
    return pos


def parse(buf: bytes) -> Parsed:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, kvs, alignment = 24, [], 32
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + n]
        start = pos + 8 + n
        (vtype,) = struct.unpack_from("<I", buf, start)
        end = _value_end(buf, start + 4, vtype)
        kvs.append((key, buf[start:end]))
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", buf, start + 4)[0]
        pos = end
    tensors = []
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", buf, pos)
        name = buf[pos + 8:pos + 8 + n]
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        ne = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
        pos += 4 + 8 * n_dims
        qtype, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        tensors.append(Tensor(name, ne, qtype, offset))
    data_offset = -(-pos // alignment) * alignment
    return Parsed(version, kvs, tensors, buf[data_offset:], alignment)


def build(p: Parsed) -> bytes:
    out = bytearray(b"GGUF")
    count = len(p.tensors) if p.n_tensors is None else p.n_tensors
    out += struct.pack("<IQQ", p.version, count, len(p.kvs))
    for key, raw in p.kvs:
        out += struct.pack("<Q", len(key)) + key + raw
    for t in p.tensors:
        out += struct.pack("<Q", len(t.name)) + t.name + struct.pack("<I", len(t.ne))
        out += struct.pack(f"<{len(t.ne)}Q", *t.ne) + struct.pack("<IQ", t.qtype, t.offset)
    out += bytes(-len(out) % p.alignment)
    return bytes(out) + p.data


def _copy(p: Parsed) -> Parsed:
    return replace(p, kvs=list(p.kvs), tensors=[replace(t, ne=list(t.ne)) for t in p.tensors])


# ── the classes: each takes the parsed model and `i`, a tensor index to act on (any int) ──────────

def overlap(p: Parsed, i: int) -> Parsed:
    """Tensor i (not the first) starts inside the one before it."""
    q, k = _copy(p), 1 + i % (len(p.tensors) - 1)
    q.tensors[k].offset = q.tensors[k - 1].offset + q.alignment * (i % 3)
    return q


def misaligned(p: Parsed, i: int) -> Parsed:
    """Tensor i (not the first) moved by less than the alignment."""
    q, k = _copy(p), 1 + i % (len(p.tensors) - 1)
    q.tensors[k].offset += 1 + i % (q.alignment - 1)
    return q


def reversed_offsets(p: Parsed, i: int) -> Parsed:
    """Two tensors' offsets swapped: the data section is in another order than the infos."""
    q, k = _copy(p), 1 + i % (len(p.tensors) - 1)
    q.tensors[0].offset, q.tensors[k].offset = q.tensors[k].offset, q.tensors[0].offset
    return q


def zero_offsets(p: Parsed, i: int) -> Parsed:
    """Every tensor at offset 0."""
    q = _copy(p)
    for t in q.tensors:
        t.offset = 0
    return q


def duplicate_tensor_name(p: Parsed, i: int) -> Parsed:
    """Tensor i (not the first) renamed to the name of one before it."""
    q, k = _copy(p), 1 + i % (len(p.tensors) - 1)
    q.tensors[k].name = q.tensors[i % k].name
    return q


def duplicate_key(p: Parsed, i: int) -> Parsed:
    """Metadata key i written a second time, at the end (with the same value)."""
    q = _copy(p)
    q.kvs.append(q.kvs[i % len(q.kvs)])
    return q


def tensor_count(p: Parsed, i: int) -> Parsed:
    """The tensor count one lower than the tensor infos written (their bytes then read as padding
    and data), so the data section starts elsewhere."""
    q = _copy(p)
    q.n_tensors = len(q.tensors) - 1 - i % 2
    return q


# GGML types and their (block elements, block bytes); the relabel picks one of another size
_TYPES = {0: (1, 4), 1: (1, 2), 8: (32, 34), 30: (1, 2), 2: (32, 18), 12: (256, 144)}


def relabelled_type(p: Parsed, i: int) -> Parsed:
    """Tensor i's type changed to another whose bytes for its shape differ (F32 <-> F16, Q8_0 …)."""
    q, k = _copy(p), i % len(p.tensors)
    t = q.tensors[k]
    own = _TYPES.get(t.qtype)
    others = [ty for ty, (be, bb) in _TYPES.items() if ty != t.qtype and t.ne[0] % be == 0
              and (own is None or bb * own[0] != own[1] * be)]
    t.qtype = others[i % len(others)]
    return q


def data_past_eof(p: Parsed, i: int) -> Parsed:
    """The last tensor's bytes cut off the end of the file."""
    q = _copy(p)
    q.data = q.data[:max(0, len(q.data) - 1 - i % 4096)]
    return q


CLASSES: dict[str, Callable[[Parsed, int], Parsed]] = {
    f.__name__: f for f in (overlap, misaligned, reversed_offsets, zero_offsets, duplicate_tensor_name,
                            duplicate_key, tensor_count, relabelled_type, data_past_eof)
}
