/* The block decoders written with intrinsics, once for both vector widths:
 * pagedcy_quant.h includes this file twice, with PQS(name) naming the
 * instruction set's copy, PQS_ATTR its target attribute and PQS_EMIT16 /
 * PQS_EMIT16S the widening of 16 quant bytes (unsigned / signed) to floats:
 * one 16-lane vector for AVX-512, two 8-lane ones for AVX2. The bit
 * twiddling runs on 16 bytes at a time in SSE registers, shared by both.
 *
 * PQS_EMIT16(y, bytes, off, d, m, mode): y[0..16) = d * (float)(bytes - off)
 * (mode 0), + m (mode 1) or - m (mode 2); the same operations, in the same
 * order, as the plain C bodies of pagedcy_quant.h, so the same bits. (The
 * GEMM's streaming tiles decode in registers instead: pagedcy_gemm_qtile.h.)
 */

/* Bit j of bits (j < 16) as byte j: val where set, 0 elsewhere. */
PQS_ATTR PQ_INLINE __m128i PQS(bits_to_bytes)(uint32_t bits, char val) {
    const __m128i v = _mm_shuffle_epi8(_mm_set1_epi16((short)(bits & 0xFFFFu)),
                                       _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, sel), sel), _mm_set1_epi8(val));
}

PQS_ATTR PQ_INLINE __m128i PQS(lo4)(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
PQS_ATTR PQ_INLINE __m128i PQS(hi4)(__m128i v) {
    return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
}
PQS_ATTR PQ_INLINE __m128i PQS(load16)(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

PQS_ATTR PQ_INLINE void PQS(blk_q4_0)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    const float d = pq_half(b);
    const __m128i q = PQS(load16)(b + 2);
    PQS_EMIT16(y, PQS(lo4)(q), 8, d, 0.0f, 0);
    PQS_EMIT16(y + 16, PQS(hi4)(q), 8, d, 0.0f, 0);
}

PQS_ATTR PQ_INLINE void PQS(blk_q4_1)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    const float d = pq_half(b), m = pq_half(b + 2);
    const __m128i q = PQS(load16)(b + 4);
    PQS_EMIT16(y, PQS(lo4)(q), 0, d, m, 1);
    PQS_EMIT16(y + 16, PQS(hi4)(q), 0, d, m, 1);
}

PQS_ATTR PQ_INLINE void PQS(blk_q5_0)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    const float d = pq_half(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const __m128i q = PQS(load16)(b + 6);
    PQS_EMIT16(y, _mm_or_si128(PQS(lo4)(q), PQS(bits_to_bytes)(qh, 16)), 16, d, 0.0f, 0);
    PQS_EMIT16(y + 16, _mm_or_si128(PQS(hi4)(q), PQS(bits_to_bytes)(qh >> 16, 16)), 16, d, 0.0f, 0);
}

PQS_ATTR PQ_INLINE void PQS(blk_q5_1)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    const float d = pq_half(b), m = pq_half(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const __m128i q = PQS(load16)(b + 8);
    PQS_EMIT16(y, _mm_or_si128(PQS(lo4)(q), PQS(bits_to_bytes)(qh, 16)), 0, d, m, 1);
    PQS_EMIT16(y + 16, _mm_or_si128(PQS(hi4)(q), PQS(bits_to_bytes)(qh >> 16, 16)), 0, d, m, 1);
}

PQS_ATTR PQ_INLINE void PQS(blk_q8_0)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    const float d = pq_half(b);
    PQS_EMIT16S(y, PQS(load16)(b + 2), d);
    PQS_EMIT16S(y + 16, PQS(load16)(b + 18), d);
}

/* A Q4_K / Q5_K block's sub-block scales d * sc[j] (dm[j]) and mins dmin * mn[j]
 * (dm[8 + j]), converted and multiplied four at a time. */
PQS_ATTR PQ_INLINE void PQS(k_scales)(const uint8_t *b, float *dm) {
    uint8_t sm[16];
    pq_scale_min_k4(b + 4, sm, sm + 8);
    const __m128i v = _mm_loadu_si128((const __m128i *)sm);
    const __m128 d = _mm_set1_ps(pq_half(b)), dmin = _mm_set1_ps(pq_half(b + 2));
    _mm_storeu_ps(dm, _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(v))));
    _mm_storeu_ps(dm + 4, _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(v, 4)))));
    _mm_storeu_ps(dm + 8, _mm_mul_ps(dmin, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(v, 8)))));
    _mm_storeu_ps(dm + 12, _mm_mul_ps(dmin, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(v, 12)))));
}

