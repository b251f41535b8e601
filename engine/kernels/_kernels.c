/* bmoe-py's compiled loops: products on GGUF blocks as stored, the way ggml's vec_dot computes them.
 *
 * Built by engine/kernels/native.py with the host's C compiler (cc -O2 -std=c11 -ffp-contract=off) into a
 * cache folder, or shipped inside a staged bmoe-py, and called through ctypes (which releases the
 * GIL). Plain C11 plus, on x86-64, functions compiled for AVX2 (+F16C) chosen at run time: the same
 * numbers either way (the integer sums are exact; the float64 lanes are added in one order).
 *
 * A weight row is read as ggml's vec_dot reads it: per 32 values, integers times a float scale
 * (Q8_0 / Q4_0 an f16 d, MXFP4 an e8m0 exponent, K-quants sc*q with the super-block's d and, for
 * Q4_K, min*dmin). The activation comes converted to the weight's vec_dot_type (engine.kernels.activation):
 * Q8_0 int8 blocks and scales, Q8_K integers (as float32) with a scale and a sum per 32 values,
 * F16/BF16 values (as float32). Per output row and token: sum over blocks of fp32(d_w * d_x) times
 * the block's exact integer dot product, every term exact in float64, summed in 8 float64 lanes
 * (lane j holds a block's products 4j..4j+3), the lanes added pairwise at the end of the row. Only
 * the order of a float64 sum differs from ggml, whose float32 lanes approximate the same value less
 * closely. A row is one sequence of operations whichever thread takes it: results do not depend on
 * the thread count.
 *
 * No floating-point contraction (-ffp-contract=off) and no -ffast-math: the float32 scale product
 * and the attention loop's roundings are ggml's.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BMOE_X86 1
#else
#define BMOE_X86 0
#endif
/* Loops the compiler vectorises itself (K-quants, dequantized tiles), also built for AVX2 and chosen
 * by the CPU at load: the same operations in the same order, in wider registers. */
#if BMOE_X86 && defined(__has_attribute)
#if __has_attribute(target_clones)
#define BMOE_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef BMOE_CLONES
#define BMOE_CLONES
#endif

enum { T_F32, T_F16, T_BF16, T_Q8_0, T_Q4_0, T_MXFP4, T_Q4_K, T_Q6_K };
enum { IT_QTYPE, IT_ADDR, IT_STRIDE, IT_M, IT_X0, IT_NTOK, IT_OUT, ITEM_FIELDS };
enum { FAMILY_Q8_0, FAMILY_Q8_K, FAMILY_FLOAT };
#define G 32
#define PREFETCH_BYTES 1024

/* kvalues_mxfp4: an e2m1 code's doubled value (bit 3 the sign) */
static const int8_t MXFP4_DOUBLED[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml_e8m0_to_fp32_half: 2^(e - 128), exact in float32 (e = 0 and 1 are subnormal), by its bits */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int use_x86 = -1; /* -1: not decided yet; 0: generic code; 1: AVX2 + F16C */

int bmoe_set_generic(int generic) {
    /* For tests and portable runs: force the generic code (1) or let the CPU decide (0). Returns
     * whether the AVX2 code is in use afterwards. */
#if BMOE_X86
    use_x86 = generic ? 0 : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"));
#else
    (void)generic;
    use_x86 = 0;
#endif
    return use_x86;
}

static int x86(void) {
    if (use_x86 < 0) bmoe_set_generic(getenv("BMOE_PY_GENERIC_KERNELS") != NULL);
    return use_x86;
}

static double lanes_sum(const double *a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* ---- Q8_0 / Q4_0 / MXFP4 rows times a Q8_0 activation ----------------------------------------- */

static int block_bytes(int kind) { return kind == T_Q8_0 ? 34 : kind == T_Q4_0 ? 18 : 17; }

static void block_ints(int kind, const uint8_t *p, int8_t *w) {
    if (kind == T_Q8_0) {
        memcpy(w, p, 32);
        return;
    }
    for (int i = 0; i < 16; i++) {
        int lo = p[i] & 15, hi = p[i] >> 4;
        if (kind == T_Q4_0) {
            w[i] = (int8_t)(lo - 8);
            w[i + 16] = (int8_t)(hi - 8);
        } else {
            w[i] = MXFP4_DOUBLED[lo];
            w[i + 16] = MXFP4_DOUBLED[hi];
        }
    }
}

static float block_scale(int kind, const uint8_t *o, const float *lut) {
    return kind == T_MXFP4 ? e8m0_half(o[0]) : lut[o[0] | (o[1] << 8)];
}

static inline __attribute__((always_inline)) double row_dot_generic(int kind, const uint8_t *row, const int8_t *x8,
                                                                   const float *xd, const float *lut, int64_t nb) {
    double acc[8] = {0};
    int bs = block_bytes(kind), skip = kind == T_MXFP4 ? 1 : 2;
    int8_t w[32];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = row + b * bs;
        __builtin_prefetch(o + PREFETCH_BYTES, 0, 3);
        double dd = (double)(block_scale(kind, o, lut) * xd[b]); /* fp32(d_w * d_x), as ggml */
        block_ints(kind, o + skip, w);
        const int8_t *x = x8 + b * 32;
        for (int j = 0; j < 8; j++) {
            int32_t s = w[4 * j] * x[4 * j] + w[4 * j + 1] * x[4 * j + 1] + w[4 * j + 2] * x[4 * j + 2] +
                        w[4 * j + 3] * x[4 * j + 3];
            acc[j] += dd * (double)s;
        }
    }
    return lanes_sum(acc);
}

#if BMOE_X86
/* ggml's AVX2 sequence: |w| times x with w's sign (psignb), adjacent pairs summed in 16 bits
 * (pmaddubsw: at most 2*128*127, no saturation), then pairs of those (pmaddwd): lane j holds the
 * products 4j..4j+3, the same exact integers as the generic code. */
__attribute__((target("avx2"), always_inline)) static inline double row_dot_avx2(int kind, const uint8_t *row,
                                                                               const int8_t *x8, const float *xd,
                                                                               const float *lut, int64_t nb) {
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6,
                                           8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    int bs = block_bytes(kind), skip = kind == T_MXFP4 ? 1 : 2;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = row + b * bs;
        __builtin_prefetch(o + PREFETCH_BYTES, 0, 3);
        double dd = (double)(block_scale(kind, o, lut) * xd[b]);
        __m256i w;
        if (kind == T_Q8_0) {
            w = _mm256_loadu_si256((const __m256i *)(o + 2));
        } else {
            __m128i v = _mm_loadu_si128((const __m128i *)(o + skip));
            __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
            __m256i codes = _mm256_set_m128i(hi, lo);
            w = kind == T_Q4_0 ? _mm256_sub_epi8(codes, _mm256_set1_epi8(8)) : _mm256_shuffle_epi8(table, codes);
        }
        __m256i x = _mm256_loadu_si256((const __m256i *)(x8 + b * 32));
        __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        __m256i lanes = _mm256_madd_epi16(pairs, ones);
        __m256d d = _mm256_set1_pd(dd);
        acc0 = _mm256_add_pd(acc0, _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(lanes)), d));
        acc1 = _mm256_add_pd(acc1, _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(lanes, 1)), d));
    }
    double a[8];
    _mm256_storeu_pd(a, acc0);
    _mm256_storeu_pd(a + 4, acc1);
    return lanes_sum(a);
}
#endif

/* One function per kind and code path, each with its kind a constant (the block's layout folds
 * into the loop); rows r0..r1-1 by tokens 0..n-1. */
#define Q8_0_ROWS_ARGS                                                                                    \
    const uint8_t *raw, int64_t stride, int64_t k, int64_t r0, int64_t r1, const int8_t *x8, const float *xd, \
        int64_t n, float *out, int64_t m, const float *lut
