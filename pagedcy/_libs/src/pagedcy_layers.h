/* Elementwise kernels of the transformer layers that need a vectorised exp.
 *
 * A scalar libm expf made SiLU(gate)*up the slowest elementwise step of a prefill (7 ns an
 * element, twice NumPy's). pagedcy_expf is a branch-free Cephes-style expf (max relative
 * error ~2 ulp over the clamped range) that compilers vectorise. On x86-64 (GCC, Clang) each
 * row loop is built for AVX-512, AVX2 + FMA and the baseline, and every call takes the build
 * of pagedcy_simd_level(), the level the attention and GEMM kernels run at: PAGEDCY_SIMD caps
 * these rows too. (They were target_clones, which the loader resolves from the CPU alone, so
 * PAGEDCY_SIMD=avx2 on an AVX-512 machine still ran them on AVX-512.) The wheel stays
 * portable without -march=native.
 */
#ifndef PAGEDCY_LAYERS_H
#define PAGEDCY_LAYERS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pagedcy_convert.h"

/* The exp's clamps and selects are if-converted into the vector loop only when FP ops may be
 * assumed not to trap; GCC's default (-ftrapping-math) left the AVX2 build of every row loop
 * scalar (AVX-512 masks them). Same values either way: only FP exception flags differ, and
 * nothing here reads them. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

/* The build the row kernels take, a PAGEDCY_SIMD_* level: AVX-512, AVX2 + FMA or the
 * baseline (the only build off x86 or without GCC/Clang). */
static inline int pagedcy_rows_build(void) {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    return pagedcy_simd_level();
#else
    return PAGEDCY_SIMD_SCALAR;
#endif
}

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
#define PAGEDCY_ROW_IMPL static inline __attribute__((always_inline))
/* name(params): the body name##_impl inlined into an AVX-512 and an AVX2 + FMA build, and
 * the baseline one, chosen per call by pagedcy_rows_build() (cached after its first call). */
#define PAGEDCY_ROW_VARIANTS(name, params, args)                                              \
    __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))                  \
    static void name##_avx512 params { name##_impl args; }                                  \
    __attribute__((target("avx2,fma")))                                                     \
    static void name##_avx2 params { name##_impl args; }                                    \
    static void name params {                                                               \
        const int build_ = pagedcy_rows_build();                                            \
        if (build_ == PAGEDCY_SIMD_AVX512) name##_avx512 args;                              \
        else if (build_ == PAGEDCY_SIMD_AVX2) name##_avx2 args;                             \
        else name##_impl args;                                                              \
    }
#else
#define PAGEDCY_ROW_IMPL static inline
#define PAGEDCY_ROW_VARIANTS(name, params, args) static void name params { name##_impl args; }
#endif

static inline float pagedcy_expf(float x_in) {
    /* exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (ln2 split in two).
     * Past the float range: +inf above, 0 below (selects, so the loop still vectorises). */
    const float hi = 88.3762626647949f, lo = -87.3365478515625f;
    float x = x_in > hi ? hi : x_in;
    x = x < lo ? lo : x;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    p = p * scale;
    p = x_in > hi ? HUGE_VALF : p;
    return x_in < lo ? 0.0f : p;
}

/* out = weight * r / sqrt(mean(r^2) + eps) with r = x, or r = (residual += x) when
 * residual is not NULL; out may alias x (the sum is taken before any write). The squares
 * go into 16 float partial sums so the loop vectorises (a float reduction in one
 * accumulator does not, without -ffast-math), then add up in double. */
PAGEDCY_ROW_IMPL void pagedcy_rms_row_impl(const float *x, float *residual, const float *weight, float eps,
                                          float *out, ptrdiff_t d) {
    float acc[16] = {0};
    const float *src = x;
    ptrdiff_t j = 0;
    if (residual) {
        for (; j + 16 <= d; j += 16)
            for (int l = 0; l < 16; l++) {
                const float v = residual[j + l] + x[j + l];
                residual[j + l] = v;
                acc[l] += v * v;
            }
        for (; j < d; j++) {
            const float v = residual[j] + x[j];
            residual[j] = v;
            acc[0] += v * v;
        }
        src = residual;
    } else {
        for (; j + 16 <= d; j += 16)
            for (int l = 0; l < 16; l++) acc[l] += x[j + l] * x[j + l];
        for (; j < d; j++) acc[0] += x[j] * x[j];
    }
    double ss = 0.0;
    for (int l = 0; l < 16; l++) ss += acc[l];
    const float inv = (float)(1.0 / sqrt(ss / (double)d + eps));
    for (j = 0; j < d; j++) out[j] = weight[j] * (src[j] * inv);
}
PAGEDCY_ROW_VARIANTS(pagedcy_rms_row,
                     (const float *x, float *residual, const float *weight, float eps, float *out, ptrdiff_t d),
                     (x, residual, weight, eps, out, d))

/* out[j] = silu(gate_up[j]) * gate_up[width + j] for one row laid out as gate | up. */
PAGEDCY_ROW_IMPL void pagedcy_silu_mul_row_impl(const float *gate_up, float *out, ptrdiff_t width) {
    const float *up = gate_up + width;
    for (ptrdiff_t j = 0; j < width; j++) {
        float g = gate_up[j];
        out[j] = g / (1.0f + pagedcy_expf(-g)) * up[j];
    }
}
PAGEDCY_ROW_VARIANTS(pagedcy_silu_mul_row, (const float *gate_up, float *out, ptrdiff_t width),
                     (gate_up, out, width))

/* out[j] = gelu_tanh(gate_up[j]) * gate_up[width + j] (Gemma's MLP). The tanh
 * approximation 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3), is computed as
 * g * sigmoid(2u), the same function: no cancellation in 1 + tanh(u) for g << 0. */
PAGEDCY_ROW_IMPL void pagedcy_gelu_tanh_mul_row_impl(const float *gate_up, float *out, ptrdiff_t width) {
    const float *up = gate_up + width;
    for (ptrdiff_t j = 0; j < width; j++) {
        float g = gate_up[j];
        float u2 = 1.5957691216057308f * (g + 0.044715f * g * g * g);  /* 2u */
        out[j] = g / (1.0f + pagedcy_expf(-u2)) * up[j];
    }
}
PAGEDCY_ROW_VARIANTS(pagedcy_gelu_tanh_mul_row, (const float *gate_up, float *out, ptrdiff_t width),
                     (gate_up, out, width))

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif
