/* Shared definitions of the paged-attention kernel: parameters, tuning
 * flags, the work list, per-thread scratch, storage-dtype dispatch and the
 * next-page prefetch cursor. Plain C; every instruction set uses them.
 */
#ifndef PAGEDCY_ATTN_TYPES_H
#define PAGEDCY_ATTN_TYPES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "pagedcy_convert.h"

/* Private tuning switches for A/B runs (pagedcy_attn_params.flags, 0 =
 * defaults). Results never depend on them beyond float rounding. */
enum pagedcy_attn_tune {
    PA_TUNE_PF_L1 = 1,            /* prefetch into L1 instead of L2 */
    PA_TUNE_PF_NEXT_HEAD = 2,     /* packed items: prefetch the next head's slice, not the next page's */
    PA_TUNE_NO_PACK = 4,          /* never pack K/V slices: prefill runs the 4-row decode kernels */
    PA_TUNE_PLAIN_ORDER = 8,      /* items largest first, not grouped by (sequence, KV head) */
    PA_TUNE_NO_PF = 16,           /* no software prefetch */
    PA_TUNE_PF_ROWS = 32,         /* decode: row-wise prefetch only, no 4 KiB-page stretches */
    PA_TUNE_NO_BF16_PERM = 64,    /* AVX2 decode: widen bf16 in order (no even/odd loads) */
    PA_TUNE_PREFILL_M128 = 128,   /* prefill items of 128 query vectors */
    PA_TUNE_PREFILL_M32 = 256,    /* ... of 32 */
    PA_TUNE_PREFILL_M256 = 512,   /* ... of 256 */
    PA_TUNE_NO_QK3 = 1024,        /* AVX2 decode: no 3-token score kernel */
    PA_TUNE_PF_PARTIAL = 2048,    /* decode: prefetch only the start of each stretch (1 KiB
                                   * float32, 2 KiB 16-bit) and leave the rest to the hardware */
    PA_TUNE_PREFILL_M512 = 4096,  /* prefill items of 512 query vectors */
    PA_TUNE_SUPER1 = 8192,        /* decode on head-major pages: one page per softmax/P.V step */
    PA_TUNE_SUPER2 = 16384,       /* ... at most two (default: PA_SUPER_PAGES) */
    PA_TUNE_SUPER_F32 = 32768,    /* ... float32 on the AVX2 and scalar paths too */
    PA_TUNE_SUPER_PAGE_ORDER = 65536, /* ... AVX-512 reads them page after page, not token-major */
    PA_TUNE_NO_VNNI = 131072,     /* int8 q.k: no VNNI even where the CPU has it */
    PA_TUNE_PACK1 = 262144,       /* packed (prefill) items: one page per pack / softmax / P.V step */
    PA_TUNE_PACK2 = 524288        /* ... at most two (default: PA_PACK_PAGES) */
};

/* pa_scale_copy's `order`: copy in order, or map queries into / results out
 * of the lane order of the AVX2 bf16 decode loads (pa_kv_perm set). */
enum { PA_ORDER_SAME = 0, PA_ORDER_TO_KERNEL = 1, PA_ORDER_FROM_KERNEL = 2 };

typedef struct {
    const float *q;              /* [total_q, H, D] */
    const int64_t *qo_indptr;    /* [B+1] */
    const char *kv;              /* page pool */
    int32_t dtype;               /* PAGEDCY_F32 / F16 / BF16 / I8 */
    /* Byte strides of the pool [page][layer][K, V][token][head][row]: any
     * order of those axes in memory works (the store keeps a head's K and V
     * rows of a page together, see _store.pyx; callers may pass C-order
     * [page, layer, 2, token, head, row] arrays). */
    int64_t page_stride;         /* bytes from one page to the next */
    int64_t layer_offset;        /* bytes from a page's start to this layer's K rows */
    int64_t v_offset;            /* bytes from a K row to the V row of the same token and head */
    int64_t tok_stride;          /* bytes from token t to t+1 (same head) */
    int64_t head_stride;         /* bytes from KV head g to g+1 (same token) */
    const int32_t *block_tables; /* [B, bt_stride] */
    int64_t bt_stride;
    const int64_t *kv_lens;      /* [B] */
    int32_t B, H, Hkv, D, T;
    float scale, soft_cap;       /* soft_cap 0: off */
    int32_t causal, window_left; /* window_left -1: off */
    const float *alibi;          /* [H] or NULL */
    float *out;                  /* [total_q, H, D] */
    float *lse;                  /* [total_q, H] or NULL */
    int32_t use_simd;            /* PAGEDCY_SIMD_* cap */
    int32_t flags;               /* enum pagedcy_attn_tune bits */
    int32_t qk_i8;               /* int8 K: integer q.k on queries quantized to int8 (below) */
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
    int32_t nthreads;            /* threads worth waking for this batch (<= the request) */
} pagedcy_attn_plan;

