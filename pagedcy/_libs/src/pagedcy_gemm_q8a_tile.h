/* Many rows of A for pagedcy_gemm_q8a.h: a panel of W's rows is unpacked to one byte per
 * quant in dot-product order, then a register tile runs the integer sums and the float
 * chain of pagedcy_gemm_q8a.h's definition (same bits as the GEMV and the scalar C).
 *
 * Packing is the only format-specific part (BLIS's split). A sub-panel of L rows (16 on
 * AVX-512, 8 on AVX2) holds q [K/4][L][4] (the 4 quants of row l at k..k+3 next to each
 * other, so one vpdpbusd / vpmaddubsw multiplies L rows by a broadcast of 4 activations), and
 * the group scales sw [G][L] (and Q4_K's mins mw [G][L]), G = K / group. Q4_K and Q6_K store
 * their unsigned quants (Q6_K's 0..63, the -32 folded into the sums), Q8_0 its signed ones.
 */
#ifndef PAGEDCY_GEMM_Q8A_TILE_H
#define PAGEDCY_GEMM_Q8A_TILE_H

#if PG_HAVE_SIMD
#define PG_Q8A_MR 4

static inline int pg_q8a_group(int F) { return F == PQ_Q6_K ? 16 : 32; }

/* One row of W: its K quants as bytes (q) and its group scales (sw, mw). */
PG_AVX2 static void pg_q8a_unpack_row_avx2(int F, const uint8_t *w, int K, uint8_t *q, float *sw, float *mw) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    if (F == PQ_Q8_0) {
        for (int g = 0; g < K / 32; g++, w += 34) {
            memcpy(q + 32 * g, w + 2, 32);
            sw[g] = pg_q8a_half(w);
        }
    } else if (F == PQ_Q4_K) {
        for (int b = 0; b < K / 256; b++, w += 144) {
            uint8_t sc[8], mn[8];
            pq_scale_min_k4(w + 4, sc, mn);
            const float d = pg_q8a_half(w), ndm = 0.0f - pg_q8a_half(w + 2);
            for (int j = 0; j < 8; j++) {
                sw[8 * b + j] = d * (float)sc[j];
                mw[8 * b + j] = ndm * (float)mn[j];
            }
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
                _mm256_storeu_si256((__m256i *)(q + 256 * b + 64 * c), _mm256_and_si256(v, m4));
                _mm256_storeu_si256((__m256i *)(q + 256 * b + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
        }
    } else {
        for (int b = 0; b < K / 256; b++, w += 210) {
            const float d = pg_q8a_half(w + 208);
            for (int j = 0; j < 16; j++) sw[16 * b + j] = d * (float)(int8_t)w[192 + j];
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
}

/* Rows [n, n + nb) of W into NV sub-panels of L rows at p (rows past nb are zero, scale 0).
 * Layout per sub-panel: q (K * L bytes), sw (G * L floats), mw (G * L floats). row: K bytes
 * of scratch, rs / rm: G floats each. */
static inline int64_t pg_q8a_subpanel_bytes(int K, int G, int L) { return (int64_t)K * L + 8 * (int64_t)G * L; }

PG_AVX2 static void pg_q8a_pack_avx2(int F, const uint8_t *W, int64_t wrb, int n, int nb, int K, int L, int NV,
                                uint8_t *p, uint8_t *row, float *rs, float *rm) {
    const int G = K / pg_q8a_group(F);
    const int64_t sp = pg_q8a_subpanel_bytes(K, G, L);
    for (int r = 0; r < L * NV; r++) {
        uint8_t *q = p + (r / L) * sp;
        float *sw = (float *)(q + (int64_t)K * L), *mw = sw + (int64_t)G * L;
        const int l = r % L;
        if (r < nb) {
            pg_q8a_unpack_row_avx2(F, W + (int64_t)(n + r) * wrb, K, row, rs, rm);
        } else {
            memset(row, 0, (size_t)K);
            memset(rs, 0, (size_t)G * sizeof(float));
            memset(rm, 0, (size_t)G * sizeof(float));
        }
        for (int k4 = 0; k4 < K / 4; k4++) memcpy(q + ((int64_t)k4 * L + l) * 4, row + 4 * k4, 4);
        for (int g = 0; g < G; g++) {
            sw[(int64_t)g * L + l] = rs[g];
            mw[(int64_t)g * L + l] = F == PQ_Q4_K ? rm[g] : 0.0f;
        }
    }
}

/* Per group: I -= off * S (Q6_K: 32 * s16; Q8_0 on AVX-512: 128 * s32), then the chain. */
#define PG_Q8A_SUMS(F_, s, g) ((F_) == PQ_Q6_K ? (s)[g] : (s)[2 * (g)] + (s)[2 * (g) + 1])

/* AVX-512 VNNI tile: MR_ rows of A x 2 sub-panels of 16 rows of W, format F_ (a constant). */
#define PG_Q8A_TILE_Z(NAME, F_, MR_)                                                                                  \
    PG_VNNI static void NAME(int K, const uint8_t *p, const pg_q8a *a, int m0, float *C, int64_t ldc) {              \
        const int GS = pg_q8a_group(F_), G = K / GS, ST = GS / 4;                                                    \
        const int64_t sp = pg_q8a_subpanel_bytes(K, G, 16);                                                          \
        const __m512i x80 = _mm512_set1_epi8((char)0x80);                                                            \
        const int8_t *qa[MR_];                                                                                       \
        const float *da[MR_];                                                                                        \
        const int32_t *s16[MR_];                                                                                     \
        PG_UNROLL for (int i = 0; i < MR_; i++) {                                                                    \
            qa[i] = a->qa + (int64_t)(m0 + i) * K;                                                                   \
            da[i] = a->da + (int64_t)(m0 + i) * (K / 32);                                                            \
            s16[i] = a->s16 + (int64_t)(m0 + i) * (K / 16);                                                          \
        }                                                                                                            \
        __m512 acc[MR_][2];                                                                                          \
        PG_UNROLL for (int i = 0; i < MR_; i++) { acc[i][0] = _mm512_setzero_ps(); acc[i][1] = _mm512_setzero_ps(); } \
        for (int g = 0; g < G; g++) {                                                                                \
            __m512i Iv[MR_][2];                                                                                       \
            PG_UNROLL for (int i = 0; i < MR_; i++) { Iv[i][0] = _mm512_setzero_si512(); Iv[i][1] = _mm512_setzero_si512(); } \
            PG_UNROLL for (int kk = 0; kk < ST; kk++) {                                                              \
                const int k4 = g * ST + kk;                                                                          \
                __m512i w[2];                                                                                        \
                PG_UNROLL for (int v = 0; v < 2; v++) {                                                              \
                    w[v] = _mm512_load_si512(p + v * sp + (int64_t)k4 * 64);                                         \
                    if ((F_) == PQ_Q8_0) w[v] = _mm512_xor_si512(w[v], x80);                                         \
                }                                                                                                    \
                PG_UNROLL for (int i = 0; i < MR_; i++) {                                                            \
                    int32_t av;                                                                                      \
                    memcpy(&av, qa[i] + 4 * k4, 4);                                                                  \
                    const __m512i ab = _mm512_set1_epi32(av);                                                        \
                    PG_UNROLL for (int v = 0; v < 2; v++) Iv[i][v] = _mm512_dpbusd_epi32(Iv[i][v], w[v], ab);          \
                }                                                                                                    \
            }                                                                                                        \
            PG_UNROLL for (int v = 0; v < 2; v++) {                                                                  \
                const float *sw = (const float *)(p + v * sp + (int64_t)K * 16);                                     \
                const __m512 swv = _mm512_load_ps(sw + g * 16);                                                      \
                const __m512 mwv = (F_) == PQ_Q4_K ? _mm512_load_ps(sw + (int64_t)G * 16 + g * 16) : swv;           \
                PG_UNROLL for (int i = 0; i < MR_; i++) {                                                            \
                    const __m512 dav = _mm512_set1_ps(da[i][(F_) == PQ_Q6_K ? g >> 1 : g]);                          \
                    __m512i Ic = Iv[i][v];                                                                            \
                    if ((F_) != PQ_Q4_K)                                                                             \
                        Ic = _mm512_sub_epi32(Ic, _mm512_set1_epi32(((F_) == PQ_Q6_K ? 32 : 128) * PG_Q8A_SUMS(F_, s16[i], g))); \
                    acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(swv, dav), _mm512_cvtepi32_ps(Ic), acc[i][v]);         \
                    if ((F_) == PQ_Q4_K)                                                                             \
                        acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(mwv, dav), _mm512_set1_ps((float)PG_Q8A_SUMS(F_, s16[i], g)), acc[i][v]); \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        PG_UNROLL for (int i = 0; i < MR_; i++) {                                                                    \
            _mm512_storeu_ps(C + (int64_t)i * ldc, acc[i][0]);                                                       \
            _mm512_storeu_ps(C + (int64_t)i * ldc + 16, acc[i][1]);                                                  \
        }                                                                                                            \
    }

/* AVX2 tile: MR_ rows of A x one sub-panel of 8 rows of W. Q8_0's signed quants go through
 * vpmaddubsw as |q| x (qa with q's sign). */
#define PG_Q8A_TILE_Y(NAME, F_, MR_)                                                                                  \
    PG_AVX2 static void NAME(int K, const uint8_t *p, const pg_q8a *a, int m0, float *C, int64_t ldc) {              \
        const int GS = pg_q8a_group(F_), G = K / GS, ST = GS / 4;                                                    \
        const int8_t *qa[MR_];                                                                                       \
        const float *da[MR_];                                                                                        \
        const int32_t *s16[MR_];                                                                                     \
        PG_UNROLL for (int i = 0; i < MR_; i++) {                                                                    \
            qa[i] = a->qa + (int64_t)(m0 + i) * K;                                                                   \
            da[i] = a->da + (int64_t)(m0 + i) * (K / 32);                                                            \
            s16[i] = a->s16 + (int64_t)(m0 + i) * (K / 16);                                                          \
        }                                                                                                            \
        const float *sw = (const float *)(p + (int64_t)K * 8);                                                       \
        __m256 acc[MR_];                                                                                             \
        PG_UNROLL for (int i = 0; i < MR_; i++) acc[i] = _mm256_setzero_ps();                                        \
        for (int g = 0; g < G; g++) {                                                                                \
            __m256i Iv[MR_];                                                                                          \
            PG_UNROLL for (int i = 0; i < MR_; i++) Iv[i] = _mm256_setzero_si256();                                   \
            PG_UNROLL for (int kk = 0; kk < ST; kk++) {                                                              \
                const int k4 = g * ST + kk;                                                                          \
                const __m256i w = _mm256_load_si256((const __m256i *)(p + (int64_t)k4 * 32));                        \
                const __m256i u = (F_) == PQ_Q8_0 ? _mm256_sign_epi8(w, w) : w;                                      \
                PG_UNROLL for (int i = 0; i < MR_; i++) {                                                            \
                    int32_t av;                                                                                      \
                    memcpy(&av, qa[i] + 4 * k4, 4);                                                                  \
                    __m256i ab = _mm256_set1_epi32(av);                                                              \
                    if ((F_) == PQ_Q8_0) ab = _mm256_sign_epi8(ab, w);                                               \
                    Iv[i] = _mm256_add_epi32(Iv[i], pg_q8a_dot_y(u, ab));                                              \
                }                                                                                                    \
            }                                                                                                        \
            const __m256 swv = _mm256_load_ps(sw + g * 8);                                                           \
            const __m256 mwv = (F_) == PQ_Q4_K ? _mm256_load_ps(sw + (int64_t)G * 8 + g * 8) : swv;                  \
            PG_UNROLL for (int i = 0; i < MR_; i++) {                                                                \
                const __m256 dav = _mm256_set1_ps(da[i][(F_) == PQ_Q6_K ? g >> 1 : g]);                              \
                __m256i Ic = Iv[i];                                                                                   \
                if ((F_) == PQ_Q6_K) Ic = _mm256_sub_epi32(Ic, _mm256_set1_epi32(32 * s16[i][g]));                   \
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(swv, dav), _mm256_cvtepi32_ps(Ic), acc[i]);                   \
                if ((F_) == PQ_Q4_K)                                                                                 \
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(mwv, dav), _mm256_set1_ps((float)PG_Q8A_SUMS(F_, s16[i], g)), acc[i]); \
            }                                                                                                        \
        }                                                                                                            \
        PG_UNROLL for (int i = 0; i < MR_; i++) _mm256_storeu_ps(C + (int64_t)i * ldc, acc[i]);                      \
    }

PG_Q8A_TILE_Z(pg_q8a_tile_avx512_q4k_4, PQ_Q4_K, 4)
PG_Q8A_TILE_Z(pg_q8a_tile_avx512_q4k_1, PQ_Q4_K, 1)
PG_Q8A_TILE_Z(pg_q8a_tile_avx512_q6k_4, PQ_Q6_K, 4)
PG_Q8A_TILE_Z(pg_q8a_tile_avx512_q6k_1, PQ_Q6_K, 1)
PG_Q8A_TILE_Z(pg_q8a_tile_avx512_q8_0_4, PQ_Q8_0, 4)
PG_Q8A_TILE_Z(pg_q8a_tile_avx512_q8_0_1, PQ_Q8_0, 1)
PG_Q8A_TILE_Y(pg_q8a_tile_avx2_q4k_4, PQ_Q4_K, 4)
PG_Q8A_TILE_Y(pg_q8a_tile_avx2_q4k_1, PQ_Q4_K, 1)
PG_Q8A_TILE_Y(pg_q8a_tile_avx2_q6k_4, PQ_Q6_K, 4)
PG_Q8A_TILE_Y(pg_q8a_tile_avx2_q6k_1, PQ_Q6_K, 1)
PG_Q8A_TILE_Y(pg_q8a_tile_avx2_q8_0_4, PQ_Q8_0, 4)
PG_Q8A_TILE_Y(pg_q8a_tile_avx2_q8_0_1, PQ_Q8_0, 1)

typedef void (*pg_q8a_tile_fn)(int, const uint8_t *, const pg_q8a *, int, float *, int64_t);

/* Columns [n0, n1) of C for M rows of A: panels of 32 (16) rows of W, packed once and
 * run against every row block of A (the panel, K * 32 bytes, stays in L2). Returns 0 or -1
 * when out of memory. */
static int pg_q8a_tiled(int level, int F, int M, int n0, int n1, const pg_q8a *a, const uint8_t *W, int64_t wrb,
                        float *C, int64_t ldc) {
    const int K = a->K, L = level == 2 ? 16 : 8, NV = level == 2 ? 2 : 1, P = L * NV;
    const int G = K / pg_q8a_group(F);
    const int64_t panel = pg_q8a_subpanel_bytes(K, G, L) * NV;
    const int64_t extra = (int64_t)K + 8 * (int64_t)G + (int64_t)PG_Q8A_MR * P * 4;
    uint8_t *buf = (uint8_t *)pg_pack_buffer((size_t)((panel + extra + 3) / 4));
    if (!buf) return -1;
    uint8_t *row = buf + panel;
    float *rs = (float *)(row + K), *rm = rs + G, *tmp = rm + G;
    const int fi = F == PQ_Q4_K ? 0 : F == PQ_Q6_K ? 1 : 2;
    static const pg_q8a_tile_fn tz[3][2] = {{pg_q8a_tile_avx512_q4k_4, pg_q8a_tile_avx512_q4k_1}, {pg_q8a_tile_avx512_q6k_4, pg_q8a_tile_avx512_q6k_1},
                                            {pg_q8a_tile_avx512_q8_0_4, pg_q8a_tile_avx512_q8_0_1}};
    static const pg_q8a_tile_fn ty[3][2] = {{pg_q8a_tile_avx2_q4k_4, pg_q8a_tile_avx2_q4k_1}, {pg_q8a_tile_avx2_q6k_4, pg_q8a_tile_avx2_q6k_1},
                                            {pg_q8a_tile_avx2_q8_0_4, pg_q8a_tile_avx2_q8_0_1}};
    const pg_q8a_tile_fn *fn = level == 2 ? tz[fi] : ty[fi];
    for (int n = n0; n < n1; n += P) {
        const int nb = pg_min(P, n1 - n);
        pg_q8a_pack_avx2(F, W, wrb, n, nb, K, L, NV, buf, row, rs, rm);
        for (int m = 0; m < M;) {
            const int mr = M - m >= PG_Q8A_MR ? PG_Q8A_MR : 1;
            float *c = C + (int64_t)m * ldc + n;
            if (nb == P) {
                fn[mr == 1](K, buf, a, m, c, ldc);
            } else {                  /* a last partial panel: through tmp, nb columns kept */
                fn[mr == 1](K, buf, a, m, tmp, P);
                for (int i = 0; i < mr; i++) memcpy(c + (int64_t)i * ldc, tmp + (int64_t)i * P, (size_t)nb * sizeof(float));
            }
            m += mr;
        }
    }
    return 0;
}
#endif
#endif
