"""An activation as ggml multiplies it: converted to each weight type's `vec_dot_type` once.

ggml_compute_forward_mul_mat first converts the activation to the weight's vec_dot_type: Q8_0
blocks for Q4_0/Q8_0/MXFP4 weights (and the other 32-value quants), Q8_K blocks for the
K-quants, F16/BF16 values for F16/BF16 weights, float32 itself for F32. `Activation` makes each
conversion at most once per activation, so the router and every expert's gate and up share one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q

from engine.errors import ModelError
from engine.kernels.native import compiled_loops

F16, F32, F64 = np.float16, np.float32, np.float64
GROUP = 32                      # the decoded group: one Q8_0 activation block, 1/8 of a Q8_K one

_Q8_0_DOT = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q8_1, Q.MXFP4, Q.IQ4_NL}
_Q8_K_DOT = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
             Q.IQ1_S, Q.IQ1_M, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0}


def vec_dot_type(qtype: Q) -> str:
    """The form ggml converts an activation to before multiplying a `qtype` weight."""
    if qtype in _Q8_0_DOT:
        return "q8_0"
    if qtype in _Q8_K_DOT:
        return "q8_k"
    return {Q.F16: "f16", Q.BF16: "bf16"}.get(qtype, "f32")


class Activation:
    """An activation x[n, k] (float32) and its conversions to the vec_dot_types, each made once.

    A form is (xq[n, k], xd[n, ng], xsum[n, ng]) float32, ng = ceil(k / 32): the integers (or, for
    f16/bf16/f32, the values) each weight value multiplies, the scale of each 32-value group and
    the sum of its integers. `exact=True` skips every conversion (numerics="float32").

    `rows(lo, hi)` is a view of some tokens whose conversions are slices of this one's: its
    `base` is the activation that owns them and `base_row` where it starts there."""

    def __init__(self, x: np.ndarray, exact: bool = False):
        self.x = np.ascontiguousarray(x, dtype=F32)
        if self.x.ndim != 2:
            raise ValueError(f"an activation is [tokens, k], got shape {self.x.shape}")
        self.exact = exact
        self.n: int = self.x.shape[0]     # tokens
        self._base: Activation | None = None   # None: this one (no reference cycle to free)
        self.base_row = 0
        self._forms: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._int8: dict[str, np.ndarray] = {}

    def form(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The activation converted to `kind` (xq, xd, xsum), made once."""
        kind = "f32" if self.exact else kind
        got = self._forms.get(kind)
        if got is None and self._base is not None:
            lo, hi = self.base_row, self.base_row + self.n
            xq, xd, xs = self._base.form(kind)
            got = self._forms[kind] = (xq[lo:hi], xd[lo:hi], xs[lo:hi])
        if got is None:
            jit = compiled_loops()
            if kind == "q8_0" and jit is not None and self.x.shape[1] % 32 == 0:
                # the same numbers, compiled (and its int8 copy made on the way), once a
                # product has loaded the compiled loops: numpy's dozen passes cost more
                n, k = self.x.shape
                got = (np.empty((n, k), F32), np.empty((n, k // 32), F32), np.empty((n, k // 32), F32))
                x8 = np.empty((n, k), np.int8)
                jit.quantize_q8_0(self.x, got[0], x8, got[1], got[2])
                self._int8["q8_0:int8"] = x8
            else:
                got = _CONVERT[kind](self.x)
            self._forms[kind] = got
        return got

    @property
    def base(self) -> Activation:
        """The activation whose conversions this one's are slices of (itself unless a `rows` view)."""
        return self if self._base is None else self._base

    def int8(self, kind: str) -> np.ndarray:
        """A quantized form's integers as int8 [n, k] (they lie in -127..127)."""
        key = kind + ":int8"
        got = self._int8.get(key)
        if got is None and self._base is not None:
            got = self._int8[key] = self._base.int8(kind)[self.base_row:self.base_row + self.n]
        if got is None:
            got = self._int8[key] = self.form(kind)[0].astype(np.int8)
        return got

    def values(self, kind: str) -> np.ndarray:
        """The activation's values as ggml multiplies them, float64 [n, k] (exact)."""
        xq, xd, _ = self.form(kind)
        k = xq.shape[1]
        scale = np.repeat(xd.astype(F64), GROUP, axis=1)[:, :k]
        return xq.astype(F64) * scale

    def rows(self, lo: int, hi: int) -> Activation:
        """Tokens lo..hi-1 as a view: converted by slicing this activation's conversions (each
        made once for all its tokens), and stacked with it when a batch reads both."""
        out = Activation.__new__(Activation)
        out.x, out.exact, out.n = self.x[lo:hi], self.exact, hi - lo
        out._base, out.base_row = self.base, self.base_row + lo
        out._forms, out._int8 = {}, {}
        return out

    def take(self, rows: np.ndarray) -> Activation:
        """The activation of some tokens (rows), its conversions carried along (a copy)."""
        out = Activation.__new__(Activation)
        out.x, out.exact = self.x[rows], self.exact
        out.n = out.x.shape[0]
        out._base, out.base_row = None, 0
        out._forms = {kind: (np.ascontiguousarray(xq[rows]), np.ascontiguousarray(xd[rows]), np.ascontiguousarray(xs[rows]))
                      for kind, (xq, xd, xs) in self._forms.items()}
        out._int8 = {key: np.ascontiguousarray(a[rows]) for key, a in self._int8.items()}
        return out


def _groups(k: int) -> int:
    return -(-k // GROUP)


def _plain(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, k = values.shape
    ones = np.ones((n, _groups(k)), dtype=F32)
    return np.ascontiguousarray(values, dtype=F32), ones, np.zeros_like(ones)


def _to_f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _plain(x.astype(F16).astype(F32))


def _to_bf16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # ggml_fp32_to_bf16: round to nearest even on the upper 16 bits (NaN kept quiet)
    bits = x.astype(F32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    rounded = np.where((bits & 0x7FFFFFFF) > 0x7F800000, (bits | 0x00400000) & 0xFFFF0000, rounded)
    return _plain(rounded.astype(np.uint32).view(F32))


def _to_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # quantize_row_q8_0 (x86): d = amax/127 stored as f16; q = round-half-even(x * 127/amax).
    n, k = x.shape
    if k % 32:
        raise ModelError(f"a Q8_0 activation needs whole 32-value blocks, got {k} values")
    blocks = x.reshape(n, k // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / F32(127.0)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127.0) / amax, F32(0.0)).astype(F32)
    q = np.rint(blocks * inv[..., None]).astype(F32)
    return q.reshape(n, k), d.astype(F16).astype(F32), q.sum(axis=-1)


def _to_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # quantize_row_q8_K_ref: iscale = -127/max (max = the first value of largest magnitude),
    # q = nearest_int(iscale*x) capped at 127, d = 1/iscale kept as float32.
    n, k = x.shape
    if k % 256:
        raise ModelError(f"a Q8_K activation needs whole 256-value blocks, got {k} values")
    blocks = x.reshape(n, k // 256, 256)
    idx = np.abs(blocks).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(blocks, idx, axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(vmax != 0, F32(-127.0) / vmax, F32(0.0)).astype(F32)
        d = np.where(vmax != 0, F32(1.0) / iscale, F32(0.0)).astype(F32)
    q = np.minimum(np.rint(iscale[..., None] * blocks), 127).astype(F32).reshape(n, k)
    return q, np.repeat(d, 256 // GROUP, axis=1), q.reshape(n, k // GROUP, GROUP).sum(axis=-1)


_CONVERT: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
    "f32": _plain, "f16": _to_f16, "bf16": _to_bf16, "q8_0": _to_q8_0, "q8_k": _to_q8_k,
}


def round_activation(x: np.ndarray, qtype: Q) -> np.ndarray:
    """The activation values ggml actually multiplies a `qtype` weight by (float32)."""
    return Activation(np.atleast_2d(np.asarray(x, dtype=F32)).reshape(-1, np.shape(x)[-1])) \
        .values(vec_dot_type(qtype)).astype(F32).reshape(np.shape(x))
