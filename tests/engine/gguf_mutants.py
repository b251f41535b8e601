"""Damaged GGUF headers, and the reader they are fed to (`model inspect`: engine.gguf.header and
engine.gguf.model through engine.gguf.inspect).

Shared by the fuzz test (tests/engine/test_fuzz_gguf.py, hypothesis draws the choices) and the fuzz
benchmark (benchmarks/fuzz_readers.py, random.Random draws them): every choice is `pick(n)`.

A seed is the header of a real synthetic model (engine.gguf.synth); a mutant is that header with one to
three operations applied — a count, length, type, dimension or offset field set to an edge value
(0, 1, 2^32, 2^63, 2^64 - 1 …), a string given an escape sequence and a bidi override (its length
fixed up, so the header stays valid), a type changed to an array of arrays, and the byte-level
operations of tests/results/mutants.py — written to a file that is the model's size again
(sparse), or cut short. "Parsed, or one clean error": `inspect_model` returns a report whose text
is terminal-safe and whose JSON is strict, or raises ModelError with one short terminal-safe line.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import BmoeError
from engine.gguf.inspect import inspect_model
from engine.gguf.synth import synth_options, write_model
from engine.safetext import printable
from tests.results.mutants import flip_byte, junk, truncate

Pick = Callable[[int], int]
MESSAGE_CHARS = 600          # an error names the file and quotes at most a short excerpt
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_U64 = (0, 1, 2, 255, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 63, 2 ** 64 - 1)
_U32 = (0, 1, 2, 8, 9, 13, 31, 255, 2 ** 31, 2 ** 32 - 1)
_NASTY = b"\x1b]0;pwned\x07\x1b[2J\xe2\x80\xae"


@dataclass(frozen=True)
class Seed:
    name: str
    header: bytes                              # the file's bytes up to its tensor data
    file_bytes: int
    fields: tuple[tuple[int, int], ...]        # (offset, size) of every count/length/type/dim/offset field
    strings: tuple[tuple[int, int], ...]       # (offset of the length field, length) of every string


def _walk(header: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    fields: list[tuple[int, int]] = [(4, 4), (8, 8), (16, 8)]
    strings: list[tuple[int, int]] = []
    pos = 24

    def u(size: int) -> int:
        nonlocal pos
        value = int.from_bytes(header[pos:pos + size], "little")
        fields.append((pos, size))
        pos += size
        return value

    def string() -> None:
        nonlocal pos
        at = pos
        n = u(8)
        strings.append((at, n))
        pos += n

    def value(vtype: int) -> None:
        nonlocal pos
        if vtype == _STRING:
            string()
        elif vtype == _ARRAY:
            item, count = u(4), u(8)
            if item in _SCALAR_SIZES:
                pos += _SCALAR_SIZES[item] * count
            else:
                for _ in range(count):
                    value(item)
        else:
            pos += _SCALAR_SIZES[vtype]

    n_tensors, n_kv = struct.unpack_from("<QQ", header, 8)
    for _ in range(n_kv):
        string()
        value(u(4))
    for _ in range(n_tensors):
        string()
        for _ in range(u(4)):
            u(8)
        u(4)
        u(8)
    return fields, strings


def make_seeds(folder: Path) -> list[Seed]:
    """Headers of two small real models (qwen3moe Q8_0, gpt-oss MXFP4), written once into folder."""
    seeds = []
    for name, preset, dims in (("qwen.gguf", "qwen3moe", dict(layers=2, experts=4, top_k=2, hidden=64, expert_ffn=32,
                                                                vocab=260, seed=5)),
                               ("oss.gguf", "gpt-oss", dict(layers=2, experts=4, top_k=2, hidden=64, expert_ffn=32,
                                                             vocab=260, seed=3))):
        path = folder / name
        if not path.exists():
            write_model(path, synth_options(preset, **dims))
        data_offset = inspect_model(str(path)).shape.header_bytes
        header = path.read_bytes()[:data_offset]
        fields, strings = _walk(header)
        seeds.append(Seed(name, header, path.stat().st_size, tuple(fields), tuple(strings)))
    return seeds


# ── operations (each takes the seed for its field map, the bytes so far, and pick) ─────────────────


def set_field(seed: Seed, data: bytes, pick: Pick) -> bytes:
    at, size = seed.fields[pick(len(seed.fields))]
    values = _U64 if size == 8 else _U32
    return data[:at] + values[pick(len(values))].to_bytes(size, "little") + data[at + size:]


def nasty_string(seed: Seed, data: bytes, pick: Pick) -> bytes:
    """A key, value or tensor name given control characters (its length fixed up: still valid)."""
    at, n = seed.strings[pick(len(seed.strings))]
    if data[at:at + 8] != n.to_bytes(8, "little"):
        return data                              # an earlier operation moved things: leave it
    new = _NASTY + data[at + 8:at + 8 + n]
    return data[:at] + len(new).to_bytes(8, "little") + new + data[at + 8 + n:]


def nest_arrays(seed: Seed, data: bytes, pick: Pick) -> bytes:
    """A value's type made an array of arrays of arrays … (each level reads its own header)."""
    at = 24 + 8 + seed.strings[0][1]              # the first key's value type
    depth = 1 + pick(64)
    nested = b"".join(struct.pack("<IQ", _ARRAY, 1) for _ in range(depth)) + struct.pack("<IQ", 4, 1)
    return data[:at] + struct.pack("<I", _ARRAY) + nested[4:] + struct.pack("<I", 0) + data[at + 4:]


def _bytes_op(op):
    return lambda seed, data, pick: op(data, pick)


OPERATIONS = (set_field, set_field, nasty_string, nest_arrays, _bytes_op(flip_byte), _bytes_op(truncate),
              _bytes_op(junk))


def mutate(seed: Seed, pick: Pick, n_ops: int) -> tuple[bytes, int]:
    """The mutant header and the size of the file it starts (the model's size, or cut short)."""
    data = seed.header
    for _ in range(n_ops):
        data = OPERATIONS[pick(len(OPERATIONS))](seed, data, pick)
    size = seed.file_bytes if pick(4) else pick(seed.file_bytes + 1)
    return data, max(size, 0)


def inspect_mutant(header: bytes, file_bytes: int, folder: Path) -> str:
    """Write the mutant (sparse to `file_bytes`) and inspect it: "accepted" or "refused"; an
    AssertionError (or any other exception) is a failure of the property."""
    path = folder / "mutant.gguf"
    with open(path, "wb") as fh:
        fh.write(header[:file_bytes] if file_bytes < len(header) else header)
        fh.truncate(max(file_bytes, 0))
    try:
        report = inspect_model(str(path))
    except BmoeError as e:
        message = str(e)
        assert "\n" not in message and printable(message) == message, message[:300]
        assert len(message) <= MESSAGE_CHARS, f"{len(message)} characters: {message[:200]}…"
        return "refused"
    finally:
        os.unlink(path)
    assert printable(report.text) == report.text, "raw control characters in inspect's text"
    json.dumps(report.data, allow_nan=False)
    assert all(len(line) <= 400 for line in report.text.splitlines())
    return "accepted"
