"""Matrix products on GGUF weights as stored, the way ggml's CPU backend computes them.

`matmul(act, w)` multiplies an activation by a weight kept in its GGUF blocks (`RawMatrix`: the
rows' bytes, never a float32 copy of the matrix). The activation is first converted to the
weight's vec_dot_type (engine.kernels.activation, once per activation and type). Then:

* few tokens (decode; `direct_max_tokens` per type): the compiled loops (engine/kernels/_kernels.c via
  engine.kernels.native), per row and token ggml's vec_dot (integer block sums times ggml's float32
  scale products), exact terms summed in float64 lanes. Every product of a step (q, k and v;
  every routed expert's gate and up; every down) is one batch, one call: with `threads` > 1 the
  library starts threads-1 threads for the call, and this thread and they take chunks of rows
  of all the products until none is left, so `-t` threads share a step's work without a
  hand-off per matrix (and nothing waits, let alone spins, between calls);
* many tokens (prefill), or a matrix under COMPILED_MIN_WEIGHTS: tiles of rows are dequantized
  to float64 (exact values) and a BLAS multiplies them by the activation's exact values: the same
  products summed in another order, `threads` row ranges on this thread and a pool. For
  K-quants this path does not round the scale product fp32(d_w * d_x) as ggml's vec_dot does
  (ggml's own batched kernels do not either); the difference is a float32 ulp.

Either way a float64 sum of exact products is the value ggml's float32 SIMD lanes approximate,
so results do not depend on the split: each row is computed identically whichever thread takes
it. docs/decisions/quantized-products.md and docs/decisions/compute-threads.md say why.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from engine.errors import ModelError
from engine.kernels.activation import Activation, vec_dot_type
from engine.kernels.native import compiled_loops, load
from engine.units import KIB, MIB

F16, F32, F64 = np.float16, np.float32, np.float64
# Up to this many tokens per product the vec_dot kernel runs; above, dequantized tiles and a BLAS.
# Measured (CPU time, one thread, four 1408-row matrices, this host): the tiles catch up at 16
# tokens for Q8_0 and Q4_0, 12 for MXFP4, 8 for F16, 16 for BF16, 8 for Q4_K and Q6_K.
_DIRECT_MAX_TOKENS = {Q.Q8_0: 12, Q.Q4_0: 12, Q.MXFP4: 8, Q.F16: 6, Q.BF16: 8, Q.F32: 6, Q.Q4_K: 6, Q.Q6_K: 6}
TILE_BYTES = 2 * MIB            # float64 tile of rows per thread on the batched path
PARALLEL_MIN_MACS = 1 << 17     # smaller products run on the calling thread alone
CHUNK_BYTES = 64 * KIB          # weight bytes a thread takes at a time from a batch of products
MAX_LANES = 64                  # threads of one batch (the library's own cap)
# Smaller matrices take numpy's path (gguf's dequantizers and a BLAS), never the compiled loops:
# a model made only of them (upstream's tiny model, the tests' synthetic ones) never loads the
# library (nor builds it: ~1 s once per source on a host with a compiler), and its numbers stay
# those it was checked against bmoe-cli with. They are the same either way for every type whose
# block scales multiply exactly.
COMPILED_MIN_WEIGHTS = 1 << 19

# storage types with a compiled kernel -> their id in _kernels.c (T_F32 ... T_Q6_K)
_KERNEL_IDS = {Q.F32: 0, Q.F16: 1, Q.BF16: 2, Q.Q8_0: 3, Q.Q4_0: 4, Q.MXFP4: 5, Q.Q4_K: 6, Q.Q6_K: 7}
# types whose scale products fp32(d_w * d_x) are exact: both paths give the same numbers
_EXACT_SCALES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.MXFP4})


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
    m: int = field(init=False, compare=False)              # output rows
    # where row 0 starts and the bytes from a row to the next: a batch of compiled products
    # reads each weight's rows by address (the caller keeps `raw` alive meanwhile)
    addr: int = field(init=False, compare=False, repr=False)
    stride: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.raw.dtype != np.uint8 or self.raw.ndim != 2:
            raise ModelError(f"a weight's rows are 2-D bytes (uint8), not {self.raw.ndim}-D {self.raw.dtype}")
        # a row's bytes must be contiguous (they are in every GGUF tensor; a test's strided
        # view is copied)
        if self.raw.strides[1] != 1:
            object.__setattr__(self, "raw", np.ascontiguousarray(self.raw))
        # One array type for the compiled loops (a memory map is read-only, an I/O buffer is not:
        # two types would compile everything twice), and no kernel can write a weight.
        if self.raw.flags.writeable:
            view = self.raw.view()
            view.flags.writeable = False
            object.__setattr__(self, "raw", view)
        object.__setattr__(self, "m", int(self.raw.shape[0]))
        object.__setattr__(self, "addr", int(self.raw.ctypes.data))
        object.__setattr__(self, "stride", int(self.raw.strides[0]))

    def rows(self, lo: int, hi: int) -> RawMatrix:
        """Rows lo..hi-1, as stored (a view)."""
        return RawMatrix(self.raw[lo:hi], self.qtype, self.k)


def row_bytes(qtype: Q, k: int) -> int:
    """Bytes of one row of k `qtype` values."""
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
    kid = _KERNEL_IDS.get(w.qtype)
    native = load() if compiled and kid is not None and w.qtype not in (Q.F32, Q.F16, Q.BF16) else None
    if kid is None or (native is None and w.qtype not in (Q.F32, Q.F16, Q.BF16)):
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
    assert native is not None
    native.dequant_rows(kid, w.raw, w.k, r0, r1, out, _f16_table())
    return out


_F16_TABLE: np.ndarray | None = None


def _f16_table() -> np.ndarray:
    """Every half's float32 value (ggml keeps the same table): block scales are one lookup."""
    global _F16_TABLE
    if _F16_TABLE is None:
        _F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(F16).astype(F32)
    return _F16_TABLE


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
    outs: list[np.ndarray | None] = []
    batches: dict[tuple[str, int], list[tuple[int, Activation, RawMatrix]]] = {}
    tasks: list[Callable[[], None]] = []
    for act, w in pairs:
        n, m, k = act.n, w.m, w.k
        if act.x.shape[1] != k:
            raise ModelError(f"activation has {act.x.shape[1]} values per token, the weight {k}")
        if n and m and _direct(act, w):
            batches.setdefault((vec_dot_type(w.qtype), k), []).append((len(outs), act, w))
            outs.append(None)
            continue
        out = np.empty((n, m), dtype=F32)
        outs.append(out)
        if n and m:
            tasks += _tile_tasks(act, w, out, threads)
    for (kind, k), batch in batches.items():
        for (index, _, _), out in zip(batch, _run_batch(kind, k, batch, threads)):
            outs[index] = out
    _run(tasks, threads)
    return [out for out in outs if out is not None]


