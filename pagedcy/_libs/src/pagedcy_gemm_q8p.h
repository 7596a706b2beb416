/* GGUF block weights repacked once, at load, into panels of 16 rows for the int8-activation
 * GEMM (pagedcy_gemm_q8a.h's definition: the same integer sums and float chain, so the same
 * bits as its scalar reference for any M, path, thread split or SIMD level).
 *
 * Why: read as the file stores it, a GEMV over 16 rows keeps one partial-sum vector per row
 * and transpose-reduces them for every group, and gathers each row's scales: about 3.7
 * vector ops per 32 weights, which on 2 cores left decode at ~60% of the read bandwidth
 * (llama-3.2-1b Q4_K_M, AMD EPYC Zen 4). In a panel the 16 rows sit in the 16 int32 lanes of
 * one vector: 4 consecutive k of every row are 64 bytes, one vpdpbusd (AVX-512 VNNI) or
 * vpmaddubsw + vpmaddwd (AVX2, two halves of 8 rows) against a broadcast of 4 activations
 * sums them for all 16 rows, and the group's sums are already lanes over rows (no reduction).
 * llama.cpp repacks its Q4_0 / Q4_K weights for the same reason (block_q4_Kx8).
 *
 * Layout (the same on every instruction set): weight [N, K] -> ceil(N / 16) panels of 16 rows
 * (rows past N are zero blocks), one after another; panel p is K / block records of 16 *
 * block_bytes bytes (the size of the 16 rows' blocks in the file), record b holding block b of
 * rows 16p .. 16p + 15. "Vector v" of a group of 32 k is 64 bytes: byte 4 l + i is row l's
 * quant at k = 4 v + i (v = 0..7). Nibble formats store vectors 2j and 2j + 1 as the low and
 * high nibbles of one 64-byte "pair" j. Per record:
 *   Q8_0 (544 B): d f16 [16] | 8 vectors of the signed quants
 *   Q4_0 (288 B): d f16 [16] | 4 pairs
 *   Q4_1 (320 B): d f16 [16] | m f16 [16] | 4 pairs
 *   Q5_0 (352 B): d f16 [16] | 4 pairs (quants & 15) | a vector H, bit v of byte i = bit 4 of
 *                 vector v's byte i
 *   Q5_1 (384 B): d f16 [16] | m f16 [16] | 4 pairs | H
 *   Q4_K (2304 B): 16 dwords of each row's block bytes 0-3 (d | dmin), 4-7, 8-11, 12-15 (the
 *                 packed 6-bit scales and mins, as stored) | per group g of 8: 4 pairs
 *   Q5_K (2816 B): as Q4_K, each group's 4 pairs followed by its H
 *   Q6_K (3360 B): d f16 [16] | scales int8 [16 groups of 16][16 rows] | per group g of 8
 *                 (32 k, two scale groups): 4 pairs (quants & 15) | 2 vectors H_h, bits
 *                 2t..2t+1 of byte i = bits 4-5 of vector 4h + t's byte i
 * A panel is 16 row_bytes: no bigger than the file's rows. Every field keeps the file's bits,
 * so a row comes back exactly (pg_q8p_row).
 */
/* Included by pagedcy_gemm_q8a.h (and, through this, it includes that first) */
#include <stdlib.h>
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>     /* pg_q8p_prefetch_enabled: GCC / clang only, as its use */
#endif
#include "pagedcy_gemm_q8a.h"
#ifndef PAGEDCY_GEMM_Q8P_H
#define PAGEDCY_GEMM_Q8P_H

/* What the formats share (F a constant wherever it is inlined) */
#define PG_Q8P_KQ(F) ((F) == PQ_Q4_K || (F) == PQ_Q5_K)    /* d | dmin, 12 bytes of 6-bit scales */
#define PG_Q8P_DM(F) ((F) == PQ_Q4_1 || (F) == PQ_Q5_1)    /* fp16 d and m a block */
#define PG_Q8P_MIN(F) (PG_Q8P_KQ(F) || PG_Q8P_DM(F))      /* w = sw * q + mw */
#define PG_Q8P_H1(F) ((F) == PQ_Q5_0 || (F) == PQ_Q5_1 || (F) == PQ_Q5_K)   /* a fifth-bit plane */
#define PG_Q8P_OFF(F) ((F) == PQ_Q4_0 ? 8 : (F) == PQ_Q5_0 ? 16 : (F) == PQ_Q6_K ? 32 : 0)

/* 32-element groups of a block, and where group gg's quants start in a record */
static inline int pg_q8p_groups(int F) { return PG_Q8P_KQ(F) || F == PQ_Q6_K ? 8 : 1; }
static inline int pg_q8p_gq(int F, int gg) {
    return F == PQ_Q4_K ? 256 + 256 * gg : F == PQ_Q5_K ? 256 + 320 * gg : F == PQ_Q6_K ? 288 + 384 * gg
           : PG_Q8P_DM(F) ? 64 : 32;
}

/* ---- repacking (plain C, once at load) and a row back as the file stores it ---- */

/* Record of block b of rows n .. n + 15 (rows at or past N: zero) from raw rows W. q: one
 * block of scratch bytes (its quants in k order), sw / mw: the unpacker's scale scratch. F is
 * a constant where it is inlined (pg_q8p_pack_panels), so the byte loops lose their branches. */