/* Bytes per stored K/V element (an int8 row also carries its scale, see
 * pagedcy_head_bytes). */
static inline int pa_dtype_bytes(int dtype) { return dtype == PAGEDCY_F32 ? 4 : dtype == PAGEDCY_I8 ? 1 : 2; }

/* Pair layout of a 4-row block's scores: (r, t) at S[(t/2)*8 + 2r + (t&1)]. */
static inline int64_t pa_pair_idx(int r, int t) { return (int64_t)(t >> 1) * 8 + 2 * r + (t & 1); }

/* int8 storage: multiply the pair-layout scores of tokens [tlo, thi) by each
 * token's row scale (at `scales` + t * stride bytes). Applied to the raw
 * q.k sums (K scales) and to the softmax weights before P.V (V scales), so
 * the kernels only widen int8 to float and never dequantize a whole row. */
static inline void pa_i8_scale_one(float *S, int t, const char *scales, int64_t stride) {
    float s;
    memcpy(&s, scales + (int64_t)t * stride, sizeof(float));
    for (int r = 0; r < 4; r++) S[pa_pair_idx(r, t)] *= s;
}

static inline void pa_i8_scale_pairs(float *S, int tlo, int thi, const char *scales, int64_t stride) {
    int t = tlo;
    if (t & 1) pa_i8_scale_one(S, t++, scales, stride);
    /* a whole pair is 8 consecutive floats (s0, s1, s0, s1, ...): written so the
     * compiler multiplies it by one vector instead of 8 indexed scalars (the
     * per-token version cost int8 decode ~15% against fp16 with K/V in cache) */
    for (; t + 1 < thi; t += 2) {
        float s0, s1;
        memcpy(&s0, scales + (int64_t)t * stride, sizeof(float));
        memcpy(&s1, scales + (int64_t)(t + 1) * stride, sizeof(float));
        float *p = S + (int64_t)(t >> 1) * 8;
        for (int k = 0; k < 8; k += 2) { p[k] *= s0; p[k + 1] *= s1; }
    }
    if (t < thi) pa_i8_scale_one(S, t, scales, stride);
}

/* pa_i8_scale_pairs over npg whole pages of T tokens in a multi-page step:
 * page j's scales at rows[j] + t*stride; token-major (v = t*npg + j) or
 * page-major (v = j*T + t) order, as the instruction set lays them out. */
static inline void pa_i8_scale_pages(float *S, const char *const *rows, int npg, int T, int64_t stride,
                                     int token_major) {
    if (!token_major) {
        for (int j = 0; j < npg; j++) pa_i8_scale_pairs(S + (int64_t)j * T * 4, 0, T, rows[j], stride);
        return;
    }
    /* a pair at a time, as pa_i8_scale_pairs (npg * T is even) */
    int j = 0, t = 0;
    for (int v = 0; v < npg * T; v += 2) {
        float s0, s1;
        memcpy(&s0, rows[j] + (int64_t)t * stride, sizeof(float));
        if (++j == npg) { j = 0; t++; }
        memcpy(&s1, rows[j] + (int64_t)t * stride, sizeof(float));
        if (++j == npg) { j = 0; t++; }
        float *p = S + (int64_t)(v >> 1) * 8;
        for (int k = 0; k < 8; k += 2) { p[k] *= s0; p[k + 1] *= s1; }
    }
}

/* Virtual token v of a multi-page step over npg pages (rows rs bytes apart)
 * -> (page j, byte offset row): token-major for tpp 0 (row v / npg of page
 * v % npg) or, tpp > 0, page after page (row v % tpp of page v / tpp).
 * Kernels step it a token at a time (pa_vtok_next) instead of dividing. */
