/* GGUF block formats (llama.cpp's GGML types) decoded natively: row decoders in
 * the shape of pagedcy_rowfmt.h's pagedcy_row_decode_fn, for F32, F16, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, and the Q8_0 / Q4_0
 * quantizers. Type numbers are GGML's (gguf.GGMLQuantizationType).
 *
 * Bit exactness against gguf-py (gguf/quants.py) and ggml's dequantize_row_*:
 * every product in a decoder is exact in float32. An fp16 scale has 11
 * significant bits, a K-quant sub-scale at most 7, a quant at most 6 (or 8 for
 * Q8_0), and the largest product, Q6_K's d * sc * q, needs at most 11+7+5 = 23
 * bits, with no overflow or underflow possible (fp16 magnitudes lie in
 * [2^-24, 65504]). So the one rounding a value sees is the final add of the
 * offset (Q4_1 / Q5_1's + m, the K-quants' - dmin * m), and fusing a multiply
 * with it (FMA) rounds the same exact product the same way: the decoders are
 * bit-exact under any vectorization or contraction, which is why one C body
 * serves every instruction set. NaN scales give NaN values (as in gguf-py),
 * though not necessarily the same NaN payload.
 *
 * The quantizers are not: x * id + 8.5 rounds twice in gguf-py, so they are
 * compiled with contraction off (the optimize attribute below; setup.py also
 * builds _quant with -ffp-contract=off).
 *
 * SIMD: each decoder body is an always_inline C function on one block, stamped
 * out three times: plain (baseline x86-64 / any CPU), AVX2+FMA+F16C and
 * AVX-512 via GCC target attributes, so the compiler vectorizes the block
 * loops for each instruction set; pagedcy_quant_rowfmt picks one at run time.
 */
#ifndef PAGEDCY_QUANT_H
#define PAGEDCY_QUANT_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#include "pagedcy_convert.h"
#include "pagedcy_rowfmt.h"

/* GGML type numbers (ggml.h's enum ggml_type). */
#define PQ_F32 0
#define PQ_F16 1
#define PQ_Q4_0 2
#define PQ_Q4_1 3
#define PQ_Q5_0 6
#define PQ_Q5_1 7
#define PQ_Q8_0 8
#define PQ_Q4_K 12
#define PQ_Q5_K 13
#define PQ_Q6_K 14
#define PQ_BF16 30
#define PQ_QK 32      /* elements per block of Q4_0 .. Q8_0 */
#define PQ_QK_K 256   /* elements per block of the K-quants */

#define PQ_INLINE static inline __attribute__((always_inline))

/* An fp16 scale, widened exactly (pagedcy_f16_to_f32's bits, NaN payloads
 * included) without its normalising loop: subnormals are renormalised by one
 * exact float subtraction (F. Giesen's method), so a block's scale costs a few
 * integer operations on every instruction set. */
PQ_INLINE float pq_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13;
    const uint32_t e = o & 0x0f800000u;
    o += (uint32_t)(127 - 15) << 23;
    if (e == 0x0f800000u) o += (uint32_t)(128 - 16) << 23;          /* inf, nan */
    else if (e == 0) {                                               /* zero, subnormal */
        o += 1u << 23;
        o = pagedcy_f32_bits(pagedcy_bits_f32(o) - pagedcy_bits_f32(113u << 23));
    }
    return pagedcy_bits_f32(o | sign);
}

/* ---- one block to float32 (the bodies every instruction set shares) ------- */

/* Q4_0: fp16 d, 16 bytes of nibbles; y[j] = d * (lo(qs[j]) - 8), y[j+16] = d * (hi - 8). */
PQ_INLINE void pq_blk_q4_0(const uint8_t *restrict b, float *restrict y) {
    const float d = pq_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((int)(qs[j] & 0xF) - 8);
        y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

/* Q4_1: fp16 d and m, nibbles; y = d * q + m. */
PQ_INLINE void pq_blk_q4_1(const uint8_t *restrict b, float *restrict y) {
    const float d = pq_half(b), m = pq_half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0xF) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* The 32 five-bit quants of a Q5_0 / Q5_1 block: 32 high bits (little-endian
 * uint32 at qh, bit j for element j) over 16 bytes of nibbles at qs. */
PQ_INLINE void pq_q5_quants(const uint8_t *restrict qh_bytes, const uint8_t *restrict qs, int *restrict q) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (int)(((qh >> j) & 1u) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    }
}

