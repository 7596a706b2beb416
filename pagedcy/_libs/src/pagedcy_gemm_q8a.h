/* GEMM of a GGUF block weight (Q4_K, Q5_0, Q6_K, Q8_0) with int8 activations, as llama.cpp
 * computes quantized weights: C[M, N] = A[M, K] @ W[N, K]^T with each row of A quantized
 * to int8 per 32 elements and integer dot products (AVX-512 VNNI vpdpbusd, AVX2
 * vpmaddubsw + vpmaddwd, or plain C).
 *
 * Semantics (one definition, every path computes exactly this):
 *  - activation row m, group g of 32: amax = max |x|, da = amax / 127, qa = rint(clamp(
 *    x * (127 / amax), -127, 127)) (qa = 0, da = 0 when amax == 0); s16[h] = sum of qa over
 *    each half of 16 (pg_q8a_quantize).
 *  - weight row n, group j of the format (32 elements; 16 for Q6_K's sub-scales): integer
 *    quants q and fp32 scales (pagedcy_gemm_q8a_unpack.h). I = sum q * qa, exact in int32
 *    (Q5_0: q - 16 as 0..31 minus 16 * S; Q6_K: q - 32 as 0..63 minus 32 * S; Q8_0: signed q).
 *  - out = 0, then over the groups in order: out = fma(sw * da, (float)I, out), and for Q4_K
 *    also out = fma(mw * da, (float)S, out) with S the group's sum of qa. Q4_K: sw = d * sc,
 *    mw = (-dmin) * m; Q6_K: sw = d * sc; Q5_0, Q8_0: sw = d.
 * The integer sums are exact and the float chain is the same operations in the same order
 * at every SIMD level, so every path gives the same bits: the GEMV on the file's rows for few
 * rows of A, the packed tile for many, the scalar reference, for any M, thread split or row
 * block. Error against float64 on the unquantized x: each element's rounding is at most
 * da / 2 = amax / 254, so |err| <= sum_j (amax_j / 254) * sum_{k in j} |w_k|, plus float32
 * rounding of the chain (tests check this bound).
 *
 * Few rows (M < PG_Q8A_TILE_M): the weight is read as the file stores it, 16 (AVX-512) or 8
 * (AVX2) rows at a time; each row's per-lane partial sums are transpose-reduced so the
 * float chain runs with lanes over rows (no per-output horizontal sums). Many rows: a panel
 * of rows is unpacked to bytes in dot-product order ([k/4][row][4], as in BLIS the
 * packing is format-specific and the micro-kernel shared) and a register tile of
 * PG_Q8A_MR rows of A x 32 (16) rows of W runs the same integer sums and float chain.
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

/* Rows of A from which the packed tile beats the GEMV (same bits either way). Q4_K 8192 x
 * 2048, 2 threads, Xeon: GEMV / tile 0.73 / 1.44 ms at 4 rows, 1.42 / 1.53 at 8, 2.80 / 1.87
 * at 16 (the tile packs the whole weight on every call). */
#ifndef PG_Q8A_TILE_M
#define PG_Q8A_TILE_M 8
#endif


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
/* Q4_K's eight group scales sw[j] = d * sc_j and mins mw[j] = ndm * mn_j for the rows in lanes,
 * from the block's dwords Q0 (bytes 4-7: sc 0-3 and the high bits of sc 4-7), Q1 (8-11: mn 0-3
 * and the high bits of mn 4-7) and Q2 (12-15: the low nibbles of sc / mn 4-7): the same
 * integer ops at either width (P _mm512 / _mm256, S si512 / si256, V the integer vector). */
