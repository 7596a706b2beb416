/* AVX-512 micro-kernels of the paged-attention kernel.
 *
 * Same contracts as the AVX2 ones (pa_qk4/pa_pv4/pa_softmax4 for decode,
 * pa_qk12/pa_pv12 for prefill) with 16-float vectors: a 16-bit K or V row
 * costs one conversion per 16 values instead of per 8 and feeds twice as
 * many lanes per FMA. The head dimension must be a multiple of 16 (the
 * driver checks). Compiled with target attributes only, so the portable
 * build carries it and the driver calls it after pagedcy_simd_level()
 * reported AVX-512.
 *
 * Where fp16 decode time goes (development VM, 32 x 2048 tokens, 2
 * threads): ~8.4-9 ms of compute with every page in L2 (a conversion is two
 * FMA-port uops, so a token and KV head costs ~60 cycles) against ~6 ms to
 * stream its 268 MB; measured 10-11 ms. There, prefetching only the start
 * of each 4 KiB page of the next page did best; on an AMD EPYC (Zen 4) the
 * hardware prefetchers do not stream the rest of those pages, and software
 * prefetch of the whole next page (pa_pfcur, set up in pagedcy_attn_item.h)
 * made DRAM-resident decode 1.3-2.1x faster. A token-major walk over all
 * heads (sequential K rows), L1 prefetch of the next head's slice and
 * prefetching in bursts at each head's start were slower.
 *
 * Tried and dropped (prototype measured in L2, one thread, per token and KV
 * head): AMX-BF16 for the fp16 scores. fp16 splits exactly into three bf16
 * tiles with integer ops (hi = |h|>>3 with the sign, then the low mantissa
 * bits over the hi exponent), and the scores came out right, but building
 * the tiles alone cost 10 ns against 12-14 ns for this whole QK kernel, and
 * the dependent tile multiplies added 15 ns more. vdpbf16ps costs about
 * three FMA-port uops here, so it does not help either. Dropping the 16x16
 * score reduction altogether (what a transposed K layout would buy) made
 * fp16 decode only 4% faster.
 *
 * Head_dim 64 decode (8 query / 2 KV heads, float32; asv_benches/
 * attn_model_shapes.py, AMD EPYC, L2-resident KV): per page and KV head the
 * score kernel took ~100 ns, P.V ~90 ns, the softmax ~30 ns, bookkeeping
 * ~20 ns; the 256 FMAs of each of QK and PV alone take ~70 ns. Two score
 * kernels with the query block in registers and K broadcast per 4 or 8
 * dimensions (a 4- or 8-lane final sum instead of pa_hsum16x16) were no
 * faster (0.97-1.03x), so that time is not the reduction. From DRAM the
 * page walk (16 KiB of K/V per page at a 128 KiB page stride) reads at
 * ~20 GB/s per thread, about what a plain C loop over the same layout with
 * the same prefetch reaches; front-loading the next page's prefetch into
 * the first head's kernels (0.70x) or prefetching every other line (0.56x)
 * was slower, two pages ahead no faster (0.97-1.0x).
 *
 * Multi-page steps (pa_qk4v_z / pa_pv4v_z), 32 x 2048 fp32 from DRAM, one
 * thread, AMD EPYC: P.V over whole V rows in one pass (4 x 8 accumulators,
 * GCC spills a few) 1.04-1.06x from DRAM but 0.93x from cache; in head
 * pairs, or in blocks of 1-4 tokens per page with the accumulators going
 * back to O, 0.93-1.06x; 8 pages per step no faster; prefetching only some
 * pages, only K or only V 0.75-0.89x; all of a head's prefetches during its
 * scores 0.85x. Without software prefetch the hardware prefetchers carry
 * the four row streams at 17-21 GB/s against ~24 with it, although the bare
 * walk (page_read_bandwidth) reaches ~30 on its own; with it the prefetch
 * instructions cost a quarter of the cached rate (42 -> 31 GB/s). On the
 * hardware prefetchers alone (whole-row P.V, walk 29.2 GB/s) the kernel read
 * 20.5 GB/s; without the softmax 21.0, with loads-only scores 22.1, loads-
 * only P.V 22.9, loads only throughout 26.5: the prefetchers run too little
 * ahead to hide the arithmetic, and software prefetch that does is bounded
 * by the core's outstanding L1 misses (~23 GB/s). Prefetching every other
 * line (relying on an adjacent-line fetch) ran at 0.64x.
 */
#ifndef PAGEDCY_ATTN_AVX512_H
#define PAGEDCY_ATTN_AVX512_H

#include "pagedcy_attn_avx2.h"

#if PAGEDCY_ATTN_HAVE_AVX2
#define PAGEDCY_ATTN_HAVE_AVX512 1
#define PA_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c")))
#define PA_AVX512_INLINE __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c"), \
                                        always_inline)) static inline