/* Q5_0: fp16 d, the high bits, nibbles; y = d * (q - 16). */
PQ_INLINE void pq_blk_q5_0(const uint8_t *restrict b, float *restrict y) {
    const float d = pq_half(b);
    int q[32];
    pq_q5_quants(b + 2, b + 6, q);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(q[j] - 16);
}

/* Q5_1: fp16 d and m, the high bits, nibbles; y = d * q + m. */
PQ_INLINE void pq_blk_q5_1(const uint8_t *restrict b, float *restrict y) {
    const float d = pq_half(b), m = pq_half(b + 2);
    int q[32];
    pq_q5_quants(b + 4, b + 8, q);
    for (int j = 0; j < 32; j++) y[j] = d * (float)q[j] + m;
}

/* Q8_0: fp16 d, 32 int8. */
PQ_INLINE void pq_blk_q8_0(const uint8_t *restrict b, float *restrict y) {
    const float d = pq_half(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

/* The K-quants' 6-bit sub-scales and mins, 8 of each in 12 bytes (ggml's
 * get_scale_min_k4), four bytes at a time in 32-bit words: sc[j] = s[j] & 63,
 * mn[j] = s[j+4] & 63, sc[j+4] = (s[j+8] & 15) | (s[j] >> 6) << 4,
 * mn[j+4] = (s[j+8] >> 4) | (s[j+4] >> 6) << 4 for j < 4. */
PQ_INLINE void pq_scale_min_k4(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t sc_lo = w0 & 0x3F3F3F3Fu, mn_lo = w1 & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t mn_hi = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(mn, &mn_lo, 4);
    memcpy(mn + 4, &mn_hi, 4);
}

/* A Q4_K / Q5_K block's sub-block scales d * sc[j] (dm[j]) and mins
 * dmin * mn[j] (dm[8 + j]). */
PQ_INLINE void pq_k_scales(const uint8_t *b, float *dm) {
    uint8_t sm[16];
    pq_scale_min_k4(b + 4, sm, sm + 8);
    const float d = pq_half(b), dmin = pq_half(b + 2);
    for (int j = 0; j < 8; j++) {
        dm[j] = d * (float)sm[j];
        dm[8 + j] = dmin * (float)sm[8 + j];
    }
}

/* Q4_K: fp16 d, dmin, 12 scale bytes, 128 bytes of nibbles. Sub-block b (32
 * elements) reads byte (b/2)*32 + j, low nibble for even b;
 * y = (d * sc) * q - dmin * m, as gguf-py and ggml order it. */
PQ_INLINE void pq_blk_q4_k(const uint8_t *restrict b, float *restrict y) {
    float dm[16];
    pq_k_scales(b, dm);
    for (int p = 0; p < 4; p++) {
        const float d1 = dm[2 * p], m1 = dm[8 + 2 * p], d2 = dm[2 * p + 1], m2 = dm[9 + 2 * p];
        const uint8_t *q = b + 16 + 32 * p;
        float *o = y + 64 * p;
        for (int j = 0; j < 32; j++) {
            o[j] = d1 * (float)(q[j] & 0xF) - m1;
            o[j + 32] = d2 * (float)(q[j] >> 4) - m2;
        }
    }
}

/* Q5_K: as Q4_K with 32 bytes of high bits between the scales and the nibbles:
 * bit b of qh[j] is the fifth bit of element b*32 + j. */
PQ_INLINE void pq_blk_q5_k(const uint8_t *restrict b, float *restrict y) {
    float dm[16];
    pq_k_scales(b, dm);
    const uint8_t *qh = b + 16;
    for (int p = 0; p < 4; p++) {
        const float d1 = dm[2 * p], m1 = dm[8 + 2 * p], d2 = dm[2 * p + 1], m2 = dm[9 + 2 * p];
        const uint8_t *q = b + 48 + 32 * p;
        float *o = y + 64 * p;
        for (int j = 0; j < 32; j++) {
            const int lo = (q[j] & 0xF) | (((qh[j] >> (2 * p)) & 1) << 4);
            const int hi = (q[j] >> 4) | (((qh[j] >> (2 * p + 1)) & 1) << 4);
            o[j] = d1 * (float)lo - m1;
            o[j + 32] = d2 * (float)hi - m2;
        }
    }
}

/* Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one
 * per 16 elements), fp16 d last. Half h (128 elements), quarter s: element
 * h*128 + s*32 + j takes nibble s/2 of ql[h*64 + (s&1)*32 + j] and bits 2s of
 * qh[h*32 + j]; y = (d * sc) * (q - 32). */
PQ_INLINE void pq_blk_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = pq_half(b + 208);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const uint8_t *l = ql + 64 * h + 32 * (s & 1), *hb = qh + 32 * h;
            float *o = y + 128 * h + 32 * s;
            const int shift = 4 * (s >> 1);
            for (int g = 0; g < 2; g++) {
                const float dd = d * (float)sc[8 * h + 2 * s + g];
                for (int j = 16 * g; j < 16 * g + 16; j++) {
                    const int q = ((l[j] >> shift) & 0xF) | (((hb[j] >> (2 * s)) & 3) << 4);
                    o[j] = dd * (float)(q - 32);
                }
            }
        }
}

