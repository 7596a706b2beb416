/* int8-activation measurement spike (standalone; not pagedcy production code).
 *
 * Semantics (bit-exact batch invariance): per output (m,n), K splits into groups
 * of 32 (16 for Q6_K's sub-scales).  I = exact int32 sum qw*qa over the group;
 * then sequentially over g:  acc = fma(sw*da, (float)I, acc)
 *                 affine:    acc = fma(mw*da, (float)S, acc)
 * sw = d*sc and mw = -dmin*m are exact fp32 products; da = amax/127 per 32-group,
 * qa = round(x*(127/amax)); S = sum of qa over the 32-group.
 * Q6_K uses u8 q (0..63) in vpdpbusd and subtracts 32*S16 (exact, integer).
 *
 * Build: see Makefile.  Run: ./int8spike check | quant | gemv N K fmt | tile N
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define Q4K_BYTES 144
#define Q6K_BYTES 210

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static uint64_t rng_s = 0x1234567887654321ull;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rnorm(void) {
    double u = (rnd() >> 11) * (1.0 / 9007199254740992.0) + 1e-300, v = (rnd() >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static float h2f(uint16_t h) { return _cvtsh_ss(h); }
static uint16_t f2h(float f) { return _cvtss_sh(f, 0); }
static void *amalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n + 64)) { perror("alloc"); exit(1); }
    return p;
}

/* ---------------- random valid blocks, reference dequant (float64) ---------------- */
static void gen_blocks(uint8_t *raw, size_t nbytes, int q6) {
    for (size_t i = 0; i + 8 <= nbytes; i += 8) { uint64_t r = rnd(); memcpy(raw + i, &r, 8); }
    size_t bs = q6 ? Q6K_BYTES : Q4K_BYTES;
    for (size_t b = 0; b < nbytes / bs; b++) {
        uint8_t *blk = raw + b * bs;
        uint16_t d = f2h((float)(0.005 + 0.01 * ((rnd() & 1023) / 1024.0)));
        uint16_t dm = f2h((float)(0.002 + 0.004 * ((rnd() & 1023) / 1024.0)));
        if (q6) memcpy(blk + 208, &d, 2);
        else { memcpy(blk, &d, 2); memcpy(blk + 2, &dm, 2); }
    }
}
static void gsm(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else { *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}
static void deq_q4k(const uint8_t *row, int K, double *y) {
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + b * Q4K_BYTES, *qs = blk + 16;
        uint16_t hd, hm; memcpy(&hd, blk, 2); memcpy(&hm, blk + 2, 2);
        double d = h2f(hd), dm = h2f(hm);
        _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) {
            int s1, m1, s2, m2; gsm(2 * j, blk + 4, &s1, &m1); gsm(2 * j + 1, blk + 4, &s2, &m2);
            _Pragma("GCC unroll 16") for (int l = 0; l < 32; l++) {
                y[b * 256 + 64 * j + l] = d * s1 * (qs[32 * j + l] & 15) - dm * m1;
                y[b * 256 + 64 * j + 32 + l] = d * s2 * (qs[32 * j + l] >> 4) - dm * m2;
            }
        }
    }
}
static void deq_q6k(const uint8_t *row, int K, double *y) {
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + b * Q6K_BYTES;
        uint16_t hd; memcpy(&hd, blk + 208, 2);
        double d = h2f(hd);
        _Pragma("GCC unroll 16") for (int h = 0; h < 2; h++) {
            const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(blk + 192 + 8 * h);
            double *yy = y + b * 256 + 128 * h;
            _Pragma("GCC unroll 16") for (int l = 0; l < 32; l++) {
                int is = l / 16;
                yy[l] = d * sc[is] * (((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                yy[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                yy[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                yy[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
    }
}

/* ---------------- activation quantization ---------------- */
typedef struct { int K; int8_t *qa; float *da; int32_t *S16; float *Sf; } actq_t;
static actq_t act_alloc(int M, int K) {
    actq_t a = {K, amalloc((size_t)M * K), amalloc((size_t)M * K / 32 * 4), amalloc((size_t)M * K / 16 * 4),
                amalloc((size_t)M * K / 32 * 4)};
    return a;
}
static void quant_ref(const float *x, int K, int8_t *qa, float *da, int32_t *S16, float *Sf) {
    for (int g = 0; g < K / 32; g++) {
        float amax = 0;
        _Pragma("GCC unroll 16") for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * g + i]));
        float id = amax > 0 ? 127.f / amax : 0.f;
        da[g] = amax / 127.f;
        int s[2] = {0, 0};
        _Pragma("GCC unroll 16") for (int i = 0; i < 32; i++) {
            float v = x[32 * g + i] * id;
            int q = (int)nearbyintf(v);
            qa[32 * g + i] = (int8_t)q; s[i / 16] += q;
        }
        S16[2 * g] = s[0]; S16[2 * g + 1] = s[1]; Sf[g] = (float)(s[0] + s[1]);
    }
}
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void quant_zmm(const float *x, int K, int8_t *qa, float *da, int32_t *S16, float *Sf) {
    for (int g = 0; g < K / 32; g++) {
        __m512 a = _mm512_loadu_ps(x + 32 * g), b = _mm512_loadu_ps(x + 32 * g + 16);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
        float amax = _mm512_reduce_max_ps(m);
        float id = amax > 0 ? 127.f / amax : 0.f;
        da[g] = amax / 127.f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i qa0 = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
        _mm_storeu_si128((__m128i *)(qa + 32 * g), _mm512_cvtepi32_epi8(qa0));
        _mm_storeu_si128((__m128i *)(qa + 32 * g + 16), _mm512_cvtepi32_epi8(qb));
        int s0 = _mm512_reduce_add_epi32(qa0), s1 = _mm512_reduce_add_epi32(qb);
        S16[2 * g] = s0; S16[2 * g + 1] = s1; Sf[g] = (float)(s0 + s1);
    }
}

/* Software prefetch PF bytes ahead of the linear progress through a row block
 * (rows are contiguous, so a block of R rows is one R*rb span).  PF=0: off. */
static size_t g_pfd = 16384; /* measured best of 0/8K/16K/32K on Q4_K 8192x2048 cold */
static size_t g_npfd = 4096; /* nibble panel: one linear stream per panel */
#ifndef PFHINT
#define PFHINT _MM_HINT_T0
#endif
#define PF(base, b, rows, BS)                                                                 \
    if (g_pfd) {                                                                              \
        const char *pp_ = (const char *)(base) + (size_t)(b) * (rows) * (BS) + g_pfd;         \
        for (int l_ = 0; l_ < (rows) * (BS); l_ += 64) _mm_prefetch(pp_ + l_, PFHINT);  \
    }

/* ---------------- transpose-reduce helpers ---------------- */
#define ZSH(a, b, i) _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), i))
#define ZCOMB1(a, b) _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)))
#define ZCOMB2(a, b) _mm512_add_epi32(ZSH(a, b, _MM_SHUFFLE(1, 0, 1, 0)), ZSH(a, b, _MM_SHUFFLE(3, 2, 3, 2)))
#define ZCOMB3(a, b) _mm512_add_epi32(ZSH(a, b, _MM_SHUFFLE(2, 0, 2, 0)), ZSH(a, b, _MM_SHUFFLE(3, 1, 3, 1)))
#define YSH(a, b, i) _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), i))
#define YCOMB1(a, b) _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31))
#define YCOMB2(a, b) _mm256_add_epi32(YSH(a, b, _MM_SHUFFLE(1, 0, 1, 0)), YSH(a, b, _MM_SHUFFLE(3, 2, 3, 2)))
#define YCOMB3(a, b) _mm256_add_epi32(YSH(a, b, _MM_SHUFFLE(2, 0, 2, 0)), YSH(a, b, _MM_SHUFFLE(3, 1, 3, 1)))

/* ---------------- GEMV Q4_K, AVX-512 VNNI, 16 rows per step ----------------
 * One 64-byte load per row = qs chunks j,j+1: low nibbles = [group 2j | 2j+2],
 * high = [2j+1 | 2j+3].  Per-row dpbusd partials are transpose-reduced (16 rows
 * x 8 lanes -> 16 lanes); the resulting lane->row order is perm[] below, so the
 * scale gathers use the same order and the store un-permutes. */
typedef void (*gemv_fn)(const uint8_t *W, size_t rb, int K, const actq_t *a, float *out, int n0, int n1);

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
static void gemv_q4k_zmm(const uint8_t *W, size_t rb, int K, const actq_t *a, float *out, int n0, int n1) {
    static const int perm[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    static const int inv[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    __m512i offs = _mm512_mullo_epi32(_mm512_loadu_si512(perm), _mm512_set1_epi32((int)rb));
    const __m512i invi = _mm512_loadu_si512(inv);
    const __m512i m4 = _mm512_set1_epi8(15), m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
    for (int n = n0; n < n1; n += 16) {
        const uint8_t *base = W + (size_t)n * rb;
        __m512 acc = _mm512_setzero_ps();
        for (int b = 0; b < K / 256; b++) {
            const uint8_t *blk = base + (size_t)b * Q4K_BYTES;
            PF(base, b, 16, Q4K_BYTES)
            __m512i D = _mm512_i32gather_epi32(offs, blk, 1);
            __m512i Q0 = _mm512_i32gather_epi32(offs, blk + 4, 1);
            __m512i Q1 = _mm512_i32gather_epi32(offs, blk + 8, 1);
            __m512i Q2 = _mm512_i32gather_epi32(offs, blk + 12, 1);
            __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D));
            __m512 ndm = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16))));
            __m512 sw[8], mw[8];
            _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) {
                __m512i sc = _mm512_and_si512(_mm512_srli_epi32(Q0, 8 * j), m63);
                __m512i mm = _mm512_and_si512(_mm512_srli_epi32(Q1, 8 * j), m63);
                __m512i sc2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(Q2, 8 * j), m15),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(Q0, 8 * j + 6), m3), 4));
                __m512i mm2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(Q2, 8 * j + 4), m15),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(Q1, 8 * j + 6), m3), 4));
                sw[j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)); mw[j] = _mm512_mul_ps(ndm, _mm512_cvtepi32_ps(mm));
                sw[j + 4] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc2)); mw[j + 4] = _mm512_mul_ps(ndm, _mm512_cvtepi32_ps(mm2));
            }
            const int8_t *qa = a->qa + b * 256;
            _Pragma("GCC unroll 16") for (int j = 0; j < 4; j += 2) {
                __m512i alo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qa + 64 * j))),
                                                 _mm256_loadu_si256((const __m256i *)(qa + 64 * j + 64)), 1);
                __m512i ahi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qa + 64 * j + 32))),
                                                 _mm256_loadu_si256((const __m256i *)(qa + 64 * j + 96)), 1);
                __m512i L[16], H[16];
                _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) {
                    __m512i w = _mm512_loadu_si512(blk + 16 + 32 * j + (size_t)r * rb);
                    L[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(w, m4), alo);
                    H[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(_mm512_srli_epi16(w, 4), m4), ahi);
                }
                _Pragma("GCC unroll 16") for (int q = 0; q < 8; q++) { L[q] = ZCOMB1(L[2 * q], L[2 * q + 1]); H[q] = ZCOMB1(H[2 * q], H[2 * q + 1]); }
                _Pragma("GCC unroll 16") for (int q = 0; q < 4; q++) { L[q] = ZCOMB2(L[2 * q], L[2 * q + 1]); H[q] = ZCOMB2(H[2 * q], H[2 * q + 1]); }
                _Pragma("GCC unroll 16") for (int q = 0; q < 2; q++) { L[q] = ZCOMB3(L[2 * q], L[2 * q + 1]); H[q] = ZCOMB3(H[2 * q], H[2 * q + 1]); }
                __m512i I[4];
                I[0] = _mm512_shuffle_i64x2(L[0], L[1], _MM_SHUFFLE(2, 0, 2, 0)); /* group 2j   */
                I[1] = _mm512_shuffle_i64x2(H[0], H[1], _MM_SHUFFLE(2, 0, 2, 0)); /* group 2j+1 */
                I[2] = _mm512_shuffle_i64x2(L[0], L[1], _MM_SHUFFLE(3, 1, 3, 1)); /* group 2j+2 */
                I[3] = _mm512_shuffle_i64x2(H[0], H[1], _MM_SHUFFLE(3, 1, 3, 1)); /* group 2j+3 */
                _Pragma("GCC unroll 16") for (int t = 0; t < 4; t++) {
                    int g = b * 8 + 2 * j + t;
                    __m512 dav = _mm512_set1_ps(a->da[g]);
                    acc = _mm512_fmadd_ps(_mm512_mul_ps(sw[2 * j + t], dav), _mm512_cvtepi32_ps(I[t]), acc);
                    acc = _mm512_fmadd_ps(_mm512_mul_ps(mw[2 * j + t], dav), _mm512_set1_ps(a->Sf[g]), acc);
                }
            }
        }
        _mm512_storeu_ps(out + n, _mm512_permutexvar_ps(invi, acc));
    }
}

