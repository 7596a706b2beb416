/* GEMM with a row-major weight: C[M, N] = A[M, K] @ W[N, K]^T, for the few
 * rows of a decode step as for a prefill's thousands (W as checkpoints store a
 * projection, output-major), W in any row format (pagedcy_rowfmt.h: float32,
 * float16, bfloat16 here, block formats elsewhere): pagedcy_gemm_rows_fmt.
 *
 * Two paths, one summation order. Few rows (M < PG_PACK_MIN_M): every output is
 * a dot product of a row of A with a row of W, so W is read front to back, once
 * per block of NB of its rows and K block, in long sequential runs the hardware
 * prefetchers follow from DRAM (OpenBLAS repacks all of W per call and leaves
 * most of the FMA rate unused there). The MR x NB accumulators hold 16 (AVX-512)
 * or 8 (AVX2) lanes of partial sums each, reduced by a fixed tree (pg_hsum8x8)
 * at the end of each K block. f16 / bf16 weights are widened in registers, and
 * GGUF block formats decoded in registers (pagedcy_gemm_qtile.h: tiles of the same
 * lanes and tree), so a decode step reads W once, as stored. Many rows:
 * pagedcy_gemm_pack.h packs W and A for a
 * BLIS-style register-blocked micro-kernel that computes the very same lane sums
 * and tree, so both paths give the same bits.
 *
 * The caller splits W's rows between threads (a row range per call). The
 * summation order depends only on K and the instruction set, so a row of C does
 * not depend on M, the thread split, its row block or the path.
 */
#ifndef PAGEDCY_GEMM_H
#define PAGEDCY_GEMM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pagedcy_convert.h"
#include "pagedcy_gemm_fmt.h"

/* Software prefetch of W: blocks ahead and locality (2: prefetcht1, into L2).
 * 4-8 blocks ahead into L2 beat 1 block into L1 by ~1.3x on the decode step's
 * GEMMs (1 thread, 16 rows, EPYC Zen 4); further ahead gained nothing. */
#ifndef PG_PF_BLOCKS
#define PG_PF_BLOCKS 4
#endif
#ifndef PG_PF_LOC
#define PG_PF_LOC 2
#endif
/* ... but at most this many bytes ahead (at least one block): a block of 8 long rows is
 * 45-512 KiB (K = 1408-16384 float32), and 4 of them ahead were evicted from L2 before
 * use or crowded it (AMD EPYC Zen 5, 2 threads, one row of A: K = 16384 31.0 -> 34.7 GB/s,
 * K = 4096 37.1 -> 40.4, K = 1408 +4%, in-process A/B against 4 blocks). */
#ifndef PG_PF_BYTES
#define PG_PF_BYTES (64 * 1024)
#endif
/* Blocks of nb rows of wrb bytes to prefetch ahead: PG_PF_BLOCKS, capped by PG_PF_BYTES. */
static inline int pg_pf_blocks(int nb, int64_t wrb) {
    const int64_t b = PG_PF_BYTES / ((int64_t)nb * wrb);
    return b < 1 ? 1 : b > PG_PF_BLOCKS ? PG_PF_BLOCKS : (int)b;
}
static inline int pg_min(int a, int b) { return a < b ? a : b; }

/* Plain C, for CPUs without AVX2 (and as the tests' third path). */
static void pg_tile_scalar(int mr, int nb, int K, const float *A, int64_t lda, const float *W,
                           int64_t ldw, float *C, int64_t ldc, int first) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nb; j++) {
            float s = first ? 0.0f : C[i * ldc + j];   /* one sequential sum over all of K */
            for (int k = 0; k < K; k++) s += A[i * lda + k] * W[j * ldw + k];
            C[i * ldc + j] = s;
        }
}

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
#define PG_HAVE_SIMD 1
/* The accumulators only stay in registers once every loop over them is
 * unrolled (without this GCC 12 kept them on the stack: 4x slower). */
#define PG_UNROLL _Pragma("GCC unroll 16")
#define PG_AVX512_INLINE __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c"), \
                                        always_inline)) static inline
#define PG_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c")))
#define PG_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define PG_AVX2 __attribute__((target("avx2,fma,f16c")))

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

/* c[0 .. n) = s (the first K block) or c + s (the later ones): every path adds a
 * K block's sum to the row's running sum this way, so they agree bit for bit. */
