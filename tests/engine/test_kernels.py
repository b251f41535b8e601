"""engine.kernels.matmul: products on GGUF blocks as stored, checked against gguf's own decoding and
ggml's vec_dot formulas written out here independently; thread-count and path independence;
bounded memory; where the compiled library is kept (zipapp, unwritable places, no compiler)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from engine.forward.graph import Model
from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from engine.kernels import activation as A
from engine.kernels import matmul as K
from engine.kernels import native as J

REPO = Path(__file__).resolve().parents[2]
TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.MXFP4, Q.Q4_K, Q.Q6_K)
EXACT_SCALES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.MXFP4)   # fp32(d_w * d_x) is exact


@pytest.fixture(autouse=True)
def compiled_for_every_size(monkeypatch):
    """The tests' matrices are small: take the compiled loops for them too (unless a test says)."""
    monkeypatch.setattr(K, "COMPILED_MIN_WEIGHTS", 0)


def _halves(rng, n: int, lo: float = -0.05, hi: float = 0.05) -> np.ndarray:
    return np.frombuffer(rng.uniform(lo, hi, n).astype(np.float16).tobytes(), np.uint8).reshape(n, 2)


def random_blocks(qtype: Q, m: int, k: int, seed: int = 0) -> np.ndarray:
    """m rows of k values as valid `qtype` bytes: random payloads, finite scales."""
    rng = np.random.default_rng(seed)
    if qtype == Q.F32:
        return rng.standard_normal((m, k)).astype(np.float32).view(np.uint8)
    if qtype == Q.F16:
        v = rng.standard_normal(m * k).astype(np.float16)
        v[:4] = [6e-8, -3e-5, 0.0, -0.0]               # subnormal halves and signed zeros decode exactly
        return v.view(np.uint8).reshape(m, 2 * k)
    if qtype == Q.BF16:
        return (rng.standard_normal(m * k).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) \
            .view(np.uint8).reshape(m, 2 * k)
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    nb = m * k // block_elems
    raw = rng.integers(0, 256, size=(nb, block_bytes), dtype=np.uint8)
    if qtype in (Q.Q8_0, Q.Q4_0):
        raw[:, 0:2] = _halves(rng, nb)
    elif qtype == Q.MXFP4:
        raw[:, 0] = rng.integers(118, 131, nb)
    elif qtype == Q.Q4_K:
        raw[:, 0:2], raw[:, 2:4] = _halves(rng, nb, 0, 0.01), _halves(rng, nb, 0, 0.01)
    elif qtype == Q.Q6_K:
        raw[:, 208:210] = _halves(rng, nb, 0, 0.01)
    return raw.reshape(m, -1)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


# ---- ggml's vec_dot written out per super-block (ggml-cpu quants.c, generic versions) --------------
def _q4_k_ints(blocks: np.ndarray):
    """(d, dmin, scale[8], min[8], q[256]) of Q4_K blocks [nb, 144]: get_scale_min_k4 and nibbles."""
    d, dmin, s = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4]), blocks[:, 4:16].astype(np.int64)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    qs = blocks[:, 16:144].astype(np.int64).reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 256)      # sub-block 2j: low nibbles, 2j+1: high
    return d, dmin, sc, mn, q


def _q6_k_ints(blocks: np.ndarray):
    """(d, scale[16], q[256]) of Q6_K blocks [nb, 210]: 4 low bits in ql, 2 high in qh, minus 32."""
    ql, qh = blocks[:, 0:128].astype(np.int64), blocks[:, 128:192].astype(np.int64)
    sc, d = blocks[:, 192:208].view(np.int8).astype(np.int64), _f16(blocks[:, 208:210])
    q = np.empty((len(blocks), 256), dtype=np.int64)
    for half in range(2):
        lo, hi = ql[:, 64 * half:64 * half + 64], qh[:, 32 * half:32 * half + 32]
        base = 128 * half
        q[:, base:base + 32] = (lo[:, :32] & 15) | ((hi & 3) << 4)
        q[:, base + 32:base + 64] = (lo[:, 32:] & 15) | (((hi >> 2) & 3) << 4)
        q[:, base + 64:base + 96] = (lo[:, :32] >> 4) | (((hi >> 4) & 3) << 4)
        q[:, base + 96:base + 128] = (lo[:, 32:] >> 4) | (((hi >> 6) & 3) << 4)
    return d, sc, q - 32