/* ---------------- GEMV Q6_K, AVX-512 VNNI, 16 rows ----------------
 * One 64-byte load of ql per row-half gives [y0|y1] low nibbles; qh (32 bytes)
 * is broadcast to both halves and shifted per half with vpsllvw/vpsrlvw.
 * Each row's partial vector holds 4 groups of 16 x 4 lanes; two reduce levels
 * and a 4x4 128-bit transpose give 4 vectors of 16 rows in natural order. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
static void gemv_q6k_zmm(const uint8_t *W, size_t rb, int K, const actq_t *a, float *out, int n0, int n1) {
    __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)rb));
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    for (int n = n0; n < n1; n += 16) {
        const uint8_t *base = W + (size_t)n * rb;
        __m512 acc = _mm512_setzero_ps();
        for (int b = 0; b < K / 256; b++) {
            const uint8_t *blk = base + (size_t)b * Q6K_BYTES;
            PF(base, b, 16, Q6K_BYTES)
            __m512i Dg = _mm512_i32gather_epi32(offs, blk + 206, 1);
            __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(Dg, 16)));
            __m512i Sc[4];
            _Pragma("GCC unroll 16") for (int i = 0; i < 4; i++) Sc[i] = _mm512_i32gather_epi32(offs, blk + 192 + 4 * i, 1);
            __m512 sw[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                sw[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(Sc[i / 4], 24 - 8 * (i % 4)), 24)));
            _Pragma("GCC unroll 16") for (int h = 0; h < 2; h++) {
                const int8_t *qa = a->qa + b * 256 + 128 * h;
                __m512i a01 = _mm512_loadu_si512(qa), a23 = _mm512_loadu_si512(qa + 64);
                __m512i P[16], R[16];
                _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) {
                    const uint8_t *rp = blk + (size_t)r * rb;
                    __m512i z = _mm512_loadu_si512(rp + 64 * h);
                    __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(rp + 128 + 32 * h)));
                    __m512i y01 = _mm512_ternarylogic_epi32(_mm512_and_si512(z, m4), _mm512_sllv_epi16(hb, sh01), m30, 0xF8); /* a|(b&c) */
                    __m512i y23 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(z, 4), m4), _mm512_srlv_epi16(hb, sh23), m30, 0xF8);
                    P[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), y01, a01);
                    R[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), y23, a23);
                }
                _Pragma("GCC unroll 16") for (int q = 0; q < 8; q++) { P[q] = ZCOMB2(P[2 * q], P[2 * q + 1]); R[q] = ZCOMB2(R[2 * q], R[2 * q + 1]); }
                _Pragma("GCC unroll 16") for (int q = 0; q < 4; q++) { P[q] = ZCOMB3(P[2 * q], P[2 * q + 1]); R[q] = ZCOMB3(R[2 * q], R[2 * q + 1]); }
                _Pragma("GCC unroll 16") for (int pass = 0; pass < 2; pass++) {
                    __m512i *O = pass ? R : P;
                    __m512i T0 = _mm512_shuffle_i64x2(O[0], O[1], _MM_SHUFFLE(1, 0, 1, 0)), T1 = _mm512_shuffle_i64x2(O[0], O[1], _MM_SHUFFLE(3, 2, 3, 2));
                    __m512i T2 = _mm512_shuffle_i64x2(O[2], O[3], _MM_SHUFFLE(1, 0, 1, 0)), T3 = _mm512_shuffle_i64x2(O[2], O[3], _MM_SHUFFLE(3, 2, 3, 2));
                    __m512i G[4] = {_mm512_shuffle_i64x2(T0, T2, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(T0, T2, _MM_SHUFFLE(3, 1, 3, 1)),
                                    _mm512_shuffle_i64x2(T1, T3, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(T1, T3, _MM_SHUFFLE(3, 1, 3, 1))};
                    _Pragma("GCC unroll 16") for (int k = 0; k < 4; k++) {
                        int g16 = 8 * h + 4 * pass + k, G16 = b * 16 + g16;
                        __m512i I = _mm512_sub_epi32(G[k], _mm512_set1_epi32(32 * a->S16[G16]));
                        __m512 dav = _mm512_set1_ps(a->da[G16 >> 1]);
                        acc = _mm512_fmadd_ps(_mm512_mul_ps(sw[g16], dav), _mm512_cvtepi32_ps(I), acc);
                    }
                }
            }
        }
        _mm512_storeu_ps(out + n, acc);
    }
}

