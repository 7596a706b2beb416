/* out[M, N] = x[M, K] @ W^T for a weight W[N, K] kept in a GGUF block format
 * (pagedcy_quant.h), sized for decode steps (M of 1 to a few dozen).
 *
 * A block of PQL_NR weight rows is decoded PQL_KC elements at a time into a
 * float32 scratch that stays in L1 (4 x 1024 floats: 16 KiB), and every row of
 * x passes over it with MR x PQL_NR vector accumulators; so the weight is read
 * from memory once per call for up to PQL_MB rows of x, and the decoders are
 * the same ones the prefill GEMM packs through. A single row of x (M = 1, a
 * one-sequence decode step) skips the scratch: the block types' bodies then
 * multiply their decoded vectors into the accumulators in registers
 * (pagedcy_quant_simd.h's PQS_DOT copies; AVX2 / AVX-512 only).
 *
 * Measured (1 thread, Sapphire-Rapids-class Xeon VM, shared): the AVX-512
 * decode runs at ~11 G elements/s (Q4_K: ~6 GB/s of weight), bound by the
 * widen / convert / scale / FMA vector operations (2 per cycle at 512 bits);
 * Q8_0 reaches the memory's rate. Beyond this needs integer dot products on
 * int8 activations (llama.cpp's vec_dot_q*_q8), which round differently.
 *
 * Batch invariance: each output's partial sums live in one vector of lanes
 * (16 for AVX-512, 8 for AVX2 and plain C), accumulated over k in order, kept
 * in memory between chunks and reduced by one fixed tree at the end. Nothing
 * in that order depends on M, the row tile, the weight-row block or the
 * thread split, so a row of out is bit for bit the same alone as in a batch.
 */
#ifndef PAGEDCY_QUANT_LINEAR_H
#define PAGEDCY_QUANT_LINEAR_H

#include <stdint.h>
#include <string.h>
#include "pagedcy_quant.h"

#define PQL_NR 4      /* weight rows decoded together */
#define PQL_KC 1024   /* elements per chunk (a multiple of every block size) */
#define PQL_MB 32     /* rows of x per pass over a decoded chunk */
#define PQL_LANES 16  /* accumulator slots per output (the widest vector) */
#define PQL_UNROLL _Pragma("GCC unroll 16")
/* Software prefetch: the weight rows PQL_PF_BLOCKS blocks ahead go toward L2
 * while this block decodes (its rows are read in chunk-interleaved order,
 * which the hardware prefetchers follow poorly; cf. pagedcy_gemm.h). */
#define PQL_PF_BLOCKS 4

/* Plain C: 8 lanes per output, multiply then add (no FMA: any CPU). */
static void pql_tile_scalar(int64_t mm, int64_t kn, const float *x, int64_t ldx,
                            const float *const *w, float *acc) {
    for (int64_t i = 0; i < mm; i++)
        for (int j = 0; j < PQL_NR; j++) {
            float *a = acc + (i * PQL_NR + j) * PQL_LANES;
            const float *xi = x + i * ldx, *wj = w[j];
            for (int64_t k = 0; k < kn; k += 8) {
                const int64_t n = kn - k < 8 ? kn - k : 8;
                for (int64_t l = 0; l < n; l++) a[l] += xi[k + l] * wj[k + l];
            }
        }
}

#if PQ_HAVE_SIMD
/* One k step of the MR x PQL_NR tile: MR vectors of x, each decoded row once. */
#define PQL_STEP(VEC, MR, LOAD, FMA) do {                                                     \
        VEC xv_[4];                                                                           \
        PQL_UNROLL for (int i = 0; i < MR; i++) xv_[i] = LOAD(x + i * ldx + k);               \
        PQL_UNROLL for (int j = 0; j < PQL_NR; j++) {                                         \
            const VEC wv_ = LOAD(w[j] + k);                                                   \
            PQL_UNROLL for (int i = 0; i < MR; i++) a[i][j] = FMA(xv_[i], wv_, a[i][j]);      \
        }                                                                                     \
    } while (0)

/* NAME(MR, ...): MR (<= 4) rows of x against the decoded rows, V k at a time, the
 * last step's loads masked (MASK: the mask of its n elements, read by MLOAD as m_);
 * TILE: every row of a chunk in tiles of MRMAX rows. */
