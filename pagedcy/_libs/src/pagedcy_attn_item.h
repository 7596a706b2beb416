/* One work item of the paged-attention kernel: a block of query rows of one
 * sequence, for a run of KV heads, over a range of KV tokens.
 *
 * Included once per instruction set by pagedcy_attention.h (no include
 * guard), so every path shares every line of the bookkeeping (visibility,
 * page walk, prefetch, finalisation) and they can only differ in
 * floating-point rounding (and, on the int8 q.k path, in whether P.V runs on
 * int16 weights, within the bound of pagedcy_attn_types.h). Expects PA_ISA (scalar, avx2, avx512: the suffix
 * of the micro-kernels and of the function defined here) and PA_FN_ATTR;
 * #undefs them at the end. Each instruction set provides, with its suffix,
 * the same micro-kernels: pa_qk4 / pa_pv4 / pa_softmax4 (4-row blocks read
 * straight from the pool), pa_pack_kt / pa_pack_row / pa_qk12 / pa_pv12
 * (12-row blocks on packed float32 slices), pa_scale_copy and pa_kv_perm,
 * for the int8 q.k path pa_quantize_q8 / pa_qk4_i8 / pa_pv4_i8 with
 * pa_qk_i8_ok / pa_pv_i8_ok (which head dimensions and CPUs they take),
 * and for multi-page decode steps pa_qk4v / pa_pv4v with
 * pa_super_token_major(dtype) (AVX-512 reads the pages token-major, AVX2
 * float ones, not int8; the others
 * map pa_qk4v / pa_pv4v to the page-after-page helpers defined here).
 *
 * Query vectors of the item are numbered v = row * G + head_in_group and
 * padded to a multiple of 4 (12 when packed); pad rows are zero and never
 * active, so they cost a little compute and nothing else.
 */

#define PA_CAT2(a, b) a##b
#define PA_CAT(a, b) PA_CAT2(a, b)
#define PA_SFX(name) PA_CAT(name##_, PA_ISA)

#ifndef PA_ITEM_SHARED
#define PA_ITEM_SHARED
/* ALiBi slope and position offset of the 4 query vectors of block b4. */
static inline void pa_block_bias(const pagedcy_attn_params *P, const pagedcy_attn_item *it,
                                 const pagedcy_attn_ws *W, int gi, int b4, int M, int64_t tok0,
                                 int64_t delta, float *slope4, float *pos4) {
    const int G = P->H / P->Hkv;
    if (!P->alibi) {            /* positions only matter with a slope */
        for (int k = 0; k < 4; k++) slope4[k] = pos4[k] = 0.0f;
        return;
    }
    for (int k = 0; k < 4; k++) {
        const int v = b4 * 4 + k;
        slope4[k] = v < M ? P->alibi[(it->g0 + gi) * G + W->vhh[v]] : 0.0f;
        pos4[k] = (float)(tok0 - (delta + it->r0 + W->vrow[v]));
    }
}

/* This layer's part of logical page i of a sequence (bt: its block-table row). */
static inline const char *pa_page_at(const pagedcy_attn_params *P, const int32_t *bt, int64_t i) {
    return P->kv + (int64_t)bt[i] * P->page_stride + P->layer_offset;
}

/* Prefetch nt token rows of a K and a V slice (row_bytes each, rows `stride`
 * bytes apart) of the next page: what a packed item reads next. */
static inline void pa_prefetch_slices(const char *pfK, const char *pfV, int nt, int64_t stride,
                                      int64_t row_bytes, int flags) {
    for (int t = 0; t < nt; t++)
        for (int64_t bb = 0; bb < 2 * row_bytes; bb += 64)
            PA_PREFETCH((bb < row_bytes ? pfK + bb : pfV + bb - row_bytes) + (int64_t)t * stride, flags);
}
#endif

/* Several whole pages per step, page after page: scores of page j at
 * S + j*T*4, later pages adding to the rescaled output. What the AVX2 and
 * scalar paths run, and AVX-512 under PA_TUNE_SUPER_PAGE_ORDER. */
