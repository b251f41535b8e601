"""engine.gguf.synth: real GGUF files in llama.cpp's conventions, bounded memory, atomic output."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from engine.errors import SynthError
from engine.gguf.model import load_model_shape
from engine.gguf.synth import build_vocab, estimate_file_bytes, synth_options, write_model
from engine.units import MIB

TINY = dict(layers=2, experts=4, top_k=2, hidden=64, expert_ffn=64, vocab=260)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _llama_cpp_names(arch: str, n_layer: int) -> set[str]:
    arch_enum = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    bases = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_enum]}
    return {b.format(bid=i) for b in bases for i in range(n_layer)}


@pytest.mark.parametrize("preset, quant", [("qwen3moe", "F32"), ("qwen3moe", "F16"), ("qwen3moe", "Q8_0"),
                                           ("qwen3moe", "Q4_0"), ("gpt-oss", "MXFP4")])
def test_files_follow_llama_cpp_conventions(tmp_path, preset, quant):
    path = tmp_path / f"{preset}-{quant}.gguf"
    write_model(path, synth_options(preset, quant=quant, **TINY))
    reader = GGUFReader(path)  # the gguf package's own reader must accept the file
    arch = reader.fields["general.architecture"].contents()
    assert arch == preset
    names = {t.name for t in reader.tensors}
    bases = {n.rsplit(".", 1)[0] for n in names}
    assert bases <= _llama_cpp_names(arch, 2), bases - _llama_cpp_names(arch, 2)
    for key in ("block_count", "expert_count", "expert_used_count", "embedding_length",
                "attention.head_count", "attention.head_count_kv", "expert_feed_forward_length"):
        assert f"{arch}.{key}" in reader.fields
    experts = [t for t in reader.tensors if t.name.endswith("_exps.weight")]
    assert {t.tensor_type.name for t in experts} == {quant}
    # ggml order: gate/up are [hidden, ffn, experts], down is [ffn, hidden, experts]
    gate = next(t for t in experts if t.name == "blk.0.ffn_gate_exps.weight")
    down = next(t for t in experts if t.name == "blk.0.ffn_down_exps.weight")
    assert list(gate.shape) == [64, 64, 4] and list(down.shape) == [64, 64, 4]
    if preset == "gpt-oss":
        assert {"blk.0.attn_sinks.weight", "blk.1.ffn_down_exps.bias", "blk.0.ffn_gate_inp.bias"} <= names
        assert reader.fields["gpt-oss.attention.sliding_window"].contents() == 128
    else:
        assert {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names


@pytest.mark.parametrize("preset", ["qwen3moe", "gpt-oss"])
def test_expert_values_are_finite_and_scaled(tmp_path, preset):
    path = tmp_path / "m.gguf"
    write_model(path, synth_options(preset, **{**TINY, "hidden": 256}))
    reader = GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == "blk.1.ffn_up_exps.weight")
    values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    assert np.isfinite(values).all()
    std = float(values.std())
    assert 0.5 / 16 < std < 2.0 / 16  # about 1/sqrt(row length 256)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_model(a, synth_options("gpt-oss", seed=1, **TINY))
    write_model(b, synth_options("gpt-oss", seed=1, **TINY))
    write_model(c, synth_options("gpt-oss", seed=2, **TINY))
    assert _sha(a) == _sha(b) != _sha(c)


@pytest.mark.parametrize("preset", ["qwen3moe", "gpt-oss"])
def test_size_target_within_5_percent(tmp_path, preset):
    target = 24 * MIB
    path = tmp_path / "sized.gguf"
    result = write_model(path, synth_options(preset, size_bytes=target))
    assert abs(os.path.getsize(path) - target) <= 0.05 * target
    assert result.file_bytes == os.path.getsize(path)
    # inspect reads back the shapes that were chosen
    shape = load_model_shape(path)
    o = result.options
    assert (shape.n_layer, shape.n_expert, shape.top_k) == (o.n_layer, o.n_expert, o.top_k)
    assert estimate_file_bytes(o) == pytest.approx(os.path.getsize(path), rel=0.01)


def test_size_respects_fixed_dimensions(tmp_path):
    o = synth_options("qwen3moe", size_bytes=16 * MIB, layers=6, experts=8, hidden=128)
    assert (o.n_layer, o.n_expert, o.hidden) == (6, 8, 128)
    assert abs(estimate_file_bytes(o) - 16 * MIB) <= 0.05 * 16 * MIB
    with pytest.raises(SynthError, match="cannot reach"):
        synth_options("qwen3moe", size_bytes=64 << 30, layers=2, experts=2, top_k=2, hidden=32)
    with pytest.raises(SynthError, match="at least one free dimension"):
        synth_options("qwen3moe", size_bytes=16 * MIB, layers=2, experts=2, hidden=64, expert_ffn=64)


def test_shape_only_is_sparse_and_prices_like_the_real_file(tmp_path):
    dims = dict(layers=3, experts=8, top_k=2, hidden=128, expert_ffn=128, vocab=300)
    full, shape_only = tmp_path / "full.gguf", tmp_path / "shape.gguf"
    write_model(full, synth_options("qwen3moe", **dims))
    write_model(shape_only, synth_options("qwen3moe", shape_only=True, **dims))
    assert os.path.getsize(full) == os.path.getsize(shape_only)
    st = os.stat(shape_only)
    assert st.st_blocks * 512 < st.st_size / 4  # sparse: the tensor data was never written
    a, b = load_model_shape(full), load_model_shape(shape_only)
    assert a.to_dict([2, 4])["prices"] == b.to_dict([2, 4])["prices"]
    assert a.to_dict([2])["layers"][0]["tensors"][0]["offset"] == b.to_dict([2])["layers"][0]["tensors"][0]["offset"]


def _router_top1_share(path, layer: int, top_k: int) -> float:
    """Share of routings that go to the layer's most popular expert, embeddings through the router."""
    reader = GGUFReader(path)
    t = {x.name: x for x in reader.tensors}
    emb = gguf.quants.dequantize(np.asarray(t["token_embd.weight"].data), t["token_embd.weight"].tensor_type)
    x = emb / np.sqrt((emb**2).mean(axis=1, keepdims=True))
    router = np.asarray(t[f"blk.{layer}.ffn_gate_inp.weight"].data, dtype=np.float32)
    logits = x @ router.T
    if f"blk.{layer}.ffn_gate_inp.bias" in t:
        logits += np.asarray(t[f"blk.{layer}.ffn_gate_inp.bias"].data)
    chosen = np.argsort(-logits, axis=1)[:, :top_k]
    counts = np.bincount(chosen.ravel(), minlength=router.shape[0])
    return counts.max() / chosen.size