/* Sixteen storage-dtype values -> 16 floats (int8 unscaled; dtype a literal after inlining). */
PA_AVX512_INLINE __m512 pa_ld16z(const void *base, int64_t idx, int dtype) {
    if (dtype == PAGEDCY_F32) return _mm512_loadu_ps((const float *)base + idx);
    if (dtype == PAGEDCY_I8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)base + idx))));
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + idx));
    if (dtype == PAGEDCY_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen 16-lane accumulators -> one vector whose element 4k+j is the sum
 * of v[4j+k]: four halving steps (256-bit, 128-bit, 64-bit, 32-bit) that
 * each add two shuffles of a pair of vectors, 45 instructions for 16 sums
 * instead of 16 separate horizontal reductions. One body for float lanes
 * (pa_hsum16x16) and int32 lanes (pa_hsum16x16_epi32: exact sums, so the
 * caller converts one vector instead of sixteen): the shuffles only move
 * bits (done on the float view, PS / BACK the casts), ADD is the lanes' add. */
PA_AVX512_INLINE __m512 pa_ps_same(__m512 x) { return x; }
#define PA_HSUM16X16_DEF(NAME, T, ADD, PS, BACK)                                                      \
    PA_AVX512_INLINE T NAME(const T *v) {                                                             \
        __m512 u[8], x[4], y[2];                                                                      \
        for (int i = 0; i < 8; i++)                                                                   \
            u[i] = PS(ADD(BACK(_mm512_shuffle_f32x4(PS(v[2 * i]), PS(v[2 * i + 1]), 0x44)),           \
                          BACK(_mm512_shuffle_f32x4(PS(v[2 * i]), PS(v[2 * i + 1]), 0xEE))));         \
        for (int i = 0; i < 4; i++)                                                                   \
            x[i] = PS(ADD(BACK(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88)),                   \
                          BACK(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD))));                 \
        for (int i = 0; i < 2; i++)                                                                   \
            y[i] = PS(ADD(BACK(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]),        \
                                                                   _mm512_castps_pd(x[2 * i + 1])))), \
                          BACK(_mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]),        \
                                                                   _mm512_castps_pd(x[2 * i + 1])))))); \
        return ADD(BACK(_mm512_shuffle_ps(y[0], y[1], 0x88)), BACK(_mm512_shuffle_ps(y[0], y[1], 0xDD))); \
    }
PA_HSUM16X16_DEF(pa_hsum16x16, __m512, _mm512_add_ps, pa_ps_same, pa_ps_same)
PA_HSUM16X16_DEF(pa_hsum16x16_epi32, __m512i, _mm512_add_epi32, _mm512_castsi512_ps, _mm512_castps_si512)

PA_AVX512_INLINE __m256 pa_fold16(__m512 x) {
    return _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
}

/* Scores of 4 query rows (stride D) against 4 tokens: the two pair vectors
 * of tokens (t, t+1) and (t+2, t+3), stored as 16 consecutive floats at o. */
PA_AVX512_INLINE void pa_qk4x4r_z(const float *q, int D, const char *k0, const char *k1, const char *k2,
                                   const char *k3, float *o, pa_pfcur *pf, int pf_per_step, int flags, int dtype) {
    __m512 a[16];
    const char *kr[4] = {k0, k1, k2, k3};
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        if (pf) pa_pf_step(pf, pf_per_step, flags);
        __m512 k[4];
        for (int j = 0; j < 4; j++) k[j] = pa_ld16z(kr[j], d, dtype);
        for (int r = 0; r < 4; r++) {
            const __m512 x = _mm512_loadu_ps(q + (int64_t)r * D + d);
            for (int j = 0; j < 4; j++) a[r * 4 + j] = _mm512_fmadd_ps(x, k[j], a[r * 4 + j]);
        }
    }
    /* output element p = 8*(t/2) + 2*r + (t&1) is a[r][t]; pa_hsum16x16
     * puts sum(v[4j+k]) at 4k+j, so v[4j+k] = a[r][t] for p = 4k+j */
    __m512 v[16];
    for (int p = 0; p < 16; p++) {
        const int t = 2 * (p >> 3) + (p & 1), r = (p & 7) >> 1;
        v[4 * (p & 3) + (p >> 2)] = a[r * 4 + t];
    }
    _mm512_storeu_ps(o, pa_hsum16x16(v));
}

PA_AVX512_INLINE void pa_qk4x4_z(const float *q, int D, const char *kb, int64_t rs, float *o,
                                  pa_pfcur *pf, int pf_per_step, int flags, int dtype) {
    pa_qk4x4r_z(q, D, kb, kb + rs, kb + 2 * rs, kb + 3 * rs, o, pf, pf_per_step, flags, dtype);
}

/* One pair vector: 4 rows x tokens (kb0, kb1). */
PA_AVX512_INLINE __m256 pa_qk4x2_z(const float *q, int D, const char *kb0, const char *kb1,
                                   pa_pfcur *pf, int pf_per_step, int flags, int dtype) {
    __m512 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        if (pf) pa_pf_step(pf, pf_per_step, flags);
        const __m512 k0 = pa_ld16z(kb0, d, dtype), k1 = pa_ld16z(kb1, d, dtype);
        for (int r = 0; r < 4; r++) {
            const __m512 x = _mm512_loadu_ps(q + (int64_t)r * D + d);
            a[2 * r] = _mm512_fmadd_ps(x, k0, a[2 * r]);
            a[2 * r + 1] = _mm512_fmadd_ps(x, k1, a[2 * r + 1]);
        }
    }
    return pa_hsum8(pa_fold16(a[0]), pa_fold16(a[1]), pa_fold16(a[2]), pa_fold16(a[3]),
                    pa_fold16(a[4]), pa_fold16(a[5]), pa_fold16(a[6]), pa_fold16(a[7]));
}

PA_AVX512_INLINE void pa_qk4_z(const float *q, int D, const void *K, int64_t ks, int tlo, int thi,
                               float *S, pa_pfcur *pf, int flags, int dtype) {
    const int64_t es = pa_dtype_bytes(dtype), rs = ks * es;
    const int steps = (thi - tlo + 3) / 4 * (D / 16);
    const int per_step = pf ? (pa_pf_lines_left(pf) + steps - 1) / steps : 0;
    int t = tlo;
    for (; t + 4 <= thi; t += 4)
        pa_qk4x4_z(q, D, (const char *)K + (int64_t)t * rs, rs, S + (t >> 1) * 8, pf, per_step, flags, dtype);
    for (; t < thi; t += 2) {
        const char *k0 = (const char *)K + (int64_t)t * rs, *k1 = t + 1 < thi ? k0 + rs : k0;
        _mm256_storeu_ps(S + (t >> 1) * 8, pa_qk4x2_z(q, D, k0, k1, pf, per_step, flags, dtype));
    }
    if (pf) pa_pf_step(pf, pa_pf_lines_left(pf), flags);
}

/* P.V runs over the head dimension in column passes of 64, then 32, then 16
 * floats (4, 2, 1 vectors: 16 accumulators at most). pa_pv_passes_z counts
 * them; PA_PV_COLUMN_PASSES_Z runs BODY once per pass with d its first column
 * and NC its width in vectors, a literal in each branch so the pass kernels
 * keep their accumulators in registers. */
static inline int pa_pv_passes_z(int D) {
    return D / 64 + (D % 64 >= 32) + (D % 32 >= 16);
}
#define PA_PV_COLUMN_PASSES_Z(D, d, NC, BODY) do {                              \
        for (int d = 0; d < (D); ) {                                             \
            const int pa_nc_ = (D) - d >= 64 ? 4 : (D) - d >= 32 ? 2 : 1;        \
            if (pa_nc_ == 4) { const int NC = 4; BODY; }                         \
            else if (pa_nc_ == 2) { const int NC = 2; BODY; }                    \
            else { const int NC = 1; BODY; }                                     \
            d += 16 * pa_nc_;                                                    \
        }                                                                        \
    } while (0)

/* The 4 x NC accumulators of a P.V pass: O's columns [d0, d0 + 16*NC)
 * scaled by alpha, and back. */
PA_AVX512_INLINE void pa_pv4_acc_load_z(__m512 c[4][4], const float *O, int D, int d0, const float *alpha,
                                        int NC) {
    for (int r = 0; r < 4; r++) {
        const __m512 al = _mm512_set1_ps(alpha[r]);
        for (int n = 0; n < NC; n++)
            c[r][n] = _mm512_mul_ps(_mm512_loadu_ps(O + (int64_t)r * D + d0 + 16 * n), al);
    }
}

PA_AVX512_INLINE void pa_pv4_acc_store_z(__m512 c[4][4], float *O, int D, int d0, int NC) {
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < NC; n++) _mm512_storeu_ps(O + (int64_t)r * D + d0 + 16 * n, c[r][n]);
}

/* O[r][d0 : d0+16*NC] = O*alpha[r] + sum_t P[r][t] V[t][...] for 4 rows:
 * 4*NC accumulators stay in registers across the tokens. */
PA_AVX512_INLINE void pa_pv4_pass_z(float *O, int D, int d0, const float *alpha, const float *P,
                                    const void *V, int64_t vs, int tlo, int thi, pa_pfcur *pf,
                                    int pf_per_step, int flags, int NC, int dtype) {
    const int64_t es = pa_dtype_bytes(dtype);
    __m512 c[4][4];
    pa_pv4_acc_load_z(c, O, D, d0, alpha, NC);
    const char *vr = (const char *)V + ((int64_t)tlo * vs + d0) * es;
    const float *pp = P + (tlo >> 1) * 8 + (tlo & 1);
    for (int t = tlo; t < thi; t++, vr += vs * es) {
        if (pf) pa_pf_step(pf, pf_per_step, flags);
        __m512 v[4];
        for (int n = 0; n < NC; n++) v[n] = pa_ld16z(vr, 16 * n, dtype);
        for (int r = 0; r < 4; r++) {
            const __m512 b = _mm512_set1_ps(pp[2 * r]);
            for (int n = 0; n < NC; n++) c[r][n] = _mm512_fmadd_ps(b, v[n], c[r][n]);
        }
        pp += (t & 1) ? 7 : 1;        /* next token: other lane of the pair, or next pair */
    }
    pa_pv4_acc_store_z(c, O, D, d0, NC);
}