#define PG_Q8A_K4_SCALES(P, S, V, Q0, Q1, Q2, d, ndm, sw, mw)                                       \
    PG_UNROLL for (int j = 0; j < 4; j++) {                                                      \
        const V m63_ = P##_set1_epi32(63), m15_ = P##_set1_epi32(15), m3_ = P##_set1_epi32(3);       \
        const V sc = P##_and_##S(P##_srli_epi32(Q0, 8 * j), m63_);                                 \
        const V mm = P##_and_##S(P##_srli_epi32(Q1, 8 * j), m63_);                                 \
        const V sc2 = P##_or_##S(P##_and_##S(P##_srli_epi32(Q2, 8 * j), m15_),                     \
                                 P##_slli_epi32(P##_and_##S(P##_srli_epi32(Q0, 8 * j + 6), m3_), 4)); \
        const V mm2 = P##_or_##S(P##_and_##S(P##_srli_epi32(Q2, 8 * j + 4), m15_),                 \
                                 P##_slli_epi32(P##_and_##S(P##_srli_epi32(Q1, 8 * j + 6), m3_), 4)); \
        sw[j] = P##_mul_ps(d, P##_cvtepi32_ps(sc));                                               \
        mw[j] = P##_mul_ps(ndm, P##_cvtepi32_ps(mm));                                             \
        sw[j + 4] = P##_mul_ps(d, P##_cvtepi32_ps(sc2));                                          \
        mw[j + 4] = P##_mul_ps(ndm, P##_cvtepi32_ps(mm2));                                        \
    }

/* ---- GEMV, AVX-512 VNNI: 16 rows of W against one row of A ----
 * Shuffle-adds that reduce 16 vectors of per-row partial sums (8 lanes per group) to lanes
 * over rows; the Q4_K / Q8_0 order of rows in lanes is pg_q8a_perm16. */
#define PG_ZSH(a, b, i) _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), i))
#define PG_ZC1(a, b) _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xDD))
#define PG_ZC2(a, b) _mm512_add_epi32(PG_ZSH(a, b, 0x44), PG_ZSH(a, b, 0xEE))
#define PG_ZC3(a, b) _mm512_add_epi32(PG_ZSH(a, b, 0x88), PG_ZSH(a, b, 0xDD))
static const int pg_q8a_perm16[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
static const int pg_q8a_inv16[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};

/* 16 vectors, lanes 8h..8h+7 of v[r] the partials of row r's group h -> two vectors of
 * sums, out[h] lane p holding row perm16[p]'s group h. */
PG_AVX512_INLINE void pg_q8a_reduce16(__m512i *v, __m512i *out) {
    PG_UNROLL for (int q = 0; q < 8; q++) v[q] = PG_ZC1(v[2 * q], v[2 * q + 1]);
    PG_UNROLL for (int q = 0; q < 4; q++) v[q] = PG_ZC2(v[2 * q], v[2 * q + 1]);
    PG_UNROLL for (int q = 0; q < 2; q++) v[q] = PG_ZC3(v[2 * q], v[2 * q + 1]);
    out[0] = _mm512_shuffle_i64x2(v[0], v[1], 0x88);
    out[1] = _mm512_shuffle_i64x2(v[0], v[1], 0xDD);
}

/* Prefetch of W for the GEMV: each of the R rows of the block, PG_Q8A_PFD bytes ahead of
 * the step at byte off of the rows (past a row's end: the next block of R rows, at the same
 * distance), into L2. The hardware prefetchers alone left the 16 short row streams at half
 * the read bandwidth (Q4_K 2048 x 8192, 2 threads, Xeon: 15.5 -> 22 GB/s with it). Measured
 * on the Xeon, 2 threads, from memory: ~576 bytes ahead (4 Q4_K blocks) best of 1-12 blocks;
 * into L2 (locality 2) 1-3 GB/s above L1 on Q4_K, Q5_0, Q6_K and Q8_0 shapes; prefetching
 * the next block of rows linearly instead ran 10-30% slower (faster only on 640-wide Q8_0). */
#ifndef PG_Q8A_PFD
#define PG_Q8A_PFD 576
#endif
#ifndef PG_Q8A_PFLOC
#define PG_Q8A_PFLOC 2
#endif
PG_AVX2_INLINE void pg_q8a_prefetch(const uint8_t *W, int64_t rb, int R, int64_t off, int bytes) {
    off += PG_Q8A_PFD;
    const uint8_t *p = W + (off < rb ? off : (int64_t)R * rb + off - rb);
    for (int r = 0; r < R; r++)
        for (int l = 0; l < bytes; l += 64) __builtin_prefetch(p + (int64_t)r * rb + l, 0, PG_Q8A_PFLOC);
}

PG_VNNI static void pg_q8a_gemv_avx512_q4k(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                       const int32_t *s16, float *out) {
    const __m512i offs = _mm512_mullo_epi32(_mm512_loadu_si512(pg_q8a_perm16), _mm512_set1_epi32((int)rb));
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = W + (int64_t)b * 144;
        pg_q8a_prefetch(W, rb, 16, (int64_t)b * 144, 144);
        const __m512i D = _mm512_i32gather_epi32(offs, blk, 1);
        const __m512i Q0 = _mm512_i32gather_epi32(offs, blk + 4, 1);
        const __m512i Q1 = _mm512_i32gather_epi32(offs, blk + 8, 1);
        const __m512i Q2 = _mm512_i32gather_epi32(offs, blk + 12, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D));
        const __m512 ndm = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16))));
        __m512 sw[8], mw[8];
        PG_Q8A_K4_SCALES(_mm512, si512, __m512i, Q0, Q1, Q2, d, ndm, sw, mw);
        const int8_t *a = qa + b * 256;
        PG_UNROLL for (int j = 0; j < 4; j += 2) {
            /* one 64-byte load per row: quant bytes of chunks j, j+1; low nibbles are groups
             * 2j | 2j+2, high nibbles 2j+1 | 2j+3 */
            const __m512i alo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + 64 * j))),
                                                   _mm256_loadu_si256((const __m256i *)(a + 64 * j + 64)), 1);
            const __m512i ahi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + 64 * j + 32))),
                                                   _mm256_loadu_si256((const __m256i *)(a + 64 * j + 96)), 1);
            __m512i L[16], H[16], IL[2], IH[2];
            PG_UNROLL for (int r = 0; r < 16; r++) {
                const __m512i w = _mm512_loadu_si512(blk + 16 + 32 * j + (int64_t)r * rb);
                L[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(w, m4), alo);
                H[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(_mm512_srli_epi16(w, 4), m4), ahi);
            }
            pg_q8a_reduce16(L, IL);
            pg_q8a_reduce16(H, IH);
            PG_UNROLL for (int t = 0; t < 4; t++) {
                const int jj = 2 * j + t, g = b * 8 + jj;
                const __m512i Iv = (t & 1) ? IH[t >> 1] : IL[t >> 1];
                const __m512 dav = _mm512_set1_ps(da[g]);
                acc = _mm512_fmadd_ps(_mm512_mul_ps(sw[jj], dav), _mm512_cvtepi32_ps(Iv), acc);
                acc = _mm512_fmadd_ps(_mm512_mul_ps(mw[jj], dav), _mm512_set1_ps((float)(s16[2 * g] + s16[2 * g + 1])), acc);
            }
        }
    }
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_loadu_si512(pg_q8a_inv16), acc));
}

