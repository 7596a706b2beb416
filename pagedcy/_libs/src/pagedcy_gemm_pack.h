/* The packed path of the GEMM (pagedcy_gemm.h), for many rows of A: a panel of
 * W and a block of A are copied into buffers laid out for a register-blocked
 * micro-kernel (the BLIS / OpenBLAS design): an MR x NR tile of C held in
 * registers, per k one vector load of NR packed weights and MR broadcasts of
 * A: 6 x 16 on AVX2 (12 ymm accumulators), 12 x 32 on AVX-512 (24 zmm).
 *
 * Bit-identical to the streaming path. The streaming tile sums each output of
 * a K block in L lanes (L = 8 on AVX2, 16 on AVX-512: lane j takes k = j, j+L,
 * ... in order, with FMA, from +0) and then adds the lanes by a fixed tree. The
 * packs here store the K block by lane class (every k = j mod L together,
 * zero-padded to the same length T), so the micro-kernel runs one lane class
 * after another and each of its accumulators sees exactly the FMAs of one
 * streaming lane, in the same order. A padded step adds 0 * 0, which leaves
 * any accumulator unchanged (a sum started at +0 never becomes -0). Between
 * lane classes the accumulators go to a small stack that adds them up in the
 * streaming tree's order (pg_lane_fold), so no [L][MR][NR] buffer is needed.
 *
 * Only the W packer knows the storage: float32 rows are read in place, any
 * other pagedcy_rowfmt is decoded 8 rows at a time into an L1 scratch first.
 * Included by pagedcy_gemm.h inside its SIMD section.
 */
#ifndef PAGEDCY_GEMM_PACK_H
#define PAGEDCY_GEMM_PACK_H

#include <stdlib.h>
#include <unistd.h>

/* Rows of A (MR) and of W (NR) per micro-tile, and the lanes L, per level. */
#define PG_Y_MR 6
#define PG_Y_NR 16
#define PG_Z_MR 12
#define PG_Z_NR 32
/* Full unrolling of the loops over a tile's 12 or 24 accumulators (see PG_UNROLL). */
#define PG_UNROLL_ALL _Pragma("GCC unroll 32")

/* Processing position of lane class j. AVX2: j. AVX-512: the streaming tile first
 * adds lane j to lane j + 8, so those two run back to back (0, 8, 1, 9, ...). */
static inline int pg_lane_pos(int L, int j) { return L == 8 ? j : (j < 8 ? 2 * j : 2 * (j - 8) + 1); }

/* 8 x 8 transpose: r[e] becomes column e of the rows r[0..7]. */
PG_AVX2_INLINE void pg_tr8(__m256 *r) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20); r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20); r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31); r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31); r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Pack elements [0, kc) of up to 8 rows (src + r * ld, r < nrows; the others are
 * zeros) by lane class: element k = t * L + j of row r goes to
 * dst[(pg_lane_pos(j) * T + t) * stride + r], for r < width (4, 6 or 8). */
PG_AVX2 static void pg_pack8_avx2(const float *src, int64_t ld, int nrows, int kc, int L, int T,
                             float *dst, int64_t stride, int width) {
    int64_t off[16];
    for (int j = 0; j < L; j++) off[j] = (int64_t)pg_lane_pos(L, j) * T * stride;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < L; h += 8) {
            const int k = t * L + h;
            const int full = k + 8 <= kc;
            const __m256i m = pg_mask8(kc - k);
            __m256 r[8];
            PG_UNROLL
            for (int i = 0; i < 8; i++) {
                const float *p = src + i * ld + k;
                r[i] = i >= nrows ? _mm256_setzero_ps() : full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
            }
            pg_tr8(r);
            PG_UNROLL
            for (int e = 0; e < 8; e++) {
                float *d = dst + off[h + e] + (int64_t)t * stride;
                if (width == 8) _mm256_storeu_ps(d, r[e]);
                else {
                    _mm_storeu_ps(d, _mm256_castps256_ps128(r[e]));
                    if (width == 6) _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(r[e], 1));
                }
            }
        }
}

/* A block of rows [0, mc) of A, K elements [k0, k0 + kc): micro-panels of MR rows,
 * each [L * T][MR] (rows past mc are zeros). */
