/* GEMM of a GGUF block weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) with int8
 * activations, as llama.cpp computes quantized weights: C[M, N] = A[M, K] @ W[N, K]^T with
 * each row of A quantized to int8 per 32 elements and integer dot products (AVX-512 VNNI
 * vpdpbusd, AVX2 vpmaddubsw + vpmaddwd, or plain C).
 *
 * Semantics (one definition, every path computes exactly this):
 *  - activation row m, group g of 32: amax = max |x|, da = amax / 127, qa = rint(clamp(
 *    x * (127 / amax), -127, 127)) (qa = 0, da = 0 when amax == 0); s16[h] = sum of qa over
 *    each half of 16 (pg_q8a_quantize).
 *  - weight row n, group j of the format (32 elements; 16 for Q6_K's sub-scales): integer
 *    quants q and fp32 scales (pagedcy_gemm_q8a_unpack.h). I = sum q * qa, exact in int32
 *    (Q4_0 / Q5_0: q - 8 / q - 16 as 0..15 / 0..31 minus 8 / 16 * S; Q6_K: q - 32 as 0..63 minus
 *    32 * S; Q8_0: signed q; the min kind's q as they are).
 *  - out = 0, then over the groups in order: out = fma(sw * da, (float)I, out), and for the
 *    min kind (Q4_1, Q5_1, Q4_K, Q5_K) also out = fma(mw * da, (float)S, out) with S the group's
 *    sum of qa. K-quants: sw = d * sc, mw = (-dmin) * m (Q6_K has no min); Q4_1 / Q5_1: sw = d,
 *    mw = m; Q4_0, Q5_0, Q8_0: sw = d.
 * The integer sums are exact and the float chain is the same operations in the same order
 * at every SIMD level, so every path gives the same bits: the decode kernels on panel-repacked
 * weights (pagedcy_gemm_q8p.h), the packed tile, the scalar reference, for any M, thread split
 * or row block. Error against float64 on the unquantized x: each element's rounding is at most
 * da / 2 = amax / 254, so |err| <= sum_j (amax_j / 254) * sum_{k in j} |w_k|, plus float32
 * rounding of the chain (tests check this bound).
 *
 * The packed tile (pagedcy_gemm_q8a_tile.h): a panel of rows is unpacked to bytes in
 * dot-product order ([k/4][row][4]; as in BLIS the packing is format-specific and the
 * micro-kernel shared) and a register tile of PG_Q8A_MR rows of A x 32 (16) rows of W runs the
 * integer sums and float chain. It packs from the file's rows (pagedcy_gemm_q8a, this file's
 * entry) or from a panel weight's records (pagedcy_gemm_q8p.h, which the models use).
 */
#ifndef PAGEDCY_GEMM_Q8A_H
#define PAGEDCY_GEMM_Q8A_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pagedcy_gemm.h"
#include "pagedcy_quant.h"
#include "pagedcy_gemm_q8a_unpack.h"



/* Activations of M rows quantized: qa [M][K] int8, da [M][K/32], s16 [M][K/16]. */
typedef struct {
    int K;
    const int8_t *qa;
    const float *da;
    const int32_t *s16;
} pg_q8a;

/* ---- activation quantization ---- */
static void pg_q8a_quant_scalar(const float *x, int K, int8_t *qa, float *da, int32_t *s16) {
    for (int g = 0; g < K / 32; g++) {
        const float *v = x + 32 * g;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        da[g] = amax / 127.0f;
        int s[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            const int q = (int)nearbyintf(fminf(fmaxf(v[i] * id, -127.0f), 127.0f));
            qa[32 * g + i] = (int8_t)q;
            s[i >> 4] += q;
        }
        s16[2 * g] = s[0];
        s16[2 * g + 1] = s[1];
    }
}

#if PG_HAVE_SIMD
#define PG_VNNI __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")))

PG_AVX512 static void pg_q8a_quant_avx512(const float *x, int K, int8_t *qa, float *da, int32_t *s16) {
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int g = 0; g < K / 32; g++) {
        const __m512 a = _mm512_loadu_ps(x + 32 * g), b = _mm512_loadu_ps(x + 32 * g + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        da[g] = amax / 127.0f;
        const __m512 vid = _mm512_set1_ps(id);
        /* max_ps(v, lo) returns lo for a NaN v, as fmaxf does */
        const __m512i qa0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(a, vid), lo), hi));
        const __m512i qb = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(b, vid), lo), hi));
        _mm_storeu_si128((__m128i *)(qa + 32 * g), _mm512_cvtepi32_epi8(qa0));
        _mm_storeu_si128((__m128i *)(qa + 32 * g + 16), _mm512_cvtepi32_epi8(qb));
        s16[2 * g] = _mm512_reduce_add_epi32(qa0);
        s16[2 * g + 1] = _mm512_reduce_add_epi32(qb);
    }
}

