"""A one-token decode in three compiled calls a layer's worth at a time (engine/kernels/_kernels.c).

On a small model a decode is almost all per-step overhead in the numpy path (engine.forward.graph):
some forty numpy calls and five product batches per layer, each a Python call, for products of
a few thousand values. `FastDecoder` runs the same steps, in the same order and with the same
roundings, in C: per layer one call for attention through routing (`bmoe_decode_attn`), then the
expert source is asked for the routed experts exactly as the numpy path asks it (one `fetch` a
layer, `on_route` just before), then one call for the experts (`bmoe_decode_moe`); one call for
the output head. The logits are the numpy path's bit for bit (tests/engine/test_fastpath.py).

It takes a model only when every step has such a loop: numerics "ggml", the compiled library
loaded, every weight F32, F16, BF16, Q8_0, Q4_0, MXFP4, or Q4_K / Q6_K of at least
kernels.COMPILED_MIN_WEIGHTS values (a smaller K-quant takes numpy's tiles on the numpy path),
SwiGLU or gpt-oss's clamped SwiGLU experts (biases and attention sinks included). A token whose
attention ggml splits per thread (a
padded KV view of 512+ cells) is split the same way (upstream's -t chunks, merged in order).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q

from engine.errors import ForwardError
from engine.forward.attention import State
from engine.forward.experts import expert_weights
from engine.kernels import matmul as kernels
from engine.kernels.matmul import _KERNEL_IDS, RawMatrix, _f16_table
from engine.kernels.native import load
from engine.kernels.ops import rope_cos_sin

F32 = np.float32
_FAST_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.MXFP4, Q.Q4_K, Q.Q6_K})
_Q8_0_FAMILY = frozenset({Q.Q8_0, Q.Q4_0, Q.MXFP4})
_K_QUANTS = frozenset({Q.Q4_K, Q.Q6_K})
MAT_FIELDS = 5
# a layer's plan: five weights, then 14 addresses and dimensions, 6 bias/sink addresses (PL_*)
PLAN_FIELDS = 5 * MAT_FIELDS + 14 + 6
# a routed slot's row: gate, up, down weights and their bias rows' addresses (EX_*)
EXPERT_FIELDS = 3 * MAT_FIELDS + 3
ACT_IDS = {"swiglu": 0, "swiglu_oai": 1}
MAX_HEAD_DIM = 512
ROPE_ROWS = 256         # rope rows made at first when the model has no n_ctx
GATING_IDS = {"softmax": 0, "softmax_weight": 1}
_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp")   # the plan's order (PL_*_BIAS)


def _mat(w: RawMatrix) -> list[int]:
    return [_KERNEL_IDS[w.qtype], w.addr, w.stride, w.m, w.k]


def _fast_type(qtype: Q, k: int, m: int) -> bool:
    """Whether a [m, k] weight's one-token product has a compiled loop that is the numpy path's
    product: a K-quant under kernels.COMPILED_MIN_WEIGHTS takes numpy's tiles there, an ulp away."""
    if qtype not in _FAST_TYPES:
        return False
    if qtype in _Q8_0_FAMILY:
        return k % 32 == 0
    if qtype in _K_QUANTS:
        return k % 256 == 0 and m * k >= kernels.COMPILED_MIN_WEIGHTS
    return True