static inline void pa_vtok_init(int v, int npg, int tpp, int64_t rs, int *j, int64_t *row) {
    if (tpp) { *j = v / tpp; *row = (int64_t)(v % tpp) * rs; }
    else { *j = v % npg; *row = (int64_t)(v / npg) * rs; }
}
static inline void pa_vtok_next(int npg, int tpp, int64_t rs, int *j, int64_t *row) {
    if (tpp) { *row += rs; if (*row == (int64_t)tpp * rs) { *row = 0; ++*j; } }
    else if (++*j == npg) { *j = 0; *row += rs; }
}
/* The rows of the next n virtual tokens (base[j] + row, base[j] the pages)
 * into rows[], advancing (j, row). Out of line on purpose: inlined into the
 * int8 P.V kernels, GCC kept j and row in stack slots there, a store-to-load
 * round trip per token (9.6% of the AVX2 int8 P.V's samples with K/V in L2,
 * AMD EPYC Zen 4; 3.5% in this function now). */
#if defined(__GNUC__)
__attribute__((noinline, unused))
#endif
static void pa_vtok_rows(const char **rows, int n, const char *const *base, int npg, int tpp, int64_t rs,
                         int *jp, int64_t *rowp) {
    int j = *jp;
    int64_t row = *rowp;
    for (int t = 0; t < n; t++) { rows[t] = base[j] + row; pa_vtok_next(npg, tpp, rs, &j, &row); }
    *jp = j;
    *rowp = row;
}

/* ---- int8 q.k --------------------------------------------------------------
 * With int8 K (and pagedcy_attn_params.qk_i8) the decode kernels score with
 * integer dot products: each pre-scaled query vector q (D floats, already
 * times the softmax scale) becomes q8 = round(q / s), s = max|q| / 127
 * (symmetric, one scale per query vector, i.e. per head and row), and
 *     score(t) = s * k_scale(t) * sum_d q8[d] k8[t][d]
 * with the int32 sum exact. The only new error is q's rounding,
 * |q[d] - s q8[d]| <= s/2, so against the float path on the same K
 *     |score error| <= (s/2) * k_scale(t) * sum_d |k8[t][d]|
 *                   =  max|q| / 254 * sum_d |k[t][d]|        (k dequantized)
 * per score, plus float32 rounding; call E the largest over the visible
 * tokens. Shifting every score by at most E moves each softmax weight by a
 * factor within [e^-2E, e^2E], so the log-sum-exp moves by at most E and
 * every output element by at most (e^2E - 1) * max_t |v[t][d]|.
 * Non-finite query values: NaN quantizes to 0, +-Inf to +-127 (the scale
 * from the finite values), as pagedcy_quantize_i8_row does for K/V.
 *
 * Where the instruction set has an integer P.V (pa_pv_i8_ok: the scalar
 * path, AVX2 (vpmaddwd, or AVX-VNNI's vpdpwssd), AVX512-VNNI), P.V also runs
 * on integers (pa_pv4_i8): per
 * 4-row block and chunk c of at most 64 tokens, w(t) = p(t) * v_scale(t)
 * is rounded to q(t) = nearbyint(w(t) / u_r), u_r = max_c w / 32767 (15
 * bits, per row), and sum_t q(t) v8[t][d] is exact in int32. Rounding moves
 * each w by at most u_r / 2 <= p_max(c) * s_v / 65534, s_v the largest V row
 * scale of the visible tokens, so a chunk's numerator moves by at most
 * 64 * 128 * p_max(c) * s_v / 65534 per element (|v8| <= 128); the
 * denominator l is at least the sum of the (rescaled) p_max(c), so
 *     |output error| <= 64 * 128 / 65534 * s_v  <  s_v / 8
 * per element (= max|v| / 1016 for rows from pagedcy's quantizer, under the
 * error int8 V storage already has, max|v| / 254), on top of the q
 * rounding's (e^2E - 1) * max_t |v[t][d]| above. */
