/* AVX2/FMA/F16C building blocks of the paged-attention kernel.
 *
 * Every function carries the target attribute, so this header compiles in a
 * portable build; the driver only calls into it after pagedcy_use_simd().
 * The head dimension must be a multiple of 8 (the driver checks).
 *
 * Where decode time goes (AMD EPYC Zen 4 with PAGEDCY_SIMD=avx2, the proxy
 * for a Zen 3; H 32 / Hkv 8 / D 128, K/V in L2, 1 thread, per token and KV
 * head): fp16 ~105 cycles, of which the 128 FMAs are 64. In isolation the
 * 3-token score kernel (pa_qk4_tri) runs at the FMA peak and P.V at ~90% of
 * it; in the item the scores take ~38 cycles, P.V ~40, the softmax ~8, and
 * stepping the prefetch cursors costs ~12% of the whole (the prefetch
 * instructions themselves next to nothing). int8 with quantize_query: ~95
 * cycles, the q.k and P.V inner loops each bound near 20 by vpmaddwd and
 * vpmovsxbw sharing two pipes with the vpaddd.
 *
 * Tried there and dropped (interleaved A/B, same sitting):
 * - unpack/add reductions instead of vhaddps / vphaddd (vhaddps issues
 *   every 2 cycles on Zen 4): 0.99-1.02x fp16, 1.0x i8q;
 * - P.V weights stored pre-broadcast (8 lanes each) and read as FMA memory
 *   operands instead of vbroadcastss: 0.89x fp16 (twice the 256-bit loads);
 * - 24-column P.V passes (12 accumulators, 4 x 24 + 2 x 16 for D 128):
 *   1.01-1.02x; P.V with the 4 pages' row pointers in registers (no
 *   page/row stepping per token): 1.0x;
 * - prefetcht0 of the next 6-token block's K rows: 1.0x in L2, 0.95x DRAM;
 * - cheaper prefetch stepping: one offset for the npg cursors of a step (the
 *   same addresses in the same order, checked), a round robin of one cursor
 *   per step, or every other step with twice the lines: 1.04-1.06x with K/V
 *   in cache, but 0.56-0.80x fp32 decode from DRAM (fp16 0.90-1.02x);
 * - prefetching only the first 4 or 8 rows of each next slice and leaving
 *   the rest to the hardware prefetchers: 0.4-0.5x from DRAM;
 * - the int16 q.k with q in a register, 2 tokens per pass: 1.0x.
 */
#ifndef PAGEDCY_ATTN_AVX2_H
#define PAGEDCY_ATTN_AVX2_H

#include "pagedcy_attn_types.h"

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
#define PAGEDCY_ATTN_HAVE_AVX2 1
#define PA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PA_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* Eight storage-dtype values -> 8 floats (int8: unscaled). `dtype` is a
 * literal at every call site after inlining, so the branch folds away. */
PA_AVX2_INLINE __m256 pa_ld8(const void *base, int64_t idx, int dtype) {
    if (dtype == PAGEDCY_F32) return _mm256_loadu_ps((const float *)base + idx);
    if (dtype == PAGEDCY_I8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + idx))));
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx));
    if (dtype == PAGEDCY_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* bf16 read directly by the decode kernels ("bf16, permuted"): a bf16 is
 * the top half of its float32, so of 16 values loaded as 8 int32 lanes the
 * even ones are lane << 16 and the odd ones lane & 0xFFFF0000. No zero
 * register is needed (the unpacks against zero used before took one, and
 * with 12 accumulators the 3-token q.k then folded every query load into
 * its FMAs: 30 loads per 24 FMAs). An item using this mode stores its
 * queries and accumulators with each 16-chunk split into its even then its
 * odd elements (pa_scale_copy_avx2, PA_ORDER_TO_KERNEL) and interleaves
 * them back when writing results (PA_ORDER_FROM_KERNEL). The kernels take
 * this as a `perm` argument beside the dtype. Measured (AMD EPYC Zen 4,
 * PAGEDCY_SIMD=avx2, 1 thread, bf16 decode with K/V in L2, 1 x 256, H 32 /
 * Hkv 8 / D 128): 120 -> 108 cycles per token and KV head (fp16: 108);
 * 32 x 2048 from DRAM 18.2 -> 17.1 ms on 1 thread, 9.30 -> 8.67 ms on 2
 * (interleaved A/B, 3 rounds). */
#define PA_BF16_EVEN(x) _mm256_castsi256_ps(_mm256_slli_epi32((x), 16))
#define PA_BF16_ODD(x) _mm256_castsi256_ps(_mm256_and_si256((x), _mm256_set1_epi32((int)0xFFFF0000u)))
/* The odd elements with two shifts, for loops with no register left for the mask. */
#define PA_BF16_ODD_SH(x) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32((x), 16), 16))

PA_AVX2_INLINE void pa_ld16_bf16p(const void *base, int64_t idx, __m256 *lo, __m256 *hi) {
    __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + idx));
    *lo = PA_BF16_EVEN(x);
    *hi = PA_BF16_ODD(x);
}

/* dst = src * scale, each 16-chunk reordered: `to_kernel` splits it into its
 * even then its odd elements (the lane order of pa_ld16_bf16p), else the
 * reverse. n % 16 == 0. */
PA_AVX2_INLINE void pa_bf16_order_scale(float *dst, const float *src, int n, float scale, int to_kernel) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int d = 0; d < n; d += 16) {
        const __m256 a = _mm256_loadu_ps(src + d), b = _mm256_loadu_ps(src + d + 8);
        __m256 x, y;
        if (to_kernel) {
            /* per 128-bit lane [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit
             * quarters put in order 0, 2, 1, 3 */
            x = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
            y = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
            x = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(x), _MM_SHUFFLE(3, 1, 2, 0)));
            y = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(y), _MM_SHUFFLE(3, 1, 2, 0)));
        } else {
            /* a: evens, b: odds -> [a0 b0 a1 b1 | a4 b4 a5 b5], [a2 b2 a3 b3 | a6 b6 a7 b7] */
            const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
            x = _mm256_permute2f128_ps(lo, hi, 0x20);
            y = _mm256_permute2f128_ps(lo, hi, 0x31);
        }
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(x, s));
        _mm256_storeu_ps(dst + d + 8, _mm256_mul_ps(y, s));
    }
}

/* Eight dot-product accumulators -> one vector [a,b,c,d,e,f,g,h] of their
 * sums; one transpose-add instead of eight horizontal reductions. */
PA_AVX2_INLINE __m256 pa_hsum8(__m256 a, __m256 b, __m256 c, __m256 d,
                               __m256 e, __m256 f, __m256 g, __m256 h) {
    __m256 t0 = _mm256_hadd_ps(a, b), t1 = _mm256_hadd_ps(c, d);
    __m256 t2 = _mm256_hadd_ps(e, f), t3 = _mm256_hadd_ps(g, h);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp(x) = 2^fx * p(r), r = x - fx*ln2 (ln2 in two parts), p the Cephes
 * polynomial: y = p(r) for one vector width; `w` is the intrinsic prefix
 * (_mm256 or _mm512), so the AVX2 and AVX-512 exps share the coefficients.
 * The degree-5 part by Estrin's scheme (three independent FMAs, then r^2 and
 * r^4): 3 FMA latencies deep instead of Horner's 5, for the softmax's exp
 * pass, where each vector is one long dependency chain; max error 1.26 ulp
 * against Horner's 1.24 over every 16th float of [-87, 88]. */
#define PA_EXP_POLY(w, fx, x, y) do { \
        x = w##_fnmadd_ps(fx, w##_set1_ps(0.693359375f), x); \
        x = w##_fnmadd_ps(fx, w##_set1_ps(-2.12194440e-4f), x); \
        const __typeof__(x) x2_ = w##_mul_ps(x, x), x4_ = w##_mul_ps(x2_, x2_); \
        const __typeof__(x) p01_ = w##_fmadd_ps(w##_set1_ps(1.9875691500E-4f), x, w##_set1_ps(1.3981999507E-3f)); \
        const __typeof__(x) p23_ = w##_fmadd_ps(w##_set1_ps(8.3334519073E-3f), x, w##_set1_ps(4.1665795894E-2f)); \
        const __typeof__(x) p45_ = w##_fmadd_ps(w##_set1_ps(1.6666665459E-1f), x, w##_set1_ps(5.0000001201E-1f)); \
        y = w##_fmadd_ps(p01_, x4_, w##_fmadd_ps(p23_, x2_, p45_)); \
        y = w##_fmadd_ps(y, x2_, w##_add_ps(x, w##_set1_ps(1.0f))); \
    } while (0)

/* exp for x <= 88 (Cephes polynomial, ~2 ulp). Arguments below the float
 * range, -inf and NaN give exactly 0, which is what a masked score needs. */
PA_AVX2_INLINE __m256 pa_exp8(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_GE_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 y;
    PA_EXP_POLY(_mm256, fx, x, y);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_and_ps(y, keep);
}

/* tanh via exp(-2|x|); near 0 that loses bits to cancellation, so a short
 * odd Taylor series takes over for |x| < 0.125 (truncation < 3e-10). */
PA_AVX2_INLINE __m256 pa_tanh8(__m256 x) {
    const __m256 signmask = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(signmask, x);
    __m256 e = pa_exp8(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    __m256 big = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e),
                               _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 x2 = _mm256_mul_ps(ax, ax);
    __m256 p = _mm256_set1_ps(-17.0f / 315.0f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), ax, ax);
    __m256 small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.125f), _CMP_LT_OQ);
    __m256 r = _mm256_blendv_ps(big, p, small);
    return _mm256_or_ps(r, _mm256_and_ps(signmask, x));
}

/* q_r . k_t for 4 packed query rows (stride D) and two K rows given by
 * their base pointers, returned as [r0t0, r0t1, r1t0, r1t1, ...]. Row base
 * pointers + one shared index keep address arithmetic out of the loop. */