PG_AVX2_INLINE int pg_q8a_hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

PG_AVX2 static void pg_q8a_quant_avx2(const float *x, int K, int8_t *qa, float *da, int32_t *s16) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int g = 0; g < K / 32; g++) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 32 * g + 8 * i);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        da[g] = amax / 127.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], vid), lo), hi));
        s16[2 * g] = pg_q8a_hsum8i(_mm256_add_epi32(q[0], q[1]));
        s16[2 * g + 1] = pg_q8a_hsum8i(_mm256_add_epi32(q[2], q[3]));
        /* packs work within 128-bit lanes: the permute puts the 32 bytes back in order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qa + 32 * g), _mm256_permutevar8x32_epi32(p, order));
    }
}
#endif

/* Rows [0, M) of A (lda floats apart) into qa / da / s16 (rows K, K/32, K/16 apart).
 * K must be a multiple of 32. */
static void pg_q8a_quantize(int level, int M, int K, const float *A, int64_t lda, int8_t *qa, float *da,
                            int32_t *s16) {
    for (int m = 0; m < M; m++) {
        const float *x = A + (int64_t)m * lda;
        int8_t *q = qa + (int64_t)m * K;
        float *d = da + (int64_t)m * (K / 32);
        int32_t *s = s16 + (int64_t)m * (K / 16);
#if PG_HAVE_SIMD
        if (level == 2) { pg_q8a_quant_avx512(x, K, q, d, s); continue; }
        if (level == 1) { pg_q8a_quant_avx2(x, K, q, d, s); continue; }
#endif
        (void)level;
        pg_q8a_quant_scalar(x, K, q, d, s);
    }
}

/* Rows [0, M) of A quantized into a buffer of the calling thread (grown, never shrunk: a
 * decode step's projections reuse it instead of allocating three arrays a call), described
 * by a. Returns 0, or -1 when out of memory. */
static int pg_q8a_quantize_tls(int level, int M, int K, const float *A, int64_t lda, pg_q8a *a) {
    static __thread uint8_t *buf = NULL;
    static __thread size_t cap = 0;
    const size_t nq = (size_t)M * K, nd = (size_t)M * (K / 32), need = nq + 4 * nd + 4 * 2 * nd;
    if (need > cap) {
        free(buf);
        cap = 0;
        buf = (uint8_t *)aligned_alloc(64, (need + 63) / 64 * 64);
        if (!buf) return -1;
        cap = need;
    }
    int8_t *qa = (int8_t *)buf;              /* K is a multiple of 32: the floats stay aligned */
    float *da = (float *)(buf + nq);
    int32_t *s16 = (int32_t *)(buf + nq + 4 * nd);
    pg_q8a_quantize(level, M, K, A, lda, qa, da, s16);
    a->K = K;
    a->qa = qa;
    a->da = da;
    a->s16 = s16;
    return 0;
}

/* The group's sum of activations: groups of 16 (GS_) or 32. */
#define PG_Q8A_SUMS(GS_, s, g) ((GS_) == 16 ? (s)[g] : (s)[2 * (g)] + (s)[2 * (g) + 1])

/* The activation rows m0 .. m0 + MR_ - 1 of a: qa[i], da[i], s16[i]. */
#define PG_Q8A_ROWS(MR_)                                                                       \
    const int8_t *qa[MR_];                                                                     \
    const float *da[MR_];                                                                      \
    const int32_t *s16[MR_];                                                                   \
    PG_UNROLL for (int i = 0; i < MR_; i++) {                                                  \
        qa[i] = a->qa + (int64_t)(m0 + i) * K;                                                 \
        da[i] = a->da + (int64_t)(m0 + i) * (K / 32);                                          \
        s16[i] = a->s16 + (int64_t)(m0 + i) * (K / 16);                                        \
    }

/* The plain C path unpacks a row this many elements at a time (a multiple of every block). */
#define PG_Q8A_KC 512