PG_VNNI static void pg_q8a_gemv_avx512_q6k(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                       const int32_t *s16, float *out) {
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = W + (int64_t)b * 210;
        pg_q8a_prefetch(W, rb, 16, (int64_t)b * 210, 210);
        const __m512i Dg = _mm512_i32gather_epi32(offs, blk + 206, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(Dg, 16)));
        __m512i Sc[4];
        PG_UNROLL for (int i = 0; i < 4; i++) Sc[i] = _mm512_i32gather_epi32(offs, blk + 192 + 4 * i, 1);
        __m512 sw[16];
        PG_UNROLL for (int i = 0; i < 16; i++)
            sw[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(Sc[i / 4], 24 - 8 * (i % 4)), 24)));
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const int8_t *a = qa + b * 256 + 128 * h;
            const __m512i a01 = _mm512_loadu_si512(a), a23 = _mm512_loadu_si512(a + 64);
            __m512i P[16], R[16];
            PG_UNROLL for (int r = 0; r < 16; r++) {
                const uint8_t *rp = blk + (int64_t)r * rb;
                const __m512i z = _mm512_loadu_si512(rp + 64 * h);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(rp + 128 + 32 * h)));
                /* (lo nibble) | (2 high bits at bits 4-5): ternlog 0xF8 = a | (b & c) */
                const __m512i y01 = _mm512_ternarylogic_epi32(_mm512_and_si512(z, m4), _mm512_sllv_epi16(hb, sh01), m30, 0xF8);
                const __m512i y23 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(z, 4), m4),
                                                              _mm512_srlv_epi16(hb, sh23), m30, 0xF8);
                P[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), y01, a01);
                R[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), y23, a23);
            }
            /* each row's vector holds 4 groups of 16 x 4 lanes: two shuffle-add levels and a
             * 4 x 4 transpose of 128-bit blocks give lanes over rows in natural order */
            PG_UNROLL for (int q = 0; q < 8; q++) { P[q] = PG_ZC2(P[2 * q], P[2 * q + 1]); R[q] = PG_ZC2(R[2 * q], R[2 * q + 1]); }
            PG_UNROLL for (int q = 0; q < 4; q++) { P[q] = PG_ZC3(P[2 * q], P[2 * q + 1]); R[q] = PG_ZC3(R[2 * q], R[2 * q + 1]); }
            PG_UNROLL for (int pass = 0; pass < 2; pass++) {
                const __m512i *O = pass ? R : P;
                const __m512i T0 = _mm512_shuffle_i64x2(O[0], O[1], 0x44), T1 = _mm512_shuffle_i64x2(O[0], O[1], 0xEE);
                const __m512i T2 = _mm512_shuffle_i64x2(O[2], O[3], 0x44), T3 = _mm512_shuffle_i64x2(O[2], O[3], 0xEE);
                const __m512i G[4] = {_mm512_shuffle_i64x2(T0, T2, 0x88), _mm512_shuffle_i64x2(T0, T2, 0xDD),
                                      _mm512_shuffle_i64x2(T1, T3, 0x88), _mm512_shuffle_i64x2(T1, T3, 0xDD)};
                PG_UNROLL for (int k = 0; k < 4; k++) {
                    const int j = 8 * h + 4 * pass + k, g16 = b * 16 + j;
                    const __m512i Iv = _mm512_sub_epi32(G[k], _mm512_set1_epi32(32 * s16[g16]));
                    acc = _mm512_fmadd_ps(_mm512_mul_ps(sw[j], _mm512_set1_ps(da[g16 >> 1])), _mm512_cvtepi32_ps(Iv), acc);
                }
            }
        }
    }
    _mm512_storeu_ps(out, acc);
}

