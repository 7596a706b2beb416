/* The streaming tiles of pagedcy_gemm.h for GGUF block formats (Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): the weight is decoded in registers as
 * it streams, instead of into an L1 scratch first. A decode-step GEMV is bound
 * by the bytes it reads, and a block format reads 1.06 (Q8_0) to 0.56 (Q4_K)
 * bytes a weight; decoding to scratch and reading it back cost a store and a
 * load per weight on top, which kept these formats at a quarter of the read
 * bandwidth.
 *
 * Same values, same order: a block is split into groups of 32 elements; each
 * group's quants become two 16-byte vectors of integers q and a scale s (and
 * an offset m), widened to float32 as s * q (signed q: Q8_0, Q4_0 / Q5_0 /
 * Q6_K with their offset subtracted in the byte domain, exactly) or
 * fma(s, q, m) (Q4_1 / Q5_1: + m; the K-quants: - dmin * min). Every product
 * here is exact in float32 (pagedcy_quant.h says why), so these are the bits of
 * the format's decoder, fused or not. The tile then runs the FMAs of
 * pg_tile_z / pg_tile_y: each output's lanes take k = lane, lane + L, ... in
 * order from +0, reduced by pg_hsum8x8 at the end of the K block; so a row of
 * C is bit for bit what the decode-to-scratch and packed paths give.
 *
 * One tile per instruction set, the format a compile-time constant F (its GGML
 * type number) of small always-inline helpers; the byte twiddling (SSE, 16
 * bytes at a time) is shared by both widths. Included by pagedcy_gemm.h in its
 * SIMD section.
 */
#ifndef PAGEDCY_GEMM_QTILE_H
#define PAGEDCY_GEMM_QTILE_H

#include "pagedcy_quant.h"

/* GGML types the tiles decode in registers (pagedcy_quant.h's PQ_* numbers). */
static inline int pg_qtile_type(int t) {
    return t == PQ_Q8_0 || t == PQ_Q4_0 || t == PQ_Q4_1 || t == PQ_Q5_0 || t == PQ_Q5_1 || t == PQ_Q4_K
        || t == PQ_Q5_K || t == PQ_Q6_K;
}
static inline int pg_q_qk(int F) { return F == PQ_Q4_K || F == PQ_Q5_K || F == PQ_Q6_K ? 256 : 32; }
static inline int pg_q_bytes(int F) {
    switch (F) {
        case PQ_Q4_0: return 18; case PQ_Q4_1: return 20; case PQ_Q5_0: return 22;
        case PQ_Q5_1: return 24; case PQ_Q8_0: return 34; case PQ_Q4_K: return 144;
        case PQ_Q5_K: return 176; default: return 210;
    }
}
/* Signed quants (w = s * q) or affine ones (w = fma(s, q, m)). */
static inline int pg_q_signed(int F) { return F == PQ_Q8_0 || F == PQ_Q4_0 || F == PQ_Q5_0 || F == PQ_Q6_K; }

/* A K-quant block's per-row constants: Q4_K / Q5_K the scale s[g] and offset m[g] of each
 * 32 elements, Q6_K the scale s[i] of each 16. */
typedef struct { float s[16]; float m[8]; } pg_qhdr;

/* pq_scale_min_k4 in one vector, no store-to-load round trip (four 4-byte stores read back as
 * one 16-byte load stall store forwarding): bytes 0-7 the 6-bit scales, 8-15 the mins of the
 * 12 bytes at s (16 are read: the block goes on past them). */
PG_AVX2_INLINE __m128i pg_q_scale_min_k4(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3F));            /* sc_lo | mn_lo */
    /* bits 6-7 of bytes 0-7 to bits 4-5 (a 16-bit shift: the mask drops what crosses bytes) */
    const __m128i top = _mm_and_si128(_mm_srli_epi16(v, 2), _mm_set1_epi8(0x30));
    const __m128i w2 = _mm_shuffle_epi8(v, _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m128i nib = _mm_and_si128(_mm_blend_epi16(w2, _mm_srli_epi16(w2, 4), 0x0C), _mm_set1_epi8(0x0F));
    return _mm_unpacklo_epi32(lo, _mm_or_si128(nib, top));              /* sc_lo sc_hi mn_lo mn_hi */
}