static inline void pa_quantize_q8(int8_t *q8, float *qs, int32_t *qsum, const float *q, int D) {
    float amax = 0.0f;
    for (int d = 0; d < D; d++) {
        const float a = fabsf(q[d]);
        amax = a > amax && a <= 3.402823466e38f ? a : amax;
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    /* branch-free, so it vectorizes (it runs once per item and query
     * vector, ~10% of a short decode item when scalar): Inf * inv clamps to
     * +-127 (Inf * 0 is NaN), NaN becomes 0, and adding 1.5 * 2^23 rounds
     * |y| <= 127 to the nearest integer, ties to even, like nearbyintf */
    for (int d = 0; d < D; d++) {
        float y = q[d] * inv;
        y = y == y ? y : 0.0f;
        y = y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y;
        y = (y + 12582912.0f) - 12582912.0f;
        q8[d] = (int8_t)(int32_t)y;
        sum += q8[d];
    }
    *qs = amax / 127.0f;
    *qsum = sum;
}

/* Runs `...` (a statement using the name DT) with DT a compile-time constant
 * equal to `dtype`: the micro-kernels are always_inline templates on the
 * storage dtype, and this is their one run-time switch. */
#define PA_DISPATCH_DTYPE(dtype, DT, ...) do {                           \
        switch (dtype) {                                                \
        case PAGEDCY_F16: { const int DT = PAGEDCY_F16; __VA_ARGS__; break; } \
        case PAGEDCY_BF16: { const int DT = PAGEDCY_BF16; __VA_ARGS__; break; } \
        case PAGEDCY_I8: { const int DT = PAGEDCY_I8; __VA_ARGS__; break; } \
        default: { const int DT = PAGEDCY_F32; __VA_ARGS__; break; }    \
        }                                                               \
    } while (0)

/* ---- per-thread scratch ------------------------------------------------ */
typedef struct {
    float *qp, *O, *m, *l, *S, *alpha, *kbuf, *vbuf;
    int64_t *rlo, *rhi;
    int32_t *vlo, *vhi, *blo, *bhi;
    int32_t *vrow, *vhh;         /* query vector -> row, head within group */
    int8_t *q8;                  /* int8 q.k: the quantized queries [ng][Mp][D], */
    float *qs;                   /* their scales [ng][Mp] */
    int32_t *qsum;               /* and the sums of their int8 values [ng][Mp] */
} pagedcy_attn_ws;

static inline int64_t pa_al16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* An item with many 4-row blocks per head ("prefill") packs each page's K/V
 * slice (K transposed) and runs the 12-row micro-kernels, so it pads its
 * query vectors to a multiple of 12; otherwise to a multiple of 4. */
static inline int pa_item_packed(int M, int flags) {
    return ((M + 3) & ~3) >= 32 && !(flags & PA_TUNE_NO_PACK);
}
static inline int pa_item_mp(int M, int flags) {
    return pa_item_packed(M, flags) ? (M + 11) / 12 * 12 : (M + 3) & ~3;
}

/* Lays the scratch out in `base` (NULL: only measure); returns its size in floats. */
/* Pages a decode item on head-major pages takes per softmax / P.V step
 * (pagedcy_attn_item.h). */
#define PA_SUPER_PAGES 4

/* Pages a packed (prefill) item packs per step: their K^T and V slices side
 * by side in kbuf / vbuf, so the softmax, the rescale of the output rows and
 * the per-block set-up run once per PA_PACK_PAGES * T tokens instead of once
 * per page (pagedcy_attn_item.h). Needs T % 8 == 0 (each page's columns start
 * on an 8-token group); other page sizes pack one page at a time. */
#define PA_PACK_PAGES 4
static inline int pa_pack_pages(int T, int flags) {
    if (T % 8 || (flags & PA_TUNE_PACK1)) return 1;
    return (flags & PA_TUNE_PACK2) ? 2 : PA_PACK_PAGES;
}

/* Floats per row of a 4-row block's scores: unpacked items (Mp < 32) hold
 * up to PA_SUPER_PAGES pages' worth, packed ones PA_PACK_PAGES pages'. */
static inline int64_t pa_score_ld(int Mp, int T) {
    return ((int64_t)(Mp < 32 ? PA_SUPER_PAGES : PA_PACK_PAGES) * T + 7) & ~7;
}