/* Scores of 4 query rows against tokens [0, T) of npg pages in token-major
 * order (virtual token v = t*npg + j is token t of page j): each 4-token
 * block reads row t of up to 4 pages side by side, so as many streams of
 * rows are in flight. pf: npg cursors (or NULL), stepped evenly. */
PA_AVX512_INLINE void pa_qk4v_z(const float *q, int D, const char *const *K, int npg, int T, int64_t rs,
                                float *S, pa_pfcur *pf, int flags, int dtype) {
    const int n = npg * T, nb = (n + 3) / 4;
    int per[PA_SUPER_PAGES];
    for (int j = 0; pf && j < npg; j++) per[j] = (pa_pf_lines_left(pf + j) + nb - 1) / nb;
#define PA_VROW(v) (K[(v) % npg] + (int64_t)((v) / npg) * rs)
    int v = 0;
    for (; v + 4 <= n; v += 4) {
        for (int j = 0; pf && j < npg; j++) pa_pf_step(pf + j, per[j], flags);
        pa_qk4x4r_z(q, D, PA_VROW(v), PA_VROW(v + 1), PA_VROW(v + 2), PA_VROW(v + 3), S + (v >> 1) * 8,
                    NULL, 0, flags, dtype);
    }
    for (; v < n; v += 2)
        _mm256_storeu_ps(S + (v >> 1) * 8, pa_qk4x2_z(q, D, PA_VROW(v), PA_VROW(v + 1), NULL, 0, flags, dtype));
#undef PA_VROW
    for (int j = 0; pf && j < npg; j++) pa_pf_step(pf + j, pa_pf_lines_left(pf + j), flags);
}

/* P.V in the same token-major order: token t of every page, then t+1. */
PA_AVX512_INLINE void pa_pv4v_pass_z(float *O, int D, int d0, const float *alpha, const float *P,
                                     const char *const *V, int npg, int T, int64_t vs, pa_pfcur *pf,
                                     const int *per_t, int flags, int NC, int dtype) {
    const int64_t es = pa_dtype_bytes(dtype);
    __m512 c[4][4];
    pa_pv4_acc_load_z(c, O, D, d0, alpha, NC);
    for (int t = 0; t < T; t++) {
        for (int j = 0; pf && j < npg; j++) pa_pf_step(pf + j, per_t[j], flags);
        for (int j = 0; j < npg; j++) {
            const int v = t * npg + j;
            const float *pp = P + (v >> 1) * 8 + (v & 1);
            const char *vr = V[j] + ((int64_t)t * vs + d0) * es;
            __m512 x[4];
            for (int n = 0; n < NC; n++) x[n] = pa_ld16z(vr, 16 * n, dtype);
            for (int r = 0; r < 4; r++) {
                const __m512 b = _mm512_set1_ps(pp[2 * r]);
                for (int n = 0; n < NC; n++) c[r][n] = _mm512_fmadd_ps(b, x[n], c[r][n]);
            }
        }
    }
    pa_pv4_acc_store_z(c, O, D, d0, NC);
}

PA_AVX512_INLINE void pa_pv4v_z(float *O, int D, const float *alpha, const float *P, const char *const *V,
                                int npg, int T, int64_t vs, pa_pfcur *pf, int flags, int dtype) {
    const int passes = pa_pv_passes_z(D);
    int per_t[PA_SUPER_PAGES];
    for (int j = 0; pf && j < npg; j++) per_t[j] = (pa_pf_lines_left(pf + j) + passes * T - 1) / (passes * T);
    PA_PV_COLUMN_PASSES_Z(D, d, NC, pa_pv4v_pass_z(O, D, d, alpha, P, V, npg, T, vs, pf, per_t, flags, NC, dtype));
    for (int j = 0; pf && j < npg; j++) pa_pf_step(pf + j, pa_pf_lines_left(pf + j), flags);
}

PA_AVX512_INLINE void pa_pv4_z(float *O, int D, const float *alpha, const float *P, const void *V,
                               int64_t vs, int tlo, int thi, pa_pfcur *pf, int flags, int dtype) {
    const int steps = pa_pv_passes_z(D) * (thi - tlo);
    const int per_step = pf && steps > 0 ? (pa_pf_lines_left(pf) + steps - 1) / steps : 0;
    PA_PV_COLUMN_PASSES_Z(D, d, NC, pa_pv4_pass_z(O, D, d, alpha, P, V, vs, tlo, thi, pf, per_step, flags, NC, dtype));
    if (pf) pa_pf_step(pf, pa_pf_lines_left(pf), flags);
}