PA_AVX2_INLINE __m256 pa_qk4_pair(const float *q, int D, const char *kb0, const char *kb1, int dtype,
                                 int perm) {
    const float *q0 = q, *q1 = q + D, *q2 = q + 2 * D, *q3 = q + 3 * D;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
#define PA_QK_STEPK(dd, k0, k1) do { \
        __m256 x0 = _mm256_loadu_ps(q0 + (dd)), x1 = _mm256_loadu_ps(q1 + (dd)); \
        a0 = _mm256_fmadd_ps(x0, k0, a0); a1 = _mm256_fmadd_ps(x0, k1, a1); \
        a2 = _mm256_fmadd_ps(x1, k0, a2); a3 = _mm256_fmadd_ps(x1, k1, a3); \
        __m256 x2 = _mm256_loadu_ps(q2 + (dd)), x3 = _mm256_loadu_ps(q3 + (dd)); \
        a4 = _mm256_fmadd_ps(x2, k0, a4); a5 = _mm256_fmadd_ps(x2, k1, a5); \
        a6 = _mm256_fmadd_ps(x3, k0, a6); a7 = _mm256_fmadd_ps(x3, k1, a7); \
    } while (0)
#define PA_QK_STEP(dd) do { \
        __m256 k0_ = pa_ld8(kb0, (dd), dtype), k1_ = pa_ld8(kb1, (dd), dtype); \
        PA_QK_STEPK((dd), k0_, k1_); \
    } while (0)
    int64_t d = 0;       /* 64-bit: no sign extension per load in the loop */
    if (perm) {
        for (; d < D; d += 16) {
            __m256 k0l, k0h, k1l, k1h;
            pa_ld16_bf16p(kb0, d, &k0l, &k0h);
            pa_ld16_bf16p(kb1, d, &k1l, &k1h);
            PA_QK_STEPK(d, k0l, k1l);
            PA_QK_STEPK(d + 8, k0h, k1h);
        }
    } else {
        for (; d + 16 <= D; d += 16) { PA_QK_STEP(d); PA_QK_STEP(d + 8); }
        if (d < D) PA_QK_STEP(d);
    }
#undef PA_QK_STEP
#undef PA_QK_STEPK
    return pa_hsum8(a0, a1, a2, a3, a4, a5, a6, a7);
}

/* Three tokens against 4 query rows with 12 accumulators (8 chains leave
 * the FMA ports ~10% idle at a 4-cycle latency): returns the pair vector of
 * tokens (kb0, kb1) and the 4 scores [r0..r3] of token kb2. q is read as FMA
 * memory operands, so 12 accumulators + 3 K registers fit in 16. */
PA_AVX2_INLINE void pa_qk4_tri(const float *q, int D, const char *kb0, const char *kb1, const char *kb2,
                               int dtype, int perm, __m256 *pair, __m128 *single) {
    const float *q0 = q, *q1 = q + D, *q2 = q + 2 * D, *q3 = q + 3 * D;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
#define PA_TRI_FMA(d_, k0, k1, k2) do { \
        __m256 x = _mm256_loadu_ps(q0 + (d_)); \
        a00 = _mm256_fmadd_ps(x, k0, a00); a01 = _mm256_fmadd_ps(x, k1, a01); a02 = _mm256_fmadd_ps(x, k2, a02); \
        x = _mm256_loadu_ps(q1 + (d_)); \
        a10 = _mm256_fmadd_ps(x, k0, a10); a11 = _mm256_fmadd_ps(x, k1, a11); a12 = _mm256_fmadd_ps(x, k2, a12); \
        x = _mm256_loadu_ps(q2 + (d_)); \
        a20 = _mm256_fmadd_ps(x, k0, a20); a21 = _mm256_fmadd_ps(x, k1, a21); a22 = _mm256_fmadd_ps(x, k2, a22); \
        x = _mm256_loadu_ps(q3 + (d_)); \
        a30 = _mm256_fmadd_ps(x, k0, a30); a31 = _mm256_fmadd_ps(x, k1, a31); a32 = _mm256_fmadd_ps(x, k2, a32); \
    } while (0)
    if (perm) {
        /* bf16, permuted lanes: the even elements of a 16-chunk of the
         * three rows, then the odd ones from a second load of the same 32
         * bytes (an L1 hit; the row pointers go through an empty asm so the
         * compiler cannot merge the loads and keep six K vectors live, which
         * with 12 accumulators spills). The odd ones take two shifts: 12
         * accumulators, 3 K vectors and the query leave no register for
         * pa_ld16_bf16p's mask. */
        const char *h0 = kb0, *h1 = kb1, *h2 = kb2;
        __asm__("" : "+r"(h0), "+r"(h1), "+r"(h2));
#define PA_TRI_LD(p) _mm256_loadu_si256((const __m256i *)((p) + 2 * d))
        for (int64_t d = 0; d < D; d += 16) {
            PA_TRI_FMA(d, PA_BF16_EVEN(PA_TRI_LD(kb0)), PA_BF16_EVEN(PA_TRI_LD(kb1)), PA_BF16_EVEN(PA_TRI_LD(kb2)));
            PA_TRI_FMA(d + 8, PA_BF16_ODD_SH(PA_TRI_LD(h0)), PA_BF16_ODD_SH(PA_TRI_LD(h1)),
                       PA_BF16_ODD_SH(PA_TRI_LD(h2)));
        }
#undef PA_TRI_LD
    } else {
        for (int64_t d = 0; d < D; d += 8) {
            __m256 k0 = pa_ld8(kb0, d, dtype), k1 = pa_ld8(kb1, d, dtype), k2 = pa_ld8(kb2, d, dtype);
            PA_TRI_FMA(d, k0, k1, k2);
        }
    }
#undef PA_TRI_FMA
    *pair = pa_hsum8(a00, a01, a10, a11, a20, a21, a30, a31);
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a02, a12), _mm256_hadd_ps(a22, a32));
    *single = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* Scores of 4 packed query rows (stride D) against tokens [tlo, thi) of one
 * K slice (token stride ks elements), tlo even. 4 rows x 2 tokens per step:
 * 6 loads feed 8 FMAs, and the eight sums are reduced together into one
 * vector that is stored whole in the "pair" layout
 *     S[(t/2)*8 + 2*r + (t&1)] = q_r . k_t
 * (one 32-byte store per token pair; scattering it into per-row arrays made
 * the softmax's vector loads wait on failed store forwarding). A token past
 * thi in the last pair is computed from a duplicate of the previous row, so
 * nothing beyond the slice is read. pf, when not NULL, is a prefetch cursor
 * over the next page (pa_pfcur); its lines are issued a few per token pair
 * so the page walk's random jumps do not stall on DRAM latency. */
PA_AVX2_INLINE void pa_qk4_t(const float *q, int D, const void *K, int64_t ks,
                             int tlo, int thi, float *S, int Sld,
                             pa_pfcur *pf, int flags, int dtype, int perm) {
    const int64_t es = pa_dtype_bytes(dtype);
    /* prefetch lines per token pair */
    const int per_pair = pf ? (pa_pf_lines_left(pf) + (thi - tlo + 1) / 2 - 1) / ((thi - tlo + 1) / 2) : 0;
    int t = tlo;
    if (!(flags & PA_TUNE_NO_QK3)) {
        /* six tokens = pairs (t, t+1), (t+2, t+3), (t+4, t+5) from two
         * 3-token passes: (t, t+1 | t+2) and (t+4, t+5 | t+3) */
        for (; t + 6 <= thi; t += 6) {
            const char *kb = (const char *)K + (int64_t)t * ks * es;
            const int64_t rs = ks * es;
            if (pf) pa_pf_step(pf, 3 * per_pair, flags);
            __m256 p0, p2;
            __m128 s2, s3;
            pa_qk4_tri(q, D, kb, kb + rs, kb + 2 * rs, dtype, perm, &p0, &s2);
            pa_qk4_tri(q, D, kb + 4 * rs, kb + 5 * rs, kb + 3 * rs, dtype, perm, &p2, &s3);
            __m256 p1 = _mm256_set_m128(_mm_unpackhi_ps(s2, s3), _mm_unpacklo_ps(s2, s3));
            float *o = S + (t >> 1) * 8;
            _mm256_storeu_ps(o, p0);
            _mm256_storeu_ps(o + 8, p1);
            _mm256_storeu_ps(o + 16, p2);
        }
    }
    for (; t < thi; t += 2) {
        int two = t + 1 < thi;
        int64_t o0 = (int64_t)t * ks, o1 = two ? o0 + ks : o0;
        if (pf) pa_pf_step(pf, per_pair, flags);
        _mm256_storeu_ps(S + (t >> 1) * 8,
                         pa_qk4_pair(q, D, (const char *)K + o0 * es, (const char *)K + o1 * es, dtype, perm));
    }
    if (pf) pa_pf_step(pf, pa_pf_lines_left(pf), flags);
    (void)Sld;
}

/* The 4 rows' rescale factors as vectors, declared per column pass of the
 * P.V kernels (al0..al3), not once per call: live across the token loop they
 * took 4 of the 16 ymm registers, and GCC spilled two of the 8 accumulators
 * to the stack there (a store and a reload in their FMA chains). Measured
 * (AMD EPYC Zen 4, PAGEDCY_SIMD=avx2, 1 thread, 4 x 256 in cache): fp16
 * decode 1.29x, bf16 1.28x; 32 x 2048 from DRAM 1.23x, 1.20x. O is stored in
 * every pass and may alias alpha, so the compiler cannot hoist the loads. */
#define PA_PV_ALPHA() \
    const __m256 al0 = _mm256_broadcast_ss(alpha), al1 = _mm256_broadcast_ss(alpha + 1); \
    const __m256 al2 = _mm256_broadcast_ss(alpha + 2), al3 = _mm256_broadcast_ss(alpha + 3)

/* O[r] = O[r]*alpha[r] + sum_{t in [tlo,thi)} P[r][t] V[t] for 4 rows, with
 * P in the pair layout of pa_qk4_t (tlo even). A 16-float slice of the 4
 * output rows (8 accumulators) stays in registers across the tokens; each V
 * load is shared by the 4 rows. */
PA_AVX2_INLINE void pa_pv4_t(float *O, int D, const float *alpha, const float *P, int Sld,
                             const void *V, int64_t vs, int tlo, int thi,
                             pa_pfcur *pf, int flags, int dtype, int perm) {
    (void)Sld;
    const int64_t es = pa_dtype_bytes(dtype);
    float *O0 = O, *O1 = O + D, *O2 = O + 2 * D, *O3 = O + 3 * D;
    /* prefetch lines per 16-float chunk of the output */
    const int per_chunk = pf ? (pa_pf_lines_left(pf) + D / 16 - 1) / (D / 16 > 0 ? D / 16 : 1) : 0;
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        if (pf) pa_pf_step(pf, per_chunk, flags);
        PA_PV_ALPHA();
        __m256 c00 = _mm256_mul_ps(_mm256_loadu_ps(O0 + d), al0), c01 = _mm256_mul_ps(_mm256_loadu_ps(O0 + d + 8), al0);
        __m256 c10 = _mm256_mul_ps(_mm256_loadu_ps(O1 + d), al1), c11 = _mm256_mul_ps(_mm256_loadu_ps(O1 + d + 8), al1);
        __m256 c20 = _mm256_mul_ps(_mm256_loadu_ps(O2 + d), al2), c21 = _mm256_mul_ps(_mm256_loadu_ps(O2 + d + 8), al2);
        __m256 c30 = _mm256_mul_ps(_mm256_loadu_ps(O3 + d), al3), c31 = _mm256_mul_ps(_mm256_loadu_ps(O3 + d + 8), al3);
        const int64_t vsb = vs * es;
        const char *vr = (const char *)V + ((int64_t)tlo * vs + d) * es;
/* One P·V step over a V row (also used by the multi-page P·V below; #undef there). */
#define PA_PV_STEP(row, pp) do { \
            __m256 v0, v1; \
            if (perm) pa_ld16_bf16p((row), 0, &v0, &v1); \
            else { v0 = pa_ld8((row), 0, dtype); v1 = pa_ld8((row), 8, dtype); } \
            __m256 b; \
            b = _mm256_broadcast_ss((pp)); c00 = _mm256_fmadd_ps(b, v0, c00); c01 = _mm256_fmadd_ps(b, v1, c01); \
            b = _mm256_broadcast_ss((pp) + 2); c10 = _mm256_fmadd_ps(b, v0, c10); c11 = _mm256_fmadd_ps(b, v1, c11); \
            b = _mm256_broadcast_ss((pp) + 4); c20 = _mm256_fmadd_ps(b, v0, c20); c21 = _mm256_fmadd_ps(b, v1, c21); \
            b = _mm256_broadcast_ss((pp) + 6); c30 = _mm256_fmadd_ps(b, v0, c30); c31 = _mm256_fmadd_ps(b, v1, c31); \
        } while (0)
/* The 8-column tail's step (D % 16 == 8): weights pp[0], [2], [4], [6] times V vector x. */
#define PA_PV_STEP8(x, pp) do { \
            c0 = _mm256_fmadd_ps(_mm256_broadcast_ss((pp)), (x), c0); \
            c1 = _mm256_fmadd_ps(_mm256_broadcast_ss((pp) + 2), (x), c1); \
            c2 = _mm256_fmadd_ps(_mm256_broadcast_ss((pp) + 4), (x), c2); \
            c3 = _mm256_fmadd_ps(_mm256_broadcast_ss((pp) + 6), (x), c3); \
        } while (0)
        int t = tlo;
        const float *pp = P + (tlo >> 1) * 8;
        for (; t + 2 <= thi; t += 2, vr += 2 * vsb, pp += 8) { PA_PV_STEP(vr, pp); PA_PV_STEP(vr + vsb, pp + 1); }
        if (t < thi) PA_PV_STEP(vr, pp);
        _mm256_storeu_ps(O0 + d, c00); _mm256_storeu_ps(O0 + d + 8, c01);
        _mm256_storeu_ps(O1 + d, c10); _mm256_storeu_ps(O1 + d + 8, c11);
        _mm256_storeu_ps(O2 + d, c20); _mm256_storeu_ps(O2 + d + 8, c21);
        _mm256_storeu_ps(O3 + d, c30); _mm256_storeu_ps(O3 + d + 8, c31);
    }
    if (pf) pa_pf_step(pf, pa_pf_lines_left(pf), flags);
    if (d < D) {   /* D % 16 == 8 */
        PA_PV_ALPHA();
        __m256 c0 = _mm256_mul_ps(_mm256_loadu_ps(O0 + d), al0);
        __m256 c1 = _mm256_mul_ps(_mm256_loadu_ps(O1 + d), al1);
        __m256 c2 = _mm256_mul_ps(_mm256_loadu_ps(O2 + d), al2);
        __m256 c3 = _mm256_mul_ps(_mm256_loadu_ps(O3 + d), al3);
        for (int t = tlo; t < thi; t++) {
            const __m256 v0 = pa_ld8(V, (int64_t)t * vs + d, dtype);
            PA_PV_STEP8(v0, P + (t >> 1) * 8 + (t & 1));
        }
        _mm256_storeu_ps(O0 + d, c0); _mm256_storeu_ps(O1 + d, c1);
        _mm256_storeu_ps(O2 + d, c2); _mm256_storeu_ps(O3 + d, c3);
    }
}