/* ---------------- GEMV, ymm (AVX-VNNI or AVX2), 8 rows per step ---------------- */
#define DOT_VNNI(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
#define DOT_AVX2(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones16)
/* fp16 in the low half of each dword -> 8 floats */
#define Y_H2F(D) _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(_mm256_and_si256(D, mffff)), _mm256_extracti128_si256(_mm256_and_si256(D, mffff), 1)))

#define GEMV_Q4K_YMM(NAME, TGT, DOT)                                                                                                    \
    __attribute__((target(TGT))) static void NAME(const uint8_t *W, size_t rb, int K, const actq_t *a, float *out, int n0, int n1) { \
        static const int perm[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* lane 4k+s <- row 2s+k */                                        \
        static const int inv[8] = {0, 4, 1, 5, 2, 6, 3, 7};                                                                       \
        __m256i offs = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)perm), _mm256_set1_epi32((int)rb));                  \
        const __m256i invi = _mm256_loadu_si256((const __m256i *)inv), mffff = _mm256_set1_epi32(0xffff);                         \
        const __m256i m4 = _mm256_set1_epi8(15), m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15), m3 = _mm256_set1_epi32(3); \
        const __m256i ones16 = _mm256_set1_epi16(1); (void)ones16;                                                                 \
        for (int n = n0; n < n1; n += 8) {                                                                                         \
            const uint8_t *base = W + (size_t)n * rb;                                                                              \
            __m256 acc = _mm256_setzero_ps();                                                                                      \
            for (int b = 0; b < K / 256; b++) {                                                                                    \
                const uint8_t *blk = base + (size_t)b * Q4K_BYTES; PF(base, b, 8, Q4K_BYTES)                                                                 \
                __m256i D = _mm256_i32gather_epi32((const int *)blk, offs, 1);                                                     \
                __m256i Q0 = _mm256_i32gather_epi32((const int *)(blk + 4), offs, 1);                                              \
                __m256i Q1 = _mm256_i32gather_epi32((const int *)(blk + 8), offs, 1);                                              \
                __m256i Q2 = _mm256_i32gather_epi32((const int *)(blk + 12), offs, 1);                                             \
                __m256 d = Y_H2F(D);                                                                                               \
                __m256 ndm = _mm256_sub_ps(_mm256_setzero_ps(), Y_H2F(_mm256_srli_epi32(D, 16)));                                  \
                __m256 sw[8], mw[8];                                                                                               \
                _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) {                                                                                      \
                    __m256i sc = _mm256_and_si256(_mm256_srli_epi32(Q0, 8 * j), m63);                                              \
                    __m256i mm = _mm256_and_si256(_mm256_srli_epi32(Q1, 8 * j), m63);                                              \
                    __m256i sc2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(Q2, 8 * j), m15),                             \
                                                  _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(Q0, 8 * j + 6), m3), 4));   \
                    __m256i mm2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(Q2, 8 * j + 4), m15),                         \
                                                  _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(Q1, 8 * j + 6), m3), 4));   \
                    sw[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)); mw[j] = _mm256_mul_ps(ndm, _mm256_cvtepi32_ps(mm));           \
                    sw[j + 4] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc2)); mw[j + 4] = _mm256_mul_ps(ndm, _mm256_cvtepi32_ps(mm2)); \
                }                                                                                                                  \
                const int8_t *qa = a->qa + b * 256;                                                                                \
                _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) {                                                                                      \
                    __m256i alo = _mm256_loadu_si256((const __m256i *)(qa + 64 * j));                                              \
                    __m256i ahi = _mm256_loadu_si256((const __m256i *)(qa + 64 * j + 32));                                         \
                    __m256i L[8], H[8];                                                                                            \
                    _Pragma("GCC unroll 16") for (int r = 0; r < 8; r++) {                                                                                  \
                        __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j + (size_t)r * rb));                     \
                        L[r] = DOT(_mm256_and_si256(w, m4), alo);                                                                  \
                        H[r] = DOT(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), ahi);                                            \
                    }                                                                                                              \
                    _Pragma("GCC unroll 16") for (int q = 0; q < 4; q++) { L[q] = YCOMB1(L[2 * q], L[2 * q + 1]); H[q] = YCOMB1(H[2 * q], H[2 * q + 1]); } \
                    _Pragma("GCC unroll 16") for (int q = 0; q < 2; q++) { L[q] = YCOMB2(L[2 * q], L[2 * q + 1]); H[q] = YCOMB2(H[2 * q], H[2 * q + 1]); } \
                    L[0] = YCOMB3(L[0], L[1]); H[0] = YCOMB3(H[0], H[1]);                                                          \
                    _Pragma("GCC unroll 16") for (int t = 0; t < 2; t++) {                                                                                  \
                        int g = b * 8 + 2 * j + t;                                                                                 \
                        __m256 dav = _mm256_set1_ps(a->da[g]);                                                                     \
                        acc = _mm256_fmadd_ps(_mm256_mul_ps(sw[2 * j + t], dav), _mm256_cvtepi32_ps(t ? H[0] : L[0]), acc);        \
                        acc = _mm256_fmadd_ps(_mm256_mul_ps(mw[2 * j + t], dav), _mm256_set1_ps(a->Sf[g]), acc);                   \
                    }                                                                                                              \
                }                                                                                                                  \
            }                                                                                                                      \
            _mm256_storeu_ps(out + n, _mm256_permutevar8x32_ps(acc, invi));                                                        \
        }                                                                                                                          \
    }
GEMV_Q4K_YMM(gemv_q4k_avxvnni, "avx2,avxvnni,f16c,fma", DOT_VNNI)
GEMV_Q4K_YMM(gemv_q4k_avx2, "avx2,f16c,fma", DOT_AVX2)

#define GEMV_Q6K_YMM(NAME, TGT, DOT)                                                                                                    \
    __attribute__((target(TGT))) static void NAME(const uint8_t *W, size_t rb, int K, const actq_t *a, float *out, int n0, int n1) { \
        __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));                 \
        const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), mffff = _mm256_set1_epi32(0xffff);                 \
        const __m256i ones16 = _mm256_set1_epi16(1); (void)ones16;                                                                 \
        for (int n = n0; n < n1; n += 8) {                                                                                         \
            const uint8_t *base = W + (size_t)n * rb;                                                                              \
            __m256 acc = _mm256_setzero_ps();                                                                                      \
            for (int b = 0; b < K / 256; b++) {                                                                                    \
                const uint8_t *blk = base + (size_t)b * Q6K_BYTES; PF(base, b, 8, Q6K_BYTES)                                                                 \
                __m256i Dg = _mm256_i32gather_epi32((const int *)(blk + 206), offs, 1);                                            \
                __m256 d = Y_H2F(_mm256_srli_epi32(Dg, 16));                                                                       \
                __m256i Sc[4];                                                                                                     \
                _Pragma("GCC unroll 16") for (int i = 0; i < 4; i++) Sc[i] = _mm256_i32gather_epi32((const int *)(blk + 192 + 4 * i), offs, 1);            \
                __m256 sw[16];                                                                                                     \
                _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)                                                                                       \
                    sw[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(Sc[i / 4], 24 - 8 * (i % 4)), 24))); \
                _Pragma("GCC unroll 16") for (int h = 0; h < 2; h++) {                                                                                      \
                    const int8_t *qa = a->qa + b * 256 + 128 * h;                                                                  \
                    __m256i av[4];                                                                                                 \
                    _Pragma("GCC unroll 16") for (int i = 0; i < 4; i++) av[i] = _mm256_loadu_si256((const __m256i *)(qa + 32 * i));                       \
                    __m256i P[4][8];                                                                                               \
                    _Pragma("GCC unroll 16") for (int r = 0; r < 8; r++) {                                                                                  \
                        const uint8_t *rp = blk + (size_t)r * rb;                                                                  \
                        __m256i A = _mm256_loadu_si256((const __m256i *)(rp + 64 * h));                                            \
                        __m256i B = _mm256_loadu_si256((const __m256i *)(rp + 64 * h + 32));                                       \
                        __m256i Hh = _mm256_loadu_si256((const __m256i *)(rp + 128 + 32 * h));                                     \
                        __m256i y0 = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(Hh, 4), m30));    \
                        __m256i y1 = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(Hh, 2), m30));    \
                        __m256i y2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(Hh, m30));    \
                        __m256i y3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4), _mm256_and_si256(_mm256_srli_epi16(Hh, 2), m30)); \
                        P[0][r] = DOT(y0, av[0]); P[1][r] = DOT(y1, av[1]); P[2][r] = DOT(y2, av[2]); P[3][r] = DOT(y3, av[3]);   \
                    }                                                                                                              \
                    _Pragma("GCC unroll 16") for (int yi = 0; yi < 4; yi++) {                                                                               \
                        __m256i *Q = P[yi];                                                                                        \
                        _Pragma("GCC unroll 16") for (int q = 0; q < 4; q++) Q[q] = YCOMB2(Q[2 * q], Q[2 * q + 1]);                                        \
                        _Pragma("GCC unroll 16") for (int q = 0; q < 2; q++) Q[q] = YCOMB3(Q[2 * q], Q[2 * q + 1]);                                        \
                        __m256i G[2] = {_mm256_permute2x128_si256(Q[0], Q[1], 0x20), _mm256_permute2x128_si256(Q[0], Q[1], 0x31)}; \
                        _Pragma("GCC unroll 16") for (int k = 0; k < 2; k++) {                                                                              \
                            int g16 = 8 * h + 2 * yi + k, G16 = b * 16 + g16;                                                     \
                            __m256i I = _mm256_sub_epi32(G[k], _mm256_set1_epi32(32 * a->S16[G16]));                              \
                            __m256 dav = _mm256_set1_ps(a->da[G16 >> 1]);                                                          \
                            acc = _mm256_fmadd_ps(_mm256_mul_ps(sw[g16], dav), _mm256_cvtepi32_ps(I), acc);                        \
                        }                                                                                                          \
                    }                                                                                                              \
                }                                                                                                                  \
            }                                                                                                                      \
            _mm256_storeu_ps(out + n, acc);                                                                                        \
        }                                                                                                                          \
    }