/* exp for 16 lanes, same polynomial as pa_exp8; vscalefps applies 2^n and
 * underflows to 0 by itself, so the range clamp and exponent bit-building go
 * away. NaN and arguments below -87.33 (masked scores) give exactly 0. */
PA_AVX512_INLINE __m512 pa_exp16(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_GE_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 y;
    PA_EXP_POLY(_mm512, fx, x, y);
    return _mm512_maskz_scalef_ps(keep, y, fx);
}

/* pa_softmax4_avx2 for the common decode case (no soft cap, no ALiBi, every
 * row sees every token of the pairs [jb, je)), two pairs per vector; any
 * other case goes to the AVX2 version. */
PA_AVX512 static void pa_softmax4_avx512(float *S, int jb, int je, const int32_t *vlo,
                                         const int32_t *vhi, float cap, const float *slope,
                                         const float *pos0, float *m, float *l, float *alpha) {
    int full = cap <= 0.0f && slope[0] == 0.0f && slope[1] == 0.0f && slope[2] == 0.0f && slope[3] == 0.0f;
    for (int r = 0; r < 4; r++) full &= vlo[r] <= 2 * jb && vhi[r] >= 2 * je - 1;
    if (!full) {
        pa_softmax4_avx2(S, jb, je, vlo, vhi, cap, slope, pos0, m, l, alpha);
        return;
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = ninf;
    for (int j = jb; j < je; j += 2) {
        const __mmask16 k = j + 1 < je ? 0xFFFF : 0x00FF;
        vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(ninf, k, S + (int64_t)j * 8));
    }
    /* row maxima, each duplicated over its two lanes of an 8-lane pair vector */
    __m256 v8 = _mm256_max_ps(_mm512_castps512_ps256(vmax), _mm512_extractf32x8_ps(vmax, 1));
    v8 = _mm256_max_ps(v8, _mm256_permute_ps(v8, 0xB1));
    const __m256 mold = _mm256_setr_ps(m[0], m[0], m[1], m[1], m[2], m[2], m[3], m[3]);
    const __m256 mnew = _mm256_max_ps(mold, v8);
    const __m512 mnew16 = _mm512_broadcast_f32x8(mnew);
    __m512 acc = _mm512_setzero_ps();
    for (int j = jb; j < je; j += 2) {
        const __mmask16 k = j + 1 < je ? 0xFFFF : 0x00FF;
        float *sj = S + (int64_t)j * 8;
        const __m512 p = pa_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sj), mnew16));
        _mm512_mask_storeu_ps(sj, k, p);
        acc = _mm512_mask_add_ps(acc, k, acc, p);
    }
    pa_softmax4_finish(mnew, _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)),
                       vlo, vhi, m, l, alpha);
}

/* ---- prefill: 16-token / 16-float versions of the AVX2 12-row kernels ----
 * Same inputs and outputs as pa_qk12_avx2 / pa_pv12_avx2 (K^T packed
 * [D][ldk], V packed [t][D] float32, scores in the pair layout of three 4-row
 * blocks); whole 16-token groups of K^T here, a remaining 8-token group on
 * the AVX2 kernel. */
PA_AVX512 static void pa_qk12_avx512(const float *qt, int D, const float *Kt, int64_t ldk, int tlo, int thi,
                                     float *S0, float *S1, float *S2) {
    int t0 = tlo & ~7;
    for (; t0 < thi && t0 + 16 <= ldk; t0 += 16) {
        __m512 c[12];
        for (int i = 0; i < 12; i++) c[i] = _mm512_setzero_ps();
        const float *k = Kt + t0, *q = qt;
        for (int d = 0; d < D; d++, k += ldk, q += 12) {
            const __m512 kv = _mm512_loadu_ps(k);
            for (int i = 0; i < 12; i++) c[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i]), kv, c[i]);
        }
        float *Sb[3] = {S0, S1, S2};
        for (int b = 0; b < 3; b++) {
            const __m512 *r = c + 4 * b;
            pa_store_pairs4(Sb[b], t0, _mm512_castps512_ps256(r[0]), _mm512_castps512_ps256(r[1]),
                            _mm512_castps512_ps256(r[2]), _mm512_castps512_ps256(r[3]));
            pa_store_pairs4(Sb[b], t0 + 8, _mm512_extractf32x8_ps(r[0], 1), _mm512_extractf32x8_ps(r[1], 1),
                            _mm512_extractf32x8_ps(r[2], 1), _mm512_extractf32x8_ps(r[3], 1));
        }
    }
    if (t0 < thi) pa_qk12_avx2(qt, D, Kt, ldk, t0, thi, S0, S1, S2);
}

/* O[i][d0 : d0 + 16*NC] for the 12 rows: 12*NC accumulators in registers.
 * NC = 2 halves the passes over the scores and over O per token and per page
 * (1.1x on head_dim 64 causal prefill); NC a literal after inlining. */