/* The 32-element block formats (Q8_0, Q5_0) step two groups at a time. Activations of
 * groups g and g + 1 as one vector; for a last odd group (two == 0) the upper half is zero,
 * so whatever weight bytes meet it add nothing. */
PG_AVX512_INLINE __m512i pg_q8a_act2(const int8_t *qa, int g, int two) {
    return two ? _mm512_loadu_si512(qa + 32 * g)
               : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(qa + 32 * g)));
}

/* Their float chain for 16 rows over groups g (and g + 1): block t's fp16 d first in the
 * block, blocks bs bytes apart, rows at offs (perm16 order), Iv the reduced integer sums,
 * I = Iv - off * S (off 128 for Q8_0's sign flip, 16 for Q5_0). */
PG_AVX512_INLINE __m512 pg_q8a_chain2(__m512 acc, __m512i offs, const uint8_t *blk, int bs, int two,
                                      const __m512i *Iv, int off, const int32_t *s16, const float *da, int g) {
    PG_UNROLL for (int t = 0; t < 2; t++) {
        if (t && !two) break;
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(offs, blk + bs * t, 1)));
        const int gg = g + t;
        const __m512i Ic = _mm512_sub_epi32(Iv[t], _mm512_set1_epi32(off * (s16[2 * gg] + s16[2 * gg + 1])));
        acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(da[gg])), _mm512_cvtepi32_ps(Ic), acc);
    }
    return acc;
}