/* An fp16 value at p, broadcast (F16C: exact, as pq_half; a signalling NaN comes out quiet,
 * as the first arithmetic on pq_half's would make it). */
PG_AVX2_INLINE __m256 pg_q_half_y(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)v));
}

PG_AVX2_INLINE void pg_q_header(const int F, const uint8_t *b, pg_qhdr *h) {
    if (F == PQ_Q4_K || F == PQ_Q5_K) {
        const __m128i v = pg_q_scale_min_k4(b + 4);
        /* d * sc and dmin * mn are exact; d * q - dmin * mn == fma(d, q, -(dmin * mn)) */
        _mm256_storeu_ps(h->s, _mm256_mul_ps(pg_q_half_y(b), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))));
        const __m256 mn = _mm256_mul_ps(pg_q_half_y(b + 2),
                                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
        _mm256_storeu_ps(h->m, _mm256_xor_ps(mn, _mm256_set1_ps(-0.0f)));
    } else if (F == PQ_Q6_K) {
        const __m256 d = pg_q_half_y(b + 208);
        const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
        _mm256_storeu_ps(h->s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(h->s + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    }
}

PG_AVX2_INLINE __m128i pg_q_lo4(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
PG_AVX2_INLINE __m128i pg_q_hi4(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)); }
PG_AVX2_INLINE __m128i pg_q_ld(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
/* Bit j of bits (j < 16) as byte j: 16 where set, 0 elsewhere (Q5_0 / Q5_1's fifth bits). */
PG_AVX2_INLINE __m128i pg_q_bits16(uint32_t bits) {
    const __m128i v = _mm_shuffle_epi8(_mm_set1_epi16((short)(bits & 0xFFFFu)),
                                       _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, sel), sel), _mm_set1_epi8(16));
}

/* Group g (elements 32 g .. 32 g + 31) of block b: quants q0 (the first 16) and q1, their
 * scales s0 and s1, the offset m (affine formats). */
PG_AVX2_INLINE void pg_q_group(const int F, const uint8_t *b, const pg_qhdr *h, int g, __m128i *q0,
                               __m128i *q1, float *s0, float *s1, float *m) {
    if (F == PQ_Q8_0) {
        *s0 = *s1 = pq_half(b);
        *q0 = pg_q_ld(b + 2);
        *q1 = pg_q_ld(b + 18);
    } else if (F == PQ_Q4_0) {
        *s0 = *s1 = pq_half(b);
        const __m128i q = pg_q_ld(b + 2), eight = _mm_set1_epi8(8);
        *q0 = _mm_sub_epi8(pg_q_lo4(q), eight);
        *q1 = _mm_sub_epi8(pg_q_hi4(q), eight);
    } else if (F == PQ_Q5_0) {
        *s0 = *s1 = pq_half(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const __m128i q = pg_q_ld(b + 6), sixteen = _mm_set1_epi8(16);
        *q0 = _mm_sub_epi8(_mm_or_si128(pg_q_lo4(q), pg_q_bits16(qh)), sixteen);
        *q1 = _mm_sub_epi8(_mm_or_si128(pg_q_hi4(q), pg_q_bits16(qh >> 16)), sixteen);
    } else if (F == PQ_Q4_1) {
        *s0 = *s1 = pq_half(b);
        *m = pq_half(b + 2);
        const __m128i q = pg_q_ld(b + 4);
        *q0 = pg_q_lo4(q);
        *q1 = pg_q_hi4(q);
    } else if (F == PQ_Q5_1) {
        *s0 = *s1 = pq_half(b);
        *m = pq_half(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const __m128i q = pg_q_ld(b + 8);
        *q0 = _mm_or_si128(pg_q_lo4(q), pg_q_bits16(qh));
        *q1 = _mm_or_si128(pg_q_hi4(q), pg_q_bits16(qh >> 16));
    } else if (F == PQ_Q4_K || F == PQ_Q5_K) {
        /* sub-block g: the low (even g) or high nibbles of bytes 32 (g / 2) .. + 31 */
        const uint8_t *q = b + (F == PQ_Q4_K ? 16 : 48) + 32 * (g >> 1);
        const __m128i a = pg_q_ld(q), c = pg_q_ld(q + 16);
        *q0 = g & 1 ? pg_q_hi4(a) : pg_q_lo4(a);
        *q1 = g & 1 ? pg_q_hi4(c) : pg_q_lo4(c);
        if (F == PQ_Q5_K) {          /* bit g of qh[j] is the fifth bit of element 32 g + j */
            const __m128i bit = _mm_set1_epi8((char)(1 << g)), sixteen = _mm_set1_epi8(16);
            const __m128i h0 = pg_q_ld(b + 16), h1 = pg_q_ld(b + 32);
            *q0 = _mm_or_si128(*q0, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h0, bit), bit), sixteen));
            *q1 = _mm_or_si128(*q1, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h1, bit), bit), sixteen));
        }
        *s0 = *s1 = h->s[g];
        *m = h->m[g];
    } else {                         /* Q6_K: half hh, quarter sq (pq_blk_q6_k's layout) */
        const int hh = g >> 2, sq = g & 3;
        /* all 32 bytes at once: bits 2 sq, 2 sq + 1 of each qh byte straight to bits 4-5 (the
         * 16-bit shifts move bits across bytes only outside the mask) */
        const __m256i l = _mm256_loadu_si256((const __m256i *)(b + 64 * hh + 32 * (sq & 1)));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hh));
        const __m256i hs = sq == 0 ? _mm256_slli_epi16(hb, 4) : sq == 1 ? _mm256_slli_epi16(hb, 2)
                         : sq == 2 ? hb : _mm256_srli_epi16(hb, 2);
        const __m256i lo = _mm256_and_si256(sq >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(0x0F));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hs, _mm256_set1_epi8(0x30))),
                                          _mm256_set1_epi8(32));
        *q0 = _mm256_castsi256_si128(q);
        *q1 = _mm256_extracti128_si256(q, 1);
        *s0 = h->s[2 * g];
        *s1 = h->s[2 * g + 1];
    }
}