/* ---- int8 q.k: integer dot products (pagedcy_attn_types.h) ---------------
 * Scores of 4 quantized query vectors against virtual tokens [v0, v1) (v0
 * even) of npg pages in token-major order (token v: row v / npg of page
 * v % npg, rows rs bytes apart; npg 1 is one page) or, tpp > 0, page after
 * page (pa_vtok_init), 6 tokens x 4 rows per step (2 for the last), in the pair layout, times the queries' and the K rows' scales (the
 * float32 after each row's D values). D % 32 == 0. Two ways to multiply int8 by
 * int8 on 256-bit vectors:
 *   AVX-VNNI: vpdpbusd (u8 x s8, 4 products summed into each int32 lane,
 *     no saturation) on k ^ 0x80 = k + 128 in [0, 255] against q8: the sum
 *     is q.k + 128 * sum(q8), corrected after the reduction. 1 + 4 uops per
 *     32 values of a token for 4 rows, against 16 for the float path.
 *   AVX2 (Zen 3 and older): k and q8 widened to int16, vpmaddwd (pairs of
 *     int16 products summed into int32) + vpaddd (pa_qk4_i8_w16_avx2).
 * pf: npg prefetch cursors (or NULL), stepped evenly over the pairs.
 * Measured (Intel Xeon with AVX-512, shared 2-vCPU VM, 1 thread, CPU time,
 * H 32 / Hkv 8 / D 128, against fp16 in the same run): 32 x 2048 from DRAM
 * 1.88x fp16 on the AVX2 kernels (float int8 path 1.52x), 1.66x on AVX-512
 * (1.31x); with K/V in L2 (1 x 256) 1.14x (AVX-VNNI), 0.99x (vpmaddubsw)
 * and 1.29x (AVX512-VNNI). In L2 the float P.V is what is left: 64 FMAs and
 * 16 int8 -> float conversions per token and KV head, as for fp16. */
/* pa_hsum8 on int32 accumulators (exact; one conversion to float after). */
PA_AVX2_INLINE __m256i pa_hsum8_epi32(__m256i a, __m256i b, __m256i c, __m256i d,
                                      __m256i e, __m256i f, __m256i g, __m256i h) {
    __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(e, f), _mm256_hadd_epi32(g, h));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* Three tokens (k0, k1 | k2) against the 4 quantized rows with 12 int32
 * accumulators: the pair vector [r0t0, r0t1, r1t0, ...] of (k0, k1) and the
 * 4 sums [r0..r3] of k2, both exact. 12 accumulators + 3 K registers + the
 * 0x80 constant fill the 16; q8 is read as a memory operand. With 8 (2
 * tokens) the dpbusd chains and the reduction after them left the loop
 * latency-bound: the 6-token blocks made i8q decode with K/V in L2 (1 x
 * 256, H 32 / Hkv 8 / D 128, AVX2 kernels, 1 thread) 1.04x faster (Intel
 * Xeon, shared 2-vCPU VM). The vpmaddubsw kernel kept 2 tokens: it needed
 * both k and |k| live, which with 12 accumulators would spill. */
#define PA_QK3_I8(KLD, KPREP, QLD, DOT, STEP, QS, k0, k1, k2, pair, single) do {                     \
        __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;    \
        __m256i a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;                        \
        for (int64_t d = 0; d < D; d += (STEP)) {                                                       \
            const __m256i x0 = KLD((k0) + d), x1 = KLD((k1) + d), x2 = KLD((k2) + d);                  \
            const __m256i u0 = KPREP(x0), u1 = KPREP(x1), u2 = KPREP(x2);                                \
            __auto_type y = QLD(q0 + (QS) * d);                                  \
            a00 = DOT(a00, u0, x0, y); a01 = DOT(a01, u1, x1, y); a02 = DOT(a02, u2, x2, y);             \
            y = QLD(q1 + (QS) * d);                                          \
            a10 = DOT(a10, u0, x0, y); a11 = DOT(a11, u1, x1, y); a12 = DOT(a12, u2, x2, y);             \
            y = QLD(q2 + (QS) * d);                                          \
            a20 = DOT(a20, u0, x0, y); a21 = DOT(a21, u1, x1, y); a22 = DOT(a22, u2, x2, y);             \
            y = QLD(q3 + (QS) * d);                                          \
            a30 = DOT(a30, u0, x0, y); a31 = DOT(a31, u1, x1, y); a32 = DOT(a32, u2, x2, y);             \
        }                                                                                               \
        pair = pa_hsum8_epi32(a00, a01, a10, a11, a20, a21, a30, a31);                                   \
        const __m256i u_ = _mm256_hadd_epi32(_mm256_hadd_epi32(a02, a12), _mm256_hadd_epi32(a22, a32));  \
        single = _mm_add_epi32(_mm256_castsi256_si128(u_), _mm256_extracti128_si256(u_, 1));            \
    } while (0)

/* Scale of the int8 row at p (the float after its D values), as a vector lane. */
#define PA_I8_KS(p) _mm_load_ss((const float *)((p) + D))

/* K loads of a step: 32 int8 values, or 16 widened to int16 (vpmovsxbw from memory). */
#define PA_KLD8(p) _mm256_loadu_si256((const __m256i *)(p))
#define PA_KLD16(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
/* The queries' values of a step as DOT takes them: a vector, or its address. */
#define PA_QLD8(p) _mm256_loadu_si256((const __m256i *)(p))
#define PA_QPTR(p) (p)

/* The int8 q.k kernels' body: KLD loads STEP values of a K row, KPREP
 * prepares them, DOT accumulates one row's products; the queries at QB
 * (const char *), QS bytes per value (q8, or widened to int16). */