#define PQL_KERNEL(NAME, TILE, MRMAX, TARGET, VEC, V, LOADU, STOREU, FMA, MASK_T, MASK, MLOAD)  \
    __attribute__((target(TARGET), always_inline)) static inline void NAME(                   \
        const int MR, int64_t kn, const float *x, int64_t ldx, const float *const *w,         \
        float *acc) {                                                                         \
        VEC a[4][PQL_NR];                                                                     \
        PQL_UNROLL for (int i = 0; i < MR; i++)                                               \
            PQL_UNROLL for (int j = 0; j < PQL_NR; j++)                                       \
                a[i][j] = LOADU(acc + (i * PQL_NR + j) * PQL_LANES);                          \
        int64_t k = 0;                                                                        \
        for (; k + V <= kn; k += V) PQL_STEP(VEC, MR, LOADU, FMA);                            \
        if (k < kn) {                                                                         \
            const MASK_T m_ = MASK(kn - k);                                                   \
            PQL_STEP(VEC, MR, MLOAD, FMA);                                                    \
        }                                                                                     \
        PQL_UNROLL for (int i = 0; i < MR; i++)                                               \
            PQL_UNROLL for (int j = 0; j < PQL_NR; j++)                                       \
                STOREU(acc + (i * PQL_NR + j) * PQL_LANES, a[i][j]);                          \
    }                                                                                         \
    __attribute__((target(TARGET))) static void TILE(int64_t mm, int64_t kn, const float *x,  \
                                                     int64_t ldx, const float *const *w,      \
                                                     float *acc) {                            \
        int64_t i = 0;                                                                        \
        for (; i + MRMAX <= mm; i += MRMAX)                                                   \
            NAME(MRMAX, kn, x + i * ldx, ldx, w, acc + i * PQL_NR * PQL_LANES);               \
        const float *xi = x + i * ldx;                                                        \
        float *ai = acc + i * PQL_NR * PQL_LANES;                                             \
        switch (mm - i) {                                                                     \
            case 3: NAME(3, kn, xi, ldx, w, ai); break;                                       \
            case 2: NAME(2, kn, xi, ldx, w, ai); break;                                       \
            case 1: NAME(1, kn, xi, ldx, w, ai); break;                                       \
            default: break;                                                                   \
        }                                                                                     \
    }

#define PQL_Z_TARGET "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c"
#define PQL_Y_TARGET "avx2,fma,f16c"
__attribute__((target(PQL_Z_TARGET), always_inline)) static inline __mmask16 pql_mask16(int64_t n) {
    return (__mmask16)((1u << n) - 1u);
}
__attribute__((target(PQL_Y_TARGET), always_inline)) static inline __m256i pql_mask8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#define PQL_ZLOAD(p) _mm512_maskz_loadu_ps(m_, p)
#define PQL_YLOAD(p) _mm256_maskload_ps(p, m_)
/* AVX-512: 16 lanes, up to 4 rows of x (16 accumulators of the 32 registers). */
PQL_KERNEL(pql_z, pql_tile_avx512, 4, PQL_Z_TARGET, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
           _mm512_fmadd_ps, __mmask16, pql_mask16, PQL_ZLOAD)
/* AVX2: 8 lanes, up to 3 rows of x (12 accumulators of the 16 registers). */
PQL_KERNEL(pql_y, pql_tile_avx2, 3, PQL_Y_TARGET, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
           _mm256_fmadd_ps, __m256i, pql_mask8, PQL_YLOAD)
#endif