PG_AVX2_INLINE void pg_store_sum(float *c, __m256 s, int first, int n) {
    if (n == 8) {
        _mm256_storeu_ps(c, first ? s : _mm256_add_ps(_mm256_loadu_ps(c), s));
    } else {
        const __m256i m = pg_mask8(n);
        _mm256_maskstore_ps(c, m, first ? s : _mm256_add_ps(_mm256_maskload_ps(c, m), s));
    }
}

/* MR rows of A against NB (<= 8) rows of W, 16 k at a time. */
/* Weights in the streaming tiles: FMT 0 float32, 1 float16, 2 bfloat16 (bits), widened
 * in registers (a decode step reads half the bytes of float32). Index idx in elements. */
PG_AVX512_INLINE __m512 pg_wload_z(const void *W, int64_t idx, __mmask16 m, int full, const int FMT) {
    if (FMT == 0) return full ? _mm512_loadu_ps((const float *)W + idx) : _mm512_maskz_loadu_ps(m, (const float *)W + idx);
    const uint16_t *p = (const uint16_t *)W + idx;
    const __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    if (FMT == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* f16 (FMT 1) or bf16 (FMT 2) elements [idx, idx + min(n, 8)), widened (zeros past n). */
PG_AVX2_INLINE __m256 pg_wload_y(const void *W, int64_t idx, int n, const int FMT) {
    const uint16_t *p = (const uint16_t *)W + idx;
    __m128i h;
    if (n >= 8) h = _mm_loadu_si128((const __m128i *)p);
    else {                      /* AVX2 has no 16-bit masked load: the K tail via a copy */
        uint16_t t[8] = {0};
        memcpy(t, p, (size_t)n * 2);
        h = _mm_loadu_si128((const __m128i *)t);
    }
    if (FMT == 1) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

PG_AVX512_INLINE void pg_tile_z(int K, const float *A, int64_t lda, const void *W, int64_t ldw,
                                float *C, int64_t ldc, const char *pf, int64_t pf_step, int first,
                                const int FMT, const int MR, const int NB) {
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
            const __m512 w = pg_wload_z(W, j * ldw + k, 0, 1, FMT);
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
            const __m512 w = pg_wload_z(W, j * ldw + k, m, 0, FMT);
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
        pg_store_sum(C + i * ldc, pg_hsum8x8(h), first, NB);
    }
}

#define PG_Z_CASE(F_, MR_, NB_) \
    case (F_) * 256 + (MR_) * 16 + (NB_): pg_tile_z(K, A, lda, W, ldw, C, ldc, pf, pf_step, first, F_, MR_, NB_); break;
#define PG_Z_ROW(F_, MR_) PG_Z_CASE(F_, MR_, 1) PG_Z_CASE(F_, MR_, 2) PG_Z_CASE(F_, MR_, 3) PG_Z_CASE(F_, MR_, 4) \
                          PG_Z_CASE(F_, MR_, 5) PG_Z_CASE(F_, MR_, 6) PG_Z_CASE(F_, MR_, 7) PG_Z_CASE(F_, MR_, 8)
#define PG_Z_FMT(F_) PG_Z_ROW(F_, 1) PG_Z_ROW(F_, 2) PG_Z_ROW(F_, 3) PG_Z_ROW(F_, 4)

/* ldw in elements of the format fmt (0 f32, 1 f16, 2 bf16). */
PG_AVX512 static void pg_tile_avx512(int mr, int nb, int K, const float *A, int64_t lda, const void *W,
                                     int64_t ldw, float *C, int64_t ldc, const char *pf, int64_t pf_step,
                                     int first, int fmt) {
    switch (fmt * 256 + mr * 16 + nb) {
        PG_Z_FMT(0) PG_Z_FMT(1) PG_Z_FMT(2)
        default: break;
    }
}

/* AVX2: 16 registers, so MR x NB <= 3 x 4 accumulators of 8 floats. */
PG_AVX2_INLINE void pg_tile_y(int K, const float *A, int64_t lda, const void *W, int64_t ldw,
                              float *C, int64_t ldc, const char *pf, int64_t pf_step, int first,
                              const int FMT, const int MR, const int NB) {
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
            const float *wf = (const float *)W + j * ldw + k;
            const __m256 w = FMT != 0 ? pg_wload_y(W, j * ldw + k, full ? 8 : K - k, FMT)
                           : full ? _mm256_loadu_ps(wf) : _mm256_maskload_ps(wf, m);
            PG_UNROLL
            for (int i = 0; i < MR; i++) c[i][j] = _mm256_fmadd_ps(a[i], w, c[i][j]);
        }
    }
    PG_UNROLL
    for (int i = 0; i < MR; i++) {
        __m256 h[8];
        PG_UNROLL
        for (int j = 0; j < 8; j++) h[j] = j < NB ? c[i][j] : _mm256_setzero_ps();
        pg_store_sum(C + i * ldc, pg_hsum8x8(h), first, NB);
    }
}