PG_AVX2 static void pg_pack_a_avx2(const float *A, int64_t lda, int mc, int k0, int kc, int L, int T,
                              int MR, float *dst) {
    const int64_t kp = (int64_t)L * T;
    for (int m = 0; m < mc; m += MR, dst += kp * MR)
        for (int g = 0; g < MR; g += 8) {
            const int rows = pg_min(mc - m - g, 8);
            pg_pack8_avx2(A + (int64_t)(m + g) * lda + k0, lda, rows, kc, L, T, dst + g, MR, pg_min(MR - g, 8));
        }
}

/* A panel of W's rows [n, n + nc), K elements [k0, k0 + kc): micro-panels of NR rows,
 * each [L * T][NR] (rows past nc are zeros). f32 rows are read in place; others are
 * decoded into scratch (8 x kc floats) first. */
PG_AVX2 static void pg_pack_w_avx2(const void *W, int64_t wrb, const pagedcy_rowfmt *fmt, int n, int nc,
                              int k0, int kc, int L, int T, int NR, float *scratch, float *dst) {
    const int64_t kp = (int64_t)L * T;
    const int f32 = pagedcy_rowfmt_is_f32(fmt);
    for (int r = 0; r < nc; r += NR, dst += kp * NR)
        for (int g = 0; g < NR; g += 8) {
            const int rows = r + g < nc ? pg_min(nc - r - g, 8) : 0;
            const char *row = (const char *)W + (int64_t)(n + pg_min(r + g, nc - 1)) * wrb;
            const float *src = (const float *)row + k0;
            int64_t ld = wrb / 4;
            if (!f32 && rows) {
                for (int i = 0; i < rows; i++) fmt->decode(row + i * wrb, k0, kc, scratch + (int64_t)i * kc);
                src = scratch;
                ld = kc;
            }
            pg_pack8_avx2(src, ld, rows, kc, L, T, dst + g, NR, 8);
        }
}

/* After lane class q (processing order) the accumulators v join the stack: AVX2
 * folds lane e = q as ((0+1)+(2+3))+((4+5)+(6+7)), a binary counter whose level l
 * holds a finished sum of 2^l lanes; AVX-512 first adds lane j + 8 to lane j
 * (slot 3 holds lane j meanwhile). Earlier sums are always the left operand, as in
 * the streaming tile. Returns 1 when v holds the finished sum. */
#define PG_LANE_FOLD(VT, ADD, L, q, v, stk, N)                                      \
    do {                                                                            \
        int e_ = (q);                                                               \
        if ((L) == 16) {                                                            \
            if (!(e_ & 1)) {                                                        \
                PG_UNROLL_ALL for (int u_ = 0; u_ < (N); u_++) (stk)[3 * (N) + u_] = (v)[u_]; \
                break;                                                              \
            }                                                                       \
            PG_UNROLL_ALL for (int u_ = 0; u_ < (N); u_++) (v)[u_] = ADD((stk)[3 * (N) + u_], (v)[u_]); \
            e_ >>= 1;                                                               \
        }                                                                           \
        const int ones_ = __builtin_ctz(~(unsigned)e_);                             \
        for (int l_ = 0; l_ < ones_; l_++)                                          \
            PG_UNROLL_ALL for (int u_ = 0; u_ < (N); u_++) (v)[u_] = ADD((stk)[l_ * (N) + u_], (v)[u_]); \
        if (ones_ < 3) {                                                            \
            PG_UNROLL_ALL for (int u_ = 0; u_ < (N); u_++) (stk)[ones_ * (N) + u_] = (v)[u_]; \
        }                                                                           \
    } while (0)

#define PG_PRAGMA(x) _Pragma(#x)
/* The body of a micro-kernel: C[0..mr, 0..nr) of an MR x (2 * VW) tile, one K block
 * of L * T packed steps (xp: [L * T][MR], wp: [L * T][2 * VW]), one lane class at a
 * time, folded by PG_LANE_FOLD; then the tile is stored (or added) with STORE. Only
 * constant indices into c: a run-time one would keep the accumulators in memory.
 * UNR: unrolling of the k loop (4 on AVX2 gained ~8%, 1 thread).
 * The tile's rows of C are prefetched first, as OpenBLAS's kernels do: C of a
 * 2048-row GEMM (23-262 MB) is not in cache, and the stores (or the loads of a
 * later K block) otherwise wait for each line at the end. AMD EPYC Zen 5, 2048 x
 * 2816 x 512, in-process A/B: 278 -> 370 GFLOP/s on 2 threads (AVX-512), 117 ->
 * 194 (AVX2); 2048 x 512 x 1408 (three K blocks): 175 -> 411; one thread +5-8%.
 * pfn: the last tile over this micro-panel of A also prefetches the next one into
 * L2, at the offset the tile reads its own (2048 x 2816 x 512, 2 threads: 371 -> 400
 * GFLOP/s AVX-512, 199 -> 218 AVX2; the others +0-3%). */
