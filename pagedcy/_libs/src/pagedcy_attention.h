/* Paged attention over the pagedcy page pool (plain C, called from Cython).
 *
 * Pool layout: kv_pages[max_pages, num_layers, 2, page_size, Hkv, D], so one
 * page's K rows for a layer are a contiguous block of page_size token rows of
 * kv_dim = Hkv*D elements and the V rows follow.  All arithmetic is float32.
 *
 * The work is cut into items (sequence, query-row block, run of KV heads, KV
 * token range); an item keeps the running softmax state of all its query
 * vectors and walks its pages once, so every K/V row is read once for all the
 * query heads (and query rows) that use it.  Items that share a query block
 * but cover different KV ranges ("splits") write partial results that are
 * merged by log-sum-exp afterwards, which lets one long sequence use every
 * thread.  Nothing here validates input: the Cython wrapper does, before
 * releasing the GIL.
 */
#ifndef PAGEDCY_ATTENTION_H
#define PAGEDCY_ATTENTION_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "pagedcy_convert.h"
#include "pagedcy_attn_avx2.h"
#include "pagedcy_attn_avx512.h"

typedef struct {
    const float *q;              /* [total_q, H, D] */
    const int64_t *qo_indptr;    /* [B+1] */
    const char *kv;              /* page pool */
    int32_t dtype;               /* PAGEDCY_F32 / F16 / BF16 */
    int64_t page_stride;         /* elements per page (all layers, K and V) */
    int64_t layer_offset;        /* elements from a page's start to this layer's K block */
    const int32_t *block_tables; /* [B, bt_stride] */
    int64_t bt_stride;
    const int64_t *kv_lens;      /* [B] */
    int32_t B, H, Hkv, D, T;
    float scale, soft_cap;       /* soft_cap 0: off */
    int32_t causal, window_left; /* window_left -1: off */
    const float *alibi;          /* [H] or NULL */
    float *out;                  /* [total_q, H, D] */
    float *lse;                  /* [total_q, H] or NULL */
    int32_t use_simd;
    /* Private tuning switches for A/B runs, 0 = defaults: 1 prefetch to L1
     * instead of L2, 2 prefetch the next head's slice instead of the next
     * page's, 4 no K/V packing, 64 no permuted bf16 loads, 8 plain largest-first item order, 16 no
     * prefetch, 32 row-wise prefetch only (no 4 KiB-page stretches), 128/256/512
     * prefill items of 128/32/256 query vectors, 1024 no 3-token score kernel. */
    int32_t flags;
} pagedcy_attn_params;

typedef struct {
    double cost, gcost;          /* own cost; summed cost of its (sequence, KV head) group */
    int32_t b, g0, ng, r0, nr;   /* sequence, KV heads [g0, g0+ng), rows [r0, r0+nr) of its queries */
    int64_t t0, t1;              /* KV tokens [t0, t1); t0 page aligned */
    int64_t po_off, pl_off;      /* partial-output offsets (floats) for splits; -1: final output */
} pagedcy_attn_item;

typedef struct {
    int32_t b, g0, ng, r0, nr, nsplit;
    int64_t po_off, pl_off;      /* of the first split; splits follow contiguously */
} pagedcy_attn_group;

typedef struct {
    pagedcy_attn_item *items;
    pagedcy_attn_group *groups;
    int64_t nitems, ngroups;
    int64_t part_o_floats, part_lse_floats;
    int64_t ws_floats;           /* scratch per thread */
} pagedcy_attn_plan;

/* ---- per-thread scratch ------------------------------------------------ */
typedef struct {
    float *qp, *O, *m, *l, *S, *alpha, *kbuf, *vbuf;
    int64_t *rlo, *rhi;
    int32_t *vlo, *vhi, *blo, *bhi;
    int32_t *vrow, *vhh;         /* query vector -> row, head within group */
} pagedcy_attn_ws;