/* ---- row decoders: elements [k0, k0 + nk) of a row ------------------------ */

#define PQ_BLOCK_DECODER(NAME, BLK, QK, BYTES, ATTR)                                          \
    ATTR static void NAME(const void *row, int64_t k0, int64_t nk, float *dst) {               \
        const uint8_t *b = (const uint8_t *)row + (k0 / (QK)) * (BYTES);                      \
        for (int64_t i = 0; i < nk; i += (QK), b += (BYTES)) BLK(b, dst + i);                 \
    }

PQ_INLINE void pq_row_f16(const void *row, int64_t k0, int64_t nk, float *dst) {
    const uint8_t *p = (const uint8_t *)row + 2 * k0;
    for (int64_t i = 0; i < nk; i++) dst[i] = pq_half(p + 2 * i);
}
PQ_INLINE void pq_row_bf16(const void *row, int64_t k0, int64_t nk, float *dst) {
    const uint8_t *p = (const uint8_t *)row + 2 * k0;
    for (int64_t i = 0; i < nk; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = pagedcy_bf16_to_f32(h);
    }
}
static void pq_row_f32(const void *row, int64_t k0, int64_t nk, float *dst) {
    memcpy(dst, (const float *)row + k0, (size_t)nk * 4);
}

#define PQ_STAMP(SUF, ATTR)                                                                   \
    PQ_BLOCK_DECODER(pq_row_q4_0_##SUF, pq_blk_q4_0, PQ_QK, 18, ATTR)                         \
    PQ_BLOCK_DECODER(pq_row_q4_1_##SUF, pq_blk_q4_1, PQ_QK, 20, ATTR)                         \
    PQ_BLOCK_DECODER(pq_row_q5_0_##SUF, pq_blk_q5_0, PQ_QK, 22, ATTR)                         \
    PQ_BLOCK_DECODER(pq_row_q5_1_##SUF, pq_blk_q5_1, PQ_QK, 24, ATTR)                         \
    PQ_BLOCK_DECODER(pq_row_q8_0_##SUF, pq_blk_q8_0, PQ_QK, 34, ATTR)                         \
    PQ_BLOCK_DECODER(pq_row_q4_k_##SUF, pq_blk_q4_k, PQ_QK_K, 144, ATTR)                      \
    PQ_BLOCK_DECODER(pq_row_q5_k_##SUF, pq_blk_q5_k, PQ_QK_K, 176, ATTR)                      \
    PQ_BLOCK_DECODER(pq_row_q6_k_##SUF, pq_blk_q6_k, PQ_QK_K, 210, ATTR)                      \
    ATTR static void pq_row_bf16_##SUF(const void *r, int64_t k0, int64_t nk, float *d) {     \
        pq_row_bf16(r, k0, nk, d);                                                            \
    }                                                                                         \
    static const pagedcy_rowfmt pq_fmts_##SUF[11] = {                                         \
        {pq_row_f32, 1, 4, 0}, {pq_row_f16_##SUF, 1, 2, 0}, {pq_row_bf16_##SUF, 1, 2, 0},              \
        {pq_row_q4_0_##SUF, PQ_QK, 18, PQ_Q4_0}, {pq_row_q4_1_##SUF, PQ_QK, 20, PQ_Q4_1},                       \
        {pq_row_q5_0_##SUF, PQ_QK, 22, PQ_Q5_0}, {pq_row_q5_1_##SUF, PQ_QK, 24, PQ_Q5_1},                       \
        {pq_row_q8_0_##SUF, PQ_QK, 34, PQ_Q8_0}, {pq_row_q4_k_##SUF, PQ_QK_K, 144, PQ_Q4_K},                    \
        {pq_row_q5_k_##SUF, PQ_QK_K, 176, PQ_Q5_K}, {pq_row_q6_k_##SUF, PQ_QK_K, 210, PQ_Q6_K}};

static void pq_row_f16_scalar(const void *r, int64_t k0, int64_t nk, float *d) { pq_row_f16(r, k0, nk, d); }
PQ_STAMP(scalar, )
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
#define PQ_HAVE_SIMD 1
#define PQ_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PQ_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c,prefer-vector-width=512")))
/* F16 rows: F16C's conversion (exact, as the scalar one) */
PQ_AVX2 static void pq_row_f16_avx2(const void *r, int64_t k0, int64_t nk, float *d) {
    const uint8_t *p = (const uint8_t *)r + 2 * k0;
    int64_t i = 0;
    for (; i + 8 <= nk; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    pq_row_f16(p + 2 * i, 0, nk - i, d + i);
}
PQ_AVX512 static void pq_row_f16_avx512(const void *r, int64_t k0, int64_t nk, float *d) {
    const uint8_t *p = (const uint8_t *)r + 2 * k0;
    int64_t i = 0;
    for (; i + 16 <= nk; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i))));
    pq_row_f16(p + 2 * i, 0, nk - i, d + i);
}
/* The AVX-512 widening of 16 quant bytes (PQS_EMIT16's operations, in its order). */
#define PQS_Z16(bytes, off, d, m, mode) ({                                                   \
        __m512 f_ = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_sub_epi32(     \
                                  _mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(off))));     \
        if ((mode) == 1) f_ = _mm512_add_ps(f_, _mm512_set1_ps(m));                           \
        else if ((mode) == 2) f_ = _mm512_sub_ps(f_, _mm512_set1_ps(m));                      \
        f_;                                                                                   \
    })
#define PQS_Z16S(bytes, d) _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), _mm512_set1_ps(d))

/* AVX2: 16 bytes -> two 8-lane vectors */
#define PQS_EMIT16_Y(y, bytes, off, d, m, mode) do {                                          \
        const __m128i b_ = (bytes);                                                           \
        const __m256 d_ = _mm256_set1_ps(d), m_ = _mm256_set1_ps(m);                          \
        const __m256i o_ = _mm256_set1_epi32(off);                                            \
        __m256 f0_ = _mm256_mul_ps(d_, _mm256_cvtepi32_ps(_mm256_sub_epi32(                   \
                                   _mm256_cvtepu8_epi32(b_), o_)));                           \
        __m256 f1_ = _mm256_mul_ps(d_, _mm256_cvtepi32_ps(_mm256_sub_epi32(                   \
                                   _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b_, b_)), o_)));   \
        if ((mode) == 1) { f0_ = _mm256_add_ps(f0_, m_); f1_ = _mm256_add_ps(f1_, m_); }      \
        else if ((mode) == 2) { f0_ = _mm256_sub_ps(f0_, m_); f1_ = _mm256_sub_ps(f1_, m_); } \
        _mm256_storeu_ps(y, f0_);                                                             \
        _mm256_storeu_ps((y) + 8, f1_);                                                       \
    } while (0)
#define PQS_EMIT16S_Y(y, bytes, d) do {                                                       \
        const __m128i b_ = (bytes);                                                           \
        const __m256 d_ = _mm256_set1_ps(d);                                                  \
        _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b_)), d_)); \
        _mm256_storeu_ps((y) + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(                           \
                         _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b_, b_))), d_));             \
    } while (0)
