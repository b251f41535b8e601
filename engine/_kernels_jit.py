"""The compiled loops behind engine.kernels (numba). Import engine.kernels, not this module: it
chooses the compile cache before numba starts and loads this file from a real path.

Each weight row is read as stored and seen as ggml's vec_dot sees it: integers `wint` (q,
q - 8, an MXFP4 code's doubled value, sc*q for K-quants; for F16/BF16/F32 the value itself)
times a float scale per 32 values `wsc` (the block's d, the super-block's d, 1 for plain
floats), less, for Q4_K, min * dmin per 32 values. A row is never widened to float32 as a whole
matrix.

Per output row and token the products compute what ggml's vec_dot computes: sum over groups of
fp32(wsc * xd) * sum(wint * xq) (minus fp32(dmin * xd) * min * sum(xq) for Q4_K), where (xq, xd)
is the activation quantized to the weight's vec_dot_type. Every term is exact in float64
(products of at most 53 significant bits) and the scale product is rounded to float32 exactly
where ggml rounds it, so the only difference from ggml is the order of a float64 sum: ggml's
float32 SIMD lanes approximate the same value less closely. Results do not depend on how rows
are split across threads (each row is one sequence of operations).

`matvec_rows` serves the K-quants; `matvec_q8_0_rows` (Q8_0, Q4_0, MXFP4) and
`matvec_float_rows` (F16, BF16, F32) compute the same a block at a time in vector registers
(`_row_dot`, `_float_block`: numba intrinsics in LLVM vector IR, generic but for the int8
block products on an AVX2 host, which take ggml's own x86 instructions; the same numbers).
`dequant_rows` (K-quants) and `dequant_q8_0_rows` give the float64 weight values (wsc * wint -
dmin * min), exact, for the batched (prefill) path, whose products a BLAS sums (engine.kernels
converts F16/BF16/F32 with numpy). `run_*_batch[_lanes]` run many products in one call.

One module past ~500 lines on purpose: numba caches compiled code per source file, and a zipapp
(bmoe-py staged on a phone) writes exactly this file beside its cache to load it from there
(engine.jit_loader); split, the pieces would import each other from a zip numba cannot cache.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, Literal, TypedDict, cast

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, overload

# engine.kernels sets NUMBA_CACHE_DIR to a writable folder before importing numba, or leaves it
# empty when there is none: then nothing is cached and every run compiles (the fallback).
_CACHE = bool(numba.config.CACHE_DIR) and os.path.isfile(__file__)  # type: ignore[attr-defined]  # made at import
# Reassociation only reorders float64 sums of exact terms (and float32 sums of integers).
_FAST = {"reassoc", "nsz", "contract"}


class _JitOptions(TypedDict):
    cache: bool
    nogil: bool
    boundscheck: bool
    error_model: Literal["python", "numpy"]


_opts: _JitOptions = {"cache": _CACHE, "nogil": True, "boundscheck": False, "error_model": "numpy"}

# storage type ids (engine.kernels maps GGMLQuantizationType onto these)
T_F32, T_F16, T_BF16, T_Q8_0, T_Q4_0, T_MXFP4, T_Q4_K, T_Q6_K = range(8)
# decoded group size
G = 32

# ggml_e8m0_to_fp32_half: 2^(e - 128), a power of two (float32 reaches 2^-149)
_E8M0_HALF = np.ldexp(1.0, np.arange(256) - 128).astype(np.float32)
# kvalues_mxfp4: an e2m1 code's doubled value (bit 3 the sign)
_MXFP4_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@njit(**_opts, inline="always")
def _f16(lut, lo, hi) -> np.float32:
    """IEEE half (two little-endian bytes) to float32, exactly, through the 65536-entry table."""
    return lut[np.int32(lo) | (np.int32(hi) << 8)]


@njit(**_opts, fastmath=_FAST)
def _f16_row(h16, u32, out):
    """A row of halves to float32, exactly, in two vectorisable passes: the half's exponent and
    mantissa placed in a float32 (a subnormal half lands as a float32 subnormal) times 2^112
    rebiases the exponent 15 -> 127; infinities and NaNs get exponent 255; then the sign."""
    for i in range(h16.size):
        u32[i] = (np.uint32(h16[i]) & np.uint32(0x7FFF)) << np.uint32(13)
    f = u32.view(np.float32)
    for i in range(h16.size):
        h = np.uint32(h16[i])
        v = f[i] * np.float32(5.192296858534828e33)
        if h & np.uint32(0x7C00) == np.uint32(0x7C00):
            v = np.float32(np.inf) if h & np.uint32(0x3FF) == np.uint32(0) else np.float32(np.nan)
        out[i] = -v if h & np.uint32(0x8000) else v


@njit(**_opts)
def decode_row(qtype, row, k, wint, wsc, wmin, wminsc, lut):
    """One K-quant row's super-blocks -> wint[k] (sc * q), wsc (d per 32 values), and for Q4_K
    wmin/wminsc (the 32 values' min and dmin); returns True when the type has mins (Q4_K)."""
    if qtype == T_Q4_K:
        for sb in range(k // 256):
            o = sb * 144
            d = _f16(lut, row[o], row[o + 1])
            dmin = _f16(lut, row[o + 2], row[o + 3])
            sc = row[o + 4:o + 16]
            for j in range(8):
                # get_scale_min_k4
                if j < 4:
                    scale = np.int32(sc[j]) & 63
                    mn = np.int32(sc[j + 4]) & 63
                else:
                    scale = (np.int32(sc[j + 4]) & 15) | ((np.int32(sc[j - 4]) >> 6) << 4)
                    mn = (np.int32(sc[j + 4]) >> 4) | ((np.int32(sc[j]) >> 6) << 4)
                g = sb * 8 + j
                wsc[g] = d
                wminsc[g] = dmin
                wmin[g] = np.float32(mn)
                q0 = o + 16 + (j // 2) * 32
                shift = 4 * (j & 1)
                for i in range(32):
                    wint[g * 32 + i] = np.float32(scale * ((np.int32(row[q0 + i]) >> shift) & 15))
        return True
    if qtype == T_Q6_K:
        for sb in range(k // 256):
            o = sb * 210
            d = _f16(lut, row[o + 208], row[o + 209])
            scales = row[o + 192:o + 208].view(np.int8)
            for g in range(8):
                wsc[sb * 8 + g] = d
            for half in range(2):
                ql = o + 64 * half
                qh = o + 128 + 32 * half
                scb = 8 * half
                yb = sb * 256 + 128 * half
                for lane in range(32):
                    s = lane // 16
                    lo0 = np.int32(row[ql + lane])
                    lo1 = np.int32(row[ql + lane + 32])
                    hi = np.int32(row[qh + lane])
                    wint[yb + lane] = np.float32(np.int32(scales[scb + s]) * (((lo0 & 15) | ((hi & 3) << 4)) - 32))
                    wint[yb + lane + 32] = np.float32(np.int32(scales[scb + s + 2])
                                                   * (((lo1 & 15) | (((hi >> 2) & 3) << 4)) - 32))
                    wint[yb + lane + 64] = np.float32(np.int32(scales[scb + s + 4])
                                                   * (((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32))
                    wint[yb + lane + 96] = np.float32(np.int32(scales[scb + s + 6])
                                                   * (((lo1 >> 4) | (((hi >> 6) & 3) << 4)) - 32))
        return False
    return False


@njit(**_opts)
def _row_scratch(k):
    """decode_row's outputs for a row of k values: wint, wsc, wmin, wminsc."""
    ng = (k + G - 1) // G
    return np.zeros(ng * G, np.float32), np.empty(ng, np.float32), np.zeros(ng, np.float32), np.zeros(ng, np.float32)


@njit(**_opts, fastmath=_FAST)
def matvec_rows(qtype, raw, k, r0, r1, xq, xd, xsum, out, lut):
    """out[:, r] for rows r0..r1-1 of a K-quant weight [m, row_bytes] (k a multiple of 256):
    activation integers xq[n, k] (float32), group scales xd[n, k/32] and group sums xsum[n, k/32]
    (for Q4_K's mins). sc*q*xq is an integer under 2^24, so its float32 product is exact."""
    n = xq.shape[0]
    ng = k // G
    wint, wsc, wmin, wminsc = _row_scratch(k)
    lanes = np.empty(G, np.float64)
    for r in range(r0, r1):
        mins = decode_row(qtype, raw[r], k, wint, wsc, wmin, wminsc, lut)
        for t in range(n):
            for i in range(G):
                lanes[i] = 0.0
            corr = 0.0
            for g in range(ng):
                lo = g * G
                dd = np.float64(wsc[g] * xd[t, g])           # float32 product, as ggml rounds it
                for i in range(G):
                    lanes[i] += dd * np.float64(wint[lo + i] * xq[t, lo + i])
                if mins:
                    corr += np.float64(wminsc[g] * xd[t, g]) * (np.float64(wmin[g]) * np.float64(xsum[t, g]))
            total = 0.0
            for i in range(G):
                total += lanes[i]
            out[t, r] = np.float32(total - corr)


@njit(**_opts, fastmath=_FAST)
def dequant_rows(qtype, raw, k, r0, r1, out, lut):
    """out[r - r0, :k] = the float64 values of rows r0..r1-1 (exact)."""
    ng = (k + G - 1) // G
    wint, wsc, wmin, wminsc = _row_scratch(k)
    for r in range(r0, r1):
        mins = decode_row(qtype, raw[r], k, wint, wsc, wmin, wminsc, lut)
        for g in range(ng):
            lo = g * G
            hi = min(k, lo + G)
            s = np.float64(wsc[g])
            m = np.float64(wminsc[g]) * np.float64(wmin[g]) if mins else 0.0
            for i in range(lo, hi):
                out[r - r0, i] = s * np.float64(wint[i]) - m


@njit(**_opts, inline="always")
def _e2m1_bits(c) -> np.uint32:
    """The float32 bits of an MXFP4 (e2m1) code's doubled value, kvalues_mxfp4[c], by integer
    arithmetic (vectorisable, no gather): e = 0 gives 0 or 1, else (1 + m/2) * 2^e."""
    e = (c >> 1) & 3
    m = c & 1
    mag = np.uint32(0x3F800000 * m) if e == 0 else np.uint32(((e + 127) << 23) | (m << 22))
    return mag | (np.uint32(c & 8) << np.uint32(28))


@intrinsic
def _float_block_ir(typingctx, qtype, acc, raw, offset, x, x_offset):
    """acc[0:8] += the 32 products of one row's F16 / BF16 / F32 values at raw[offset:] (bytes)
    by x[x_offset:+32] (float32), each exact (halves in float32, F32 in float64), summed 4 to a
    lane in float64. Generic vector IR: an F16 row widens with the target's half conversion
    (x86 F16C: vcvtph2ps), BF16 by a 16-bit shift."""
    if not isinstance(qtype, types.IntegerLiteral):
        return None
    kind = qtype.literal_value
    sig = types.void(qtype, acc, raw, offset, x, x_offset)

    def codegen(context, builder, signature, args):
        _, acc_v, raw_v, off_v, x_v, xoff_v = args
        f32, f64, i32 = ir.FloatType(), ir.DoubleType(), ir.IntType(32)
        acc_ptr = context.make_array(signature.args[1])(context, builder, acc_v).data
        data = context.make_array(signature.args[2])(context, builder, raw_v).data
        wptr = builder.gep(data, [off_v])
        _prefetch(builder, builder.gep(data, [builder.add(off_v, ir.Constant(off_v.type, PREFETCH_BYTES))]))
        xdata = context.make_array(signature.args[4])(context, builder, x_v).data
        xv = builder.load(builder.bitcast(builder.gep(xdata, [xoff_v]), ir.VectorType(f32, 32).as_pointer()), align=4)
        if kind == T_F32:
            wv = builder.load(builder.bitcast(wptr, ir.VectorType(f32, 32).as_pointer()), align=1)
            prod = builder.fmul(builder.fpext(wv, ir.VectorType(f64, 32)), builder.fpext(xv, ir.VectorType(f64, 32)))
        else:
            h = builder.load(builder.bitcast(wptr, ir.VectorType(ir.IntType(16), 32).as_pointer()), align=1)
            if kind == T_F16:
                wv = builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 32)), ir.VectorType(f32, 32))
            else:
                wide = builder.shl(builder.zext(h, ir.VectorType(i32, 32)), ir.Constant(ir.VectorType(i32, 32), [16] * 32))
                wv = builder.bitcast(wide, ir.VectorType(f32, 32))
            prod = builder.fpext(builder.fmul(wv, xv), ir.VectorType(f64, 32))
        quarters = [builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(i32, 8), list(range(8 * j, 8 * j + 8))))
                    for j in range(4)]
        lanes = builder.fadd(builder.fadd(quarters[0], quarters[1]), builder.fadd(quarters[2], quarters[3]))
        pacc = builder.bitcast(acc_ptr, ir.VectorType(f64, 8).as_pointer())
        builder.store(builder.fadd(builder.load(pacc, align=8), lanes), pacc, align=8)
        return context.get_dummy_value()
    return sig, codegen


# numba's @intrinsic takes the typing context first, so its decorator hides the call signature:
# the name compiled code calls, typed as it calls it (qtype, acc, raw, offset, x, x_offset).
_float_block = cast("Callable[[int, np.ndarray, np.ndarray, int, np.ndarray, int], None]", _float_block_ir)


@njit(**_opts, fastmath=_FAST)
def matvec_float_rows(qtype, raw, k, r0, r1, xq, out):
    """matvec_rows for F16, BF16 and F32 weights: exact products (products of halves are exact in
    float32, of F32 values in float64) summed in float64 lanes, 32 values at a time in vector
    registers (`_float_block`); a row whose length is not a multiple of 32 is converted first."""
    n = xq.shape[0]
    width = 4 if qtype == T_F32 else 2
    acc = np.empty(8, np.float64)
    if k % G == 0:
        for r in range(r0, r1):
            row = raw[r]
            for t in range(n):
                xt = xq[t]
                acc[:] = 0.0
                if qtype == T_F16:
                    for g in range(0, k, G):
                        _float_block(T_F16, acc, row, g * width, xt, g)
                elif qtype == T_BF16:
                    for g in range(0, k, G):
                        _float_block(T_BF16, acc, row, g * width, xt, g)
                else:
                    for g in range(0, k, G):
                        _float_block(T_F32, acc, row, g * width, xt, g)
                out[t, r] = np.float32(_lanes_sum(acc))
        return
    u32 = np.empty(k, np.uint32)
    w = np.empty(k, np.float32)
    for r in range(r0, r1):
        if qtype == T_F16:
            _f16_row(raw[r].view(np.uint16), u32, w)
        else:
            _wide_row(qtype, raw[r], u32, w)
        for t in range(n):
            total = 0.0
            for i in range(k):
                total += np.float64(w[i]) * np.float64(xq[t, i])
            out[t, r] = np.float32(total)


@njit(**_opts)
def _wide_row(qtype, row, u32, out):
    """A BF16 row (the high halves of float32s) or an F32 row as float32."""
    if qtype == T_BF16:
        h = row.view(np.uint16)
        for i in range(h.size):
            u32[i] = np.uint32(h[i]) << np.uint32(16)
    else:
        src = row.view(np.uint32)
        for i in range(src.size):
            u32[i] = src[i]
    f = u32.view(np.float32)
    for i in range(out.size):
        out[i] = f[i]


def _host_avx2() -> bool:
    """Whether numba compiles for this host and it has AVX2: then the block products use x86's
    psignb/pmaddubsw/pmaddwd (and pshufb for MXFP4 codes), as ggml's own AVX2 kernels do."""
    if numba.config.CPU_NAME or numba.config.CPU_FEATURES:   # type: ignore[attr-defined]  # made at import
        return False                      # compiling for another CPU (a portable cache): generic IR
    try:
        from llvmlite import binding

        return bool(binding.get_host_cpu_features().get("avx2"))
    except (ImportError, RuntimeError):
        return False


_AVX2 = _host_avx2()


def _x86(builder, name, ret, *args):
    """IR: call the x86 intrinsic llvm.x86.<name>."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), "llvm.x86." + name)
    return builder.call(fn, list(args))


def _block_lanes(builder, w, x):
    """IR: the 32 exact products w*x of two <32 x i8> vectors, summed 4 to a lane: lane j holds
    products 4j..4j+3, an exact integer (<8 x i32>). With AVX2 ggml's sequence: |w| times x
    with w's sign (psignb), adjacent pairs summed in 16 bits (pmaddubsw: at most 2*128*127, no
    saturation), then pairs of those (pmaddwd); elsewhere the same sums in generic vector IR."""
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    if _AVX2:
        v32 = ir.VectorType(i8, 32)
        pairs = _x86(builder, "avx2.pmadd.ub.sw", ir.VectorType(i16, 16), _x86(builder, "avx2.psign.b", v32, w, w),
                     _x86(builder, "avx2.psign.b", v32, x, w))
        return _x86(builder, "avx2.pmadd.wd", ir.VectorType(i32, 8), pairs, ir.Constant(ir.VectorType(i16, 16), [1] * 16))
    p = builder.mul(builder.sext(w, ir.VectorType(i32, 32)), builder.sext(x, ir.VectorType(i32, 32)))
    quarters = [builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(i32, 8), list(range(j, 32, 4)))) for j in range(4)]
    return builder.add(builder.add(quarters[0], quarters[1]), builder.add(quarters[2], quarters[3]))


def _int8_block_fma(builder, acc_ptr, w, x, dd):
    """IR: acc[0:8] += dd * `_block_lanes(w, x)`, each lane's integer exact in float64 and its
    product by dd (a float32) exact too. (Lanes kept in a numba tuple instead of this array
    measured 2x slower.)"""
    i32, f64 = ir.IntType(32), ir.DoubleType()
    lanes = builder.sitofp(_block_lanes(builder, w, x), ir.VectorType(f64, 8))
    splat = builder.insert_element(ir.Constant(ir.VectorType(f64, 8), ir.Undefined), dd, ir.Constant(i32, 0))
    splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(i32, 8), [0] * 8))
    pacc = builder.bitcast(acc_ptr, ir.VectorType(f64, 8).as_pointer())
    builder.store(builder.fadd(builder.load(pacc, align=8), builder.fmul(lanes, splat)), pacc, align=8)


PREFETCH_BYTES = 1024     # how far ahead in a weight row the next blocks are asked for


def _prefetch(builder, ptr):
    """IR: llvm.prefetch (read, keep) of the byte at `ptr`: a streamed expert is cold, and a row's
    next blocks then arrive while this one is multiplied."""
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _block_ints(builder, kind, ptr):
    """IR: one weight block's 32 integers as <32 x i8>, from its payload at `ptr` (after the
    scale). Q8_0 its 32 int8; Q4_0 its 16 bytes' low then high nibbles minus 8; MXFP4 those
    nibbles as e2m1 codes, doubled values 0 1 2 3 4 6 8 12 (bit 3 the sign), made by vector
    arithmetic: m + max(m-4, 0) + 2 max(m-6, 0)."""
    i8 = ir.IntType(8)
    if kind == T_Q8_0:
        return builder.load(builder.bitcast(ptr, ir.VectorType(i8, 32).as_pointer()), align=1)
    v = builder.load(builder.bitcast(ptr, ir.VectorType(i8, 16).as_pointer()), align=1)
    c16 = lambda n: ir.Constant(ir.VectorType(i8, 16), [n] * 16)  # noqa: E731
    lo, hi = builder.and_(v, c16(15)), builder.lshr(v, c16(4))
    codes = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(32))))
    c32 = lambda n: ir.Constant(ir.VectorType(i8, 32), [n] * 32)  # noqa: E731
    if kind == T_Q4_0:
        return builder.sub(codes, c32(8))
    if _AVX2:   # a table lookup per byte (pshufb looks up within each 16-byte half)
        table = ir.Constant(ir.VectorType(i8, 32), [int(v) for v in _MXFP4_DOUBLED] * 2)
        return _x86(builder, "avx2.pshuf.b", ir.VectorType(i8, 32), table, codes)
    m = builder.and_(codes, c32(7))
    over4 = builder.select(builder.icmp_signed(">", m, c32(4)), builder.sub(m, c32(4)), c32(0))
    over6 = builder.select(builder.icmp_signed(">", m, c32(6)), builder.sub(m, c32(6)), c32(0))
    mag = builder.add(builder.add(m, over4), builder.shl(over6, c32(1)))
    neg = builder.icmp_unsigned("!=", builder.and_(codes, c32(8)), c32(0))
    return builder.select(neg, builder.neg(mag), mag)


_BLOCK_BYTES = {T_Q8_0: 34, T_Q4_0: 18, T_MXFP4: 17}


@intrinsic
def _row_dot_ir(typingctx, qtype, row, x8, xd, lut, e8m0, nb):
    """One output of a Q8_0 / Q4_0 / MXFP4 product: sum over the row's `nb` blocks of
    fp32(d_w * xd[b]) * (the block's 32 integers times x8's), in float64. Each block's 32 exact
    integer products are summed 4 to a lane (`_int8_block_fma`) and scaled into 8 float64 lanes
    kept in registers through the whole row (an accumulator in memory cost a store-to-load
    round trip per block), then the lanes are added pairwise. The scale: Q8_0 / Q4_0 an f16
    (`lut`), MXFP4 an e8m0 exponent (`e8m0`). Each block also asks llvm.prefetch for the row's
    bytes PREFETCH_BYTES ahead: a streamed expert is cold."""
    if not isinstance(qtype, types.IntegerLiteral):
        return None
    kind = qtype.literal_value
    sig = types.float64(qtype, row, x8, xd, lut, e8m0, types.intp)

    def codegen(context, builder, signature, args):
        nb_v = args[6]
        i32, i64, f64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()
        rowp, xp, xdp, lutp, e8p = (context.make_array(ty)(context, builder, v).data
                                    for ty, v in zip(signature.args[1:6], args[1:6]))
        lanes8 = ir.VectorType(f64, 8)
        acc = cgutils.alloca_once_value(builder, ir.Constant(lanes8, [0.0] * 8))
        with cgutils.for_range(builder, nb_v) as loop:
            b = loop.index
            o = builder.mul(b, ir.Constant(b.type, _BLOCK_BYTES[kind]))
            _prefetch(builder, builder.gep(rowp, [builder.add(o, ir.Constant(o.type, PREFETCH_BYTES))]))
            if kind == T_MXFP4:
                dw = builder.load(builder.gep(e8p, [builder.zext(builder.load(builder.gep(rowp, [o])), i64)]))
                payload = builder.add(o, ir.Constant(o.type, 1))
            else:
                lo = builder.zext(builder.load(builder.gep(rowp, [o])), i64)
                hi = builder.zext(builder.load(builder.gep(rowp, [builder.add(o, ir.Constant(o.type, 1))])), i64)
                dw = builder.load(builder.gep(lutp, [builder.or_(lo, builder.shl(hi, ir.Constant(i64, 8)))]))
                payload = builder.add(o, ir.Constant(o.type, 2))
            # fp32(d_w * d_x) as ggml rounds it, then exact in float64
            dd = builder.fpext(builder.fmul(dw, builder.load(builder.gep(xdp, [b]))), f64)
            x = builder.load(builder.bitcast(builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 32))]),
                                             ir.VectorType(ir.IntType(8), 32).as_pointer()), align=1)
            _int8_block_fma(builder, acc, _block_ints(builder, kind, builder.gep(rowp, [payload])), x, dd)
        v = builder.load(acc)
        lane = [builder.extract_element(v, ir.Constant(i32, j)) for j in range(8)]
        pair = [builder.fadd(lane[2 * j], lane[2 * j + 1]) for j in range(4)]
        return builder.fadd(builder.fadd(pair[0], pair[1]), builder.fadd(pair[2], pair[3]))
    return sig, codegen


# numba's @intrinsic hides the call signature (the typing context comes first): the name
# compiled code calls, typed as it calls it (qtype, row, x8, xd, lut, e8m0, nb)
_row_dot = cast("Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], float]",
                _row_dot_ir)


@njit(**_opts)
def matvec_q8_0_rows(qtype, raw, k, r0, r1, x8, xd, out, lut):
    """matvec_rows for Q8_0, Q4_0 and MXFP4 weights (32-value blocks, Q8_0 activation x8 as int8):
    for every token and block fp32(d_w * d_x) * (q_w * q_x), the products exact integers summed
    4 to a lane in vector registers, the lanes in float64 (`_row_dot`)."""
    n = x8.shape[0]
    nb = k // 32
    for r in range(r0, r1):
        row = raw[r]
        for t in range(n):
            if qtype == T_Q8_0:
                total = _row_dot(T_Q8_0, row, x8[t], xd[t], lut, _E8M0_HALF, nb)
            elif qtype == T_Q4_0:
                total = _row_dot(T_Q4_0, row, x8[t], xd[t], lut, _E8M0_HALF, nb)
            else:
                total = _row_dot(T_MXFP4, row, x8[t], xd[t], lut, _E8M0_HALF, nb)
            out[t, r] = np.float32(total)


@njit(**_opts, inline="always")
def _lanes_sum(acc) -> float:
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


@njit(**_opts)
def dequant_q8_0_rows(qtype, raw, k, r0, r1, out, lut):
    """dequant_rows for Q8_0, Q4_0 and MXFP4 (compiles in a fraction of the general form)."""
    s8 = raw.view(np.int8)
    wbits = np.empty(32, np.uint32)
    wb = wbits.view(np.float32)
    for r in range(r0, r1):
        for b in range(k // 32):
            x0 = b * 32
            if qtype == T_Q8_0:
                o = b * 34
                d = np.float64(lut[np.int32(raw[r, o]) | (np.int32(raw[r, o + 1]) << 8)])
                for i in range(32):
                    out[r - r0, x0 + i] = d * np.float64(s8[r, o + 2 + i])
            elif qtype == T_Q4_0:
                o = b * 18
                d = np.float64(lut[np.int32(raw[r, o]) | (np.int32(raw[r, o + 1]) << 8)])
                for i in range(16):
                    q = np.int32(raw[r, o + 2 + i])
                    out[r - r0, x0 + i] = d * np.float64((q & 15) - 8)
                    out[r - r0, x0 + 16 + i] = d * np.float64((q >> 4) - 8)
            else:
                o = b * 17
                d = np.float64(_E8M0_HALF[raw[r, o]])
                for i in range(16):
                    q = np.int32(raw[r, o + 1 + i])
                    wbits[i] = _e2m1_bits(q & 15)
                    wbits[16 + i] = _e2m1_bits(q >> 4)
                for i in range(32):
                    out[r - r0, x0 + i] = d * np.float64(wb[i])



@intrinsic
def _f32_bits_ir(typingctx, x):
    """A float32's bits as a uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32_ir(typingctx, u):
    """The float32 whose bits are the low 32 of an integer (numba widens uint32 arithmetic)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = args[0] if args[0].type.width == 32 else builder.trunc(args[0], ir.IntType(32))
        return builder.bitcast(low, ir.FloatType())
    return types.float32(u), codegen


# typed as compiled code calls them, as _float_block
_f32_bits = cast("Callable[[np.float32], np.uint32]", _f32_bits_ir)
_bits_f32 = cast("Callable[[np.unsignedinteger[Any]], np.float32]", _bits_f32_ir)


@njit(**_opts, inline="always")
def _round_f16(x):
    """A float32 rounded to the nearest half (ties to even), as a float32 — numpy's
    astype(float16): subnormal halves keep their 2^-24 quantum, 65520 and beyond overflow.
    Branch-free, so a row of them vectorises: a normal half keeps the top 10 of the float32's
    23 fraction bits, rounded to even on its bits; a subnormal one is a multiple of 2^-24 (x
    scaled by 2^24 is exact, so rint rounds it once)."""
    x = np.float32(x)
    a = abs(x)
    b = _f32_bits(x)
    normal = _bits_f32((b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
    sub = np.float32(np.rint(x * np.float32(16777216.0)) * np.float32(5.9604644775390625e-08))
    r = sub if a < np.float32(6.103515625e-05) else normal
    r = np.float32(math.copysign(np.inf, x)) if a >= np.float32(65520.0) else r
    return r if a < np.float32(np.inf) else x                 # inf, nan as they are


@njit(**_opts)
def f16acc_cells(s, active, rows_kv, v64, M, S, acc):
    """ggml's one-chunk flash attention over KV cells in order, for R = tokens*heads rows
    (attention._f16acc_chunk): online softmax with float32 max M and sum S, V*softmax accumulated
    in an f16 buffer `acc` (float32 holding half values), rounded to f16 after every cell.
    s[R, cells] the scaled scores, active[R, cells] the mask, rows_kv[R] each row's KV head,
    v64[Hkv, cells, Dv] the values. Updates M, S, acc in place."""
    R, cells = s.shape
    Dv = acc.shape[1]
    for n in range(cells):
        for r in range(R):
            if not active[r, n]:
                continue
            sn = s[r, n]
            ms = np.float32(1.0)
            vs = np.float32(1.0)
            if sn > M[r]:
                ms = np.float32(math.exp(np.float64(np.float32(M[r] - sn))))
                for d in range(Dv):
                    acc[r, d] = _round_f16(acc[r, d] * ms)
                M[r] = sn
            else:
                vs = np.float32(math.exp(np.float64(np.float32(sn - M[r]))))
            h = rows_kv[r]
            for d in range(Dv):
                acc[r, d] = _round_f16(np.float32(np.float64(acc[r, d]) + v64[h, n, d] * np.float64(vs)))
            S[r] = np.float32(np.float64(S[r]) * np.float64(ms) + np.float64(vs))


@njit(**_opts)
def quantize_q8_0(x, xq, x8, d, sums):
    """engine.kernels._to_q8_0 compiled, bit for bit (quantize_row_q8_0 on x86): per 32 values
    amax, d = fp16(amax / 127), q = round-half-even(x * fp32(127 / amax)); fills the float32 and
    int8 integers, the scales and the blocks' sums of integers."""
    n, k = x.shape
    for t in range(n):
        for b in range(k // 32):
            x0 = b * 32
            amax = np.float32(0.0)
            for i in range(32):
                amax = max(amax, abs(x[t, x0 + i]))
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            total = np.float32(0.0)
            for i in range(32):
                q = np.float32(np.rint(x[t, x0 + i] * inv))
                xq[t, x0 + i] = q
                x8[t, x0 + i] = np.int8(q)
                total += q
            d[t, b] = _round_f16(amax / np.float32(127.0))
            sums[t, b] = total


# ---- batches: the rows of many matrices in one call, shared out among threads -------------------

# A batch is an int64 table, one row per (weight, activation) product: the weight's storage type,
# the address of its first row, its row stride in bytes and its row count, the product's first
# activation row and token count, and where its output [tokens, m] starts in the flat output.
IT_QTYPE, IT_ADDR, IT_STRIDE, IT_M, IT_X0, IT_NTOK, IT_OUT = range(7)
ITEM_FIELDS = 7


@intrinsic
def _u8_at_ir(typingctx, addr):
    """The uint8 pointer at an integer address (a weight's bytes the caller keeps alive)."""
    if not isinstance(addr, types.Integer):
        return None
    sig = types.CPointer(types.uint8)(addr)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())
    return sig, codegen