PA_FN_ATTR static void PA_SFX(pa_qk4v_pages)(const float *q, int D, const char *const *K, int npg, int T,
                                             int64_t ks, float *S, pa_pfcur *pf, int flags, int dtype, int perm) {
    for (int j = 0; j < npg; j++)
        PA_SFX(pa_qk4)(q, D, K[j], ks, 0, T, S + (int64_t)j * T * 4, 0, pf ? pf + j : NULL, flags, dtype, perm);
}

PA_FN_ATTR static void PA_SFX(pa_pv4v_pages)(float *O, int D, const float *alpha, const float *P,
                                             const char *const *V, int npg, int T, int64_t vs, pa_pfcur *pf,
                                             int flags, int dtype, int perm) {
    static const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    for (int j = 0; j < npg; j++)
        PA_SFX(pa_pv4)(O, D, j ? one : alpha, P + (int64_t)j * T * 4, 0, V[j], vs, 0, T, pf ? pf + j : NULL,
                       flags, dtype, perm);
}

PA_FN_ATTR static void PA_SFX(pa_run_item)(const pagedcy_attn_params *P, const pagedcy_attn_item *it,
                                           float *ws, float *part_o, float *part_lse) {
    const int G = P->H / P->Hkv, D = P->D, T = P->T, flags = P->flags;
    const int ng = it->ng, M = it->nr * G, Mp = pa_item_mp(M, flags), nblk = Mp / 4;
    const int Sld = (T + 7) & ~7;
    const int64_t SldS = pa_score_ld(Mp, T);
    const int64_t q_start = P->qo_indptr[it->b];
    const int64_t q_len = P->qo_indptr[it->b + 1] - q_start;
    const int64_t kv_len = P->kv_lens[it->b];
    const int64_t delta = kv_len - q_len;            /* i_abs = delta + row */
    const int es = pa_dtype_bytes(P->dtype), i8 = P->dtype == PAGEDCY_I8;
    /* bytes of one (token, KV head) row; the kernels take the token stride
     * in elements (bytes for int8, whose rows end with their scale) */
    const int64_t row_bytes = (int64_t)pagedcy_head_bytes(P->dtype, (size_t)D);
    const int64_t row_stride = P->tok_stride, ks = row_stride / es, hs = P->head_stride;
    /* token-major pages ([token][head][row], the C order of a caller's
     * [page, layer, 2, token, head, row] array) get the 4 KiB-stretch
     * prefetch below; head-major pages (the store's) prefetch the next
     * (page, head) slice and may go several pages per step */
    const int nhd = hs == row_bytes && row_stride == P->Hkv * row_bytes
                    && P->v_offset == (int64_t)T * row_stride;

    pagedcy_attn_ws W;
    pagedcy_attn_ws_layout(&W, ws, ng, Mp, D, T);
    /* Many row blocks per head: K/V slices get packed to float32 (measured:
     * a win from 8 blocks on with 4 KiB token rows, a loss at 2-4 blocks). */
    const int packed = pa_item_packed(M, flags);
    const int perm = PA_SFX(pa_kv_perm)(P->dtype, D, packed, flags);

    /* v -> (row, head in group) once: integer division by the runtime G in
     * the per-page loops cost as much as the softmax itself. */
    for (int v = 0; v < Mp; v++) {
        W.vrow[v] = v < M ? v / G : 0;
        W.vhh[v] = v < M ? v % G : 0;
    }

    /* Pack the item's query vectors, pre-scaled: the score is then a plain
     * dot. Packed items store them [D][12] per group of 12 vectors, so the
     * 12-row score kernel broadcasts q[.][d] from one row of 12. */
    for (int gi = 0; gi < ng; gi++) {
        float *qd = W.qp + (int64_t)gi * Mp * D;
        for (int v = 0; v < Mp; v++) {
            float *dst = qd + (int64_t)v * D;
            float *qt = qd + (int64_t)(v / 12) * 12 * D + v % 12;
            if (v >= M) {
                if (packed) for (int d = 0; d < D; d++) qt[(int64_t)d * 12] = 0.0f;
                else memset(dst, 0, sizeof(float) * D);
                continue;
            }
            const int r = v / G, hh = v % G;
            const float *src = P->q + ((q_start + it->r0 + r) * P->H + (int64_t)(it->g0 + gi) * G + hh) * D;
            if (packed) for (int d = 0; d < D; d++) qt[(int64_t)d * 12] = src[d] * P->scale;
            else PA_SFX(pa_scale_copy)(dst, src, D, P->scale, perm ? PA_ORDER_TO_KERNEL : PA_ORDER_SAME);
        }
    }
    /* int8 K with qk_i8: the queries quantized once per item for the
     * integer q.k kernels (decode blocks; packed items score float32) */
    const int qk8 = P->qk_i8 && i8 && !packed && PA_SFX(pa_qk_i8_ok)(D);
    /* ... and their P.V on int16-quantized weights (pa_pv4_i8), where the
     * instruction set has a fast integer multiply-add for it */
    const int pv8 = qk8 && PA_SFX(pa_pv_i8_ok)(flags);
    for (int i = 0; qk8 && i < ng * Mp; i++)
        PA_SFX(pa_quantize_q8)(W.q8 + (int64_t)i * D, W.qs + i, W.qsum + i, W.qp + (int64_t)i * D, D);
    memset(W.O, 0, sizeof(float) * (size_t)ng * Mp * D);
    for (int i = 0; i < ng * Mp; i++) { W.m[i] = -INFINITY; W.l[i] = 0.0f; }

    /* Absolute visible range of each row; both ends grow with the row. */
    for (int r = 0; r < it->nr; r++) {
        int64_t ia = delta + it->r0 + r;
        int64_t hi = P->causal ? (ia < kv_len - 1 ? ia : kv_len - 1) : kv_len - 1;
        int64_t lo = P->window_left >= 0 ? ia - P->window_left : 0;
        if (lo < it->t0) lo = it->t0;
        if (hi > it->t1 - 1) hi = it->t1 - 1;
        W.rlo[r] = lo; W.rhi[r] = hi;
    }
    int64_t lo_it = W.rlo[0], hi_it = W.rhi[0];
    for (int r = 1; r < it->nr; r++) {
        if (W.rlo[r] < lo_it) lo_it = W.rlo[r];
        if (W.rhi[r] > hi_it) hi_it = W.rhi[r];
    }

    const int64_t p_first = lo_it / T, p_last = lo_it <= hi_it ? hi_it / T : p_first - 1;
    const int32_t *bt = P->block_tables + (int64_t)it->b * P->bt_stride;
    int whole_nt = -1;          /* vlo/vhi/blo/bhi hold a whole page of nt tokens */
    const int pack_pages = packed ? pa_pack_pages(T, flags) : 1;
    for (int64_t p = p_first; p <= p_last; p++) {
        const int64_t tok0 = p * T;
        /* a packed item's step spans npk pages (tokens [tok0, tok0 + nt)), every
         * other step one page */
        const int npk = (int)(p_last - p + 1 < pack_pages ? p_last - p + 1 : pack_pages);
        const int nt = (int)(kv_len - tok0 < (int64_t)npk * T ? kv_len - tok0 : (int64_t)npk * T);
        const char *page = pa_page_at(P, bt, p);
        const char *next_page = p + npk <= p_last ? pa_page_at(P, bt, p + npk) : NULL;

        /* page-local visible [vlo, vhi] per row and the union per 4-block.
         * Rows' ranges grow with the row, so the page is whole for every row
         * when the last row starts and the first row ends within it: then
         * the arrays hold [0, nt) for every vector and, when the previous
         * page left them so, are not rewritten (decode and most prefill
         * pages; the general loop cost ~10% of a causal prefill). */
        const int whole = W.rlo[it->nr - 1] <= tok0 && W.rhi[0] >= tok0 + nt - 1;
        if (!whole || whole_nt != nt) {
            for (int b4 = 0; b4 < nblk; b4++) { W.blo[b4] = nt; W.bhi[b4] = 0; }
            for (int v = 0; v < Mp; v++) {
                int vlo = 1, vhi = 0;
                if (v < M) {
                    const int r = W.vrow[v];
                    int64_t a = W.rlo[r] > tok0 ? W.rlo[r] - tok0 : 0;
                    int64_t z = W.rhi[r] - tok0;
                    if (z > nt - 1) z = nt - 1;
                    if (a <= z) { vlo = (int)a; vhi = (int)z; }
                }
                W.vlo[v] = vlo; W.vhi[v] = vhi;
                if (vlo <= vhi) {
                    if (vlo < W.blo[v / 4]) W.blo[v / 4] = vlo;
                    if (vhi + 1 > W.bhi[v / 4]) W.bhi[v / 4] = vhi + 1;
                }
            }
            whole_nt = whole ? nt : -1;
        }

        /* Head-major decode: up to PA_SUPER_PAGES whole pages per step, so
         * the softmax, the output's rescale and the per-call set-up run once
         * for all of them, and (AVX-512) each 4-token score block reads row
         * t of every page side by side, P.V likewise: four streams of rows
         * in flight instead of one. Decode is compute-bound at high
         * bandwidth (about 4.2 M tokens/s per thread at H 32 / Hkv 8 / D
         * 128, 60% of the FMA peak, AMD EPYC). Measured there against one
         * page per step, 32 x 2048 from DRAM: bf16 1.07-1.11x on 1 thread,
         * 1.02-1.06x on 2; fp32 1.05x on 2 threads, 0.95x on 1; reading the
         * pages one after another instead (PA_TUNE_SUPER_PAGE_ORDER, what the
         * scalar path does, and AVX2 for int8) cost fp32 15%, so there only
         * 16-bit and int8 K/V take several pages, and fp32 where it is read
         * token-major (AVX-512, and AVX2 since it measured 1.30x there on
         * Zen 4, pa_super_token_major_avx2 says why). Without ALiBi (positions are not in
         * order in a token-major step); pages must be whole for every row. */
        int npg = 1;
        if (!packed && Mp < 32 && !nhd && T % 2 == 0 && whole && nt == T && !(flags & PA_TUNE_SUPER1) && !P->alibi
            && (es < 4 || (PA_SFX(pa_super_token_major)(P->dtype) && !(flags & PA_TUNE_SUPER_PAGE_ORDER))
                || (flags & PA_TUNE_SUPER_F32))) {
            const int cap = (flags & PA_TUNE_SUPER2) ? 2 : PA_SUPER_PAGES;
            while (npg < cap && p + npg <= p_last && kv_len - (tok0 + (int64_t)npg * T) >= T
                   && W.rhi[0] >= tok0 + (int64_t)(npg + 1) * T - 1)
                npg++;
        }
        if (npg > 1) {
            const char *pg[PA_SUPER_PAGES], *nx[PA_SUPER_PAGES];
            int32_t slo[32], shi[32];
            for (int j = 0; j < npg; j++) {
                pg[j] = pa_page_at(P, bt, p + j);
                nx[j] = p + npg + j <= p_last ? pa_page_at(P, bt, p + npg + j) : NULL;
            }
            for (int v = 0; v < Mp; v++) { slo[v] = v < M ? 0 : 1; shi[v] = v < M ? npg * T - 1 : 0; }
            for (int gi = 0; gi < ng; gi++) {
                const int64_t hoff = (int64_t)(it->g0 + gi) * hs;
                const char *Kj[PA_SUPER_PAGES], *Vj[PA_SUPER_PAGES];
                for (int j = 0; j < npg; j++) { Kj[j] = pg[j] + hoff; Vj[j] = Kj[j] + P->v_offset; }
                const float *qg = W.qp + (int64_t)gi * Mp * D;
                float *Og = W.O + (int64_t)gi * Mp * D;
                float *mg = W.m + gi * Mp, *lg = W.l + gi * Mp;
                /* the first block's passes over page j prefetch page j's
                 * slice of the next head (or of the next step's page j):
                 * its K rows during the scores, its V rows during P.V */
                pa_pfcur cK[PA_SUPER_PAGES], cV[PA_SUPER_PAGES];
                int use_pf = !(flags & PA_TUNE_NO_PF);
                for (int j = 0; j < npg; j++) {
                    const char *nK = gi + 1 < ng ? Kj[j] + hs : nx[j] ? nx[j] + (int64_t)it->g0 * hs : NULL;
                    pa_pf_init(&cK[j], nK ? nK : Kj[j], row_stride, row_bytes, 0, nK ? T : 0);
                    pa_pf_init(&cV[j], nK ? nK + P->v_offset : Kj[j], row_stride, row_bytes, 0, nK ? T : 0);
                }
                const char *Ks[PA_SUPER_PAGES], *Vs[PA_SUPER_PAGES];
                for (int j = 0; j < npg; j++) { Ks[j] = Kj[j] + D; Vs[j] = Vj[j] + D; }  /* int8 scales */
                const int tm = PA_SFX(pa_super_token_major)(P->dtype) && !(flags & PA_TUNE_SUPER_PAGE_ORDER);
                for (int b4 = 0; b4 < nblk; b4++) {
                    if (b4 * 4 >= M) continue;
                    float *Sb = W.S + (int64_t)b4 * 4 * SldS;
                    const int64_t qo = (int64_t)gi * Mp + b4 * 4;    /* int8 q.k: the block's queries */
                    if (qk8)    /* one call for the step's pages, token-major or page after page */
                        PA_SFX(pa_qk4_i8)(W.q8 + qo * D, W.qs + qo, W.qsum + qo, D, Kj, npg, row_stride,
                                          tm ? 0 : T, 0, npg * T, Sb, use_pf ? cK : NULL, flags);
                    else if (tm) PA_SFX(pa_qk4v)(qg + (int64_t)b4 * 4 * D, D, Kj, npg, T, ks, Sb, use_pf ? cK : NULL,
                                                 flags, P->dtype, perm);
                    else PA_SFX(pa_qk4v_pages)(qg + (int64_t)b4 * 4 * D, D, Kj, npg, T, ks, Sb,
                                               use_pf ? cK : NULL, flags, P->dtype, perm);
                    if (i8 && !qk8) pa_i8_scale_pages(Sb, Ks, npg, T, row_stride, tm);
                    float slope4[4], pos4[4];
                    pa_block_bias(P, it, &W, gi, b4, M, tok0, delta, slope4, pos4);
                    PA_SFX(pa_softmax4)(Sb, 0, npg * T / 2, slo + b4 * 4, shi + b4 * 4, P->soft_cap, slope4,
                                        pos4, mg + b4 * 4, lg + b4 * 4, W.alpha + b4 * 4);
                    /* one call for the step's pages, in the scores' order (its
                     * 64-token chunks then span pages) */
                    if (pv8)
                        PA_SFX(pa_pv4_i8)(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, Sb, Vj, npg, row_stride,
                                          tm ? 0 : T, 0, npg * T, use_pf ? cV : NULL, flags);
                    else {
                        if (i8) pa_i8_scale_pages(Sb, Vs, npg, T, row_stride, tm);
                        if (tm) PA_SFX(pa_pv4v)(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, Sb, Vj, npg, T, ks,
                                                use_pf ? cV : NULL, flags, P->dtype, perm);
                        else PA_SFX(pa_pv4v_pages)(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, Sb, Vj, npg,
                                                   T, ks, use_pf ? cV : NULL, flags, P->dtype, perm);
                    }
                    use_pf = 0;
                }
            }
            p += npg - 1;
            continue;
        }

        for (int gi = 0; gi < ng; gi++) {
            const int64_t hoff = (int64_t)(it->g0 + gi) * hs;
            const char *Kg = page + hoff;
            const char *Vg = Kg + P->v_offset;
            const float *qg = W.qp + (int64_t)gi * Mp * D;
            float *Og = W.O + (int64_t)gi * Mp * D;
            float *mg = W.m + gi * Mp, *lg = W.l + gi * Mp;

            if (packed) {
                /* Many 4-row blocks reuse this slice: copy it once to a
                 * contiguous float32 buffer. Token rows in the pool sit kv_dim
                 * apart (often 4 KiB), so the raw slice maps onto a few L1
                 * sets and would be refetched from L2 by every block. The
                 * step's npk pages go side by side (K^T columns j*T.., V rows
                 * j*T..), so the blocks below see one span of nt tokens. */
                const int ldk = (nt + 7) & ~7;
                for (int j = 0; j < npk; j++) {
                    const char *Kp = j ? pa_page_at(P, bt, p + j) + hoff : Kg;
                    const int ntj = nt - j * T < T ? nt - j * T : T;
                    PA_SFX(pa_pack_kt)(W.kbuf + j * T, ldk, (ntj + 7) & ~7, Kp, ks, ntj, D, P->dtype);
                    for (int t = 0; t < ntj; t++)
                        PA_SFX(pa_pack_row)(W.vbuf + ((int64_t)j * T + t) * D, Kp + P->v_offset + (int64_t)t * row_stride,
                                            D, P->dtype);
                }
                /* this head's slices of the next step's pages (or the next
                 * head's of this step's), a whole step of work ahead of use */
                if (!(flags & PA_TUNE_NO_PF)) {
                    for (int j = 0; j < npk; j++) {
                        const char *pfK = NULL;
                        int64_t ptok = tok0 + (int64_t)j * T;
                        if (!(flags & PA_TUNE_PF_NEXT_HEAD)) {
                            ptok += (int64_t)npk * T;
                            if (p + npk + j <= p_last)
                                pfK = pa_page_at(P, bt, p + npk + j) + hoff;
                        } else if (gi + 1 < ng) {
                            pfK = pa_page_at(P, bt, p + j) + hoff + hs;
                        } else if (j == 0 && next_page) {
                            pfK = next_page + (int64_t)it->g0 * hs;
                            ptok += (int64_t)npk * T;
                        }
                        const int pnt = (int)(kv_len - ptok < T ? kv_len - ptok : T);
                        if (pfK && pnt > 0)
                            pa_prefetch_slices(pfK, pfK + P->v_offset, pnt, row_stride, row_bytes, flags);
                    }
                }
                /* three 4-row blocks at a time, over the union of their token
                 * ranges (rows mask what they do not see) */
                for (int b0 = 0; b0 < nblk; b0 += 3) {
                    int ulo = npk * T, uhi = 0;
                    for (int k = 0; k < 3; k++) {
                        if (W.blo[b0 + k] >= W.bhi[b0 + k]) continue;
                        if (W.blo[b0 + k] < ulo) ulo = W.blo[b0 + k];
                        if (W.bhi[b0 + k] > uhi) uhi = W.bhi[b0 + k];
                    }
                    if (ulo >= uhi) continue;
                    float *S0 = W.S + (int64_t)b0 * 4 * SldS;
                    PA_SFX(pa_qk12)(qg + (int64_t)b0 * 4 * D, D, W.kbuf, ldk, ulo, uhi,
                                    S0, S0 + 4 * SldS, S0 + 8 * SldS);
                    for (int k = 0; k < 3; k++) {
                        const int b4 = b0 + k;
                        float slope4[4], pos4[4];
                        pa_block_bias(P, it, &W, gi, b4, M, tok0, delta, slope4, pos4);
                        PA_SFX(pa_softmax4)(W.S + (int64_t)b4 * 4 * SldS, ulo >> 1, (uhi + 1) >> 1,
                                            W.vlo + b4 * 4, W.vhi + b4 * 4, P->soft_cap, slope4, pos4,
                                            mg + b4 * 4, lg + b4 * 4, W.alpha + b4 * 4);
                    }
                    PA_SFX(pa_pv12)(Og + (int64_t)b0 * 4 * D, D, W.alpha + b0 * 4, S0, S0 + 4 * SldS,
                                    S0 + 8 * SldS, W.vbuf, ulo & ~1, uhi);
                }
                continue;
            }

            /* Token-major pages ("NHD", a caller's C-order array): this
             * head's share of the next page's K and V bytes, in address
             * order, spread over the heads and issued a few lines per step of
             * the micro-kernels, so the whole next page is in flight while
             * this one computes. When the item has every KV head, the page's
             * K/V block is one contiguous span and, in a 4 KiB-aligned pool,
             * the stretches are its 4 KiB pages; otherwise they are the item's
             * slice of each row. The whole page, because the hardware
             * prefetchers do not stream the rest of a 4 KiB page when each
             * head touches only its 512-byte slice of it: on an AMD EPYC
             * (Zen 4, 1 thread, 32 x 2048 fp32 from DRAM) prefetching whole
             * stretches took 24.4 ms against 51.2 ms with only the first KiB
             * of each (what an Intel development VM preferred, by 13%) and
             * 54.6 ms with none; fp16 24.8 against 33.3 ms, bf16 25.2 against
             * 35.9 ms. PA_TUNE_PF_PARTIAL keeps the old lengths for A/B runs. */
            /* The item's first page has had no previous page to prefetch
             * it: request all of it at once, so its misses overlap instead of
             * coming one demand line at a time (1.0-1.07x on head_dim 64
             * decode from DRAM, AMD EPYC, 2 threads). Only small pages (16
             * KiB there): a 128 KiB burst (head_dim 128, 8 KV heads) would
             * queue ahead of the first demand loads and was not measured to
             * help. */
            if (nhd && p == p_first && gi == 0 && !(flags & PA_TUNE_NO_PF)
                && 2 * (int64_t)nt * ng * row_bytes <= 32768)
                pa_prefetch_slices(page + (int64_t)it->g0 * row_bytes,
                                   page + P->v_offset + (int64_t)it->g0 * row_bytes, nt,
                                   row_stride, (int64_t)ng * row_bytes, flags);
            pa_pfcur cK, cV;
            int use_pf = 0;
            if (nhd && next_page && !(flags & PA_TUNE_NO_PF)) {
                const char *base = next_page + (int64_t)it->g0 * row_bytes;
                const int64_t span = 2 * (int64_t)T * row_stride;
                if (ng == P->Hkv && span % 4096 == 0 && (uintptr_t)base % 4096 == 0 && !(flags & PA_TUNE_PF_ROWS)) {
                    const int nreg = (int)(span / 4096);
                    const int g0r = gi * nreg / ng, g1r = (gi + 1) * nreg / ng, gmr = (g0r + g1r) / 2;
                    const int64_t len = !(flags & PA_TUNE_PF_PARTIAL) ? 4096 : es == 4 ? 1024 : 2048;
                    pa_pf_init(&cK, base, 4096, len, g0r, gmr);
                    pa_pf_init(&cV, base, 4096, len, gmr, g1r);
                } else {
                    const int r0 = gi * 2 * T / ng, r1 = (gi + 1) * 2 * T / ng, rm = (r0 + r1) / 2;
                    const int64_t slice = (int64_t)ng * row_bytes;
                    const int64_t head = !(flags & PA_TUNE_PF_PARTIAL) || slice < 1024 ? slice : 1024;
                    pa_pf_init(&cK, base, row_stride, head, r0, rm);
                    pa_pf_init(&cV, base, row_stride, head, rm, r1);
                }
                use_pf = 1;
            } else if (!nhd && !(flags & PA_TUNE_NO_PF)) {
                /* Head-major pages: the (page, head) slice this item reads
                 * next, one head's work ahead. Its K and V rows are each one
                 * contiguous run, yet the kernels' access order (4 tokens at
                 * a time, V in column passes) does not train the hardware
                 * prefetchers: without this, 32 x 2048 float32 decode from
                 * DRAM ran at 9.3 GB/s against 26.4 GB/s with it (AMD EPYC,
                 * 1 thread); 2 or 4 heads ahead measured the same. */
                const char *nK = gi + 1 < ng ? Kg + hs : next_page ? next_page + (int64_t)it->g0 * hs : NULL;
                if (nK) {
                    pa_pf_init(&cK, nK, row_stride, row_bytes, 0, T);
                    pa_pf_init(&cV, nK + P->v_offset, row_stride, row_bytes, 0, T);
                    use_pf = 1;
                }
            }
            for (int b4 = 0; b4 < nblk; b4++) {
                if (W.blo[b4] >= W.bhi[b4]) continue;
                /* the first active block walks the prefetch cursors */
                pa_pfcur *pk = use_pf ? &cK : NULL, *pv = use_pf ? &cV : NULL;
                use_pf = 0;
                float *Sb = W.S + (int64_t)b4 * 4 * SldS;
                if (qk8) {
                    const int64_t qo = (int64_t)gi * Mp + b4 * 4;
                    PA_SFX(pa_qk4_i8)(W.q8 + qo * D, W.qs + qo, W.qsum + qo, D, &Kg, 1, row_stride, 0,
                                      W.blo[b4] & ~1, W.bhi[b4], Sb, pk, flags);
                } else
                    PA_SFX(pa_qk4)(qg + (int64_t)b4 * 4 * D, D, Kg, ks, W.blo[b4] & ~1, W.bhi[b4],
                                   Sb, Sld, pk, flags, P->dtype, perm);
                if (i8 && !qk8) pa_i8_scale_pairs(Sb, W.blo[b4] & ~1, W.bhi[b4], Kg + D, row_stride);
                float slope4[4], pos4[4];
                pa_block_bias(P, it, &W, gi, b4, M, tok0, delta, slope4, pos4);
                PA_SFX(pa_softmax4)(Sb, W.blo[b4] >> 1, (W.bhi[b4] + 1) >> 1, W.vlo + b4 * 4,
                                    W.vhi + b4 * 4, P->soft_cap, slope4, pos4,
                                    mg + b4 * 4, lg + b4 * 4, W.alpha + b4 * 4);
                if (pv8) {
                    PA_SFX(pa_pv4_i8)(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, Sb, &Vg, 1, row_stride, 0,
                                      W.blo[b4] & ~1, W.bhi[b4], pv, flags);
                    continue;
                }
                if (i8) pa_i8_scale_pairs(Sb, W.blo[b4] & ~1, W.bhi[b4], Vg + D, row_stride);
                PA_SFX(pa_pv4)(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, Sb, Sld,
                               Vg, ks, W.blo[b4] & ~1, W.bhi[b4], pv, flags, P->dtype, perm);
            }
        }
        p += npk - 1;
    }

    /* Normalise and write either the final output or this split's partial. */
    for (int gi = 0; gi < ng; gi++) {
        for (int v = 0; v < M; v++) {
            const int r = v / G, hh = v % G;
            const float *o = W.O + ((int64_t)gi * Mp + v) * D;
            float lval = W.l[gi * Mp + v], mval = W.m[gi * Mp + v];
            float inv = lval > 0.0f ? 1.0f / lval : 0.0f;
            float lse = lval > 0.0f ? mval + logf(lval) : -INFINITY;
            float *dst;
            float *lse_dst;
            if (it->po_off >= 0) {
                dst = part_o + it->po_off + ((int64_t)gi * M + v) * D;
                lse_dst = part_lse + it->pl_off + (int64_t)gi * M + v;
            } else {
                int64_t row = (q_start + it->r0 + r) * P->H + (int64_t)(it->g0 + gi) * G + hh;
                dst = P->out + row * D;
                lse_dst = P->lse ? P->lse + row : NULL;
            }
            PA_SFX(pa_scale_copy)(dst, o, D, inv, perm ? PA_ORDER_FROM_KERNEL : PA_ORDER_SAME);
            if (lse_dst) *lse_dst = lse;
        }
    }
}

#undef PA_SFX
#undef PA_CAT
#undef PA_CAT2
#undef PA_ISA
#undef PA_FN_ATTR