#define PG_Y_CASE(F_, MR_, NB_) \
    case (F_) * 256 + (MR_) * 16 + (NB_): pg_tile_y(K, A, lda, W, ldw, C, ldc, pf, pf_step, first, F_, MR_, NB_); break;
#define PG_Y_ROW(F_, MR_) PG_Y_CASE(F_, MR_, 1) PG_Y_CASE(F_, MR_, 2) PG_Y_CASE(F_, MR_, 3) PG_Y_CASE(F_, MR_, 4)
#define PG_Y_FMT(F_) PG_Y_ROW(F_, 1) PG_Y_ROW(F_, 2) PG_Y_ROW(F_, 3)

PG_AVX2 static void pg_tile_avx2(int mr, int nb, int K, const float *A, int64_t lda, const void *W,
                                 int64_t ldw, float *C, int64_t ldc, const char *pf, int64_t pf_step,
                                 int first, int fmt) {
    switch (fmt * 256 + mr * 16 + nb) {
        PG_Y_FMT(0) PG_Y_FMT(1) PG_Y_FMT(2)
        default: break;
    }
}
#include "pagedcy_gemm_pack.h"
#include "pagedcy_gemm_qtile.h"
#else
#define PG_HAVE_SIMD 0
#endif

/* K block: every path sums an output block by block, kc = PG_KC elements at a
 * time (the last block shorter), adding each block's sum to the running sum of
 * the row (first block: the sum itself). Fixed here, not tuned per machine,
 * because it is part of the summation order; a multiple of every block format's
 * block (GGUF's largest is 256), so block decoders can decode K block by K block. */
#define PG_KC 512
/* Rows of A from which the packed path beats streaming W once per row block
 * (measured on the 2 MiB-L2 Xeon, 1 thread: at 32 rows streaming ran ~1.1x
 * (AVX2) to ~1.3x (AVX-512) faster, at 48 to 64 they were even, at 128 packing
 * won by 1.25x). Both give the same bits, so this only moves the speed. */
#define PG_PACK_MIN_M 48

#if PG_HAVE_SIMD
#define PG_QTILE_MAX_M 3
/* Streaming path for a block format F the tiles decode in registers (pagedcy_gemm_qtile.h):
 * the loops of pg_gemm_stream, no scratch. Blocks of 8 rows of W (4 on AVX2 for more than
 * one row of A: 16 registers), row blocks of up to 3 rows of A. */
static void pg_gemm_stream_q(int level, int M, int n0, int n1, int K, const float *A, int64_t lda,
                             const void *W, int64_t wrb, int F, float *C, int64_t ldc) {
    const int mr_max = 3, nb_max = level == 1 && M > 1 ? 4 : 8;
    const int QK = pg_q_qk(F), BYTES = pg_q_bytes(F);
    const int nblk = (M + mr_max - 1) / mr_max;
    const int nkb = (K + PG_KC - 1) / PG_KC, pf_blocks = pg_pf_blocks(nb_max, wrb);
    for (int n = n0; n < n1; n += nb_max) {
        const int nb = pg_min(nb_max, n1 - n);
        const uint8_t *wrow = (const uint8_t *)W + (int64_t)n * wrb;
        const int ahead = n + pf_blocks * nb_max;
        const int64_t ahead_bytes = ahead < n1 ? (int64_t)pg_min(nb_max, n1 - ahead) * wrb : 0;
        for (int kb = 0; kb < nkb; kb++) {
            const int k0 = kb * PG_KC, kc = pg_min(PG_KC, K - k0), nq = kc / QK;
            const uint8_t *w = wrow + (int64_t)(k0 / QK) * BYTES;
            const char *pf = ahead_bytes ? (const char *)W + (int64_t)ahead * wrb + ahead_bytes * kb / nkb : NULL;
            const int64_t pf_len = ahead_bytes ? ahead_bytes * (kb + 1) / nkb - ahead_bytes * kb / nkb : 0;
            const int64_t pf_step = pf ? (pf_len / nq + 63) & ~63 : 0;
            for (int bi = 0, m = 0; bi < nblk; bi++) {
                const int mr = (M - m + (nblk - bi) - 1) / (nblk - bi);
                const float *a = A + (int64_t)m * lda + k0;
                float *c = C + (int64_t)m * ldc + n;
                const char *p = bi == 0 ? pf : NULL;
                if (level == 2) pg_qtile_avx512(F, mr, nq, nb, a, lda, w, wrb, c, ldc, p, pf_step, kb == 0);
                else pg_qtile_avx2(F, mr, nb_max, nq, nb, a, lda, w, wrb, c, ldc, p, pf_step, kb == 0);
                m += mr;
            }
        }
    }
}
#endif