#define DEFINE_Q8_0_ROWS(NAME, KIND, IMPL, ATTR)                                           \
    ATTR static void NAME(Q8_0_ROWS_ARGS) {                                                \
        int64_t nb = k / 32;                                                               \
        for (int64_t r = r0; r < r1; r++) {                                                \
            const uint8_t *row = raw + r * stride;                                         \
            for (int64_t t = 0; t < n; t++)                                                \
                out[t * m + r] = (float)IMPL(KIND, row, x8 + t * k, xd + t * nb, lut, nb); \
        }                                                                                  \
    }
DEFINE_Q8_0_ROWS(q8_0_rows_generic, T_Q8_0, row_dot_generic, )
DEFINE_Q8_0_ROWS(q4_0_rows_generic, T_Q4_0, row_dot_generic, )
DEFINE_Q8_0_ROWS(mxfp4_rows_generic, T_MXFP4, row_dot_generic, )
#if BMOE_X86
DEFINE_Q8_0_ROWS(q8_0_rows_avx2, T_Q8_0, row_dot_avx2, __attribute__((target("avx2"))))
DEFINE_Q8_0_ROWS(q4_0_rows_avx2, T_Q4_0, row_dot_avx2, __attribute__((target("avx2"))))
DEFINE_Q8_0_ROWS(mxfp4_rows_avx2, T_MXFP4, row_dot_avx2, __attribute__((target("avx2"))))
#endif

static void matvec_q8_0_rows(int kind, Q8_0_ROWS_ARGS) {
#if BMOE_X86
    if (x86()) {
        (kind == T_Q8_0   ? q8_0_rows_avx2
         : kind == T_Q4_0 ? q4_0_rows_avx2
                          : mxfp4_rows_avx2)(raw, stride, k, r0, r1, x8, xd, n, out, m, lut);
        return;
    }
#endif
    (kind == T_Q8_0   ? q8_0_rows_generic
     : kind == T_Q4_0 ? q4_0_rows_generic
                      : mxfp4_rows_generic)(raw, stride, k, r0, r1, x8, xd, n, out, m, lut);
}

/* ---- F16 / BF16 / F32 rows times float values -------------------------------------------------- */

/* A row's value i as float32 (halves through the table; BF16 the high half of a float32). */
static inline __attribute__((always_inline)) float float_value(int kind, const uint8_t *row, int64_t i, const float *lut) {
    if (kind == T_F32) {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    if (kind == T_F16) return lut[h];
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 32 products summed 4 to a lane: lane i gets (p[i] + p[8+i]) + (p[16+i] + p[24+i]). F16 / BF16
 * products of half values are exact in float32; F32 ones are made in float64. */
static inline __attribute__((always_inline)) double float_row_dot_generic(int kind, const uint8_t *row, const float *x, int64_t k, const float *lut) {
    double acc[8] = {0}, p[32];
    int width = kind == T_F32 ? 4 : 2;
    for (int64_t g = 0; g < k; g += G) {
        __builtin_prefetch(row + g * width + PREFETCH_BYTES, 0, 3);
        for (int i = 0; i < 32; i++) {
            float w = float_value(kind, row, g + i, lut);
            p[i] = kind == T_F32 ? (double)w * (double)x[g + i] : (double)(w * x[g + i]);
        }
        for (int i = 0; i < 8; i++) acc[i] += (p[i] + p[8 + i]) + (p[16 + i] + p[24 + i]);
    }
    return lanes_sum(acc);
}

#if BMOE_X86
__attribute__((target("avx2,f16c"), always_inline)) static inline __m256 float8(int kind, const uint8_t *p) {
    if (kind == T_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

__attribute__((target("avx2,f16c"), always_inline)) static inline double float_row_dot_avx2(int kind, const uint8_t *row, const float *x,
                                                                     int64_t k, const float *lut) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int width = kind == T_F32 ? 4 : 2;
    (void)lut;
    for (int64_t g = 0; g < k; g += G) {
        const uint8_t *w = row + g * width;
        __builtin_prefetch(w + PREFETCH_BYTES, 0, 3);
        __m256d ql[4], qh[4];
        for (int j = 0; j < 4; j++) { /* quarter j: values 8j..8j+7 */
            __m256 xv = _mm256_loadu_ps(x + g + 8 * j);
            if (kind == T_F32) {
                __m256 wv = _mm256_loadu_ps((const float *)(w + 32 * j));
                ql[j] = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(wv)),
                                      _mm256_cvtps_pd(_mm256_castps256_ps128(xv)));
                qh[j] = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(wv, 1)),
                                      _mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1)));
            } else {
                __m256 prod = _mm256_mul_ps(float8(kind, w + 16 * j), xv);
                ql[j] = _mm256_cvtps_pd(_mm256_castps256_ps128(prod));
                qh[j] = _mm256_cvtps_pd(_mm256_extractf128_ps(prod, 1));
            }
        }
        lo = _mm256_add_pd(lo, _mm256_add_pd(_mm256_add_pd(ql[0], ql[1]), _mm256_add_pd(ql[2], ql[3])));
        hi = _mm256_add_pd(hi, _mm256_add_pd(_mm256_add_pd(qh[0], qh[1]), _mm256_add_pd(qh[2], qh[3])));
    }
    double a[8];
    _mm256_storeu_pd(a, lo);
    _mm256_storeu_pd(a + 4, hi);
    return lanes_sum(a);
}
#endif

#define FLOAT_ROWS_ARGS                                                                                     \
    const uint8_t *raw, int64_t stride, int64_t k, int64_t r0, int64_t r1, const float *xq, int64_t n, float *out, \
        int64_t m, const float *lut
/* Rows of 32-value groups; a row that is not (k % 32) is one float64 sum in order. */
#define DEFINE_FLOAT_ROWS(NAME, KIND, IMPL, ATTR)                                                         \
    ATTR static void NAME(FLOAT_ROWS_ARGS) {                                                              \
        for (int64_t r = r0; r < r1; r++) {                                                               \
            const uint8_t *row = raw + r * stride;                                                        \
            for (int64_t t = 0; t < n; t++) {                                                             \
                const float *x = xq + t * k;                                                              \
                double total = 0.0;                                                                       \
                if (k % G == 0) {                                                                         \
                    total = IMPL(KIND, row, x, k, lut);                                                   \
                } else {                                                                                  \
                    for (int64_t i = 0; i < k; i++) total += (double)float_value(KIND, row, i, lut) * (double)x[i]; \
                }                                                                                         \
                out[t * m + r] = (float)total;                                                            \
            }                                                                                             \
        }                                                                                                 \
    }
DEFINE_FLOAT_ROWS(f32_rows_generic, T_F32, float_row_dot_generic, )
DEFINE_FLOAT_ROWS(f16_rows_generic, T_F16, float_row_dot_generic, )
DEFINE_FLOAT_ROWS(bf16_rows_generic, T_BF16, float_row_dot_generic, )
#if BMOE_X86
DEFINE_FLOAT_ROWS(f32_rows_avx2_each, T_F32, float_row_dot_avx2, __attribute__((target("avx2,f16c"))))

/* F32 rows: float_row_dot_avx2's products and sums, with the activation widened to float64 once
 * per call instead of once per row (the same numbers; most of a small model's decode). */