def ggml_vec_dot_k(qtype: Q, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_q4_K_q8_K / q6_K_q8_K for every row and token: per super-block
    fp32(d_w * d_x) * (integer sum) [- fp32(dmin * d_x) * sum(min * bsums)], summed in float64."""
    m, n, k = raw.shape[0], x.shape[0], x.shape[1]
    xq, xd, _ = A.Activation(x).form("q8_k")
    yq = xq.astype(np.int64).reshape(n, k // 256, 256)
    yd = xd[:, ::8]                                            # one Q8_K scale per 256 values
    out = np.empty((n, m), dtype=np.float32)
    for r in range(m):
        blocks = raw[r].reshape(k // 256, -1)
        if qtype == Q.Q4_K:
            d, dmin, sc, mn, q = _q4_k_ints(blocks)
            isum = (np.repeat(sc, 32, axis=1)[None] * q[None] * yq).sum(-1)
            msum = (mn[None] * yq.reshape(n, k // 256, 8, 32).sum(-1)).sum(-1)
            D, Dmin = (d[None] * yd).astype(np.float32), (dmin[None] * yd).astype(np.float32)
            total = D.astype(np.float64) * isum - Dmin.astype(np.float64) * msum
        else:
            d, sc, q = _q6_k_ints(blocks)
            isum = (np.repeat(sc, 16, axis=1)[None] * q[None] * yq).sum(-1)
            total = (d[None] * yd).astype(np.float32).astype(np.float64) * isum
        out[:, r] = total.sum(-1).astype(np.float32)
    return out


# ---- the tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_blocks_decode_exactly_as_gguf_decodes_them(qtype):
    m, k = 40, 512
    raw = random_blocks(qtype, m, k)
    got = K.dequantize(K.RawMatrix(raw, qtype, k))
    want = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(m, k)
    np.testing.assert_array_equal(got, want)
    if qtype == Q.F16:
        assert got[0, 0] == np.float32(np.float16(6e-8)) and np.signbit(got[0, 3])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n", [1, 3, 11, 17])
def test_products_are_ggmls_vec_dot(qtype, n):
    """Few tokens take the vec_dot kernel, more the dequantized tiles (17 always): both give
    ggml's value."""
    m, k = 72, 512
    raw = random_blocks(qtype, m, k, seed=n)
    x = np.random.default_rng(100 + n).standard_normal((n, k)).astype(np.float32)
    got = K.matmul(A.Activation(x), K.RawMatrix(raw, qtype, k))
    assert got.dtype == np.float32 and got.shape == (n, m)
    if qtype in (Q.Q4_K, Q.Q6_K):
        want = ggml_vec_dot_k(qtype, raw, x)
        if n > K.direct_max_tokens(qtype):   # the batched path does not round fp32(d_w * d_x): an ulp
            np.testing.assert_allclose(got, want, rtol=3e-7, atol=3e-7 * np.abs(want).max())
            return
        np.testing.assert_array_equal(got, want)
        return
    # Q8_0-dot types see gguf's own Q8_0 round trip of x; F16/BF16 the rounded values; F32 x.
    if qtype in (Q.Q8_0, Q.Q4_0, Q.MXFP4):
        xv = gguf.quants.dequantize(gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0)
    elif qtype == Q.F16:
        xv = x.astype(np.float16)
    elif qtype == Q.BF16:
        xv = gguf.quants.dequantize(gguf.quants.quantize(x, Q.BF16), Q.BF16)
    else:
        xv = x
    w = gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(m, k)
    want = (np.asarray(xv, dtype=np.float64) @ w.T).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    if qtype != Q.F32:  # the conversion is really there
        assert not np.array_equal(got, (x.astype(np.float64) @ w.T).astype(np.float32))


@pytest.mark.parametrize("n", [1, 11])
def test_small_matrices_take_numpys_path_with_the_same_numbers(monkeypatch, n):
    m, k = 64, 512
    x = A.Activation(np.random.default_rng(n).standard_normal((n, k)).astype(np.float32))
    for qtype in TYPES:
        w = K.RawMatrix(random_blocks(qtype, m, k, seed=3), qtype, k)
        compiled = K.matmul(x, w)
        monkeypatch.setattr(K, "COMPILED_MIN_WEIGHTS", m * k + 1)
        plain = K.matmul(x, w)
        monkeypatch.setattr(K, "COMPILED_MIN_WEIGHTS", 0)
        if qtype in EXACT_SCALES:
            np.testing.assert_array_equal(plain, compiled)
        else:   # gguf rounds a K-quant's values to float32 once; ggml rounds the scale product
            np.testing.assert_allclose(plain, compiled, rtol=1e-6, atol=1e-6 * np.abs(compiled).max())


def test_an_exact_activation_is_not_converted():
    """numerics="float32": every type multiplies the float32 activation itself."""
    m, k = 48, 512
    x = np.random.default_rng(8).standard_normal((2, k)).astype(np.float32)
    for qtype in TYPES:
        raw = random_blocks(qtype, m, k, seed=5)
        w = gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(m, k)
        got = K.matmul(A.Activation(x, exact=True), K.RawMatrix(raw, qtype, k))
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("T", [1, 7])
def test_compiled_flash_attention_cells_equal_the_numpy_loop(monkeypatch, T):
    """attention._f16acc_chunk's compiled loop (used once a product has loaded the compiled code)
    is the numpy loop bit for bit: the f16 accumulator's roundings included."""
    from engine.forward import attention

    rng = np.random.default_rng(T)
    H, Hkv, N, D = 8, 2, 40, 64
    q = (rng.standard_normal((T, H, D)) * 2).astype(np.float32)
    k = rng.standard_normal((Hkv, N, D)).astype(np.float16)
    v = (rng.standard_normal((Hkv, N, D)) * np.logspace(-7, 4, D)).astype(np.float16)  # subnormal..large
    allowed = attention.attention_mask(np.arange(N - T, N), np.arange(N), 12 if T > 1 else 0)
    lib, calls = J.load(), []
    assert lib is not None
    loop = lib.f16acc_cells
    monkeypatch.setattr(lib, "f16acc_cells", lambda *a: (calls.append(1), loop(*a)))
    compiled = attention._f16acc_chunk(q, k, v, allowed, 0.125, 3, N)
    assert calls == [1]          # the compiled loop did run
    monkeypatch.setattr(attention, "load", lambda quiet=False: None)
    plain = attention._f16acc_chunk(q, k, v, allowed, 0.125, 3, N)
    for a, b in zip(compiled, plain):
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(plain[0]).all() and (plain[1] > 0).all()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda q: q.name)
def test_float_rows_of_any_length(qtype):
    """Rows of a length that is not whole 32-value groups take the converting loop: same values."""
    m, k = 24, 72
    raw = random_blocks(qtype, m, k, seed=2)
    x = np.random.default_rng(6).standard_normal((2, k)).astype(np.float32)
    got = K.matmul(A.Activation(x), K.RawMatrix(raw, qtype, k))
    xv = A.round_activation(x, qtype).astype(np.float64)
    want = (xv @ gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(m, k).T).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_compiled_q8_0_quantizer_equals_numpys():
    x = np.random.default_rng(12).standard_normal((5, 256)).astype(np.float32) * 3
    x[1, :32] = 0.0                                          # an all-zero block
    x[2, 40] = 1e-30                                         # a tiny amax
    x[3, 64:96] = np.float32(2.5) * np.arange(32) / 31       # ties at .5 steps
    plain = A._to_q8_0(x)
    J.load()
    act = A.Activation(x)
    compiled = act.form("q8_0")
    assert act._int8["q8_0:int8"].dtype == np.int8
    for a, b in zip(compiled, plain):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(act.int8("q8_0"), plain[0].astype(np.int8))


