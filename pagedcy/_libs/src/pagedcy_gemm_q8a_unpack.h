/* The format-specific part of the int8-activation GEMM (pagedcy_gemm_q8a.h): each GGUF
 * block format unpacks a range of a row into one byte per quant, in k order, and the fp32
 * scales of its groups. Everything after that (the GEMV, the packed tile, the scalar
 * reference) is shared.
 *
 * A group is 32 elements (16 for Q6_K's sub-scales) with one scale sw, and the weight is
 *   signed:  w = sw * q                 (Q8_0: q the signed byte)
 *   offset:  w = sw * (q - off)         (Q4_0: off 8, q = 0..15; Q5_0: off 16, q = 0..31;
 *                                        Q6_K: off 32, q = 0..63)
 *   min:     w = sw * q + mw            (Q4_K / Q5_K: q = 0..15 / 0..31, mw = (-dmin) * mn;
 *                                        Q4_1 / Q5_1: mw = m)
 * with sw = d (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or d * sc (K-quants) rounded to fp32 once. These are
 * the values gguf's dequantization computes (up to its own float32 rounding of the product).
 */
#ifndef PAGEDCY_GEMM_Q8A_UNPACK_H
#define PAGEDCY_GEMM_Q8A_UNPACK_H

#include <stdint.h>
#include <string.h>
#include "pagedcy_quant.h"

#define PG_Q8A_SIGNED 0
#define PG_Q8A_OFFSET 1
#define PG_Q8A_MIN 2

/* Unpack elements [k0, k0 + kc) of row w (both multiples of the block): q[kc] bytes, and
 * group j's scale at sw[j * ss] (mw[j * ss] for the min kind). */
typedef void (*pg_q8a_unpack_fn)(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw, int ss);

typedef struct {
    int block, block_bytes;     /* elements and bytes per block */
    int group, kind, off;       /* group size, PG_Q8A_*, the offset of the offset kind */
    pg_q8a_unpack_fn unpack;    /* plain C */
    pg_q8a_unpack_fn unpack_avx2;   /* the same bytes and scales with AVX2 + F16C (NULL: none) */
} pg_q8a_fmt;

static inline float pg_q8a_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return pagedcy_f16_to_f32(h);
}

/* The 32 quants of a Q4_0 / Q4_1 / Q5_0 / Q5_1 block as bytes: element j (j < 16) is the low
 * nibble of qs[j], element j + 16 the high one; with qh (the 5-bit formats), bit j (j + 16) of
 * its little-endian uint32 is their bit 4. */
static inline void pg_q8a_q4q5(const uint8_t *qs, const uint8_t *qh, uint8_t *q) {
    uint32_t h = 0;
    if (qh) memcpy(&h, qh, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1) << 4);
        q[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
}

/* Q4_0 (offset 8), Q4_1 (d, m: the min kind), Q5_0 (offset 16), Q5_1 (d, m): a block's quants
 * and its fp16 d (and m). */
#define PG_Q8A_UNPACK_Q4Q5(NAME, BYTES, QS, QH, MIN)                                                 \
    static void NAME(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw, int ss) {   \
        w += (int64_t)k0 / 32 * (BYTES);                                                             \
        for (int g = 0; g < kc / 32; g++, w += (BYTES)) {                                            \
            pg_q8a_q4q5(w + (QS), (QH) ? w + (QH) : NULL, q + 32 * g);                               \
            sw[g * ss] = pg_q8a_half(w);                                                             \
            if (MIN) mw[g * ss] = pg_q8a_half(w + 2);                                                \
        }                                                                                            \
    }
PG_Q8A_UNPACK_Q4Q5(pg_q8a_unpack_q4_0, 18, 2, 0, 0)
PG_Q8A_UNPACK_Q4Q5(pg_q8a_unpack_q4_1, 20, 4, 0, 1)
PG_Q8A_UNPACK_Q4Q5(pg_q8a_unpack_q5_0, 22, 6, 2, 0)
PG_Q8A_UNPACK_Q4Q5(pg_q8a_unpack_q5_1, 24, 8, 4, 1)

static void pg_q8a_unpack_q8_0(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw, int ss) {
    (void)mw;
    w += (int64_t)k0 / 32 * 34;
    for (int g = 0; g < kc / 32; g++, w += 34) {
        memcpy(q + 32 * g, w + 2, 32);
        sw[g * ss] = pg_q8a_half(w);
    }
}

/* A Q4_K block's 8 group scales d * sc and mins (-dmin) * mn (ndm = 0 - dmin: +0 for +0,
 * as the SIMD paths compute it). */
static inline void pg_q8a_k4_scales(const uint8_t *w, float d, float ndm, float *sw, float *mw, int ss) {
    uint8_t sc[8], mn[8];
    pq_scale_min_k4(w + 4, sc, mn);
    for (int j = 0; j < 8; j++) {
        sw[j * ss] = d * (float)sc[j];
        mw[j * ss] = ndm * (float)mn[j];
    }
}

/* Q4_K / Q5_K: 8 groups per 256; chunk c's 32 bytes of nibbles (at QS) hold groups 2c (low
 * nibbles) and 2c + 1 (high); Q5_K's 32 bytes of high bits (at QH) give element l of group 2c
 * (2c + 1) bit 2c (2c + 1) of qh[l] as its bit 4. */
#define PG_Q8A_UNPACK_K(NAME, BYTES, QS, QH)                                                         \
    static void NAME(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw, int ss) {   \
        w += (int64_t)k0 / 256 * (BYTES);                                                            \
        for (int b = 0; b < kc / 256; b++, w += (BYTES)) {                                           \
            pg_q8a_k4_scales(w, pg_q8a_half(w), 0.0f - pg_q8a_half(w + 2), sw + 8 * b * ss,          \
                             mw + 8 * b * ss, ss);                                                   \
            for (int c = 0; c < 4; c++)                                                              \
                for (int l = 0; l < 32; l++) {                                                       \
                    const int hl = (QH) ? (w[(QH) + l] >> (2 * c)) & 1 : 0;                          \
                    const int hh = (QH) ? (w[(QH) + l] >> (2 * c + 1)) & 1 : 0;                      \
                    q[256 * b + 64 * c + l] = (uint8_t)((w[(QS) + 32 * c + l] & 15) | hl << 4);      \
                    q[256 * b + 64 * c + 32 + l] = (uint8_t)((w[(QS) + 32 * c + l] >> 4) | hh << 4); \
                }                                                                                    \
        }                                                                                            \
    }
PG_Q8A_UNPACK_K(pg_q8a_unpack_q4_k, 144, 16, 0)
PG_Q8A_UNPACK_K(pg_q8a_unpack_q5_k, 176, 48, 16)

/* Q6_K: 16 groups of 16 per 256, q = 0..63 (the -32 is the offset). Half h, element
 * 32t + l of it: low or high nibble of ql[l + 32 (t & 1)] and bits 2t..2t+1 of qh[l]. */
static void pg_q8a_unpack_q6_k(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw, int ss) {
    (void)mw;
    w += (int64_t)k0 / 256 * 210;
    for (int b = 0; b < kc / 256; b++, w += 210) {
        const float d = pg_q8a_half(w + 208);
        for (int j = 0; j < 16; j++) sw[(16 * b + j) * ss] = d * (float)(int8_t)w[192 + j];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            uint8_t *o = q + 256 * b + 128 * h;
            for (int t = 0; t < 4; t++)
                for (int l = 0; l < 32; l++) {
                    const int v = ql[l + 32 * (t & 1)];
                    o[32 * t + l] = (uint8_t)(((t >> 1) ? v >> 4 : v & 15) | ((qh[l] >> (2 * t)) & 3) << 4);
                }
        }
    }
}

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PG_Q8A_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PG_Q8A_HALF(p) _cvtsh_ss(*(const uint16_t *)(p))

/* A Q5_0 block's 32 quants (0..31) as bytes: nibbles of qs (low ones first) and bit j of qh
 * as 16 (llama.cpp's bytes_from_bits_32). */
PG_Q8A_AVX2 static inline __m256i pg_q8a_q5_0_bytes_avx2(const uint8_t *blk) {
    /* qs in both 128-bit lanes (a load), the upper one shifted right by 4 */
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 6)));
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(t, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
    uint32_t x;
    memcpy(&x, blk + 2, 4);
    const __m256i sh = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i b = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)x), sh),
                                      _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_or_si256(nib, _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16)));
}

PG_Q8A_AVX2 static void pg_q8a_unpack_q5_0_avx2(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw,
                                                int ss) {
    (void)mw;
    w += (int64_t)k0 / 32 * 22;
    for (int g = 0; g < kc / 32; g++, w += 22) {
        _mm256_storeu_si256((__m256i *)(q + 32 * g), pg_q8a_q5_0_bytes_avx2(w));
        sw[g * ss] = PG_Q8A_HALF(w);
    }
}