static inline int64_t pa_al16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* An item with many 4-row blocks per head ("prefill") packs each page's K/V
 * slice (K transposed) and runs the 12-row micro-kernels, so it pads its
 * query vectors to a multiple of 12; otherwise to a multiple of 4. */
static inline int pa_item_packed(int M, int flags) {
    return ((M + 3) & ~3) >= 32 && !(flags & 4);
}
static inline int pa_item_mp(int M, int flags) {
    return pa_item_packed(M, flags) ? (M + 11) / 12 * 12 : (M + 3) & ~3;
}

/* Lays the scratch out in `base` (NULL: only measure); returns its size in floats. */
static inline int64_t pagedcy_attn_ws_layout(pagedcy_attn_ws *W, float *base, int ng, int Mp, int D, int T) {
    const int64_t Sld = (T + 7) & ~7;
    int64_t off = 0;
#define PA_TAKE(field, type, n) do { if (W) W->field = (type *)(base + off); off += pa_al16(n); } while (0)
    PA_TAKE(qp, float, (int64_t)ng * Mp * D);
    PA_TAKE(O, float, (int64_t)ng * Mp * D);
    PA_TAKE(m, float, (int64_t)ng * Mp);
    PA_TAKE(l, float, (int64_t)ng * Mp);
    PA_TAKE(S, float, (int64_t)Mp * Sld);
    PA_TAKE(alpha, float, Mp);
    PA_TAKE(kbuf, float, (int64_t)Sld * D);     /* [T][D], or K^T as [D][Sld] */
    PA_TAKE(vbuf, float, (int64_t)T * D);
    PA_TAKE(rlo, int64_t, 2 * (int64_t)Mp);
    PA_TAKE(rhi, int64_t, 2 * (int64_t)Mp);
    PA_TAKE(vlo, int32_t, Mp);
    PA_TAKE(vhi, int32_t, Mp);
    PA_TAKE(blo, int32_t, Mp);
    PA_TAKE(bhi, int32_t, Mp);
    PA_TAKE(vrow, int32_t, Mp);
    PA_TAKE(vhh, int32_t, Mp);
#undef PA_TAKE
    return off;
}

/* ---- scalar helpers (reference path; also used when D % 8 != 0) -------- */
static void pa_qk4_scalar(const float *q, int D, const float *K, int64_t ks, int tlo, int thi,
                          float *S, int Sld) {
    for (int t = tlo; t < thi; t++) {
        const float *k = K + (int64_t)t * ks;
        for (int r = 0; r < 4; r++) {
            const float *x = q + (int64_t)r * D;
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += x[d] * k[d];
            S[(int64_t)r * Sld + t] = acc;
        }
    }
}

static void pa_pv4_scalar(float *O, int D, const float *alpha, const float *P, int Sld,
                          const float *V, int64_t vs, int tlo, int thi) {
    for (int r = 0; r < 4; r++) {
        float *o = O + (int64_t)r * D;
        const float *p = P + (int64_t)r * Sld;
        const float a = alpha[r];
        for (int d = 0; d < D; d++) o[d] *= a;
        for (int t = tlo; t < thi; t++) {
            const float w = p[t];
            const float *v = V + (int64_t)t * vs;
            for (int d = 0; d < D; d++) o[d] += w * v[d];
        }
    }
}

static float pa_softmax_row_scalar(float *s, int tb, int te, int vlo, int vhi,
                                   float cap, float slope, float pos0, float *m, float *l) {
    float mx = -INFINITY;
    for (int t = tb; t < te; t++) {
        float x = s[t];
        if (cap > 0.0f) x = cap * tanhf(x / cap);
        if (slope != 0.0f) x += slope * ((float)t + pos0);
        if (t < vlo || t > vhi) x = -INFINITY;
        s[t] = x;
        if (x > mx) mx = x;
    }
    float mnew = *m > mx ? *m : mx;
    float alpha = expf(*m - mnew);
    float sum = 0.0f;
    for (int t = tb; t < te; t++) {
        float p = s[t] == -INFINITY ? 0.0f : expf(s[t] - mnew);
        s[t] = p;
        sum += p;
    }
    *l = *l * alpha + sum;
    *m = mnew;
    return alpha;
}