static inline __attribute__((always_inline)) void pg_q8p_pack_record(const pg_q8a_fmt *f, const int F,
        const uint8_t *W, int64_t wrb, int N, int n, int b, uint8_t *rec, uint8_t *q, float *sw, float *mw) {
    const int bs = f->block, BB = f->block_bytes, G = pg_q8p_groups(F);
    memset(rec, 0, (size_t)16 * BB);
    for (int l = 0; l < 16 && n + l < N; l++) {
        const uint8_t *src = W + (int64_t)(n + l) * wrb + (int64_t)b * BB;
        f->unpack(W + (int64_t)(n + l) * wrb, b * bs, bs, q, sw, mw, 1);
        if (PG_Q8P_KQ(F)) for (int w = 0; w < 4; w++) memcpy(rec + 64 * w + 4 * l, src + 4 * w, 4);
        else memcpy(rec + 2 * l, src + (F == PQ_Q6_K ? 208 : 0), 2);
        if (PG_Q8P_DM(F)) memcpy(rec + 32 + 2 * l, src + 2, 2);
        if (F == PQ_Q6_K) for (int s = 0; s < 16; s++) rec[32 + 16 * s + l] = src[192 + s];
        for (int gg = 0; gg < G; gg++) {
            uint8_t *gq = rec + pg_q8p_gq(F, gg);
            const uint8_t *x = q + 32 * gg;
            if (F == PQ_Q8_0) {
                for (int v = 0; v < 8; v++) memcpy(gq + 64 * v + 4 * l, x + 4 * v, 4);
                continue;
            }
            for (int j = 0; j < 4; j++)
                for (int i = 0; i < 4; i++)
                    gq[64 * j + 4 * l + i] = (uint8_t)((x[8 * j + i] & 15) | (x[8 * j + 4 + i] & 15) << 4);
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) {
                    const int byte = 4 * l + i;
                    if (PG_Q8P_H1(F)) gq[256 + byte] |= (uint8_t)(((x[4 * v + i] >> 4) & 1) << v);
                    if (F == PQ_Q6_K) gq[256 + 64 * (v >> 2) + byte] |= (uint8_t)((x[4 * v + i] >> 4) << (2 * (v & 3)));
                }
        }
    }
}

static inline __attribute__((always_inline)) void pg_q8p_pack_panels(const pg_q8a_fmt *f, const int F,
        const uint8_t *W, int64_t wrb, int N, int K, int p0, int p1, uint8_t *P, uint8_t *q, float *sw, float *mw) {
    const int NB = K / f->block, rec = 16 * f->block_bytes;
    for (int p = p0; p < p1; p++)
        for (int b = 0; b < NB; b++)
            pg_q8p_pack_record(f, F, W, wrb, N, 16 * p, b, P + ((int64_t)p * NB + b) * rec, q, sw, mw);
}

/* Row n of a panel weight (panels at P, K values a row) as the file stored it: row_bytes at
 * out. */
static void pg_q8p_row(const pg_q8a_fmt *f, int F, const uint8_t *P, int K, int64_t n, uint8_t *out) {
    const int bs = f->block, BB = f->block_bytes, NB = K / bs, G = pg_q8p_groups(F), l = (int)(n % 16);
    const uint8_t *panel = P + n / 16 * 16 * (int64_t)NB * BB;
    for (int b = 0; b < NB; b++) {
        const uint8_t *rec = panel + (int64_t)b * 16 * BB;
        uint8_t *dst = out + (int64_t)b * BB;
        uint8_t q[256];
        memset(dst, 0, (size_t)BB);
        for (int gg = 0; gg < G; gg++) {
            const uint8_t *gq = rec + pg_q8p_gq(F, gg);
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) {
                    const int byte = 4 * l + i;
                    uint8_t x;
                    if (F == PQ_Q8_0) x = gq[64 * v + byte];
                    else x = (gq[64 * (v >> 1) + byte] >> (4 * (v & 1))) & 15;
                    if (PG_Q8P_H1(F)) x |= (uint8_t)(((gq[256 + byte] >> v) & 1) << 4);
                    if (F == PQ_Q6_K) x |= (uint8_t)(((gq[256 + 64 * (v >> 2) + byte] >> (2 * (v & 3))) & 3) << 4);
                    q[32 * gg + 4 * v + i] = x;
                }
        }
        /* q (k order) back into the block's encoding: the inverse of pagedcy_gemm_q8a_unpack.h */
        if (F == PQ_Q8_0) {
            memcpy(dst, rec + 2 * l, 2);
            memcpy(dst + 2, q, 32);
        } else if (G == 1) {        /* Q4_0 / Q4_1 / Q5_0 / Q5_1: d (m) (qh) qs */
            const int h = PG_Q8P_DM(F) ? 4 : 2;
            uint32_t qh = 0;
            memcpy(dst, rec + 2 * l, 2);
            if (PG_Q8P_DM(F)) memcpy(dst + 2, rec + 32 + 2 * l, 2);
            for (int j = 0; j < 16; j++) {
                dst[h + (PG_Q8P_H1(F) ? 4 : 0) + j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
                qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
            }
            if (PG_Q8P_H1(F)) memcpy(dst + h, &qh, 4);
        } else if (PG_Q8P_KQ(F)) {   /* Q5_K: its high bits between the scales and the nibbles */
            const int qs = F == PQ_Q5_K ? 48 : 16;
            for (int w = 0; w < 4; w++) memcpy(dst + 4 * w, rec + 64 * w + 4 * l, 4);
            for (int c = 0; c < 4; c++)
                for (int j = 0; j < 32; j++) {
                    dst[qs + 32 * c + j] = (uint8_t)((q[64 * c + j] & 15) | (q[64 * c + 32 + j] & 15) << 4);
                    if (F == PQ_Q5_K)
                        dst[16 + j] |= (uint8_t)((q[64 * c + j] >> 4) << (2 * c) | (q[64 * c + 32 + j] >> 4) << (2 * c + 1));
                }
        } else {   /* Q6_K: half h, element 32 t + j: nibble t >> 1 of ql[j + 32 (t & 1)], bits 2t of qh[j] */
            memcpy(dst + 208, rec + 2 * l, 2);
            for (int s = 0; s < 16; s++) dst[192 + s] = rec[32 + 16 * s + l];
            for (int h = 0; h < 2; h++)
                for (int t = 0; t < 4; t++)
                    for (int j = 0; j < 32; j++) {
                        const uint8_t x = q[128 * h + 32 * t + j];
                        dst[64 * h + j + 32 * (t & 1)] |= (uint8_t)((x & 15) << (4 * (t >> 1)));
                        dst[128 + 32 * h + j] |= (uint8_t)((x >> 4) << (2 * t));
                    }
        }
    }
}