PA_AVX512_INLINE void pa_pv12_pass_z(float *O, int D, int d0, const float *alpha, const float *S0,
                                     const float *S1, const float *S2, const float *V, int tlo, int thi,
                                     int NC) {
    __m512 c[2][12];
    for (int i = 0; i < 12; i++) {
        const __m512 al = _mm512_set1_ps(alpha[i]);
        for (int n = 0; n < NC; n++)
            c[n][i] = _mm512_mul_ps(_mm512_loadu_ps(O + (int64_t)i * D + d0 + 16 * n), al);
    }
    const float *v = V + (int64_t)tlo * D + d0;
    for (int t = tlo; t < thi; t++, v += D) {
        __m512 vv[2];
        for (int n = 0; n < NC; n++) vv[n] = _mm512_loadu_ps(v + 16 * n);
        const int64_t off = (int64_t)(t >> 1) * 8 + (t & 1);
        const float *pb[3] = {S0 + off, S1 + off, S2 + off};
        for (int i = 0; i < 12; i++) {
            const __m512 b = _mm512_set1_ps(pb[i >> 2][2 * (i & 3)]);
            for (int n = 0; n < NC; n++) c[n][i] = _mm512_fmadd_ps(b, vv[n], c[n][i]);
        }
    }
    for (int i = 0; i < 12; i++)
        for (int n = 0; n < NC; n++) _mm512_storeu_ps(O + (int64_t)i * D + d0 + 16 * n, c[n][i]);
}

PA_AVX512 static void pa_pv12_avx512(float *O, int D, const float *alpha, const float *S0, const float *S1,
                                     const float *S2, const float *V, int tlo, int thi) {
    int d = 0;
    for (; d + 32 <= D; d += 32) pa_pv12_pass_z(O, D, d, alpha, S0, S1, S2, V, tlo, thi, 2);
    if (d < D) pa_pv12_pass_z(O, D, d, alpha, S0, S1, S2, V, tlo, thi, 1);
}


/* ---- int8 q.k on AVX512-VNNI -------------------------------------------
 * pa_qk4_i8_avx2's contract; 4 tokens x 4 rows per step (16 accumulators,
 * reduced by pa_hsum16x16 as pa_qk4x4r_z does), vpdpbusd on 64 values of
 * k ^ 0x80 against q8 with the 128 * sum(q8) correction. Needs D % 64 == 0
 * and the CPU's avx512vnni; otherwise, and for the last 1-3 tokens, the
 * AVX2-level kernel (AVX-VNNI or int16 vpmaddwd). */
#if defined(__GNUC__) || defined(__clang__)
#define PAGEDCY_ATTN_HAVE_AVX512VNNI 1
/* vpdpbusd through asm, as pa_dpbusd_avx: with the intrinsic GCC 12 copied the tied
 * accumulator to another register per use and spilled some of the 16 to the stack */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline __m512i pa_dpbusd_z(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")))
static void pa_qk4_i8_vnni_avx512(const int8_t *q8, const float *qs, const int32_t *qsum, int D,
                                  const char *const *K, int npg, int64_t rs, int tpp, int v0, int v1, float *S,
                                  pa_pfcur *pf, int flags) {
    const int nb = (v1 - v0) / 4;
    int per[PA_SUPER_PAGES];
    for (int i = 0; pf && i < npg; i++) per[i] = nb ? (pa_pf_lines_left(pf + i) + nb - 1) / nb : 0;
    int32_t cs[16];               /* element p of a 4x4 block is row (p & 7) >> 1 */
    float ss[16];
    for (int p = 0; p < 16; p++) { cs[p] = 128 * qsum[(p & 7) >> 1]; ss[p] = qs[(p & 7) >> 1]; }
    const __m512i corr = _mm512_loadu_si512(cs);
    const __m512 sc = _mm512_loadu_ps(ss);
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    int j;
    int64_t row;
    pa_vtok_init(v0, npg, tpp, rs, &j, &row);
    int v = v0;
    for (; v + 4 <= v1; v += 4) {
        for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);
        const char *kr[4];
        for (int t = 0; t < 4; t++) {
            kr[t] = K[j] + row;
            pa_vtok_next(npg, tpp, rs, &j, &row);
        }
        __m512i a[16];
        for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_si512();
        for (int64_t d = 0; d < D; d += 64) {
            __m512i u[4];
            for (int t = 0; t < 4; t++) u[t] = _mm512_xor_si512(_mm512_loadu_si512(kr[t] + d), x80);
            for (int r = 0; r < 4; r++) {
                const __m512i y = _mm512_loadu_si512(q8 + (int64_t)r * D + d);
                for (int t = 0; t < 4; t++) a[r * 4 + t] = pa_dpbusd_z(a[r * 4 + t], u[t], y);
            }
        }
        __m512i w[16];            /* pa_qk4x4r_z's order */
        for (int p = 0; p < 16; p++) {
            const int t = 2 * (p >> 3) + (p & 1), r = (p & 7) >> 1;
            w[4 * (p & 3) + (p >> 2)] = a[r * 4 + t];
        }
        /* the K rows' scales in the same element order (tokens 0 1 0 1 ... in lanes 0-7,
         * 2 3 2 3 ... in 8-15), built in registers: written to the stack as 16 floats and
         * read back as one vector they stalled store-to-load forwarding */
        const __m128 ka = _mm_unpacklo_ps(_mm_load_ss((const float *)(kr[0] + D)),
                                          _mm_load_ss((const float *)(kr[1] + D)));
        const __m128 kb = _mm_unpacklo_ps(_mm_load_ss((const float *)(kr[2] + D)),
                                          _mm_load_ss((const float *)(kr[3] + D)));
        const __m512 kss = _mm512_insertf32x8(
            _mm512_castps256_ps512(_mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(ka)))),
            _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(kb))), 1);
        /* reduced and corrected on integers (exact), one conversion: the sums stay
         * below 2^24 for D <= 512, so the value is the float sums' bit for bit */
        const __m512 h = _mm512_cvtepi32_ps(_mm512_sub_epi32(pa_hsum16x16_epi32(w), corr));
        _mm512_storeu_ps(S + (v >> 1) * 8, _mm512_mul_ps(h, _mm512_mul_ps(sc, kss)));
    }
    if (v < v1) pa_qk4_i8_avx2(q8, qs, qsum, D, K, npg, rs, tpp, v, v1, S, pf, flags);
    else for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, pa_pf_lines_left(pf + i), flags);
}

