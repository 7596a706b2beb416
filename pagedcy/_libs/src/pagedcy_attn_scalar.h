/* Portable C micro-kernels of the paged-attention kernel: the reference
 * path, and what runs when the CPU lacks AVX2 or the head dimension is not a
 * multiple of 8. Same signatures and data layouts as the AVX2 / AVX-512
 * kernels (scores in the pair layout, queries of packed items as [D][12]),
 * so pagedcy_attn_item.h instantiates one driver for every instruction set.
 * No prefetching here: the cursor arguments are accepted and ignored.
 */
#ifndef PAGEDCY_ATTN_SCALAR_H
#define PAGEDCY_ATTN_SCALAR_H

#include "pagedcy_attn_types.h"

/* One stored value as float (dtype a constant after inlining; int8 unscaled). */
static inline float pa_ld1(const void *base, int64_t i, int dtype) {
    if (dtype == PAGEDCY_F32) return ((const float *)base)[i];
    if (dtype == PAGEDCY_F16) return pagedcy_f16_to_f32(((const uint16_t *)base)[i]);
    if (dtype == PAGEDCY_I8) return (float)((const int8_t *)base)[i];
    return pagedcy_bf16_to_f32(((const uint16_t *)base)[i]);
}

static inline void pa_qk4_scalar_t(const float *q, int D, const void *K, int64_t ks, int tlo, int thi,
                                   float *S, int dtype) {
    for (int t = tlo; t < thi; t++) {
        const int64_t k0 = (int64_t)t * ks;
        for (int r = 0; r < 4; r++) {
            const float *x = q + (int64_t)r * D;
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += x[d] * pa_ld1(K, k0 + d, dtype);
            S[pa_pair_idx(r, t)] = acc;
        }
    }
}

/* Scores of 4 query rows (stride D) against tokens [tlo, thi) of a K slice
 * (token stride ks elements), in the pair layout. */
static void pa_qk4_scalar(const float *q, int D, const void *K, int64_t ks, int tlo, int thi,
                          float *S, int Sld, pa_pfcur *pf, int flags, int dtype, int perm) {
    (void)Sld; (void)pf; (void)flags; (void)perm;
    PA_DISPATCH_DTYPE(dtype, DT, pa_qk4_scalar_t(q, D, K, ks, tlo, thi, S, DT));
}

/* int8 q.k (pagedcy_attn_types.h): scores of 4 quantized query vectors (q8
 * rows of D, scales qs) against virtual tokens [v0, v1) of npg pages in
 * token-major order (token v is row v / npg of page v % npg, rows rs bytes
 * apart; npg 1: one page) or, tpp > 0, page after page (pa_vtok_init), in
 * the pair layout, times the q and K scales. */
static void pa_qk4_i8_scalar(const int8_t *q8, const float *qs, const int32_t *qsum, int D,
                             const char *const *K, int npg, int64_t rs, int tpp, int v0, int v1, float *S,
                             pa_pfcur *pf, int flags) {
    (void)qsum; (void)pf; (void)flags;
    for (int v = v0; v < v1; v++) {
        int j;
        int64_t row;
        pa_vtok_init(v, npg, tpp, rs, &j, &row);
        const int8_t *k = (const int8_t *)(K[j] + row);
        for (int r = 0; r < 4; r++) {
            int32_t acc = 0;
            for (int d = 0; d < D; d++) acc += (int32_t)q8[(int64_t)r * D + d] * k[d];
            S[pa_pair_idx(r, v)] = qs[r] * pagedcy_i8_scale(k, (size_t)D) * (float)acc;
        }
    }
}

static inline int pa_qk_i8_ok_scalar(int D) { (void)D; return 1; }

/* int8 P.V of the int8 q.k path, pa_pv4_i8_avx2's contract and numerics:
 * per chunk of up to 64 virtual tokens, p' = p * v_scale(t) quantized per
 * row to q = nearbyint(p' * (32767 / max p')), exact int32 sums of q * v8,
 * O[r] = O[r] * alpha[r] (first chunk) + (max p' / 32767) * sum. */