#define PA_QK4_I8_BODY(KLD, KPREP, QLD, DOT, CORR, SIX, STEP, QS, QB)                                 \
    const int npairs = (v1 - v0 + 1) / 2;                                                               \
    int per[PA_SUPER_PAGES];                                                                            \
    for (int j = 0; pf && j < npg; j++) per[j] = npairs ? (pa_pf_lines_left(pf + j) + npairs - 1) / npairs : 0; \
    const __m256 sc = _mm256_setr_ps(qs[0], qs[0], qs[1], qs[1], qs[2], qs[2], qs[3], qs[3]);          \
    const __m256i corr = CORR ? _mm256_setr_epi32(128 * qsum[0], 128 * qsum[0], 128 * qsum[1],          \
                                                  128 * qsum[1], 128 * qsum[2], 128 * qsum[2],          \
                                                  128 * qsum[3], 128 * qsum[3])                         \
                              : _mm256_setzero_si256();                                                 \
    const char *q0 = (QB), *q1 = q0 + (QS) * D, *q2 = q0 + 2 * (QS) * D, *q3 = q0 + 3 * (QS) * D;       \
    int j;                                   /* page and row of token v, stepped, not divided */        \
    int64_t row;                                                                                        \
    pa_vtok_init(v0, npg, tpp, rs, &j, &row);                                                           \
    int v = v0;                                                                                         \
    /* six tokens = pairs (v, v+1), (v+2, v+3), (v+4, v+5) from two 3-token                             \
     * passes, (v, v+1 | v+2) and (v+4, v+5 | v+3), as pa_qk4_t does */                                 \
    for (; SIX && v + 6 <= v1; v += 6) {                                                                \
        for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, 3 * per[i], flags);                      \
        const char *r[6];                                                                               \
        for (int i = 0; i < 6; i++) { r[i] = K[j] + row; pa_vtok_next(npg, tpp, rs, &j, &row); }        \
        __m256i p0, p2;                                                                                 \
        __m128i s2, s3;                                                                                 \
        PA_QK3_I8(KLD, KPREP, QLD, DOT, STEP, QS, r[0], r[1], r[2], p0, s2);                                 \
        PA_QK3_I8(KLD, KPREP, QLD, DOT, STEP, QS, r[4], r[5], r[3], p2, s3);                                 \
        const __m256i p1 = _mm256_set_m128i(_mm_unpackhi_epi32(s2, s3), _mm_unpacklo_epi32(s2, s3));    \
        const __m128 ka = _mm_unpacklo_ps(PA_I8_KS(r[0]), PA_I8_KS(r[1]));                              \
        const __m128 kb = _mm_unpacklo_ps(PA_I8_KS(r[2]), PA_I8_KS(r[3]));                              \
        const __m128 kc = _mm_unpacklo_ps(PA_I8_KS(r[4]), PA_I8_KS(r[5]));                              \
        float *o = S + (v >> 1) * 8;                                                                    \
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(p0, corr)), _mm256_mul_ps(sc, \
                         _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(ka))))));                 \
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(p1, corr)), _mm256_mul_ps(sc, \
                         _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(kb))))));                 \
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(p2, corr)), _mm256_mul_ps(sc, \
                         _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(kc))))));                 \
    }                                                                                                   \
    for (; v < v1; v += 2) {                                                                            \
        for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);                          \
        const char *k0 = K[j] + row;                                                                    \
        pa_vtok_next(npg, tpp, rs, &j, &row);                                                           \
        const char *k1 = k0;                 /* past v1: a duplicate, nothing beyond is read */         \
        if (v + 1 < v1) { k1 = K[j] + row; pa_vtok_next(npg, tpp, rs, &j, &row); }                       \
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
        for (int64_t d = 0; d < D; d += (STEP)) {                                                       \
            const __m256i x0 = KLD(k0 + d), x1 = KLD(k1 + d);                                           \
            const __m256i p0 = KPREP(x0), p1 = KPREP(x1);                                                \
            __auto_type y = QLD(q0 + (QS) * d);                                  \
            a0 = DOT(a0, p0, x0, y); a1 = DOT(a1, p1, x1, y);                                            \
            y = QLD(q1 + (QS) * d);                                          \
            a2 = DOT(a2, p0, x0, y); a3 = DOT(a3, p1, x1, y);                                            \
            y = QLD(q2 + (QS) * d);                                          \
            a4 = DOT(a4, p0, x0, y); a5 = DOT(a5, p1, x1, y);                                            \
            y = QLD(q3 + (QS) * d);                                          \
            a6 = DOT(a6, p0, x0, y); a7 = DOT(a7, p1, x1, y);                                            \
        }                                                                                               \
        const __m256i h = _mm256_sub_epi32(pa_hsum8_epi32(a0, a1, a2, a3, a4, a5, a6, a7), corr);        \
        /* times the K rows' scales too (lanes s0, s1, s0, s1, ...): no second pass over S */           \
        const __m128 ks2 = _mm_unpacklo_ps(_mm_load_ss((const float *)(k0 + D)), _mm_load_ss((const float *)(k1 + D))); \
        const __m256 ksc = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(ks2)));                  \
        _mm256_storeu_ps(S + (v >> 1) * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(sc, ksc))); \
    }                                                                                                   \
    for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, pa_pf_lines_left(pf + i), flags)

/* Plain AVX2: K widened to int16 once per token (vpmovsxbw from memory,
 * shared by the 4 rows) against the queries widened once per call, vpmaddwd
 * + vpaddd per row. It replaced vpmaddubsw on |k| against sign(q8, k) =
 * q8 * sign(k) (|k| <= 128, |q8| <= 127: a pair at most 32512, never
 * saturating) and vpmaddwd by ones, which took vpsignb, vpmaddubsw and
 * vpmaddwd per row and 32 values, and k and |k| both live, so only 2-token
 * passes fit in the 16 registers; here k needs one register and 3-token
 * passes (12 accumulators, q as memory operands) fit, as on AVX-VNNI. The
 * int32 sums are exact either way: the same scores. Measured (AMD EPYC Zen
 * 4, PAGEDCY_SIMD=avx2, 1 thread, i8q decode, interleaved A/B): 4 x 256 in
 * cache 0.231 -> 0.207 ms (1.12x), 32 x 2048 from DRAM 15.28 -> 13.74 ms
 * (1.11x). */
#define PA_KSAME(x) (x)
/* vpmaddwd with q from memory, then vpaddd into the tied accumulator, in
 * asm: with intrinsics GCC 12 loaded the queries into registers and spilled
 * accumulators instead. */
PA_AVX2_INLINE __m256i pa_maddwd_accm(__m256i acc, __m256i k, const char *q) {
    __m256i t;
    __asm__("vpmaddwd %2, %1, %0" : "=x"(t) : "x"(k), "m"(*(const __m256i *)q));
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(t));
    return acc;
}
#define PA_I16_DOT_Q(acc, k, k_, q) pa_maddwd_accm((acc), (k), (q))
PA_AVX2 static void pa_qk4_i8_w16_avx2(const int8_t *q8, const float *qs, const int32_t *qsum, int D,
                                       const char *const *K, int npg, int64_t rs, int tpp, int v0, int v1, float *S,
                                       pa_pfcur *pf, int flags) {
    int16_t q16[4 * D];
    for (int i = 0; i < 4 * D; i += 16)
        _mm256_storeu_si256((__m256i *)(q16 + i), PA_KLD16(q8 + i));
    PA_QK4_I8_BODY(PA_KLD16, PA_KSAME, PA_QPTR, PA_I16_DOT_Q, 0, !(flags & PA_TUNE_NO_QK3), 16, 2, (const char *)q16);
}

#if defined(__GNUC__) && (__GNUC__ >= 11 || (defined(__clang__) && __clang_major__ >= 12))
#define PAGEDCY_ATTN_HAVE_AVXVNNI 1
#define PA_I8_XOR80(x) _mm256_xor_si256((x), _mm256_set1_epi8((char)0x80))
/* vpdpbusd through asm: GCC 12 wraps the intrinsic's tied accumulator in a
 * register copy per use (8 vmovdqa per 8 dot products in this loop). */
__attribute__((target("avx2,fma,f16c,avxvnni"), always_inline))
static inline __m256i pa_dpbusd_avx(__m256i acc, __m256i u, __m256i s) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "xm"(s));
    return acc;
}
#define PA_I8_DOT_VNNI(acc, ku, k, q) pa_dpbusd_avx((acc), (ku), (q))
__attribute__((target("avx2,fma,f16c,avxvnni")))
static void pa_qk4_i8_vnni_avx2(const int8_t *q8, const float *qs, const int32_t *qsum, int D,
                                const char *const *K, int npg, int64_t rs, int tpp, int v0, int v1, float *S,
                                pa_pfcur *pf, int flags) {
    PA_QK4_I8_BODY(PA_KLD8, PA_I8_XOR80, PA_QLD8, PA_I8_DOT_VNNI, 1, !(flags & PA_TUNE_NO_QK3), 32, 1, (const char *)q8);
}

static inline int pa_cpu_has_avxvnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = pagedcy_cpu_has_avx2_fma() && __builtin_cpu_supports("avxvnni");
    }
    return cached;
}
#else
static inline int pa_cpu_has_avxvnni(void) { return 0; }
#endif

/* The AVX2-level int8 q.k: AVX-VNNI where the CPU has it (and
 * PA_TUNE_NO_VNNI is clear), else int16 vpmaddwd (pa_qk4_i8_w16_avx2). */
PA_AVX2 static void pa_qk4_i8_avx2(const int8_t *q8, const float *qs, const int32_t *qsum, int D,
                                   const char *const *K, int npg, int64_t rs, int tpp, int v0, int v1, float *S,
                                   pa_pfcur *pf, int flags) {
#ifdef PAGEDCY_ATTN_HAVE_AVXVNNI
    if (!(flags & PA_TUNE_NO_VNNI) && pa_cpu_has_avxvnni()) {
        pa_qk4_i8_vnni_avx2(q8, qs, qsum, D, K, npg, rs, tpp, v0, v1, S, pf, flags);
        return;
    }
#endif
    pa_qk4_i8_w16_avx2(q8, qs, qsum, D, K, npg, rs, tpp, v0, v1, S, pf, flags);
}

/* pa_quantize_q8 (pagedcy_attn_types.h, same results) 32 values at a time,
 * D % 32 == 0: it runs once per item and query vector, and scalar it cost
 * ~10% of a 256-token decode. vcvtps2dq rounds to nearest even, as
 * nearbyintf does in the default rounding mode. */
