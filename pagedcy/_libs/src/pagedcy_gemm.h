/* Float32 GEMM with a row-major weight: C[M, N] = A[M, K] @ W[N, K]^T, for
 * the few rows of a decode step as for a prefill's thousands (W as
 * checkpoints store a projection, output-major).
 *
 * Why not BLAS: for M up to a few dozen rows OpenBLAS repacks the whole of W
 * on every call, and its small-M paths leave most of the FMA rate unused: a
 * decode step of the engine benchmark's model ran its projections at 75
 * GFLOP/s with 16 rows, against ~200 for large M, on the 2-core EPYC. For
 * large M this kernel matches it (pagedcy._libs._gemm says why it serves
 * there too).
 *
 * Here every output is a dot product of a row of A with a row of W, so W is
 * read front to back, once per block of NB of its rows, in long sequential
 * runs the hardware prefetchers follow from DRAM; the block (NB x K floats)
 * then stays in L1/L2 while each block of MR rows of A passes over it. The
 * MR x NB accumulators hold 16 (AVX-512) or 8 (AVX2) partial sums each, kept
 * in registers over all of K and reduced once at the end, eight outputs of a
 * row at a time, so one reduction serves K/16 fused multiply-adds.
 *
 * The caller splits W's rows between threads (pagedcy_gemm_nt_rows takes a
 * row range). The summation order depends only on K and the instruction set,
 * so a row of C does not depend on M, the thread split or its row block.
 */
#ifndef PAGEDCY_GEMM_H
#define PAGEDCY_GEMM_H

#include <stdint.h>
#include "pagedcy_convert.h"

/* Software prefetch of W: blocks ahead and locality (2: prefetcht1, into L2).
 * 4-8 blocks ahead into L2 beat 1 block into L1 by ~1.3x on the decode step's
 * GEMMs (1 thread, 16 rows, EPYC Zen 4); further ahead gained nothing. */
#define PG_PF_BLOCKS 4
#define PG_PF_LOC 2
static inline int pg_min(int a, int b) { return a < b ? a : b; }

/* Plain C, for CPUs without AVX2 (and as the tests' third path). */
static void pg_tile_scalar(int mr, int nb, int K, const float *A, int64_t lda, const float *W,
                           int64_t ldw, float *C, int64_t ldc) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nb; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += A[i * lda + k] * W[j * ldw + k];
            C[i * ldc + j] = s;
        }
}

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
#define PG_HAVE_SIMD 1
/* The accumulators only stay in registers once every loop over them is
 * unrolled (without this GCC 12 kept them on the stack: 4x slower). */
#define PG_UNROLL _Pragma("GCC unroll 16")
#define PG_AVX512_INLINE __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"), \
                                        always_inline)) static inline
#define PG_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))
#define PG_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline
#define PG_AVX2 __attribute__((target("avx2,fma")))

/* The next pf_step bytes at *pf toward L2 (nothing when *pf is NULL). */
static inline __attribute__((always_inline)) void pg_prefetch(const char **pf, int64_t pf_step) {
    if (!*pf) return;
    for (int64_t p = 0; p < pf_step; p += 64) __builtin_prefetch(*pf + p, 0, PG_PF_LOC);
    *pf += pf_step;
}

