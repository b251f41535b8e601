"""engine.kernels: products on GGUF blocks as stored, checked against gguf's own decoding and
ggml's vec_dot formulas written out here independently; thread-count and path independence;
bounded memory; the compile cache's folder (zipapp, unwritable places)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from engine import kernels as K
from engine.forward import Model
from engine.model import load_model_shape
from engine.synth import synth_options, write_model

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
    xq, xd, _ = K.Activation(x).form("q8_k")
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
@pytest.mark.parametrize("n", [1, 3, 11])
def test_products_are_ggmls_vec_dot(qtype, n):
    """1-4 tokens take the vec_dot kernel, more the dequantized tiles: both give ggml's value."""
    m, k = 72, 512
    raw = random_blocks(qtype, m, k, seed=n)
    x = np.random.default_rng(100 + n).standard_normal((n, k)).astype(np.float32)
    got = K.matmul(K.Activation(x), K.RawMatrix(raw, qtype, k))
    assert got.dtype == np.float32 and got.shape == (n, m)
    if qtype in (Q.Q4_K, Q.Q6_K):
        want = ggml_vec_dot_k(qtype, raw, x)
        if n > K.DIRECT_MAX_TOKENS:   # the batched path does not round fp32(d_w * d_x): an ulp
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
    x = K.Activation(np.random.default_rng(n).standard_normal((n, k)).astype(np.float32))
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
        got = K.matmul(K.Activation(x, exact=True), K.RawMatrix(raw, qtype, k))
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("T", [1, 7])
def test_compiled_flash_attention_cells_equal_the_numpy_loop(monkeypatch, T):
    """forward._f16acc_chunk's compiled loop (used once a product has loaded the compiled code)
    is the numpy loop bit for bit: the f16 accumulator's roundings included."""
    from engine import forward

    rng = np.random.default_rng(T)
    H, Hkv, N, D = 8, 2, 40, 64
    q = (rng.standard_normal((T, H, D)) * 2).astype(np.float32)
    k = rng.standard_normal((Hkv, N, D)).astype(np.float16)
    v = (rng.standard_normal((Hkv, N, D)) * np.logspace(-7, 4, D)).astype(np.float16)  # subnormal..large
    allowed = forward.attention_mask(np.arange(N - T, N), np.arange(N), 12 if T > 1 else 0)
    K._jit()
    compiled = forward._f16acc_chunk(q, k, v, allowed, 0.125, 3, N)
    assert K._jit().f16acc_cells.signatures          # the compiled loop did run
    monkeypatch.setattr(forward, "compiled_loops", lambda: None)
    plain = forward._f16acc_chunk(q, k, v, allowed, 0.125, 3, N)
    for a, b in zip(compiled, plain):
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(plain[0]).all() and (plain[1] > 0).all()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda q: q.name)
def test_float_rows_of_any_length(qtype):
    """Rows of a length that is not whole 32-value groups take the converting loop: same values."""
    m, k = 24, 72
    raw = random_blocks(qtype, m, k, seed=2)
    x = np.random.default_rng(6).standard_normal((2, k)).astype(np.float32)
    got = K.matmul(K.Activation(x), K.RawMatrix(raw, qtype, k))
    xv = K.round_activation(x, qtype).astype(np.float64)
    want = (xv @ gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(m, k).T).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_compiled_q8_0_quantizer_equals_numpys():
    x = np.random.default_rng(12).standard_normal((5, 256)).astype(np.float32) * 3
    x[1, :32] = 0.0                                          # an all-zero block
    x[2, 40] = 1e-30                                         # a tiny amax
    x[3, 64:96] = np.float32(2.5) * np.arange(32) / 31       # ties at .5 steps
    plain = K._to_q8_0(x)
    K._jit()
    act = K.Activation(x)
    compiled = act.form("q8_0")
    assert act._int8["q8_0:int8"].dtype == np.int8
    for a, b in zip(compiled, plain):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(act.int8("q8_0"), plain[0].astype(np.int8))


def test_q8_k_activation_is_ggmls_reference_quantizer():
    x = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = -9.0                          # the block's largest magnitude, negative
    xq, xd, xsum = K.Activation(x).form("q8_k")
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
            x = K.Activation(np.random.default_rng(n).standard_normal((n, k)).astype(np.float32))
            outs = [K.matmul(x, w, threads=t) for t in (1, 2, 3)]
            assert all(np.array_equal(outs[0], o) for o in outs[1:]), (qtype, n)


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