GEMV_Q6K_YMM(gemv_q6k_avxvnni, "avx2,avxvnni,f16c,fma", DOT_VNNI)
GEMV_Q6K_YMM(gemv_q6k_avx2, "avx2,f16c,fma", DOT_AVX2)

/* ---------------- Q4_K tile (prefill): packed u8 panels, AVX-512 VNNI ----------------
 * Panel per 16 rows n: [G][8][16][4] bytes (group, k/4 within group, n, 4 k)
 * plus sw/mw [G][16] fp32.  Micro-kernel: MR activation rows x NV*16 columns;
 * per group 8 vpdpbusd per (m, n-vector) with a 4-byte activation broadcast,
 * then the same fp32 chain as the GEMV. */
typedef struct { int N, K; uint8_t *q; float *sw, *mw; } pack_t;
static pack_t pack_q4k(const uint8_t *W, size_t rb, int N, int K) {
    int G = K / 32;
    pack_t p = {N, K, amalloc((size_t)N * K), amalloc((size_t)N * G * 4), amalloc((size_t)N * G * 4)};
    for (int n = 0; n < N; n++) {
        const uint8_t *row = W + (size_t)n * rb;
        int pn = n / 16, ln = n % 16;
        for (int b = 0; b < K / 256; b++) {
            const uint8_t *blk = row + b * Q4K_BYTES;
            uint16_t hd, hm; memcpy(&hd, blk, 2); memcpy(&hm, blk + 2, 2);
            float d = h2f(hd), ndm = -h2f(hm);
            _Pragma("GCC unroll 16") for (int gg = 0; gg < 8; gg++) {
                int s, m; gsm(gg, blk + 4, &s, &m);
                int g = b * 8 + gg;
                p.sw[((size_t)pn * G + g) * 16 + ln] = d * (float)s;
                p.mw[((size_t)pn * G + g) * 16 + ln] = ndm * (float)m;
                _Pragma("GCC unroll 16") for (int k = 0; k < 32; k++) {
                    int j = gg / 2, l = k;
                    uint8_t byte = blk[16 + 32 * j + l];
                    uint8_t q = (gg & 1) ? byte >> 4 : byte & 15;
                    p.q[(((size_t)pn * G + g) * 8 + k / 4) * 64 + ln * 4 + k % 4] = q;
                }
            }
        }
    }
    return p;
}

#define TILE_KERNEL(MR, NV)                                                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) static void tile_##MR##x##NV(                             \
        const pack_t *p, const actq_t *a, int m0, int pn0, float *out, int ldo) {                                                  \
        int K = p->K, G = K / 32;                                                                                                  \
        __m512 acc[MR][NV];                                                                                                        \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();                                 \
        const uint8_t *pq[NV]; const float *psw[NV], *pmw[NV];                                                                     \
        _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) { pq[v] = p->q + (size_t)(pn0 + v) * G * 512; psw[v] = p->sw + (size_t)(pn0 + v) * G * 16; pmw[v] = p->mw + (size_t)(pn0 + v) * G * 16; } \
        for (int g = 0; g < G; g++) {                                                                                              \
            __m512i I[MR][NV];                                                                                                     \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) I[i][v] = _mm512_setzero_si512();                           \
            _Pragma("GCC unroll 16") for (int kk = 0; kk < 8; kk++) {                                                                                       \
                __m512i w[NV];                                                                                                     \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) w[v] = _mm512_load_si512(pq[v] + (size_t)g * 512 + kk * 64);                          \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                                                     \
                    int32_t av; memcpy(&av, a->qa + (size_t)(m0 + i) * K + 32 * g + 4 * kk, 4);                                    \
                    __m512i ab = _mm512_set1_epi32(av);                                                                            \
                    _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) I[i][v] = _mm512_dpbusd_epi32(I[i][v], w[v], ab);                                 \
                }                                                                                                                  \
            }                                                                                                                      \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) {                                                                                         \
                __m512 swv = _mm512_load_ps(psw[v] + g * 16), mwv = _mm512_load_ps(pmw[v] + g * 16);                               \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                                                     \
                    __m512 dav = _mm512_set1_ps(a->da[(size_t)(m0 + i) * G + g]);                                                  \
                    acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(swv, dav), _mm512_cvtepi32_ps(I[i][v]), acc[i][v]);                  \
                    acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(mwv, dav), _mm512_set1_ps(a->Sf[(size_t)(m0 + i) * G + g]), acc[i][v]); \
                }                                                                                                                  \
            }                                                                                                                      \
        }                                                                                                                          \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + (size_t)(m0 + i) * ldo + (pn0 + v) * 16, acc[i][v]); \
    }
TILE_KERNEL(8, 1)
TILE_KERNEL(4, 2)
TILE_KERNEL(6, 2)
TILE_KERNEL(2, 2)
TILE_KERNEL(1, 1)
TILE_KERNEL(1, 2)
TILE_KERNEL(12, 1)

typedef void (*tile_fn)(const pack_t *, const actq_t *, int, int, float *, int);
static void tile_run(const pack_t *p, const actq_t *a, int M, float *out, int variant, int nth) {
    int NP = p->N / 16;
    int NV = variant == 0 || variant == 3 ? 1 : 2, MR = variant == 0 ? 8 : variant == 1 ? 4 : variant == 2 ? 6 : 12;
    tile_fn f = variant == 0 ? tile_8x1 : variant == 1 ? tile_4x2 : variant == 2 ? tile_6x2 : tile_12x1;
    tile_fn tail = NV == 1 ? tile_1x1 : tile_1x2;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int pn = 0; pn < NP; pn += NV) {
        int m = 0;
        for (; m + MR <= M; m += MR) f(p, a, m, pn, out, p->N);
        for (; m < M; m++) tail(p, a, m, pn, out, p->N);
    }
}


/* ---------------- Q4_K nibble panel: one kernel for decode and prefill ----------------
 * Repacked once at load: per 16-row panel and super-block, a 2368-byte record
 * (GGUF: 16*144 = 2304): d[16] fp16, dmin[16] fp16, sc[8][16] u8, m[8][16] u8,
 * then per group g four zmm of nibbles: zmm q, lane n, byte i: low nibble
 * w[n][32g+8q+i], high nibble w[n][32g+8q+4+i].  Lanes run over n, so there
 * is no horizontal reduction; M=1 is the same micro-kernel as M=512. */