@intrinsic
def _fetch_add_ir(typingctx, counters, index, value):
    """Atomically counters[index] += value (int64, sequentially consistent); the old value."""
    if not (isinstance(counters, types.Array) and counters.dtype == types.int64):
        return None
    sig = types.int64(counters, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        arr_v, idx_v, val_v = args
        data = context.make_array(signature.args[0])(context, builder, arr_v).data
        return builder.atomic_rmw("add", builder.gep(data, [idx_v]), val_v, "seq_cst")
    return sig, codegen


# numba's @intrinsic takes the typing context first, so its decorator hides the call signature:
# these names are what compiled code calls, typed as it calls them.
_u8_at = cast("Callable[[int], Any]", _u8_at_ir)
_fetch_add = cast("Callable[[np.ndarray, int, int], int]", _fetch_add_ir)



@njit(**_opts)
def _chunk_starts(items, chunk_rows):
    """The first chunk index of each product and, last, the number of chunks."""
    n = items.shape[0]
    starts = np.empty(n + 1, np.int64)
    starts[0] = 0
    for i in range(n):
        starts[i + 1] = starts[i] + (items[i, IT_M] + chunk_rows - 1) // chunk_rows
    return starts


@njit(**_opts)
def _claim(counters, starts, items, chunk_rows):
    """The next unclaimed chunk as (product, first row, end row), or (-1, 0, 0) when none is left."""
    c = _fetch_add(counters, 0, 1)
    if c >= starts[-1]:
        return -1, 0, 0
    i = np.searchsorted(starts, c, side="right") - 1
    r0 = (c - starts[i]) * chunk_rows
    return i, r0, min(items[i, IT_M], r0 + chunk_rows)


def _family_rows(qtype, raw, k, r0, r1, x8, xq, xd, xsum, x0, n, dest, lut):
    """Rows r0..r1-1 of one product (activation rows x0..x0+n-1) by its family's kernel: the
    activation forms a batch passes (None for those its family does not read) choose it."""
    raise NotImplementedError("compiled code only")


@overload(_family_rows)
def _family_rows_impl(qtype, raw, k, r0, r1, x8, xq, xd, xsum, x0, n, dest, lut):
    """_family_rows typed: only the kernel a batch's arguments select is compiled into it."""
    if not isinstance(x8, types.NoneType):          # Q8_0 / Q4_0 / MXFP4: int8 integers and scales
        def q8_0(qtype, raw, k, r0, r1, x8, xq, xd, xsum, x0, n, dest, lut):
            matvec_q8_0_rows(qtype, raw, k, r0, r1, x8[x0:x0 + n], xd[x0:x0 + n], dest, lut)
        return q8_0
    if not isinstance(xsum, types.NoneType):        # K-quants: integers, scales and group sums
        def q8_k(qtype, raw, k, r0, r1, x8, xq, xd, xsum, x0, n, dest, lut):
            matvec_rows(qtype, raw, k, r0, r1, xq[x0:x0 + n], xd[x0:x0 + n], xsum[x0:x0 + n], dest, lut)
        return q8_k

    def plain(qtype, raw, k, r0, r1, x8, xq, xd, xsum, x0, n, dest, lut):   # F16 / BF16 / F32: values
        matvec_float_rows(qtype, raw, k, r0, r1, xq[x0:x0 + n], dest)
    return plain


@njit(**_opts)
def _chunks(items, k, x8, xq, xd, xsum, out, lut, chunk_rows, counters, starts):
    """Chunks of a batch's products until none is left (`_family_rows`)."""
    while True:
        i, r0, r1 = _claim(counters, starts, items, chunk_rows)
        if i < 0:
            return
        m, n, o = items[i, IT_M], items[i, IT_NTOK], items[i, IT_OUT]
        raw = numba.carray(_u8_at(items[i, IT_ADDR]), (m, items[i, IT_STRIDE]))
        _family_rows(items[i, IT_QTYPE], raw, k, r0, r1, x8, xq, xd, xsum, items[i, IT_X0], n,
                     out[o:o + n * m].reshape((n, m)), lut)


# A batch runs on the calling thread (`run_batch`) or on `lanes` threads of numba's threading
# layer (`run_batch_lanes`; engine.jit_loader chooses the layer; the caller sets
# numba.set_num_threads(lanes) first, out here because the compiled call would hold a pointer
# into the threading layer and never be cached),
# every lane taking chunks until none is left, so a lane that starts late or is preempted leaves
# its share to the others.

@njit(**_opts)
def run_batch(items, k, x8, xq, xd, xsum, out, lut, chunk_rows):
    """A batch of products of one kernel family (see _family_rows) on this thread."""
    _chunks(items, k, x8, xq, xd, xsum, out, lut, chunk_rows, np.zeros(1, np.int64), _chunk_starts(items, chunk_rows))


@njit(**_opts, parallel=True)
def run_batch_lanes(items, k, x8, xq, xd, xsum, out, lut, chunk_rows, lanes):
    """run_batch on `lanes` threads."""
    counters, starts = np.zeros(1, np.int64), _chunk_starts(items, chunk_rows)
    for _ in numba.prange(lanes):
        _chunks(items, k, x8, xq, xd, xsum, out, lut, chunk_rows, counters, starts)
