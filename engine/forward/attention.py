"""Attention as ggml_flash_attn_ext computes it on the CPU, over an F16 KV cache (`State`).

* the KV cache is F16 (llama.cpp's default cache type), so K and V are rounded to f16 on store;
* batches under 64 queries convert Q to f16 and accumulate V·softmax in an f16 buffer with an
  online softmax, visiting KV cells in order; 64+ queries take the tiled float32 path; a
  one-token decode over 512+ (padded) KV cells is split into one chunk per llama.cpp thread
  whose partial softmaxes are merged (`attend`);
* numerics="float32" takes `attend_float32`, plain softmax attention in float64.

ARM builds with FP16 vector arithmetic accumulate the f16 attention in f16 lanes (x86 widens to
f32, as here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.kernels.native import load
from engine.kernels.ops import expf

F16, F32, F64 = np.float16, np.float32, np.float64

FA_TILE_Q = 64          # ggml-cpu common.h GGML_FA_TILE_Q: batches this big take the tiled FA path
FA_TILE_KV = 64
SPLIT_KV_MIN_CELLS = 512   # ggml-cpu: a 1-query flash attention over this many KV cells splits per thread


def attention_mask(q_pos: np.ndarray, kv_pos: np.ndarray, n_swa: int) -> np.ndarray:
    """True where query at q_pos may see the key at kv_pos: causal, and within the sliding
    window when n_swa > 0 (llama_hparams::is_masked_swa, STANDARD: masked if p1 - p0 >= n_swa)."""
    allowed = kv_pos[None, :] <= q_pos[:, None]
    if n_swa > 0:
        allowed &= (q_pos[:, None] - kv_pos[None, :]) < n_swa
    return allowed


def attend(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, scale: float,
    sinks: np.ndarray | None = None, *, n_kv_pad: int = 0, n_threads: int = 1,
) -> np.ndarray:
    """Attention of q[T, H, Dk] over an F16 cache k[Hkv, N, Dk], v[Hkv, N, Dv] → [T, H*Dv] f32.

    Picks the kernel ggml-cpu would: tiled float32 for 64+ queries; for one query over a KV
    view of 512+ cells (`n_kv_pad`: llama.cpp's n_kv, the used cells padded to 256) the range
    is split into `n_threads` chunks whose partial softmaxes are merged; otherwise one chunk
    with an f16 accumulator.
    """
    T = q.shape[0]
    if T >= FA_TILE_Q:
        out = _attend_tiled_f32(q, k, v, allowed, scale, sinks)
    elif T == 1 and n_kv_pad >= SPLIT_KV_MIN_CELLS:
        out = _attend_split_kv(q, k, v, allowed, scale, sinks, n_kv_pad, max(1, n_threads))
    else:
        out = _attend_ggml_f16acc(q, k, v, allowed, scale, sinks)
    return out.reshape(T, -1)


def attend_float32(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, scale: float,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Plain softmax attention in float64, rounded once to float32 (numerics="float32").
    Queries go 64 at a time so memory stays [64, H, N]."""
    T, H, _ = q.shape
    Hkv, N, Dv = v.shape
    out = np.empty((T, H * Dv), dtype=F32)
    v64 = v.astype(F64)
    sink = None if sinks is None else sinks.astype(F64)[None, :]
    for t0 in range(0, T, FA_TILE_Q):
        t1 = min(t0 + FA_TILE_Q, T)
        s = np.where(allowed[t0:t1, None, :], _scores(q[t0:t1], k, scale).astype(F64), -np.inf)
        m = s.max(axis=-1) if sink is None else np.maximum(s.max(axis=-1), sink)
        p = np.exp(s - m[..., None])
        denom = p.sum(axis=-1) + (0.0 if sink is None else np.exp(sink - m))
        o = np.einsum("tkgn,knd->tkgd", p.reshape(t1 - t0, Hkv, H // Hkv, N), v64, optimize=False)
        out[t0:t1] = (o.reshape(t1 - t0, H, Dv) / denom[..., None]).astype(F32).reshape(t1 - t0, -1)
    return out


def _scores(qv: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    # [T, H, N]: exact float64 dots of (already rounded) q and f16 k, rounded once, then scaled.
    T, H, D = qv.shape
    Hkv = k.shape[0]
    grouped = qv.astype(F64).reshape(T, Hkv, H // Hkv, D).transpose(1, 0, 2, 3)   # [Hkv, T, g, D]
    s = np.einsum("htgd,hnd->htgn", grouped, k.astype(F64), optimize=False)
    s = s.transpose(1, 0, 2, 3).reshape(T, H, -1).astype(F32)
    return s * F32(scale)


def _f16acc_chunk(q, k, v, allowed, scale, lo: int, hi: int):
    # ggml_compute_forward_flash_attn_ext_f16_one_chunk over KV cells [lo, hi) with F16 K/V: Q
    # converted to f16, online softmax over the cells in order, V*softmax accumulated in an f16
    # buffer (scaled and fma-added in float32, stored back as f16 each step).
    # Returns the unnormalised float32 accumulator [R, Dv], sum S [R] and max M [R], R = T*H.
    T, H, _ = q.shape
    Hkv, N, Dv = v.shape
    hi = min(hi, N)
    R = T * H
    M = np.full(R, -np.inf, dtype=F32)
    S = np.zeros(R, dtype=F32)
    acc = np.zeros((R, Dv), dtype=F16)
    if lo >= hi:
        return acc.astype(F32), S, M
    s = _scores(q.astype(F16), k[:, lo:hi], scale).reshape(R, hi - lo)
    rows_kv = np.tile(np.arange(H) // (H // Hkv), T)
    active_all = allowed[np.repeat(np.arange(T), H), lo:hi]
    v64 = v[:, lo:hi].astype(F64)
    jit = load(quiet=True)
    if jit is not None:
        # the same loop compiled (bit for bit: tests/engine/test_kernels.py): a decode's cells
        # cost a Python loop each otherwise (most of a token on a small float model)
        acc32 = np.zeros((R, Dv), dtype=F32)
        jit.f16acc_cells(np.ascontiguousarray(s), np.ascontiguousarray(active_all), rows_kv, v64, M, S, acc32)
        return acc32, S, M
    for n in range(hi - lo):
        active = active_all[:, n]
        if not active.any():
            continue
        sn = s[:, n]
        grow = active & (sn > M)
        stay = active & ~grow
        ms = np.ones(R, dtype=F32)
        vs = np.ones(R, dtype=F32)
        ms[grow] = expf(M[grow] - sn[grow])
        vs[stay] = expf(sn[stay] - M[stay])
        if grow.any():
            acc[grow] = (acc[grow].astype(F32) * ms[grow, None]).astype(F16)
        vn = v64[rows_kv[active], n]
        acc[active] = (acc[active].astype(F64) + vn * vs[active, None].astype(F64)).astype(F32).astype(F16)
        S[active] = (S[active].astype(F64) * ms[active] + vs[active]).astype(F32)
        M[grow] = sn[grow]
    return acc.astype(F32), S, M


def _normalise(acc: np.ndarray, S: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    inv = np.zeros_like(S)
    np.divide(F32(1.0), S, out=inv, where=S != 0)
    return (acc * inv[:, None]).reshape(shape)


def _attend_ggml_f16acc(q, k, v, allowed, scale, sinks):
    T, H, _ = q.shape
    acc, S, M = _f16acc_chunk(q, k, v, allowed, scale, 0, k.shape[1])
    if sinks is not None:
        acc, S, M = _apply_sinks(acc, S, M, np.tile(sinks.astype(F32), T))
    return _normalise(acc, S, (T, H, v.shape[2]))


def _attend_split_kv(q, k, v, allowed, scale, sinks, n_kv_pad: int, n_threads: int):
    # ggml's use_split_kv_path: thread i takes cells [i*c, (i+1)*c) of the padded KV view,
    # c = ceil(n_kv / n_threads); sinks join the first chunk only; ggml_flash_attn_ext_reduce_partials
    # then merges the chunks in order in float32.
    T, H, _ = q.shape
    Dv = v.shape[2]
    chunk = -(-n_kv_pad // n_threads)
    M_all = np.full(T * H, -np.inf, dtype=F32)
    S_all = np.zeros(T * H, dtype=F32)
    acc_all = np.zeros((T * H, Dv), dtype=F32)
    for lo in range(0, n_kv_pad, chunk):
        acc, S, M = _f16acc_chunk(q, k, v, allowed, scale, lo, lo + chunk)
        if sinks is not None and lo == 0:
            acc, S, M = _apply_sinks(acc, S, M, np.tile(sinks.astype(F32), T))
        live = S != 0
        m_new = np.maximum(M_all, M)
        old = np.zeros_like(S)
        new = np.zeros_like(S)
        old[live] = expf(M_all[live] - m_new[live])
        new[live] = expf(M[live] - m_new[live])
        acc_all[live] = (acc_all[live].astype(F64) * old[live, None] + acc[live].astype(F64) * new[live, None]).astype(F32)
        S_all[live] = (S_all[live].astype(F64) * old[live] + S[live].astype(F64) * new[live]).astype(F32)
        M_all[live] = m_new[live]
    return _normalise(acc_all, S_all, (T, H, Dv))


def _apply_sinks(acc: np.ndarray, S: np.ndarray, M: np.ndarray, sink: np.ndarray):
    # A per-head learned logit in the softmax denominator only (it has no value row); a larger
    # sink becomes the new running max.
    acc, S, M = acc.copy(), S.copy(), M.copy()
    bigger = sink > M
    ms = np.ones_like(S)
    vs = np.ones_like(S)
    ms[bigger] = expf(M[bigger] - sink[bigger])
    vs[~bigger] = expf(sink[~bigger] - M[~bigger])
    acc[bigger] = acc[bigger] * ms[bigger, None]
    S = (S.astype(F64) * ms + vs).astype(F32)
    M[bigger] = sink[bigger]
    return acc, S, M


def _attend_tiled_f32(q, k, v, allowed, scale, sinks):
    # ggml_compute_forward_flash_attn_ext_tiled: float32 Q, K/V widened from f16, online softmax
    # per 64-cell KV tile with float32 running max/sum and float32 accumulator. Scores are made
    # one tile at a time so a long prefill never holds a [T, H, N] matrix.
    T, H, _ = q.shape
    Hkv, N, Dv = v.shape
    g = H // Hkv
    qf = q.astype(F32)
    M = np.full((T, H), -np.inf, dtype=F32)
    S = np.zeros((T, H), dtype=F32)
    acc = np.zeros((T, H, Dv), dtype=F32)
    for c0 in range(0, N, FA_TILE_KV):
        c1 = min(c0 + FA_TILE_KV, N)
        visible = allowed[:, c0:c1]
        if not visible.any():
            continue
        tile = np.where(visible[:, None, :], _scores(qf, k[:, c0:c1], scale), -np.inf).astype(F32)
        tile_max = tile.max(axis=-1)
        live = tile_max > -np.inf
        new_m = np.where(live, np.maximum(M, tile_max), M)
        grow = live & (new_m > M)
        ms = np.ones_like(S)
        ms[grow] = expf(M[grow] - new_m[grow])
        acc[grow] = acc[grow] * ms[grow][:, None]
        S[grow] = S[grow] * ms[grow]
        M = new_m
        p = np.zeros_like(tile)
        p[live] = expf(tile[live] - M[live][:, None])
        S = (S.astype(F64) + p.astype(F64).sum(axis=-1)).astype(F32)
        pv = np.einsum("tkgn,knd->tkgd", p.astype(F64).reshape(T, Hkv, g, c1 - c0),
                       v[:, c0:c1].astype(F64), optimize=False).reshape(T, H, Dv)
        acc = (acc.astype(F64) + pv).astype(F32)
    acc, S = acc.reshape(T * H, Dv), S.reshape(T * H)
    if sinks is not None:
        acc, S, _ = _apply_sinks(acc, S, M.reshape(T * H), np.tile(sinks.astype(F32), T))
    return _normalise(acc, S, (T, H, Dv))



@dataclass
class State:
    """A sequence's KV cache (F16 like llama.cpp's default, F32 for numerics="float32") and how
    many positions it holds."""

    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    kv_dtype: type = F16
    n_past: int = 0
    k: list[np.ndarray] = field(default_factory=list)   # per layer [Hkv, capacity, Dk] f16
    v: list[np.ndarray] = field(default_factory=list)

    def reserve(self, layer: int, need: int) -> None:
        """Room for `need` cells in the layer's K and V (both [Hkv, capacity, D], C-contiguous)."""
        while len(self.k) <= layer:
            self.k.append(np.zeros((self.n_head_kv, 0, self.head_dim_k), dtype=self.kv_dtype))
            self.v.append(np.zeros((self.n_head_kv, 0, self.head_dim_v), dtype=self.kv_dtype))
        if self.k[layer].shape[1] < need:
            cap = max(need, 2 * self.k[layer].shape[1], 256)
            for store, d in ((self.k, self.head_dim_k), (self.v, self.head_dim_v)):
                grown = np.zeros((self.n_head_kv, cap, d), dtype=self.kv_dtype)
                grown[:, :self.n_past] = store[layer][:, :self.n_past]
                store[layer] = grown

    def append(self, layer: int, k_new: np.ndarray, v_new: np.ndarray) -> None:
        """Store this batch's K/V (T, Hkv, D) after the cached positions, rounded to f16."""
        T = k_new.shape[0]
        need = self.n_past + T
        self.reserve(layer, need)
        self.k[layer][:, self.n_past:need] = k_new.transpose(1, 0, 2).astype(self.kv_dtype)
        self.v[layer][:, self.n_past:need] = v_new.transpose(1, 0, 2).astype(self.kv_dtype)

    def view(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.k[layer][:, :n], self.v[layer][:, :n]

