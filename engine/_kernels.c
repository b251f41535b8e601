/* bmoe-py's compiled loops: products on GGUF blocks as stored, the way ggml's vec_dot computes them.
 *
 * Built by engine/native.py with the host's C compiler (cc -O2 -std=c11 -ffp-contract=off) into a
 * cache folder, or shipped inside a staged bmoe-py, and called through ctypes (which releases the
 * GIL). Plain C11 plus, on x86-64, functions compiled for AVX2 (+F16C) chosen at run time: the same
 * numbers either way (the integer sums are exact; the float64 lanes are added in one order).
 *
 * A weight row is read as ggml's vec_dot reads it: per 32 values, integers times a float scale
 * (Q8_0 / Q4_0 an f16 d, MXFP4 an e8m0 exponent, K-quants sc*q with the super-block's d and, for
 * Q4_K, min*dmin). The activation comes converted to the weight's vec_dot_type (engine.activation):
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
DEFINE_FLOAT_ROWS(f32_rows_avx2, T_F32, float_row_dot_avx2, __attribute__((target("avx2,f16c"))))
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

/* engine.activation's Q8_0 conversion, bit for bit (quantize_row_q8_0 on x86): per 32 values amax,
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