__attribute__((target("avx2,f16c"))) static void f32_rows_avx2(FLOAT_ROWS_ARGS) {
    double *xw = k % G == 0 ? malloc(sizeof(double) * (size_t)(n * k)) : NULL;
    if (!xw) {
        f32_rows_avx2_each(raw, stride, k, r0, r1, xq, n, out, m, lut);
        return;
    }
    for (int64_t i = 0; i < n * k; i++) xw[i] = (double)xq[i];
    for (int64_t r = r0; r < r1; r++) {
        const float *row = (const float *)(const void *)(raw + r * stride);
        for (int64_t t = 0; t < n; t++) {
            const double *x = xw + t * k;
            __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
            for (int64_t g = 0; g < k; g += G) {
                __builtin_prefetch((const uint8_t *)(row + g) + PREFETCH_BYTES, 0, 3);
                __m256d ql[4], qh[4];
                for (int j = 0; j < 4; j++) {
                    __m256 wv = _mm256_loadu_ps(row + g + 8 * j);
                    ql[j] = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(wv)), _mm256_loadu_pd(x + g + 8 * j));
                    qh[j] = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(wv, 1)), _mm256_loadu_pd(x + g + 8 * j + 4));
                }
                lo = _mm256_add_pd(lo, _mm256_add_pd(_mm256_add_pd(ql[0], ql[1]), _mm256_add_pd(ql[2], ql[3])));
                hi = _mm256_add_pd(hi, _mm256_add_pd(_mm256_add_pd(qh[0], qh[1]), _mm256_add_pd(qh[2], qh[3])));
            }
            double a[8];
            _mm256_storeu_pd(a, lo);
            _mm256_storeu_pd(a + 4, hi);
            out[t * m + r] = (float)lanes_sum(a);
        }
    }
    free(xw);
}
DEFINE_FLOAT_ROWS(f16_rows_avx2, T_F16, float_row_dot_avx2, __attribute__((target("avx2,f16c"))))
DEFINE_FLOAT_ROWS(bf16_rows_avx2, T_BF16, float_row_dot_avx2, __attribute__((target("avx2,f16c"))))
#endif

static void matvec_float_rows(int kind, FLOAT_ROWS_ARGS) {
#if BMOE_X86
    if (x86()) {
        (kind == T_F32   ? f32_rows_avx2
         : kind == T_F16 ? f16_rows_avx2
                         : bf16_rows_avx2)(raw, stride, k, r0, r1, xq, n, out, m, lut);
        return;
    }
#endif
    (kind == T_F32   ? f32_rows_generic
     : kind == T_F16 ? f16_rows_generic
                     : bf16_rows_generic)(raw, stride, k, r0, r1, xq, n, out, m, lut);
}

/* ---- K-quants -------------------------------------------------------------------------------- */

/* One Q4_K / Q6_K row's super-blocks -> wint[k] (sc * q: |Q4_K| <= 63*15, |Q6_K| <= 128*32, int16),
 * wsc (d per 32 values) and, for Q4_K, wmin / wminsc (each 32 values' min and dmin). Returns
 * whether the type has mins. */
static int decode_row(int kind, const uint8_t *row, int64_t k, int16_t *wint, float *wsc, float *wmin,
                      float *wminsc, const float *lut) {
    if (kind == T_Q4_K) {
        for (int64_t sb = 0; sb < k / 256; sb++) {
            const uint8_t *o = row + sb * 144, *sc = o + 4;
            float d = lut[o[0] | (o[1] << 8)], dmin = lut[o[2] | (o[3] << 8)];
            for (int j = 0; j < 8; j++) { /* get_scale_min_k4 */
                int scale, mn;
                if (j < 4) {
                    scale = sc[j] & 63;
                    mn = sc[j + 4] & 63;
                } else {
                    scale = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
                    mn = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                }
                int64_t g = sb * 8 + j;
                wsc[g] = d;
                wminsc[g] = dmin;
                wmin[g] = (float)mn;
                const uint8_t *q = o + 16 + (j / 2) * 32;
                int shift = 4 * (j & 1);
                for (int i = 0; i < 32; i++) wint[g * 32 + i] = (int16_t)(scale * ((q[i] >> shift) & 15));
            }
        }
        return 1;
    }
    for (int64_t sb = 0; sb < k / 256; sb++) { /* Q6_K */
        const uint8_t *o = row + sb * 210;
        const int8_t *scales = (const int8_t *)(o + 192);
        float d = lut[o[208] | (o[209] << 8)];
        for (int g = 0; g < 8; g++) wsc[sb * 8 + g] = d;
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = o + 64 * half, *qh = o + 128 + 32 * half;
            const int8_t *sc = scales + 8 * half;
            int16_t *y = wint + sb * 256 + 128 * half;
            for (int l = 0; l < 32; l++) {
                int s = l / 16, lo0 = ql[l], lo1 = ql[l + 32], hi = qh[l];
                y[l] = (int16_t)(sc[s] * (((lo0 & 15) | ((hi & 3) << 4)) - 32));
                y[l + 32] = (int16_t)(sc[s + 2] * (((lo1 & 15) | (((hi >> 2) & 3) << 4)) - 32));
                y[l + 64] = (int16_t)(sc[s + 4] * (((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32));
                y[l + 96] = (int16_t)(sc[s + 6] * (((lo1 >> 4) | (((hi >> 6) & 3) << 4)) - 32));
            }
        }
    }
    return 0;
}

typedef struct {
    int16_t *wint, *x16; /* a row's sc*q; the tokens' activation integers */
    float *wsc, *wmin, *wminsc;
    void *block;
} Scratch;

static int scratch_alloc(Scratch *s, int64_t k, int64_t n) {
    int64_t ng = (k + G - 1) / G;
    s->block = calloc(1, (size_t)(3 * ng) * sizeof(float) + (size_t)(ng * G + n * k) * sizeof(int16_t));
    if (!s->block) return 0;
    s->wsc = s->block;
    s->wmin = s->wsc + ng;
    s->wminsc = s->wmin + ng;
    s->wint = (int16_t *)(s->wminsc + ng);
    s->x16 = s->wint + ng * G;
    return 1;
}

/* Activation integers xq[n, k] (Q8_K's, as float32), group scales xd[n, k/32] and group sums
 * xsum[n, k/32] (for Q4_K's mins). Per 32 values the integer dot product sum(sc*q * x) is exact in
 * int32 (at most 32 * 4096 * 127), times fp32(d_w * d_x) as ggml rounds it: exact in float64. */
BMOE_CLONES static int matvec_k_rows(int kind, const uint8_t *raw, int64_t stride, int64_t k, int64_t r0, int64_t r1,
                                     const float *xq, const float *xd, const float *xsum, int64_t n, float *out,
                                     int64_t m, const float *lut) {
    Scratch s;
    if (!scratch_alloc(&s, k, n)) return 0;
    int64_t ng = k / G;
    for (int64_t i = 0; i < n * k; i++) s.x16[i] = (int16_t)xq[i];
    for (int64_t r = r0; r < r1; r++) {
        int mins = decode_row(kind, raw + r * stride, k, s.wint, s.wsc, s.wmin, s.wminsc, lut);
        for (int64_t t = 0; t < n; t++) {
            const int16_t *x = s.x16 + t * k;
            const float *d = xd + t * ng, *sums = xsum + t * ng;
            double total = 0.0, corr = 0.0;
            for (int64_t g = 0; g < ng; g++) {
                const int16_t *wi = s.wint + g * G, *xi = x + g * G;
                int32_t isum = 0;
                for (int i = 0; i < G; i++) isum += (int32_t)wi[i] * (int32_t)xi[i];
                total += (double)(s.wsc[g] * d[g]) * (double)isum; /* float32 product, as ggml rounds it */
                if (mins) corr += (double)(s.wminsc[g] * d[g]) * ((double)s.wmin[g] * (double)sums[g]);
            }
            out[t * m + r] = (float)(total - corr);
        }
    }
    free(s.block);
    return 1;
}

/* ---- dequantized tiles (the batched path): exact float64 values ------------------------------- */

BMOE_CLONES int bmoe_dequant_rows(int kind, const uint8_t *raw, int64_t stride, int64_t k, int64_t r0, int64_t r1, double *out,
                      const float *lut) {
    if (kind == T_Q4_K || kind == T_Q6_K) {
        Scratch s;
        if (!scratch_alloc(&s, k, 0)) return 0;
        int64_t ng = (k + G - 1) / G;
        for (int64_t r = r0; r < r1; r++) {
            int mins = decode_row(kind, raw + r * stride, k, s.wint, s.wsc, s.wmin, s.wminsc, lut);
            double *y = out + (r - r0) * k;
            for (int64_t g = 0; g < ng; g++) {
                double sc = (double)s.wsc[g], mn = mins ? (double)s.wminsc[g] * (double)s.wmin[g] : 0.0;
                int64_t hi = k < (g + 1) * G ? k : (g + 1) * G;
                for (int64_t i = g * G; i < hi; i++) y[i] = sc * (double)s.wint[i] - mn;
            }
        }
        free(s.block);
        return 1;
    }
    int bs = block_bytes(kind), skip = kind == T_MXFP4 ? 1 : 2;
    int8_t w[32];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = raw + r * stride;
        double *y = out + (r - r0) * k;
        for (int64_t b = 0; b < k / 32; b++) {
            const uint8_t *o = row + b * bs;
            double d = (double)block_scale(kind, o, lut);
            block_ints(kind, o + skip, w);
            for (int i = 0; i < 32; i++) y[b * 32 + i] = d * (double)w[i];
        }
    }
    return 1;
}