/* Each include of the template consumes (undefines) its PQS* parameters. */
#define PQS(name) pq_##name##_avx2
#define PQS_ATTR PQ_AVX2
#define PQS_YT float *
#define PQS_EXTRA
#define PQS_EMIT16 PQS_EMIT16_Y
#define PQS_EMIT16S PQS_EMIT16S_Y
#include "pagedcy_quant_simd.h"

#define PQS(name) pq_##name##_avx512
#define PQS_ATTR PQ_AVX512
#define PQS_YT float *
#define PQS_EXTRA
#define PQS_EMIT16(y, bytes, off, d, m, mode) _mm512_storeu_ps(y, PQS_Z16(bytes, off, d, m, mode))
#define PQS_EMIT16S(y, bytes, d) _mm512_storeu_ps(y, PQS_Z16S(bytes, d))
#include "pagedcy_quant_simd.h"

#else
#define PQ_HAVE_SIMD 0
#endif

/* The table slot of a GGML type, or -1 when pagedcy cannot decode it. */
static inline int pq_slot(int ggml_type) {
    switch (ggml_type) {
        case PQ_F32: return 0;
        case PQ_F16: return 1;
        case PQ_BF16: return 2;
        case PQ_Q4_0: return 3;
        case PQ_Q4_1: return 4;
        case PQ_Q5_0: return 5;
        case PQ_Q5_1: return 6;
        case PQ_Q8_0: return 7;
        case PQ_Q4_K: return 8;
        case PQ_Q5_K: return 9;
        case PQ_Q6_K: return 10;
        default: return -1;
    }
}

