"""ggml's element-wise operations (norms, activations, softmax, RoPE) and a reference matrix
product, rounding where llama.cpp's CPU kernels round:

* tensors are float32 between ops, as ggml stores them;
* RoPE angles come from ggml's rope cache: theta multiplied by theta_scale in float32 per pair;
* rms_norm sums squares in double and scales by a float32 1/sqrt(mean+eps);
* softmax exponentiates in float32, sums in double and multiplies by float32(1/sum);
* exp here is correctly rounded where ggml's SIMD expf approximates (within an ulp).
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as Q

from engine.gguf.hparams import RopeParams
from engine.kernels.activation import round_activation
from engine.units import MIB

F16, F32, F64 = np.float16, np.float32, np.float64
MATMUL_CHUNK_BYTES = 64 * MIB


def mul_mat(x: np.ndarray, w: np.ndarray, qtype: Q = Q.F32) -> np.ndarray:
    """ggml_mul_mat(w, x) for a float matrix w[m, k] holding a `qtype` weight's values: x[n, k]
    times w transposed → [n, m] float32. A reference: the Model multiplies the stored blocks
    (engine.kernels.matmul), with the same activation rounding and the same exact products."""
    xa = round_activation(np.asarray(x, dtype=F32), qtype).astype(F64)
    m, k = w.shape
    out = np.empty((xa.shape[0], m), dtype=F32)
    rows = max(1, MATMUL_CHUNK_BYTES // (8 * max(k, 1)))
    for r0 in range(0, m, rows):
        out[:, r0:r0 + rows] = xa @ np.asarray(w[r0:r0 + rows], dtype=F64).T
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm then ggml_mul by the norm weight, over the last axis."""
    x = x.astype(F32, copy=False)
    mean = ((x * x).astype(F64).sum(axis=-1) / x.shape[-1]).astype(F32)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    return (x * scale[..., None]) * weight


def expf(x: np.ndarray) -> np.ndarray:
    """float32 exp, correctly rounded (glibc's expf is within an ulp of this)."""
    return np.exp(np.asarray(x, dtype=F64)).astype(F32)


def soft_max(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max over the last axis: float32 exp(x - max), double sum, float32 scale."""
    x = x.astype(F32, copy=False)
    e = expf(x - x.max(axis=-1, keepdims=True))
    inv = (1.0 / e.astype(F64).sum(axis=-1, keepdims=True)).astype(F32)
    return e * inv


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml_swiglu_split: silu(gate) * up."""
    g = gate.astype(F64)
    with np.errstate(over="ignore"):   # exp overflow → inf → silu -0, as in C
        return (g / (1.0 + np.exp(-g))).astype(F32) * up


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """ggml_swiglu_oai: min(gate, limit) * sigmoid(alpha * that) * (clamp(up, ±limit) + 1)."""
    x = np.minimum(gate, F32(limit)).astype(F32)
    y = np.clip(up, F32(-limit), F32(limit)).astype(F32)
    with np.errstate(over="ignore"):
        glu = (x.astype(F64) / (1.0 + np.exp(-(F32(alpha) * x).astype(F64)))).astype(F32)
    return glu * (y + F32(1.0))


def _yarn_corr_dims(rope: RopeParams) -> tuple[float, float]:
    def corr_dim(n_rot: float) -> float:
        return rope.n_dims * math.log(rope.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(rope.freq_base))

    start = math.floor(corr_dim(rope.beta_fast))
    end = math.ceil(corr_dim(rope.beta_slow))
    return float(max(0, start)), float(min(rope.n_dims - 1, end))


def rope_cos_sin(positions: np.ndarray, rope: RopeParams) -> tuple[np.ndarray, np.ndarray]:
    """ggml_rope_cache_init: per position and rotated pair, float32 (cos, sin) * mscale."""
    n_pairs = rope.n_dims // 2
    theta_scale = F32(F64(rope.freq_base) ** F64(F32(-2.0) / F32(rope.n_dims)))
    theta = positions.astype(F32)
    cos = np.empty((positions.size, n_pairs), dtype=F32)
    sin = np.empty((positions.size, n_pairs), dtype=F32)
    low, high = _yarn_corr_dims(rope) if rope.ext_factor != 0 else (0.0, 0.0)
    for i in range(n_pairs):
        extrap = theta.astype(F64)
        interp = (F32(rope.freq_scale) * theta).astype(F64)
        mscale = F32(rope.attn_factor)
        if rope.ext_factor != 0:
            y = F32(F32(i - low) / F32(max(0.001, high - low)))
            ramp = F32(F32(1.0 - min(1.0, max(0.0, float(y)))) * F32(rope.ext_factor))
            angle = (interp * (1.0 - F64(ramp)) + extrap * F64(ramp)).astype(F32).astype(F64)
            mscale = F32(mscale * F32(F32(1.0) + F32(F32(0.1) * F32(np.log(F32(1.0) / F32(rope.freq_scale))))))
        else:
            angle = interp
        cos[:, i] = np.cos(angle).astype(F32) * mscale
        sin[:, i] = np.sin(angle).astype(F32) * mscale
        theta = (theta * theta_scale).astype(F32)
    return cos, sin


def rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x[T, heads, dim] NEOX-style: pair (i, i + n_dims/2); dims past n_dims pass through."""
    half = cos.shape[1]
    x0 = x[..., :half].astype(F64)
    x1 = x[..., half:2 * half].astype(F64)
    c = cos[:, None, :].astype(F64)
    s = sin[:, None, :].astype(F64)
    out = x.astype(F32, copy=True)
    out[..., :half] = (x0 * c - x1 * s).astype(F32)
    out[..., half:2 * half] = (x0 * s + x1 * c).astype(F32)
    return out