def test_q8_k_activation_is_ggmls_reference_quantizer():
    x = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = -9.0                          # the block's largest magnitude, negative
    xq, xd, xsum = A.Activation(x).form("q8_k")
    assert xq.min() >= -128 and xq.max() <= 127 and np.array_equal(xq, np.rint(xq))
    assert xq[1, 300] == -127 and xd.shape == (3, 16)
    err = np.abs(xq * np.repeat(xd, 32, axis=1) - x)
    assert (err <= np.abs(np.repeat(xd, 32, axis=1)) / 2 + 1e-7).all()
    np.testing.assert_array_equal(xsum, xq.reshape(3, 16, 32).sum(-1))


def test_results_do_not_depend_on_compute_threads():
    m, k = 512, 1024
    for qtype in (Q.Q8_0, Q.F16, Q.Q6_K):
        w = K.RawMatrix(random_blocks(qtype, m, k), qtype, k)
        for n in (1, 9):
            x = A.Activation(np.random.default_rng(n).standard_normal((n, k)).astype(np.float32))
            outs = [K.matmul(x, w, threads=t) for t in (1, 2, 3)]
            assert all(np.array_equal(outs[0], o) for o in outs[1:]), (qtype, n)


def test_a_batch_of_products_is_each_product_alone():
    """One step's products (shared and own activations, three kernel families, several row
    counts) in one batch, on 1 and 2 threads: each equals the same product made alone."""
    k = 512
    rng = np.random.default_rng(21)
    shared = A.Activation(rng.standard_normal((1, k)).astype(np.float32))
    pairs = []
    for i, (qtype, m) in enumerate([(Q.Q8_0, 96), (Q.MXFP4, 40), (Q.Q8_0, 7), (Q.F16, 64), (Q.Q4_K, 33),
                                    (Q.Q4_0, 128), (Q.BF16, 5)]):
        w = K.RawMatrix(random_blocks(qtype, m, k, seed=i), qtype, k)
        own = A.Activation(rng.standard_normal((1 + i % 3, k)).astype(np.float32))
        pairs += [(shared, w), (own, w)]
    alone = [K.matmul(A.Activation(x.x), w) for x, w in pairs]
    for threads in (1, 2):
        together = K.matmul_pairs(pairs, threads)
        assert len(together) == len(alone)
        for got, want in zip(together, alone):
            np.testing.assert_array_equal(got, want)