/* The instruction set a request for simd_level gets here: capped by the CPU. */
static inline int pagedcy_quant_level(int simd_level) {
#if PQ_HAVE_SIMD
    if (simd_level >= PAGEDCY_SIMD_AVX512 && pagedcy_cpu_has_avx512()) return PAGEDCY_SIMD_AVX512;
    if (simd_level >= PAGEDCY_SIMD_AVX2 && pagedcy_cpu_has_avx2_fma()) return PAGEDCY_SIMD_AVX2;
#else
    (void)simd_level;
#endif
    return PAGEDCY_SIMD_SCALAR;
}

/* The row format of a GGML type at instruction-set cap simd_level (a
 * PAGEDCY_SIMD_*; the CPU may lower it), or NULL for a type pagedcy does not
 * decode (Q2_K, Q3_K, the IQ and TQ types, ...). */
static inline const pagedcy_rowfmt *pagedcy_quant_rowfmt(int ggml_type, int simd_level) {
    const int s = pq_slot(ggml_type);
    if (s < 0) return NULL;
#if PQ_HAVE_SIMD
    switch (pagedcy_quant_level(simd_level)) {
        case PAGEDCY_SIMD_AVX512: return &pq_fmts_avx512[s];
        case PAGEDCY_SIMD_AVX2: return &pq_fmts_avx2[s];
        default: break;
    }
#else
    (void)simd_level;
#endif
    return &pq_fmts_scalar[s];
}