static inline int pa_pv_i8_ok_scalar(int flags) { (void)flags; return 1; }
static void pa_pv4_i8_scalar(float *O, int D, const float *alpha, float *S, const char *const *V,
                             int npg, int64_t rs, int tpp, int v0, int v1, pa_pfcur *pf, int flags) {
    (void)pf; (void)flags;
    int16_t Q[64 * 4];
    for (int c0 = v0; c0 < v1; c0 += 64) {
        const int c1 = c0 + 64 < v1 ? c0 + 64 : v1;
        for (int r = 0; r < 4; r++) {
            float mx = 0.0f;
            for (int v = c0; v < c1; v++) {
                int j;
                int64_t off;
                pa_vtok_init(v, npg, tpp, rs, &j, &off);
                const char *row = V[j] + off;
                float *p = S + pa_pair_idx(r, v);
                *p *= pagedcy_i8_scale(row, (size_t)D);
                mx = *p > mx ? *p : mx;
            }
            const float inv = mx > 0.0f ? 32767.0f / mx : 0.0f, ps = mx * (1.0f / 32767.0f);
            for (int v = c0; v < c1; v++) Q[(v - c0) * 4 + r] = (int16_t)nearbyintf(S[pa_pair_idx(r, v)] * inv);
            float *o = O + (int64_t)r * D;
            const float a = c0 == v0 ? alpha[r] : 1.0f;
            for (int d = 0; d < D; d++) {
                int32_t acc = 0;
                for (int v = c0; v < c1; v++) {
                    int j;
                    int64_t off;
                    pa_vtok_init(v, npg, tpp, rs, &j, &off);
                    const int8_t *row = (const int8_t *)(V[j] + off);
                    acc += (int32_t)Q[(v - c0) * 4 + r] * row[d];
                }
                o[d] = fmaf(ps, (float)acc, o[d] * a);
            }
        }
    }
}
#define pa_quantize_q8_scalar pa_quantize_q8

static inline void pa_pv4_scalar_t(float *O, int D, const float *alpha, const float *P,
                                   const void *V, int64_t vs, int tlo, int thi, int dtype) {
    for (int r = 0; r < 4; r++) {
        float *o = O + (int64_t)r * D;
        for (int d = 0; d < D; d++) o[d] *= alpha[r];
        for (int t = tlo; t < thi; t++) {
            const float w = P[pa_pair_idx(r, t)];
            const int64_t v0 = (int64_t)t * vs;
            for (int d = 0; d < D; d++) o[d] += w * pa_ld1(V, v0 + d, dtype);
        }
    }
}

/* O[r] = O[r]*alpha[r] + sum_{t in [tlo, thi)} P[r][t] V[t] for 4 rows, P in
 * the pair layout. */
static void pa_pv4_scalar(float *O, int D, const float *alpha, const float *P, int Sld,
                          const void *V, int64_t vs, int tlo, int thi,
                          pa_pfcur *pf, int flags, int dtype, int perm) {
    (void)Sld; (void)pf; (void)flags; (void)perm;
    PA_DISPATCH_DTYPE(dtype, DT, pa_pv4_scalar_t(O, D, alpha, P, V, vs, tlo, thi, DT));
}


/* Several whole pages per step: page after page here (the helpers live in
 * pagedcy_attn_item.h); only the AVX-512 kernels read them token-major. */
#define pa_super_token_major_scalar(dtype) ((void)(dtype), 0)
#define pa_qk4v_scalar pa_qk4v_pages_scalar
#define pa_pv4v_scalar pa_pv4v_pages_scalar
/* Online-softmax step of a 4-row block over token pairs [jb, je), the
 * contract of pa_softmax4_avx2: soft cap, ALiBi, mask outside [vlo, vhi] (an
 * empty range marks an inactive row: p 0, alpha 1, m and l kept), scores
 * replaced by p = exp(s - m_new), rescale factors written to alpha. */