PQS_ATTR PQ_INLINE void PQS(blk_q4_k)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    float dm[16];
    PQS(k_scales)(b, dm);
    for (int p = 0; p < 4; p++) {
        const float d1 = dm[2 * p], m1 = dm[8 + 2 * p], d2 = dm[2 * p + 1], m2 = dm[9 + 2 * p];
        const __m128i q0 = PQS(load16)(b + 16 + 32 * p), q1 = PQS(load16)(b + 32 + 32 * p);
        PQS_YT o = y + 64 * p;
        PQS_EMIT16(o, PQS(lo4)(q0), 0, d1, m1, 2);
        PQS_EMIT16(o + 16, PQS(lo4)(q1), 0, d1, m1, 2);
        PQS_EMIT16(o + 32, PQS(hi4)(q0), 0, d2, m2, 2);
        PQS_EMIT16(o + 48, PQS(hi4)(q1), 0, d2, m2, 2);
    }
}

PQS_ATTR PQ_INLINE void PQS(blk_q5_k)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    float dm[16];
    PQS(k_scales)(b, dm);
    const __m128i h0 = PQS(load16)(b + 16), h1 = PQS(load16)(b + 32);
    for (int p = 0; p < 4; p++) {
        const float d1 = dm[2 * p], m1 = dm[8 + 2 * p], d2 = dm[2 * p + 1], m2 = dm[9 + 2 * p];
        const __m128i q0 = PQS(load16)(b + 48 + 32 * p), q1 = PQS(load16)(b + 64 + 32 * p);
        const __m128i s1 = _mm_set1_epi8((char)(1 << (2 * p))), s2 = _mm_set1_epi8((char)(2 << (2 * p)));
        const __m128i sixteen = _mm_set1_epi8(16);
#define PQS_HB(h, s) _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h, s), s), sixteen)
        PQS_YT o = y + 64 * p;
        PQS_EMIT16(o, _mm_or_si128(PQS(lo4)(q0), PQS_HB(h0, s1)), 0, d1, m1, 2);
        PQS_EMIT16(o + 16, _mm_or_si128(PQS(lo4)(q1), PQS_HB(h1, s1)), 0, d1, m1, 2);
        PQS_EMIT16(o + 32, _mm_or_si128(PQS(hi4)(q0), PQS_HB(h0, s2)), 0, d2, m2, 2);
        PQS_EMIT16(o + 48, _mm_or_si128(PQS(hi4)(q1), PQS_HB(h1, s2)), 0, d2, m2, 2);
#undef PQS_HB
    }
}

PQS_ATTR PQ_INLINE void PQS(blk_q6_k)(const uint8_t *b, PQS_YT y PQS_EXTRA) {
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = pq_half(b + 208);
    const __m128i three = _mm_set1_epi8(3);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const uint8_t *l = b + 64 * h + 32 * (s & 1), *hb = b + 128 + 32 * h;
            PQS_YT o = y + 128 * h + 32 * s;
            for (int g = 0; g < 2; g++) {
                const float dd = d * (float)sc[8 * h + 2 * s + g];
                __m128i lo = PQS(load16)(l + 16 * g);
                lo = (s >> 1) ? PQS(hi4)(lo) : PQS(lo4)(lo);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(PQS(load16)(hb + 16 * g), 2 * s), three);
                hi = _mm_slli_epi16(hi, 4);
                PQS_EMIT16(o + 16 * g, _mm_or_si128(lo, hi), 32, dd, 0.0f, 0);
            }
        }
}

PQ_BLOCK_DECODER(PQS(row_q4_0), PQS(blk_q4_0), PQ_QK, 18, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q4_1), PQS(blk_q4_1), PQ_QK, 20, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q5_0), PQS(blk_q5_0), PQ_QK, 22, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q5_1), PQS(blk_q5_1), PQ_QK, 24, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q8_0), PQS(blk_q8_0), PQ_QK, 34, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q4_k), PQS(blk_q4_k), PQ_QK_K, 144, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q5_k), PQS(blk_q5_k), PQ_QK_K, 176, PQS_ATTR)
PQ_BLOCK_DECODER(PQS(row_q6_k), PQS(blk_q6_k), PQ_QK_K, 210, PQS_ATTR)

PQS_ATTR static void PQS(row_bf16)(const void *r, int64_t k0, int64_t nk, float *d) { pq_row_bf16(r, k0, nk, d); }

static const pagedcy_rowfmt PQS(fmts)[11] = {
    {pq_row_f32, 1, 4, 0}, {PQS(row_f16), 1, 2, 0}, {PQS(row_bf16), 1, 2, 0},
    {PQS(row_q4_0), PQ_QK, 18, PQ_Q4_0}, {PQS(row_q4_1), PQ_QK, 20, PQ_Q4_1},
    {PQS(row_q5_0), PQ_QK, 22, PQ_Q5_0}, {PQS(row_q5_1), PQ_QK, 24, PQ_Q5_1},
    {PQS(row_q8_0), PQ_QK, 34, PQ_Q8_0}, {PQS(row_q4_k), PQ_QK_K, 144, PQ_Q4_K},
    {PQS(row_q5_k), PQ_QK_K, 176, PQ_Q5_K}, {PQS(row_q6_k), PQ_QK_K, 210, PQ_Q6_K}};

#undef PQS
#undef PQS_ATTR
#undef PQS_YT
#undef PQS_EXTRA
#undef PQS_EMIT16
#undef PQS_EMIT16S