/* ---- batches: the rows of many products in one call, shared out among threads ----------------- */

typedef struct {
    const int64_t *items; /* [nitems, ITEM_FIELDS] */
    int64_t nitems, k, chunk_rows, nchunks;
    const int64_t *starts; /* first chunk of each product */
    int family;
    const int8_t *x8;
    const float *xq, *xd, *xsum, *lut;
    float *out;
    int64_t next; /* the next unclaimed chunk (atomic) */
    int failed;
} Batch;

static void *chunks(void *arg) {
    Batch *b = arg;
    int64_t ng = b->k / G;
    for (;;) {
        int64_t c = __atomic_fetch_add(&b->next, 1, __ATOMIC_SEQ_CST);
        if (c >= b->nchunks) return NULL;
        int64_t i = 0;
        while (i + 1 < b->nitems && b->starts[i + 1] <= c) i++;
        const int64_t *it = b->items + i * ITEM_FIELDS;
        int64_t m = it[IT_M], n = it[IT_NTOK], x0 = it[IT_X0];
        int64_t r0 = (c - b->starts[i]) * b->chunk_rows, r1 = r0 + b->chunk_rows < m ? r0 + b->chunk_rows : m;
        const uint8_t *raw = (const uint8_t *)(uintptr_t)it[IT_ADDR];
        float *dest = b->out + it[IT_OUT];
        int kind = (int)it[IT_QTYPE];
        if (b->family == FAMILY_Q8_0) {
            matvec_q8_0_rows(kind, raw, it[IT_STRIDE], b->k, r0, r1, b->x8 + x0 * b->k, b->xd + x0 * ng, n, dest, m,
                             b->lut);
        } else if (b->family == FAMILY_Q8_K) {
            if (!matvec_k_rows(kind, raw, it[IT_STRIDE], b->k, r0, r1, b->xq + x0 * b->k, b->xd + x0 * ng,
                               b->xsum + x0 * ng, n, dest, m, b->lut))
                __atomic_store_n(&b->failed, 1, __ATOMIC_SEQ_CST);
        } else {
            matvec_float_rows(kind, raw, it[IT_STRIDE], b->k, r0, r1, b->xq + x0 * b->k, n, dest, m, b->lut);
        }
    }
}

/* Every product of a batch (one kernel family) on `lanes` threads: this one and lanes-1 made for
 * the call (no pool waits between calls: an idle engine spins nothing, and a forked child has no
 * threads to lose). Returns 0 when memory or a thread could not be had for a product. */
int bmoe_run_batch(const int64_t *items, int64_t nitems, int64_t k, const int8_t *x8, const float *xq,
                   const float *xd, const float *xsum, float *out, const float *lut, int64_t chunk_rows,
                   int family, int lanes) {
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(nitems + 1));
    if (!starts) return 0;
    starts[0] = 0;
    for (int64_t i = 0; i < nitems; i++)
        starts[i + 1] = starts[i] + (items[i * ITEM_FIELDS + IT_M] + chunk_rows - 1) / chunk_rows;
    Batch b = {items, nitems, k, chunk_rows, starts[nitems], starts, family, x8, xq, xd, xsum, lut, out, 0, 0};
    pthread_t threads[64];
    int made = 0;
    for (int i = 1; i < lanes && i < 64; i++) {
        if (pthread_create(&threads[made], NULL, chunks, &b) != 0) break; /* fewer lanes still finish */
        made++;
    }
    chunks(&b);
    for (int i = 0; i < made; i++) pthread_join(threads[i], NULL);
    free(starts);
    return !b.failed;
}

/* ---- the activation and attention ------------------------------------------------------------ */

/* A float32 rounded to the nearest half (ties to even), as a float32: numpy's astype(float16). */
static float round_f16(float x) {
    float a = fabsf(x);
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t nb = (b + 0xFFFu + ((b >> 13) & 1u)) & 0xFFFFE000u;
    float normal;
    memcpy(&normal, &nb, 4);
    float sub = rintf(x * 16777216.0f) * 5.9604644775390625e-08f;
    float r = a < 6.103515625e-05f ? sub : normal;
    if (a >= 65520.0f) r = copysignf(INFINITY, x);
    return a < INFINITY ? r : x; /* inf, nan as they are */
}

/* round_f16 over an array (its tests see it through this). */
void bmoe_round_f16(const float *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = round_f16(x[i]);
}

/* engine.kernels.activation's Q8_0 conversion, bit for bit (quantize_row_q8_0 on x86): per 32 values amax,
 * d = fp16(amax / 127), q = round-half-even(x * fp32(127 / amax)); the float32 and int8 integers,
 * the scales and the blocks' sums of integers. */
void bmoe_quantize_q8_0(const float *x, int64_t n, int64_t k, float *xq, int8_t *x8, float *d, float *sums) {
    for (int64_t t = 0; t < n; t++) {
        for (int64_t b = 0; b < k / 32; b++) {
            const float *v = x + t * k + b * 32;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            float inv = amax != 0.0f ? 127.0f / amax : 0.0f, total = 0.0f;
            for (int i = 0; i < 32; i++) {
                float q = rintf(v[i] * inv);
                xq[t * k + b * 32 + i] = q;
                x8[t * k + b * 32 + i] = (int8_t)q;
                total += q;
            }
            d[t * (k / 32) + b] = round_f16(amax / 127.0f);
            sums[t * (k / 32) + b] = total;
        }
    }
}

/* ggml's one-chunk flash attention over KV cells in order, for R = tokens*heads rows
 * (attention._f16acc_chunk): online softmax with float32 max M and sum S, V*softmax accumulated
 * in an f16 buffer (float32 holding half values) rounded to f16 after every cell. s[R, cells] the
 * scaled scores, active[R, cells] the mask, rows_kv[R] each row's KV head, v64[Hkv, cells, Dv]. */
void bmoe_f16acc_cells(const float *s, const uint8_t *active, int64_t R, int64_t cells, const int64_t *rows_kv,
                       const double *v64, int64_t Dv, float *M, float *S, float *acc) {
    for (int64_t n = 0; n < cells; n++) {
        for (int64_t r = 0; r < R; r++) {
            if (!active[r * cells + n]) continue;
            float sn = s[r * cells + n], ms = 1.0f, vs = 1.0f;
            float *a = acc + r * Dv;
            if (sn > M[r]) {
                ms = (float)exp((double)(float)(M[r] - sn));
                for (int64_t d = 0; d < Dv; d++) a[d] = round_f16(a[d] * ms);
                M[r] = sn;
            } else {
                vs = (float)exp((double)(float)(sn - M[r]));
            }
            const double *v = v64 + (rows_kv[r] * cells + n) * Dv;
            for (int64_t d = 0; d < Dv; d++) a[d] = round_f16((float)((double)a[d] + v[d] * (double)vs));
            S[r] = (float)((double)S[r] * (double)ms + (double)vs);
        }
    }
}

/* ---- one decode token, fused (engine/forward/fastpath.py) ---------------------------------------------
 *
 * A one-token decode of a layer in two calls (attention through routing; the routed experts) and
 * the output head in a third, for the models whose every step is one of the loops above: the same
 * operations in the same order as engine.forward.graph's numpy path, which are ggml's roundings. Each
 * element-wise step is written out as numpy computes it: float32 ops stay float32, a float64 sum
 * is numpy's pairwise sum (add.reduce from 0), exp is the float64 exp rounded to float32. The
 * f16 KV cache is the State's own arrays, written in place. */

