"""Matrix products on GGUF weights as stored, the way ggml's CPU backend computes them.

`matmul(act, w)` multiplies an activation by a weight kept in its GGUF blocks (`RawMatrix`: the
rows' bytes, never a float32 copy of the matrix). The activation is first converted to the
weight's `vec_dot_type`, as ggml_compute_forward_mul_mat does: Q8_0 blocks for Q8_0/Q4_0/MXFP4
weights, Q8_K blocks for K-quants, F16/BF16 values for F16/BF16 weights (`Activation`, one
conversion per activation and type, reused by every weight that multiplies it). Then:

* few tokens (decode): the compiled `_kernels_jit.matvec_*_rows`, per row and token ggml's
  vec_dot (integer block sums times ggml's float32 scale products), exact terms summed in
  float64 lanes;
* many tokens (prefill), or a matrix under COMPILED_MIN_WEIGHTS: tiles of rows are dequantized
  to float64 (exact values) and a BLAS multiplies them by the activation's exact values: the same
  products summed in another order. For K-quants this path does not round the scale product
  fp32(d_w * d_x) as ggml's vec_dot does (ggml's own batched kernels do not either); the
  difference is a float32 ulp.

Either way a float64 sum of exact products is the value ggml's float32 SIMD lanes approximate,
so results do not depend on the split: `threads` output-row ranges run on `threads` threads
(this one and a pool), each row computed identically whichever thread takes it.

The loops are compiled by numba (`_kernels_jit`, each 32-value block an `@intrinsic` in generic
LLVM vector IR), once per machine: compiled code is cached in
the first writable of $NUMBA_CACHE_DIR, a folder beside the engine (`engine/__pycache__/numba`
in a source tree; `.bmoe-py-cache/` next to a zipapp, e.g. the one staged in /data/local/tmp),
and `$TMPDIR/bmoe-py-cache-UID` (a folder this user owns); with none writable it compiles every
run (docs/decisions.md "Quantized kernels"). numba is imported on first use, so a refused
command line or `--help` never pays for it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from .errors import ModelError
from .fsutil import atomic_write

F16, F32, F64 = np.float16, np.float32, np.float64
GROUP = 32                      # the decoded group: one Q8_0 activation block, 1/8 of a Q8_K one
# Up to this many tokens per product the vec_dot kernel runs; above, dequantized tiles and a BLAS
# (one thread, this host: the tiles win from 3 tokens on for MXFP4, 5 for Q8_0, 6 for F16).
DIRECT_MAX_TOKENS = 4
TILE_BYTES = 2 << 20            # float64 tile of rows per thread on the batched path
PARALLEL_MIN_MACS = 1 << 17     # smaller products run on the calling thread alone
# Smaller matrices take numpy's path (gguf's dequantizers and a BLAS), never the compiled loops:
# a model made only of them (upstream's tiny model, the tests' synthetic ones) never imports numba,
# whose start-up (~0.5 CPU s and ~110 MiB warm, seconds to compile cold) would outweigh their whole
# compute. The numbers are the same either way for every type whose block scales multiply exactly.
COMPILED_MIN_WEIGHTS = 1 << 19

# storage type -> (kernel type id, vec_dot_type of the activation)
_KERNEL_TYPES = {Q.F32: (0, "f32"), Q.F16: (1, "f16"), Q.BF16: (2, "bf16"), Q.Q8_0: (3, "q8_0"),
                 Q.Q4_0: (4, "q8_0"), Q.MXFP4: (5, "q8_0"), Q.Q4_K: (6, "q8_k"), Q.Q6_K: (7, "q8_k")}
# Types without a kernel still multiply correctly: gguf dequantizes their tiles (slow path).
_Q8_0_DOT = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q8_1, Q.MXFP4, Q.IQ4_NL}
_Q8_K_DOT = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
             Q.IQ1_S, Q.IQ1_M, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0}


def vec_dot_type(qtype: Q) -> str:
    """The form ggml converts an activation to before multiplying a `qtype` weight."""
    if qtype in _KERNEL_TYPES:
        return _KERNEL_TYPES[qtype][1]
    if qtype in _Q8_0_DOT:
        return "q8_0"
    if qtype in _Q8_K_DOT:
        return "q8_k"
    return "f16" if qtype == Q.F16 else "f32"


# ------------------------------------------------------------------------------------------------
# weights as stored
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RawMatrix:
    """A 2-D ggml weight as its bytes: `raw[r]` is output row r (ne[0] = `k` inputs) in `qtype`
    blocks. Views of a memory map or of an I/O buffer; nothing is converted."""

    raw: np.ndarray        # uint8 [m, row_bytes], read-only
    qtype: Q
    k: int

    def __post_init__(self) -> None:
        # One array type for the compiled loops (a memory map is read-only, an I/O buffer is not:
        # two types would compile everything twice), and no kernel can write a weight.
        if self.raw.flags.writeable:
            view = self.raw.view()
            view.flags.writeable = False
            object.__setattr__(self, "raw", view)

    @property
    def m(self) -> int:
        return self.raw.shape[0]

    def rows(self, lo: int, hi: int) -> RawMatrix:
        return RawMatrix(self.raw[lo:hi], self.qtype, self.k)


def row_bytes(qtype: Q, k: int) -> int:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if k % block_elems:
        raise ModelError(f"a {qtype.name} row of {k} values is not whole {block_elems}-value blocks")
    return k // block_elems * block_bytes


def raw_matrix(data: np.ndarray, qtype: Q, k: int, m: int, name: str = "weight") -> RawMatrix:
    """`data` (1-D uint8, exactly m rows of k values) as a RawMatrix, without copying."""
    rb = row_bytes(qtype, k)
    data = np.asarray(data)
    if data.dtype != np.uint8:
        data = data.reshape(-1).view(np.uint8)
    if data.ndim != 1 or data.size != rb * m:
        raise ModelError(f"{name}: expected {rb * m} bytes for {m} rows of {k} {qtype.name} values, got {data.size}")
    return RawMatrix(data.reshape(m, rb), qtype, k)


def dequantize(w: RawMatrix) -> np.ndarray:
    """The weight's values as float32 [m, k], as gguf's dequantizers give them (exact, but for a
    K-quant value that needs more than 24 bits: rounded once)."""
    out = np.empty((w.m, w.k), dtype=F32)
    rows = max(1, TILE_BYTES // (8 * max(w.k, 1)))
    for r0 in range(0, w.m, rows):
        out[r0:r0 + rows] = _dequant_tile(w, r0, min(w.m, r0 + rows))
    return out


def _dequant_tile(w: RawMatrix, r0: int, r1: int, compiled: bool = True) -> np.ndarray:
    """Rows r0..r1-1 as float64 values: numpy's conversions for F16/BF16/F32, the compiled
    decoders for the other kernel types (`compiled`), else gguf's numpy dequantizers (their
    float32 values are exact for every type but the K-quants, which they round once)."""
    kind = _KERNEL_TYPES.get(w.qtype)
    if kind is None or (not compiled and w.qtype not in (Q.F32, Q.F16, Q.BF16)):
        from gguf import quants

        try:
            return quants.dequantize(np.ascontiguousarray(w.raw[r0:r1]), w.qtype).astype(F64).reshape(r1 - r0, w.k)
        except NotImplementedError:
            raise ModelError(f"gguf cannot dequantize {w.qtype.name}") from None
    rows = w.raw[r0:r1]
    if w.qtype == Q.F32:
        return rows.view(F32).astype(F64)
    if w.qtype == Q.F16:
        return rows.view(F16).astype(F64)
    if w.qtype == Q.BF16:
        return (rows.view(np.uint16).astype(np.uint32) << 16).view(F32).astype(F64)
    out = np.empty((r1 - r0, w.k), dtype=F64)
    if kind[1] == "q8_0":
        _jit().dequant_q8_0_rows(kind[0], w.raw, w.k, r0, r1, out, _f16_table())
    else:
        _jit().dequant_rows(kind[0], w.raw, w.k, r0, r1, out, _f16_table())
    return out


_F16_TABLE: np.ndarray | None = None


def _f16_table() -> np.ndarray:
    """Every half's float32 value (ggml keeps the same table): block scales are one lookup."""
    global _F16_TABLE
    if _F16_TABLE is None:
        _F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(F16).astype(F32)
    return _F16_TABLE


