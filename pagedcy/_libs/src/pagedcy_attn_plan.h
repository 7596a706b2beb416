/* Work planning of the paged-attention kernel: cuts a batch into items
 * (sequence, query-row block, run of KV heads, KV token range) and orders
 * them for the threads. Items that share a query block but cover different
 * KV ranges ("splits") are grouped for the log-sum-exp merge.
 */
#ifndef PAGEDCY_ATTN_PLAN_H
#define PAGEDCY_ATTN_PLAN_H

#include "pagedcy_attn_types.h"

/* Query vectors per prefill item: enough rows to amortise the per-page work
 * (packing the K/V slice, bookkeeping) over many 4-row blocks, few enough
 * that Q and the accumulators (2 * M * D floats) stay in L2. 256 beat 64 and
 * 128 by 5-10% on causal 1024-token prefill (1 and 2 threads). Twice that
 * at head_dim <= 64 (the same bytes): 4% faster on causal 4 x 512 and
 * 1 x 2048 at H 8 / Hkv 2 / D 64 (AMD EPYC, 1 thread), since every item
 * packs each of its pages once. */
#ifndef PAGEDCY_ATTN_PREFILL_M
#define PAGEDCY_ATTN_PREFILL_M 256
#endif
/* Below this many query vectors per KV head a sequence counts as decode: all
 * KV heads go in one item so the page's K block is read front to back. */
#ifndef PAGEDCY_ATTN_DECODE_M
#define PAGEDCY_ATTN_DECODE_M 16
#endif
#define PAGEDCY_ATTN_MIN_CHUNK 256
/* Below this much work (cost units, see pa_plan_pass, times head_dim: about
 * 4 flops each) a call runs on one thread. Waking a passive OpenMP worker
 * took ~60 us on the 2-core EPYC VM, and a single-sequence decode step
 * (512 tokens, 8 heads of 64: 0.26M) spent ~130 us per layer in two woken
 * regions (items, then the split merge) for ~20 us of work. */
#ifndef PAGEDCY_ATTN_MIN_PARALLEL_WORK
#define PAGEDCY_ATTN_MIN_PARALLEL_WORK (1 << 21)
#endif
/* The same threshold for a call on a step's team (pagedcy_team.h), whose other threads
 * are spinning, not asleep: handing them a share costs a microsecond or two. */
#ifndef PAGEDCY_ATTN_TEAM_MIN_WORK
#define PAGEDCY_ATTN_TEAM_MIN_WORK (1 << 15)
#endif

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

/* One pass over the batch: fill == 0 counts items, groups and buffer sizes
 * into pl; fill == 1 writes the items and groups (arrays sized by a counting
 * pass with the same arguments). Counts cannot overflow int64: the Python
 * wrapper bounds B, kv_len and the head counts far below that. */
static void pa_plan_pass(const pagedcy_attn_params *P, int64_t kv_chunk,
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
        else {
            const int m = (P->flags & PA_TUNE_PREFILL_M128) ? 128 : (P->flags & PA_TUNE_PREFILL_M32) ? 32
                        : (P->flags & PA_TUNE_PREFILL_M256) ? 256 : (P->flags & PA_TUNE_PREFILL_M512) ? 512
                        : P->D <= 64 ? 2 * PAGEDCY_ATTN_PREFILL_M : PAGEDCY_ATTN_PREFILL_M;
            rb = m / G > 1 ? m / G : 1;
            ng = 1;
        }
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
}

/* Build the work list. kv_chunk > 0 forces splits of that many tokens,
 * < 0 forbids them, 0 lets the cost model decide; below min_work (cost units
 * times head_dim) the call runs on one thread. Returns NULL on OOM. */
static inline pagedcy_attn_plan *pagedcy_attn_make_plan(const pagedcy_attn_params *P, int nthreads,
                                                        int64_t kv_chunk, double min_work) {
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
        /* Too little work to pay for waking another thread: one thread, no splits. */
        if (tot * P->D < min_work) nthreads = 1;
        else max_cost = tot / (8.0 * nthreads);
    }
    pl->nthreads = nthreads > 0 ? nthreads : 1;
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
        for (int64_t k = i; k < j; k++) pl->items[k].gcost = (P->flags & PA_TUNE_PLAIN_ORDER) ? pl->items[k].cost : sum;
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

#endif