/* Eight 8-float vectors -> one whose element j is the sum of v[j]. */
PG_AVX2_INLINE __m256 pg_hsum8x8(const __m256 *v) {
    const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
    /* b0 = [s0 s1 s2 s3 | s0' s1' s2' s3'] (low and high 128-bit halves) */
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

PG_AVX2_INLINE __m256i pg_mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* MR rows of A against NB (<= 8) rows of W, 16 k at a time. */
PG_AVX512_INLINE void pg_tile_z(int K, const float *A, int64_t lda, const float *W, int64_t ldw,
                                float *C, int64_t ldc, const char *pf, int64_t pf_step, const int MR,
                                const int NB) {
    __m512 c[4][8];
    PG_UNROLL
    for (int i = 0; i < MR; i++)
        PG_UNROLL
        for (int j = 0; j < NB; j++) c[i][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        pg_prefetch(&pf, pf_step);
        __m512 a[4];
        PG_UNROLL
        for (int i = 0; i < MR; i++) a[i] = _mm512_loadu_ps(A + i * lda + k);
        PG_UNROLL
        for (int j = 0; j < NB; j++) {
            const __m512 w = _mm512_loadu_ps(W + j * ldw + k);
            PG_UNROLL
            for (int i = 0; i < MR; i++) c[i][j] = _mm512_fmadd_ps(a[i], w, c[i][j]);
        }
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 a[4];
        PG_UNROLL
        for (int i = 0; i < MR; i++) a[i] = _mm512_maskz_loadu_ps(m, A + i * lda + k);
        PG_UNROLL
        for (int j = 0; j < NB; j++) {
            const __m512 w = _mm512_maskz_loadu_ps(m, W + j * ldw + k);
            PG_UNROLL
            for (int i = 0; i < MR; i++) c[i][j] = _mm512_fmadd_ps(a[i], w, c[i][j]);
        }
    }
    PG_UNROLL
    for (int i = 0; i < MR; i++) {
        __m256 h[8];
        PG_UNROLL
        for (int j = 0; j < 8; j++)
            h[j] = j < NB ? _mm256_add_ps(_mm512_castps512_ps256(c[i][j]), _mm512_extractf32x8_ps(c[i][j], 1))
                          : _mm256_setzero_ps();
        const __m256 s = pg_hsum8x8(h);
        if (NB == 8) _mm256_storeu_ps(C + i * ldc, s);
        else _mm256_maskstore_ps(C + i * ldc, pg_mask8(NB), s);
    }
}

#define PG_Z_CASE(MR_, NB_) \
    case (MR_) * 16 + (NB_): pg_tile_z(K, A, lda, W, ldw, C, ldc, pf, pf_step, MR_, NB_); break;
#define PG_Z_ROW(MR_) PG_Z_CASE(MR_, 1) PG_Z_CASE(MR_, 2) PG_Z_CASE(MR_, 3) PG_Z_CASE(MR_, 4) \
                      PG_Z_CASE(MR_, 5) PG_Z_CASE(MR_, 6) PG_Z_CASE(MR_, 7) PG_Z_CASE(MR_, 8)

PG_AVX512 static void pg_tile_avx512(int mr, int nb, int K, const float *A, int64_t lda, const float *W,
                                     int64_t ldw, float *C, int64_t ldc, const char *pf, int64_t pf_step) {
    switch (mr * 16 + nb) {
        PG_Z_ROW(1) PG_Z_ROW(2) PG_Z_ROW(3) PG_Z_ROW(4)
        default: break;
    }
}

/* AVX2: 16 registers, so MR x NB <= 3 x 4 accumulators of 8 floats. */
PG_AVX2_INLINE void pg_tile_y(int K, const float *A, int64_t lda, const float *W, int64_t ldw,
                              float *C, int64_t ldc, const char *pf, int64_t pf_step, const int MR,
                              const int NB) {
    __m256 c[3][4];
    PG_UNROLL
    for (int i = 0; i < MR; i++)
        PG_UNROLL
        for (int j = 0; j < NB; j++) c[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k < K; k += 8) {
        pg_prefetch(&pf, pf_step);
        const int full = k + 8 <= K;
        const __m256i m = pg_mask8(K - k);
        __m256 a[3];
        PG_UNROLL
        for (int i = 0; i < MR; i++)
            a[i] = full ? _mm256_loadu_ps(A + i * lda + k) : _mm256_maskload_ps(A + i * lda + k, m);
        PG_UNROLL
        for (int j = 0; j < NB; j++) {
            const __m256 w = full ? _mm256_loadu_ps(W + j * ldw + k) : _mm256_maskload_ps(W + j * ldw + k, m);
            PG_UNROLL
            for (int i = 0; i < MR; i++) c[i][j] = _mm256_fmadd_ps(a[i], w, c[i][j]);
        }
    }
    PG_UNROLL
    for (int i = 0; i < MR; i++) {
        __m256 h[8];
        PG_UNROLL
        for (int j = 0; j < 8; j++) h[j] = j < NB ? c[i][j] : _mm256_setzero_ps();
        _mm256_maskstore_ps(C + i * ldc, pg_mask8(NB), pg_hsum8x8(h));
    }
}

#define PG_Y_CASE(MR_, NB_) \
    case (MR_) * 16 + (NB_): pg_tile_y(K, A, lda, W, ldw, C, ldc, pf, pf_step, MR_, NB_); break;
#define PG_Y_ROW(MR_) PG_Y_CASE(MR_, 1) PG_Y_CASE(MR_, 2) PG_Y_CASE(MR_, 3) PG_Y_CASE(MR_, 4)

PG_AVX2 static void pg_tile_avx2(int mr, int nb, int K, const float *A, int64_t lda, const float *W,
                                 int64_t ldw, float *C, int64_t ldc, const char *pf, int64_t pf_step) {
    switch (mr * 16 + nb) {
        PG_Y_ROW(1) PG_Y_ROW(2) PG_Y_ROW(3)
        default: break;
    }
}
#else
#define PG_HAVE_SIMD 0
#endif

/* Columns [n0, n1) of C = A @ W^T (every row of A; rows [n0, n1) of W), on
 * the calling thread. simd: a PAGEDCY_SIMD_* cap; the CPU and the build may
 * lower it. */
static void pg_gemm_nt_chunk(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                             const float *W, int64_t ldw, float *C, int64_t ldc) {
    int level = 0, nb_max = 8, mr_max = 3;
#if PG_HAVE_SIMD
    if (simd >= PAGEDCY_SIMD_AVX512 && pagedcy_cpu_has_avx512()) {
        /* 4 x 6 accumulators (24 of the 32 registers) ran at ~95% of the FMA peak
         * with the block in cache, against ~60% for 3 x 8; up to 3 rows, wider blocks
         * of W keep more of it streaming at once (a GEMV is bound by memory). */
        level = 2;
        if (M > 3) { nb_max = 6; mr_max = 4; }
    }
    else if (simd >= PAGEDCY_SIMD_AVX2 && pagedcy_cpu_has_avx2_fma()) { level = 1; nb_max = 4; mr_max = 3; }
#else
    (void)simd;
#endif
    const int nblk = (M + mr_max - 1) / mr_max;           /* row blocks of near-equal size */
    for (int n = n0; n < n1; n += nb_max) {
        const int nb = pg_min(nb_max, n1 - n);
        const float *w = W + (int64_t)n * ldw;
        for (int bi = 0, m = 0; bi < nblk; bi++) {
            const int mr = (M - m + (nblk - bi) - 1) / (nblk - bi);
            const float *a = A + (int64_t)m * lda;
            float *c = C + (int64_t)m * ldc + n;
#if PG_HAVE_SIMD
            /* The first row block pulls the block of W PG_PF_BLOCKS ahead (contiguous
             * when ldw == K) toward L2, a few lines per k step: a block is only NB short
             * runs, too short for the hardware prefetchers to ramp up on. */
            const char *pf = NULL;
            int64_t pf_step = 0;
            const int ahead = n + PG_PF_BLOCKS * nb_max;
            if (bi == 0 && ahead < n1 && ldw == K) {
                const int vw = level == 2 ? 16 : 8;
                pf = (const char *)(W + (int64_t)ahead * ldw);
                pf_step = ((int64_t)pg_min(nb_max, n1 - ahead) * K * 4 / ((K + vw - 1) / vw) + 63) & ~63;
            }
            if (level == 2) pg_tile_avx512(mr, nb, K, a, lda, w, ldw, c, ldc, pf, pf_step);
            else if (level == 1) pg_tile_avx2(mr, nb, K, a, lda, w, ldw, c, ldc, pf, pf_step);
            else
#endif
            pg_tile_scalar(mr, nb, K, a, lda, w, ldw, c, ldc);
            m += mr;
        }
    }
}

/* Columns [n0, n1) of C = A @ W^T (every row of A; rows [n0, n1) of W), on
 * the calling thread. simd: a PAGEDCY_SIMD_* cap; the CPU and the build may
 * lower it. Rows of A go in chunks of ~PG_A_CHUNK_BYTES, so a chunk stays in
 * L2 while the thread's part of W streams past it once per chunk (from L3
 * after the first): without chunks a prefill's 2048 rows were re-read from
 * memory for every block of W. */
#define PG_A_CHUNK_BYTES (256 * 1024)
static void pagedcy_gemm_nt_rows(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                                 const float *W, int64_t ldw, float *C, int64_t ldc) {
    int mc = (int)(PG_A_CHUNK_BYTES / ((int64_t)4 * (K > 0 ? K : 1))) & ~3;
    if (mc < 4) mc = 4;
    for (int m0 = 0; m0 < M; m0 += mc)
        pg_gemm_nt_chunk(simd, pg_min(mc, M - m0), n0, n1, K, A + (int64_t)m0 * lda, lda, W, ldw,
                         C + (int64_t)m0 * ldc, ldc);
}

#endif