/* ---- the item driver, instantiated per instruction set ------------------ */
/* pagedcy_attn_item.h defines PA_SFX(name) as name_<PA_ISA> and #undefs the
 * three parameters at its end. */
#define PA_ISA scalar
#define PA_FN_ATTR
#define PA_SIMD 0
#include "pagedcy_attn_item.h"

#if PAGEDCY_ATTN_HAVE_AVX2
#define PA_ISA avx2
#define PA_FN_ATTR PA_AVX2
#define PA_SIMD 1
#include "pagedcy_attn_item.h"
#endif

#if PAGEDCY_ATTN_HAVE_AVX512
#define PA_ISA avx512
#define PA_FN_ATTR PA_AVX512
#define PA_SIMD 2
#include "pagedcy_attn_item.h"
#endif

static inline void pagedcy_attn_run_item(const pagedcy_attn_params *P, const pagedcy_attn_item *it,
                                         float *ws, float *part_o, float *part_lse) {
#if PAGEDCY_ATTN_HAVE_AVX512
    if (P->use_simd >= 2 && P->D % 16 == 0) { pa_run_item_avx512(P, it, ws, part_o, part_lse); return; }
#endif
#if PAGEDCY_ATTN_HAVE_AVX2
    if (P->use_simd && P->D % 8 == 0) { pa_run_item_avx2(P, it, ws, part_o, part_lse); return; }
#endif
    pa_run_item_scalar(P, it, ws, part_o, part_lse);
}

/* ---- log-sum-exp merge -------------------------------------------------- */
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

/* ---- planning ----------------------------------------------------------- */
/* Query vectors per prefill item: enough rows to amortise the per-page work
 * (packing the K/V slice, bookkeeping) over many 4-row blocks, few enough
 * that Q and the accumulators (2 * M * D floats) stay in L2. 256 beat 64 and
 * 128 by 5-10% on causal 1024-token prefill (1 and 2 threads). */
#ifndef PAGEDCY_ATTN_PREFILL_M
#define PAGEDCY_ATTN_PREFILL_M 256
#endif
/* Below this many query vectors per KV head a sequence counts as decode: all
 * KV heads go in one item so the page's K block is read front to back. */
#ifndef PAGEDCY_ATTN_DECODE_M
#define PAGEDCY_ATTN_DECODE_M 16
#endif
#define PAGEDCY_ATTN_MIN_CHUNK 256

static int pa_item_cmp_group(const void *a, const void *b) {
    const pagedcy_attn_item *x = (const pagedcy_attn_item *)a, *y = (const pagedcy_attn_item *)b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return x->g0 < y->g0 ? -1 : (x->g0 > y->g0);
}

static int pa_item_cmp(const void *a, const void *b) {
    const pagedcy_attn_item *x = (const pagedcy_attn_item *)a, *y = (const pagedcy_attn_item *)b;
    if (x->gcost != y->gcost) return x->gcost > y->gcost ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->g0 != y->g0) return x->g0 < y->g0 ? -1 : 1;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->g0 != y->g0) return x->g0 < y->g0 ? -1 : 1;
    if (x->r0 != y->r0) return x->r0 < y->r0 ? -1 : 1;
    return x->t0 < y->t0 ? -1 : (x->t0 > y->t0);
}

static inline int pa_largest_divisor_at_most(int n, int cap) {
    if (cap < 1) cap = 1;
    for (int d = cap; d > 1; d--) if (n % d == 0) return d;
    return 1;
}