static void pa_softmax4_scalar(float *S, int jb, int je, const int32_t *vlo, const int32_t *vhi,
                               float cap, const float *slope, const float *pos0,
                               float *m, float *l, float *alpha) {
    for (int r = 0; r < 4; r++) {
        float mx = -INFINITY;
        for (int t = 2 * jb; t < 2 * je; t++) {
            float *s = S + pa_pair_idx(r, t);
            float x = *s;
            if (cap > 0.0f) x = cap * tanhf(x / cap);
            if (slope[r] != 0.0f) x += slope[r] * ((float)t + pos0[r]);
            if (t < vlo[r] || t > vhi[r]) x = -INFINITY;
            *s = x;
            if (x > mx) mx = x;
        }
        const float mnew = m[r] > mx ? m[r] : mx;
        float sum = 0.0f;
        for (int t = 2 * jb; t < 2 * je; t++) {
            float *s = S + pa_pair_idx(r, t);
            const float p = *s == -INFINITY ? 0.0f : expf(*s - mnew);
            *s = p;
            sum += p;
        }
        if (vlo[r] > vhi[r]) { alpha[r] = 1.0f; continue; }
        alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mnew;
    }
}

/* Kt[d][t] = K[t][d] as float32 (int8 dequantized) for t < nt, 0 for
 * nt <= t < ncol (rows ldk floats apart). */
static void pa_pack_kt_scalar(float *Kt, int ldk, int ncol, const void *K, int64_t ks, int nt, int D,
                              int dtype) {
    for (int t = 0; t < ncol; t++) {
        const char *row = (const char *)K + (int64_t)t * ks * pa_dtype_bytes(dtype);
        const float s = t < nt && dtype == PAGEDCY_I8 ? pagedcy_i8_scale(row, (size_t)D) : 1.0f;
        for (int d = 0; d < D; d++)
            Kt[(int64_t)d * ldk + t] = t < nt ? pa_ld1(row, d, dtype) * s : 0.0f;
    }
}

static void pa_pack_row_scalar(float *dst, const void *src, int D, int dtype) {
    pagedcy_kv_load(dtype, dst, src, (size_t)D, (size_t)D);
}

/* Scores of 12 query vectors (qt [D][12]) against the 8-token groups of Kt
 * ([D][ldk]) covering [tlo, thi), in the pair layout of blocks S0, S1, S2. */
static void pa_qk12_scalar(const float *qt, int D, const float *Kt, int64_t ldk, int tlo, int thi,
                           float *S0, float *S1, float *S2) {
    float *Sb[3] = {S0, S1, S2};
    const int tend = ((thi + 7) & ~7) < ldk ? ((thi + 7) & ~7) : (int)ldk;
    for (int t = tlo & ~7; t < tend; t++)
        for (int i = 0; i < 12; i++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += qt[(int64_t)d * 12 + i] * Kt[(int64_t)d * ldk + t];
            Sb[i >> 2][pa_pair_idx(i & 3, t)] = acc;
        }
}

/* O[i] = O[i]*alpha[i] + sum_t P[i][t] V[t] for 12 rows (V packed [t][D]). */
static void pa_pv12_scalar(float *O, int D, const float *alpha, const float *S0, const float *S1,
                           const float *S2, const float *V, int tlo, int thi) {
    const float *Sb[3] = {S0, S1, S2};
    for (int i = 0; i < 12; i++) {
        float *o = O + (int64_t)i * D;
        for (int d = 0; d < D; d++) o[d] *= alpha[i];
        for (int t = tlo; t < thi; t++) {
            const float w = Sb[i >> 2][pa_pair_idx(i & 3, t)];
            for (int d = 0; d < D; d++) o[d] += w * V[(int64_t)t * D + d];
        }
    }
}

/* dst = src * scale; `order` (a lane order of the AVX2 bf16 loads) is
 * never set on this path. */
static void pa_scale_copy_scalar(float *dst, const float *src, int n, float scale, int order) {
    (void)order;
    for (int i = 0; i < n; i++) dst[i] = src[i] * scale;
}

/* Whether the decode kernels read bf16 in the permuted lane order: never here. */
static inline int pa_kv_perm_scalar(int dtype, int D, int packed, int flags) {
    (void)dtype; (void)D; (void)packed; (void)flags;
    return 0;
}

#endif