#define NREC 2368
typedef struct { int N, K; uint8_t *p; } npack_t;
static npack_t npack_q4k(const uint8_t *W, size_t rb, int N, int K) {
    int NB = K / 256;
    npack_t P = {N, K, amalloc((size_t)N / 16 * NB * NREC)};
    memset(P.p, 0, (size_t)N / 16 * NB * NREC);
    for (int n = 0; n < N; n++) {
        int pn = n / 16, ln = n % 16;
        for (int b = 0; b < NB; b++) {
            const uint8_t *blk = W + (size_t)n * rb + b * Q4K_BYTES;
            uint8_t *rec = P.p + ((size_t)pn * NB + b) * NREC;
            memcpy(rec + 2 * ln, blk, 2); memcpy(rec + 32 + 2 * ln, blk + 2, 2);
            for (int gg = 0; gg < 8; gg++) {
                int sc, m; gsm(gg, blk + 4, &sc, &m);
                rec[64 + gg * 16 + ln] = (uint8_t)sc; rec[192 + gg * 16 + ln] = (uint8_t)m;
                for (int k = 0; k < 32; k++) {
                    uint8_t byte = blk[16 + 32 * (gg / 2) + k];
                    uint8_t q = (gg & 1) ? byte >> 4 : byte & 15;
                    int qq = k / 8, hi = (k % 8) / 4, i = k % 4;
                    rec[320 + gg * 256 + qq * 64 + ln * 4 + i] |= (uint8_t)(q << (4 * hi));
                }
            }
        }
    }
    return P;
}

#define NTILE(MR, NV)                                                                                                              \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"))) static void ntile_##MR##x##NV(                        \
        const npack_t *P, const actq_t *a, int m0, int pn0, float *out, int ldo) {                                                 \
        int K = P->K, NB = K / 256, G = K / 32;                                                                                    \
        const __m512i m4 = _mm512_set1_epi8(15);                                                                                   \
        __m512 acc[MR][NV];                                                                                                        \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps(); \
        for (int b = 0; b < NB; b++) {                                                                                             \
            const uint8_t *rec[NV]; __m512 d[NV], ndm[NV];                                                                         \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) {                                                                \
                rec[v] = P->p + ((size_t)(pn0 + v) * NB + b) * NREC;                                                               \
                if (g_npfd) for (int l = 0; l < NREC; l += 64) _mm_prefetch((const char *)rec[v] + g_npfd + l, _MM_HINT_T0);        \
                d[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec[v]));                                               \
                ndm[v] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec[v] + 32))));  \
            }                                                                                                                      \
            for (int gg = 0; gg < 8; gg++) {                                                                                       \
                int g = b * 8 + gg;                                                                                                \
                __m512i I[MR][NV];                                                                                                 \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) I[i][v] = _mm512_setzero_si512(); \
                _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                                                              \
                    __m512i lo[NV], hi[NV];                                                                                        \
                    _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) {                                                        \
                        __m512i z = _mm512_loadu_si512(rec[v] + 320 + gg * 256 + q * 64);                                          \
                        lo[v] = _mm512_and_si512(z, m4); hi[v] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);                    \
                    }                                                                                                              \
                    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                        \
                        const int8_t *qp = a->qa + (size_t)(m0 + i) * K + 32 * g + 8 * q;                                          \
                        int32_t a0, a1; memcpy(&a0, qp, 4); memcpy(&a1, qp + 4, 4);                                                \
                        __m512i b0 = _mm512_set1_epi32(a0), b1 = _mm512_set1_epi32(a1);                                            \
                        _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) {                                                    \
                            I[i][v] = _mm512_dpbusd_epi32(I[i][v], lo[v], b0); I[i][v] = _mm512_dpbusd_epi32(I[i][v], hi[v], b1);  \
                        }                                                                                                          \
                    }                                                                                                              \
                }                                                                                                                  \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) {                                                            \
                    __m512 swv = _mm512_mul_ps(d[v], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec[v] + 64 + gg * 16))))); \
                    __m512 mwv = _mm512_mul_ps(ndm[v], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec[v] + 192 + gg * 16))))); \
                    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                        \
                        __m512 dav = _mm512_set1_ps(a->da[(size_t)(m0 + i) * G + g]);                                              \
                        acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(swv, dav), _mm512_cvtepi32_ps(I[i][v]), acc[i][v]);              \
                        acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(mwv, dav), _mm512_set1_ps(a->Sf[(size_t)(m0 + i) * G + g]), acc[i][v]); \
                    }                                                                                                              \
                }                                                                                                                  \
            }                                                                                                                      \
        }                                                                                                                          \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + (size_t)(m0 + i) * ldo + (pn0 + v) * 16, acc[i][v]); \
    }
NTILE(1, 4) NTILE(2, 4) NTILE(1, 1) NTILE(2, 1) NTILE(3, 1) NTILE(1, 2) NTILE(2, 2) NTILE(3, 2) NTILE(4, 2) NTILE(6, 2) NTILE(8, 1)
static void ntile_run(const npack_t *P, const actq_t *a, int M, float *out, int nv, int mr, int nth) {
    tile_fn f; /* same signature as tile_fn but npack_t: cast through void* */
    typedef void (*nf)(const npack_t *, const actq_t *, int, int, float *, int);
    nf fn = NULL, t1 = nv == 1 ? ntile_1x1 : nv == 2 ? ntile_1x2 : ntile_1x4;
    (void)f;
    if (nv == 1) fn = mr == 1 ? ntile_1x1 : mr == 2 ? ntile_2x1 : mr == 3 ? ntile_3x1 : ntile_8x1;
    else if (nv == 4) fn = mr == 1 ? ntile_1x4 : ntile_2x4;
    else fn = mr == 1 ? ntile_1x2 : mr == 2 ? ntile_2x2 : mr == 3 ? ntile_3x2 : mr == 4 ? ntile_4x2 : ntile_6x2;
    int NP = P->N / 16;
    if (nth == 1) {
        for (int pn = 0; pn < NP; pn += nv) { int m = 0; for (; m + mr <= M; m += mr) fn(P, a, m, pn, out, P->N); for (; m < M; m++) t1(P, a, m, pn, out, P->N); }
        return;
    }
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int pn = 0; pn < NP; pn += nv) { int m = 0; for (; m + mr <= M; m += mr) fn(P, a, m, pn, out, P->N); for (; m < M; m++) t1(P, a, m, pn, out, P->N); }
}


/* prefill packing from the nibble panel: u8 panel [G][8][16][4] + fp32 sw/mw (vectorized) */
__attribute__((target("avx512f,avx512bw,avx512vl,f16c")))
static void unpack_npack(const npack_t *P, pack_t *out) {
    int N = P->N, K = P->K, NB = K / 256, G = K / 32;
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int pn = 0; pn < N / 16; pn++)
        for (int b = 0; b < NB; b++) {
            const uint8_t *rec = P->p + ((size_t)pn * NB + b) * NREC;
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
            __m512 ndm = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32))));
            for (int gg = 0; gg < 8; gg++) {
                int g = b * 8 + gg;
                uint8_t *dst = out->q + ((size_t)pn * G + g) * 512;
                for (int q = 0; q < 4; q++) {
                    __m512i z = _mm512_loadu_si512(rec + 320 + gg * 256 + q * 64);
                    _mm512_store_si512(dst + (2 * q) * 64, _mm512_and_si512(z, m4));
                    _mm512_store_si512(dst + (2 * q + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
                }
                _mm512_store_ps(out->sw + ((size_t)pn * G + g) * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + 64 + gg * 16))))));
                _mm512_store_ps(out->mw + ((size_t)pn * G + g) * 16, _mm512_mul_ps(ndm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + 192 + gg * 16))))));
            }
        }
}

static int cmd_ndecode(int N, int K, double cold_mb) {
    size_t rb = (size_t)K / 256 * Q4K_BYTES, mb = rb * N;
    int nmat = (int)(cold_mb * 1e6 / mb) + 1;
    npack_t *Ps = malloc(sizeof(*Ps) * nmat);
    uint8_t *W = amalloc(mb);
    for (int i = 0; i < nmat; i++) { gen_blocks(W, mb, 0); Ps[i] = npack_q4k(W, rb, N, K); }
    size_t pbytes = (size_t)N / 16 * (K / 256) * NREC;
    int M = 8;
    float *x = amalloc((size_t)M * K * 4), *out = amalloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)rnorm();
    actq_t a = act_alloc(M, K);
    for (int m = 0; m < M; m++) quant_zmm(x + (size_t)m * K, K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32);
    printf("Q4_K nibble panel N=%d K=%d: %.2f MB/matrix (GGUF %.2f MB), cold set %d = %.0f MB; GB/s of GGUF-equivalent bytes\n", N, K, pbytes / 1e6, mb / 1e6, nmat, nmat * pbytes / 1e6);
    for (int m = 1; m <= 3; m++)
        for (int nv = 1; nv <= 4; nv *= 2)
            for (int nth = 1; nth <= 2 && !(nv == 4 && m == 3); nth++) {
                double bh = 1e9, bc = 1e9;
                for (int rep = 0; rep < 5; rep++) {
                    ntile_run(&Ps[0], &a, m, out, nv, m, nth);
                    double t0 = now();
                    for (int i = 0; i < 40; i++) ntile_run(&Ps[0], &a, m, out, nv, m, nth);
                    double t = (now() - t0) / 40; if (t < bh) bh = t;
                    t0 = now();
                    for (int i = 0; i < nmat; i++) ntile_run(&Ps[i], &a, m, out, nv, m, nth);
                    t = (now() - t0) / nmat; if (t < bc) bc = t;
                }
                printf("  M=%d MRxNR %dx%-2d threads=%d  hot %6.1f GB/s (%5.0f us)   cold %6.1f GB/s (%5.0f us)\n", m, m, 16 * nv, nth, mb / bh / 1e9, bh * 1e6, mb / bc / 1e9, bc * 1e6);
            }
    return 0;
}