/* Rows ids[0 .. count) of a panel weight of type F (K values a row) as the file stored them,
 * row_bytes apart at out (ids checked by the caller). */
static void pagedcy_q8p_rows(int F, const uint8_t *P, int K, const int64_t *ids, int count, uint8_t *out) {
    const pg_q8a_fmt *f = pg_q8a_format(F);
    const int64_t rb = (int64_t)K / f->block * f->block_bytes;
    for (int i = 0; i < count; i++) pg_q8p_row(f, F, P, K, ids[i], out + i * rb);
}

/* Panels [p0, p1) of raw rows W (N rows, row_bytes wrb, K values a row) at P (the whole
 * weight's panels: ceil(N / 16) * 16 * wrb bytes). Returns 0, -1 out of memory, -3 for a type
 * without int8 kernels. */
static int pagedcy_q8p_repack(int F, const uint8_t *W, int64_t wrb, int N, int K, int p0, int p1, uint8_t *P) {
    const pg_q8a_fmt *f = pg_q8a_format(F);
    if (!f || K % f->block) return -3;
    uint8_t *q = (uint8_t *)malloc((size_t)f->block + 2 * 16 * sizeof(float));
    if (!q) return -1;
    float *sw = (float *)(q + f->block), *mw = sw + 16;
    switch (F) {
#define PG_Q8P_CASE(T) case T: pg_q8p_pack_panels(f, T, W, wrb, N, K, p0, p1, P, q, sw, mw); break;
        PG_Q8P_CASE(PQ_Q4_0) PG_Q8P_CASE(PQ_Q4_1) PG_Q8P_CASE(PQ_Q5_0) PG_Q8P_CASE(PQ_Q5_1)
        PG_Q8P_CASE(PQ_Q8_0) PG_Q8P_CASE(PQ_Q4_K) PG_Q8P_CASE(PQ_Q5_K) PG_Q8P_CASE(PQ_Q6_K)
#undef PG_Q8P_CASE
    }
    free(q);
    return 0;
}

#if PG_HAVE_SIMD
/* ---- AVX2: the quants of a group as bytes, for half h (rows 8h .. 8h + 7) ---- */

/* Q5_0: bit v of every byte moved to bit 4 (16-bit shifts: bit 4 of a byte comes from the same
 * byte for shifts up to 4 left / 3 right) */
#define PG_Q8P_SHL4(P, H, v) ((v) <= 4 ? P##_slli_epi16(H, 4 - (v)) : P##_srli_epi16(H, (v) - 4))

/* Q6_K: bits 4-5 of vector 4h + t from the high-bit vector H (bits 2t..2t+1 of each byte) */
#define PG_Q8P_Q6HI(P, S, H, t, m30)                                                              \
    ((t) == 0 ? P##_and_##S(P##_slli_epi16(H, 4), m30) : (t) == 1 ? P##_and_##S(P##_slli_epi16(H, 2), m30) \
     : (t) == 2 ? P##_and_##S(H, m30) : P##_and_##S(P##_srli_epi16(H, 2), m30))

/* Vectors 2j and 2j + 1 of the group whose quants start at gq: the format's quant bytes
 * (Q8_0 signed, the others 0..15 / 0..31 / 0..63). */
PG_AVX2_INLINE void pg_q8p_pair_avx2(const int F, const uint8_t *gq, int j, int h, __m256i *u0, __m256i *u1) {
    if (F == PQ_Q8_0) {
        *u0 = _mm256_loadu_si256((const __m256i *)(gq + 128 * j + 32 * h));
        *u1 = _mm256_loadu_si256((const __m256i *)(gq + 128 * j + 64 + 32 * h));
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(15), z = _mm256_loadu_si256((const __m256i *)(gq + 64 * j + 32 * h));
    __m256i a = _mm256_and_si256(z, m4), b = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
    if (PG_Q8P_H1(F)) {
        const __m256i m10 = _mm256_set1_epi8(0x10), H = _mm256_loadu_si256((const __m256i *)(gq + 256 + 32 * h));
        a = _mm256_or_si256(a, _mm256_and_si256(PG_Q8P_SHL4(_mm256, H, 2 * j), m10));
        b = _mm256_or_si256(b, _mm256_and_si256(PG_Q8P_SHL4(_mm256, H, 2 * j + 1), m10));
    } else if (F == PQ_Q6_K) {
        const __m256i m30 = _mm256_set1_epi8(0x30);
        const __m256i H = _mm256_loadu_si256((const __m256i *)(gq + 256 + 64 * (j >> 1) + 32 * h));
        a = _mm256_or_si256(a, PG_Q8P_Q6HI(_mm256, si256, H, 2 * (j & 1), m30));
        b = _mm256_or_si256(b, PG_Q8P_Q6HI(_mm256, si256, H, 2 * (j & 1) + 1, m30));
    }
    *u0 = a;
    *u1 = b;
}

/* Q4_K's 6-bit scales and mins as bytes, rows in lanes (P _mm256 / _mm512, S si256 / si512):
 * from the dwords Q0, Q1, Q2 (block bytes 4-15, as stored), SC[0] holds the scales of groups
 * 0-3 (byte j: group j), SC[1] of groups 4-7, MN the mins (ggml's get_scale_min_k4 on every
 * row at once, once per block). */
#define PG_Q8P_K4_BYTES(P, S, Q0, Q1, Q2, SC, MN)                                                     \
    do {                                                                                              \
        const __typeof__(Q0) m6_ = P##_set1_epi32(0x3F3F3F3F), m4_ = P##_set1_epi32(0x0F0F0F0F);      \
        const __typeof__(Q0) hi_ = P##_set1_epi32(0x30303030);                                        \
        SC[0] = P##_and_##S(Q0, m6_);                                                                 \
        MN[0] = P##_and_##S(Q1, m6_);                                                                 \
        SC[1] = P##_or_##S(P##_and_##S(Q2, m4_), P##_and_##S(P##_srli_epi32(Q0, 2), hi_));           \
        MN[1] = P##_or_##S(P##_and_##S(P##_srli_epi32(Q2, 4), m4_), P##_and_##S(P##_srli_epi32(Q1, 2), hi_)); \
    } while (0)
/* Byte j of each lane of v, as an int32 */
#define PG_Q8P_BYTE(P, S, v, j)                                                                       \
    ((j) == 3 ? P##_srli_epi32(v, 24)                                                                 \
     : P##_and_##S((j) ? P##_srli_epi32(v, 8 * (j)) : (v), P##_set1_epi32(0xFF)))
/* Group gg's scales sw = d * sc and mins mw = (-dmin) * mn, from PG_Q8P_K4_BYTES's SC, MN */
#define PG_Q8P_K4(P, S, SC, MN, d, ndm, gg, sw, mw)                                                   \
    do {                                                                                              \
        sw = P##_mul_ps(d, P##_cvtepi32_ps(PG_Q8P_BYTE(P, S, SC[(gg) >> 2], (gg) & 3)));             \
        mw = P##_mul_ps(ndm, P##_cvtepi32_ps(PG_Q8P_BYTE(P, S, MN[(gg) >> 2], (gg) & 3)));           \
    } while (0)

/* Half h's per-record scale state: d; mv the min's factor (-dmin for the K-quants, m for Q4_1 /
 * Q5_1); the K-quants' 6-bit scales and mins as bytes. */
typedef struct { __m256 d, mv; __m256i SC[2], MN[2]; } pg_q8p_sc_avx2;

PG_AVX2_INLINE pg_q8p_sc_avx2 pg_q8p_scales_avx2(const int F, const uint8_t *rec, int h) {
    pg_q8p_sc_avx2 s;
    if (PG_Q8P_KQ(F)) {
        const __m256i D = _mm256_loadu_si256((const __m256i *)(rec + 32 * h));
        s.d = pg_q8a_h2f_y(D);
        s.mv = _mm256_sub_ps(_mm256_setzero_ps(), pg_q8a_h2f_y(_mm256_srli_epi32(D, 16)));
        const __m256i Q0 = _mm256_loadu_si256((const __m256i *)(rec + 64 + 32 * h));
        const __m256i Q1 = _mm256_loadu_si256((const __m256i *)(rec + 128 + 32 * h));
        const __m256i Q2 = _mm256_loadu_si256((const __m256i *)(rec + 192 + 32 * h));
        PG_Q8P_K4_BYTES(_mm256, si256, Q0, Q1, Q2, s.SC, s.MN);
    } else {
        s.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 16 * h)));
        s.mv = PG_Q8P_DM(F) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 32 + 16 * h))) : s.d;
        s.SC[0] = s.SC[1] = s.MN[0] = s.MN[1] = _mm256_setzero_si256();
    }
    return s;
}