PG_VNNI static void pg_q8a_gemv_avx512_q8_0(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                        const int32_t *s16, float *out) {
    const __m512i offs = _mm512_mullo_epi32(_mm512_loadu_si512(pg_q8a_perm16), _mm512_set1_epi32((int)rb));
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const int G = K / 32;
    __m512 acc = _mm512_setzero_ps();
    for (int g = 0; g < G; g += 2) {
        const int two = g + 1 < G;
        const uint8_t *blk = W + (int64_t)g * 34;
        pg_q8a_prefetch(W, rb, 16, (int64_t)g * 34, 68);
        /* q ^ 0x80 = q + 128 as unsigned bytes; I = dot - 128 * S */
        const __m512i a = pg_q8a_act2(qa, g, two);
        __m512i L[16], Iv[2];
        PG_UNROLL for (int r = 0; r < 16; r++) {
            const uint8_t *rp = blk + (int64_t)r * rb + 2;
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)rp);
            const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(rp + 34)) : _mm256_setzero_si256();
            const __m512i w = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1), x80);
            L[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
        }
        pg_q8a_reduce16(L, Iv);
        acc = pg_q8a_chain2(acc, offs, blk, 34, two, Iv, 128, s16, da, g);
    }
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_loadu_si512(pg_q8a_inv16), acc));
}

PG_VNNI static void pg_q8a_gemv_avx512_q5_0(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                            const int32_t *s16, float *out) {
    const __m512i offs = _mm512_mullo_epi32(_mm512_loadu_si512(pg_q8a_perm16), _mm512_set1_epi32((int)rb));
    const __m512i m4 = _mm512_set1_epi8(15), b16 = _mm512_set1_epi8(16);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                         0x0004000400040004LL, 0x0004000400040004LL);
    const int G = K / 32;
    __m512 acc = _mm512_setzero_ps();
    for (int g = 0; g < G; g += 2) {
        const int two = g + 1 < G;
        const uint8_t *blk = W + (int64_t)g * 22;
        pg_q8a_prefetch(W, rb, 16, (int64_t)g * 22, 44);
        const __m512i a = pg_q8a_act2(qa, g, two);
        __m512i L[16], Iv[2];
        PG_UNROLL for (int r = 0; r < 16; r++) {
            /* the two blocks' quants as 64 bytes in k order: qs of block g in 128-bit lanes 0-1
             * and of g + 1 in lanes 2-3, shifted right by 0 / 4 and masked (low / high
             * nibbles), then bit i of the two qh words (a 64-bit mask) adds 16 to byte i. A
             * last odd group reads block g twice: its activations are zero. */
            const uint8_t *rp = blk + (int64_t)r * rb, *rq = two ? rp + 22 : rp;
            __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(rp + 6)));
            w = _mm512_mask_broadcast_i32x4(w, 0xFF00, _mm_loadu_si128((const __m128i *)(rq + 6)));
            w = _mm512_and_si512(_mm512_srlv_epi16(w, sh), m4);
            uint32_t h0, h1;
            memcpy(&h0, rp + 2, 4);
            memcpy(&h1, rq + 2, 4);
            w = _mm512_mask_add_epi8(w, _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32), w, b16);
            L[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
        }
        pg_q8a_reduce16(L, Iv);
        acc = pg_q8a_chain2(acc, offs, blk, 22, two, Iv, 16, s16, da, g);
    }
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_loadu_si512(pg_q8a_inv16), acc));
}