# ------------------------------------------------------------------------------------------------
# activations in each vec_dot_type
# ------------------------------------------------------------------------------------------------

class Activation:
    """An activation x[n, k] (float32) and its conversions to the vec_dot_types, each made once.

    A form is (xq[n, k], xd[n, ng], xsum[n, ng]) float32, ng = ceil(k / 32): the integers (or, for
    f16/bf16/f32, the values) each weight value multiplies, the scale of each 32-value group and
    the sum of its integers. `exact=True` skips every conversion (numerics="float32")."""

    def __init__(self, x: np.ndarray, exact: bool = False):
        self.x = np.ascontiguousarray(x, dtype=F32)
        if self.x.ndim != 2:
            raise ValueError(f"an activation is [tokens, k], got shape {self.x.shape}")
        self.exact = exact
        self._forms: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._int8: dict[str, np.ndarray] = {}

    @property
    def n(self) -> int:
        return self.x.shape[0]

    def form(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        kind = "f32" if self.exact else kind
        got = self._forms.get(kind)
        if got is None:
            if kind == "q8_0" and _jit_module is not None and self.x.shape[1] % 32 == 0:
                # the same numbers, compiled (and its int8 copy made on the way), once a
                # product has loaded the compiled loops: numpy's dozen passes cost more
                n, k = self.x.shape
                got = (np.empty((n, k), F32), np.empty((n, k // 32), F32), np.empty((n, k // 32), F32))
                x8 = np.empty((n, k), np.int8)
                _jit_module.quantize_q8_0(self.x, got[0], x8, got[1], got[2])
                self._int8["q8_0:int8"] = x8
            else:
                got = _CONVERT[kind](self.x)
            self._forms[kind] = got
        return got

    def int8(self, kind: str) -> np.ndarray:
        """A quantized form's integers as int8 [n, k] (they lie in -127..127)."""
        key = kind + ":int8"
        got = self._int8.get(key)
        if got is None:
            got = self._int8[key] = self.form(kind)[0].astype(np.int8)
        return got

    def values(self, kind: str) -> np.ndarray:
        """The activation's values as ggml multiplies them, float64 [n, k] (exact)."""
        xq, xd, _ = self.form(kind)
        n, k = xq.shape
        scale = np.repeat(xd.astype(F64), GROUP, axis=1)[:, :k]
        return xq.astype(F64) * scale

    def take(self, rows: np.ndarray) -> Activation:
        """The activation of some tokens (rows), its conversions carried along."""
        out = Activation.__new__(Activation)
        out.x, out.exact = self.x[rows], self.exact
        out._forms = {kind: tuple(np.ascontiguousarray(a[rows]) for a in f) for kind, f in self._forms.items()}
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


# ------------------------------------------------------------------------------------------------
# products
# ------------------------------------------------------------------------------------------------

def matmul(act: Activation, w: RawMatrix, threads: int = 1) -> np.ndarray:
    """ggml_mul_mat(w, act): [n, m] float32."""
    return matmul_pairs([(act, w)], threads)[0]


def matmul_many(act: Activation, weights: Sequence[RawMatrix], threads: int = 1) -> list[np.ndarray]:
    """Several weights times one activation (q, k and v), as one parallel step."""
    return matmul_pairs([(act, w) for w in weights], threads)


def matmul_pairs(pairs: Sequence[tuple[Activation, RawMatrix]], threads: int = 1) -> list[np.ndarray]:
    """Each activation times its weight (every routed expert's gate and up), as one parallel step:
    the rows of all of them are shared out among the threads at once."""
    outs, tasks = [], []
    for act, w in pairs:
        if act.x.shape[1] != w.k:
            raise ModelError(f"activation has {act.x.shape[1]} values per token, the weight {w.k}")
        out = np.empty((act.n, w.m), dtype=F32)
        outs.append(out)
        tasks += _tasks(act, w, out, threads)
    _run(tasks, threads)
    return outs


def _tasks(act: Activation, w: RawMatrix, out: np.ndarray, threads: int) -> list[Callable[[], None]]:
    n, m, k = act.n, w.m, w.k
    if n == 0 or m == 0:
        return []
    kind = _KERNEL_TYPES.get(w.qtype)
    compiled = kind is not None and m * k >= COMPILED_MIN_WEIGHTS
    parts = threads if n * m * k >= PARALLEL_MIN_MACS else 1
    bounds = [m * i // parts for i in range(parts + 1)]
    if compiled and n <= DIRECT_MAX_TOKENS and not act.exact:
        xq, xd, xsum = act.form(kind[1])
        jit, lut = _jit(), _f16_table()
        if kind[1] == "q8_0":
            x8 = act.int8(kind[1])
            return [lambda a=a, b=b: jit.matvec_q8_0_rows(kind[0], w.raw, k, a, b, x8, xd, out, lut)
                    for a, b in zip(bounds, bounds[1:]) if b > a]
        if kind[1] == "q8_k":
            return [lambda a=a, b=b: jit.matvec_rows(kind[0], w.raw, k, a, b, xq, xd, xsum, out, lut)
                    for a, b in zip(bounds, bounds[1:]) if b > a]
        return [lambda a=a, b=b: jit.matvec_float_rows(kind[0], w.raw, k, a, b, xq, out)
                for a, b in zip(bounds, bounds[1:]) if b > a]
    # the batched path; also every product of numerics="float32" (unconverted activations)
    xv = act.values(vec_dot_type(w.qtype))
    rows = max(1, TILE_BYTES // (8 * k))

    def tiles(a: int, b: int) -> None:
        for r0 in range(a, b, rows):
            r1 = min(b, r0 + rows)
            out[:, r0:r1] = xv @ _dequant_tile(w, r0, r1, compiled).T
    return [lambda a=a, b=b: tiles(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


_pools: dict[int, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _run(tasks: list[Callable[[], None]], threads: int) -> None:
    """Run the tasks on `threads` threads: this one and threads-1 pool workers (kept for the
    process; they wait on a queue, so an idle engine spins nothing)."""
    if threads <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    groups = [tasks[i::threads] for i in range(threads)]
    with _pool_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads - 1, thread_name_prefix="bmoe-compute")
    futures = [pool.submit(_run_all, g) for g in groups[1:] if g]
    try:
        _run_all(groups[0])
    finally:
        for f in futures:
            f.result()


def _run_all(tasks: list[Callable[[], None]]) -> None:
    for task in tasks:
        task()


# ------------------------------------------------------------------------------------------------
# the compiled module and its cache
# ------------------------------------------------------------------------------------------------

_jit_module: ModuleType | None = None
_jit_lock = threading.Lock()
CACHE_SUBDIR = ".bmoe-py-cache"


def _jit() -> ModuleType:
    global _jit_module
    if _jit_module is None:
        with _jit_lock:
            if _jit_module is None:
                _jit_module = _load_jit()
    return _jit_module


def compiled_loops() -> ModuleType | None:
    """The compiled module if a product has loaded it already, else None (never loads it)."""
    return _jit_module


def cache_dir() -> str | None:
    """Where compiled kernels are cached, or None (compiled each run); see the module docstring."""
    candidates = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(os.environ["NUMBA_CACHE_DIR"])
    container = _zip_container()
    if container is not None:
        candidates.append(os.path.join(os.path.dirname(container), CACHE_SUBDIR))
    else:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__", "numba"))
    tmp = os.environ.get("TMPDIR") or "/tmp"
    candidates.append(os.path.join(tmp, f"bmoe-py-cache-{os.getuid()}"))
    for path in candidates:
        if _usable_dir(path):
            return path
    return None


def _usable_dir(path: str) -> bool:
    """A folder this user owns (created 0700 if missing), not writable by others, that takes a file:
    compiled code loaded from a folder someone else can write would run their code."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _zip_container() -> str | None:
    """The zipapp this package was imported from (bmoe-py staged as one file), else None."""
    here = os.path.abspath(__file__)
    if os.path.isfile(here):
        return None
    path = here
    while path and path != os.path.dirname(path):
        path = os.path.dirname(path)
        if os.path.isfile(path):
            return path
    return None


def _load_jit() -> ModuleType:
    cache = cache_dir()
    if cache is None:
        os.environ.pop("NUMBA_CACHE_DIR", None)
    else:
        os.environ["NUMBA_CACHE_DIR"] = cache
    import numba

    numba.config.CACHE_DIR = cache or ""
    if cache is None or _zip_container() is None:
        from . import _kernels_jit

        return _kernels_jit
    # Inside a zipapp numba cannot cache (its locators need the source as a file): the module's
    # source is written beside the cache, named by its hash, and loaded from there.
    import pkgutil

    source = pkgutil.get_data(__package__, "_kernels_jit.py")
    if source is None:
        from . import _kernels_jit

        return _kernels_jit
    name = "bmoe_kernels_" + hashlib.sha256(source).hexdigest()[:16]
    path = os.path.join(cache, name + ".py")
    try:
        if not os.path.isfile(path):
            atomic_write(path, source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    except OSError:
        sys.modules.pop(name, None)
        numba.config.CACHE_DIR = ""
        os.environ.pop("NUMBA_CACHE_DIR", None)
        from . import _kernels_jit

        return _kernels_jit