#define PG_MICRO_KERNEL(VT, ZERO, LOAD, SET1, FMA, ADD, STORE, MR, VW, L, UNR)          \
    VT c[(MR) * 2], stk[4 * (MR) * 2];                                                 \
    for (int i = 0; i < mr; i++) {                                                     \
        __builtin_prefetch(C + i * ldc, 1, 3);                                         \
        __builtin_prefetch(C + i * ldc + 2 * (VW) - 1, 1, 3);                          \
    }                                                                                  \
    for (int q = 0; q < (L); q++) {                                                    \
        PG_UNROLL_ALL for (int u = 0; u < (MR) * 2; u++) c[u] = ZERO();               \
        PG_PRAGMA(GCC unroll UNR)                                                      \
        for (int t = 0; t < T; t++, xp += (MR), wp += 2 * (VW)) {                      \
            if (pfn) __builtin_prefetch(xp + (int64_t)(L) * T * (MR), 0, 2);           \
            const VT w0 = LOAD(wp), w1 = LOAD(wp + (VW));                              \
            PG_UNROLL_ALL for (int i = 0; i < (MR); i++) {                             \
                const VT a = SET1(xp[i]);                                              \
                c[2 * i] = FMA(a, w0, c[2 * i]);                                       \
                c[2 * i + 1] = FMA(a, w1, c[2 * i + 1]);                               \
            }                                                                          \
        }                                                                              \
        PG_LANE_FOLD(VT, ADD, L, q, c, stk, (MR) * 2);                                 \
    }                                                                                  \
    PG_UNROLL_ALL for (int i = 0; i < (MR); i++)                                       \
        PG_UNROLL for (int h = 0; h < 2; h++)                                          \
            if (i < mr && h * (VW) < nr)                                               \
                STORE(C + i * ldc + h * (VW), c[2 * i + h], first, pg_min(nr - h * (VW), (VW)))

/* c[0 .. n) = s or c + s, as pg_store_sum, for 16 floats. */
PG_AVX512_INLINE void pg_store_sum16(float *c, __m512 s, int first, int n) {
    const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    _mm512_mask_storeu_ps(c, m, first ? s : _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), s));
}

/* AVX2 micro-kernel: a 6 x 16 tile (xp: [8 * T][6], wp: [8 * T][16]). */
PG_AVX2 static void pg_mk_avx2(int T, const float *xp, const float *wp, float *C, int64_t ldc, int mr,
                               int nr, int first, int pfn) {
    PG_MICRO_KERNEL(__m256, _mm256_setzero_ps, _mm256_load_ps, _mm256_set1_ps, _mm256_fmadd_ps,
                    _mm256_add_ps, pg_store_sum, PG_Y_MR, 8, 8, 4);
}

/* AVX-512 micro-kernel: a 12 x 32 tile (xp: [16 * T][12], wp: [16 * T][32]). The
 * streaming tile adds lane j + 8 to lane j in ymm halves, then runs the 8-lane tree;
 * PG_LANE_FOLD does the same adds on whole vectors, in the same order. */
PG_AVX512 static void pg_mk_avx512(int T, const float *xp, const float *wp, float *C, int64_t ldc, int mr,
                                   int nr, int first, int pfn) {
    PG_MICRO_KERNEL(__m512, _mm512_setzero_ps, _mm512_load_ps, _mm512_set1_ps, _mm512_fmadd_ps,
                    _mm512_add_ps, pg_store_sum16, PG_Z_MR, 16, 16, 2);
}

/* Level 2 L2 cache bytes per core (sysconf), 512 KiB when unknown. */
static inline int64_t pg_l2_bytes(void) {
    static int64_t cached = 0;
    if (!cached) {
        long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
        v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        cached = v >= 128 * 1024 ? (int64_t)v : 512 * 1024;
    }
    return cached;
}

