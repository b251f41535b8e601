"""engine.forward.graph: bmoe-cli's bytes on its own tiny model, and gpt-oss against a float64 reference."""

from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter

from engine.errors import ForwardError, ModelError
from engine.forward.attention import FA_TILE_Q, attend, attention_mask
from engine.forward.experts import ResidentExpertSource, dequantize_expert
from engine.forward.graph import Model, Sampler
from engine.forward.weights import DenseWeights
from engine.gguf.header import TensorInfo
from engine.gguf.hparams import Hparams
from engine.gguf.model import ExpertLayer, load_model_shape
from engine.gguf.tokenizer import load_tokenizer
from engine.kernels.ops import mul_mat, rope_cos_sin, swiglu_oai

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "host-v2-0.19.0"
TINY = UPSTREAM / "tiny-qwen3moe.gguf"
PROMPT = "The capital of Japan is"


# ------------------------------------------------------------------------------------------------
# the upstream fixture: bmoe-cli 0.19.0 on tiny-qwen3moe.gguf, 32 tokens, greedy
# ------------------------------------------------------------------------------------------------

def _upstream_generated_bytes(name: str) -> bytes:
    out = (UPSTREAM / name).read_bytes()
    assert out.startswith(PROMPT.encode())
    return out[len(PROMPT):out.index(b"\n\ngeneration: 32 tokens")]


def _upstream_routes() -> dict[tuple[int, int, int], tuple[int, float]]:
    """(step, layer, slot) -> (expert, weight) from the engine's route trace."""
    lines = [line for line in (UPSTREAM / "tiny_auto.route.csv").read_text().splitlines() if not line.startswith("#")]
    return {(int(r["step"]), int(r["layer"]), int(r["slot"])): (int(r["expert"]), float(r["weight"]))
            for r in csv.DictReader(lines)}


class CountingSource:
    """Wraps a source, records every fetch, and hands out private copies as a streamer would."""

    def __init__(self, inner, log: list):
        self.inner = inner
        self.log = log

    def fetch(self, layer, experts):
        self.log.append(("fetch", layer, list(experts)))
        return {e: tuple(np.array(s, copy=True) for s in slices) for e, slices in self.inner.fetch(layer, experts).items()}


@pytest.fixture(scope="module")
def tiny_run():
    shape = load_model_shape(TINY)
    tok = load_tokenizer(shape.metadata)
    prompt = tok.tokenize(PROMPT)
    log: list = []
    model = Model(shape, CountingSource(ResidentExpertSource(shape), log),
                  on_route=lambda il, pos, ids, w: log.append(("route", il, pos, ids, w)))
    gen = model.generate(prompt, 32)
    return shape, tok, prompt, gen, log


def test_tiny_model_prints_exactly_bmoe_clis_bytes(tiny_run):
    _, tok, prompt, gen, _ = tiny_run
    expected = _upstream_generated_bytes("tiny_mmap.out")
    # all four upstream runs (mmap, auto cache, cold cache, progress) printed the same answer
    assert {_upstream_generated_bytes(n) for n in ("tiny_mmap.out", "tiny_auto.out", "tiny_c0_warm.out")} == {expected}
    assert len(prompt) == 35
    assert len(gen.tokens) == 32 and not gen.stopped_at_eog
    assert tok.detokenize(gen.tokens) == expected
    # upstream decodes every emitted token, the 32nd too: 35 prefill steps + 32 decode steps
    assert gen.n_decode == 32


def test_tiny_model_routes_like_the_upstream_route_trace(tiny_run):
    *_, log = tiny_run
    mine = {}
    for event in log:
        if event[0] == "route":
            _, layer, positions, ids, weights = event
            for pos, row_ids, row_w in zip(positions, ids, weights):
                for slot, (e, w) in enumerate(zip(row_ids, row_w)):
                    mine[(int(pos), layer, slot)] = (int(e), float(w))
    upstream = _upstream_routes()
    # same (step, layer, slot) set: prefill routes 35 tokens in layers 0-2 but only the last
    # prompt token in layer 3 (llama.cpp computes the last layer for output rows only)
    assert set(mine) == set(upstream)
    assert {s for (s, layer, _) in mine if layer == 3 and s < 35} == {34}
    assert [mine[k][0] for k in sorted(upstream)] == [upstream[k][0] for k in sorted(upstream)]
    assert max(abs(mine[k][1] - upstream[k][1]) for k in upstream) < 1e-5