/* Scale of group gg (scale group sub of a Q6_K group) and Q4_K's min, half h */
PG_AVX2_INLINE __m256 pg_q8p_sw_avx2(const int F, const pg_q8p_sc_avx2 *s, const uint8_t *rec, int gg, int sub, int h,
                                  __m256 *mw) {
    __m256 sw = s->d;
    *mw = _mm256_setzero_ps();
    if (PG_Q8P_DM(F)) *mw = s->mv;
    if (PG_Q8P_KQ(F)) PG_Q8P_K4(_mm256, si256, s->SC, s->MN, s->d, s->mv, gg, sw, *mw);
    if (F == PQ_Q6_K) {
        const __m128i sc = _mm_loadl_epi64((const __m128i *)(rec + 32 + 16 * (2 * gg + sub) + 8 * h));
        sw = _mm256_mul_ps(s->d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    }
    return sw;
}

/* Rows of a record (half h) into the packed tile's sub-panel of L = 8 (q [K/4][8][4] bytes,
 * sw / mw [groups][8]) or, twice, of L = 16 (lane offset 8 h): k4 the record's first k / 4, g0
 * its first scale group. */
PG_AVX2 static void pg_q8p_expand_avx2(const int F, const uint8_t *rec, int h, int L, int lo, int64_t k4, int g0,
                                    uint8_t *q, float *sw, float *mw) {
    const pg_q8p_sc_avx2 s = pg_q8p_scales_avx2(F, rec, h);
    const int G = pg_q8p_groups(F), subs = F == PQ_Q6_K ? 2 : 1;
    for (int gg = 0; gg < G; gg++) {
        const uint8_t *gq = rec + pg_q8p_gq(F, gg);
        for (int j = 0; j < 4; j++) {
            __m256i u0, u1;
            pg_q8p_pair_avx2(F, gq, j, h, &u0, &u1);
            _mm256_storeu_si256((__m256i *)(q + ((k4 + 8 * gg + 2 * j) * L + lo) * 4), u0);
            _mm256_storeu_si256((__m256i *)(q + ((k4 + 8 * gg + 2 * j + 1) * L + lo) * 4), u1);
        }
        for (int sub = 0; sub < subs; sub++) {
            __m256 m;
            const __m256 w = pg_q8p_sw_avx2(F, &s, rec, gg, sub, h, &m);
            const int64_t g = g0 + subs * gg + sub;
            _mm256_storeu_ps(sw + g * L + lo, w);
            _mm256_storeu_ps(mw + g * L + lo, m);
        }
    }
}

/* u8 x s8 sums of 4 into int32 lanes (vpmaddubsw pairs stay exact: see pagedcy_gemm_q8a.h);
 * Q8_0's signed quants as |q| x (a with q's sign). */
PG_AVX2_INLINE __m256i pg_q8p_dot_avx2(const int F, __m256i acc, __m256i u, __m256i ab) {
    if (F == PQ_Q8_0) return _mm256_add_epi32(acc, pg_q8a_dot_y(_mm256_sign_epi8(u, u), _mm256_sign_epi8(ab, u)));
    return _mm256_add_epi32(acc, pg_q8a_dot_y(u, ab));
}

/* Pairs of nibble vectors whose vpmaddubsw results add up in int16 before widening: each
 * int16 lane sums 4 products per pair, |q| * 127 each, so 4 pairs of the 4-bit formats (16 *
 * 15 * 127 = 30480), 2 of the 5-bit ones (8 * 31 * 127 = 31496), 1 of Q6_K (4 * 63 * 127 =
 * 32004) stay below 2^15:
 * the same exact integer sums with fewer ops. */
#define PG_Q8P_I16(F) (PG_Q8P_H1(F) ? 2 : (F) == PQ_Q6_K ? 1 : 4)

PG_AVX2_INLINE __m256i pg_q8p_bcast_avx2(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The group's float chain for MR_ rows of A (see pagedcy_gemm_q8a.h): I the integer sums,
 * S the group's sums of activations */
#define PG_Q8P_LINK(P, F, acc, sw, mw, dav, Iv_, S)                                                 \
    do {                                                                                        \
        const int off_ = (F) == PQ_Q8_0 && (P##_LINK_SIGNED) ? 128 : PG_Q8P_OFF(F);               \
        const __typeof__(Iv_) Ic_ = off_ ? P##_sub_epi32(Iv_, P##_set1_epi32(off_ * (S))) : (Iv_);       \
        acc = P##_fmadd_ps(P##_mul_ps(sw, dav), P##_cvtepi32_ps(Ic_), acc);                       \
        if (PG_Q8P_MIN(F)) acc = P##_fmadd_ps(P##_mul_ps(mw, dav), P##_set1_ps((float)(S)), acc); \
    } while (0)
#define _mm256_LINK_SIGNED 0   /* AVX2 sums Q8_0's signed quants directly */
#define _mm512_LINK_SIGNED 1   /* AVX-512 sums q + 128 (vpdpbusd is u8 x s8) */

/* Software prefetch PG_Q8P_PFD bytes ahead into L2, for the formats of 256-element blocks
 * (Q4_K, Q5_K, Q6_K): a thread's panels are one linear stream, but the hardware prefetchers
 * alone leave it latency-bound on Zen 5. In-process A/B, GB/s from memory, 1 / 2 threads,
 * none vs 2048 bytes ahead: AMD EPYC Zen 5 (family 26 model 2), AVX-512 VNNI: Q4_K 16384 x
 * 2048 17.9 / 28.8 vs 31.1 / 36.7, 2048 x 8192 14.8 / 27.5 vs 29.0 / 43.9, Q6_K 2048 x 8192
 * 28.3 / 30.7 vs 28.9 / 36.8; at the AVX2 level Q4_K 23.5 -> 47.6 and Q6_K 37.3 -> 58.4 on 2
 * threads (3072-8192 bytes ahead: the same within noise). Zen 4 (family 25 model 17), 2
 * threads: Q4_K 2048 x 8192 31.1 vs 32.3, Q6_K 27.7 vs 27.6 (4096 ahead: 26.9 and 24.3,
 * slower). The 32-element formats go without: on Zen 5 Q8_0 4096 x 2048 and Q5_0 4096 x 896
 * are the same either way (48.5 vs 47.7, 47.5 vs 50.0), on Zen 4 Q5_0 4096 x 896 was slower
 * with it (27.9 vs 24.0 at 1024 ahead).
 *
 * Which CPUs: AMD EPYC Zen 4 (family 25 model 17, another host, 2026-12-03) lost by it,
 * llama-3.2-1b's matrices from memory, two alternating rounds, GB/s none vs 2048 ahead: 2
 * threads Q4_K 16384 x 2048 30.6 / 25.3 vs 32.5 / 18.8, Q6_K 2048 x 8192 30.0 / 32.5 vs
 * 27.7 / 23.5, q|k|v 31.7 / 40.9 vs 19.3 / 16.6; 1 thread 25.9 / 17.9 vs 13.0 / 17.8,
 * 20.6 / 18.2 vs 14.2 / 12.7 (4096 and 8192 ahead lower still). So it is on where it was
 * measured to win, AMD family 26 (Zen 5) and later, and off elsewhere
 * (pg_q8p_prefetch_enabled); PAGEDCY_Q8P_PREFETCH=0 / 1 overrides, for A/B runs. */
#ifndef PG_Q8P_PFD
#define PG_Q8P_PFD 2048
#endif
static inline int pg_q8p_prefetch_enabled(void) {
    static int cached = -1;
    if (cached < 0) {
        int on = 0;
        const char *e = getenv("PAGEDCY_Q8P_PREFETCH");
        if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) {
            on = e[0] == '1';
        } else {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
            unsigned a, b, c, d;
            /* vendor "AuthenticAMD" (ebx of leaf 0 is "Auth"), family from leaf 1 */
            if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && __get_cpuid(1, &a, &b, &c, &d)) {
                unsigned fam = (a >> 8) & 0xFu;
                if (fam == 0xFu) fam += (a >> 20) & 0xFFu;
                on = fam >= 0x1Au;
            }
#endif
        }
        cached = on;
    }
    return cached;
}
/* The lines PG_Q8P_PFD bytes past a group's n bytes at p (a group's start, per format F),
 * when pf_on_ (the kernel's pg_q8p_prefetch_enabled()). */
#define PG_Q8P_PF(F, p, n)                                                                    \
    do {                                                                                      \
        if (PG_Q8P_PFD && pf_on_ && (PG_Q8P_KQ(F) || (F) == PQ_Q6_K))                         \
            for (int l_ = 0; l_ < (n); l_ += 64)                                              \
                __builtin_prefetch((const char *)(p) + l_ + PG_Q8P_PFD, 0, 2);                \
    } while (0)

/* AVX2 decode kernel: MR_ rows of A (m0 ..) x one panel (16 rows, two halves of 8), nv of
 * its rows kept (the last panel may be partial). */
#define PG_Q8P_KERN_Y(NAME, F, MR_)                                                                        \
    PG_AVX2 static void NAME(const uint8_t *pan, int NB, const pg_q8a *a, int m0, float *C, int64_t ldc,  \
                             int nv) {                                                                    \
        const int K = a->K, BB = 16 * pg_q8a_format(F)->block_bytes, G = pg_q8p_groups(F);                 \
        const int pf_on_ = pg_q8p_prefetch_enabled();                                                     \
        PG_Q8A_ROWS(MR_)                                                                                  \
        __m256 acc[2][MR_];                                                                               \
        PG_UNROLL for (int i = 0; i < MR_; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();              \
        for (int b = 0; b < NB; b++) {                                                                    \
            const uint8_t *rec = pan + (int64_t)b * BB;                                                   \
            const pg_q8p_sc_avx2 s[2] = {pg_q8p_scales_avx2(F, rec, 0), pg_q8p_scales_avx2(F, rec, 1)};             \
            /* Q4_K: the block's scales and mins for both halves up front (too many registers to \
             * keep the unpacked bytes of both halves live through the groups) */                 \
            __m256 swb[2][8], mwb[2][8];                                                                  \
            if (PG_Q8P_KQ(F))                                                                             \
                PG_UNROLL for (int h = 0; h < 2; h++)                                                     \
                    PG_UNROLL for (int q = 0; q < 8; q++) swb[h][q] = pg_q8p_sw_avx2(F, &s[h], rec, q, 0, h, &mwb[h][q]); \
            for (int gg = 0; gg < G; gg++) {                                                              \
                const uint8_t *gq = rec + pg_q8p_gq(F, gg);                                               \
                const int g = b * G + gg;                                                                 \
                PG_Q8P_PF(F, gq, BB / G);                                                                 \
                /* both halves of each 64-byte vector in turn: the record streams once */                 \
                PG_UNROLL for (int h = 0; h < 2; h++) {                                                   \
                    __m256i Is[MR_], P16[MR_];                                                            \
                    PG_UNROLL for (int i = 0; i < MR_; i++) Is[i] = P16[i] = _mm256_setzero_si256();      \
                    PG_UNROLL for (int j = 0; j < 4; j++) {                                               \
                        __m256i u0, u1;                                                                   \
                        pg_q8p_pair_avx2(F, gq, j, h, &u0, &u1);                                             \
                        PG_UNROLL for (int i = 0; i < MR_; i++) {                                         \
                            const __m256i b0 = pg_q8p_bcast_avx2(qa[i] + 32 * g + 8 * j);                    \
                            const __m256i b1 = pg_q8p_bcast_avx2(qa[i] + 32 * g + 8 * j + 4);                \
                            if ((F) == PQ_Q8_0) {                                                         \
                                Is[i] = pg_q8p_dot_avx2(F, pg_q8p_dot_avx2(F, Is[i], u0, b0), u1, b1);          \
                            } else {  /* int16 sums of pairs of products, widened every PG_Q8P_I16(F) pairs */ \
                                const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(u0, b0), _mm256_maddubs_epi16(u1, b1)); \
                                P16[i] = j % PG_Q8P_I16(F) ? _mm256_add_epi16(P16[i], t) : t;              \
                                if ((j + 1) % PG_Q8P_I16(F) == 0)                                         \
                                    Is[i] = _mm256_add_epi32(Is[i], _mm256_madd_epi16(P16[i], _mm256_set1_epi16(1))); \
                            }                                                                             \
                        }                                                                                 \
                        if ((F) == PQ_Q6_K && (j == 1 || j == 3)) {     /* a scale group of 16 ends */   \
                            __m256 mw;                                                                    \
                            const __m256 sw = pg_q8p_sw_avx2(F, &s[h], rec, gg, j >> 1, h, &mw);             \
                            PG_UNROLL for (int i = 0; i < MR_; i++) {                                     \
                                PG_Q8P_LINK(_mm256, F, acc[h][i], sw, mw, _mm256_set1_ps(da[i][g]), Is[i], s16[i][2 * g + (j >> 1)]); \
                                Is[i] = _mm256_setzero_si256();                                            \
                            }                                                                             \
                        }                                                                                 \
                    }                                                                                     \
                    if ((F) != PQ_Q6_K) {                                                                 \
                        __m256 mw = s[h].mv, sw = s[h].d;                                                 \
                        if (PG_Q8P_KQ(F)) { sw = swb[h][gg]; mw = mwb[h][gg]; }                           \
                        PG_UNROLL for (int i = 0; i < MR_; i++)                                           \
                            PG_Q8P_LINK(_mm256, F, acc[h][i], sw, mw, _mm256_set1_ps(da[i][g]), Is[i],     \
                                        s16[i][2 * g] + s16[i][2 * g + 1]);                               \
                    }                                                                                     \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        PG_UNROLL for (int h = 0; h < 2; h++)                                                             \
            PG_UNROLL for (int i = 0; i < MR_; i++) pg_q8p_store_avx2(C + (int64_t)i * ldc + 8 * h, acc[h][i], nv - 8 * h); \
    }

PG_AVX2_INLINE void pg_q8p_store_avx2(float *c, __m256 v, int n) {
    if (n >= 8) _mm256_storeu_ps(c, v);
    else if (n > 0) _mm256_maskstore_ps(c, pg_mask8(n), v);
}

#define PG_Q8P_FORMATS(T, ISA, MR)                                                                   \
    T(pg_q8p_kern_##ISA##_q4_0_##MR, PQ_Q4_0, MR) T(pg_q8p_kern_##ISA##_q4_1_##MR, PQ_Q4_1, MR)      \
    T(pg_q8p_kern_##ISA##_q5_0_##MR, PQ_Q5_0, MR) T(pg_q8p_kern_##ISA##_q5_1_##MR, PQ_Q5_1, MR)      \
    T(pg_q8p_kern_##ISA##_q8_0_##MR, PQ_Q8_0, MR) T(pg_q8p_kern_##ISA##_q4_k_##MR, PQ_Q4_K, MR)      \
    T(pg_q8p_kern_##ISA##_q5_k_##MR, PQ_Q5_K, MR) T(pg_q8p_kern_##ISA##_q6_k_##MR, PQ_Q6_K, MR)
#define PG_Q8P_MRS(T, ISA) PG_Q8P_FORMATS(T, ISA, 1) PG_Q8P_FORMATS(T, ISA, 2) PG_Q8P_FORMATS(T, ISA, 3) \
    PG_Q8P_FORMATS(T, ISA, 4)
PG_Q8P_MRS(PG_Q8P_KERN_Y, avx2)

/* ---- AVX-512 VNNI: all 16 rows of a panel in one vector ---- */
PG_AVX512_INLINE void pg_q8p_pair_avx512(const int F, const uint8_t *gq, int j, __m512i *u0, __m512i *u1) {
    if (F == PQ_Q8_0) {      /* q ^ 0x80 = q + 128 as unsigned (the link takes 128 S off) */
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
        *u0 = _mm512_xor_si512(_mm512_loadu_si512(gq + 128 * j), x80);
        *u1 = _mm512_xor_si512(_mm512_loadu_si512(gq + 128 * j + 64), x80);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(15), z = _mm512_loadu_si512(gq + 64 * j);
    __m512i a = _mm512_and_si512(z, m4), b = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    if (PG_Q8P_H1(F)) {   /* (lo nibble) | (bit v at bit 4): ternlog 0xF8 = a | (b & c) */
        const __m512i m10 = _mm512_set1_epi8(0x10), H = _mm512_loadu_si512(gq + 256);
        a = _mm512_ternarylogic_epi32(a, PG_Q8P_SHL4(_mm512, H, 2 * j), m10, 0xF8);
        b = _mm512_ternarylogic_epi32(b, PG_Q8P_SHL4(_mm512, H, 2 * j + 1), m10, 0xF8);
    } else if (F == PQ_Q6_K) {
        const __m512i m30 = _mm512_set1_epi8(0x30), H = _mm512_loadu_si512(gq + 256 + 64 * (j >> 1));
        a = _mm512_or_si512(a, PG_Q8P_Q6HI(_mm512, si512, H, 2 * (j & 1), m30));
        b = _mm512_or_si512(b, PG_Q8P_Q6HI(_mm512, si512, H, 2 * (j & 1) + 1, m30));
    }
    *u0 = a;
    *u1 = b;
}

/* acc + u . (the 4 activations at p, in every lane): vpdpbusd with its s8 operand broadcast
 * from memory ({1to16}), one instruction. Written with _mm512_set1_epi32, GCC 12 emits a
 * separate vpbroadcastd per dot: 8 of the ~45 vector instructions of a group at one row of A. */
typedef int32_t pg_q8p_i32a __attribute__((may_alias));
PG_VNNI static inline __attribute__((always_inline)) __m512i pg_q8p_dpbusd_bcast(__m512i acc, __m512i u,
                                                                                 const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const pg_q8p_i32a *)p));
    return acc;
}

#define PG_Q8P_KERN_Z(NAME, F, MR_)                                                                        \
    PG_VNNI static void NAME(const uint8_t *pan, int NB, const pg_q8a *a, int m0, float *C, int64_t ldc,  \
                             int nv) {                                                                    \
        const int K = a->K, BB = 16 * pg_q8a_format(F)->block_bytes, G = pg_q8p_groups(F);                 \
        const int pf_on_ = pg_q8p_prefetch_enabled();                                                     \
        PG_Q8A_ROWS(MR_)                                                                                  \
        __m512 acc[MR_];                                                                                  \
        PG_UNROLL for (int i = 0; i < MR_; i++) acc[i] = _mm512_setzero_ps();                             \
        for (int b = 0; b < NB; b++) {                                                                    \
            const uint8_t *rec = pan + (int64_t)b * BB;                                                   \
            __m512 d, mv = _mm512_setzero_ps();     /* -dmin (K-quants) or m (Q4_1 / Q5_1) */             \
            __m512i SC[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}, MN[2] = {SC[0], SC[0]};    \
            if (PG_Q8P_KQ(F)) {                                                                           \
                const __m512i D = _mm512_loadu_si512(rec);                                                \
                d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D));                                            \
                mv = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16)))); \
                PG_Q8P_K4_BYTES(_mm512, si512, _mm512_loadu_si512(rec + 64), _mm512_loadu_si512(rec + 128), \
                                _mm512_loadu_si512(rec + 192), SC, MN);                                    \
            } else {                                                                                      \
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));                            \
                if (PG_Q8P_DM(F)) mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32)));  \
            }                                                                                             \
            for (int gg = 0; gg < G; gg++) {                                                              \
                const uint8_t *gq = rec + pg_q8p_gq(F, gg);                                               \
                const int g = b * G + gg;                                                                 \
                PG_Q8P_PF(F, gq, BB / G);                                                                 \
                __m512i Is[MR_];                                                                           \
                PG_UNROLL for (int i = 0; i < MR_; i++) Is[i] = _mm512_setzero_si512();                    \
                PG_UNROLL for (int j = 0; j < 4; j++) {                                                   \
                    __m512i u0, u1;                                                                       \
                    pg_q8p_pair_avx512(F, gq, j, &u0, &u1);                                                    \
                    PG_UNROLL for (int i = 0; i < MR_; i++) {                                             \
                        Is[i] = pg_q8p_dpbusd_bcast(Is[i], u0, qa[i] + 32 * g + 8 * j);                   \
                        Is[i] = pg_q8p_dpbusd_bcast(Is[i], u1, qa[i] + 32 * g + 8 * j + 4);               \
                    }                                                                                     \
                    if ((F) == PQ_Q6_K && (j == 1 || j == 3)) {                                           \
                        const __m128i sc = _mm_loadu_si128((const __m128i *)(rec + 32 + 16 * (2 * gg + (j >> 1)))); \
                        const __m512 sw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));  \
                        PG_UNROLL for (int i = 0; i < MR_; i++) {                                         \
                            PG_Q8P_LINK(_mm512, F, acc[i], sw, sw, _mm512_set1_ps(da[i][g]), Is[i], s16[i][2 * g + (j >> 1)]); \
                            Is[i] = _mm512_setzero_si512();                                                \
                        }                                                                                 \
                    }                                                                                     \
                }                                                                                         \
                if ((F) != PQ_Q6_K) {                                                                     \
                    __m512 sw = d, mw = mv;                                                               \
                    if (PG_Q8P_KQ(F)) PG_Q8P_K4(_mm512, si512, SC, MN, d, mv, gg, sw, mw);                \
                    PG_UNROLL for (int i = 0; i < MR_; i++)                                               \
                        PG_Q8P_LINK(_mm512, F, acc[i], sw, mw, _mm512_set1_ps(da[i][g]), Is[i],            \
                                    s16[i][2 * g] + s16[i][2 * g + 1]);                                   \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        const __mmask16 keep = nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1);               \
        PG_UNROLL for (int i = 0; i < MR_; i++) _mm512_mask_storeu_ps(C + (int64_t)i * ldc, keep, acc[i]); \
    }
