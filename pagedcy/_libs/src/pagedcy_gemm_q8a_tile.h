/* Many rows of A for pagedcy_gemm_q8a.h: a panel of W's rows is unpacked to one byte per
 * quant in dot-product order, then a register tile runs the integer sums and the float
 * chain of pagedcy_gemm_q8a.h's definition (same bits as the panel decode kernels and the
 * scalar C).
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

/* Where the tile's rows of W come from: raw rows W (row_bytes wrb) as the file stores them,
 * or (W NULL) a panel weight P of N rows (pagedcy_gemm_q8p.h). */
typedef struct {
    const pg_q8a_fmt *f;
    int F;
    const uint8_t *W;
    int64_t wrb;
    const uint8_t *P;
    int N;
} pg_q8a_src;

/* Rows [n, n + nb) of W into NV sub-panels of L rows at p (rows past nb are zero, scale 0).
 * Layout per sub-panel: q (K * L bytes), sw (G * L floats), mw (G * L floats). row: K bytes
 * of scratch, rs / rm: G floats each. */
static inline int64_t pg_q8a_subpanel_bytes(int K, int G, int L) { return (int64_t)K * L + 8 * (int64_t)G * L; }

static void pg_q8a_pack(const pg_q8a_src *src, int n, int nb, int K, int L, int NV, uint8_t *p, uint8_t *row,
                        float *rs, float *rm) {
    const pg_q8a_fmt *f = src->f;
    const int G = K / f->group;
    const int64_t sp = pg_q8a_subpanel_bytes(K, G, L);
    if (!src->W) {      /* a panel weight: its records expanded, 16 / L sub-panels a panel */
        const int NB = K / f->block, BB = 16 * f->block_bytes, gpb = f->block / f->group;
        for (int v = 0; v < NV; v++) {
            uint8_t *q = p + v * sp;
            float *sw = (float *)(q + (int64_t)K * L), *mw = sw + (int64_t)G * L;
            const int r0 = n + L * v;
            if (r0 >= n + nb || r0 >= src->N) {
                memset(q, 0, (size_t)sp);
                continue;
            }
            const uint8_t *pan = src->P + (int64_t)(r0 / 16) * NB * BB;
            for (int b = 0; b < NB; b++)
                for (int h = L == 16 ? 0 : (r0 / 8) & 1; h < (L == 16 ? 2 : ((r0 / 8) & 1) + 1); h++)
                    pg_q8p_expand_avx2(src->F, pan + (int64_t)b * BB, h, L, L == 16 ? 8 * h : 0, (int64_t)b * f->block / 4,
                                    b * gpb, q, sw, mw);
        }
        return;
    }
    for (int r = 0; r < L * NV; r++) {
        uint8_t *q = p + (r / L) * sp;
        float *sw = (float *)(q + (int64_t)K * L), *mw = sw + (int64_t)G * L;
        const int l = r % L;
        if (r < nb) {
            (f->unpack_avx2 ? f->unpack_avx2 : f->unpack)(src->W + (int64_t)(n + r) * src->wrb, 0, K, row, rs, rm, 1);
        } else {
            memset(row, 0, (size_t)K);
            memset(rs, 0, (size_t)G * sizeof(float));
            memset(rm, 0, (size_t)G * sizeof(float));
        }
        for (int k4 = 0; k4 < K / 4; k4++) memcpy(q + ((int64_t)k4 * L + l) * 4, row + 4 * k4, 4);
        for (int g = 0; g < G; g++) {
            sw[(int64_t)g * L + l] = rs[g];
            mw[(int64_t)g * L + l] = f->kind == PG_Q8A_MIN ? rm[g] : 0.0f;
        }
    }
}

/* AVX-512 VNNI tile: MR_ rows of A x 2 sub-panels of 16 rows of W, for a format of kind KIND_
 * (PG_Q8A_*) and groups of GS_ (constants); off: the offset kind's offset, 128 when signed. */
#define PG_Q8A_TILE_Z(NAME, KIND_, GS_, MR_)                                                                                  \
    PG_VNNI static void NAME(int K, int off, const uint8_t *p, const pg_q8a *a, int m0, float *C, int64_t ldc) {              \
        const int GS = (GS_), G = K / GS, ST = GS / 4;                                                    \
        const int64_t sp = pg_q8a_subpanel_bytes(K, G, 16);                                                          \
        const __m512i x80 = _mm512_set1_epi8((char)0x80);                                                            \
        PG_Q8A_ROWS(MR_)                                                                                             \
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
                    if ((KIND_) == PG_Q8A_SIGNED) w[v] = _mm512_xor_si512(w[v], x80);                                         \
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
                const __m512 mwv = (KIND_) == PG_Q8A_MIN ? _mm512_load_ps(sw + (int64_t)G * 16 + g * 16) : swv;           \
                PG_UNROLL for (int i = 0; i < MR_; i++) {                                                            \
                    const __m512 dav = _mm512_set1_ps(da[i][(GS_) == 16 ? g >> 1 : g]);                          \
                    __m512i Ic = Iv[i][v];                                                                            \
                    if ((KIND_) != PG_Q8A_MIN)                                                                             \
                        Ic = _mm512_sub_epi32(Ic, _mm512_set1_epi32(off * PG_Q8A_SUMS(GS_, s16[i], g))); \
                    acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(swv, dav), _mm512_cvtepi32_ps(Ic), acc[i][v]);         \
                    if ((KIND_) == PG_Q8A_MIN)                                                                             \
                        acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(mwv, dav), _mm512_set1_ps((float)PG_Q8A_SUMS(GS_, s16[i], g)), acc[i][v]); \
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
#define PG_Q8A_TILE_Y(NAME, KIND_, GS_, MR_)                                                                                  \
    PG_AVX2 static void NAME(int K, int off, const uint8_t *p, const pg_q8a *a, int m0, float *C, int64_t ldc) {              \
        const int GS = (GS_), G = K / GS, ST = GS / 4;                                                    \
        PG_Q8A_ROWS(MR_)                                                                                             \
        const float *sw = (const float *)(p + (int64_t)K * 8);                                                       \
        __m256 acc[MR_];                                                                                             \
        PG_UNROLL for (int i = 0; i < MR_; i++) acc[i] = _mm256_setzero_ps();                                        \
        for (int g = 0; g < G; g++) {                                                                                \
            __m256i Iv[MR_];                                                                                          \
            PG_UNROLL for (int i = 0; i < MR_; i++) Iv[i] = _mm256_setzero_si256();                                   \
            PG_UNROLL for (int kk = 0; kk < ST; kk++) {                                                              \
                const int k4 = g * ST + kk;                                                                          \
                const __m256i w = _mm256_load_si256((const __m256i *)(p + (int64_t)k4 * 32));                        \
                const __m256i u = (KIND_) == PG_Q8A_SIGNED ? _mm256_sign_epi8(w, w) : w;                                      \
                PG_UNROLL for (int i = 0; i < MR_; i++) {                                                            \
                    int32_t av;                                                                                      \
                    memcpy(&av, qa[i] + 4 * k4, 4);                                                                  \
                    __m256i ab = _mm256_set1_epi32(av);                                                              \
                    if ((KIND_) == PG_Q8A_SIGNED) ab = _mm256_sign_epi8(ab, w);                                               \
                    Iv[i] = _mm256_add_epi32(Iv[i], pg_q8a_dot_y(u, ab));                                              \
                }                                                                                                    \
            }                                                                                                        \
            const __m256 swv = _mm256_load_ps(sw + g * 8);                                                           \
            const __m256 mwv = (KIND_) == PG_Q8A_MIN ? _mm256_load_ps(sw + (int64_t)G * 8 + g * 8) : swv;                  \
            PG_UNROLL for (int i = 0; i < MR_; i++) {                                                                \
                const __m256 dav = _mm256_set1_ps(da[i][(GS_) == 16 ? g >> 1 : g]);                              \
                __m256i Ic = Iv[i];                                                                                   \
                if ((KIND_) == PG_Q8A_OFFSET) Ic = _mm256_sub_epi32(Ic, _mm256_set1_epi32(off * PG_Q8A_SUMS(GS_, s16[i], g)));                   \
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(swv, dav), _mm256_cvtepi32_ps(Ic), acc[i]);                   \
                if ((KIND_) == PG_Q8A_MIN)                                                                                 \
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(mwv, dav), _mm256_set1_ps((float)PG_Q8A_SUMS(GS_, s16[i], g)), acc[i]); \
            }                                                                                                        \
        }                                                                                                            \
        PG_UNROLL for (int i = 0; i < MR_; i++) _mm256_storeu_ps(C + (int64_t)i * ldc, acc[i]);                      \
    }


/* the kinds: min (Q4_K, Q5_K, Q4_1, Q5_1), offset (Q4_0, Q5_0), signed (Q8_0), offset with
 * groups of 16 (Q6_K); MR 4 and the 1-row tail */
#define PG_Q8A_TILES(ISA, T)                                                                  \
    T(pg_q8a_tile_##ISA##_min_4, PG_Q8A_MIN, 32, 4) T(pg_q8a_tile_##ISA##_min_1, PG_Q8A_MIN, 32, 1) \
    T(pg_q8a_tile_##ISA##_off_4, PG_Q8A_OFFSET, 32, 4) T(pg_q8a_tile_##ISA##_off_1, PG_Q8A_OFFSET, 32, 1) \
    T(pg_q8a_tile_##ISA##_sgn_4, PG_Q8A_SIGNED, 32, 4) T(pg_q8a_tile_##ISA##_sgn_1, PG_Q8A_SIGNED, 32, 1) \
    T(pg_q8a_tile_##ISA##_off16_4, PG_Q8A_OFFSET, 16, 4) T(pg_q8a_tile_##ISA##_off16_1, PG_Q8A_OFFSET, 16, 1)
PG_Q8A_TILES(avx512, PG_Q8A_TILE_Z)
PG_Q8A_TILES(avx2, PG_Q8A_TILE_Y)

typedef void (*pg_q8a_tile_fn)(int, int, const uint8_t *, const pg_q8a *, int, float *, int64_t);

/* Columns [n0, n1) of C for M rows of A: panels of 32 (16) rows of W, packed once and
 * run against every row block of A (the panel, K * 32 bytes, stays in L2). Returns 0 or -1
 * when out of memory. */
static int pg_q8a_tiled(int level, const pg_q8a_src *src, int M, int n0, int n1, const pg_q8a *a, float *C,
                        int64_t ldc) {
    const pg_q8a_fmt *f = src->f;
    const int K = a->K, L = level == 2 ? 16 : 8, NV = level == 2 ? 2 : 1, P = L * NV;
    const int G = K / f->group;
    const int64_t panel = pg_q8a_subpanel_bytes(K, G, L) * NV;
    const int64_t extra = (int64_t)K + 8 * (int64_t)G + (int64_t)PG_Q8A_MR * P * 4;
    uint8_t *buf = (uint8_t *)pg_pack_buffer((size_t)((panel + extra + 3) / 4));
    if (!buf) return -1;
    uint8_t *row = buf + panel;
    float *rs = (float *)(row + K), *rm = rs + G, *tmp = rm + G;
    const int fi = f->group == 16 ? 3 : f->kind == PG_Q8A_MIN ? 0 : f->kind == PG_Q8A_OFFSET ? 1 : 2;
    const int off = f->kind == PG_Q8A_SIGNED ? 128 : f->off;
    static const pg_q8a_tile_fn tz[4][2] = {
        {pg_q8a_tile_avx512_min_4, pg_q8a_tile_avx512_min_1}, {pg_q8a_tile_avx512_off_4, pg_q8a_tile_avx512_off_1},
        {pg_q8a_tile_avx512_sgn_4, pg_q8a_tile_avx512_sgn_1}, {pg_q8a_tile_avx512_off16_4, pg_q8a_tile_avx512_off16_1}};
    static const pg_q8a_tile_fn ty[4][2] = {
        {pg_q8a_tile_avx2_min_4, pg_q8a_tile_avx2_min_1}, {pg_q8a_tile_avx2_off_4, pg_q8a_tile_avx2_off_1},
        {pg_q8a_tile_avx2_sgn_4, pg_q8a_tile_avx2_sgn_1}, {pg_q8a_tile_avx2_off16_4, pg_q8a_tile_avx2_off16_1}};
    const pg_q8a_tile_fn *fn = level == 2 ? tz[fi] : ty[fi];
    for (int n = n0; n < n1; n += P) {
        const int nb = pg_min(P, n1 - n);
        pg_q8a_pack(src, n, nb, K, L, NV, buf, row, rs, rm);
        for (int m = 0; m < M;) {
            const int mr = M - m >= PG_Q8A_MR ? PG_Q8A_MR : 1;
            float *c = C + (int64_t)m * ldc + n;
            if (nb == P) {
                fn[mr == 1](K, off, buf, a, m, c, ldc);
            } else {                  /* a last partial panel: through tmp, nb columns kept */
                fn[mr == 1](K, off, buf, a, m, tmp, P);
                for (int i = 0; i < mr; i++) memcpy(c + (int64_t)i * ldc, tmp + (int64_t)i * P, (size_t)nb * sizeof(float));
            }
            m += mr;
        }
    }
    return 0;
}
#endif
#endif