/* Streaming path: columns [n0, n1) of C for few rows of A. W goes by once per
 * block of nb_max rows and K block; each block is then in L1 while every row
 * block of A passes over it. f32 rows are read in place, f16 / bf16 widened in
 * the tiles; other formats without register tiles (and every non-f32 format on
 * the scalar level) are decoded into scratch (nb_max x PG_KC floats). */
static void pg_gemm_stream(int level, int M, int n0, int n1, int K, const float *A, int64_t lda,
                           const void *W, int64_t wrb, const pagedcy_rowfmt *fmt, float *C, int64_t ldc,
                           float *scratch) {
    int nb_max = 8, mr_max = 3;
#if PG_HAVE_SIMD
    if (level == 2 && M > 3) { nb_max = 6; mr_max = 4; }
    /* 4 x 6 accumulators (24 of the 32 registers) ran at ~95% of the FMA peak
     * with the block in cache, against ~60% for 3 x 8; up to 3 rows, wider blocks
     * of W keep more of it streaming at once (a GEMV is bound by memory). */
    else if (level == 1) nb_max = 4;
#endif
    /* Formats the tiles widen in registers: f32 (read in place), f16, bf16 (the
     * latter two only with SIMD); any other is decoded into scratch first. */
    const int wfmt = pagedcy_rowfmt_is_f32(fmt) ? 0 : !level ? -1 : fmt->decode == pagedcy_decode_f16 ? 1
                   : fmt->decode == pagedcy_decode_bf16 ? 2 : -1;
    const int64_t ldw_in = wfmt == 0 ? wrb / 4 : wrb / 2;
    const int nblk = (M + mr_max - 1) / mr_max;           /* row blocks of near-equal size */
    const int nkb = (K + PG_KC - 1) / PG_KC, pf_blocks = pg_pf_blocks(nb_max, wrb);
    for (int n = n0; n < n1; n += nb_max) {
        const int nb = pg_min(nb_max, n1 - n);
        const char *wrow = (const char *)W + (int64_t)n * wrb;
        /* The block of W pf_blocks ahead goes toward L2 (its rows are contiguous),
         * a share per K block: a block is only NB short runs, too short for the
         * hardware prefetchers to ramp up on. */
        const int ahead = n + pf_blocks * nb_max;
        const int64_t ahead_bytes = ahead < n1 ? (int64_t)pg_min(nb_max, n1 - ahead) * wrb : 0;
        for (int kb = 0; kb < nkb; kb++) {
            const int k0 = kb * PG_KC, kc = pg_min(PG_KC, K - k0);
            const void *w = wfmt == 0 ? (const void *)((const float *)wrow + k0)
                                       : (const void *)((const uint16_t *)wrow + k0);
            int64_t ldw = ldw_in;
            int tf = wfmt;
            const char *pf = ahead_bytes ? (const char *)W + (int64_t)ahead * wrb + ahead_bytes * kb / nkb : NULL;
            const int64_t pf_len = ahead_bytes ? ahead_bytes * (kb + 1) / nkb - ahead_bytes * kb / nkb : 0;
            if (wfmt < 0) {
                tf = 0;
                for (int64_t p = 0; pf && p < pf_len; p += 64) __builtin_prefetch(pf + p, 0, PG_PF_LOC);
                pf = NULL;
                for (int j = 0; j < nb; j++) fmt->decode(wrow + j * wrb, k0, kc, scratch + (int64_t)j * PG_KC);
                w = scratch;
                ldw = PG_KC;
            }
            for (int bi = 0, m = 0; bi < nblk; bi++) {
                const int mr = (M - m + (nblk - bi) - 1) / (nblk - bi);
                const float *a = A + (int64_t)m * lda + k0;
                float *c = C + (int64_t)m * ldc + n;
#if PG_HAVE_SIMD
                /* Each row block prefetches its share of the block ahead: issued all by
                 * the first one, 16 rows of A had 12 KiB of prefetches in a quarter of the
                 * block's time and ran at half the single row's bandwidth. */
                const int64_t p0 = pf_len * bi / nblk, p1 = pf_len * (bi + 1) / nblk;
                const char *p = pf && p1 > p0 ? pf + p0 : NULL;
                const int vw = level == 2 ? 16 : 8;
                const int64_t pf_step = p ? ((p1 - p0) / ((kc + vw - 1) / vw) + 63) & ~63 : 0;
                if (level == 2) pg_tile_avx512(mr, nb, kc, a, lda, w, ldw, c, ldc, p, pf_step, kb == 0, tf);
                else if (level == 1) pg_tile_avx2(mr, nb, kc, a, lda, w, ldw, c, ldc, p, pf_step, kb == 0, tf);
                else
#endif
                pg_tile_scalar(mr, nb, kc, a, lda, (const float *)w, ldw, c, ldc, kb == 0);
                m += mr;
            }
        }
    }
}