PG_Q8P_MRS(PG_Q8P_KERN_Z, avx512)

typedef void (*pg_q8p_kern_fn)(const uint8_t *, int, const pg_q8a *, int, float *, int64_t, int);

static pg_q8p_kern_fn pg_q8p_kernel(int level, int F, int mr) {
#define PG_Q8P_ROW(ISA, f) {pg_q8p_kern_##ISA##_##f##_1, pg_q8p_kern_##ISA##_##f##_2, pg_q8p_kern_##ISA##_##f##_3, \
                            pg_q8p_kern_##ISA##_##f##_4}
#define PG_Q8P_PICK(ISA) {PG_Q8P_ROW(ISA, q4_0), PG_Q8P_ROW(ISA, q4_1), PG_Q8P_ROW(ISA, q5_0), PG_Q8P_ROW(ISA, q5_1), \
                          PG_Q8P_ROW(ISA, q8_0), PG_Q8P_ROW(ISA, q4_k), PG_Q8P_ROW(ISA, q5_k), PG_Q8P_ROW(ISA, q6_k)}
    static const pg_q8p_kern_fn z[8][4] = PG_Q8P_PICK(avx512), y[8][4] = PG_Q8P_PICK(avx2);
#undef PG_Q8P_PICK
#undef PG_Q8P_ROW
    const int fi = F == PQ_Q4_0 ? 0 : F == PQ_Q4_1 ? 1 : F == PQ_Q5_0 ? 2 : F == PQ_Q5_1 ? 3 : F == PQ_Q8_0 ? 4
                 : F == PQ_Q4_K ? 5 : F == PQ_Q5_K ? 6 : 7;
    return (level == 2 ? z : y)[fi][mr - 1];
}
#endif /* PG_HAVE_SIMD */