/* Visible KV range [lo, hi] of query rows [r0, r0+nr) of sequence b. */
static inline void pa_block_range(const pagedcy_attn_params *P, int b, int64_t r0, int64_t nr,
                                  int64_t *lo, int64_t *hi) {
    int64_t q_len = P->qo_indptr[b + 1] - P->qo_indptr[b], kv_len = P->kv_lens[b];
    int64_t first = kv_len - q_len + r0, last = first + nr - 1;
    *hi = P->causal ? (last < kv_len - 1 ? last : kv_len - 1) : kv_len - 1;
    int64_t l = P->window_left >= 0 ? first - P->window_left : 0;
    *lo = l > 0 ? l : 0;
}

/* fill == 0: count only. Returns 0, or -1 when the item count overflows. */
static int pa_plan_pass(const pagedcy_attn_params *P, int64_t kv_chunk,
                        pagedcy_attn_plan *pl, int fill, double max_cost) {
    const int G = P->H / P->Hkv, T = P->T;
    int64_t ni = 0, ngp = 0, po = 0, plo = 0, ws = 0;
    const int64_t min_chunk = ((PAGEDCY_ATTN_MIN_CHUNK + T - 1) / T) * T;
    for (int b = 0; b < P->B; b++) {
        const int64_t q_len = P->qo_indptr[b + 1] - P->qo_indptr[b];
        if (q_len <= 0) continue;
        int64_t rb;
        int ng;
        if (q_len * G <= PAGEDCY_ATTN_DECODE_M) { rb = q_len; ng = P->Hkv; }
        else { rb = ((P->flags & 128) ? 128 : (P->flags & 256) ? 32 : (P->flags & 512) ? 256 : PAGEDCY_ATTN_PREFILL_M) / G; if (rb < 1) rb = 1; ng = 1; }
        for (int64_t r0 = 0; r0 < q_len; r0 += rb) {
            const int nr = (int)(q_len - r0 < rb ? q_len - r0 : rb);
            const int M = nr * G, Mp = pa_item_mp(M, P->flags);
            int64_t lo, hi;
            pa_block_range(P, b, r0, nr, &lo, &hi);
            const int64_t start = (lo / T) * T;
            const int64_t span = hi >= start ? hi + 1 - start : 0;
            double cost = (double)(span > 0 ? span : 1) * M * ng;
            int64_t chunk = span > 0 ? span : 1;
            int ngi = ng;
            if (kv_chunk > 0) {
                chunk = ((kv_chunk + T - 1) / T) * T;
            } else if (kv_chunk == 0 && max_cost > 0 && cost > max_cost && span > 0) {
                int64_t want = (int64_t)ceil(cost / max_cost);
                int64_t by_kv = (span + min_chunk - 1) / min_chunk;
                int64_t nkv = want < by_kv ? want : by_kv;
                if (nkv > 1) {
                    chunk = (span + nkv - 1) / nkv;
                    chunk = ((chunk + T - 1) / T) * T;
                }
                if (want > nkv && ng > 1)
                    ngi = pa_largest_divisor_at_most(P->Hkv, (int)(ng / ((want + nkv - 1) / nkv)));
            }
            const int64_t nsplit = span > 0 ? (span + chunk - 1) / chunk : 1;
            int64_t w = pagedcy_attn_ws_layout(NULL, NULL, ngi, Mp, P->D, T);
            if (w > ws) ws = w;
            for (int g0 = 0; g0 < P->Hkv; g0 += ngi) {
                if (nsplit > 1 && fill) {
                    pagedcy_attn_group *gr = &pl->groups[ngp];
                    gr->b = b; gr->g0 = g0; gr->ng = ngi; gr->r0 = (int32_t)r0; gr->nr = nr;
                    gr->nsplit = (int32_t)nsplit; gr->po_off = po; gr->pl_off = plo;
                }
                if (nsplit > 1) ngp++;
                for (int64_t s = 0; s < nsplit; s++) {
                    if (fill) {
                        pagedcy_attn_item *it = &pl->items[ni];
                        it->b = b; it->g0 = g0; it->ng = ngi; it->r0 = (int32_t)r0; it->nr = nr;
                        if (nsplit > 1) {
                            it->t0 = start + s * chunk;
                            it->t1 = start + (s + 1) * chunk < hi + 1 ? start + (s + 1) * chunk : hi + 1;
                            it->po_off = po; it->pl_off = plo;
                            it->cost = (double)(it->t1 - it->t0) * M * ngi;
                        } else {
                            it->t0 = 0; it->t1 = P->kv_lens[b];
                            it->po_off = -1; it->pl_off = -1;
                            it->cost = cost * ngi / ng;
                        }
                    }
                    if (nsplit > 1) { po += (int64_t)ngi * M * P->D; plo += (int64_t)ngi * M; }
                    ni++;
                }
            }
        }
    }
    if (!fill) {
        pl->nitems = ni; pl->ngroups = ngp;
        pl->part_o_floats = po; pl->part_lse_floats = plo; pl->ws_floats = ws;
    }
    return 0;
}