def test_no_product_copies_the_matrix():
    """A 48 MiB float32 matrix (12 MiB of Q8_0): neither path allocates a float32 copy of it."""
    m, k = 3072, 4096
    w = K.RawMatrix(random_blocks(Q.Q8_0, m, k), Q.Q8_0, k)
    for n in (1, 16):
        x = K.Activation(np.random.default_rng(0).standard_normal((n, k)).astype(np.float32))
        K.matmul(x, w, threads=2)                      # compiled and pooled before measuring
        tracemalloc.start()
        K.matmul(x, w, threads=2)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 2 * K.TILE_BYTES + (4 << 20), (n, peak)
        assert peak < m * k * 4 // 8


def test_wrong_sizes_are_one_line_errors():
    from engine.errors import ModelError

    with pytest.raises(ModelError, match="expected 340 bytes for 10 rows of 32 Q8_0 values, got 339"):
        K.raw_matrix(np.zeros(339, np.uint8), Q.Q8_0, 32, 10, "blk.0.ffn_up_exps.weight")
    with pytest.raises(ModelError, match="not whole 256-value blocks"):
        K.raw_matrix(np.zeros(144, np.uint8), Q.Q4_K, 128, 1)
    w = K.RawMatrix(random_blocks(Q.Q8_0, 4, 64), Q.Q8_0, 64)
    with pytest.raises(ModelError, match="32 values per token, the weight 64"):
        K.matmul(K.Activation(np.zeros((1, 32), np.float32)), w)


# ---- the compile cache ---------------------------------------------------------------------------
_PROBE = ("import numpy as np, engine.kernels as K\n"
          "K.COMPILED_MIN_WEIGHTS = 0\n"
          "from gguf import GGMLQuantizationType as Q\n"
          "w = K.RawMatrix(np.arange(34 * 8, dtype=np.uint8).reshape(8, 34) % 7, Q.Q8_0, 32)\n"
          "print(K.cache_dir(), K.matmul(K.Activation(np.ones((1, 32), np.float32)), w).tobytes().hex())\n")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(extra)
    return env


def test_cache_goes_to_numba_cache_dir_or_a_private_folder(tmp_path):
    cache = tmp_path / "numba-cache"
    r = subprocess.run([sys.executable, "-c", _PROBE], env=_env(NUMBA_CACHE_DIR=str(cache)), cwd=REPO,
                       capture_output=True, text=True, timeout=300, check=True)
    where, value = r.stdout.split()
    assert where == str(cache) and any(cache.rglob("*.nbi"))      # numba's index files
    # a folder someone else owns (or others may write) is never used: its code would run here
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 12345, 12345)
    assert not K._usable_dir(str(foreign))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert not K._usable_dir(str(open_dir))
    assert K._usable_dir(str(tmp_path / "fresh")) and (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


def test_zipapp_caches_beside_itself_and_runs_without_any_cache(tmp_path, monkeypatch):
    """bmoe-py staged as one file (as on a virtual phone): compiled code lands in .bmoe-py-cache
    next to it; where nothing is writable it still runs, compiling, with the same numbers."""
    from harness.runner import build_bmoe_py

    monkeypatch.setenv("BMOE_FLEET_HOME", str(tmp_path / "home"))
    app = build_bmoe_py(sys.executable)
    staged = tmp_path / "stage" / "bmoe-py"
    staged.parent.mkdir()
    staged.write_bytes(app.read_bytes())
    staged.chmod(0o755)
    (tmp_path / "stage" / "probe.py").write_text(_PROBE)
    runner = ("import sys, runpy; sys.path.insert(0, sys.argv[1]); "
              "runpy.run_path(sys.argv[2], run_name='__main__')")
    ok = subprocess.run([sys.executable, "-c", runner, str(staged), str(tmp_path / "stage" / "probe.py")],
                        env=_env(TMPDIR=str(tmp_path / "tmp")), capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    where, value = ok.stdout.split()
    beside = tmp_path / "stage" / ".bmoe-py-cache"
    assert where == str(beside) and any(beside.rglob("*.nbi")) and any(beside.glob("bmoe_kernels_*.py"))
    # nowhere writable: the folder beside it is taken by a file, TMPDIR is a file
    (tmp_path / "stage2").mkdir()
    staged2 = tmp_path / "stage2" / "bmoe-py"
    staged2.write_bytes(app.read_bytes())
    (tmp_path / "stage2" / ".bmoe-py-cache").write_text("not a folder")
    blocked = tmp_path / "tmpfile"
    blocked.write_text("")
    bare = subprocess.run([sys.executable, "-c", runner, str(staged2), str(tmp_path / "stage" / "probe.py")],
                          env=_env(TMPDIR=str(blocked)), capture_output=True, text=True, timeout=300)
    assert bare.returncode == 0 and bare.stderr == "", bare.stderr
    assert bare.stdout.split() == ["None", value]
