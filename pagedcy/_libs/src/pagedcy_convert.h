/* Storage-dtype conversion between float32 and the KV formats: float16,
 * bfloat16, and int8 with a scale per (token, KV head) row.
 *
 * Scalar versions are exact IEEE round-to-nearest-even and are the reference;
 * the F16C/AVX2 bulk versions are compiled with target attributes and picked
 * at run time, so a portable wheel still runs on any x86-64 (and elsewhere).
 * Both give bit-identical results (F16C rounds to nearest even too).
 */
#ifndef PAGEDCY_CONVERT_H
#define PAGEDCY_CONVERT_H

#include <stdint.h>
#include <string.h>
#include <stddef.h>
#include <math.h>

#define PAGEDCY_F32 0
#define PAGEDCY_F16 1
#define PAGEDCY_BF16 2
/* int8: each (token, KV head) row is head_dim int8 values q followed by its
 * float32 scale s (4 bytes, native byte order); the row stands for q * s.
 * Symmetric: s = max|x| / 127, q = round(x / s) in [-127, 127]. */
#define PAGEDCY_I8 3
#define PAGEDCY_I8_SCALE_BYTES 4

#if defined(__x86_64__) || defined(__i386__)
#define PAGEDCY_X86 1
#include <immintrin.h>
#else
#define PAGEDCY_X86 0
#endif

static inline uint32_t pagedcy_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float pagedcy_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t pagedcy_f32_to_f16(float f) {
    uint32_t x = pagedcy_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {                       /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? (0x200u | ((absx >> 13) & 0x3ffu)) : 0u));
    }
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* overflow -> inf */
    if (absx < 0x38800000u) {                        /* subnormal or zero in f16 */
        if (absx < 0x33000000u) return (uint16_t)sign;            /* < 2^-25 rounds to 0 */
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                   /* 14 .. 24 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = absx - 0x38000000u;                 /* rebias exponent 127 -> 15 */
    uint32_t h = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static inline float pagedcy_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t out;
    if (e == 0) {
        if (m == 0) out = sign;
        else {                                        /* subnormal: normalise */
            int k = -1;
            do { k++; m <<= 1; } while (!(m & 0x400u));
            out = sign | ((uint32_t)(127 - 15 - k) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        out = sign | 0x7f800000u | (m << 13);
    } else {
        out = sign | ((e + 112u) << 23) | (m << 13);
    }
    return pagedcy_bits_f32(out);
}

static inline uint16_t pagedcy_f32_to_bf16(float f) {
    uint32_t x = pagedcy_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float pagedcy_bf16_to_f32(uint16_t b) {
    return pagedcy_bits_f32((uint32_t)b << 16);
}

/* ---- run-time dispatch ------------------------------------------------- */
static inline int pagedcy_cpu_has_avx2_fma(void) {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                 __builtin_cpu_supports("f16c");
    }
    return cached;
#else
    return 0;
#endif
}

/* AVX-512 F/DQ/VL/BW usable: the CPU has them and the OS saves the zmm state
 * (libgcc's feature check includes XGETBV). */
static inline int pagedcy_cpu_has_avx512(void) {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = pagedcy_cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bw");
    }
    return cached;
#else
    return 0;
#endif
}

/* AVX-512 VNNI (vpdpbusd on zmm) as well: the int8 kernels' AVX-512 level. */
static inline int pagedcy_cpu_has_avx512vnni(void) {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = pagedcy_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
    }
    return cached;
#else
    return 0;
#endif
}

#define PAGEDCY_SIMD_SCALAR 0
#define PAGEDCY_SIMD_AVX2 1
#define PAGEDCY_SIMD_AVX512 2

/* The kernels' instruction set: the best the CPU has, capped by the
 * environment (read once per process): PAGEDCY_SIMD=scalar|avx2|avx512, or
 * the older PAGEDCY_FORCE_SCALAR=1. Tests use the caps to check that every
 * path agrees with the reference. */
#include <stdlib.h>
static inline int pagedcy_simd_level(void) {
    static int cached = -1;
    if (cached < 0) {
        int level = pagedcy_cpu_has_avx512() ? PAGEDCY_SIMD_AVX512
                  : pagedcy_cpu_has_avx2_fma() ? PAGEDCY_SIMD_AVX2 : PAGEDCY_SIMD_SCALAR;
        const char *s = getenv("PAGEDCY_FORCE_SCALAR");
        if (s && s[0] && s[0] != '0') level = PAGEDCY_SIMD_SCALAR;
        const char *c = getenv("PAGEDCY_SIMD");
        if (c && (!strcmp(c, "scalar") || !strcmp(c, "none"))) level = PAGEDCY_SIMD_SCALAR;
        else if (c && !strcmp(c, "avx2") && level > PAGEDCY_SIMD_AVX2) level = PAGEDCY_SIMD_AVX2;
        cached = level;
    }
    return cached;
}

/* Any SIMD path (the conversions only need AVX2/F16C). */
static inline int pagedcy_use_simd(void) { return pagedcy_simd_level() > PAGEDCY_SIMD_SCALAR; }

#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma,f16c")))
static void pagedcy_f32_to_f16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = pagedcy_f32_to_f16(src[i]);
}
__attribute__((target("avx2,fma,f16c")))
static void pagedcy_f16_to_f32_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = pagedcy_f16_to_f32(src[i]);
}
#endif