/* Build the work list. kv_chunk > 0 forces splits of that many tokens,
 * < 0 forbids them, 0 lets the cost model decide. Returns NULL on OOM. */
static inline pagedcy_attn_plan *pagedcy_attn_make_plan(const pagedcy_attn_params *P, int nthreads,
                                                        int64_t kv_chunk) {
    pagedcy_attn_plan *pl = (pagedcy_attn_plan *)calloc(1, sizeof(pagedcy_attn_plan));
    if (!pl) return NULL;
    double max_cost = 0.0;
    if (nthreads > 1 && kv_chunk == 0) {
        /* total cost without splits; items above a third of a thread's share get split */
        pa_plan_pass(P, -1, pl, 0, 0.0);
        pl->items = (pagedcy_attn_item *)malloc(sizeof(pagedcy_attn_item) * (pl->nitems ? pl->nitems : 1));
        if (!pl->items) { free(pl); return NULL; }
        pa_plan_pass(P, -1, pl, 1, 0.0);
        double tot = 0.0;
        for (int64_t i = 0; i < pl->nitems; i++) tot += pl->items[i].cost;
        free(pl->items);
        pl->items = NULL;
        max_cost = tot / (8.0 * nthreads);
    }
    pa_plan_pass(P, kv_chunk, pl, 0, max_cost);
    pl->items = (pagedcy_attn_item *)malloc(sizeof(pagedcy_attn_item) * (pl->nitems ? pl->nitems : 1));
    pl->groups = (pagedcy_attn_group *)malloc(sizeof(pagedcy_attn_group) * (pl->ngroups ? pl->ngroups : 1));
    if (!pl->items || !pl->groups) { free(pl->items); free(pl->groups); free(pl); return NULL; }
    pa_plan_pass(P, kv_chunk, pl, 1, max_cost);
    /* Order: (sequence, KV head) groups largest first, and inside a group the
     * largest items first. Dynamic scheduling then balances the tail, while
     * consecutive items of a thread mostly reread the same head's K/V pages,
     * which are still in its L2 (prefill). */
    qsort(pl->items, (size_t)pl->nitems, sizeof(pagedcy_attn_item), pa_item_cmp_group);
    for (int64_t i = 0, j; i < pl->nitems; i = j) {
        double sum = 0.0;
        for (j = i; j < pl->nitems && pl->items[j].b == pl->items[i].b && pl->items[j].g0 == pl->items[i].g0; j++)
            sum += pl->items[j].cost;
        for (int64_t k = i; k < j; k++) pl->items[k].gcost = (P->flags & 8) ? pl->items[k].cost : sum;
    }
    qsort(pl->items, (size_t)pl->nitems, sizeof(pagedcy_attn_item), pa_item_cmp);
    return pl;
}

static inline void pagedcy_attn_free_plan(pagedcy_attn_plan *pl) {
    if (!pl) return;
    free(pl->items);
    free(pl->groups);
    free(pl);
}

static inline void *pagedcy_aligned_alloc(size_t nbytes) {
    void *p = NULL;
    if (nbytes == 0) nbytes = 64;
    if (posix_memalign(&p, 64, nbytes) != 0) return NULL;
    return p;
}

#endif