static int cmd_ntile(int N, int M, int K, int nth) {
    size_t rb = (size_t)K / 256 * Q4K_BYTES;
    uint8_t *W = amalloc(rb * N);
    gen_blocks(W, rb * N, 0);
    npack_t P = npack_q4k(W, rb, N, K);
    float *x = amalloc((size_t)M * K * 4), *out = amalloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)rnorm();
    actq_t a = act_alloc(M, K);
    for (int m = 0; m < M; m++) quant_zmm(x + (size_t)m * K, K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32);
    printf("Q4_K nibble-panel tile M=%d N=%d K=%d threads=%d (nibbles unpacked in the micro-kernel)\n", M, N, K, nth);
    {
        pack_t U = {N, K, amalloc((size_t)N * K), amalloc((size_t)N * K / 32 * 4), amalloc((size_t)N * K / 32 * 4)};
        double bu = 1e9, bt = 1e9;
        for (int rep = 0; rep < 5; rep++) { double s0 = now(); unpack_npack(&P, &U); double t = now() - s0; if (t < bu) bu = t; }
        float *o2 = amalloc((size_t)M * N * 4);
        for (int rep = 0; rep < 5; rep++) { double s0 = now(); tile_run(&U, &a, M, o2, 1, nth); double t = now() - s0; if (t < bt) bt = t; }
        ntile_run(&P, &a, M, out, 2, 6, nth);
        printf("  unpack nibble panel -> u8 panel + fp32 scales: %.2f ms (1 thread); u8 tile 4x32: %.2f ms = %.1f GFLOP/s-equiv; unpack+tile %.1f GFLOP/s-equiv; bits == nibble kernel: %s\n",
               bu * 1e3, bt * 1e3, 2.0 * M * N * K / bt / 1e9, 2.0 * M * N * K / (bt + bu) / 1e9, memcmp(o2, out, (size_t)M * N * 4) ? "NO" : "YES");
    }
    int cfg[4][2] = {{8, 1}, {4, 2}, {6, 2}, {3, 2}};
    for (int c = 0; c < 4; c++) {
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) { double s = now(); ntile_run(&P, &a, M, out, cfg[c][1], cfg[c][0], nth); double t = now() - s; if (t < best) best = t; }
        printf("  MRxNR %dx%-2d %7.1f GFLOP/s-equiv (%.2f ms)\n", cfg[c][0], 16 * cfg[c][1], 2.0 * M * N * K / best / 1e9, best * 1e3);
    }
    return 0;
}


/* ---------------- Q6_K tile (prefill): u8 panel with 16-element groups ----------------
 * Panel per 16 rows: [G16][4][16][4] bytes of q (0..63) + sw[G16][16]; epilogue per
 * 16-group: I - 32*S16, then acc = fma(sw*da, (float)I, acc) -- the GEMV's chain. */
static pack_t pack_q6k(const uint8_t *W, size_t rb, int N, int K) {
    int G = K / 16;
    pack_t p = {N, K, amalloc((size_t)N * K), amalloc((size_t)N * G * 4), NULL};
    double *tmp = amalloc((size_t)K * 8);
    for (int n = 0; n < N; n++) {
        const uint8_t *row = W + (size_t)n * rb;
        int pn = n / 16, ln = n % 16;
        for (int b = 0; b < K / 256; b++) {
            const uint8_t *blk = row + b * Q6K_BYTES;
            uint16_t hd; memcpy(&hd, blk + 208, 2);
            float d = h2f(hd);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                for (int l = 0; l < 32; l++) {
                    int q[4] = {(ql[l] & 15) | ((qh[l] & 3) << 4), (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4), (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)};
                    for (int t = 0; t < 4; t++) {
                        int k = b * 256 + 128 * h + 32 * t + l, g = k / 16, kk = k % 16;
                        p.q[(((size_t)pn * G + g) * 4 + kk / 4) * 64 + ln * 4 + kk % 4] = (uint8_t)q[t];
                    }
                }
            }
            for (int i = 0; i < 16; i++) p.sw[((size_t)pn * G + b * 16 + i) * 16 + ln] = d * (float)(int8_t)blk[192 + i];
        }
    }
    free(tmp);
    return p;
}
#define TILE6_KERNEL(MR, NV)                                                                                                       \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) static void tile6_##MR##x##NV(                            \
        const pack_t *p, const actq_t *a, int m0, int pn0, float *out, int ldo) {                                                  \
        int K = p->K, G = K / 16;                                                                                                  \
        __m512 acc[MR][NV];                                                                                                        \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps(); \
        for (int g = 0; g < G; g++) {                                                                                              \
            __m512i I[MR][NV];                                                                                                     \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) I[i][v] = _mm512_setzero_si512(); \
            _Pragma("GCC unroll 4") for (int kk = 0; kk < 4; kk++) {                                                               \
                __m512i w[NV];                                                                                                     \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) w[v] = _mm512_load_si512(p->q + ((size_t)(pn0 + v) * G + g) * 256 + kk * 64); \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                            \
                    int32_t av; memcpy(&av, a->qa + (size_t)(m0 + i) * K + 16 * g + 4 * kk, 4);                                    \
                    __m512i ab = _mm512_set1_epi32(av);                                                                            \
                    _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) I[i][v] = _mm512_dpbusd_epi32(I[i][v], w[v], ab);        \
                }                                                                                                                  \
            }                                                                                                                      \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) {                                                                \
                __m512 swv = _mm512_load_ps(p->sw + ((size_t)(pn0 + v) * G + g) * 16);                                            \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                            \
                    __m512 dav = _mm512_set1_ps(a->da[(size_t)(m0 + i) * (K / 32) + g / 2]);                                       \
                    __m512i Ic = _mm512_sub_epi32(I[i][v], _mm512_set1_epi32(32 * a->S16[(size_t)(m0 + i) * G + g]));              \
                    acc[i][v] = _mm512_fmadd_ps(_mm512_mul_ps(swv, dav), _mm512_cvtepi32_ps(Ic), acc[i][v]);                       \
                }                                                                                                                  \
            }                                                                                                                      \
        }                                                                                                                          \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + (size_t)(m0 + i) * ldo + (pn0 + v) * 16, acc[i][v]); \
    }
TILE6_KERNEL(4, 2) TILE6_KERNEL(6, 2) TILE6_KERNEL(1, 2)
static void tile6_run(const pack_t *p, const actq_t *a, int M, float *out, int mr, int nth) {
    tile_fn f = mr == 4 ? tile6_4x2 : tile6_6x2;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int pn = 0; pn < p->N / 16; pn += 2) {
        int m = 0;
        for (; m + mr <= M; m += mr) f(p, a, m, pn, out, p->N);
        for (; m < M; m++) tile6_1x2(p, a, m, pn, out, p->N);
    }
}
static int cmd_tile6(int N, int M, int K, int nth) {
    size_t rb = (size_t)K / 256 * Q6K_BYTES;
    uint8_t *W = amalloc(rb * N);
    gen_blocks(W, rb * N, 1);
    pack_t p = pack_q6k(W, rb, N, K);
    float *x = amalloc((size_t)M * K * 4), *out = amalloc((size_t)M * N * 4), *o1 = amalloc((size_t)N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)rnorm();
    actq_t a = act_alloc(M, K);
    for (int m = 0; m < M; m++) quant_zmm(x + (size_t)m * K, K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32);
    int same = 1;
    tile6_run(&p, &a, M, out, 6, nth);
    for (int m = 0; m < M; m += 37) { /* spot rows: tile == Q6_K GEMV bits */
        actq_t am = {K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32};
        gemv_q6k_zmm(W, rb, K, &am, o1, 0, N);
        if (memcmp(o1, out + (size_t)m * N, N * 4)) same = 0;
    }
    printf("Q6_K tile M=%d N=%d K=%d threads=%d (16-element groups; bits == Q6_K GEMV on rows 0,37,..: %s)\n", M, N, K, nth, same ? "YES" : "NO");
    int mrs[2] = {4, 6};
    for (int c = 0; c < 2; c++) {
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) { double s0 = now(); tile6_run(&p, &a, M, out, mrs[c], nth); double t = now() - s0; if (t < best) best = t; }
        printf("  MRxNR %dx32 %7.1f GFLOP/s-equiv (%.2f ms)\n", mrs[c], 2.0 * M * N * K / best / 1e9, best * 1e3);
    }
    return !same;
}