/* Group j's integer sum with the format's offset folded in, and its link of the chain. */
static inline float pg_q8a_link(const pg_q8a_fmt *f, float acc, float sw, float mw, float da, int32_t dot,
                                int32_t S) {
    const int32_t Iv = f->kind == PG_Q8A_OFFSET ? dot - f->off * S : dot;
    acc = fmaf(sw * da, (float)Iv, acc);
    if (f->kind == PG_Q8A_MIN) acc = fmaf(mw * da, (float)S, acc);
    return acc;
}

/* ---- the reference: one output in plain C (also the scalar level and row tails) ---- */
static float pg_q8a_dot_scalar(const pg_q8a_fmt *f, const uint8_t *w, int K, const int8_t *qa, const float *da,
                               const int32_t *s16) {
    uint8_t q[PG_Q8A_KC];
    float sw[PG_Q8A_KC / 16], mw[PG_Q8A_KC / 16];
    float acc = 0.0f;
    const int gs = f->group;
    for (int k0 = 0; k0 < K; k0 += PG_Q8A_KC) {
        const int kc = pg_min(PG_Q8A_KC, K - k0);
        f->unpack(w, k0, kc, q, sw, mw, 1);
        for (int g = 0; g < kc / gs; g++) {
            const int k = k0 + gs * g;
            int32_t dot = 0;
            for (int i = 0; i < gs; i++)
                dot += (f->kind == PG_Q8A_SIGNED ? (int32_t)(int8_t)q[gs * g + i] : (int32_t)q[gs * g + i]) * qa[k + i];
            const int32_t S = gs == 16 ? s16[k / 16] : s16[k / 16] + s16[k / 16 + 1];
            acc = pg_q8a_link(f, acc, sw[g], mw[g], da[k / 32], dot, S);
        }
    }
    return acc;
}

#if PG_HAVE_SIMD
/* u8 x s8 -> 8 int32 sums of 4 (vpmaddubsw pairs are exact: at most 2 * 63 * 127 here; Q8_0's
 * signed quants go in as |q| x (a with q's sign), at most 2 * 128 * 127) */
PG_AVX2_INLINE __m256i pg_q8a_dot_y(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* fp16 in the low half of each int32 lane -> 8 floats */
PG_AVX2_INLINE __m256 pg_q8a_h2f_y(__m256i D) {
    const __m256i lo = _mm256_and_si256(D, _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
}
#endif /* PG_HAVE_SIMD */

#include "pagedcy_gemm_q8p.h"

/* Columns [n0, n1) of C[M, N] = A @ W^T for a GGUF block weight of type F as the file stores
 * it (row n at W + n * w_row_bytes) and activations a quantized by pg_q8a_quantize, on the
 * calling thread: the packed tile at the SIMD levels (it unpacks 32 / 16 rows of W at a time,
 * for every call: the models repack their weights once into panels instead,
 * pagedcy_gemm_q8p.h), one output at a time in plain C at the scalar level. simd: a
 * PAGEDCY_SIMD_* cap (AVX-512 needs the CPU's VNNI; without it the AVX2 kernels run). The bits
 * depend on nothing but the inputs (see the top). Returns 0; -1 out of memory; -3 for a type
 * without these kernels or a K that is not a multiple of its block. */
static int pagedcy_gemm_q8a(int simd, int F, int M, int n0, int n1, const pg_q8a *a, const void *W,
                            int64_t w_row_bytes, float *C, int64_t ldc) {
    const pg_q8a_fmt *f = pg_q8a_format(F);
    if (!f || a->K % f->block) return -3;
    if (M <= 0 || n1 <= n0) return 0;
#if PG_HAVE_SIMD
    int level = 0;
    if (simd >= PAGEDCY_SIMD_AVX512 && pagedcy_cpu_has_avx512vnni()) level = 2;
    else if (simd >= PAGEDCY_SIMD_AVX2 && pagedcy_cpu_has_avx2_fma()) level = 1;
    if (level) {
        const pg_q8a_src src = {f, F, (const uint8_t *)W, w_row_bytes, NULL, 0};
        return pg_q8a_tiled(level, &src, M, n0, n1, a, C, ldc);
    }
#else
    (void)simd;
#endif
    const int K = a->K;
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++)
            C[(int64_t)m * ldc + n] = pg_q8a_dot_scalar(f, (const uint8_t *)W + (int64_t)n * w_row_bytes, K,
                                                        a->qa + (int64_t)m * K, a->da + (int64_t)m * (K / 32),
                                                        a->s16 + (int64_t)m * (K / 16));
    return 0;
}

#endif