/* pg_q_half_y, 16 lanes. */
PG_AVX512_INLINE __m512 pg_q_half_z(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)v));
}

/* Group g of block b as two vectors of 16 weights, AVX-512 (Q4_K / Q5_K: pg_q_pair_z, two
 * groups at a time). The 4- and 5-bit formats look
 * their weights up in a table of the 16 (or 32) values a quant can take, made by the
 * decoder's own operation (d * (q - 8), fma(d, q, m), ...) on q = 0 .. 15: one lookup
 * (vpermps reads only the index's low 4 bits, so a byte's other nibble needs no mask)
 * instead of a convert and a multiply per vector; a fifth bit picks the second table
 * through a mask register. Q8_0 and Q6_K (256 / 64 values) convert and multiply. */
PG_AVX512_INLINE void pg_q_group_z(const int F, const uint8_t *b, const pg_qhdr *h, int g, __m512 *w0,
                                   __m512 *w1) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if (F == PQ_Q8_0) {
        const __m512 d = pg_q_half_z(b);
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(pg_q_ld(b + 2))), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(pg_q_ld(b + 18))), d);
    } else if (F == PQ_Q4_0 || F == PQ_Q4_1) {
        const __m512 d = pg_q_half_z(b);
        const __m512 t = F == PQ_Q4_0 ? _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)))
                                      : _mm512_fmadd_ps(d, iota, pg_q_half_z(b + 2));
        const __m512i q = _mm512_cvtepu8_epi32(pg_q_ld(b + (F == PQ_Q4_0 ? 2 : 4)));
        *w0 = _mm512_permutexvar_ps(q, t);
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), t);
    } else if (F == PQ_Q5_0 || F == PQ_Q5_1) {
        const __m512 d = pg_q_half_z(b);
        __m512 t0, t1;               /* quants 0 .. 15 and 16 .. 31 */
        if (F == PQ_Q5_0) {
            t0 = _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(16.0f)));
            t1 = _mm512_mul_ps(d, iota);
        } else {
            const __m512 m = pg_q_half_z(b + 2);
            t0 = _mm512_fmadd_ps(d, iota, m);
            t1 = _mm512_fmadd_ps(d, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), m);
        }
        const __m512i q = _mm512_cvtepu8_epi32(pg_q_ld(b + (F == PQ_Q5_0 ? 6 : 8)));
        const __m512i qhi = _mm512_srli_epi32(q, 4);
        /* the fifth bits straight into mask registers (a load, not a move from a GPR) */
        const uint8_t *qh = b + (F == PQ_Q5_0 ? 2 : 4);
        *w0 = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(q, t0), _load_mask16((const __mmask16 *)qh), q, t1);
        *w1 = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(qhi, t0), _load_mask16((const __mmask16 *)(qh + 2)),
                                         qhi, t1);
    } else {                         /* Q6_K: pg_q_group's bit twiddling on all 32 bytes at once */
        const int hh = g >> 2, sq = g & 3;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(b + 64 * hh + 32 * (sq & 1)));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hh));
        /* bits 2 sq, 2 sq + 1 of each byte straight to bits 4-5 (16-bit shifts: the mask drops
         * what crosses a byte), then (lo & 0x0F) | hi in one ternary-logic op */
        const __m256i hs = sq == 0 ? _mm256_slli_epi16(hb, 4) : sq == 1 ? _mm256_slli_epi16(hb, 2)
                         : sq == 2 ? hb : _mm256_srli_epi16(hb, 2);
        const __m256i hi = _mm256_and_si256(hs, _mm256_set1_epi8(0x30));
        const __m256i q = _mm256_sub_epi8(_mm256_ternarylogic_epi32(sq >> 1 ? _mm256_srli_epi16(l, 4) : l, hi,
                                                                    _mm256_set1_epi8(0x0F), 0xEC),  /* (A & C) | B */
                                          _mm256_set1_epi8(32));
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))),
                            _mm512_set1_ps(h->s[2 * g]));
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))),
                            _mm512_set1_ps(h->s[2 * g + 1]));
    }
}