PG_Q8A_AVX2 static void pg_q8a_unpack_q8_0_avx2(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw,
                                                int ss) {
    (void)mw;
    w += (int64_t)k0 / 32 * 34;
    for (int g = 0; g < kc / 32; g++, w += 34) {
        _mm256_storeu_si256((__m256i *)(q + 32 * g), _mm256_loadu_si256((const __m256i *)(w + 2)));
        sw[g * ss] = PG_Q8A_HALF(w);
    }
}

PG_Q8A_AVX2 static void pg_q8a_unpack_q4_k_avx2(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw,
                                                int ss) {
    const __m256i m4 = _mm256_set1_epi8(15);
    w += (int64_t)k0 / 256 * 144;
    for (int b = 0; b < kc / 256; b++, w += 144) {
        pg_q8a_k4_scales(w, PG_Q8A_HALF(w), 0.0f - PG_Q8A_HALF(w + 2), sw + 8 * b * ss, mw + 8 * b * ss, ss);
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
            _mm256_storeu_si256((__m256i *)(q + 256 * b + 64 * c), _mm256_and_si256(v, m4));
            _mm256_storeu_si256((__m256i *)(q + 256 * b + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        }
    }
}

PG_Q8A_AVX2 static void pg_q8a_unpack_q6_k_avx2(const uint8_t *w, int k0, int kc, uint8_t *q, float *sw, float *mw,
                                                int ss) {
    (void)mw;
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    w += (int64_t)k0 / 256 * 210;
    for (int b = 0; b < kc / 256; b++, w += 210) {
        const float d = PG_Q8A_HALF(w + 208);
        for (int j = 0; j < 16; j++) sw[(16 * b + j) * ss] = d * (float)(int8_t)w[192 + j];
        for (int h = 0; h < 2; h++) {
            const __m256i A = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            const __m256i B = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            uint8_t *o = q + 256 * b + 128 * h;
            _mm256_storeu_si256((__m256i *)o, _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)));
            _mm256_storeu_si256((__m256i *)(o + 32), _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)));
            _mm256_storeu_si256((__m256i *)(o + 64), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m30)));
            _mm256_storeu_si256((__m256i *)(o + 96), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                                                     _mm256_and_si256(_mm256_srli_epi16(H, 2), m30)));
        }
    }
}
#define PG_Q8A_WITH_AVX2(x) x
#else
#define PG_Q8A_WITH_AVX2(x) NULL
#endif

/* The int8-activation description of GGML type F, or NULL. unpack_avx2: the AVX2 unpacker of
 * the formats whose raw rows the tile packs often enough to have one (NULL: the plain C one). */
static inline const pg_q8a_fmt *pg_q8a_format(int F) {
#define PG_Q8A_FMT(name, blk, bytes, group, kind, off, avx2) \
    static const pg_q8a_fmt name = {blk, bytes, group, kind, off, pg_q8a_unpack_##name, avx2};
    PG_Q8A_FMT(q4_0, 32, 18, 32, PG_Q8A_OFFSET, 8, NULL)
    PG_Q8A_FMT(q4_1, 32, 20, 32, PG_Q8A_MIN, 0, NULL)
    PG_Q8A_FMT(q5_0, 32, 22, 32, PG_Q8A_OFFSET, 16, PG_Q8A_WITH_AVX2(pg_q8a_unpack_q5_0_avx2))
    PG_Q8A_FMT(q5_1, 32, 24, 32, PG_Q8A_MIN, 0, NULL)
    PG_Q8A_FMT(q8_0, 32, 34, 32, PG_Q8A_SIGNED, 0, PG_Q8A_WITH_AVX2(pg_q8a_unpack_q8_0_avx2))
    PG_Q8A_FMT(q4_k, 256, 144, 32, PG_Q8A_MIN, 0, PG_Q8A_WITH_AVX2(pg_q8a_unpack_q4_k_avx2))
    PG_Q8A_FMT(q5_k, 256, 176, 32, PG_Q8A_MIN, 0, NULL)
    PG_Q8A_FMT(q6_k, 256, 210, 16, PG_Q8A_OFFSET, 32, PG_Q8A_WITH_AVX2(pg_q8a_unpack_q6_k_avx2))
#undef PG_Q8A_FMT
    switch (F) {
        case PQ_Q4_0: return &q4_0;
        case PQ_Q4_1: return &q4_1;
        case PQ_Q5_0: return &q5_0;
        case PQ_Q5_1: return &q5_1;
        case PQ_Q8_0: return &q8_0;
        case PQ_Q4_K: return &q4_k;
        case PQ_Q5_K: return &q5_k;
        case PQ_Q6_K: return &q6_k;
        default: return NULL;
    }
}

#endif
