/* Port-throughput probe: 12 independent chains of vpdpbusd zmm / ymm(AVX-VNNI) / vfmadd zmm. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define IT 20000000L
__attribute__((target("avx512f,avx512vnni"))) static double dp_zmm(void) {
    __m512i a[12]; _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    __m512i w = _mm512_set1_epi32(0x01010101), x = _mm512_set1_epi32(0x02020202);
    double t = now();
    for (long k = 0; k < IT; k++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
        __asm__ volatile("" : "+v"(w), "+v"(x));
    }
    t = now() - t; int s = 0; for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
    if (s == 7) puts("");
    return IT * 12.0 / t;
}
__attribute__((target("avx2,avxvnni"))) static double dp_ymm(void) {
    __m256i a[12]; _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(i);
    __m256i w = _mm256_set1_epi32(0x01010101), x = _mm256_set1_epi32(0x02020202);
    double t = now();
    for (long k = 0; k < IT; k++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm256_dpbusd_avx_epi32(a[i], w, x);
        __asm__ volatile("" : "+x"(w), "+x"(x));
    }
    t = now() - t; int s = 0; for (int i = 0; i < 12; i++) s += _mm256_extract_epi32(a[i], 0);
    if (s == 7) puts("");
    return IT * 12.0 / t;
}
__attribute__((target("avx512f"))) static double fma_zmm(void) {
    __m512 a[12]; _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(i);
    __m512 w = _mm512_set1_ps(1.0f), x = _mm512_set1_ps(0.0f);
    double t = now();
    for (long k = 0; k < IT; k++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], w, x);
        __asm__ volatile("" : "+v"(w), "+v"(x));
    }
    t = now() - t; float s = 0; for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    if (s == 7) puts("");
    return IT * 12.0 / t;
}
int main(void) {
    for (int r = 0; r < 3; r++)
        printf("per second: vpdpbusd zmm %.2fG  vpdpbusd ymm (AVX-VNNI) %.2fG  vfmadd zmm %.2fG\n", dp_zmm() / 1e9, dp_ymm() / 1e9, fma_zmm() / 1e9);
}