/* ---------------- drivers ---------------- */
static void gemv_run(gemv_fn f, const uint8_t *W, size_t rb, int N, int K, const actq_t *a, float *out, int nth, int rows) {
    if (nth == 1) { f(W, rb, K, a, out, 0, N); return; }
#pragma omp parallel num_threads(nth)
    {
        int t = omp_get_thread_num(), nb = N / rows;
        int b0 = nb * t / nth, b1 = nb * (t + 1) / nth;
        f(W, rb, K, a, out, b0 * rows, b1 * rows);
    }
}

static const char *NAMES[3] = {"avx512vnni-zmm", "avxvnni-ymm", "avx2-maddubs"};
static gemv_fn pick(int q6, int v) {
    if (q6) return v == 0 ? gemv_q6k_zmm : v == 1 ? gemv_q6k_avxvnni : gemv_q6k_avx2;
    return v == 0 ? gemv_q4k_zmm : v == 1 ? gemv_q4k_avxvnni : gemv_q4k_avx2;
}

static void errstats(const char *what, const float *out, const double *ref, const double *scale, int n) {
    double maxrel = 0, maxn = 0, med[1] = {0};
    int cnt = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(out[i] - ref[i]);
        if (fabs(ref[i]) > 1e-3 * scale[i]) { double r = e / fabs(ref[i]); if (r > maxrel) maxrel = r; med[0] += r; cnt++; }
        if (e / scale[i] > maxn) maxn = e / scale[i];
    }
    printf("  %-44s max|err|/|ref| = %.3e (mean %.3e, over |ref|>1e-3*||w||||x||), max|err|/(||w||*||x||) = %.3e\n", what, maxrel, med[0] / cnt, maxn);
}

/* check: float64 references, cross-kernel bit identity, GEMV vs tile */
static int cmd_check(void) {
    int N = 256, K = 2048, M = 24, fail = 0;
    float *x = amalloc((size_t)M * K * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)rnorm();
    if (getenv("OUTLIER")) { /* LLM-like: 1% of channels (fixed k) 30x larger */
        printf("x: N(0,1) with channels k %% 97 == 0 scaled by 30\n");
        for (int m = 0; m < M; m++) for (int k = 0; k < K; k += 97) x[(size_t)m * K + k] *= 30.f;
    }
    actq_t a = act_alloc(M, K), ar = act_alloc(1, K);
    for (int m = 0; m < M; m++) quant_zmm(x + (size_t)m * K, K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32);
    for (int m = 0; m < M; m++) { /* vector quant == scalar quant */
        quant_ref(x + (size_t)m * K, K, ar.qa, ar.da, ar.S16, ar.Sf);
        if (memcmp(ar.qa, a.qa + (size_t)m * K, K) || memcmp(ar.da, a.da + m * K / 32, K / 8) || memcmp(ar.S16, a.S16 + m * K / 16, K / 4)) { printf("quant mismatch row %d\n", m); fail = 1; }
    }
    double *wd = amalloc((size_t)N * K * 8), *ref = amalloc((size_t)N * 8), *refq = amalloc((size_t)N * 8), *scl = amalloc((size_t)N * 8);
    float *o[3], *ot = amalloc((size_t)M * N * 4);
    _Pragma("GCC unroll 16") for (int v = 0; v < 3; v++) o[v] = amalloc((size_t)N * 4);
    _Pragma("GCC unroll 16") for (int q6 = 0; q6 < 2; q6++) {
        size_t rb = (size_t)K / 256 * (q6 ? Q6K_BYTES : Q4K_BYTES);
        uint8_t *W = amalloc(rb * N);
        gen_blocks(W, rb * N, q6);
        for (int n = 0; n < N; n++) (q6 ? deq_q6k : deq_q4k)(W + rb * n, K, wd + (size_t)n * K);
        printf("%s N=%d K=%d, %d activation rows (x ~ N(0,1)):\n", q6 ? "Q6_K" : "Q4_K", N, K, M);
        double worst[2] = {0, 0};
        pack_t p = {0};
        if (!q6) { p = pack_q4k(W, rb, N, K); tile_run(&p, &a, M, ot, 2, 1); }
        int bitsame = 1, tilesame = 1;
        for (int m = 0; m < M; m++) {
            actq_t am = {K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32};
            _Pragma("GCC unroll 16") for (int v = 0; v < 3; v++) pick(q6, v)(W, rb, K, &am, o[v], 0, N);
            for (int n = 0; n < N; n++) {
                double s = 0, sq = 0, ww = 0, xx = 0;
                for (int k = 0; k < K; k++) {
                    double w = wd[(size_t)n * K + k];
                    s += w * x[(size_t)m * K + k];
                    sq += w * (am.qa[k] * (double)am.da[k / 32]);
                    ww += w * w; xx += (double)x[(size_t)m * K + k] * x[(size_t)m * K + k];
                }
                ref[n] = s; refq[n] = sq; scl[n] = sqrt(ww * xx);
            }
            if (m == 0) { errstats("vs float64 W*x (x unquantized), row 0", o[0], ref, scl, N); errstats("vs float64 W*(qa*da) (kernel exactness), row 0", o[0], refq, scl, N); }
            for (int n = 0; n < N; n++) {
                double e1 = fabs(o[0][n] - ref[n]) / scl[n], e2 = fabs(o[0][n] - refq[n]) / scl[n];
                if (e1 > worst[0]) worst[0] = e1;
                if (e2 > worst[1]) worst[1] = e2;
            }
            if (memcmp(o[0], o[1], N * 4) || memcmp(o[0], o[2], N * 4)) bitsame = 0;
            if (!q6 && memcmp(o[0], ot + (size_t)m * N, N * 4)) tilesame = 0;
        }
        printf("  all %d rows: max|err|/(||w|| ||x||) vs unquantized x %.3e, vs quantized x %.3e\n", M, worst[0], worst[1]);
        printf("  GEMV zmm == ymm AVX-VNNI == AVX2 bit-identical: %s\n", bitsame ? "YES" : "NO");
        if (!q6) {
            printf("  tile 6x32 (M=%d) == GEMV zmm bit-identical for every row: %s\n", M, tilesame ? "YES" : "NO");
            _Pragma("GCC unroll 16") for (int var = 0; var < 4; var++) {
                float *o2 = amalloc((size_t)M * N * 4); tile_run(&p, &a, M, o2, var, 2);
                if (memcmp(o2, ot, (size_t)M * N * 4)) { printf("  tile variant %d differs\n", var); fail = 1; }
                free(o2);
            }
            printf("  tile variants 8x16/4x32/6x32/12x16, 2 threads, identical: %s\n", fail ? "NO" : "YES");
            npack_t P = npack_q4k(W, rb, N, K);
            int nsame = 1;
            int cf[6][2] = {{1, 1}, {2, 1}, {3, 2}, {4, 2}, {6, 2}, {8, 1}};
            for (int c = 0; c < 6; c++) {
                float *o2 = amalloc((size_t)M * N * 4); ntile_run(&P, &a, M, o2, cf[c][1], cf[c][0], 1 + (c & 1));
                if (memcmp(o2, ot, (size_t)M * N * 4)) nsame = 0;
                free(o2);
            }
            printf("  nibble-panel kernel MR=1,2,3,4,6,8 == tile == GEMV bit-identical: %s\n", nsame ? "YES" : "NO");
            if (!nsame) fail = 1;
        }
        if (!bitsame || (!q6 && !tilesame) || worst[1] > 1e-5) fail = 1;
        free(W);
    }
    printf(fail ? "CHECK FAILED\n" : "CHECK OK\n");
    return fail;
}

static int cmd_dump(const char *path, int q6) { /* blocks + our dequant, for the python cross-check vs gguf.quants */
    int N = 64, K = 512;
    size_t rb = (size_t)K / 256 * (q6 ? Q6K_BYTES : Q4K_BYTES);
    uint8_t *W = amalloc(rb * N); double *wd = amalloc((size_t)N * K * 8);
    gen_blocks(W, rb * N, q6);
    for (int n = 0; n < N; n++) (q6 ? deq_q6k : deq_q4k)(W + rb * n, K, wd + (size_t)n * K);
    FILE *f = fopen(path, "wb"); fwrite(W, 1, rb * N, f); fwrite(wd, 8, (size_t)N * K, f); fclose(f);
    return 0;
}