/* Columns [n0, n1) of C[M, N] = A[M, K] @ W^T, on the calling thread, for a
 * weight W of N rows stored in any row format: row n starts w_row_bytes * n
 * bytes into W and fmt->decode widens a range of it to float32 (the format's
 * block must divide PG_KC: ranges start at multiples of PG_KC). The entry
 * point for every weight format: a format supplies its decoder; with few rows
 * the GGUF block formats (fmt->qtile) are decoded in registers by the streaming
 * tiles (AVX2 / AVX-512), others decode nb rows of a K block into an L1 scratch
 * for them; with many rows the packer calls the decoder.
 *
 * simd: a PAGEDCY_SIMD_* cap; the CPU and the build may lower it. For a given
 * level the result does not depend on M, on [n0, n1) or on the path taken (few
 * rows stream W, many rows pack it): every output is summed in the same order,
 * which depends on K and the level only. The result equals the float32 GEMM on
 * the decoded weight bit for bit.
 *
 * Returns 0; -1 when out of memory; -2 when fmt's block does not divide PG_KC. */
static int pagedcy_gemm_rows_fmt(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                                 const void *W, int64_t w_row_bytes, const pagedcy_rowfmt *fmt, float *C,
                                 int64_t ldc) {
    if (fmt->block < 1 || PG_KC % fmt->block) return -2;
    if (M <= 0 || n1 <= n0) return 0;
    if (K <= 0) {
        for (int i = 0; i < M; i++) memset(C + (int64_t)i * ldc + n0, 0, (size_t)(n1 - n0) * sizeof(float));
        return 0;
    }
    int level = 0;
#if PG_HAVE_SIMD
    if (simd >= PAGEDCY_SIMD_AVX512 && pagedcy_cpu_has_avx512()) level = 2;
    else if (simd >= PAGEDCY_SIMD_AVX2 && pagedcy_cpu_has_avx2_fma()) level = 1;
    if (level && M >= PG_PACK_MIN_M)
        return pg_gemm_packed(level, PG_KC, M, n0, n1, K, A, lda, W, w_row_bytes, fmt, C, ldc);
#else
    (void)simd;
#endif
#if PG_HAVE_SIMD
    /* Register decode for one row block of A (up to 3 rows: a decode step's few sequences);
     * more rows would decode every weight once per row block, so they decode it once into
     * the scratch instead (M = 16, Q4_K: ~10x the rate). Same bits either way. */
    if (level && pg_qtile_type(fmt->qtile) && M <= PG_QTILE_MAX_M) {
        pg_gemm_stream_q(level, M, n0, n1, K, A, lda, W, w_row_bytes, fmt->qtile, C, ldc);
        return 0;
    }
#endif
    float *scratch = NULL;
    if (!pagedcy_rowfmt_is_f32(fmt)) {       /* (f16/bf16 with SIMD need none, but it is small) */
#if PG_HAVE_SIMD
        scratch = pg_pack_buffer((size_t)8 * PG_KC);
#else
        scratch = (float *)malloc((size_t)8 * PG_KC * sizeof(float));
#endif
        if (!scratch) return -1;
    }
    pg_gemm_stream(level, M, n0, n1, K, A, lda, W, w_row_bytes, fmt, C, ldc, scratch);
#if !PG_HAVE_SIMD
    free(scratch);
#endif
    return 0;
}

/* The float32 case: W[N, K] float32 rows ldw floats apart. */
static inline int pagedcy_gemm_nt_rows(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                                const float *W, int64_t ldw, float *C, int64_t ldc) {
    return pagedcy_gemm_rows_fmt(simd, M, n0, n1, K, A, lda, W, ldw * 4, &pagedcy_rowfmt_f32, C, ldc);
}

#endif