/* Q4_K / Q5_K groups g and g + 1 (g even) at once: they are the low and high nibbles of the
 * same 32 bytes, so each byte is widened once for both (pg_q_group_z's lookups and fifth
 * bits, the same values). */
PG_AVX512_INLINE void pg_q_pair_z(const int F, const uint8_t *b, const pg_qhdr *h, int g, __m512 w[4]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t *q = b + (F == PQ_Q4_K ? 16 : 48) + 16 * g;
    const __m512i i0 = _mm512_cvtepu8_epi32(pg_q_ld(q)), i1 = _mm512_cvtepu8_epi32(pg_q_ld(q + 16));
    const __m512i j0 = _mm512_srli_epi32(i0, 4), j1 = _mm512_srli_epi32(i1, 4);
    const __m512 s0 = _mm512_set1_ps(h->s[g]), m0 = _mm512_set1_ps(h->m[g]);
    const __m512 s1 = _mm512_set1_ps(h->s[g + 1]), m1 = _mm512_set1_ps(h->m[g + 1]);
    const __m512 t0 = _mm512_fmadd_ps(s0, iota, m0), t1 = _mm512_fmadd_ps(s1, iota, m1);
    w[0] = _mm512_permutexvar_ps(i0, t0);
    w[1] = _mm512_permutexvar_ps(i1, t0);
    w[2] = _mm512_permutexvar_ps(j0, t1);
    w[3] = _mm512_permutexvar_ps(j1, t1);
    if (F == PQ_Q5_K) {              /* bit g of qh[j]: the fifth bit of element 32 g + j */
        const __m512 hi = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
        const __m512 u0 = _mm512_fmadd_ps(s0, hi, m0), u1 = _mm512_fmadd_ps(s1, hi, m1);
        const __m128i h0 = pg_q_ld(b + 16), h1 = pg_q_ld(b + 32);
        const __m128i bit0 = _mm_set1_epi8((char)(1 << g)), bit1 = _mm_set1_epi8((char)(2 << g));
        w[0] = _mm512_mask_permutexvar_ps(w[0], _mm_test_epi8_mask(h0, bit0), i0, u0);
        w[1] = _mm512_mask_permutexvar_ps(w[1], _mm_test_epi8_mask(h1, bit0), i1, u0);
        w[2] = _mm512_mask_permutexvar_ps(w[2], _mm_test_epi8_mask(h0, bit1), j0, u1);
        w[3] = _mm512_mask_permutexvar_ps(w[3], _mm_test_epi8_mask(h1, bit1), j1, u1);
    }
}