PA_AVX2 static void pa_quantize_q8_avx2(int8_t *q8, float *qs, int32_t *qsum, const float *q, int D) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(3.402823466e38f);
    __m256 am = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(q + d), absm);
        am = _mm256_max_ps(am, _mm256_and_ps(a, _mm256_cmp_ps(a, big, _CMP_LE_OQ)));   /* finite only */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i sum = _mm256_setzero_si256();
    for (int d = 0; d < D; d += 32) {
        __m256i w[4];
        for (int i = 0; i < 4; i++) {
            __m256 y = _mm256_mul_ps(_mm256_loadu_ps(q + d + 8 * i), inv);
            y = _mm256_and_ps(y, _mm256_cmp_ps(y, y, _CMP_ORD_Q));                     /* NaN -> 0 */
            w[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(y, lo), hi));
            sum = _mm256_add_epi32(sum, w[i]);
        }
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
        _mm256_storeu_si256((__m256i *)(q8 + d), _mm256_permutevar8x32_epi32(b, order));
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    *qs = amax / 127.0f;
    *qsum = _mm_cvtsi128_si32(s4);
}
#define pa_quantize_q8_avx512 pa_quantize_q8_avx2

/* Head dimensions the int8 q.k kernels of this instruction set take. */
static inline int pa_qk_i8_ok_avx2(int D) { return D % 32 == 0; }

/* ---- int8 P.V for the int8 q.k path (pagedcy_attn_types.h, pa_pv4_i8) ---
 * O[r] = O[r]*alpha[r] + sum_v p[r][v] V[v] for virtual tokens [v0, v1) (v0
 * even) of npg pages (rows rs bytes apart), token-major (tpp 0) or page
 * after page (tpp tokens per page, pa_vtok_init): one call covers a
 * multi-page step, so its 64-token chunks span pages (1.03x against a call
 * per 16-token page, which paid the chunk's quantization and the output's
 * loads and stores per page). P
 * the softmax weights in the pair layout (overwritten). Per chunk of up to
 * 64 tokens: p' = p * v_scale(t), quantized per row to int16 (pa_p16_chunk),
 * then int16 x int8 dot products of token pairs: V rows t, t+1 widened to
 * int16 (vpmovsxbw from memory) and interleaved in 128-bit lanes
 * (vpunpck[lh]wd, columns put back in order once per pass: 1.01-1.03x
 * against interleaving the bytes first, Zen 4, PAGEDCY_SIMD=avx2) against
 * the row's (q[t], q[t+1]) broadcast, vpdpwssd (AVX-VNNI) or vpmaddwd +
 * vpaddd into int32, which cannot overflow: 32 pairs x 2 x 32767 x 128 <
 * 2^31. 2 multiply uops per 16 values of a token for 4 rows against 8 FMAs
 * and 2 conversions on the float path. Measured (Intel Xeon, shared 2-vCPU
 * VM, H 32 / Hkv 8 / D 128, AVX2 kernels, against the float P.V in the
 * same run): i8q decode 1.13x with K/V in L2 (1 x 256, 1 thread), 1.11x
 * from DRAM (32 x 2048, 2 threads); the 512-bit version 1.15x, 1.13x. */
PA_AVX2_INLINE void pa_p16_chunk(int16_t *Q, float *ps, float *S, const char *const *rows, int np, int D,
                                 int odd) {
    __m256 vmax = _mm256_setzero_ps();
    for (int i = 0; i < np; i++) {
        /* a token past the range (odd tail) gets weight 0 */
        const __m128 s1 = odd && i == np - 1 ? _mm_setzero_ps() : PA_I8_KS(rows[2 * i + 1]);
        const __m128 s2 = _mm_unpacklo_ps(PA_I8_KS(rows[2 * i]), s1);
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(S + 8 * i),
                                       _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(s2))));
        _mm256_storeu_ps(S + 8 * i, x);
        vmax = _mm256_max_ps(vmax, x);
    }
    vmax = _mm256_max_ps(vmax, _mm256_permute_ps(vmax, 0xB1));     /* row r's max in lanes 2r, 2r+1 */
    const __m256 pos = _mm256_cmp_ps(vmax, _mm256_setzero_ps(), _CMP_GT_OQ);
    const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(32767.0f), vmax), pos);
    _mm256_storeu_ps(ps, _mm256_mul_ps(vmax, _mm256_set1_ps(1.0f / 32767.0f)));
    for (int i = 0; i < np; i++) {
        const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(S + 8 * i), inv));
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q, q), 0x08);
        _mm_storeu_si128((__m128i *)(Q + 8 * i), _mm256_castsi256_si128(w));
    }
}

#define PA_LANES_FIX(a, b) do {                                                                     \
        const __m256i lo_ = _mm256_permute2x128_si256((a), (b), 0x20);                                 \
        (b) = _mm256_permute2x128_si256((a), (b), 0x31);                                                \
        (a) = lo_;                                                                                      \
    } while (0)
#define PA_PV4_I8_BODY(DOTW)                                                                          \
    float *O0 = O, *O1 = O + D, *O2 = O + 2 * D, *O3 = O + 3 * D;                                       \
    const int nch = (v1 - v0 + 63) / 64, passes = nch * (D / 16);                                       \
    int per[PA_SUPER_PAGES];                                                                            \
    for (int i = 0; pf && i < npg; i++) per[i] = (pa_pf_lines_left(pf + i) + passes - 1) / passes;      \
    int16_t Q[32 * 8] __attribute__((aligned(32)));                                                     \
    float ps[8];                                                                                        \
    const char *rows[64];                                                                               \
    int j;                                                                                              \
    int64_t row;                                                                                        \
    pa_vtok_init(v0, npg, tpp, rs, &j, &row);                                                           \
    for (int c0 = v0; c0 < v1; c0 += 64) {                                                              \
        const int c1 = c0 + 64 < v1 ? c0 + 64 : v1, np = (c1 - c0 + 1) / 2, odd = (c1 - c0) & 1;         \
        pa_vtok_rows(rows, c1 - c0, V, npg, tpp, rs, &j, &row);                                            \
        if (odd) rows[c1 - c0] = rows[c1 - c0 - 1];     /* a duplicate: nothing beyond is read */     \
        float *Sc = S + (int64_t)(c0 >> 1) * 8;                                                         \
        pa_p16_chunk(Q, ps, Sc, rows, np, D, odd);                                                      \
        /* the rows' alpha (the first chunk only) and int16 scales, read after each pass's           \
         * token loop through an opaque pointer: held in 8 ymm registers across it they made GCC     \
         * spill accumulators (as in pa_pv4_t, PA_PV_ALPHA) */                                        \
        float fac[8];                                                                                   \
        for (int r = 0; r < 4; r++) { fac[r] = c0 == v0 ? alpha[r] : 1.0f; fac[4 + r] = ps[2 * r]; }   \
        for (int64_t d = 0; d < D; d += 16) {                                                           \
            for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);                      \
            __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;                      \
            __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                         \
            const int32_t *qp = (const int32_t *)Q;                                                     \
            for (int i = 0; i < np; i++, qp += 4) {                                                     \
                const __m256i x = PA_KLD16(rows[2 * i] + d), y = PA_KLD16(rows[2 * i + 1] + d);         \
                const __m256i w0 = _mm256_unpacklo_epi16(x, y), w1 = _mm256_unpackhi_epi16(x, y);       \
                __m256i b = _mm256_set1_epi32(qp[0]); a00 = DOTW(a00, w0, b); a01 = DOTW(a01, w1, b);   \
                b = _mm256_set1_epi32(qp[1]); a10 = DOTW(a10, w0, b); a11 = DOTW(a11, w1, b);           \
                b = _mm256_set1_epi32(qp[2]); a20 = DOTW(a20, w0, b); a21 = DOTW(a21, w1, b);           \
                b = _mm256_set1_epi32(qp[3]); a30 = DOTW(a30, w0, b); a31 = DOTW(a31, w1, b);           \
            }                                                                                           \
            /* the in-lane unpacks left columns {0-3, 8-11} in a_r0, {4-7, 12-15} in a_r1 */           \
            PA_LANES_FIX(a00, a01); PA_LANES_FIX(a10, a11); PA_LANES_FIX(a20, a21); PA_LANES_FIX(a30, a31); \
            const float *fp_ = fac;                                                                     \
            __asm__("" : "+r"(fp_));                                                                    \
            const __m256 al0 = _mm256_broadcast_ss(fp_), al1 = _mm256_broadcast_ss(fp_ + 1);            \
            const __m256 al2 = _mm256_broadcast_ss(fp_ + 2), al3 = _mm256_broadcast_ss(fp_ + 3);        \
            const __m256 ps0 = _mm256_broadcast_ss(fp_ + 4), ps1 = _mm256_broadcast_ss(fp_ + 5);        \
            const __m256 ps2 = _mm256_broadcast_ss(fp_ + 6), ps3 = _mm256_broadcast_ss(fp_ + 7);        \
            _mm256_storeu_ps(O0 + d, _mm256_fmadd_ps(ps0, _mm256_cvtepi32_ps(a00), _mm256_mul_ps(_mm256_loadu_ps(O0 + d), al0))); \
            _mm256_storeu_ps(O0 + d + 8, _mm256_fmadd_ps(ps0, _mm256_cvtepi32_ps(a01), _mm256_mul_ps(_mm256_loadu_ps(O0 + d + 8), al0))); \
            _mm256_storeu_ps(O1 + d, _mm256_fmadd_ps(ps1, _mm256_cvtepi32_ps(a10), _mm256_mul_ps(_mm256_loadu_ps(O1 + d), al1))); \
            _mm256_storeu_ps(O1 + d + 8, _mm256_fmadd_ps(ps1, _mm256_cvtepi32_ps(a11), _mm256_mul_ps(_mm256_loadu_ps(O1 + d + 8), al1))); \
            _mm256_storeu_ps(O2 + d, _mm256_fmadd_ps(ps2, _mm256_cvtepi32_ps(a20), _mm256_mul_ps(_mm256_loadu_ps(O2 + d), al2))); \
            _mm256_storeu_ps(O2 + d + 8, _mm256_fmadd_ps(ps2, _mm256_cvtepi32_ps(a21), _mm256_mul_ps(_mm256_loadu_ps(O2 + d + 8), al2))); \
            _mm256_storeu_ps(O3 + d, _mm256_fmadd_ps(ps3, _mm256_cvtepi32_ps(a30), _mm256_mul_ps(_mm256_loadu_ps(O3 + d), al3))); \
            _mm256_storeu_ps(O3 + d + 8, _mm256_fmadd_ps(ps3, _mm256_cvtepi32_ps(a31), _mm256_mul_ps(_mm256_loadu_ps(O3 + d + 8), al3))); \
        }                                                                                               \
    }                                                                                                   \
    for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, pa_pf_lines_left(pf + i), flags)

