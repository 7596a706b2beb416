/* Paged attention over the pagedcy page pool (plain C, called from Cython).
 *
 * Pool: kv_pages[max_pages, num_layers, 2, page_size, Hkv, D] with any byte
 * strides whose rows are contiguous (pagedcy_attn_params): the store's pages
 * are head-major (a head's K rows of a page, then its V rows), a caller's
 * C-order array token-major. All arithmetic is float32.
 *
 * The work is cut into items (pagedcy_attn_plan.h); an item keeps the running
 * softmax state of all its query vectors and walks its pages once, so every
 * K/V row is read once for all the query heads (and query rows) that use it
 * (pagedcy_attn_item.h, instantiated per instruction set on the scalar, AVX2
 * and AVX-512 micro-kernels). Splits of one long sequence are merged by
 * log-sum-exp afterwards (pagedcy_attn_merge.h), which lets it use every
 * thread. Nothing here validates input: the Cython wrapper does, before
 * releasing the GIL.
 */
#ifndef PAGEDCY_ATTENTION_H
#define PAGEDCY_ATTENTION_H

#include "pagedcy_attn_types.h"
#include "pagedcy_attn_scalar.h"
#include "pagedcy_attn_avx2.h"
#include "pagedcy_attn_avx512.h"
#include "pagedcy_attn_plan.h"
#include "pagedcy_attn_merge.h"

/* ---- the item driver, instantiated per instruction set ------------------ */
#define PA_ISA scalar
#define PA_FN_ATTR
#include "pagedcy_attn_item.h"

#if PAGEDCY_ATTN_HAVE_AVX2
#define PA_ISA avx2
#define PA_FN_ATTR PA_AVX2
#include "pagedcy_attn_item.h"
#endif

#if PAGEDCY_ATTN_HAVE_AVX512
#define PA_ISA avx512
#define PA_FN_ATTR PA_AVX512
#include "pagedcy_attn_item.h"
#endif

/* The best instruction set allowed by P->use_simd whose vector width divides D. */
static inline void pagedcy_attn_run_item(const pagedcy_attn_params *P, const pagedcy_attn_item *it,
                                         float *ws, float *part_o, float *part_lse) {
#if PAGEDCY_ATTN_HAVE_AVX512
    if (P->use_simd >= PAGEDCY_SIMD_AVX512 && P->D % 16 == 0) { pa_run_item_avx512(P, it, ws, part_o, part_lse); return; }
#endif
#if PAGEDCY_ATTN_HAVE_AVX2
    if (P->use_simd >= PAGEDCY_SIMD_AVX2 && P->D % 8 == 0) { pa_run_item_avx2(P, it, ws, part_o, part_lse); return; }
#endif
    pa_run_item_scalar(P, it, ws, part_o, part_lse);
}

static inline void *pagedcy_aligned_alloc(size_t nbytes) {
    void *p = NULL;
    if (nbytes == 0) nbytes = 64;
    if (posix_memalign(&p, 64, nbytes) != 0) return NULL;
    return p;
}

#endif