static inline int64_t pagedcy_attn_ws_layout(pagedcy_attn_ws *W, float *base, int ng, int Mp, int D, int T) {
    const int64_t Sld = ((int64_t)PA_PACK_PAGES * T + 7) & ~7, SldS = pa_score_ld(Mp, T);
    int64_t off = 0;
#define PA_TAKE(field, type, n) do { if (W) W->field = (type *)(base + off); off += pa_al16(n); } while (0)
    PA_TAKE(qp, float, (int64_t)ng * Mp * D);
    PA_TAKE(O, float, (int64_t)ng * Mp * D);
    PA_TAKE(m, float, (int64_t)ng * Mp);
    PA_TAKE(l, float, (int64_t)ng * Mp);
    PA_TAKE(S, float, (int64_t)Mp * SldS);
    PA_TAKE(alpha, float, Mp);
    PA_TAKE(kbuf, float, (int64_t)Sld * D);     /* K^T of up to PA_PACK_PAGES pages as [D][<= Sld] */
    PA_TAKE(vbuf, float, (int64_t)Sld * D);     /* their V rows [t][D] */
    PA_TAKE(rlo, int64_t, 2 * (int64_t)Mp);
    PA_TAKE(rhi, int64_t, 2 * (int64_t)Mp);
    PA_TAKE(vlo, int32_t, Mp);
    PA_TAKE(vhi, int32_t, Mp);
    PA_TAKE(blo, int32_t, Mp);
    PA_TAKE(bhi, int32_t, Mp);
    PA_TAKE(vrow, int32_t, Mp);
    PA_TAKE(vhh, int32_t, Mp);
    PA_TAKE(q8, int8_t, ((int64_t)ng * Mp * D + 3) / 4);
    PA_TAKE(qs, float, (int64_t)ng * Mp);
    PA_TAKE(qsum, int32_t, (int64_t)ng * Mp);
#undef PA_TAKE
    return off;
}

/* ---- software prefetch ------------------------------------------------- */
/* Prefetches run a whole page ahead, more than L1 holds, so they target L2
 * (T1); measured ~3% faster than T0 on fp16 decode, equal on fp32. */
#if defined(__GNUC__) || defined(__clang__)
#define PA_PREFETCH(p, flags) do {                                       \
        if ((flags) & PA_TUNE_PF_L1) __builtin_prefetch((p), 0, 3);     \
        else __builtin_prefetch((p), 0, 2);                             \
    } while (0)
#else
#define PA_PREFETCH(p, flags) do { (void)(p); (void)(flags); } while (0)
#endif

/* Prefetch cursor over stretches [row0, row1) of `len` bytes, `stride`
 * apart, in the next page: either the starts of its 4 KiB pages or the
 * starts of the item's slice of each K/V row (pagedcy_attn_item.h picks).
 * The kernels issue its lines a few per step of their inner loops, so misses
 * stay in flight all the time instead of in bursts that fill the line-fill
 * buffers and stall. When len covers the whole stride the stretches abut
 * and the cursor is one contiguous span (p -> end); otherwise it hops. */
typedef struct {
    const char *p, *row_end, *end;
    int64_t stride, len;
} pa_pfcur;

static inline void pa_pf_init(pa_pfcur *c, const char *base, int64_t stride, int64_t len, int row0, int row1) {
    c->stride = stride;
    c->len = len;
    c->p = base + (int64_t)row0 * stride;
    if (row0 >= row1) { c->row_end = c->end = c->p; return; }
    if (len >= stride) c->row_end = c->end = base + (int64_t)row1 * stride;
    else { c->row_end = c->p + len; c->end = base + (int64_t)(row1 - 1) * stride + len; }
}

static inline int pa_pf_lines_left(const pa_pfcur *c) {
    if (!c || c->p >= c->end) return 0;
    int64_t n = (c->row_end - c->p + 63) / 64;
    if (c->end > c->row_end) n += (c->end - c->row_end) / c->stride * ((c->len + 63) / 64);
    return (int)n;
}

static inline void pa_pf_step(pa_pfcur *c, int n, int flags) {
    /* one contiguous span (head-major pages): the same lines, without the hop
     * bookkeeping; the decode kernels call this per page every few tokens */
    if (c->row_end == c->end) {
        const char *p = c->p, *e = c->end;
        for (; n > 0 && p < e; n--, p += 64) PA_PREFETCH(p, flags);
        c->p = p;
        return;
    }
    while (n > 0 && c->p < c->end) {
        int k = (int)((c->row_end - c->p + 63) >> 6);
        if (k > n) k = n;
        for (int i = 0; i < k; i++) PA_PREFETCH(c->p + 64 * i, flags);
        c->p += 64 * (int64_t)k;
        n -= k;
        if (c->p >= c->row_end && c->row_end < c->end) {
            c->row_end += c->stride;
            c->p = c->row_end - c->len;
        }
    }
}

#endif