/* numpy's pairwise float64 sum (add.reduce over a contiguous axis, started from 0) */
static double np_pairwise(const double *a, int64_t n) {
    if (n < 8) {
        double res = 0.;
        for (int64_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise(a, n2) + np_pairwise(a + n2, n - n2);
}

static double np_sum(const double *a, int64_t n) { return 0. + np_pairwise(a, n); }

/* ops.rms_norm over n values: x*x in float32, a float64 sum, float32 1/sqrt(mean + eps), then
 * (x * scale) * w in float32. `tmp` holds n doubles. */
static void rms_norm_f32(const float *x, const float *w, int64_t n, float eps, float *out, double *tmp) {
    for (int64_t i = 0; i < n; i++) tmp[i] = (double)(x[i] * x[i]);
    float mean = (float)(np_sum(tmp, n) / (double)n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

static float np_expf(float x) { return (float)exp((double)x); }

/* ggml_fp32_to_bf16 as activation._to_bf16 rounds it */
static float round_bf16(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t r = (b & 0x7FFFFFFFu) > 0x7F800000u ? (b | 0x00400000u) & 0xFFFF0000u
                                                 : (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    float f;
    memcpy(&f, &r, 4);
    return f;
}

/* The bits of a float32 that holds a half's value (round_f16's result). */
static uint16_t half_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    uint32_t e = (b >> 23) & 0xFFu, man = b & 0x7FFFFFu;
    if (e == 0xFF) return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0));
    if (e == 0) return sign;
    int he = (int)e - 127 + 15;
    if (he >= 31) return (uint16_t)(sign | 0x7C00u);
    if (he <= 0) return (uint16_t)(sign | ((man | 0x800000u) >> (126 - e)));
    return (uint16_t)(sign | ((uint32_t)he << 10) | (man >> 13));
}

/* A product's weight in a plan: qtype id, address, row stride, rows (m), inputs (k). */
enum { MAT_KIND, MAT_ADDR, MAT_STRIDE, MAT_M, MAT_K, MAT_FIELDS };

/* One activation vector of k values in the forms its products read (made on first use). */
typedef struct {
    const float *x;
    int64_t k;
    float *f16, *bf16, *xq, *xd, *xsum; /* f16 / bf16 values; the Q8_0 form */
    int8_t *x8;
    float *kq, *kd, *ksum;              /* the Q8_K form */
} Act;

static void act_free(Act *a) {
    free(a->f16);
    free(a->bf16);
    free(a->xq);
    free(a->xd);
    free(a->xsum);
    free(a->x8);
    free(a->kq);
    free(a->kd);
    free(a->ksum);
}

static int family_of(int kind) {
    return kind == T_Q8_0 || kind == T_Q4_0 || kind == T_MXFP4 ? FAMILY_Q8_0
           : kind == T_Q4_K || kind == T_Q6_K                  ? FAMILY_Q8_K
                                                               : FAMILY_FLOAT;
}

/* activation._to_q8_k (quantize_row_q8_K_ref) of one k-value vector, k a multiple of 256: per
 * block the first value of largest magnitude vmax, iscale = -127/vmax, d = 1/iscale, q =
 * min(rint(iscale*x), 127); q as floats, d per 32 values, each 32 values' sum of q. */
static int act_q8_k(Act *a) {
    if (a->kq) return 1;
    int64_t ng = a->k / 32;
    a->kq = malloc(sizeof(float) * (size_t)a->k);
    a->kd = malloc(sizeof(float) * (size_t)(ng ? ng : 1));
    a->ksum = malloc(sizeof(float) * (size_t)(ng ? ng : 1));
    if (!a->kq || !a->kd || !a->ksum || a->k % 256) return 0;
    for (int64_t b = 0; b < a->k / 256; b++) {
        const float *v = a->x + b * 256;
        int64_t at = 0;
        for (int64_t i = 1; i < 256; i++)
            if (fabsf(v[i]) > fabsf(v[at])) at = i;
        float vmax = v[at];
        float iscale = vmax != 0.0f ? -127.0f / vmax : 0.0f;
        float d = vmax != 0.0f ? 1.0f / iscale : 0.0f;
        for (int64_t g = 0; g < 8; g++) {
            float total = 0.0f;
            for (int64_t i = 0; i < 32; i++) {
                float q = rintf(iscale * v[g * 32 + i]);
                q = q < 127.0f ? q : 127.0f;
                a->kq[b * 256 + g * 32 + i] = q;
                total += q;
            }
            a->kd[b * 8 + g] = d;
            a->ksum[b * 8 + g] = total;
        }
    }
    return 1;
}

/* The float values a float-family weight of `kind` multiplies (activation.Activation.form). */
static const float *act_float(Act *a, int kind) {
    if (kind == T_F32) return a->x;
    float **slot = kind == T_F16 ? &a->f16 : &a->bf16;
    if (!*slot) {
        float *v = malloc(sizeof(float) * (size_t)a->k);
        if (!v) return NULL;
        for (int64_t i = 0; i < a->k; i++) v[i] = kind == T_F16 ? round_f16(a->x[i]) : round_bf16(a->x[i]);
        *slot = v;
    }
    return *slot;
}

static int act_q8_0(Act *a) {
    if (a->x8) return 1;
    int64_t ng = a->k / 32;
    a->xq = malloc(sizeof(float) * (size_t)a->k);
    a->x8 = malloc((size_t)a->k);
    a->xd = malloc(sizeof(float) * (size_t)(ng ? ng : 1));
    a->xsum = malloc(sizeof(float) * (size_t)(ng ? ng : 1));
    if (!a->xq || !a->x8 || !a->xd || !a->xsum) return 0;
    bmoe_quantize_q8_0(a->x, 1, a->k, a->xq, a->x8, a->xd, a->xsum);
    return 1;
}

#define MAX_HEAD_DIM 512

/* One query head's pass over KV cells 0..pos (those within n_swa of pos when n_swa > 0) of its
 * KV head (kh, vh: [cap, D] f16 bits): the score is the float64 sum of the exact products of the
 * f16 q (qh) and the cell's k, summed in 8 lanes (lane j: dims 8c + j) added as lanes_sum adds
 * them, rounded to float32 and scaled; then _f16acc_chunk's online softmax step with an f16
 * accumulator. acc[Dv] gets the unnormalised accumulator; returns the sum S. */
static float attend_cells_generic(const float *qh, const uint16_t *kh, const uint16_t *vh, int64_t Dk, int64_t Dv,
                                  int64_t pos, int64_t lo, int64_t hi, int64_t n_swa, float kq_scale, const float *lut,
                                  float *acc, float *M_out) {
    float M = -INFINITY, S = 0.0f;
    for (int64_t d = 0; d < Dv; d++) acc[d] = 0.0f;
    for (int64_t n = lo; n < hi; n++) {
        if (n_swa > 0 && pos - n >= n_swa) continue;
        const uint16_t *kr = kh + n * Dk;
        double l[8] = {0};
        for (int64_t d = 0; d < Dk; d++) l[d % 8] += (double)qh[d] * (double)lut[kr[d]];
        float sn = (float)lanes_sum(l) * kq_scale, ms = 1.0f, vs = 1.0f;
        if (sn > M) {
            ms = (float)exp((double)(float)(M - sn));
            for (int64_t d = 0; d < Dv; d++) acc[d] = round_f16(acc[d] * ms);
            M = sn;
        } else {
            vs = (float)exp((double)(float)(sn - M));
        }
        const uint16_t *vr = vh + n * Dv;
        for (int64_t d = 0; d < Dv; d++) acc[d] = round_f16((float)((double)acc[d] + (double)lut[vr[d]] * (double)vs));
        S = (float)((double)S * (double)ms + (double)vs);
    }
    *M_out = M;
    return S;
}

#if BMOE_X86
/* The same operations 8 dims at a time (Dk, Dv multiples of 8); F16C's round-to-nearest-even
 * conversion is round_f16 (but for a NaN's payload). */
__attribute__((target("avx2,f16c"))) static float attend_cells_avx2(const float *qh, const uint16_t *kh,
                                                                   const uint16_t *vh, int64_t Dk, int64_t Dv,
                                                                   int64_t pos, int64_t lo, int64_t hi, int64_t n_swa,
                                                                   float kq_scale, const float *lut, float *acc,
                                                                   float *M_out) {
    (void)lut;
    float M = -INFINITY, S = 0.0f;
    for (int64_t d = 0; d < Dv; d++) acc[d] = 0.0f;
    for (int64_t n = lo; n < hi; n++) {
        if (n_swa > 0 && pos - n >= n_swa) continue;
        const uint16_t *kr = kh + n * Dk;
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        for (int64_t d = 0; d < Dk; d += 8) {
            __m256 qv = _mm256_loadu_ps(qh + d);
            __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + d)));
            lo = _mm256_add_pd(lo, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(qv)),
                                                 _mm256_cvtps_pd(_mm256_castps256_ps128(kv))));
            hi = _mm256_add_pd(hi, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(qv, 1)),
                                                 _mm256_cvtps_pd(_mm256_extractf128_ps(kv, 1))));
        }
        double l[8];
        _mm256_storeu_pd(l, lo);
        _mm256_storeu_pd(l + 4, hi);
        float sn = (float)lanes_sum(l) * kq_scale, ms = 1.0f, vs = 1.0f;
        if (sn > M) {
            ms = (float)exp((double)(float)(M - sn));
            __m256 m8 = _mm256_set1_ps(ms);
            for (int64_t d = 0; d < Dv; d += 8)
                _mm256_storeu_ps(acc + d, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(acc + d), m8),
                                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
            M = sn;
        } else {
            vs = (float)exp((double)(float)(sn - M));
        }
        const uint16_t *vr = vh + n * Dv;
        __m256d v4 = _mm256_set1_pd((double)vs);
        for (int64_t d = 0; d < Dv; d += 8) {
            __m256 a = _mm256_loadu_ps(acc + d);
            __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + d)));
            __m256d slo = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                                        _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(vv)), v4));
            __m256d shi = _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                                        _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(vv, 1)), v4));
            __m256 sum = _mm256_set_m128(_mm256_cvtpd_ps(shi), _mm256_cvtpd_ps(slo));
            _mm256_storeu_ps(acc + d, _mm256_cvtph_ps(_mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        }
        S = (float)((double)S * (double)ms + (double)vs);
    }
    *M_out = M;
    return S;
}
#endif