/* Convert n float32 values into storage dtype `dtype` (bytes at dst). */
static inline void pagedcy_store_from_f32(int dtype, void *dst, const float *src, size_t n) {
    if (dtype == PAGEDCY_F32) { memcpy(dst, src, n * 4); return; }
    uint16_t *d = (uint16_t *)dst;
    if (dtype == PAGEDCY_F16) {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
        if (pagedcy_use_simd()) { pagedcy_f32_to_f16_avx2(src, d, n); return; }
#endif
        for (size_t i = 0; i < n; i++) d[i] = pagedcy_f32_to_f16(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) d[i] = pagedcy_f32_to_bf16(src[i]);
    }
}

/* Convert n storage-dtype values to float32. */
static inline void pagedcy_load_to_f32(int dtype, float *dst, const void *src, size_t n) {
    if (dtype == PAGEDCY_F32) { memcpy(dst, src, n * 4); return; }
    const uint16_t *s = (const uint16_t *)src;
    if (dtype == PAGEDCY_F16) {
#if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
        if (pagedcy_use_simd()) { pagedcy_f16_to_f32_avx2(s, dst, n); return; }
#endif
        for (size_t i = 0; i < n; i++) dst[i] = pagedcy_f16_to_f32(s[i]);
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = pagedcy_bf16_to_f32(s[i]);
    }
}

/* Stored bytes of one (token, KV head) row of head_dim values. */
static inline size_t pagedcy_head_bytes(int dtype, size_t head_dim) {
    if (dtype == PAGEDCY_I8) return head_dim + PAGEDCY_I8_SCALE_BYTES;
    return head_dim * (dtype == PAGEDCY_F32 ? 4 : 2);
}

/* Quantize one row of D floats. Non-finite values saturate and stay in
 * their row: the scale comes from the finite values only, NaN stores 0,
 * +-Inf store +-127 (0 when the row has no non-zero finite value). */
static inline void pagedcy_quantize_i8_row(int8_t *dst, const float *src, size_t D) {
    float amax = 0.0f;
    for (size_t d = 0; d < D; d++) {
        const float a = fabsf(src[d]);
        if (a > amax && a <= 3.402823466e38f) amax = a;
    }
    const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (size_t d = 0; d < D; d++) {
        const float x = src[d];
        float y;
        if (x != x) y = 0.0f;
        else if (fabsf(x) > 3.402823466e38f) y = amax > 0.0f ? (x > 0.0f ? 127.0f : -127.0f) : 0.0f;
        else y = nearbyintf(x * inv);
        if (y > 127.0f) y = 127.0f;
        if (y < -127.0f) y = -127.0f;
        dst[d] = (int8_t)y;
    }
    memcpy(dst + D, &scale, sizeof(float));
}

static inline float pagedcy_i8_scale(const void *row, size_t D) {
    float s;
    memcpy(&s, (const char *)row + D, sizeof(float));
    return s;
}

static inline void pagedcy_dequantize_i8_row(float *dst, const int8_t *src, size_t D) {
    const float s = pagedcy_i8_scale(src, D);
    for (size_t d = 0; d < D; d++) dst[d] = (float)src[d] * s;
}

/* n float32 values (rows of head_dim) into storage dtype `dtype` at dst,
 * pagedcy_head_bytes(dtype, head_dim) bytes per row. */
static inline void pagedcy_kv_store(int dtype, void *dst, const float *src, size_t n, size_t head_dim) {
    if (dtype != PAGEDCY_I8) { pagedcy_store_from_f32(dtype, dst, src, n); return; }
    const size_t hb = pagedcy_head_bytes(dtype, head_dim);
    for (size_t r = 0; r < n / head_dim; r++)
        pagedcy_quantize_i8_row((int8_t *)dst + r * hb, src + r * head_dim, head_dim);
}

/* The inverse: n float32 values from rows of storage dtype `dtype`. */
static inline void pagedcy_kv_load(int dtype, float *dst, const void *src, size_t n, size_t head_dim) {
    if (dtype != PAGEDCY_I8) { pagedcy_load_to_f32(dtype, dst, src, n); return; }
    const size_t hb = pagedcy_head_bytes(dtype, head_dim);
    for (size_t r = 0; r < n / head_dim; r++)
        pagedcy_dequantize_i8_row(dst + r * head_dim, (const int8_t *)src + r * hb, head_dim);
}

/* nrows rows of head_dim float32 values (src_stride floats apart) into
 * stored rows dst_stride bytes apart: one (token, head) row each, so the
 * store can place a head's rows wherever its page layout puts them. */
static inline void pagedcy_kv_store_rows(int dtype, char *dst, int64_t dst_stride, const float *src,
                                         int64_t src_stride, int64_t nrows, size_t head_dim) {
    for (int64_t r = 0; r < nrows; r++)
        pagedcy_kv_store(dtype, dst + r * dst_stride, src + r * src_stride, head_dim, head_dim);
}

/* The inverse, to float32 rows; or (to_f32 == 0) a byte copy of the stored
 * rows (head_bytes each) into rows dst_stride bytes apart. */
static inline void pagedcy_kv_load_rows(int dtype, char *dst, int64_t dst_stride, const char *src,
                                        int64_t src_stride, int64_t nrows, size_t head_dim, int to_f32) {
    const size_t hb = pagedcy_head_bytes(dtype, head_dim);
    for (int64_t r = 0; r < nrows; r++) {
        if (to_f32) pagedcy_kv_load(dtype, (float *)(dst + r * dst_stride), src + r * src_stride, head_dim, head_dim);
        else memcpy(dst + r * dst_stride, src + r * src_stride, hb);
    }
}

#endif