#include "pagedcy_gemm_q8a_tile.h"

/* Rows of A per decode-kernel call (the panel is re-read from L1 / L2 for the next MR) */
#define PG_Q8P_MR 4

/* Rows of A from which a panel weight runs the packed tile rather than the decode kernels
 * (same bits either way). Q4_K 2048 x 2048, 1 thread, AMD EPYC Zen 4, GOP/s decode kernels /
 * tile: 245 / 167 at 8 rows, 252 / 188 at 16, 253 / 232 at 64, 246 / 255 at 512 (the tile
 * expands the panels on every call; the decode kernels unpack nibbles in registers). */
#ifndef PG_Q8P_TILE_M
#define PG_Q8P_TILE_M 128
#endif

/* Panels [p0, p1) of C[M, N] = A @ W^T for a panel weight at P (format F, N rows, K = a->K)
 * and activations a quantized by pg_q8a_quantize, on the calling thread: columns 16 p0 ..
 * min(16 p1, N). simd: a PAGEDCY_SIMD_* cap (AVX-512 needs the CPU's VNNI). Few rows run the
 * decode kernels on the panels; from PG_Q8P_TILE_M rows the panels are expanded into the
 * packed tile of pagedcy_gemm_q8a_tile.h; the scalar level takes each row back as the file
 * stored it. Same bits on every path. Returns 0; -1 out of memory; -3 for a type without
 * these kernels or a K that is not a multiple of its block. */