def direct_max_tokens(qtype: Q) -> int:
    """The most tokens a product of a `qtype` weight computes with the vec_dot kernel (0: none)."""
    return _DIRECT_MAX_TOKENS.get(qtype, 0)


def _direct(act: Activation, w: RawMatrix) -> bool:
    """Whether a product takes the compiled vec_dot kernel (else dequantized tiles and a BLAS):
    a big enough matrix, or any matrix of a type whose numbers are the same either way once a
    product has loaded the compiled loops (a model's small k and v projections then cost no
    float64 copy per token)."""
    if act.n > direct_max_tokens(w.qtype) or act.exact:
        return False
    if w.m * w.k >= COMPILED_MIN_WEIGHTS:
        return load() is not None
    return w.qtype in _EXACT_SCALES and compiled_loops() is not None


def _run_batch(kind: str, k: int, batch: list[tuple[int, Activation, RawMatrix]], threads: int) -> list[np.ndarray]:
    """One batch of compiled products sharing a vec_dot_type and k: their outputs [n, m]."""
    # the activations (the bases of row views), each once, stacked: a product reads rows
    # x0..x0+n-1 of the stack
    first_row: dict[int, int] = {}
    acts: list[Activation] = []
    rows = 0
    table, shapes = [], []
    at = macs = 0
    stride = 1
    for _, act, w in batch:
        base = act.base
        x0 = first_row.get(id(base))
        if x0 is None:
            x0 = first_row[id(base)] = rows
            rows += base.n
            acts.append(base)
        x0 += act.base_row
        n, m = act.n, w.m
        table.append((_KERNEL_IDS[w.qtype], w.addr, w.stride, m, x0, n, at))
        shapes.append((at, n, m))
        at += n * m
        macs += n * m
        stride = max(stride, w.stride)
    items = np.array(table, dtype=np.int64)
    out = np.empty(at, dtype=F32)
    chunk_rows = max(1, CHUNK_BYTES // stride)
    native = load()
    assert native is not None   # _direct sent this batch here
    # the stacked activation in the forms its kernel reads (None for the others: the forms given
    # choose the kernel)
    x8 = xq = xd = xsum = None
    if kind == "q8_0":
        x8, xd = _stack([a.int8(kind) for a in acts]), _stack([a.form(kind)[1] for a in acts])
    elif kind == "q8_k":
        forms = [a.form(kind) for a in acts]
        xq, xd, xsum = (np.ascontiguousarray(_stack([f[i] for f in forms])) for i in range(3))
    else:
        xq = np.ascontiguousarray(_stack([a.form(kind)[0] for a in acts]))
    if x8 is not None:
        x8, xd = np.ascontiguousarray(x8), np.ascontiguousarray(xd)
    lanes = min(threads, MAX_LANES) if macs * k >= PARALLEL_MIN_MACS else 1
    native.run_batch(items, k, x8, xq, xd, xsum, out, _f16_table(), chunk_rows, lanes)
    return [out[o:o + n * m].reshape(n, m) for o, n, m in shapes]


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _tile_tasks(act: Activation, w: RawMatrix, out: np.ndarray, threads: int) -> list[Callable[[], None]]:
    """The batched path (also every product of numerics="float32", whose activations are not
    converted): `threads` ranges of rows, each dequantized a tile at a time and multiplied."""
    n, m, k = act.n, w.m, w.k
    compiled = w.qtype in _KERNEL_IDS and m * k >= COMPILED_MIN_WEIGHTS and load() is not None
    parts = threads if n * m * k >= PARALLEL_MIN_MACS else 1
    bounds = [m * i // parts for i in range(parts + 1)]
    xv = act.values(vec_dot_type(w.qtype))
    rows = max(1, TILE_BYTES // (8 * k))

    def tiles(a: int, b: int) -> None:
        for r0 in range(a, b, rows):
            r1 = min(b, r0 + rows)
            out[:, r0:r1] = xv @ _dequant_tile(w, r0, r1, compiled).T
    return [functools.partial(tiles, a, b) for a, b in itertools.pairwise(bounds) if b > a]


# ------------------------------------------------------------------------------------------------
# threads
# ------------------------------------------------------------------------------------------------

_pools: dict[int, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """threads-1 workers kept for the process; they wait on a queue, so an idle engine spins nothing."""
    with _pool_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads - 1, thread_name_prefix="bmoe-compute")
    return pool


def _run(tasks: list[Callable[[], None]], threads: int) -> None:
    """Run the tasks on `threads` threads: this one and threads-1 pool workers."""
    if threads <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    groups = [tasks[i::threads] for i in range(threads)]
    pool = _pool(threads)
    futures = [pool.submit(_run_all, g) for g in groups[1:] if g]
    try:
        _run_all(groups[0])
    finally:
        for f in futures:
            f.result()


def _run_all(tasks: list[Callable[[], None]]) -> None:
    for task in tasks:
        task()