/* Rows [r0, r1) of a tensor of K-element rows (row_bytes bytes each, in format
 * fmt) to float32 rows of K at out (row r0 first). */
static inline void pagedcy_quant_decode_rows(const pagedcy_rowfmt *fmt, const uint8_t *raw,
                                             int64_t row_bytes, int64_t r0, int64_t r1, int64_t K,
                                             float *out) {
    for (int64_t r = r0; r < r1; r++) fmt->decode(raw + r * row_bytes, 0, K, out + (r - r0) * K);
}

/* ---- quantizers (gguf-py's Q8_0 and Q4_0, bit for bit) -------------------- */

/* float32 -> integer as x86's cvttss2si does and so as NumPy's astype does
 * here: truncation, and INT32_MIN (low byte 0) for NaN and out-of-range
 * values. Only reachable for blocks whose scale's inverse overflows (all
 * |x| below ~2^-126), where gguf-py's casts meet inf and NaN. */
PQ_INLINE uint8_t pq_cast_u8(float y) {
    if (!(y > -2147483648.0f && y < 2147483648.0f)) return 0;
    return (uint8_t)((uint32_t)(int32_t)y & 0xFFu);
}

/* roundf(y) (half away from zero) then pq_cast_u8, without libm: y - trunc(y)
 * is exact, so comparing it with +-0.5 decides the rounding exactly. */
PQ_INLINE uint8_t pq_round_u8(float y) {
    if (!(y > -2147483648.0f && y < 2147483648.0f)) return 0;
    int32_t i = (int32_t)y;
    const float r = y - (float)i;
    i += (r >= 0.5f) - (r <= -0.5f);
    return (uint8_t)((uint32_t)i & 0xFFu);
}

/* 32 floats -> one Q8_0 block: d = amax / 127, q = round-half-away(x / d). */
__attribute__((optimize("fp-contract=off")))
static inline void pq_quantize_q8_0_block(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = pagedcy_f32_to_f16(d);
    memcpy(out, &h, 2);
    for (int j = 0; j < 32; j++) out[2 + j] = pq_round_u8(x[j] * id);
}

/* 32 floats -> one Q4_0 block: the value of largest magnitude (the first of
 * equals) gives d = max / -8; q = min(15, trunc(x / d + 8.5)). */
__attribute__((optimize("fp-contract=off")))
static inline void pq_quantize_q4_0_block(const float *x, uint8_t *out) {
    float amax = fabsf(x[0]), max = x[0];   /* x[0] when all are +-0: its sign sets d's */
    for (int j = 1; j < 32; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) { amax = a; max = x[j]; }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = pagedcy_f32_to_f16(d);
    memcpy(out, &h, 2);
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        const float t = x[j] * id;
        const float v = t + 8.5f;
        const uint8_t c = pq_cast_u8(v);              /* truncation, as truncf then the cast */
        q[j] = c > 15 ? 15 : c;
    }
    for (int j = 0; j < 16; j++) out[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

/* nblocks blocks of 32 floats to ggml_type (PQ_Q8_0 or PQ_Q4_0). Returns 0, or
 * -1 for another type, -2 when x holds a NaN or infinity (gguf-py gives
 * platform-dependent bytes for those). */
static inline int pagedcy_quantize_blocks(int ggml_type, const float *x, int64_t nblocks, uint8_t *out) {
    if (ggml_type != PQ_Q8_0 && ggml_type != PQ_Q4_0) return -1;
    for (int64_t i = 0; i < nblocks * 32; i++)
        if (!isfinite(x[i])) return -2;
    for (int64_t i = 0; i < nblocks; i++) {
        if (ggml_type == PQ_Q8_0) pq_quantize_q8_0_block(x + 32 * i, out + 34 * i);
        else pq_quantize_q4_0_block(x + 32 * i, out + 18 * i);
    }
    return 0;
}

#endif