def test_fetch_is_called_once_per_layer_per_batch_with_the_routed_experts(tiny_run):
    shape, *_, log = tiny_run
    fetches = [e for e in log if e[0] == "fetch"]
    assert len(fetches) == shape.n_layer * (1 + 32)
    for route, fetch in zip(log[0::2], log[1::2]):
        assert route[0] == "route" and fetch[0] == "fetch" and route[1] == fetch[1]
        assert fetch[2] == [int(e) for e in route[3].ravel()]  # routing order, repeats kept
    assert [f[1] for f in fetches[:4]] == [0, 1, 2, 3]


def test_generation_stops_before_an_end_of_generation_token(tiny_run):
    shape, _, prompt, gen, _ = tiny_run
    model = Model(shape)
    stopped = model.generate(prompt, 32, eog_ids={gen.tokens[3]})
    assert stopped.tokens == gen.tokens[:3] and stopped.stopped_at_eog and stopped.n_decode == 3


def test_bad_inputs_are_one_line_errors(tiny_run):
    shape, *_ = tiny_run
    model = Model(shape, n_ctx=40)
    with pytest.raises(ForwardError, match="empty prompt"):
        model.prefill([])
    with pytest.raises(ForwardError, match="out of range"):
        model.prefill([1, 259])
    model.prefill(list(range(1, 40)))
    model.decode(5)
    with pytest.raises(ForwardError, match="context full"):
        model.decode(5)
    with pytest.raises(ForwardError, match="numerics"):
        Model(shape, numerics="fast")
    with pytest.raises(ForwardError, match="qwen3moe, gpt-oss; this model is llama4"):
        Hparams.from_shape(dataclasses.replace(shape, arch="llama4"))


def test_prefill_in_ubatches_gives_the_same_logits(tiny_run):
    shape, _, prompt, *_ = tiny_run
    whole = Model(shape).prefill(prompt)
    log: list = []
    split = Model(shape, CountingSource(ResidentExpertSource(shape), log), ubatch_tokens=16)
    logits = split.prefill(prompt)
    np.testing.assert_array_equal(logits, whole)
    # 3 ubatches; the last layer has no output rows in the first two, so nothing to fetch there
    assert [layer for _, layer, _ in log] == [0, 1, 2] * 2 + [0, 1, 2, 3]
    assert split.state.n_past == 35


# ------------------------------------------------------------------------------------------------
# numerics pieces
# ------------------------------------------------------------------------------------------------