def why_not(model: Any) -> str | None:
    """Why `model` (an engine.forward.graph.Model) cannot take the fused decode (None: it can)."""
    hp, w = model.hp, model.weights
    if model.numerics != "ggml":
        return f"numerics {model.numerics}"
    if hp.ffn_act not in ACT_IDS or hp.gating not in GATING_IDS:
        return f"{hp.ffn_act} experts gated by {hp.gating}"
    if hp.n_head % hp.n_head_kv or hp.head_dim_k > MAX_HEAD_DIM or hp.rope.n_dims > hp.head_dim_k \
            or hp.rope_swa.n_dims > hp.head_dim_k:
        return "head layout"
    head = "output.weight" if "output.weight" in w else "token_embd.weight"
    names = [head]
    for il in range(hp.n_layer):
        names += [f"blk.{il}.{n}.weight" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp")]
    for name in names:
        if name not in w:
            return f"no {name}"
        info = w.info(name)
        if not _fast_type(info.qtype, info.ne[0], info.ne[1]):
            return f"{name} is {info.qtype.name} [{info.ne[0]}, {info.ne[1]}]"
    for layer in model.shape.moe_layers:
        for t in layer.tensors:
            rows = t.ne[1] // 2 if t.name.split(".")[2] == "ffn_gate_up_exps" else t.ne[1]
            if not _fast_type(t.qtype, t.ne[0], rows):
                return f"{t.name} is {t.qtype.name} [{t.ne[0]}, {t.ne[1]}]"
    if load(quiet=True) is None:
        return "no compiled kernels"
    return None


class FastDecoder:
    """The fused decode of one Model (built by Model on its first decode, when `why_not` is None)."""

    def __init__(self, model: Any):
        kernels = load(quiet=True)
        assert kernels is not None
        self.model = model
        lib = kernels.lib
        P, I64, INT, D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
        self._attn = lib.bmoe_decode_attn
        self._attn.argtypes = [P, P, I64, P, P, P, P, I64, D, D, D, I64, I64, I64, P, INT, P, P, P, P]
        self._attn.restype = INT
        self._moe = lib.bmoe_decode_moe
        self._moe.argtypes = [P, I64, P, P, P, I64, INT, P, INT, P]
        self._moe.restype = INT
        self._head = lib.bmoe_decode_head
        self._head.argtypes = [P, P, P, I64, D, P, INT, P]
        self._head.restype = INT
        hp, w = model.hp, model.weights
        self._keep: list[np.ndarray] = []     # arrays whose addresses a plan holds
        self.plans: list[np.ndarray] = []
        for il in range(hp.n_layer):
            mats = [w.matrix(f"blk.{il}.{n}.weight") for n in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                 "ffn_gate_inp")]
            swa = hp.swa_layers[il]
            rope = hp.rope_swa if swa else hp.rope
            plan = [v for m in mats for v in _mat(m)]
            plan += [self._addr(w.get(f"blk.{il}.attn_norm.weight")),
                     self._addr(w.optional(f"blk.{il}.attn_q_norm.weight")),
                     self._addr(w.optional(f"blk.{il}.attn_k_norm.weight")),
                     self._addr(w.get(f"blk.{il}.{hp.ffn_norm}.weight")),
                     hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, rope.n_dims, hp.n_expert,
                     GATING_IDS[hp.gating], int(hp.norm_weights), hp.n_swa if swa else 0]
            plan += [self._addr(w.optional(f"blk.{il}.{n}.bias")) for n in _BIASES]
            plan += [self._addr(w.optional(f"blk.{il}.attn_sinks.weight"))]
            assert len(plan) == PLAN_FIELDS
            self.plans.append(np.array(plan, dtype=np.int64))
        self._plan_addr = [int(p.ctypes.data) for p in self.plans]
        self._ropes = [hp.rope_swa if hp.swa_layers[il] else hp.rope for il in range(hp.n_layer)]
        self._tables: dict[object, tuple[np.ndarray, np.ndarray, int, int]] = {}
        for il in range(hp.n_layer):
            self._rope_rows(il, model.n_ctx or ROPE_ROWS)
        head = w.matrix("output.weight" if "output.weight" in w else "token_embd.weight")
        self._head_mat = np.array(_mat(head), dtype=np.int64)
        self._head_norm = self._addr(w.get("output_norm.weight"))
        self.n_vocab_out = head.m
        self._lut = _f16_table()
        self._lut_addr = int(self._lut.ctypes.data)
        E = hp.n_embd
        self._bufs = np.zeros((4, E), dtype=F32)       # x, ffn_inp, h, next x
        self._buf_addr = [int(self._bufs[i].ctypes.data) for i in range(4)]
        self._moe_layers = {m.layer: m for m in model.shape.moe_layers}
        # each layer's expert bias tables [n_expert, n] (float32, kept), by kind
        self._expert_biases: dict[int, dict[str, np.ndarray]] = {}
        for il in range(hp.n_layer):
            tables = {}
            for kind in ("gate", "up", "down", "gate_up"):
                b = w.optional(f"blk.{il}.ffn_{kind}_exps.bias")
                if b is not None:
                    tables[kind] = np.ascontiguousarray(b, dtype=F32).reshape(hp.n_expert, -1)
            self._expert_biases[il] = tables
        self._act = ACT_IDS[hp.ffn_act]
        # an F32 / F16 embedding table as a view of its bytes (a row is DenseWeights.rows' row)
        embd = w.info("token_embd.weight")
        self._embd = w.get("token_embd.weight") if embd.qtype in (Q.F32, Q.F16) and len(embd.ne) == 2 else None
        self._experts: dict[tuple[int, int], tuple[Sequence[np.ndarray], np.ndarray]] = {}
        self._kv: list[tuple[np.ndarray | None, int, int]] = [(None, 0, 0)] * hp.n_layer
        self._k = 0

    def _addr(self, a: np.ndarray | None) -> int:
        if a is None:
            return 0
        a = np.ascontiguousarray(a, dtype=F32).reshape(-1)
        self._keep.append(a)
        return int(a.ctypes.data)

    def _rope_rows(self, il: int, n: int) -> tuple[int, int]:
        """Addresses of the layer's rope cos and sin rows for position n - 1 (ops.rope_cos_sin
        made for positions 0..at least n-1: a row is the same whichever positions it was made with)."""
        rope = self._ropes[il]
        got = self._tables.get(rope)
        if got is None or got[0].shape[0] < n:
            rows = max(n, 2 * (got[0].shape[0] if got is not None else 0), ROPE_ROWS)
            cos, sin = (np.ascontiguousarray(a) for a in rope_cos_sin(np.arange(rows), rope))
            got = self._tables[rope] = (cos, sin, int(cos.ctypes.data), int(sin.ctypes.data))
        step = got[0].strides[0] * (n - 1)
        return got[2] + step, got[3] + step

    def _routing_buffers(self, k: int) -> None:
        if k != self._k:
            self._k = k
            self._ids = np.zeros((1, k), dtype=np.int64)
            self._weights = np.zeros((1, k), dtype=F32)
            self._mats = np.zeros(k * EXPERT_FIELDS, dtype=np.int64)
            self._ids_addr, self._w_addr = int(self._ids.ctypes.data), int(self._weights.ctypes.data)
            self._mats_addr = int(self._mats.ctypes.data)

    def _expert_row(self, il: int, e: int, slices: Sequence[np.ndarray]) -> np.ndarray:
        """An expert's (gate, up, down) plan rows; kept while the source hands out the same slices."""
        got = self._experts.get((il, e))
        if got is not None and got[0] is slices:
            return got[1]
        ew = expert_weights(self._moe_layers[il], slices)
        row = np.array(_mat(ew.gate) + _mat(ew.up) + _mat(ew.down) + self._bias_rows(il, e, ew.gate.m), dtype=np.int64)
        if getattr(self.model.source, "stable_slices", False):
            self._experts[(il, e)] = (slices, row)
        return row

    def _bias_rows(self, il: int, e: int, n_ff: int) -> list[int]:
        """Addresses of expert e's gate, up and down bias rows (0: none); a fused gate_up bias is
        gate values first, then up (forward.moe_ffn adds it before a separate one; a model has one)."""
        tables = self._expert_biases[il]
        out = [0, 0, 0]
        both = tables.get("gate_up")
        if both is not None:
            base = int(both.ctypes.data) + e * both.strides[0]
            out[0], out[1] = base, base + n_ff * both.itemsize
        for i, kind in enumerate(("gate", "up", "down")):
            t = tables.get(kind)
            if t is not None:
                out[i] = int(t.ctypes.data) + e * t.strides[0]
        return out

    def decode(self, token: int, state: State) -> np.ndarray:
        """The logits after `token` (its K and V written to `state`, which it advances)."""
        model = self.model
        hp, w = model.hp, model.weights
        pos = state.n_past
        n_kv = pos + 1
        n_kv_pad = model._padded_kv_cells(n_kv)
        if not 0 <= token < hp.n_vocab:
            raise ForwardError(f"token id out of range 0..{hp.n_vocab - 1}: {token}..{token}")
        if model.n_ctx is not None and n_kv > model.n_ctx:
            raise ForwardError(f"context full: {pos} + 1 tokens exceed n_ctx {model.n_ctx}")
        k = hp.n_expert_used
        self._routing_buffers(k)
        bufs, addr = self._bufs, self._buf_addr
        if self._embd is not None:
            bufs[0] = self._embd[token]
        else:
            bufs[0] = w.rows("token_embd.weight", np.array([token], dtype=np.int64))[0]
        x, x_next = 0, 3
        lanes = model.threads
        kv_chunks = max(1, model.upstream_threads)   # ggml's split of a 512+ cell view (attention.attend)
        on_route, source = model.on_route, model.source
        ids, weights = self._ids, self._weights
        positions = np.array([pos], dtype=np.int64)
        for il in range(hp.n_layer):
            kc_addr, vc_addr, cap = self._kv_cache(state, il, n_kv)
            cos, sin = self._rope_rows(il, n_kv)
            if not self._attn(self._plan_addr[il], addr[x], pos, cos, sin,
                              kc_addr, vc_addr, cap, hp.rms_eps, hp.kq_scale, hp.weights_scale, k, n_kv_pad,
                              kv_chunks, self._lut_addr, lanes, addr[1], addr[2], self._ids_addr, self._w_addr):
                raise MemoryError("the fused decode could not allocate its scratch")
            if model.rerank is not None:
                # the router again, in numpy (the same bits as the C call's), with the reranking
                # between its top-k and its weights; the MoE call reads these buffers
                ids[:], weights[:] = model.route(il, bufs[2:3].copy())
            if on_route is not None:
                on_route(il, positions.copy(), ids.copy(), weights.copy())
            if model.route_hook is not None:   # edits ids and weights in place: the buffers the MoE call reads
                model.route_hook(il, ids, weights)
            routed = ids[0].tolist()
            raw = source.fetch(il, routed)
            mats = self._mats
            for s, e in enumerate(routed):
                try:
                    slices = raw[e]
                except KeyError:
                    raise ForwardError(f"expert source returned no slices for layer {il} expert {e}") from None
                mats[s * EXPERT_FIELDS:(s + 1) * EXPERT_FIELDS] = self._expert_row(il, e, slices)
            if not self._moe(self._mats_addr, k, addr[2], addr[1], self._w_addr, hp.n_embd, self._act, self._lut_addr,
                             lanes, addr[x_next]):
                raise MemoryError("the fused decode could not allocate its scratch")
            x, x_next = x_next, x
        state.n_past = n_kv
        logits = np.empty(self.n_vocab_out, dtype=F32)
        if not self._head(self._head_mat.ctypes.data, self._head_norm, addr[x], hp.n_embd, hp.rms_eps,
                          self._lut_addr, lanes, logits.ctypes.data):
            raise MemoryError("the fused decode could not allocate its scratch")
        return logits

    def _kv_cache(self, state: State, il: int, n_kv: int) -> tuple[int, int, int]:
        """Addresses of the layer's f16 K and V caches (room for n_kv cells made) and their capacity."""
        state.reserve(il, n_kv)
        kc = state.k[il]
        held, ka, va = self._kv[il]
        if held is not kc:
            ka, va = int(kc.ctypes.data), int(state.v[il].ctypes.data)
            self._kv[il] = (kc, ka, va)
        return ka, va, kc.shape[1]