static int pagedcy_gemm_q8p(int simd, int F, int M, int p0, int p1, const pg_q8a *a, const uint8_t *P, int N,
                            float *C, int64_t ldc) {
    const pg_q8a_fmt *f = pg_q8a_format(F);
    if (!f || a->K % f->block) return -3;
    const int K = a->K, NB = K / f->block;
    const int64_t pan = (int64_t)NB * 16 * f->block_bytes;
    p1 = pg_min(p1, (N + 15) / 16);
    if (M <= 0 || p1 <= p0) return 0;
    int level = 0;
#if PG_HAVE_SIMD
    if (simd >= PAGEDCY_SIMD_AVX512 && pagedcy_cpu_has_avx512vnni()) level = 2;
    else if (simd >= PAGEDCY_SIMD_AVX2 && pagedcy_cpu_has_avx2_fma()) level = 1;
    if (level && M >= PG_Q8P_TILE_M) {
        pg_q8a_src src = {f, F, NULL, 0, P, N};
        return pg_q8a_tiled(level, &src, M, 16 * p0, pg_min(16 * p1, N), a, C, ldc);
    }
    if (level) {
        for (int p = p0; p < p1; p++) {
            const int nv = pg_min(16, N - 16 * p);
            for (int m = 0; m < M;) {
                const int mr = pg_min(PG_Q8P_MR, M - m);
                pg_q8p_kernel(level, F, mr)(P + p * pan, NB, a, m, C + (int64_t)m * ldc + 16 * p, ldc, nv);
                m += mr;
            }
        }
        return 0;
    }
#else
    (void)simd;
#endif
    uint8_t *row = (uint8_t *)malloc((size_t)NB * f->block_bytes);
    if (!row) return -1;
    for (int n = 16 * p0; n < pg_min(16 * p1, N); n++) {
        pg_q8p_row(f, F, P, K, n, row);
        for (int m = 0; m < M; m++)
            C[(int64_t)m * ldc + n] = pg_q8a_dot_scalar(f, row, K, a->qa + (int64_t)m * K, a->da + (int64_t)m * (K / 32),
                                                        a->s16 + (int64_t)m * (K / 16));
    }
    free(row);
    return 0;
}

#endif
