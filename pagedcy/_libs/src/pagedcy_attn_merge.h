/* Log-sum-exp merge of partial attention states: the KV splits of the
 * paged-attention kernel, and merge_states.
 */
#ifndef PAGEDCY_ATTN_MERGE_H
#define PAGEDCY_ATTN_MERGE_H

#include "pagedcy_attn_types.h"

/* Merge k partial states of one (row, head): out = sum_i w_i v_i / sum_i w_i
 * with w_i = exp(s_i - max s); all-empty (-inf) states give 0 and -inf. */
static inline void pagedcy_merge_one(int k, const float *const *v, const float *s, int D,
                                     float *out, float *s_out) {
    float mx = -INFINITY;
    for (int i = 0; i < k; i++) if (s[i] > mx) mx = s[i];
    if (mx == -INFINITY) {
        for (int d = 0; d < D; d++) out[d] = 0.0f;
        *s_out = -INFINITY;
        return;
    }
    float w[64];
    float tot = 0.0f;
    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int i0 = 0; i0 < k; i0 += 64) {
        int n = k - i0 < 64 ? k - i0 : 64;
        for (int i = 0; i < n; i++) { w[i] = expf(s[i0 + i] - mx); tot += w[i]; }
        for (int i = 0; i < n; i++) {
            if (w[i] == 0.0f) continue;    /* an empty partial may hold anything */
            const float *vi = v[i0 + i];
            for (int d = 0; d < D; d++) out[d] += w[i] * vi[d];
        }
    }
    const float inv = 1.0f / tot;
    for (int d = 0; d < D; d++) out[d] *= inv;
    *s_out = mx + logf(tot);
}

/* Combine the splits of one group into the final output rows. */
static inline int pagedcy_attn_merge_group(const pagedcy_attn_params *P, const pagedcy_attn_group *g,
                                           const float *part_o, const float *part_lse) {
    const int G = P->H / P->Hkv, D = P->D, M = g->nr * G, ns = g->nsplit;
    const float *vstack[256];
    float sstack[256];
    const float **vp = vstack;
    float *sp = sstack;
    if (ns > 256) {
        vp = (const float **)malloc(sizeof(float *) * ns);
        sp = (float *)malloc(sizeof(float) * ns);
        if (!vp || !sp) { free(vp); free(sp); return -1; }
    }
    const int64_t q_start = P->qo_indptr[g->b];
    const int64_t stride_o = (int64_t)g->ng * M * D, stride_l = (int64_t)g->ng * M;
    for (int gi = 0; gi < g->ng; gi++) {
        for (int v = 0; v < M; v++) {
            for (int s = 0; s < ns; s++) {
                vp[s] = part_o + g->po_off + s * stride_o + ((int64_t)gi * M + v) * D;
                sp[s] = part_lse[g->pl_off + s * stride_l + (int64_t)gi * M + v];
            }
            const int r = v / G, hh = v % G;
            int64_t row = (q_start + g->r0 + r) * P->H + (int64_t)(g->g0 + gi) * G + hh;
            float lse;
            pagedcy_merge_one(ns, vp, sp, D, P->out + row * D, &lse);
            if (P->lse) P->lse[row] = lse;
        }
    }
    if (ns > 256) { free(vp); free(sp); }
    return 0;
}

#endif