/* vpmaddwd + vpaddd through asm, the accumulator tied: written with intrinsics
 * GCC 12 renamed the 8 accumulators every iteration (8 vmovdqa per 16 dot
 * products) and spilled one. */
PA_AVX2_INLINE __m256i pa_maddwd_acc(__m256i acc, __m256i w, __m256i b) {
    __m256i t;
    __asm__("vpmaddwd %2, %1, %0" : "=x"(t) : "x"(w), "x"(b));
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(t));
    return acc;
}
#define PA_I16_DOT_MADD(acc, w, b) pa_maddwd_acc((acc), (w), (b))
PA_AVX2 static void pa_pv4_i8_madd_avx2(float *O, int D, const float *alpha, float *S, const char *const *V,
                                        int npg, int64_t rs, int tpp, int v0, int v1, pa_pfcur *pf, int flags) {
    PA_PV4_I8_BODY(PA_I16_DOT_MADD);
}

#ifdef PAGEDCY_ATTN_HAVE_AVXVNNI
__attribute__((target("avx2,fma,f16c,avxvnni"), always_inline))
static inline __m256i pa_dpwssd_avx(__m256i acc, __m256i w, __m256i b) {
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(b));
    return acc;
}
__attribute__((target("avx2,fma,f16c,avxvnni")))
static void pa_pv4_i8_vnni_avx2(float *O, int D, const float *alpha, float *S, const char *const *V,
                                int npg, int64_t rs, int tpp, int v0, int v1, pa_pfcur *pf, int flags) {
    PA_PV4_I8_BODY(pa_dpwssd_avx);
}
#endif

/* The integer P.V runs on every AVX2 CPU: vpdpwssd with AVX-VNNI, else
 * vpmaddwd + vpaddd. The latter first measured 0.96x the float P.V (Intel
 * Xeon, i8q decode in L2, AVX2 kernels, 1 thread), with GCC spilling the
 * accumulators in the token loop (the per-chunk scales live across it and
 * the intrinsics' renamed accumulators); without the spills (fac[] and
 * pa_maddwd_acc above) it is 1.05x the float P.V on an AMD EPYC Zen 4 with
 * PAGEDCY_SIMD=avx2 (i8q decode, 1 thread: 4 x 256 in cache 0.244 -> 0.231
 * ms, 32 x 2048 from DRAM 15.98 -> 15.19 ms), where vpmaddwd issues on two
 * pipes and vpaddd on four. */
static inline int pa_pv_i8_ok_avx2(int flags) { (void)flags; return 1; }

PA_AVX2 static void pa_pv4_i8_avx2(float *O, int D, const float *alpha, float *S, const char *const *V,
                                   int npg, int64_t rs, int tpp, int v0, int v1, pa_pfcur *pf, int flags) {
#ifdef PAGEDCY_ATTN_HAVE_AVXVNNI
    if (!(flags & PA_TUNE_NO_VNNI) && pa_cpu_has_avxvnni()) {
        pa_pv4_i8_vnni_avx2(O, D, alpha, S, V, npg, rs, tpp, v0, v1, pf, flags);
        return;
    }
#endif
    pa_pv4_i8_madd_avx2(O, D, alpha, S, V, npg, rs, tpp, v0, v1, pf, flags);
}

/* Decode entry points: one dtype switch, then the inlined kernel for that
 * storage dtype (perm: bf16 read in the permuted lane order). */
PA_AVX2 static void pa_qk4_avx2(const float *q, int D, const void *K, int64_t ks, int tlo, int thi,
                                float *S, int Sld, pa_pfcur *pf, int flags, int dtype, int perm) {
    if (perm) pa_qk4_t(q, D, K, ks, tlo, thi, S, Sld, pf, flags, PAGEDCY_BF16, 1);
    else PA_DISPATCH_DTYPE(dtype, DT, pa_qk4_t(q, D, K, ks, tlo, thi, S, Sld, pf, flags, DT, 0));
}

PA_AVX2 static void pa_pv4_avx2(float *O, int D, const float *alpha, const float *P, int Sld,
                                const void *V, int64_t vs, int tlo, int thi,
                                pa_pfcur *pf, int flags, int dtype, int perm) {
    if (perm) pa_pv4_t(O, D, alpha, P, Sld, V, vs, tlo, thi, pf, flags, PAGEDCY_BF16, 1);
    else PA_DISPATCH_DTYPE(dtype, DT, pa_pv4_t(O, D, alpha, P, Sld, V, vs, tlo, thi, pf, flags, DT, 0));
}

/* ---- several whole pages per step, token-major ---------------------------
 * Virtual token v = t*npg + j is token t of page j (pagedcy_attn_item.h), so
 * each pass reads row t of every page side by side: npg streams of rows in
 * flight instead of one, as the AVX-512 kernels do. Page after page
 * (PA_TUNE_SUPER_PAGE_ORDER, pa_qk4v_pages_avx2) the AVX2 path hid less of
 * its compute behind the page walk than AVX-512 (32 x 2048 from DRAM, Intel
 * Xeon, 2 threads: fp16 62%, bf16 58% of the walk rate against 87%, 86%).
 * Row pointers are stepped (page, then row), not divided. Float K/V only
 * (pa_super_token_major_avx2). */
#define PA_VSTEP(j, off, npg, rs) do { if (++(j) == (npg)) { (j) = 0; (off) += (rs); } } while (0)

PA_AVX2_INLINE void pa_qk4v_t(const float *q, int D, const char *const *K, int npg, int T, int64_t ks,
                              float *S, pa_pfcur *pf, int flags, int dtype, int perm) {
    const int64_t rs = ks * pa_dtype_bytes(dtype);
    const int n = npg * T;            /* even: the driver takes T % 2 == 0 */
    const int steps = (n + 5) / 6;
    int per[PA_SUPER_PAGES];
    for (int j = 0; pf && j < npg; j++) per[j] = (pa_pf_lines_left(pf + j) + steps - 1) / steps;
    int j = 0;
    int64_t off = 0;
    int v = 0;
    if (!(flags & PA_TUNE_NO_QK3)) {
        for (; v + 6 <= n; v += 6) {
            const char *r[6];
            for (int i = 0; i < 6; i++) { r[i] = K[j] + off; PA_VSTEP(j, off, npg, rs); }
            for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);
            __m256 p0, p2;
            __m128 s2, s3;
            pa_qk4_tri(q, D, r[0], r[1], r[2], dtype, perm, &p0, &s2);
            pa_qk4_tri(q, D, r[4], r[5], r[3], dtype, perm, &p2, &s3);
            float *o = S + (v >> 1) * 8;
            _mm256_storeu_ps(o, p0);
            _mm256_storeu_ps(o + 8, _mm256_set_m128(_mm_unpackhi_ps(s2, s3), _mm_unpacklo_ps(s2, s3)));
            _mm256_storeu_ps(o + 16, p2);
        }
    }
    for (; v < n; v += 2) {
        const char *r0 = K[j] + off;
        PA_VSTEP(j, off, npg, rs);
        const char *r1 = K[j] + off;
        PA_VSTEP(j, off, npg, rs);
        for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);
        _mm256_storeu_ps(S + (v >> 1) * 8, pa_qk4_pair(q, D, r0, r1, dtype, perm));
    }
    for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, pa_pf_lines_left(pf + i), flags);
}

/* P.V in the same token-major order, 16 output columns (8 accumulators) per
 * pass as pa_pv4_t; the first page's alpha rescales O, once. */
PA_AVX2_INLINE void pa_pv4v_t(float *O, int D, const float *alpha, const float *P, const char *const *V,
                              int npg, int T, int64_t vs, pa_pfcur *pf, int flags, int dtype, int perm) {
    const int64_t es = pa_dtype_bytes(dtype), vsb = vs * es;
    const int n = npg * T;
    const int passes = (D + 15) / 16;
    int per[PA_SUPER_PAGES];
    for (int j = 0; pf && j < npg; j++) per[j] = (pa_pf_lines_left(pf + j) + passes - 1) / passes;
    float *O0 = O, *O1 = O + D, *O2 = O + 2 * D, *O3 = O + 3 * D;
    for (int d = 0; d < D; d += 16) {
        for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, per[i], flags);
        PA_PV_ALPHA();
        const char *Vd[PA_SUPER_PAGES];
        for (int i = 0; i < npg; i++) Vd[i] = V[i] + (int64_t)d * es;
        if (d + 16 > D) {           /* D % 16 == 8: one 8-wide pass */
            __m256 c0 = _mm256_mul_ps(_mm256_loadu_ps(O0 + d), al0), c1 = _mm256_mul_ps(_mm256_loadu_ps(O1 + d), al1);
            __m256 c2 = _mm256_mul_ps(_mm256_loadu_ps(O2 + d), al2), c3 = _mm256_mul_ps(_mm256_loadu_ps(O3 + d), al3);
            int j = 0;
            int64_t off = 0;
            for (int v = 0; v < n; v++) {
                const __m256 x = pa_ld8(Vd[j] + off, 0, dtype);
                PA_VSTEP(j, off, npg, vsb);
                PA_PV_STEP8(x, P + (v >> 1) * 8 + (v & 1));
            }
            _mm256_storeu_ps(O0 + d, c0); _mm256_storeu_ps(O1 + d, c1);
            _mm256_storeu_ps(O2 + d, c2); _mm256_storeu_ps(O3 + d, c3);
            break;
        }
        __m256 c00 = _mm256_mul_ps(_mm256_loadu_ps(O0 + d), al0), c01 = _mm256_mul_ps(_mm256_loadu_ps(O0 + d + 8), al0);
        __m256 c10 = _mm256_mul_ps(_mm256_loadu_ps(O1 + d), al1), c11 = _mm256_mul_ps(_mm256_loadu_ps(O1 + d + 8), al1);
        __m256 c20 = _mm256_mul_ps(_mm256_loadu_ps(O2 + d), al2), c21 = _mm256_mul_ps(_mm256_loadu_ps(O2 + d + 8), al2);
        __m256 c30 = _mm256_mul_ps(_mm256_loadu_ps(O3 + d), al3), c31 = _mm256_mul_ps(_mm256_loadu_ps(O3 + d + 8), al3);
        int j = 0;
        int64_t off = 0;
        const float *pp = P;
        for (int v = 0; v < n; v += 2, pp += 8) {      /* n even */
            const char *r0 = Vd[j] + off;
            PA_VSTEP(j, off, npg, vsb);
            const char *r1 = Vd[j] + off;
            PA_VSTEP(j, off, npg, vsb);
            PA_PV_STEP(r0, pp);
            PA_PV_STEP(r1, pp + 1);
        }
#undef PA_PV_STEP
#undef PA_PV_STEP8
#undef PA_PV_ALPHA
        _mm256_storeu_ps(O0 + d, c00); _mm256_storeu_ps(O0 + d + 8, c01);
        _mm256_storeu_ps(O1 + d, c10); _mm256_storeu_ps(O1 + d + 8, c11);
        _mm256_storeu_ps(O2 + d, c20); _mm256_storeu_ps(O2 + d + 8, c21);
        _mm256_storeu_ps(O3 + d, c30); _mm256_storeu_ps(O3 + d + 8, c31);
    }
    for (int i = 0; pf && i < npg; i++) pa_pf_step(pf + i, pa_pf_lines_left(pf + i), flags);
}
#undef PA_VSTEP