/* The fixed reduction tree of one output's 16 lane slots (unused slots hold 0). */
static inline float pql_hsum(const float *a) {
    float s[8];
    for (int l = 0; l < 8; l++) s[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) s[l] = s[l] + s[l + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
}

/* One row of x (M = 1): the blocks of PQL_NR weight rows at a time are decoded
 * in registers and multiplied into their accumulators (pq_rowdot), no scratch;
 * the same steps, so the same bits, as the tiles. The rows PQL_PF_ROWS ahead
 * go toward L2. */
#define PQL_PF_ROWS 16
static void pql_gemv(pq_row_dot_fn dot, int64_t n0, int64_t n1, int64_t K, const float *x,
                     const uint8_t *W, int64_t row_bytes, float *out) {
    for (int64_t nb = n0; nb < n1; nb += PQL_NR) {
        const int nr = n1 - nb < PQL_NR ? (int)(n1 - nb) : PQL_NR;
        if (nb + PQL_PF_ROWS < n1) {
            const int64_t end = nb + PQL_PF_ROWS + PQL_NR < n1 ? nb + PQL_PF_ROWS + PQL_NR : n1;
            const char *pf = (const char *)(W + (nb + PQL_PF_ROWS) * row_bytes);
            for (int64_t p = 0; p < (end - nb - PQL_PF_ROWS) * row_bytes; p += 64) __builtin_prefetch(pf + p, 0, 2);
        }
        const uint8_t *rows[PQL_NR];
        for (int j = 0; j < PQL_NR; j++) rows[j] = W + (nb + (j < nr ? j : 0)) * row_bytes;
        float acc[PQL_NR * PQL_LANES] __attribute__((aligned(64))) = {0};
        dot(rows, K, x, acc);
        for (int j = 0; j < nr; j++) out[nb + j] = pql_hsum(acc + j * PQL_LANES);
    }
}

/* Columns [n0, n1) of out = x @ W^T on the calling thread: x float32 [M, K]
 * (rows ldx apart), W rows of row_bytes bytes of GGML type ggml_type (K a
 * multiple of its block; the type one pagedcy_quant_rowfmt knows), out rows
 * ldo apart; simd: a PAGEDCY_SIMD_* cap. */
static void pagedcy_quant_linear_rows(int ggml_type, int simd, int64_t M, int64_t n0,
                                      int64_t n1, int64_t K, const float *x, int64_t ldx,
                                      const uint8_t *W, int64_t row_bytes, float *out, int64_t ldo) {
    const pagedcy_rowfmt *fmt = pagedcy_quant_rowfmt(ggml_type, simd);
    const pq_row_dot_fn dot = M == 1 ? pq_rowdot(ggml_type, simd) : NULL;
    if (!fmt) return;
    if (dot) { pql_gemv(dot, n0, n1, K, x, W, row_bytes, out); return; }
    /* rows past nr (the last block's) repeat row 0: computed, never stored */
    float scratch[PQL_NR * PQL_KC] __attribute__((aligned(64)));
    float acc[PQL_MB * PQL_NR * PQL_LANES] __attribute__((aligned(64)));
    const int level = pagedcy_quant_level(simd);
    for (int64_t nb = n0; nb < n1; nb += PQL_NR) {
        const int nr = n1 - nb < PQL_NR ? (int)(n1 - nb) : PQL_NR;
        const float *w[PQL_NR];
        /* F32 rows are used in place (no decode) */
        const int direct = fmt->block == 1 && fmt->block_bytes == 4;
        const char *pf = NULL, *pf_end = NULL;
        const int64_t ahead = nb + PQL_PF_BLOCKS * PQL_NR;
        if (ahead < n1) {
            pf = (const char *)(W + ahead * row_bytes);
            pf_end = (const char *)(W + (ahead + PQL_NR < n1 ? ahead + PQL_NR : n1) * row_bytes);
        }
        const int64_t nchunks = (K + PQL_KC - 1) / PQL_KC;
        const int64_t pf_step = ((pf_end - pf + nchunks - 1) / nchunks + 63) & ~(int64_t)63;
        for (int64_t mb = 0; mb < M; mb += PQL_MB) {
            const int64_t mm = M - mb < PQL_MB ? M - mb : PQL_MB;
            const float *xb = x + mb * ldx;
            memset(acc, 0, sizeof(float) * (size_t)(mm * PQL_NR * PQL_LANES));
            for (int64_t kc = 0; kc < K; kc += PQL_KC) {
                const int64_t kn = K - kc < PQL_KC ? K - kc : PQL_KC;
                for (int64_t p = 0; pf && mb == 0 && p < pf_step && pf + p < pf_end; p += 64)
                    __builtin_prefetch(pf + p, 0, 2);
                if (pf && mb == 0) pf += pf_step;
                for (int j = 0; j < PQL_NR; j++) {
                    const int64_t r = nb + (j < nr ? j : 0);
                    if (direct) w[j] = (const float *)(W + r * row_bytes) + kc;
                    else {
                        w[j] = scratch + (j < nr ? j : 0) * PQL_KC;
                        if (j < nr) fmt->decode(W + r * row_bytes, kc, kn, scratch + j * PQL_KC);
                    }
                }
#if PQ_HAVE_SIMD
                if (level == PAGEDCY_SIMD_AVX512) pql_tile_avx512(mm, kn, xb + kc, ldx, w, acc);
                else if (level == PAGEDCY_SIMD_AVX2) pql_tile_avx2(mm, kn, xb + kc, ldx, w, acc);
                else
#endif
                pql_tile_scalar(mm, kn, xb + kc, ldx, w, acc);
            }
            for (int64_t i = 0; i < mm; i++)
                for (int j = 0; j < nr; j++)
                    out[(mb + i) * ldo + nb + j] = pql_hsum(acc + (i * PQL_NR + j) * PQL_LANES);
        }
    }
    (void)level;
}

#endif