/* ---- GEMV, AVX2: 8 rows ---- */
#define PG_YSH(a, b, i) _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), i))
#define PG_YC1(a, b) _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31))
#define PG_YC2(a, b) _mm256_add_epi32(PG_YSH(a, b, 0x44), PG_YSH(a, b, 0xEE))
#define PG_YC3(a, b) _mm256_add_epi32(PG_YSH(a, b, 0x88), PG_YSH(a, b, 0xDD))
static const int pg_q8a_perm8[8] = {0, 2, 4, 6, 1, 3, 5, 7};
static const int pg_q8a_inv8[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* u8 x s8 -> 8 int32 sums of 4 (vpmaddubsw pairs are exact: at most 2 * 63 * 127 here) */
PG_AVX2_INLINE __m256i pg_q8a_dot_y(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* 8 vectors of 8 per-row partials -> lanes p = row perm8[p] */
PG_AVX2_INLINE __m256i pg_q8a_reduce8(__m256i *v) {
    PG_UNROLL for (int q = 0; q < 4; q++) v[q] = PG_YC1(v[2 * q], v[2 * q + 1]);
    PG_UNROLL for (int q = 0; q < 2; q++) v[q] = PG_YC2(v[2 * q], v[2 * q + 1]);
    return PG_YC3(v[0], v[1]);
}
/* fp16 in the low half of each int32 lane -> 8 floats */
PG_AVX2_INLINE __m256 pg_q8a_h2f_y(__m256i D) {
    const __m256i lo = _mm256_and_si256(D, _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
}

PG_AVX2 static void pg_q8a_gemv_avx2_q4k(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                      const int32_t *s16, float *out) {
    const __m256i offs = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)pg_q8a_perm8), _mm256_set1_epi32((int)rb));
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = W + (int64_t)b * 144;
        pg_q8a_prefetch(W, rb, 8, (int64_t)b * 144, 144);
        const __m256i D = _mm256_i32gather_epi32((const int *)blk, offs, 1);
        const __m256i Q0 = _mm256_i32gather_epi32((const int *)(blk + 4), offs, 1);
        const __m256i Q1 = _mm256_i32gather_epi32((const int *)(blk + 8), offs, 1);
        const __m256i Q2 = _mm256_i32gather_epi32((const int *)(blk + 12), offs, 1);
        const __m256 d = pg_q8a_h2f_y(D);
        const __m256 ndm = _mm256_sub_ps(_mm256_setzero_ps(), pg_q8a_h2f_y(_mm256_srli_epi32(D, 16)));
        __m256 sw[8], mw[8];
        PG_Q8A_K4_SCALES(_mm256, si256, __m256i, Q0, Q1, Q2, d, ndm, sw, mw);
        const int8_t *a = qa + b * 256;
        PG_UNROLL for (int j = 0; j < 4; j++) {
            const __m256i alo = _mm256_loadu_si256((const __m256i *)(a + 64 * j));
            const __m256i ahi = _mm256_loadu_si256((const __m256i *)(a + 64 * j + 32));
            __m256i L[8], H[8];
            PG_UNROLL for (int r = 0; r < 8; r++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j + (int64_t)r * rb));
                L[r] = pg_q8a_dot_y(_mm256_and_si256(w, m4), alo);
                H[r] = pg_q8a_dot_y(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), ahi);
            }
            const __m256i IL = pg_q8a_reduce8(L), IH = pg_q8a_reduce8(H);
            PG_UNROLL for (int t = 0; t < 2; t++) {
                const int g = b * 8 + 2 * j + t;
                const __m256 dav = _mm256_set1_ps(da[g]);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(sw[2 * j + t], dav), _mm256_cvtepi32_ps(t ? IH : IL), acc);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(mw[2 * j + t], dav), _mm256_set1_ps((float)(s16[2 * g] + s16[2 * g + 1])), acc);
            }
        }
    }
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(acc, _mm256_loadu_si256((const __m256i *)pg_q8a_inv8)));
}

PG_AVX2 static void pg_q8a_gemv_avx2_q6k(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                      const int32_t *s16, float *out) {
    const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = W + (int64_t)b * 210;
        pg_q8a_prefetch(W, rb, 8, (int64_t)b * 210, 210);
        const __m256 d = pg_q8a_h2f_y(_mm256_srli_epi32(_mm256_i32gather_epi32((const int *)(blk + 206), offs, 1), 16));
        __m256i Sc[4];
        PG_UNROLL for (int i = 0; i < 4; i++) Sc[i] = _mm256_i32gather_epi32((const int *)(blk + 192 + 4 * i), offs, 1);
        __m256 sw[16];
        PG_UNROLL for (int i = 0; i < 16; i++)
            sw[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(Sc[i / 4], 24 - 8 * (i % 4)), 24)));
        PG_UNROLL for (int h = 0; h < 2; h++) {
            const int8_t *a = qa + b * 256 + 128 * h;
            __m256i av[4];
            PG_UNROLL for (int i = 0; i < 4; i++) av[i] = _mm256_loadu_si256((const __m256i *)(a + 32 * i));
            __m256i P[4][8];
            PG_UNROLL for (int r = 0; r < 8; r++) {
                const uint8_t *rp = blk + (int64_t)r * rb;
                const __m256i A = _mm256_loadu_si256((const __m256i *)(rp + 64 * h));
                const __m256i B = _mm256_loadu_si256((const __m256i *)(rp + 64 * h + 32));
                const __m256i Hh = _mm256_loadu_si256((const __m256i *)(rp + 128 + 32 * h));
                const __m256i y0 = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(Hh, 4), m30));
                const __m256i y1 = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(Hh, 2), m30));
                const __m256i y2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(Hh, m30));
                const __m256i y3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                                   _mm256_and_si256(_mm256_srli_epi16(Hh, 2), m30));
                P[0][r] = pg_q8a_dot_y(y0, av[0]);
                P[1][r] = pg_q8a_dot_y(y1, av[1]);
                P[2][r] = pg_q8a_dot_y(y2, av[2]);
                P[3][r] = pg_q8a_dot_y(y3, av[3]);
            }
            PG_UNROLL for (int yi = 0; yi < 4; yi++) {
                __m256i *Q = P[yi];
                PG_UNROLL for (int q = 0; q < 4; q++) Q[q] = PG_YC2(Q[2 * q], Q[2 * q + 1]);
                PG_UNROLL for (int q = 0; q < 2; q++) Q[q] = PG_YC3(Q[2 * q], Q[2 * q + 1]);
                const __m256i G[2] = {_mm256_permute2x128_si256(Q[0], Q[1], 0x20), _mm256_permute2x128_si256(Q[0], Q[1], 0x31)};
                PG_UNROLL for (int k = 0; k < 2; k++) {
                    const int j = 8 * h + 2 * yi + k, g16 = b * 16 + j;
                    const __m256i Iv = _mm256_sub_epi32(G[k], _mm256_set1_epi32(32 * s16[g16]));
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(sw[j], _mm256_set1_ps(da[g16 >> 1])), _mm256_cvtepi32_ps(Iv), acc);
                }
            }
        }
    }
    _mm256_storeu_ps(out, acc);
}