/* Token-major for float K/V (fp32, fp16, bf16). Measured (Intel Xeon, AVX2
 * kernels, 1 thread, CPU time, H 32 / Hkv 8 / D 128) against page after
 * page: 32 x 2048 from DRAM fp16 1.17x, bf16 1.22x, fp32 1.05x, int8 1.0x;
 * with 4 x 256 in the last-level cache 0.92x (16-bit), 0.89x (fp32), 0.93x
 * (int8): the rows at one offset of npg pages share an L1 set (the page
 * stride is a multiple of 4 KiB). fp32 kept one page per step there; on an
 * AMD EPYC Zen 4 with PAGEDCY_SIMD=avx2 (1 thread, same shapes, interleaved
 * A/B) 4 token-major pages per step against one page per step: 32 x 2048
 * from DRAM 29.9 -> 23.1 ms (1.30x; 2 pages 1.16x, 4 pages in page order
 * 1.05x), 4 x 256 in the last-level cache 0.91x. Decode reads from DRAM, so
 * fp32 takes them too. int8 keeps pages in order (equal there: 17.3 against
 * 17.4 ms, i8q 14.2 both). */
#define pa_super_token_major_avx2(dtype) ((dtype) != PAGEDCY_I8)

PA_AVX2 static void pa_qk4v_avx2(const float *q, int D, const char *const *K, int npg, int T, int64_t ks,
                                 float *S, pa_pfcur *pf, int flags, int dtype, int perm) {
    if (perm) pa_qk4v_t(q, D, K, npg, T, ks, S, pf, flags, PAGEDCY_BF16, 1);
    else if (dtype == PAGEDCY_F16) pa_qk4v_t(q, D, K, npg, T, ks, S, pf, flags, PAGEDCY_F16, 0);
    else if (dtype == PAGEDCY_F32) pa_qk4v_t(q, D, K, npg, T, ks, S, pf, flags, PAGEDCY_F32, 0);
    else pa_qk4v_t(q, D, K, npg, T, ks, S, pf, flags, PAGEDCY_BF16, 0);
}

PA_AVX2 static void pa_pv4v_avx2(float *O, int D, const float *alpha, const float *P, const char *const *V,
                                 int npg, int T, int64_t vs, pa_pfcur *pf, int flags, int dtype, int perm) {
    if (perm) pa_pv4v_t(O, D, alpha, P, V, npg, T, vs, pf, flags, PAGEDCY_BF16, 1);
    else if (dtype == PAGEDCY_F16) pa_pv4v_t(O, D, alpha, P, V, npg, T, vs, pf, flags, PAGEDCY_F16, 0);
    else if (dtype == PAGEDCY_F32) pa_pv4v_t(O, D, alpha, P, V, npg, T, vs, pf, flags, PAGEDCY_F32, 0);
    else pa_pv4v_t(O, D, alpha, P, V, npg, T, vs, pf, flags, PAGEDCY_BF16, 0);
}

/* End of an online-softmax step of a 4-row block: from the new row maxima
 * (lanes 2r, 2r+1 of mnew) and the partial sums of p (lanes 2r, 2r+1 of acc),
 * update m and l and write the rescale factors alpha; rows with an empty
 * visible range keep (m, l) and get alpha 1. */
PA_AVX2_INLINE void pa_softmax4_finish(__m256 mnew, __m256 acc, const int32_t *vlo, const int32_t *vhi,
                                       float *m, float *l, float *alpha) {
    acc = _mm256_add_ps(acc, _mm256_permute_ps(acc, 0xB1));
    const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128 mold4 = _mm_loadu_ps(m);
    const __m128 mnew4 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(mnew, pick));
    const __m128 sum4 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(acc, pick));
    __m128 al = _mm256_castps256_ps128(pa_exp8(_mm256_castps128_ps256(_mm_sub_ps(mold4, mnew4))));
    __m128 act = _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_add_epi32(_mm_loadu_si128((const __m128i *)vhi),
                                                                _mm_set1_epi32(1)),
                                                  _mm_loadu_si128((const __m128i *)vlo)));
    al = _mm_blendv_ps(_mm_set1_ps(1.0f), al, act);
    _mm_storeu_ps(alpha, al);
    _mm_storeu_ps(l, _mm_fmadd_ps(_mm_loadu_ps(l), al, sum4));
    _mm_storeu_ps(m, _mm_blendv_ps(mold4, mnew4, act));
}

/* Online-softmax step of a 4-row block whose scores sit in the pair layout
 * (lane 2*r + (t&1) of vector t/2) for token pairs [jb, je): soft cap,
 * ALiBi, mask outside [vlo[r], vhi[r]] (an empty range marks an inactive row:
 * p = 0, alpha = 1), update m and l, overwrite the scores with
 * p = exp(s - m_new), write the rows' rescale factors to alpha. Working on
 * whole pair vectors keeps every load and store 32 bytes wide and handles the
 * four rows' reductions together. */
PA_AVX2 static void pa_softmax4_avx2(float *S, int jb, int je, const int32_t *vlo,
                                     const int32_t *vhi, float cap, const float *slope,
                                     const float *pos0, float *m, float *l, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i todd = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
    const __m256i lo = _mm256_setr_epi32(vlo[0] - 1, vlo[0] - 1, vlo[1] - 1, vlo[1] - 1,
                                         vlo[2] - 1, vlo[2] - 1, vlo[3] - 1, vlo[3] - 1);
    const __m256i hi = _mm256_setr_epi32(vhi[0] + 1, vhi[0] + 1, vhi[1] + 1, vhi[1] + 1,
                                         vhi[2] + 1, vhi[2] + 1, vhi[3] + 1, vhi[3] + 1);
    const int t_first = 2 * jb, t_last = 2 * je - 1;
    int full = 1;      /* every row sees every token of the range: no mask needed */
    for (int r = 0; r < 4; r++) full &= vlo[r] <= t_first && vhi[r] >= t_last;
    const int use_alibi = slope[0] != 0.0f || slope[1] != 0.0f || slope[2] != 0.0f || slope[3] != 0.0f;
    const __m256 sl = _mm256_setr_ps(slope[0], slope[0], slope[1], slope[1],
                                     slope[2], slope[2], slope[3], slope[3]);
    const __m256 ps = _mm256_setr_ps(pos0[0], pos0[0], pos0[1], pos0[1],
                                     pos0[2], pos0[2], pos0[3], pos0[3]);
    __m256 vmax = ninf;
    for (int j = jb; j < je; j++) {
        float *sj = S + (int64_t)j * 8;
        __m256 x = _mm256_loadu_ps(sj);
        __m256i ti = _mm256_add_epi32(todd, _mm256_set1_epi32(2 * j));
        if (cap > 0.0f)
            x = _mm256_mul_ps(_mm256_set1_ps(cap), pa_tanh8(_mm256_mul_ps(x, _mm256_set1_ps(1.0f / cap))));
        if (use_alibi)
            x = _mm256_fmadd_ps(sl, _mm256_add_ps(_mm256_cvtepi32_ps(ti), ps), x);
        if (!full) {
            __m256i vis = _mm256_and_si256(_mm256_cmpgt_epi32(ti, lo), _mm256_cmpgt_epi32(hi, ti));
            x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(vis));
        }
        if (cap > 0.0f || use_alibi || !full) _mm256_storeu_ps(sj, x);
        vmax = _mm256_max_ps(vmax, x);
    }
    /* row maxima, each duplicated over its two lanes */
    vmax = _mm256_max_ps(vmax, _mm256_permute_ps(vmax, 0xB1));
    const __m256 mold = _mm256_setr_ps(m[0], m[0], m[1], m[1], m[2], m[2], m[3], m[3]);
    const __m256 mnew = _mm256_max_ps(mold, vmax);
    /* -inf - -inf (row with no history and nothing visible) is NaN and
     * pa_exp8 turns it into 0, as masked scores need. */
    __m256 acc = _mm256_setzero_ps();
    for (int j = jb; j < je; j++) {
        float *sj = S + (int64_t)j * 8;
        __m256 p = pa_exp8(_mm256_sub_ps(_mm256_loadu_ps(sj), mnew));
        _mm256_storeu_ps(sj, p);
        acc = _mm256_add_ps(acc, p);
    }
    pa_softmax4_finish(mnew, acc, vlo, vhi, m, l, alpha);
}

PA_AVX2_INLINE void pa_pack_row_t(float *dst, const void *src, int D, int dtype) {
    const __m256 s = _mm256_set1_ps(dtype == PAGEDCY_I8 ? pagedcy_i8_scale(src, (size_t)D) : 1.0f);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(pa_ld8(src, d, dtype), s));
}

PA_AVX2 static void pa_pack_row_avx2(float *dst, const void *src, int D, int dtype) {
    PA_DISPATCH_DTYPE(dtype, DT, pa_pack_row_t(dst, src, D, DT));
}

