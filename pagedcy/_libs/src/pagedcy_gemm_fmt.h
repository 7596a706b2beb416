/* The GEMM's own row formats (pagedcy_rowfmt.h): float32, float16 and bfloat16
 * weights stored [N, K] row-major. Each decoder widens elements [k0, k0 + nk)
 * of one row to float32 exactly (both widenings are exact), so a GEMM on f16 or
 * bf16 storage equals the float32 GEMM on the widened weight bit for bit.
 *
 * The widening's instruction set follows pagedcy_simd_level() (so PAGEDCY_SIMD
 * caps it for tests); every level gives the same values.
 *
 * The float32 format is recognised by its decoder (pagedcy_rowfmt_is_f32): the
 * GEMM then reads the weight in place instead of decoding it.
 */
#ifndef PAGEDCY_GEMM_FMT_H
#define PAGEDCY_GEMM_FMT_H

#include <stdint.h>
#include <string.h>
#include "pagedcy_convert.h"
#include "pagedcy_rowfmt.h"

static void pagedcy_decode_f32(const void *row, int64_t k0, int64_t nk, float *dst) {
    memcpy(dst, (const float *)row + k0, (size_t)nk * sizeof(float));
}

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
static void pg_f16_avx512(const uint16_t *s, int64_t n, float *d) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
static void pg_bf16_avx512(const uint16_t *s, int64_t n, float *d) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
        _mm512_mask_storeu_ps(d + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

__attribute__((target("avx2,fma")))
static void pg_bf16_avx2(const uint16_t *s, int64_t n, float *d) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) d[i] = pagedcy_bf16_to_f32(s[i]);
}
#define PG_FMT_SIMD 1
#else
#define PG_FMT_SIMD 0
#endif

static void pagedcy_decode_f16(const void *row, int64_t k0, int64_t nk, float *dst) {
    const uint16_t *s = (const uint16_t *)row + k0;
#if PG_FMT_SIMD
    if (pagedcy_simd_level() >= PAGEDCY_SIMD_AVX512) { pg_f16_avx512(s, nk, dst); return; }
    if (pagedcy_simd_level() >= PAGEDCY_SIMD_AVX2) { pagedcy_f16_to_f32_avx2(s, dst, (size_t)nk); return; }
#endif
    for (int64_t i = 0; i < nk; i++) dst[i] = pagedcy_f16_to_f32(s[i]);
}

static void pagedcy_decode_bf16(const void *row, int64_t k0, int64_t nk, float *dst) {
    const uint16_t *s = (const uint16_t *)row + k0;
#if PG_FMT_SIMD
    if (pagedcy_simd_level() >= PAGEDCY_SIMD_AVX512) { pg_bf16_avx512(s, nk, dst); return; }
    if (pagedcy_simd_level() >= PAGEDCY_SIMD_AVX2) { pg_bf16_avx2(s, nk, dst); return; }
#endif
    for (int64_t i = 0; i < nk; i++) dst[i] = pagedcy_bf16_to_f32(s[i]);
}

static const pagedcy_rowfmt pagedcy_rowfmt_f32 = {pagedcy_decode_f32, 1, 4, 0};
static const pagedcy_rowfmt pagedcy_rowfmt_f16 = {pagedcy_decode_f16, 1, 2, 0};
static const pagedcy_rowfmt pagedcy_rowfmt_bf16 = {pagedcy_decode_bf16, 1, 2, 0};

/* PAGEDCY_F32 / PAGEDCY_F16 / PAGEDCY_BF16 (pagedcy_convert.h) -> its format, or NULL. */
static inline const pagedcy_rowfmt *pagedcy_rowfmt_for_dtype(int dtype) {
    return dtype == PAGEDCY_F32 ? &pagedcy_rowfmt_f32 : dtype == PAGEDCY_F16 ? &pagedcy_rowfmt_f16
         : dtype == PAGEDCY_BF16 ? &pagedcy_rowfmt_bf16 : (const pagedcy_rowfmt *)0;
}

static inline int pagedcy_rowfmt_is_f32(const pagedcy_rowfmt *fmt) {
    return fmt->decode == pagedcy_decode_f32;
}

#endif
