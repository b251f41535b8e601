"""engine.forward.fastpath: the fused one-token decode gives the numpy path's logits bit for bit.

Each test decodes the same tokens twice, through the fused calls (Model's default) and through
engine.forward.graph's numpy steps (`fast_decode=False`), and compares every logit's bits, the KV cache
and what the expert source and the route observer saw.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.forward.experts import ResidentExpertSource
from engine.forward.graph import Model
from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from engine.kernels import native
from engine.stream.source import StreamingExpertSource
from tests.engine.test_kernels import random_blocks

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "upstream" / "host-v2-0.19.0" / "tiny-qwen3moe.gguf"
PROMPT = [1, 450, 7483, 310, 5546, 338]


class Recorder:
    """A source wrapper that logs each fetch (layer, routed ids) and hands the inner slices on."""

    def __init__(self, inner, log: list):
        self.inner, self.log = inner, log
        self.stable_slices = getattr(inner, "stable_slices", False)

    def fetch(self, layer, experts):
        self.log.append(("fetch", layer, list(experts)))
        return self.inner.fetch(layer, experts)


def _decode(path, fast: bool, n: int, prompt=None, threads: int = 1, hp_change=None, source=None, n_ctx=2048,
            upstream_threads=1):
    """Greedy decode of n tokens: (tokens, logits per step, fetch/route log, model)."""
    shape = load_model_shape(path)
    log: list = []
    inner = source(shape) if source else ResidentExpertSource(shape)
    model = Model(shape, Recorder(inner, log), n_ctx=n_ctx, threads=threads, upstream_threads=upstream_threads,
                  fast_decode=fast,
                  on_route=lambda il, pos, ids, w: log.append(("route", il, pos.tolist(), ids.tolist(), w.tobytes())))
    if hp_change:
        model.hp = dataclasses.replace(model.hp, **hp_change)
    vocab = model.hp.n_vocab
    prompt = [t % vocab for t in (prompt or PROMPT)]
    logits = model.prefill(prompt)
    del log[:]
    tokens, steps = [], []
    try:
        for _ in range(n):
            token = int(np.argmax(logits))
            tokens.append(token)
            logits = model.decode(token)
            steps.append(logits.view(np.uint32).copy())
    finally:
        if hasattr(inner, "close"):
            inner.close()
    return tokens, steps, log, model


def _same(path, n=24, **kw):
    a_tok, a_logits, a_log, a = _decode(path, False, n, **kw)
    b_tok, b_logits, b_log, b = _decode(path, True, n, **kw)
    assert a.fast_why_not == "fast_decode=False" and b.fast_why_not is None, b.fast_why_not
    assert b_tok == a_tok
    assert all(np.isfinite(x.view(np.float32)).all() for x in b_logits)    # bits of numbers, not of NaNs
    for step, (x, y) in enumerate(zip(a_logits, b_logits)):
        assert np.array_equal(x, y), f"step {step}: logits differ ({np.count_nonzero(x != y)} of {x.size})"
    assert b_log == a_log      # same fetches (routing order) and the same routes (weights' bits)
    n_kv = a.state.n_past
    assert b.state.n_past == n_kv
    for il in range(a.hp.n_layer):
        assert np.array_equal(a.state.k[il][:, :n_kv].view(np.uint16), b.state.k[il][:, :n_kv].view(np.uint16))
        assert np.array_equal(a.state.v[il][:, :n_kv].view(np.uint16), b.state.v[il][:, :n_kv].view(np.uint16))
    return b


@pytest.fixture(scope="module")
def synth_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fastpath")
    out = {}
    for quant in ("F32", "F16", "Q8_0", "Q4_0"):
        path = d / f"qwen-{quant}.gguf"
        write_model(path, synth_options("qwen3moe", layers=2, experts=8, top_k=3, hidden=128, expert_ffn=96, vocab=300,
                                        quant=quant, seed=3))
        out[quant] = path
    path = d / "gptoss.gguf"
    write_model(path, synth_options("gpt-oss", layers=2, experts=4, top_k=2, hidden=128, expert_ffn=128, vocab=260))
    out["gpt-oss"] = path
    return out


def test_tiny_model_logits_kv_and_routes_are_the_numpy_paths():
    _same(TINY, n=48)


def test_tiny_model_with_two_threads_is_the_same():
    _same(TINY, n=8, threads=2)


@pytest.mark.parametrize("quant", ["F32", "F16", "Q8_0", "Q4_0"])
def test_synthetic_models_of_each_weight_type(synth_models, quant):
    """F16 dense weights (the f16-rounded activation), Q8_0 / Q4_0 experts (the Q8_0 one), three
    routed experts, an expert FFN width that is not a power of two."""
    _same(synth_models[quant])


@pytest.mark.parametrize("quant", ["F16", "Q8_0"])
def test_generic_code_gives_the_same_logits(synth_models, quant):
    """The library's generic code (no AVX2/F16C) in the fused attention and products: the same bits."""
    kernels = native.load()
    assert kernels is not None
    kernels.set_generic(True)
    try:
        fast = _decode(synth_models[quant], True, 12)
    finally:
        kernels.set_generic(False)
    numpy_path = _decode(synth_models[quant], False, 12)
    assert fast[0] == numpy_path[0] and all(np.array_equal(x, y) for x, y in zip(fast[1], numpy_path[1]))


def test_sliding_window_mask_and_softmax_weight_gating(synth_models):
    """A window of 5 cells on every layer, and gpt-oss's gating (top-k logits, then a softmax of
    those) without the normalisation, on a qwen3moe body."""
    _same(synth_models["Q8_0"], n=16, hp_change=dict(n_swa=5, swa_layers=(True, True), gating="softmax_weight",
                                                       norm_weights=False, weights_scale=1.5))


@pytest.mark.parametrize("upstream_threads", [1, 3, 4])
def test_decode_across_the_split_kv_threshold(upstream_threads):
    """Past 256 used cells (n_ctx 1024, so the padded view reaches 512) ggml splits a decode's
    attention into one chunk per upstream thread and merges them: split as the numpy path splits."""
    prompt = [(7 * i) % 250 + 3 for i in range(250)]
    model = _same(TINY, n=12, prompt=prompt, n_ctx=1024, upstream_threads=upstream_threads)
    assert model.state.n_past == 262


def test_streaming_source_gives_the_same_logits(synth_models, tmp_path):
    """A streamer's buffers (a cache too small for every expert, so slices move) instead of the map."""
    def streamer(shape):
        return StreamingExpertSource(shape, 6 * shape.moe_layers[0].expert_bytes, io_threads=1)
    _same(synth_models["Q4_0"], n=16, source=streamer)


def _k_quant_copy(src: Path, dest: Path) -> Path:
    """`src` (an F32 model) with its attention and expert matrices replaced by random Q4_K blocks
    (Q6_K for the downs), every other tensor and key as it was."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dest, arch=str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    for i, t in enumerate(reader.tensors):
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        qtype = Q.Q6_K if kind == "ffn_down_exps" else Q.Q4_K if kind in (
            "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps") else None
        ne = [int(v) for v in t.shape]
        if qtype is None:
            writer.add_tensor(t.name, np.array(t.data))
            continue
        blocks = random_blocks(qtype, int(np.prod(ne[1:])), ne[0], seed=i)     # [rows, row bytes]
        writer.add_tensor(t.name, blocks.reshape([*reversed(ne[1:]), blocks.shape[1]]), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


@pytest.fixture(scope="module")
def k_quant_model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fastpath-k")
    src = d / "f32.gguf"
    write_model(src, synth_options("qwen3moe", layers=2, experts=8, top_k=2, hidden=256, expert_ffn=256, vocab=300,
                                   quant="F32", seed=4))
    return _k_quant_copy(src, d / "q4k.gguf")


@pytest.mark.parametrize("threads", [1, 2])
def test_k_quants_of_compiled_size(k_quant_model, monkeypatch, threads):
    """Q4_K / Q6_K matrices (the Q8_K activation made in C): the numpy path's bits, once both paths
    multiply them with the compiled loops (these are smaller than COMPILED_MIN_WEIGHTS, so the
    floor is lowered for the test, for both paths alike). At -t 2 the q/k/v step and the experts'
    gate/up step are big enough to be shared out among two threads."""
    from engine.kernels import matmul as kernels

    monkeypatch.setattr(kernels, "COMPILED_MIN_WEIGHTS", 0)
    model = _same(k_quant_model, n=16, threads=threads)
    assert model.weights.qtype("blk.0.attn_q.weight") == Q.Q4_K
    assert model.shape.moe_layers[0].tensors[1].qtype in (Q.Q4_K, Q.Q6_K)


def test_small_k_quants_keep_the_numpy_path(k_quant_model):
    """Below COMPILED_MIN_WEIGHTS the numpy path multiplies a K-quant with float64 tiles (an ulp
    from the compiled loop), so such a model is not fused."""
    model = Model(load_model_shape(k_quant_model))
    model.prefill([5, 6, 7])
    assert model.fast_why_not is not None and "Q4_K" in model.fast_why_not


@pytest.mark.parametrize("upstream_threads", [1, 4])
def test_gpt_oss_biases_sinks_clamped_swiglu_and_yarn(synth_models, upstream_threads):
    """gpt-oss: q/k/v/output, router and expert biases, a sink per head, swiglu_oai, softmax_weight
    gating, YaRN rope, a 128-cell window on every other layer; past 256 cells too (the sinks join
    the first chunk of a split decode), where the window leaves that chunk with no visible cell."""
    _same(synth_models["gpt-oss"], n=12)
    prompt = [(5 * i) % 250 + 3 for i in range(600)]
    _same(synth_models["gpt-oss"], n=6, prompt=prompt, n_ctx=1024, upstream_threads=upstream_threads)


def test_fused_swiglu_oai_is_the_numpy_one_at_and_past_its_clamps():
    """The fused experts' swiglu_oai against ops.swiglu_oai, bit for bit, on values around and far
    past the ±7 clamps (a synthetic model's activations never reach them)."""
    import ctypes

    from engine.kernels.ops import swiglu_oai

    kernels = native.load()
    assert kernels is not None
    rng = np.random.default_rng(9)
    edges = np.array([7.0, -7.0, 6.9999995, 7.0000005, 0.0, -0.0, 1e-30, 80.0, -80.0, 1e4, -1e4], dtype=np.float32)
    gate = np.concatenate([edges, np.repeat(edges, edges.size), (rng.standard_normal(4000) * 6).astype(np.float32)])
    up = np.concatenate([edges[::-1], np.tile(edges, edges.size), (rng.standard_normal(4000) * 6).astype(np.float32)])
    out = np.empty_like(gate)
    fn = kernels.lib.bmoe_swiglu_oai
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    fn(gate.ctypes.data, up.ctypes.data, gate.size, out.ctypes.data)
    want = swiglu_oai(gate, up)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_models_without_fused_loops_keep_the_numpy_path():
    exact = Model(load_model_shape(TINY), numerics="float32")
    exact.prefill([5, 6])
    assert exact.fast_why_not == "numerics float32"