static float attend_cells(const float *qh, const uint16_t *kh, const uint16_t *vh, int64_t Dk, int64_t Dv, int64_t pos,
                          int64_t lo, int64_t hi, int64_t n_swa, float kq_scale, const float *lut, float *acc,
                          float *M_out) {
#if BMOE_X86
    if (x86() && Dk % 8 == 0 && Dv % 8 == 0)
        return attend_cells_avx2(qh, kh, vh, Dk, Dv, pos, lo, hi, n_swa, kq_scale, lut, acc, M_out);
#endif
    return attend_cells_generic(qh, kh, vh, Dk, Dv, pos, lo, hi, n_swa, kq_scale, lut, acc, M_out);
}

/* attention._attend_ggml_f16acc (one chunk of every cell) or, for a KV view of n_kv_pad >= 512
 * cells, _attend_split_kv: `chunks` ranges of ceil(n_kv_pad / chunks) cells, each one pass, their
 * partial softmaxes merged in order in float32 (reduce_partials); then _normalise into out[Dv].
 * acc and part: Dv floats of scratch each. */
/* attention._apply_sinks: a head's learned logit joins the softmax's denominator (no value row);
 * a larger sink becomes the running max, scaling acc (float32, no f16 rounding here). */
static void apply_sink(float sink, float *acc, int64_t Dv, float *S, float *M) {
    float ms = 1.0f, vs = 1.0f;
    if (sink > *M) {
        ms = np_expf(*M - sink);
        for (int64_t d = 0; d < Dv; d++) acc[d] = acc[d] * ms;
    } else {
        vs = np_expf(sink - *M);
    }
    *S = (float)((double)*S * (double)ms + (double)vs);
    if (sink > *M) *M = sink;
}

static void attend_head(const float *qh, const uint16_t *kh, const uint16_t *vh, int64_t Dk, int64_t Dv, int64_t pos,
                        int64_t n_swa, float kq_scale, const float *lut, int64_t n_kv_pad, int64_t chunks,
                        const float *sink, float *acc, float *part, float *out) {
    const int64_t n_kv = pos + 1;
    float M, S;
    if (n_kv_pad < 512) {
        S = attend_cells(qh, kh, vh, Dk, Dv, pos, 0, n_kv, n_swa, kq_scale, lut, acc, &M);
        if (sink) apply_sink(*sink, acc, Dv, &S, &M);
    } else {
        const int64_t chunk = (n_kv_pad + chunks - 1) / chunks;
        float M_all = -INFINITY, S_all = 0.0f;
        for (int64_t d = 0; d < Dv; d++) acc[d] = 0.0f;
        for (int64_t lo = 0; lo < n_kv_pad; lo += chunk) {
            int64_t hi = lo + chunk < n_kv ? lo + chunk : n_kv;
            float Mc = -INFINITY, Sc = 0.0f;
            if (lo < hi) {
                Sc = attend_cells(qh, kh, vh, Dk, Dv, pos, lo, hi, n_swa, kq_scale, lut, part, &Mc);
            } else {
                for (int64_t d = 0; d < Dv; d++) part[d] = 0.0f;
            }
            if (sink && lo == 0) apply_sink(*sink, part, Dv, &Sc, &Mc); /* the first chunk's */
            if (Sc == 0.0f) continue;  /* not live */
            float m_new = M_all > Mc ? M_all : Mc;
            double old = (double)np_expf(M_all - m_new), now = (double)np_expf(Mc - m_new);
            for (int64_t d = 0; d < Dv; d++) acc[d] = (float)((double)acc[d] * old + (double)part[d] * now);
            S_all = (float)((double)S_all * old + (double)Sc * now);
            M_all = m_new;
        }
        S = S_all;
    }
    float inv = S != 0.0f ? 1.0f / S : 0.0f;
    for (int64_t d = 0; d < Dv; d++) out[d] = acc[d] * inv;
}

/* kernels.PARALLEL_MIN_MACS and CHUNK_BYTES */
#define FUSED_PARALLEL_MIN_MACS (1 << 17)
#define FUSED_CHUNK_BYTES (64 << 10)

/* The products of `n` weights (plan rows, MAT_FIELDS each) that read one activation, as
 * kernels.matmul_pairs runs them: grouped by kernel family, each group one batch on `lanes`
 * threads when it is big enough. out[i] is product i's output (m floats). */