def _ref_attention(q, k, v, allowed, scale, sinks=None):
    """Plain float64 softmax attention, with an optional per-head sink logit in the denominator."""
    T, H, _ = q.shape
    g = H // k.shape[0]
    out = np.zeros((T, H, v.shape[2]))
    for t in range(T):
        for h in range(H):
            s = (k[h // g].astype(np.float64) @ q[t, h].astype(np.float64)) * scale
            s = np.where(allowed[t], s, -np.inf)
            m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - m)
            denom = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
            out[t, h] = (p / denom) @ v[h // g].astype(np.float64)
    return out.reshape(T, -1)


@pytest.mark.parametrize("n_q", [5, FA_TILE_Q + 3])
def test_attention_with_sinks_matches_float64_softmax(n_q):
    rng = np.random.default_rng(n_q)
    H, Hkv, D, n_past = 4, 2, 16, 7
    N = n_past + n_q
    q = rng.standard_normal((n_q, H, D)).astype(np.float32)
    k = rng.standard_normal((Hkv, N, D)).astype(np.float16)
    v = rng.standard_normal((Hkv, N, D)).astype(np.float16)
    sinks = (rng.standard_normal(H) * 2).astype(np.float32)
    allowed = attention_mask(np.arange(n_past, N), np.arange(N), n_swa=6)
    scale = 1 / np.sqrt(D)
    ours = attend(q, k, v, allowed, scale, sinks)
    ref = _ref_attention(q, k, v, allowed, scale, sinks)
    # under 64 queries ggml rounds Q to f16 and accumulates V in f16; the tiled path is float32
    tol = 3e-3 if n_q < FA_TILE_Q else 1e-5
    assert np.max(np.abs(ours - ref)) < tol
    assert np.max(np.abs(ours - _ref_attention(q, k, v, allowed, scale))) > 20 * tol   # sinks matter


@pytest.mark.parametrize("n_swa", [0, 100])
def test_split_kv_decode_merges_per_thread_chunks(n_swa):
    # One query over 600 used cells (padded to 768): ggml splits the range per thread. With a
    # window of 100 the first chunks are fully masked and the sink must still count once.
    rng = np.random.default_rng(11)
    H, Hkv, D, N = 4, 2, 16, 600
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k = rng.standard_normal((Hkv, N, D)).astype(np.float16)
    v = rng.standard_normal((Hkv, N, D)).astype(np.float16)
    sinks = rng.standard_normal(H).astype(np.float32)
    allowed = attention_mask(np.array([N - 1]), np.arange(N), n_swa)
    one = attend(q, k, v, allowed, 0.25, sinks)
    np.testing.assert_array_equal(attend(q, k, v, allowed, 0.25, sinks, n_kv_pad=768, n_threads=1), one)
    four = attend(q, k, v, allowed, 0.25, sinks, n_kv_pad=768, n_threads=4)
    ref = _ref_attention(q, k, v, allowed, 0.25, sinks)
    assert np.max(np.abs(four - ref)) < 3e-3 and np.max(np.abs(one - ref)) < 3e-3
    assert not np.array_equal(four, one)     # upstream's bytes here depend on its thread count


def test_decode_past_256_cells_follows_upstreams_thread_count():
    shape = load_model_shape(TINY)
    prompt = [int(t) for t in np.random.default_rng(4).integers(3, 259, 300)]
    logits = {}
    for threads in (1, 4):
        model = Model(shape, upstream_threads=threads)
        model.prefill(prompt)
        logits[threads] = model.decode(42)
    np.testing.assert_allclose(logits[1], logits[4], atol=1e-5)
    assert not np.array_equal(logits[1], logits[4])


def test_sliding_window_mask_and_which_layers_slide():
    q_pos, kv_pos = np.arange(10, 14), np.arange(14)
    mask = attention_mask(q_pos, kv_pos, n_swa=4)
    for i, p1 in enumerate(q_pos):
        for p0 in kv_pos:
            assert mask[i, p0] == (p0 <= p1 and p1 - p0 < 4)
    assert attention_mask(q_pos, kv_pos, 0).sum() == sum(p + 1 for p in q_pos)


def test_swiglu_oai_matches_reference_including_the_clamps():
    gate = np.array([-30, -7.5, -1, 0, 0.3, 6.9, 7.0, 7.2, 50], dtype=np.float32)
    up = np.array([-9, -7.1, -7, 0.5, 1, 3, 7.01, 20, -0.2], dtype=np.float32)
    g = np.minimum(gate.astype(np.float64), 7.0)
    ref = g / (1 + np.exp(-1.702 * g)) * (np.clip(up.astype(np.float64), -7, 7) + 1)
    np.testing.assert_allclose(swiglu_oai(gate, up), ref, rtol=1e-6, atol=1e-6)


def test_activation_is_rounded_like_ggmls_vec_dot_type():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    w = rng.standard_normal((5, 128)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(mul_mat(x, w, Q.F32), exact, rtol=1e-6)
    x_q8 = gguf.quants.dequantize(gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0).astype(np.float64)
    np.testing.assert_allclose(mul_mat(x, w, Q.Q8_0), x_q8 @ w.T, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mul_mat(x, w, Q.MXFP4), x_q8 @ w.T, rtol=1e-6, atol=1e-6)
    x_f16 = x.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(mul_mat(x, w, Q.F16), x_f16 @ w.T, rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(mul_mat(x, w, Q.Q8_0) - exact)) > 1e-3   # the rounding is really there


def test_fused_gate_up_expert_splits_gate_first(tmp_path):
    n_embd, n_ff, n_expert = 32, 8, 3
    rng = np.random.default_rng(5)
    gate_up = rng.standard_normal((n_expert, 2 * n_ff, n_embd)).astype(np.float32)
    down = rng.standard_normal((n_expert, n_embd, n_ff)).astype(np.float32)
    path = str(tmp_path / "none.gguf")
    layer = ExpertLayer(0, n_expert, (
        TensorInfo("blk.0.ffn_gate_up_exps.weight", (n_embd, 2 * n_ff, n_expert), Q.F32, path, 0, gate_up.nbytes),
        TensorInfo("blk.0.ffn_down_exps.weight", (n_ff, n_embd, n_expert), Q.F32, path, 0, down.nbytes),
    ))
    raw = (gate_up[1].ravel().view(np.uint8), down[1].tobytes())   # arrays or plain bytes
    mats = dequantize_expert(layer, raw)
    np.testing.assert_array_equal(mats.gate, gate_up[1, :n_ff])
    np.testing.assert_array_equal(mats.up, gate_up[1, n_ff:])
    np.testing.assert_array_equal(mats.down, down[1])
    with pytest.raises(ModelError, match="slice"):
        dequantize_expert(layer, (raw[0][:-4], raw[1]))
    with pytest.raises(ModelError, match="expected 2 expert slices"):
        dequantize_expert(layer, raw[:1])


def test_sampler_greedy_takes_the_first_maximum_and_seeds_reproduce():
    logits = np.array([0.1, 2.0, 2.0, -1.0], dtype=np.float32)
    assert Sampler().sample(logits) == 1
    wide = np.linspace(0, 1, 50).astype(np.float32)
    draws = [[Sampler(temp=5.0, seed=s).sample(wide) for _ in range(1)] for s in range(20)]
    again = [[Sampler(temp=5.0, seed=s).sample(wide) for _ in range(1)] for s in range(20)]
    assert draws == again and len({d[0] for d in draws}) > 1
    assert all(d[0] >= 10 for d in draws)      # top-k 40 keeps only the 40 largest of 50


def test_results_do_not_depend_on_blas_threads():
    # Big enough that OpenBLAS splits the products across threads when it may.
    script = (
        "import hashlib, numpy as np\n"
        "from engine.kernels.ops import mul_mat\nfrom engine.forward.attention import attend, attention_mask\n"
        "from engine.gguf.model import load_model_shape\n"
        "from engine.forward.graph import Model\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.standard_normal((96, 1024)).astype(np.float32)\n"
        "w = rng.standard_normal((1536, 1024)).astype(np.float32)\n"
        "q = rng.standard_normal((70, 8, 64)).astype(np.float32)\n"
        "k = rng.standard_normal((2, 300, 64)).astype(np.float16)\n"
        "allowed = attention_mask(np.arange(230, 300), np.arange(300), 0)\n"
        "h = hashlib.sha256(mul_mat(x, w).tobytes())\n"
        "h.update(mul_mat(x[:1], w).tobytes())\n"
        "h.update(attend(q, k, k, allowed, 0.125).tobytes())\n"
        f"m = Model(load_model_shape({str(TINY)!r}))\n"
        "h.update(m.prefill(list(range(1, 40))).tobytes())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for threads in ("1", "2", "4"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads,
               "PYTHONPATH": str(REPO)}
        res = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                             check=True, timeout=120)
        digests.add(res.stdout.strip())
    assert len(digests) == 1


# ------------------------------------------------------------------------------------------------
# gpt-oss: a tiny model written here, checked against an independent float64 forward
# ------------------------------------------------------------------------------------------------

GPTOSS = dict(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=4, top_k=2, n_ff=64,
              n_vocab=96, n_swa=6, yarn_factor=32.0, n_ctx_orig=4096, freq_base=150000.0, eps=1e-5)


def write_tiny_gptoss(path: Path, seed: int = 0) -> None:
    c = GPTOSS
    rng = np.random.default_rng(seed)
    E, F, V, H, Hkv, D = c["n_embd"], c["n_ff"], c["n_vocab"], c["n_head"], c["n_head_kv"], c["head_dim"]

    def lin(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def vec(n, mean=0.0, sd=0.1):
        return (mean + sd * rng.standard_normal(n)).astype(np.float32)

    w = GGUFWriter(str(path), "gpt-oss")
    w.add_block_count(c["n_layer"])
    w.add_context_length(c["n_ctx_orig"] * 32)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(c["freq_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_expert_count(c["n_expert"])
    w.add_expert_used_count(c["top_k"])
    w.add_expert_feed_forward_length(F)
    w.add_sliding_window(c["n_swa"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(c["yarn_factor"])
    w.add_rope_scaling_orig_ctx_len(c["n_ctx_orig"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(V - 1)] + ["<|return|>"])
    w.add_eos_token_id(V - 1)
    # a Q8_0 embedding table and F16 attention outputs exercise the dense dequant paths too
    w.add_tensor("token_embd.weight", gguf.quants.quantize(rng.standard_normal((V, E)).astype(np.float32), Q.Q8_0),
                 raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", vec(E, 1.0))
    w.add_tensor("output.weight", lin(V, E))
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vec(E, 1.0))
        w.add_tensor(p + "post_attention_norm.weight", vec(E, 1.0))
        for name, n_out in (("attn_q", H * D), ("attn_k", Hkv * D), ("attn_v", Hkv * D)):
            w.add_tensor(p + name + ".weight", lin(n_out, E))
            w.add_tensor(p + name + ".bias", vec(n_out))
        w.add_tensor(p + "attn_output.weight", lin(E, H * D).astype(np.float16))
        w.add_tensor(p + "attn_output.bias", vec(E))
        w.add_tensor(p + "attn_sinks.weight", vec(H, 0.0, 1.5))
        w.add_tensor(p + "ffn_gate_inp.weight", lin(c["n_expert"], E) * 3)
        w.add_tensor(p + "ffn_gate_inp.bias", vec(c["n_expert"]))
        for name, shape in (("gate", (c["n_expert"], F, E)), ("up", (c["n_expert"], F, E)),
                            ("down", (c["n_expert"], E, F))):
            dense = (rng.standard_normal(shape) / np.sqrt(shape[2]) * 2).astype(np.float32)
            w.add_tensor(p + f"ffn_{name}_exps.weight", gguf.quants.quantize(dense, Q.MXFP4), raw_dtype=Q.MXFP4)
            w.add_tensor(p + f"ffn_{name}_exps.bias", (0.1 * rng.standard_normal(shape[:2])).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gptoss_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gptoss") / "tiny-gpt-oss.gguf"
    write_tiny_gptoss(path)
    return path


def _reader_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as float64, through gguf's own reader (not engine.forward.weights)."""
    out = {}
    for t in GGUFReader(str(path)).tensors:
        data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        out[t.name] = np.asarray(data, dtype=np.float64).reshape(tuple(int(d) for d in reversed(t.shape)))
    return out


def _yarn_cos_sin(positions, dim, base, factor, n_ctx_orig, beta_fast=32.0, beta_slow=1.0):
    """YaRN as in HF transformers' _compute_yarn_parameters (rope_type 'yarn')."""
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2) / dim)

    def corr_dim(n_rot):
        return dim * np.log(n_ctx_orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))

    low = max(np.floor(corr_dim(beta_fast)), 0)
    high = min(np.ceil(corr_dim(beta_slow)), dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / max(high - low, 0.001), 0, 1)
    extrapolation = 1 - ramp
    inv = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    mscale = 0.1 * np.log(factor) + 1.0
    ang = np.outer(positions, inv)
    return np.cos(ang) * mscale, np.sin(ang) * mscale


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _q8_0(x: np.ndarray) -> np.ndarray:
    """gguf's own Q8_0 round trip: what ggml feeds an MXFP4 weight (its vec_dot_type is Q8_0)."""
    return gguf.quants.dequantize(gguf.quants.quantize(x.astype(np.float32), Q.Q8_0), Q.Q8_0).astype(np.float64)


def reference_gptoss_logits(path: Path, tokens, *, sinks=True, swa=True, q8_inputs=True) -> np.ndarray:
    c = GPTOSS
    q8 = _q8_0 if q8_inputs else (lambda v: v)
    W = _reader_weights(path)
    H, Hkv, D, k = c["n_head"], c["n_head_kv"], c["head_dim"], c["top_k"]
    T = len(tokens)
    pos = np.arange(T)
    cos, sin = _yarn_cos_sin(pos, D, c["freq_base"], c["yarn_factor"], c["n_ctx_orig"])

    def rope(x):   # NEOX: rotate (i, i + D/2)
        a, b = x[..., :D // 2], x[..., D // 2:]
        cc, ss = cos[:, None], sin[:, None]
        return np.concatenate([a * cc - b * ss, a * ss + b * cc], axis=-1)

    x = W["token_embd.weight"][tokens]
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        h = _rms(x, W[p + "attn_norm.weight"], c["eps"])
        q = rope((h @ W[p + "attn_q.weight"].T + W[p + "attn_q.bias"]).reshape(T, H, D))
        kk = rope((h @ W[p + "attn_k.weight"].T + W[p + "attn_k.bias"]).reshape(T, Hkv, D))
        vv = (h @ W[p + "attn_v.weight"].T + W[p + "attn_v.bias"]).reshape(T, Hkv, D)
        sliding = swa and il % 2 == 0          # gpt-oss: even layers slide, odd layers see everything
        allowed = (pos[None, :] <= pos[:, None]) & (~sliding | (pos[:, None] - pos[None, :] < c["n_swa"]))
        att = _ref_attention(q, kk.transpose(1, 0, 2), vv.transpose(1, 0, 2), allowed, 1 / np.sqrt(D),
                             W[p + "attn_sinks.weight"] if sinks else None)
        x = x + att @ W[p + "attn_output.weight"].T + W[p + "attn_output.bias"]
        h = _rms(x, W[p + "post_attention_norm.weight"], c["eps"])
        logits = h @ W[p + "ffn_gate_inp.weight"].T + W[p + "ffn_gate_inp.bias"]
        moe = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-logits[t])[:k]
            wts = np.exp(logits[t, top] - logits[t, top].max())
            wts /= wts.sum()
            for e, wt in zip(top, wts):
                g = W[p + "ffn_gate_exps.weight"][e] @ q8(h[t]) + W[p + "ffn_gate_exps.bias"][e]
                u = W[p + "ffn_up_exps.weight"][e] @ q8(h[t]) + W[p + "ffn_up_exps.bias"][e]
                g = np.minimum(g, 7.0)
                act = g / (1 + np.exp(-1.702 * g)) * (np.clip(u, -7, 7) + 1)
                moe[t] += wt * (W[p + "ffn_down_exps.weight"][e] @ q8(act) + W[p + "ffn_down_exps.bias"][e])
        x = x + moe
    x = _rms(x, W["output_norm.weight"], c["eps"])
    return (x @ W["output.weight"].T)[-1]


def test_dense_weights_read_what_gguf_reads(gptoss_path):
    shape = load_model_shape(gptoss_path)
    dense = DenseWeights(shape)
    ref = _reader_weights(gptoss_path)
    for name in ("token_embd.weight", "blk.1.attn_output.weight", "blk.0.attn_q.bias", "blk.2.ffn_up_exps.bias"):
        got = dense.get(name)
        # F16 tensors stay F16 views (no float32 copy doubling the dense RSS); values are exact
        storage = np.float16 if dense.qtype(name) == Q.F16 else np.float32
        assert got.dtype == storage and got.shape == ref[name].shape
        np.testing.assert_array_equal(got.astype(np.float32), ref[name])
        assert dense.get(name) is got                       # cached
    fresh = DenseWeights(shape)
    ids = np.array([5, 0, 95, 5])
    np.testing.assert_array_equal(fresh.rows("token_embd.weight", ids), ref["token_embd.weight"][ids])
    assert dense.qtype("token_embd.weight") == Q.Q8_0 and "blk.0.ffn_gate_exps.weight" not in dense
    with pytest.raises(ModelError, match="no tensor"):
        dense.get("blk.9.attn_q.weight")


def test_gptoss_hparams(gptoss_path):
    hp = Hparams.from_shape(load_model_shape(gptoss_path))
    assert hp.swa_layers == (True, False, True, False) and hp.n_swa == GPTOSS["n_swa"]
    assert (hp.gating, hp.norm_weights, hp.ffn_act, hp.ffn_norm) == (
        "softmax_weight", False, "swiglu_oai", "post_attention_norm")
    assert hp.rope.ext_factor == 1.0 and hp.rope.freq_scale == pytest.approx(1 / 32)
    # attn_factor cancels ggml's own (1 + 0.1 ln s) so the net YaRN magnitude is 1 + 0.1 ln 32
    assert hp.rope.attn_factor * (1 + 0.1 * np.log(32)) == pytest.approx(1 + 0.1 * np.log(32), rel=1e-6)


def test_yarn_rope_matches_hf_formula(gptoss_path):
    hp = Hparams.from_shape(load_model_shape(gptoss_path))
    pos = np.array([0, 1, 5, 17, 40])
    cos, sin = rope_cos_sin(pos, hp.rope)
    ref_cos, ref_sin = _yarn_cos_sin(pos, GPTOSS["head_dim"], GPTOSS["freq_base"], GPTOSS["yarn_factor"],
                                     GPTOSS["n_ctx_orig"])
    np.testing.assert_allclose(cos, ref_cos, atol=2e-6)
    np.testing.assert_allclose(sin, ref_sin, atol=2e-6)


def test_gptoss_router_selects_on_logits_then_softmaxes_the_selected(gptoss_path):
    model = Model(load_model_shape(gptoss_path))
    W = _reader_weights(gptoss_path)
    h = np.random.default_rng(9).standard_normal((40, GPTOSS["n_embd"])).astype(np.float32)
    for il in range(GPTOSS["n_layer"]):
        ids, weights = model.route(il, h)
        logits = h.astype(np.float64) @ W[f"blk.{il}.ffn_gate_inp.weight"].T + W[f"blk.{il}.ffn_gate_inp.bias"]
        ref_ids = np.argsort(-logits, axis=1)[:, :GPTOSS["top_k"]]
        sel = np.take_along_axis(logits, ref_ids, 1)
        ref_w = np.exp(sel - sel.max(1, keepdims=True))
        ref_w /= ref_w.sum(1, keepdims=True)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(weights, ref_w, atol=1e-6)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_gptoss_float32_logits_match_an_independent_float64_forward(gptoss_path):
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, GPTOSS["n_vocab"] - 1, 20)]
    ours = Model(load_model_shape(gptoss_path), numerics="float32").prefill(tokens)
    ref = reference_gptoss_logits(gptoss_path, tokens, q8_inputs=False)
    assert _rel(ours, ref) < 1e-5
    # ... and the comparison can tell the architecture's features apart
    for variant in (dict(sinks=False), dict(swa=False)):
        assert _rel(reference_gptoss_logits(gptoss_path, tokens, q8_inputs=False, **variant), ref) > 1e-2, variant


def test_gptoss_ggml_numerics_round_like_llama_cpp(gptoss_path):
    shape = load_model_shape(gptoss_path)
    model = Model(shape)
    W = _reader_weights(gptoss_path)
    h = np.random.default_rng(2).standard_normal((6, GPTOSS["n_embd"])).astype(np.float32)
    # MXFP4 experts see Q8_0-rounded inputs (their vec_dot_type): exactly, up to float32 sums
    for il in range(GPTOSS["n_layer"]):
        ids, wts = model.route(il, h)
        ref = np.zeros(h.shape)
        p = f"blk.{il}."
        for t in range(len(h)):
            for e, wt in zip(ids[t], wts[t]):
                g = W[p + "ffn_gate_exps.weight"][e] @ _q8_0(h[t]) + W[p + "ffn_gate_exps.bias"][e]
                u = W[p + "ffn_up_exps.weight"][e] @ _q8_0(h[t]) + W[p + "ffn_up_exps.bias"][e]
                act = swiglu_oai(g.astype(np.float32), u.astype(np.float32))
                ref[t] += wt * (W[p + "ffn_down_exps.weight"][e] @ _q8_0(act) + W[p + "ffn_down_exps.bias"][e])
        assert _rel(model.moe_ffn(il, h, np.arange(len(h))), ref) < 1e-6
    # end to end the f16 attention and those roundings move the logits, but only a little
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, GPTOSS["n_vocab"] - 1, 20)]
    ggml = model.prefill(tokens)
    plain = Model(shape, numerics="float32").prefill(tokens)
    assert 1e-3 < _rel(ggml, plain) < 0.1
    assert _rel(ggml, reference_gptoss_logits(gptoss_path, tokens)) < _rel(ggml, plain)


def test_gptoss_generation_is_deterministic_and_source_independent(gptoss_path):
    shape = load_model_shape(gptoss_path)
    prompt = [5, 17, 42, 8, 64, 3, 11, 29, 50, 7]
    first = Model(shape).generate(prompt, 12)
    second = Model(shape).generate(prompt, 12)
    log: list = []
    counted = Model(shape, CountingSource(ResidentExpertSource(shape), log),
                    on_route=lambda il, pos, ids, w: log.append(("route", il, ids)))
    third = counted.generate(prompt, 12)
    assert first == second == third
    assert len(first.tokens) == 12
    fetches = [e for e in log if e[0] == "fetch"]
    assert len(fetches) == GPTOSS["n_layer"] * (1 + first.n_decode)
    for route, fetch in zip(log[0::2], log[1::2]):
        assert (route[0], fetch[0], route[1]) == ("route", "fetch", fetch[1])
        assert fetch[2] == [int(e) for e in route[2].ravel()]  # routing order, repeats kept
    # a different prompt takes a different path through the experts
    assert Model(shape).generate(prompt[::-1], 12).tokens != first.tokens