static int cmd_quant(void) {
    int K = 2048, M = 512;
    float *x = amalloc((size_t)M * K * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)rnorm();
    actq_t a = act_alloc(M, K);
    _Pragma("GCC unroll 16") for (int pass = 0; pass < 2; pass++) {
        int rows = pass ? M : 1;
        double best = 1e9;
        _Pragma("GCC unroll 16") for (int rep = 0; rep < 7; rep++) {
            int it = pass ? 5 : 2000;
            double t0 = now();
            for (int r = 0; r < it; r++)
                for (int m = 0; m < rows; m++) quant_zmm(x + (size_t)m * K, K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32);
            double t = (now() - t0) / it;
            if (t < best) best = t;
        }
        printf("quant AVX-512, %d x %d: %.0f ns/call, %.3f ns/element (1 thread)\n", rows, K, best * 1e9, best * 1e9 / rows / K);
    }
    return 0;
}

static int cmd_gemv(int N, int K, int q6, double cold_mb) {
    size_t rb = (size_t)K / 256 * (q6 ? Q6K_BYTES : Q4K_BYTES), mb = rb * N;
    int nmat = (int)(cold_mb * 1e6 / mb) + 1;
    uint8_t **Ws = malloc(sizeof(*Ws) * nmat);
    for (int i = 0; i < nmat; i++) { Ws[i] = amalloc(mb); gen_blocks(Ws[i], mb, q6); }
    float *x = amalloc((size_t)K * 4), *out = amalloc((size_t)N * 4);
    for (int k = 0; k < K; k++) x[k] = (float)rnorm();
    actq_t a = act_alloc(1, K);
    quant_zmm(x, K, a.qa, a.da, a.S16, a.Sf);
    printf("%s N=%d K=%d: %.2f MB/matrix, cold set %d matrices = %.0f MB\n", q6 ? "Q6_K" : "Q4_K", N, K, mb / 1e6, nmat, nmat * mb / 1e6);
    const char *vm = getenv("V");
    _Pragma("GCC unroll 16") for (int v = 0; v < 3; v++) {
        if (vm && !strchr(vm, '0' + v)) continue;
        gemv_fn f = pick(q6, v);
        int rows = v == 0 ? 16 : 8;
        const char *tm = getenv("T");
        for (int nth = 1; nth <= 2; nth++) {
            if (tm && atoi(tm) != nth) continue;
            double bh = 1e9, bc = 1e9;
            int hot = 40;
            _Pragma("GCC unroll 16") for (int rep = 0; rep < 5; rep++) {
                gemv_run(f, Ws[0], rb, N, K, &a, out, nth, rows);
                double t0 = now();
                for (int i = 0; i < hot; i++) gemv_run(f, Ws[0], rb, N, K, &a, out, nth, rows);
                double t = (now() - t0) / hot;
                if (t < bh) bh = t;
                t0 = now();
                for (int i = 0; i < nmat; i++) gemv_run(f, Ws[i], rb, N, K, &a, out, nth, rows);
                t = (now() - t0) / nmat;
                if (t < bc) bc = t;
            }
            printf("  %-15s threads=%d  hot %6.1f GB/s (%5.0f us)   cold %6.1f GB/s (%5.0f us)\n", NAMES[v], nth, mb / bh / 1e9, bh * 1e6, mb / bc / 1e9, bc * 1e6);
        }
    }
    return 0;
}

static int cmd_tile(int N, int M, int K, int nth) {
    size_t rb = (size_t)K / 256 * Q4K_BYTES;
    uint8_t *W = amalloc(rb * N);
    gen_blocks(W, rb * N, 0);
    double t0 = now();
    pack_t p = pack_q4k(W, rb, N, K);
    double tp = now() - t0;
    float *x = amalloc((size_t)M * K * 4), *out = amalloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)rnorm();
    actq_t a = act_alloc(M, K);
    t0 = now();
    for (int m = 0; m < M; m++) quant_zmm(x + (size_t)m * K, K, a.qa + (size_t)m * K, a.da + m * K / 32, a.S16 + m * K / 16, a.Sf + m * K / 32);
    double tq = now() - t0;
    printf("Q4_K tile M=%d N=%d K=%d threads=%d (scalar prototype pack %.1f ms, act quant %.2f ms)\n", M, N, K, nth, tp * 1e3, tq * 1e3);
    const char *vn[4] = {"8x16", "4x32", "6x32", "12x16"};
    _Pragma("GCC unroll 16") for (int var = 0; var < 4; var++) {
        double best = 1e9;
        _Pragma("GCC unroll 16") for (int rep = 0; rep < 5; rep++) {
            double s = now();
            tile_run(&p, &a, M, out, var, nth);
            double t = now() - s;
            if (t < best) best = t;
        }
        printf("  MRxNR %-5s %7.1f GFLOP/s-equiv (%.2f ms)\n", vn[var], 2.0 * M * N * K / best / 1e9, best * 1e3);
    }
    return 0;
}

/* read-bandwidth ceiling over the same cold set: linear zmm loads, and the GEMV's
 * access order (16 rows interleaved, 64 B per row per step) without compute. */
__attribute__((target("avx512f")))
static int cmd_bw(double mbtot, size_t rb) {
    size_t mb = rb * 8192; int nmat = (int)(mbtot * 1e6 / mb) + 1;
    uint8_t **Ws = malloc(sizeof(*Ws) * nmat);
    for (int i = 0; i < nmat; i++) { Ws[i] = amalloc(mb); memset(Ws[i], i, mb); }
    for (int nth = 1; nth <= 2; nth++)
    for (int pat = 0; pat < 2; pat++) {
        double best = 1e9; __m512i s = _mm512_setzero_si512();
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now();
            for (int i = 0; i < nmat; i++) {
                const uint8_t *W = Ws[i];
                __m512i acc = _mm512_setzero_si512();
#pragma omp parallel num_threads(nth)
                {
                    int t = omp_get_thread_num();
                    size_t n0 = 8192 / nth * t, n1 = 8192 / nth * (t + 1);
                    __m512i a = _mm512_setzero_si512();
                    if (!pat) for (size_t o = n0 * rb; o < n1 * rb; o += 64) a = _mm512_xor_si512(a, _mm512_load_si512(W + o));
                    else for (size_t n = n0; n < n1; n += 16) for (size_t c = 0; c < rb; c += 64) for (int r = 0; r < 16; r++) a = _mm512_xor_si512(a, _mm512_loadu_si512(W + (n + r) * rb + c));
#pragma omp critical
                    acc = _mm512_xor_si512(acc, a);
                }
                s = _mm512_xor_si512(s, acc);
            }
            double t = now() - t0; if (t < best) best = t;
        }
        printf("read %s threads=%d: %.1f GB/s (%lld)\n", pat ? "16-row interleaved" : "linear", nth, nmat * mb / best / 1e9, (long long)_mm512_reduce_add_epi64(s) & 1);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (getenv("PF")) g_pfd = (size_t)atol(getenv("PF"));
    if (getenv("NPF")) g_npfd = (size_t)atol(getenv("NPF"));
    if (argc < 2) { fprintf(stderr, "usage: check | quant | dump path q6 | gemv N K q4k|q6k [coldMB] | tile N [M K threads]\n"); return 2; }
    if (!strcmp(argv[1], "check")) return cmd_check();
    if (!strcmp(argv[1], "bw")) return cmd_bw(650, 1152);
    if (!strcmp(argv[1], "tile6")) return cmd_tile6(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 512, argc > 4 ? atoi(argv[4]) : 2048, argc > 5 ? atoi(argv[5]) : 1);
    if (!strcmp(argv[1], "ndecode")) return cmd_ndecode(atoi(argv[2]), atoi(argv[3]), argc > 4 ? atof(argv[4]) : 650);
    if (!strcmp(argv[1], "ntile")) return cmd_ntile(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 512, argc > 4 ? atoi(argv[4]) : 2048, argc > 5 ? atoi(argv[5]) : 1);
    if (!strcmp(argv[1], "quant")) return cmd_quant();
    if (!strcmp(argv[1], "dump")) return cmd_dump(argv[2], atoi(argv[3]));
    if (!strcmp(argv[1], "gemv")) return cmd_gemv(atoi(argv[2]), atoi(argv[3]), !strcmp(argv[4], "q6k"), argc > 5 ? atof(argv[5]) : 650);
    if (!strcmp(argv[1], "tile")) return cmd_tile(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 512, argc > 4 ? atoi(argv[4]) : 2048, argc > 5 ? atoi(argv[5]) : 1);
    return 2;
}