#endif

PA_AVX512 static void pa_qk4_i8_avx512(const int8_t *q8, const float *qs, const int32_t *qsum, int D,
                                       const char *const *K, int npg, int64_t rs, int tpp, int v0, int v1, float *S,
                                       pa_pfcur *pf, int flags) {
#ifdef PAGEDCY_ATTN_HAVE_AVX512VNNI
    if (D % 64 == 0 && !(flags & PA_TUNE_NO_VNNI) && pagedcy_cpu_has_avx512vnni()) {
        pa_qk4_i8_vnni_avx512(q8, qs, qsum, D, K, npg, rs, tpp, v0, v1, S, pf, flags);
        return;
    }
#endif
    pa_qk4_i8_avx2(q8, qs, qsum, D, K, npg, rs, tpp, v0, v1, S, pf, flags);
}
#define pa_qk_i8_ok_avx512 pa_qk_i8_ok_avx2

/* int8 P.V of the int8 q.k path: pa_pv4_i8_avx2's contract and numerics
 * (the same pa_p16_chunk weights), 32 columns per pass with 512-bit
 * vpdpwssd. Token pairs are interleaved by 256-bit unpacks, which work
 * within 128-bit lanes, so accumulator 0 holds columns {0-7, 16-23} and
 * accumulator 1 {8-15, 24-31}; two 128-bit shuffles put them in order once
 * per pass. Only with AVX512-VNNI (pa_pv_i8_ok_avx512): the 256-bit integer
 * P.V measured 1.0x the 512-bit float one there. */
#ifdef PAGEDCY_ATTN_HAVE_AVX512VNNI
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")))
static void pa_pv4_i8_vnni_avx512(float *O, int D, const float *alpha, float *S, const char *const *V,
                                  int npg, int64_t rs, int tpp, int v0, int v1, pa_pfcur *pf, int flags) {
    const int nch = (v1 - v0 + 63) / 64, passes = nch * (D / 32);
    int per[PA_SUPER_PAGES];
    for (int i = 0; pf && i < npg; i++) per[i] = (pa_pf_lines_left(pf + i) + passes - 1) / passes;
    int16_t Q[32 * 8] __attribute__((aligned(32)));
    float ps[8];
    const char *rows[66];
    int j;
    int64_t row;
    pa_vtok_init(v0, npg, tpp, rs, &j, &row);
    for (int c0 = v0; c0 < v1; c0 += 64) {
        const int c1 = c0 + 64 < v1 ? c0 + 64 : v1, np = (c1 - c0 + 1) / 2, odd = (c1 - c0) & 1;
        pa_vtok_rows(rows, c1 - c0, V, npg, tpp, rs, &j, &row);
        if (odd) rows[c1 - c0] = rows[c1 - c0 - 1];     /* a duplicate: nothing beyond is read */
        pa_p16_chunk(Q, ps, S + (int64_t)(c0 >> 1) * 8, rows, np, D, odd);
        __m512 al[4], pr[4];
        for (int r = 0; r < 4; r++) {
            al[r] = _mm512_set1_ps(c0 == v0 ? alpha[r] : 1.0f);
            pr[r] = _mm512_set1_ps(ps[2 * r]);
        }
        for (int64_t d = 0; d < D; d += 32) {
            for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);
            __m512i a[4][2];
            for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm512_setzero_si512();
            const int32_t *qp = (const int32_t *)Q;
            for (int i = 0; i < np; i++, qp += 4) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(rows[2 * i] + d));
                const __m256i y = _mm256_loadu_si256((const __m256i *)(rows[2 * i + 1] + d));
                const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(x, y));
                const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(x, y));
                for (int r = 0; r < 4; r++) {
                    const __m512i b = _mm512_set1_epi32(qp[r]);
                    a[r][0] = _mm512_dpwssd_epi32(a[r][0], w0, b);
                    a[r][1] = _mm512_dpwssd_epi32(a[r][1], w1, b);
                }
            }
            for (int r = 0; r < 4; r++) {
                float *o = O + (int64_t)r * D + d;
                const __m512 lo = _mm512_cvtepi32_ps(_mm512_shuffle_i64x2(a[r][0], a[r][1], 0x44));
                const __m512 hi = _mm512_cvtepi32_ps(_mm512_shuffle_i64x2(a[r][0], a[r][1], 0xEE));
                _mm512_storeu_ps(o, _mm512_fmadd_ps(pr[r], lo, _mm512_mul_ps(_mm512_loadu_ps(o), al[r])));
                _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(pr[r], hi, _mm512_mul_ps(_mm512_loadu_ps(o + 16), al[r])));
            }
        }
    }
    for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, pa_pf_lines_left(pf + i), flags);
}
#endif