@pytest.mark.parametrize("preset", ["qwen3moe", "gpt-oss"])
def test_router_skew_concentrates_routing(tmp_path, preset):
    dims = dict(layers=1, experts=16, top_k=2, hidden=128, expert_ffn=32, vocab=2000)
    flat, skewed = tmp_path / "flat.gguf", tmp_path / "skewed.gguf"
    write_model(flat, synth_options(preset, router_skew=0.0, **dims))
    write_model(skewed, synth_options(preset, router_skew=1.0, **dims))
    uniform = 1 / 16
    assert _router_top1_share(flat, 0, 2) < 2.5 * uniform
    assert _router_top1_share(skewed, 0, 2) > 4 * uniform


def test_vocabulary_is_byte_fallback_spm():
    tokens, scores, types = build_vocab(600)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert types[3:259] == [int(gguf.TokenType.BYTE)] * 256
    assert len(set(tokens)) == 600 and len(scores) == 600
    pieces = set(tokens[259:])
    for p in pieces:  # every multi-character piece is reachable by merging two shorter pieces
        assert len(p) == 1 or any(p[:i] in pieces and p[i:] in pieces for i in range(1, len(p)))


def test_interrupted_write_leaves_nothing(tmp_path):
    out = tmp_path / "m.gguf"

    def stop(done, total):
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_model(out, synth_options("qwen3moe", **TINY), progress=stop)
    assert list(tmp_path.iterdir()) == []


def test_progress_reaches_the_total(tmp_path):
    seen = []
    write_model(tmp_path / "m.gguf", synth_options("qwen3moe", **TINY), progress=lambda d, t: seen.append((d, t)))
    assert seen[-1][0] == seen[-1][1] and all(a[0] <= b[0] for a, b in itertools.pairwise(seen))


@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="qwen3moe", quant="MXFP4"), "not offered for qwen3moe"),
    (dict(preset="gpt-oss", quant="Q8_0"), "not offered for gpt-oss"),
    (dict(preset="qwen3moe", hidden=100), "multiple of 32"),
    (dict(preset="qwen3moe", experts=4, top_k=5), "--top-k must be in 1..4"),
    (dict(preset="qwen3moe", vocab=100), "--vocab must be at least 259"),
    (dict(preset="llama"), "unknown preset"),
])
def test_bad_options(kwargs, message):
    with pytest.raises(SynthError, match=message):
        synth_options(**kwargs)


def test_output_name_must_be_gguf(tmp_path):
    with pytest.raises(SynthError, match=r"must end in \.gguf"):
        write_model(tmp_path / "m.bin", synth_options("qwen3moe", **TINY))


def test_writer_memory_is_bounded(tmp_path):
    """A 320 MiB model is written with a peak RSS well under its size (chunked tensor data)."""
    out = tmp_path / "big.gguf"
    code = (
        "import sys\n"
        "from engine.gguf.synth import synth_options, write_model\n"
        f"write_model({str(out)!r}, synth_options('qwen3moe', size_bytes=320 << 20, layers=4))\n"
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would report pytest's own size.
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    peak_rss_kb = int(done.stdout.split()[-1])
    assert os.path.getsize(out) > 300 * MIB
    assert peak_rss_kb < 120 * 1024, peak_rss_kb