PG_AVX2 static void pg_q8a_gemv_avx2_q8_0(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                       const int32_t *s16, float *out) {
    (void)s16;
    const __m256i offs = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)pg_q8a_perm8), _mm256_set1_epi32((int)rb));
    __m256 acc = _mm256_setzero_ps();
    for (int g = 0; g < K / 32; g++) {
        const uint8_t *blk = W + (int64_t)g * 34;
        pg_q8a_prefetch(W, rb, 8, (int64_t)g * 34, 34);
        const __m256i a = _mm256_loadu_si256((const __m256i *)(qa + 32 * g));
        __m256i L[8];
        PG_UNROLL for (int r = 0; r < 8; r++) {
            /* signed q: |q| x (qa with q's sign), llama.cpp's trick; pairs stay under 2^15 */
            const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + (int64_t)r * rb + 2));
            L[r] = pg_q8a_dot_y(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
        }
        const __m256i Iv = pg_q8a_reduce8(L);
        const __m256 d = pg_q8a_h2f_y(_mm256_i32gather_epi32((const int *)blk, offs, 1));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(da[g])), _mm256_cvtepi32_ps(Iv), acc);
    }
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(acc, _mm256_loadu_si256((const __m256i *)pg_q8a_inv8)));
}
PG_AVX2 static void pg_q8a_gemv_avx2_q5_0(const uint8_t *W, int64_t rb, int K, const int8_t *qa, const float *da,
                                          const int32_t *s16, float *out) {
    const __m256i offs = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)pg_q8a_perm8), _mm256_set1_epi32((int)rb));
    __m256 acc = _mm256_setzero_ps();
    for (int g = 0; g < K / 32; g++) {
        const uint8_t *blk = W + (int64_t)g * 22;
        pg_q8a_prefetch(W, rb, 8, (int64_t)g * 22, 22);
        const __m256i a = _mm256_loadu_si256((const __m256i *)(qa + 32 * g));
        __m256i L[8];
        PG_UNROLL for (int r = 0; r < 8; r++) L[r] = pg_q8a_dot_y(pg_q8a_q5_0_bytes_avx2(blk + (int64_t)r * rb), a);
        const __m256i Ic = _mm256_sub_epi32(pg_q8a_reduce8(L), _mm256_set1_epi32(16 * (s16[2 * g] + s16[2 * g + 1])));
        const __m256 d = pg_q8a_h2f_y(_mm256_i32gather_epi32((const int *)blk, offs, 1));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(da[g])), _mm256_cvtepi32_ps(Ic), acc);
    }
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(acc, _mm256_loadu_si256((const __m256i *)pg_q8a_inv8)));
}
#endif /* PG_HAVE_SIMD */