/* Per-thread packing buffer, grown on demand and kept for the thread's life (a
 * GEMM per layer would otherwise map and fault in a few MiB per call). */
static float *pg_pack_buffer(size_t floats) {
    static __thread float *buf = NULL;
    static __thread size_t cap = 0;
    if (floats > cap) {
        free(buf);
        cap = 0;
        buf = (float *)aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64);
        if (!buf) return NULL;
        cap = floats;
    }
    return buf;
}

/* A's block: at most this many bytes of packed rows per K block (in L3; a block of
 * 768 rows instead of 2048 repacked W 3 times and ran 2048-row GEMMs ~3% slower). */
#define PG_A_PACK_BYTES (4096 * 1024)

/* Packed path of pagedcy_gemm_rows_fmt, level 1 (AVX2) or 2 (AVX-512). Loops, outer
 * to inner: rows of A in blocks of mc (packed per K block), K blocks of kc_max,
 * panels of nc rows of W (packed, sized to half the L2), micro-panels of A (in L1)
 * over the panel's micro-panels (streamed from L2; BLIS keeps the broadcast operand
 * in L2 instead, but our K block of 512 makes a weight micro-panel 32-64 KiB, too
 * big for L1). Returns 0, or -1 when out of
 * memory. */
static int pg_gemm_packed(int level, int kc_max, int M, int n0, int n1, int K, const float *A,
                          int64_t lda, const void *W, int64_t wrb, const pagedcy_rowfmt *fmt, float *C,
                          int64_t ldc) {
    const int L = level == 2 ? 16 : 8, MR = level == 2 ? PG_Z_MR : PG_Y_MR, NR = level == 2 ? PG_Z_NR : PG_Y_NR;
    const int64_t kp_max = ((int64_t)kc_max + L - 1) / L * L;
    int mc = (int)(PG_A_PACK_BYTES / (kp_max * 4)) / MR * MR;
    if (mc < MR) mc = MR;
    mc = pg_min(mc, (M + MR - 1) / MR * MR);
    /* A quarter of L2 for the panel: with half, A's micro-panels and C streaming
     * through L2 evicted it (K = 1408, 512 rows: 0.5x OpenBLAS on AVX2, 1.0x with a
     * quarter; the AVX-512 kernel gained ~5% too, 2 MiB L2). */
    int nc = (int)(pg_l2_bytes() / 4 / (kp_max * 4)) / NR * NR;
    if (nc < NR) nc = NR;
    nc = pg_min(nc, (n1 - n0 + NR - 1) / NR * NR);
    const size_t a_n = (size_t)mc * kp_max, w_n = (size_t)nc * kp_max, s_n = (size_t)8 * kc_max;
    float *buf = pg_pack_buffer(a_n + w_n + s_n);
    if (!buf) return -1;
    float *ap = buf, *wp = buf + a_n, *scratch = buf + a_n + w_n;
    for (int m0 = 0; m0 < M; m0 += mc) {
        const int mb = pg_min(mc, M - m0);
        for (int k0 = 0; k0 < K; k0 += kc_max) {
            const int kc = pg_min(kc_max, K - k0), T = (kc + L - 1) / L;
            const int64_t kp = (int64_t)L * T;
            pg_pack_a_avx2(A + (int64_t)m0 * lda, lda, mb, k0, kc, L, T, MR, ap);
            for (int j0 = n0; j0 < n1; j0 += nc) {
                const int nb = pg_min(nc, n1 - j0);
                pg_pack_w_avx2(W, wrb, fmt, j0, nb, k0, kc, L, T, NR, scratch, wp);
                for (int i = 0; i < mb; i += MR) {
                    const float *xa = ap + (int64_t)i * kp;
                    float *c = C + (int64_t)(m0 + i) * ldc + j0;
                    const int mr = pg_min(MR, mb - i);
                    for (int j = 0; j < nb; j += NR) {
                        const int pfn = j + NR >= nb && i + MR < mb;   /* the last tile of xa's row */
                        if (level == 2) pg_mk_avx512(T, xa, wp + (int64_t)j * kp, c + j, ldc, mr, pg_min(NR, nb - j), k0 == 0, pfn);
                        else pg_mk_avx2(T, xa, wp + (int64_t)j * kp, c + j, ldc, mr, pg_min(NR, nb - j), k0 == 0, pfn);
                    }
                }
            }
        }
    }
    return 0;
}

#endif