/* 8 quants (the low 8 bytes of q) -> 8 weights, AVX2. */
PG_AVX2_INLINE __m256 pg_q_widen_y(const int F, __m128i q, float s, float m) {
    if (pg_q_signed(F)) return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(s));
    return _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), _mm256_set1_ps(m));
}

/* MR rows of A against NB rows of W (rows past nb repeat row nb - 1: computed, not stored)
 * over nblk blocks of format F; A at the K block's first element, W at its first block.
 * Groups outer, rows of W inner: the NB accumulator chains interleave. */
PG_AVX512_INLINE void pg_qtile_z(int nblk, int nb, const float *A, int64_t lda, const uint8_t *W,
                                 int64_t wrb, float *C, int64_t ldc, const char *pf, int64_t pf_step,
                                 int first, const int F, const int MR, const int NB) {
    const int QK = pg_q_qk(F), BYTES = pg_q_bytes(F);
    const uint8_t *row[8];
    PG_UNROLL
    for (int j = 0; j < NB; j++) row[j] = W + (int64_t)(j < nb ? j : nb - 1) * wrb;
    __m512 c[3][8];
    PG_UNROLL
    for (int i = 0; i < MR; i++)
        PG_UNROLL
        for (int j = 0; j < NB; j++) c[i][j] = _mm512_setzero_ps();
    for (int bk = 0; bk < nblk; bk++) {
        pg_prefetch(&pf, pf_step);
        pg_qhdr h[8];
        if (QK == 256) {
            PG_UNROLL
            for (int j = 0; j < NB; j++) pg_q_header(F, row[j] + (int64_t)bk * BYTES, &h[j]);
        }
        if (F == PQ_Q4_K || F == PQ_Q5_K) {   /* two groups a step: same accumulators, same order */
            for (int g = 0; g < 8; g += 2) {
                const float *a = A + (int64_t)bk * 256 + 32 * g;
                PG_UNROLL
                for (int j = 0; j < NB; j++) {
                    __m512 w[4];
                    pg_q_pair_z(F, row[j] + (int64_t)bk * BYTES, &h[j], g, w);
                    PG_UNROLL
                    for (int u = 0; u < 4; u++)
                        PG_UNROLL
                        for (int i = 0; i < MR; i++)
                            c[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i * lda + 16 * u), w[u], c[i][j]);
                }
            }
            continue;
        }
        for (int g = 0; g < QK / 32; g++) {
            const float *a = A + (int64_t)bk * QK + 32 * g;
            PG_UNROLL
            for (int j = 0; j < NB; j++) {
                __m512 w0, w1;
                pg_q_group_z(F, row[j] + (int64_t)bk * BYTES, &h[j], g, &w0, &w1);
                PG_UNROLL
                for (int i = 0; i < MR; i++) {
                    c[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i * lda), w0, c[i][j]);
                    c[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i * lda + 16), w1, c[i][j]);
                }
            }
        }
    }
    PG_UNROLL
    for (int i = 0; i < MR; i++) {
        __m256 hs[8];
        PG_UNROLL
        for (int j = 0; j < 8; j++)
            hs[j] = j < NB ? _mm256_add_ps(_mm512_castps512_ps256(c[i][j]), _mm512_extractf32x8_ps(c[i][j], 1))
                           : _mm256_setzero_ps();
        pg_store_sum(C + i * ldc, pg_hsum8x8(hs), first, nb);
    }
}

PG_AVX2_INLINE void pg_qtile_y(int nblk, int nb, const float *A, int64_t lda, const uint8_t *W,
                               int64_t wrb, float *C, int64_t ldc, const char *pf, int64_t pf_step,
                               int first, const int F, const int MR, const int NB) {
    const int QK = pg_q_qk(F), BYTES = pg_q_bytes(F);
    const uint8_t *row[8];
    PG_UNROLL
    for (int j = 0; j < NB; j++) row[j] = W + (int64_t)(j < nb ? j : nb - 1) * wrb;
    __m256 c[3][8];
    PG_UNROLL
    for (int i = 0; i < MR; i++)
        PG_UNROLL
        for (int j = 0; j < NB; j++) c[i][j] = _mm256_setzero_ps();
    for (int bk = 0; bk < nblk; bk++) {
        pg_prefetch(&pf, pf_step);
        pg_qhdr h[8];
        if (QK == 256) {
            PG_UNROLL
            for (int j = 0; j < NB; j++) pg_q_header(F, row[j] + (int64_t)bk * BYTES, &h[j]);
        }
        for (int g = 0; g < QK / 32; g++) {
            const float *a = A + (int64_t)bk * QK + 32 * g;
            PG_UNROLL
            for (int j = 0; j < NB; j++) {
                __m128i q0, q1;
                float s0, s1, m = 0.0f;
                pg_q_group(F, row[j] + (int64_t)bk * BYTES, &h[j], g, &q0, &q1, &s0, &s1, &m);
                const __m256 w[4] = {pg_q_widen_y(F, q0, s0, m), pg_q_widen_y(F, _mm_unpackhi_epi64(q0, q0), s0, m),
                                     pg_q_widen_y(F, q1, s1, m), pg_q_widen_y(F, _mm_unpackhi_epi64(q1, q1), s1, m)};
                PG_UNROLL
                for (int u = 0; u < 4; u++)
                    PG_UNROLL
                    for (int i = 0; i < MR; i++)
                        c[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i * lda + 8 * u), w[u], c[i][j]);
            }
        }
    }
    PG_UNROLL
    for (int i = 0; i < MR; i++) {
        __m256 hs[8];
        PG_UNROLL
        for (int j = 0; j < 8; j++) hs[j] = j < NB ? c[i][j] : _mm256_setzero_ps();
        pg_store_sum(C + i * ldc, pg_hsum8x8(hs), first, nb);
    }
}

/* Register-decode tiles: AVX-512 with NB = 8 for MR = 1 .. 3; AVX2 with NB = 8 for one row
 * of A, NB = 4 for MR = 1 .. 3 (16 registers). The tile shape moves no bits. */
#define PG_QZ_CASE(F_, MR_) \
    case (F_) * 16 + (MR_): pg_qtile_z(nblk, nb, A, lda, W, wrb, C, ldc, pf, pf_step, first, F_, MR_, 8); break;
#define PG_QZ_FMT(F_) PG_QZ_CASE(F_, 1) PG_QZ_CASE(F_, 2) PG_QZ_CASE(F_, 3)
PG_AVX512 static void pg_qtile_avx512(int F, int mr, int nblk, int nb, const float *A, int64_t lda,
                                      const uint8_t *W, int64_t wrb, float *C, int64_t ldc, const char *pf,
                                      int64_t pf_step, int first) {
    switch (F * 16 + mr) {
        PG_QZ_FMT(PQ_Q8_0) PG_QZ_FMT(PQ_Q4_0) PG_QZ_FMT(PQ_Q4_1) PG_QZ_FMT(PQ_Q5_0)
        PG_QZ_FMT(PQ_Q5_1) PG_QZ_FMT(PQ_Q4_K) PG_QZ_FMT(PQ_Q5_K) PG_QZ_FMT(PQ_Q6_K)
        default: break;
    }
}

#define PG_QY_CASE(F_, MR_, NB_) \
    case (F_) * 256 + (MR_) * 16 + (NB_): pg_qtile_y(nblk, nb, A, lda, W, wrb, C, ldc, pf, pf_step, first, F_, MR_, NB_); break;
#define PG_QY_FMT(F_) PG_QY_CASE(F_, 1, 8) PG_QY_CASE(F_, 1, 4) PG_QY_CASE(F_, 2, 4) PG_QY_CASE(F_, 3, 4)
PG_AVX2 static void pg_qtile_avx2(int F, int mr, int nbmax, int nblk, int nb, const float *A, int64_t lda,
                                  const uint8_t *W, int64_t wrb, float *C, int64_t ldc, const char *pf,
                                  int64_t pf_step, int first) {
    switch (F * 256 + mr * 16 + nbmax) {
        PG_QY_FMT(PQ_Q8_0) PG_QY_FMT(PQ_Q4_0) PG_QY_FMT(PQ_Q4_1) PG_QY_FMT(PQ_Q5_0)
        PG_QY_FMT(PQ_Q5_1) PG_QY_FMT(PQ_Q4_K) PG_QY_FMT(PQ_Q5_K) PG_QY_FMT(PQ_Q6_K)
        default: break;
    }
}

#endif