static int products(const int64_t *const *mats, int n, Act *a, float *const *out, const float *lut, int lanes) {
    for (int i = 0; i < n; i++)
        if (mats[i][MAT_KIND] < 0 || mats[i][MAT_KIND] > T_Q6_K) return 0;
    for (int kind = 0; kind <= T_Q6_K; kind++) {
        int64_t items[8 * ITEM_FIELDS];
        int count = 0;
        int64_t macs = 0, stride = 1;
        float *base = NULL;
        for (int i = 0; i < n; i++)
            if (mats[i][MAT_KIND] == kind && mats[i][MAT_M] > 0 && (!base || out[i] < base)) base = out[i];
        if (!base) continue;
        for (int i = 0; i < n; i++) {
            const int64_t *w = mats[i];
            if (w[MAT_KIND] != kind || w[MAT_M] == 0) continue;
            if (count == 8) return 0;
            int64_t *it = items + count * ITEM_FIELDS;
            it[IT_QTYPE] = kind;
            it[IT_ADDR] = w[MAT_ADDR];
            it[IT_STRIDE] = w[MAT_STRIDE];
            it[IT_M] = w[MAT_M];
            it[IT_X0] = 0;
            it[IT_NTOK] = 1;
            it[IT_OUT] = out[i] - base;
            macs += w[MAT_M];
            if (w[MAT_STRIDE] > stride) stride = w[MAT_STRIDE];
            count++;
        }
        int use = macs * a->k >= FUSED_PARALLEL_MIN_MACS ? lanes : 1;
        int64_t chunk_rows = FUSED_CHUNK_BYTES / stride > 0 ? FUSED_CHUNK_BYTES / stride : 1;
        int fam = family_of(kind), ok;
        if (fam == FAMILY_Q8_0) {
            if (!act_q8_0(a)) return 0;
            ok = bmoe_run_batch(items, count, a->k, a->x8, NULL, a->xd, NULL, base, lut, chunk_rows, fam, use);
        } else if (fam == FAMILY_Q8_K) {
            if (!act_q8_k(a)) return 0;
            ok = bmoe_run_batch(items, count, a->k, NULL, a->kq, a->kd, a->ksum, base, lut, chunk_rows, fam, use);
        } else {
            const float *xv = act_float(a, kind);
            if (!xv) return 0;
            ok = bmoe_run_batch(items, count, a->k, NULL, xv, NULL, NULL, base, lut, chunk_rows, fam, use);
        }
        if (!ok) return 0;
    }
    return 1;
}

/* Plan of one layer (int64): the q, k, v, output and router weights (MAT_FIELDS each), then the
 * addresses of the norm weights (0: none) and the layer's dimensions. */
enum {
    PL_Q = 0, PL_K = 5, PL_V = 10, PL_O = 15, PL_ROUTER = 20,
    PL_ATTN_NORM = 25, PL_Q_NORM, PL_K_NORM, PL_FFN_NORM,
    PL_N_EMBD, PL_N_HEAD, PL_N_HEAD_KV, PL_DK, PL_DV, PL_N_ROT, PL_N_EXPERT, PL_GATING, PL_NORM_W, PL_N_SWA,
    PL_Q_BIAS, PL_K_BIAS, PL_V_BIAS, PL_O_BIAS, PL_ROUTER_BIAS, PL_SINKS, /* addresses, 0: none */
    PLAN_FIELDS
};

/* y[i] = y[i] + b[i] in float32 (a projection's bias), when there is one */
static void add_bias(float *y, int64_t addr, int64_t n) {
    if (!addr) return;
    const float *b = (const float *)(uintptr_t)addr;
    for (int64_t i = 0; i < n; i++) y[i] = y[i] + b[i];
}

/* Attention of one token at `pos` and its routing: x [n_embd] -> ffn_inp = attn_out(x) + x,
 * h = ffn_norm(ffn_inp), the top `n_used` experts `ids` (descending score, first index on a tie)
 * and their weights. The token's K and V go to cell `pos` of kc / vc (f16 bits [Hkv, cap, D]).
 * cos / sin: the position's rope row (n_rot/2 floats); n_kv_pad: llama.cpp's padded KV view,
 * split into kv_chunks (upstream's -t) from 512 cells on. Returns 0 when memory could not be had. */
int bmoe_decode_attn(const int64_t *plan, const float *x, int64_t pos, const float *cos_row, const float *sin_row,
                     uint16_t *kc, uint16_t *vc, int64_t cap, double eps_d, double kq_scale_d, double w_scale_d,
                     int64_t n_used, int64_t n_kv_pad, int64_t kv_chunks, const float *lut, int lanes,
                     float *ffn_inp, float *h, int64_t *ids, float *weights) {
    const int64_t E = plan[PL_N_EMBD], H = plan[PL_N_HEAD], Hkv = plan[PL_N_HEAD_KV], Dk = plan[PL_DK],
                  Dv = plan[PL_DV], half = plan[PL_N_ROT] / 2, NE = plan[PL_N_EXPERT], n_swa = plan[PL_N_SWA];
    const float eps = (float)eps_d, kq_scale = (float)kq_scale_d;
    const int64_t nq = H * Dk, nk = Hkv * Dk, nv = Hkv * Dv, n_kv = pos + 1;
    int64_t big = E > nq ? E : nq;
    if (n_kv > big) big = n_kv;
    if (NE > big) big = NE;
    float *buf = malloc(sizeof(float) * (size_t)(E + nq + nk + nv + H * Dv + E + NE + NE + 2 * Dv));
    double *tmp = malloc(sizeof(double) * (size_t)big);
    if (!buf || !tmp) {
        free(buf);
        free(tmp);
        return 0;
    }
    float *hn = buf, *q = hn + E, *k = q + nq, *v = k + nk, *att = v + nv, *o = att + H * Dv, *logits = o + E,
          *probs = logits + NE, *acc = probs + NE;
    int ok = 0;
    Act a1 = {0}, a2 = {0}, a3 = {0};

    rms_norm_f32(x, (const float *)(uintptr_t)plan[PL_ATTN_NORM], E, eps, hn, tmp);
    a1.x = hn;
    a1.k = E;
    {
        const int64_t *mats[3] = {plan + PL_Q, plan + PL_K, plan + PL_V};
        float *outs[3] = {q, k, v};
        if (!products(mats, 3, &a1, outs, lut, lanes)) goto done;
    }
    add_bias(q, plan[PL_Q_BIAS], nq);
    add_bias(k, plan[PL_K_BIAS], nk);
    add_bias(v, plan[PL_V_BIAS], nv);
    /* q/k norms per head, then NEOX rope over the first n_rot dims (float64, rounded once) */
    for (int64_t r = 0; r < H + Hkv; r++) {
        float *p = r < H ? q + r * Dk : k + (r - H) * Dk;
        int64_t norm = r < H ? plan[PL_Q_NORM] : plan[PL_K_NORM];
        if (norm) rms_norm_f32(p, (const float *)(uintptr_t)norm, Dk, eps, p, tmp);
        for (int64_t i = 0; i < half; i++) {
            double x0 = (double)p[i], x1 = (double)p[i + half], c = (double)cos_row[i], s = (double)sin_row[i];
            p[i] = (float)(x0 * c - x1 * s);
            p[i + half] = (float)(x0 * s + x1 * c);
        }
    }
    for (int64_t g = 0; g < Hkv; g++) {
        for (int64_t d = 0; d < Dk; d++) kc[(g * cap + pos) * Dk + d] = half_bits(round_f16(k[g * Dk + d]));
        for (int64_t d = 0; d < Dv; d++) vc[(g * cap + pos) * Dv + d] = half_bits(round_f16(v[g * Dv + d]));
    }
    /* attention._f16acc_chunk for one query: f16 q against the f16 cache, online softmax over the
     * cells in order, V accumulated in f16; then _normalise */
    for (int64_t r = 0; r < H; r++) {
        const int64_t g = r / (H / Hkv);
        float qh[MAX_HEAD_DIM];
        if (Dk > MAX_HEAD_DIM) goto done;
        for (int64_t d = 0; d < Dk; d++) qh[d] = round_f16(q[r * Dk + d]);
        const float *sink = plan[PL_SINKS] ? (const float *)(uintptr_t)plan[PL_SINKS] + r : NULL;
        attend_head(qh, kc + g * cap * Dk, vc + g * cap * Dv, Dk, Dv, pos, n_swa, kq_scale, lut, n_kv_pad,
                    kv_chunks > 0 ? kv_chunks : 1, sink, acc, acc + Dv, att + r * Dv);
    }
    a2.x = att;
    a2.k = H * Dv;
    {
        const int64_t *mats[1] = {plan + PL_O};
        float *outs[1] = {o};
        if (!products(mats, 1, &a2, outs, lut, lanes)) goto done;
    }
    add_bias(o, plan[PL_O_BIAS], E);
    for (int64_t i = 0; i < E; i++) ffn_inp[i] = o[i] + x[i];
    rms_norm_f32(ffn_inp, (const float *)(uintptr_t)plan[PL_FFN_NORM], E, eps, h, tmp);
    a3.x = h;
    a3.k = E;
    {
        const int64_t *mats[1] = {plan + PL_ROUTER};
        float *outs[1] = {logits};
        if (!products(mats, 1, &a3, outs, lut, lanes)) goto done;
    }
    add_bias(logits, plan[PL_ROUTER_BIAS], NE);
    /* forward.route: softmax then top-k ("softmax"), or top-k of the logits then a softmax of
     * those (1: "softmax_weight"); argsort(-v, stable) is the first maximum each time */
    {
        const int softmax_first = plan[PL_GATING] == 0;
        const float *score = logits;
        if (softmax_first) {
            float mx = logits[0];
            for (int64_t e = 1; e < NE; e++) mx = logits[e] > mx ? logits[e] : mx;
            for (int64_t e = 0; e < NE; e++) probs[e] = np_expf(logits[e] - mx);
            for (int64_t e = 0; e < NE; e++) tmp[e] = (double)probs[e];
            float inv = (float)(1.0 / np_sum(tmp, NE));
            for (int64_t e = 0; e < NE; e++) probs[e] = probs[e] * inv;
            score = probs;
        }
        for (int64_t s = 0; s < n_used; s++) {
            int64_t best = -1;
            for (int64_t e = 0; e < NE; e++) {
                int taken = 0;
                for (int64_t t = 0; t < s; t++) taken |= ids[t] == e;
                if (taken) continue;
                if (best < 0 || score[e] > score[best]) best = e;
            }
            ids[s] = best;
            weights[s] = score[best];
        }
        if (!softmax_first) {
            float mx = weights[0];
            for (int64_t s = 1; s < n_used; s++) mx = weights[s] > mx ? weights[s] : mx;
            for (int64_t s = 0; s < n_used; s++) weights[s] = np_expf(weights[s] - mx);
            for (int64_t s = 0; s < n_used; s++) tmp[s] = (double)weights[s];
            float inv = (float)(1.0 / np_sum(tmp, n_used));
            for (int64_t s = 0; s < n_used; s++) weights[s] = weights[s] * inv;
        }
        if (plan[PL_NORM_W]) {
            for (int64_t s = 0; s < n_used; s++) tmp[s] = (double)weights[s];
            float total = (float)np_sum(tmp, n_used);
            if (!isnan(total) && !(total > 6.103515625e-5f)) total = 6.103515625e-5f; /* np.maximum */
            for (int64_t s = 0; s < n_used; s++) weights[s] = weights[s] / total;
        }
        const float ws = (float)w_scale_d;
        if (w_scale_d != 0.0 && w_scale_d != 1.0)
            for (int64_t s = 0; s < n_used; s++) weights[s] = weights[s] * ws;
    }
    ok = 1;
done:
    act_free(&a1);
    act_free(&a2);
    act_free(&a3);
    free(buf);
    free(tmp);
    return ok;
}