#include "pagedcy_gemm_q8p.h"

/* Rows [0, M) of C, columns [n0, n1): the GEMV path, row blocks of 16 / 8 of W as the file
 * stores them, each block against every row of A (it is in L1/L2 for the rows after the
 * first); row tails, and every row at the scalar level, in plain C. */
static void pg_q8a_gemv(int level, int F, const pg_q8a_fmt *fm, int M, int n0, int n1, const pg_q8a *a,
                        const uint8_t *W, int64_t wrb, float *C, int64_t ldc) {
    const int K = a->K;
    int n = n0;
#if PG_HAVE_SIMD
    typedef void (*gemv_fn)(const uint8_t *, int64_t, int, const int8_t *, const float *, const int32_t *, float *);
    gemv_fn f = NULL;
    switch (level * 256 + F) {
        case 2 * 256 + PQ_Q4_K: f = pg_q8a_gemv_avx512_q4k; break;
        case 2 * 256 + PQ_Q6_K: f = pg_q8a_gemv_avx512_q6k; break;
        case 2 * 256 + PQ_Q5_0: f = pg_q8a_gemv_avx512_q5_0; break;
        case 2 * 256 + PQ_Q8_0: f = pg_q8a_gemv_avx512_q8_0; break;
        case 256 + PQ_Q4_K: f = pg_q8a_gemv_avx2_q4k; break;
        case 256 + PQ_Q6_K: f = pg_q8a_gemv_avx2_q6k; break;
        case 256 + PQ_Q5_0: f = pg_q8a_gemv_avx2_q5_0; break;
        case 256 + PQ_Q8_0: f = pg_q8a_gemv_avx2_q8_0; break;
        default: break;
    }
    const int rows = level == 2 ? 16 : 8;
    for (; f && n + rows <= n1; n += rows)
        for (int m = 0; m < M; m++)
            f(W + (int64_t)n * wrb, wrb, K, a->qa + (int64_t)m * K, a->da + (int64_t)m * (K / 32),
              a->s16 + (int64_t)m * (K / 16), C + (int64_t)m * ldc + n);
#else
    (void)level;
#endif
    for (; n < n1; n++)
        for (int m = 0; m < M; m++)
            C[(int64_t)m * ldc + n] = pg_q8a_dot_scalar(fm, W + (int64_t)n * wrb, K, a->qa + (int64_t)m * K,
                                                        a->da + (int64_t)m * (K / 32), a->s16 + (int64_t)m * (K / 16));
}

/* Columns [n0, n1) of C[M, N] = A @ W^T for a GGUF block weight of type F (row n at W + n *
 * w_row_bytes) and activations a quantized by pg_q8a_quantize, on the calling thread. simd:
 * a PAGEDCY_SIMD_* cap (AVX-512 needs the CPU's VNNI; without it the AVX2 kernels run). The
 * bits depend on nothing but the inputs (see the top). Returns 0; -1 out of memory; -3 for
 * a type without these kernels or a K that is not a multiple of its block. */
static int pagedcy_gemm_q8a(int simd, int F, int M, int n0, int n1, const pg_q8a *a, const void *W,
                            int64_t w_row_bytes, float *C, int64_t ldc) {
    const pg_q8a_fmt *f = pg_q8a_format(F);
    if (!f || a->K % f->block) return -3;
    if (M <= 0 || n1 <= n0) return 0;
    int level = 0;
#if PG_HAVE_SIMD
    if (simd >= PAGEDCY_SIMD_AVX512 && pagedcy_cpu_has_avx512vnni()) level = 2;
    else if (simd >= PAGEDCY_SIMD_AVX2 && pagedcy_cpu_has_avx2_fma()) level = 1;
    if (level && M >= PG_Q8A_TILE_M) {
        const pg_q8a_src src = {f, F, (const uint8_t *)W, w_row_bytes, NULL, 0};
        return pg_q8a_tiled(level, &src, M, n0, n1, a, C, ldc);
    }
#else
    (void)simd;
#endif
    pg_q8a_gemv(level, F, f, M, n0, n1, a, (const uint8_t *)W, w_row_bytes, C, ldc);
    return 0;
}

#endif