PA_AVX512 static void pa_pv4_i8_avx512(float *O, int D, const float *alpha, float *S, const char *const *V,
                                       int npg, int64_t rs, int tpp, int v0, int v1, pa_pfcur *pf, int flags) {
#ifdef PAGEDCY_ATTN_HAVE_AVX512VNNI
    if (D % 32 == 0 && !(flags & PA_TUNE_NO_VNNI) && pagedcy_cpu_has_avx512vnni()) {
        pa_pv4_i8_vnni_avx512(O, D, alpha, S, V, npg, rs, tpp, v0, v1, pf, flags);
        return;
    }
#endif
    pa_pv4_i8_avx2(O, D, alpha, S, V, npg, rs, tpp, v0, v1, pf, flags);
}

#ifdef PAGEDCY_ATTN_HAVE_AVX512VNNI
static inline int pa_pv_i8_ok_avx512(int flags) { return !(flags & PA_TUNE_NO_VNNI) && pagedcy_cpu_has_avx512vnni(); }
#else
static inline int pa_pv_i8_ok_avx512(int flags) { (void)flags; return 0; }
#endif

/* Decode entry points, same signatures as the AVX2 ones; 16-wide loads widen
 * bf16 in order, so perm is never set here. */
PA_AVX512 static void pa_qk4_avx512(const float *q, int D, const void *K, int64_t ks, int tlo, int thi,
                                    float *S, int Sld, pa_pfcur *pf, int flags, int dtype, int perm) {
    (void)Sld; (void)perm;
    PA_DISPATCH_DTYPE(dtype, DT, pa_qk4_z(q, D, K, ks, tlo, thi, S, pf, flags, DT));
}

PA_AVX512 static void pa_pv4_avx512(float *O, int D, const float *alpha, const float *P, int Sld,
                                    const void *V, int64_t vs, int tlo, int thi, pa_pfcur *pf, int flags,
                                    int dtype, int perm) {
    (void)Sld; (void)perm;
    PA_DISPATCH_DTYPE(dtype, DT, pa_pv4_z(O, D, alpha, P, V, vs, tlo, thi, pf, flags, DT));
}


/* Several whole pages per step (pagedcy_attn_item.h): scores and P.V in
 * token-major order (the AVX2 and scalar paths go page after page). */
#define pa_super_token_major_avx512(dtype) ((void)(dtype), 1)

PA_AVX512 static void pa_qk4v_avx512(const float *q, int D, const char *const *K, int npg, int T, int64_t ks,
                                     float *S, pa_pfcur *pf, int flags, int dtype, int perm) {
    (void)perm;
    PA_DISPATCH_DTYPE(dtype, DT, pa_qk4v_z(q, D, K, npg, T, ks * pa_dtype_bytes(DT), S, pf, flags, DT));
}

PA_AVX512 static void pa_pv4v_avx512(float *O, int D, const float *alpha, const float *P,
                                     const char *const *V, int npg, int T, int64_t vs, pa_pfcur *pf,
                                     int flags, int dtype, int perm) {
    (void)perm;
    PA_DISPATCH_DTYPE(dtype, DT, pa_pv4v_z(O, D, alpha, P, V, npg, T, vs, pf, flags, DT));
}

/* Packing and scaling are bandwidth-trivial: the AVX2 versions serve. */
#define pa_pack_kt_avx512 pa_pack_kt_avx2
#define pa_pack_row_avx512 pa_pack_row_avx2
#define pa_scale_copy_avx512 pa_scale_copy_avx2
static inline int pa_kv_perm_avx512(int dtype, int D, int packed, int flags) {
    (void)dtype; (void)D; (void)packed; (void)flags;
    return 0;
}

#endif /* AVX2 available */
#endif