/* The routed experts of one token (forward.moe_ffn): for each slot s, its row of `mats`
 * (EX_FIELDS), every gate and up product of h (plus their biases), then silu(gate) * up (act 0)
 * or swiglu_oai (act 1), every down product (plus its bias), each scaled by weights[s]; their
 * sum in slot order plus ffn_inp -> x_out [n_embd]. */
/* A slot's row in the experts' table: gate, up, down (MAT_FIELDS each), then the addresses of the
 * expert's gate, up and down bias rows (0: none). */
enum { EX_GATE = 0, EX_UP = MAT_FIELDS, EX_DOWN = 2 * MAT_FIELDS, EX_GATE_B = 3 * MAT_FIELDS, EX_UP_B, EX_DOWN_B,
       EX_FIELDS };

/* ops.swiglu_oai: min(gate, 7) * sigmoid(1.702 * that) * (clamp(up, +-7) + 1) */
static float swiglu_oai_1(float gate, float up) {
    float x = gate < 7.0f ? gate : 7.0f, y = up < -7.0f ? -7.0f : up > 7.0f ? 7.0f : up;
    float glu = (float)((double)x / (1.0 + exp(-(double)(1.702f * x))));
    return glu * (y + 1.0f);
}

/* swiglu_oai_1 over arrays (its tests see it through this). */
void bmoe_swiglu_oai(const float *gate, const float *up, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = swiglu_oai_1(gate[i], up[i]);
}

int bmoe_decode_moe(const int64_t *mats, int64_t n_used, const float *h, const float *ffn_inp, const float *weights,
                    int64_t n_embd, int act, const float *lut, int lanes, float *x_out) {
    const int64_t n_ff = mats[MAT_M];
    float *gu = malloc(sizeof(float) * (size_t)(2 * n_used * n_ff + n_used * n_ff + n_used * n_embd));
    if (!gu) return 0;
    float *glu = gu + 2 * n_used * n_ff, *down = glu + n_used * n_ff;
    int ok = 0;
    Act a = {.x = h, .k = n_embd};
    Act *g = calloc((size_t)n_used, sizeof(Act));
    if (!g) goto done;
    {
        const int64_t *wm[16];
        float *outs[16];
        int64_t done_slots = 0;
        /* gate and up of up to 8 experts a batch (products() takes 8 a kind) */
        while (done_slots < n_used) {
            int64_t take = n_used - done_slots < 4 ? n_used - done_slots : 4;
            for (int64_t s = 0; s < take; s++) {
                const int64_t *m = mats + (done_slots + s) * EX_FIELDS;
                wm[2 * s] = m + EX_GATE;
                wm[2 * s + 1] = m + EX_UP;
                outs[2 * s] = gu + (done_slots + s) * 2 * n_ff;
                outs[2 * s + 1] = gu + (done_slots + s) * 2 * n_ff + n_ff;
            }
            if (!products(wm, (int)(2 * take), &a, outs, lut, lanes)) goto done;
            done_slots += take;
        }
    }
    for (int64_t s = 0; s < n_used; s++) {
        const int64_t *row = mats + s * EX_FIELDS;
        float *gate = gu + s * 2 * n_ff, *up = gate + n_ff;
        float *y = glu + s * n_ff;
        add_bias(gate, row[EX_GATE_B], n_ff);
        add_bias(up, row[EX_UP_B], n_ff);
        for (int64_t i = 0; i < n_ff; i++) {
            if (act) {
                y[i] = swiglu_oai_1(gate[i], up[i]);
            } else {
                double gd = (double)gate[i];
                y[i] = (float)(gd / (1.0 + exp(-gd))) * up[i];
            }
        }
        g[s].x = y;
        g[s].k = n_ff;
        const int64_t *dm[1] = {row + EX_DOWN};
        float *outs[1] = {down + s * n_embd};
        if (!products(dm, 1, &g[s], outs, lut, lanes)) goto done;
        add_bias(down + s * n_embd, row[EX_DOWN_B], n_embd);
    }
    for (int64_t i = 0; i < n_embd; i++) {
        float total = down[i] * weights[0];
        for (int64_t s = 1; s < n_used; s++) total = total + down[s * n_embd + i] * weights[s];
        x_out[i] = total + ffn_inp[i];
    }
    ok = 1;
done:
    if (g)
        for (int64_t s = 0; s < n_used; s++) act_free(&g[s]);
    free(g);
    act_free(&a);
    free(gu);
    return ok;
}

/* forward._logits: output_norm(x) times the head weight (MAT_FIELDS) -> logits [m]. */
int bmoe_decode_head(const int64_t *mat, const float *norm, const float *x, int64_t n_embd, double eps,
                     const float *lut, int lanes, float *logits) {
    float *hn = malloc(sizeof(float) * (size_t)n_embd);
    double *tmp = malloc(sizeof(double) * (size_t)n_embd);
    int ok = 0;
    if (hn && tmp) {
        rms_norm_f32(x, norm, n_embd, (float)eps, hn, tmp);
        Act a = {.x = hn, .k = n_embd};
        const int64_t *mats[1] = {mat};
        float *outs[1] = {logits};
        ok = products(mats, 1, &a, outs, lut, lanes);
        act_free(&a);
    }
    free(hn);
    free(tmp);
    return ok;
}