_TWO_CALLERS = """
import threading, numpy as np, sys
sys.path.insert(0, "tests/engine")
import engine.kernels.matmul as K, engine.kernels.activation as A
from gguf import GGMLQuantizationType as Q
from test_kernels import random_blocks
K.COMPILED_MIN_WEIGHTS = 0
w = K.RawMatrix(random_blocks(Q.Q8_0, 2048, 1024), Q.Q8_0, 1024)
x = A.Activation(np.random.default_rng(0).standard_normal((1, 1024)).astype(np.float32))
want = K.matmul(x, w)
bad = []
def work():
    for _ in range(200):
        if not np.array_equal(K.matmul(x, w, threads=2), want):
            bad.append(1)
callers = [threading.Thread(target=work) for _ in range(3)]
for c in callers: c.start()
for c in callers: c.join()
print("ok" if not bad else "wrong")
"""


def test_parallel_products_from_several_threads_at_once():
    """Three Python threads multiplying with 2 threads each at once still get their numbers (a
    child process, so an abort or a hang fails this test instead of the whole run)."""
    r = subprocess.run([sys.executable, "-c", _TWO_CALLERS], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


_BLOCK_PRODUCTS = """
import sys, hashlib, numpy as np
sys.path.insert(0, "tests/engine")
import engine.kernels.matmul as K, engine.kernels.activation as A, engine.kernels.native as N
from gguf import GGMLQuantizationType as Q
from test_kernels import random_blocks, TYPES
K.COMPILED_MIN_WEIGHTS = 0
avx2 = N.load().set_generic(bool(int(sys.argv[1])))
h = hashlib.sha256()
for qtype in TYPES:
    for n in (1, 3):
        w = K.RawMatrix(random_blocks(qtype, 96, 1024, seed=n), qtype, 1024)
        x = A.Activation((np.random.default_rng(n).standard_normal((n, 1024)) * 4).astype(np.float32))
        h.update(K.matmul(x, w, threads=2).tobytes())
print(avx2, h.hexdigest())
"""


def test_block_products_are_the_same_with_and_without_x86_instructions():
    """On an AVX2 host the blocks' products use x86's psignb/pmaddubsw/pmaddwd/pshufb and F16C's
    vcvtph2ps; the generic code sums the same four products per lane: the same numbers, every
    type (the generic run is forced through the library's switch)."""
    runs = [subprocess.run([sys.executable, "-c", _BLOCK_PRODUCTS, generic], cwd=REPO, capture_output=True,
                           text=True, timeout=600, env=_env())
            for generic in ("0", "1")]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    (host_avx2, host), (generic_avx2, generic) = (r.stdout.split() for r in runs)
    assert generic_avx2 == "False" and host == generic
    if os.uname().machine == "x86_64" and "avx2" in Path("/proc/cpuinfo").read_text():
        assert host_avx2 == "True"      # this host really ran the x86 code


_FORK = """
import os, sys, numpy as np
sys.path.insert(0, "tests/engine")
import engine.kernels.matmul as K, engine.kernels.activation as A
from gguf import GGMLQuantizationType as Q
from test_kernels import random_blocks
w = K.RawMatrix(random_blocks(Q.Q8_0, 2048, 1024), Q.Q8_0, 1024)
x = A.Activation(np.random.default_rng(0).standard_normal((1, 1024)).astype(np.float32))
want = K.matmul(x, w, threads=2)
pid = os.fork()
if pid == 0:
    os._exit(0 if np.array_equal(K.matmul(x, w, threads=2), want) else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_still_multiplies():
    """A child forked after parallel products (the library keeps no threads between calls)
    computes its own on two threads, with the same numbers."""
    r = subprocess.run([sys.executable, "-c", _FORK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", (r.stdout, r.stderr[-1500:])


def test_compiled_f16_rounding_is_numpys():
    """The branch-free f16 rounding of the compiled attention and quantizer equals numpy's
    astype(float16) on every kind of float32: the edges of each half range, ties, specials, and
    a million random bit patterns (the whole 2^32 were checked once, docs/decisions/quantized-products.md)."""
    lib = J.load()
    assert lib is not None
    edges = np.array([0.0, -0.0, 5.96e-8, 2.98e-8, 2.9802326e-08, 2.9802325e-08, 6.1035156e-05, 6.1035e-05,
                      65504.0, 65519.99, 65520.0, 1e30, np.inf, -np.inf, np.nan, 1.0009766, 1.0004883, 1.0014648,
                      -2049.0, 2051.0, 1e-45, -3.4e38], dtype=np.float32)
    bits = np.random.default_rng(3).integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    for f in (edges, bits.view(np.float32)):
        out = lib.round_f16(f)
        with np.errstate(over="ignore"):
            want = f.astype(np.float16).astype(np.float32)
        same = (out.view(np.uint32) == want.view(np.uint32)) | (np.isnan(out) & np.isnan(want))
        assert same.all(), f[~same][:5]


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kq4") / "q4.gguf"
    write_model(path, synth_options("qwen3moe", layers=2, experts=8, top_k=2, hidden=256, expert_ffn=256,
                                    vocab=300, quant="Q4_0", seed=7))
    return path


def test_a_model_generates_the_same_tokens_on_any_thread_count(q4_model):
    shape = load_model_shape(q4_model)
    prompt = [5, 17, 42, 8, 64, 3, 11, 29, 50, 7, 90, 12]
    gens, logits = [], []
    for threads in (1, 3):
        model = Model(shape, threads=threads)
        gens.append(model.generate(prompt, 6))
        logits.append(model.prefill(prompt))
    assert gens[0] == gens[1] and np.array_equal(logits[0], logits[1])


_PEAK = """
import sys, numpy as np
sys.path.insert(0, "tests/engine")
import engine.kernels.matmul as K, engine.kernels.activation as A
from gguf import GGMLQuantizationType as Q
from test_kernels import random_blocks

def kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

m, k = 3072, 4096
for qtype in (Q.Q8_0, Q.Q4_K, Q.F16):
    w = K.RawMatrix(random_blocks(qtype, m, k), qtype, k)
    for n in (1, 16):
        x = A.Activation(np.random.default_rng(0).standard_normal((n, k)).astype(np.float32))
        K.matmul(x, w, threads=2)                       # the library loaded, the pool made
        with open("/proc/self/clear_refs", "w") as f:   # VmHWM := VmRSS
            f.write("5")
        before = kb("VmRSS")
        K.matmul(x, w, threads=2)
        print(qtype.name, n, kb("VmHWM") - before)
"""


def test_no_product_raises_peak_rss_by_a_copy_of_the_matrix():
    """A 48 MiB float32 matrix (12 MiB of Q8_0, 6.75 of Q4_K, 24 of F16), one token (the vec_dot
    kernel) and 16 (dequantized tiles): the process's peak RSS (VmHWM, reset just before; C's
    allocations and numpy's both count) rises by a few MiB, never by a float32 copy."""
    r = subprocess.run([sys.executable, "-c", _PEAK], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    rises = {(q, int(n)): int(kb) for q, n, kb in (line.split() for line in r.stdout.splitlines())}
    assert len(rises) == 6
    for (qtype, n), kb in rises.items():
        # the output and the activation's forms are < 1 MiB; tiles are 2 MiB of float64 per thread
        limit_kb = (1 << 10) if n == 1 else (2 * K.TILE_BYTES + (2 << 20)) >> 10
        assert kb <= limit_kb, (qtype, n, kb)
    assert max(rises.values()) < (3072 * 4096 * 4 >> 10) // 4


def test_wrong_sizes_are_one_line_errors():
    from engine.errors import ModelError

    with pytest.raises(ModelError, match="expected 340 bytes for 10 rows of 32 Q8_0 values, got 339"):
        K.raw_matrix(np.zeros(339, np.uint8), Q.Q8_0, 32, 10, "blk.0.ffn_up_exps.weight")
    with pytest.raises(ModelError, match="not whole 256-value blocks"):
        K.raw_matrix(np.zeros(144, np.uint8), Q.Q4_K, 128, 1)
    w = K.RawMatrix(random_blocks(Q.Q8_0, 4, 64), Q.Q8_0, 64)
    with pytest.raises(ModelError, match="32 values per token, the weight 64"):
        K.matmul(A.Activation(np.zeros((1, 32), np.float32)), w)


# ---- where the compiled library is kept ----------------------------------------------------------
_PROBE = ("import numpy as np, engine.kernels.matmul as K, engine.kernels.activation as A, engine.kernels.native as J\n"
          "K.COMPILED_MIN_WEIGHTS = 0\n"
          "from gguf import GGMLQuantizationType as Q\n"
          "w = K.RawMatrix(np.arange(34 * 8, dtype=np.uint8).reshape(8, 34) % 7, Q.Q8_0, 32)\n"
          "print(J.cache_dir(), J.load() is not None, "
          "K.matmul(A.Activation(np.ones((1, 32), np.float32)), w).tobytes().hex())\n")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BMOE_PY_CACHE_DIR", "CC")}
    env.update(extra)
    return env


@pytest.mark.root("gives a folder to another user (chown)")
def test_the_library_goes_to_bmoe_py_cache_dir_or_a_private_folder(tmp_path):
    cache = tmp_path / "kernel-cache"
    r = subprocess.run([sys.executable, "-c", _PROBE], env=_env(BMOE_PY_CACHE_DIR=str(cache)), cwd=REPO,
                       capture_output=True, text=True, timeout=300, check=True)
    where, loaded, _ = r.stdout.split()
    assert where == str(cache) and loaded == "True" and [p.name for p in cache.glob("*.so")] == [J.library_name()]
    # a folder someone else owns (or others may write) is never used: its code would run here
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 12345, 12345)
    assert not J._usable_dir(str(foreign))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert not J._usable_dir(str(open_dir))
    assert J._usable_dir(str(tmp_path / "fresh")) and (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


def test_an_edited_source_gets_its_own_library():
    src = J.source_bytes()
    assert J.library_name(src) == J.library_name() and J.library_name(src + b"\n") != J.library_name(src)


def test_zipapp_ships_its_library_and_runs_without_any_cache_or_compiler(tmp_path, monkeypatch):
    """bmoe-py staged as one file (as on a virtual phone, which has no compiler): the library built
    here travels inside it and lands in .bmoe-py-cache next to it; where nothing is writable it
    still loads it (an anonymous file); with neither a library nor a compiler it says so in one
    line and multiplies in numpy, with the same numbers."""
    from harness.run.staging import build_bmoe_py

    monkeypatch.setenv("BMOE_FLEET_HOME", str(tmp_path / "home"))
    app = build_bmoe_py(sys.executable)
    no_cc = _env(PATH=str(tmp_path / "empty-path"), TMPDIR=str(tmp_path / "tmp"))
    runner = ("import sys, runpy; sys.path.insert(0, sys.argv[1]); "
              "runpy.run_path(sys.argv[2], run_name='__main__')")
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)

    def staged_run(folder: str, payload: bytes, env: dict[str, str]) -> subprocess.CompletedProcess:
        staged = tmp_path / folder / "bmoe-py"
        staged.parent.mkdir(exist_ok=True)
        staged.write_bytes(payload)
        staged.chmod(0o755)
        return subprocess.run([sys.executable, "-c", runner, str(staged), str(probe)], env=env,
                              capture_output=True, text=True, timeout=300)

    ok = staged_run("stage", app.read_bytes(), no_cc)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    where, loaded, value = ok.stdout.split()
    beside = tmp_path / "stage" / ".bmoe-py-cache"
    assert where == str(beside) and loaded == "True" and [p.name for p in beside.glob("*.so")] == [J.library_name()]
    # nowhere writable: the folder beside it is taken by a file, TMPDIR is a file
    (tmp_path / "stage2").mkdir()
    (tmp_path / "stage2" / ".bmoe-py-cache").write_text("not a folder")
    blocked = tmp_path / "tmpfile"
    blocked.write_text("")
    bare = staged_run("stage2", app.read_bytes(), _env(PATH=str(tmp_path / "empty-path"), TMPDIR=str(blocked)))
    assert bare.returncode == 0 and bare.stderr == "", bare.stderr
    assert bare.stdout.split() == ["None", "True", value]
    # a zipapp without the library, on a machine without a compiler: numpy, one line on stderr
    import io
    import zipfile

    head, _, body = app.read_bytes().partition(b"\n")
    stripped = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(body)) as src, zipfile.ZipFile(stripped, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith(".so"):
                dst.writestr(item, src.read(item))
    plain = staged_run("stage3", head + b"\n" + stripped.getvalue(), no_cc)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split()[1:] == ["False", value]
    assert plain.stderr.count("\n") == 1 and "no compiled kernels (no C compiler" in plain.stderr


def test_the_staged_zipapp_holds_every_module_of_the_engine_package(tmp_path, monkeypatch):
    """A phone runs bmoe-py from the zipapp alone: every module of engine/ (its sub-packages too:
    engine/interface/, the flag table the parser derives from) is inside, and it answers --help
    run from a folder with nothing of this repository on its path."""
    from harness.run.staging import build_bmoe_py

    monkeypatch.setenv("BMOE_FLEET_HOME", str(tmp_path / "home"))
    app = build_bmoe_py(sys.executable)
    engine_dir = Path(__file__).resolve().parents[2] / "engine"
    with zipfile.ZipFile(app) as zf:
        shipped = set(zf.namelist())
    wanted = {f"engine/{p.relative_to(engine_dir).as_posix()}" for p in engine_dir.rglob("*.py")
              if "__pycache__" not in p.parts}
    assert "engine/interface/flags.py" in wanted and wanted <= shipped, sorted(wanted - shipped)
    done = subprocess.run([sys.executable, str(app), "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=_env(PYTHONPATH=""))
    assert done.returncode == 0 and done.stdout.startswith("usage: bmoe-py"), done.stderr[-500:]
