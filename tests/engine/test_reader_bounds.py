"""Readers' limits: a split name with impossible shard numbers and a block_count no engine loads
are handled in one line (`Error: ...`, exit 1), never a traceback. Real synthesized GGUFs, edited
in their header; the property test draws the block_count and the shard numbers."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import ModelError
from engine.gguf.inspect import inspect_model
from engine.gguf.model import MAX_LAYERS, load_model_shape, split_paths
from engine.gguf.synth import synth_options, write_model
from tests.engine.gguf_mutants import _walk

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_U32, _U64 = 4, 10


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bounds") / "m.gguf"
    write_model(path, synth_options("qwen3moe", layers=2, experts=4, top_k=2, hidden=64, expert_ffn=32, vocab=260))
    return path


def with_uint(path: Path, out: Path, key: str, value: int, vtype: int) -> Path:
    """`path` with metadata `key` set to `value` as u32 or u64, the header re-padded to 32 bytes."""
    data = path.read_bytes()
    end_of_header = inspect_model(str(path)).shape.header_bytes
    header, body = data[:end_of_header], data[end_of_header:]
    k = key.encode()
    at = header.index(struct.pack("<Q", len(k)) + k) + 8 + len(k)
    old = {_U32: 4, _U64: 8}[struct.unpack_from("<I", header, at)[0]]
    fields, _ = _walk(header)
    infos_end = fields[-1][0] + fields[-1][1]
    new = struct.pack("<I", vtype) + value.to_bytes(8 if vtype == _U64 else 4, "little")
    infos = header[:at] + new + header[at + 4 + old:infos_end]
    out.write_bytes(infos + b"\0" * (-len(infos) % 32) + body)
    return out


def _run(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*map(str, args)], capture_output=True, text=True, errors="replace", timeout=120, cwd=ROOT)


def _one_line_refusal(p: subprocess.CompletedProcess[str], word: str) -> None:
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert word in last and last.lower().startswith(("error: ", "error: failed to load model")), last


@pytest.mark.parametrize("value,vtype", [(2**32 - 1, _U32), (2**63, _U64)])
def test_block_count_no_engine_loads_is_one_line_for_bmoe_py_and_inspect(model, tmp_path, value, vtype):
    bad = with_uint(model, tmp_path / "bad.gguf", "qwen3moe.block_count", value, vtype)
    _one_line_refusal(_run(BIN / "bmoe-py", "-m", bad, "-p", "hi", "-n", "1", "-t", "1"), "block_count")
    _one_line_refusal(_run(BIN / "bmoe-fleet", "model", "inspect", bad), "block_count")


@pytest.mark.parametrize("value", [0, MAX_LAYERS + 1])
def test_block_count_bounds_are_llama_cpps(model, tmp_path, value):
    with pytest.raises(ModelError, match=f"block_count={value} is not 1 to {MAX_LAYERS}"):
        load_model_shape(with_uint(model, tmp_path / "bad.gguf", "qwen3moe.block_count", value, _U32))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(value=st.integers(0, 2**64 - 1))
def test_any_block_count_is_priced_or_refused(model, tmp_path_factory, value):
    bad = with_uint(model, tmp_path_factory.mktemp("bc") / "bad.gguf", "qwen3moe.block_count", value, _U64)
    try:
        shape = load_model_shape(bad)
    except ModelError as e:
        assert "\n" not in str(e)
        assert not 0 < value <= MAX_LAYERS or "layer" in str(e) or "expert" in str(e)
    else:
        assert 0 < shape.n_layer <= MAX_LAYERS


def test_split_name_of_zero_shards_is_one_file_as_bmoe_cli_loads_it(model, tmp_path):
    odd = tmp_path / "x-00001-of-00000.gguf"
    shutil.copy(model, odd)
    p = _run(BIN / "bmoe-fleet", "model", "inspect", odd)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = _run(BIN / "bmoe-py", "-m", odd, "-p", "hi", "-n", "1", "-t", "1")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = _run(BIN / "bmoe-fleet", "sweep", "--device", "local", "--model", odd, "--dry-run", "-o", tmp_path / "c")
    assert p.returncode == 0 and "Traceback" not in p.stderr and str(odd) in p.stdout, p.stderr


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(no=st.integers(0, 40) | st.just(99999), count=st.integers(0, 40))
def test_any_split_name_gives_its_shards_or_itself(tmp_path_factory, no, count):
    path = str(tmp_path_factory.getbasetemp() / f"m-{no:05d}-of-{count:05d}.gguf")
    try:
        paths = split_paths(path)
    except ModelError as e:  # a real split name whose shards are not there
        assert 1 <= no <= count and "missing" in str(e)
    else:
        assert paths == (path,) and not 1 <= no <= count