/* ---- prefill: three 4-row blocks at once ---------------------------------
 * 12 accumulators instead of 8: with a 4-cycle FMA latency, 8 independent
 * chains reach only ~90% of the FMA ports' throughput (measured), 12 reach
 * it; K is packed transposed so the score kernel needs no horizontal sums. */

/* Kt[d][t] = K[t][d] for t < nt, 0 for nt <= t < ncol (ncol % 8 == 0; rows
 * ldk floats apart): a float32 (int8: dequantized) copy of one page slice
 * (token stride ks elements), transposed in 8x8 tiles. */
PA_AVX2_INLINE void pa_pack_kt_t(float *Kt, int ldk, int ncol, const void *K, int64_t ks, int nt, int D,
                                 int dtype) {
    const int64_t es = pa_dtype_bytes(dtype);
    for (int t0 = 0; t0 < ncol; t0 += 8) {
        for (int d0 = 0; d0 < D; d0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) {
                const int t = t0 + i;
                if (t >= nt) { r[i] = _mm256_setzero_ps(); continue; }
                const char *row = (const char *)K + (int64_t)t * ks * es;
                r[i] = pa_ld8(row, d0, dtype);
                if (dtype == PAGEDCY_I8) r[i] = _mm256_mul_ps(r[i], _mm256_set1_ps(pagedcy_i8_scale(row, (size_t)D)));
            }
            __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
            __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
            __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
            __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
            __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
            __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
            __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
            __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
            float *o = Kt + (int64_t)d0 * ldk + t0;
            _mm256_storeu_ps(o + 0 * (int64_t)ldk, _mm256_permute2f128_ps(b0, b4, 0x20));
            _mm256_storeu_ps(o + 1 * (int64_t)ldk, _mm256_permute2f128_ps(b1, b5, 0x20));
            _mm256_storeu_ps(o + 2 * (int64_t)ldk, _mm256_permute2f128_ps(b2, b6, 0x20));
            _mm256_storeu_ps(o + 3 * (int64_t)ldk, _mm256_permute2f128_ps(b3, b7, 0x20));
            _mm256_storeu_ps(o + 4 * (int64_t)ldk, _mm256_permute2f128_ps(b0, b4, 0x31));
            _mm256_storeu_ps(o + 5 * (int64_t)ldk, _mm256_permute2f128_ps(b1, b5, 0x31));
            _mm256_storeu_ps(o + 6 * (int64_t)ldk, _mm256_permute2f128_ps(b2, b6, 0x31));
            _mm256_storeu_ps(o + 7 * (int64_t)ldk, _mm256_permute2f128_ps(b3, b7, 0x31));
        }
    }
}

PA_AVX2 static void pa_pack_kt_avx2(float *Kt, int ldk, int ncol, const void *K, int64_t ks, int nt, int D,
                                    int dtype) {
    PA_DISPATCH_DTYPE(dtype, DT, pa_pack_kt_t(Kt, ldk, ncol, K, ks, nt, D, DT));
}

/* Four row vectors of 8 consecutive tokens (t0 even) -> the 4 pair vectors
 * of the pair layout, stored at S + (t0/2)*8. */
PA_AVX2_INLINE void pa_store_pairs4(float *S, int t0, __m256 r0, __m256 r1, __m256 r2, __m256 r3) {
    __m256d a = _mm256_unpacklo_pd(_mm256_castps_pd(r0), _mm256_castps_pd(r1));
    __m256d b = _mm256_unpackhi_pd(_mm256_castps_pd(r0), _mm256_castps_pd(r1));
    __m256d c = _mm256_unpacklo_pd(_mm256_castps_pd(r2), _mm256_castps_pd(r3));
    __m256d d = _mm256_unpackhi_pd(_mm256_castps_pd(r2), _mm256_castps_pd(r3));
    float *o = S + (int64_t)(t0 >> 1) * 8;
    _mm256_storeu_ps(o, _mm256_castpd_ps(_mm256_permute2f128_pd(a, c, 0x20)));
    _mm256_storeu_ps(o + 8, _mm256_castpd_ps(_mm256_permute2f128_pd(b, d, 0x20)));
    _mm256_storeu_ps(o + 16, _mm256_castpd_ps(_mm256_permute2f128_pd(a, c, 0x31)));
    _mm256_storeu_ps(o + 24, _mm256_castpd_ps(_mm256_permute2f128_pd(b, d, 0x31)));
}

/* Scores of one 4-row block (q: its 4 columns of qt, stride 12 floats per d)
 * against NG 8-token groups from t0: 4 x NG accumulators, NG K loads and 4
 * broadcasts per d (NG a literal after inlining). */
PA_AVX2_INLINE void pa_qk4_groups(const float *q, int D, const float *Kt, int64_t ldk, int t0, float *S, int NG) {
    __m256 c[4][3];
    for (int r = 0; r < 4; r++)
        for (int g = 0; g < NG; g++) c[r][g] = _mm256_setzero_ps();
    const float *k = Kt + t0;
    for (int d = 0; d < D; d++, k += ldk, q += 12) {
        __m256 kv[3];
        for (int g = 0; g < NG; g++) kv[g] = _mm256_loadu_ps(k + 8 * g);
        for (int r = 0; r < 4; r++) {
            const __m256 b = _mm256_broadcast_ss(q + r);
            for (int g = 0; g < NG; g++) c[r][g] = _mm256_fmadd_ps(b, kv[g], c[r][g]);
        }
    }
    for (int g = 0; g < NG; g++) pa_store_pairs4(S, t0 + 8 * g, c[0][g], c[1][g], c[2][g], c[3][g]);
}

/* Scores of 12 query vectors (qt: [D][12], pre-scaled) against the tokens of
 * 8-token groups covering [tlo, thi) of Kt ([D][ldk]), written in the pair
 * layout of the three 4-row blocks S0, S1, S2. Each block in turn, 24 tokens
 * (12 accumulators) a pass: 7 loads per 12 FMAs, where 12 rows x 8 tokens took
 * 13 (12 broadcasts), more than AVX2's load ports keep up with. Every score is
 * the same sequential FMA chain over d either way (same bits). */
PA_AVX2 static void pa_qk12_avx2(const float *qt, int D, const float *Kt, int64_t ldk, int tlo, int thi,
                                 float *S0, float *S1, float *S2) {
    float *Sb[3] = {S0, S1, S2};
    for (int b = 0; b < 3; b++)
        for (int t0 = tlo & ~7; t0 < thi; t0 += 24) {
            const int ng = (thi - t0 + 7) >> 3;       /* 8-token groups left; literals below */
            if (ng >= 3) pa_qk4_groups(qt + 4 * b, D, Kt, ldk, t0, Sb[b], 3);
            else if (ng == 2) pa_qk4_groups(qt + 4 * b, D, Kt, ldk, t0, Sb[b], 2);
            else pa_qk4_groups(qt + 4 * b, D, Kt, ldk, t0, Sb[b], 1);
        }
}

/* O[r][d0 : d0 + 8*NC] for one 4-row block (O, alpha and S at the block):
 * 4 x NC accumulators, NC V loads and 4 broadcasts per token (NC a literal
 * after inlining). */
PA_AVX2_INLINE void pa_pv4_cols(float *O, int D, int d0, const float *alpha, const float *S, const float *V,
                                int tlo, int thi, int NC) {
    __m256 c[4][3];
    for (int r = 0; r < 4; r++) {
        const __m256 al = _mm256_set1_ps(alpha[r]);
        for (int n = 0; n < NC; n++) c[r][n] = _mm256_mul_ps(_mm256_loadu_ps(O + (int64_t)r * D + d0 + 8 * n), al);
    }
    const float *v = V + (int64_t)tlo * D + d0;
    for (int t = tlo; t < thi; t++, v += D) {
        __m256 vv[3];
        for (int n = 0; n < NC; n++) vv[n] = _mm256_loadu_ps(v + 8 * n);
        const float *p = S + (int64_t)(t >> 1) * 8 + (t & 1);
        for (int r = 0; r < 4; r++) {
            const __m256 b = _mm256_broadcast_ss(p + 2 * r);
            for (int n = 0; n < NC; n++) c[r][n] = _mm256_fmadd_ps(b, vv[n], c[r][n]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < NC; n++) _mm256_storeu_ps(O + (int64_t)r * D + d0 + 8 * n, c[r][n]);
}

/* O[r] = O[r]*alpha[r] + sum_{t in [tlo, thi)} P[r][t] V[t] for 12 rows (O
 * stride D; P in the pair layout of blocks S0..S2; V packed [t][D] float32).
 * Each 4-row block in turn, 24 output floats (12 accumulators) a pass: 7 loads
 * per 12 FMAs against 13 for 12 rows x 8 floats. Every output is the same
 * sequential FMA chain over t either way (same bits). */
PA_AVX2 static void pa_pv12_avx2(float *O, int D, const float *alpha, const float *S0, const float *S1,
                                 const float *S2, const float *V, int tlo, int thi) {
    const float *Sb[3] = {S0, S1, S2};
    for (int b = 0; b < 3; b++) {
        float *Ob = O + (int64_t)b * 4 * D;
        const float *ab = alpha + 4 * b;
        for (int d = 0; d < D; d += 24) {           /* D % 8 == 0; literals below */
            if (D - d >= 24) pa_pv4_cols(Ob, D, d, ab, Sb[b], V, tlo, thi, 3);
            else if (D - d == 16) pa_pv4_cols(Ob, D, d, ab, Sb[b], V, tlo, thi, 2);
            else pa_pv4_cols(Ob, D, d, ab, Sb[b], V, tlo, thi, 1);
        }
    }
}

/* dst = src * scale; `order` (PA_ORDER_*) maps queries into the lane order
 * of the permuted bf16 loads, or results out of it. */
PA_AVX2 static void pa_scale_copy_avx2(float *dst, const float *src, int n, float scale, int order) {
    if (order != PA_ORDER_SAME) { pa_bf16_order_scale(dst, src, n, scale, order == PA_ORDER_TO_KERNEL); return; }
    int i = 0;
    __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), s));
    for (; i < n; i++) dst[i] = src[i] * scale;
}

/* bf16 decode (items reading the pool directly) uses the permuted loads. */
static inline int pa_kv_perm_avx2(int dtype, int D, int packed, int flags) {
    return dtype == PAGEDCY_BF16 && D % 16 == 0 && !packed && !(flags & PA_TUNE_NO_BF16_PERM);
}

#endif /* x86 */
#endif
