/* One work item of the paged-attention kernel: a block of query rows of one
 * sequence, for a run of KV heads, over a range of KV tokens.
 *
 * Included once per instruction set by pagedcy_attention.h (no include
 * guard), so every path shares every line of the bookkeeping (visibility,
 * page walk, finalisation) and they can only differ in floating-point
 * rounding.  Expects PA_ISA (scalar, avx2, avx512: the suffix of the
 * micro-kernels and of the function defined here), PA_FN_ATTR and PA_SIMD
 * (0, 1, 2); #undefs them at the end.
 *
 * Query vectors of the item are numbered v = row * G + head_in_group and
 * padded to a multiple of 4 (the micro-kernels' M block); pad rows are zero
 * and never active, so they cost a little compute and nothing else.
 */

#define PA_CAT2(a, b) a##b
#define PA_CAT(a, b) PA_CAT2(a, b)
#define PA_SFX(name) PA_CAT(name##_, PA_ISA)
/* the micro-kernels of this instruction set (decode, then prefill) */
#define PA_QK4 PA_SFX(pa_qk4)
#define PA_PV4 PA_SFX(pa_pv4)
#define PA_SOFTMAX4 PA_SFX(pa_softmax4)
#define PA_QK12 PA_SFX(pa_qk12)
#define PA_PV12 PA_SFX(pa_pv12)

PA_FN_ATTR static void PA_SFX(pa_run_item)(const pagedcy_attn_params *P, const pagedcy_attn_item *it,
                                           float *ws, float *part_o, float *part_lse) {
    const int G = P->H / P->Hkv, D = P->D, T = P->T;
    const int ng = it->ng, M = it->nr * G, Mp = pa_item_mp(M, P->flags), nblk = Mp / 4;
    const int Sld = (T + 7) & ~7;
    const int64_t kv_dim = (int64_t)P->Hkv * D;
    const int64_t q_start = P->qo_indptr[it->b];
    const int64_t q_len = P->qo_indptr[it->b + 1] - q_start;
    const int64_t kv_len = P->kv_lens[it->b];
    const int64_t delta = kv_len - q_len;            /* i_abs = delta + row */
    const int es = P->dtype == PAGEDCY_F32 ? 4 : 2;
    const int64_t row_bytes = (int64_t)D * es;

    pagedcy_attn_ws W;
    pagedcy_attn_ws_layout(&W, ws, ng, Mp, D, T);
    /* Many row blocks per head: K/V slices get packed to float32 (measured:
     * a win from 8 blocks on with 4 KiB token rows, a loss at 2-4 blocks). */
    const int packed = pa_item_packed(M, P->flags);
#if PA_SIMD
    /* the AVX-512 decode kernels widen bf16 in order; only AVX2's permute */
    const int perm = PA_SIMD == 1 && P->dtype == PAGEDCY_BF16 && D % 16 == 0 && !packed && !(P->flags & 64);
#else
    (void)packed;
#endif

    /* v -> (row, head in group) once: integer division by the runtime G in
     * the per-page loops cost as much as the softmax itself. */
    for (int v = 0; v < Mp; v++) {
        W.vrow[v] = v < M ? v / G : 0;
        W.vhh[v] = v < M ? v % G : 0;
    }

    /* Pack the item's query vectors, pre-scaled: the score is then a plain dot. */
    for (int gi = 0; gi < ng; gi++) {
        float *qd = W.qp + (int64_t)gi * Mp * D;
        for (int v = 0; v < Mp; v++) {
            float *dst = qd + (int64_t)v * D;
            if (v >= M) {
#if PA_SIMD
                if (packed) {
                    float *qt = qd + (int64_t)(v / 12) * 12 * D + v % 12;
                    for (int d = 0; d < D; d++) qt[(int64_t)d * 12] = 0.0f;
                    continue;
                }
#endif
                memset(dst, 0, sizeof(float) * D);
                continue;
            }
            int r = v / G, hh = v % G;
            const float *src = P->q + ((q_start + it->r0 + r) * P->H + (int64_t)(it->g0 + gi) * G + hh) * D;
#if PA_SIMD
            if (packed) {
                /* [D][12] per group of 12 vectors: the 12-row QK kernel
                 * broadcasts q[.][d] from one row of 12 */
                float *qt = qd + (int64_t)(v / 12) * 12 * D + v % 12;
                for (int d = 0; d < D; d++) qt[(int64_t)d * 12] = src[d] * P->scale;
            }
            else if (perm) pa_swap_mid_scale(dst, src, D, P->scale);
            else pa_scale_copy_avx2(dst, src, D, P->scale);
#else
            for (int d = 0; d < D; d++) dst[d] = src[d] * P->scale;
#endif
        }
    }
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

    if (lo_it <= hi_it) {
        const int64_t p_first = lo_it / T, p_last = hi_it / T;
        const int32_t *bt = P->block_tables + (int64_t)it->b * P->bt_stride;
        for (int64_t p = p_first; p <= p_last; p++) {
            const int64_t tok0 = p * T;
            const int nt = (int)(kv_len - tok0 < T ? kv_len - tok0 : T);
            const char *page = P->kv + ((int64_t)bt[p] * P->page_stride + P->layer_offset) * es;
            const char *next_page = p < p_last
                ? P->kv + ((int64_t)bt[p + 1] * P->page_stride + P->layer_offset) * es : NULL;

            /* page-local visible [vlo, vhi] per row and the union per 4-block */
            for (int b4 = 0; b4 < nblk; b4++) { W.blo[b4] = T; W.bhi[b4] = 0; }
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

            for (int gi = 0; gi < ng; gi++) {
                const int64_t hoff = (int64_t)(it->g0 + gi) * D * es;
                const char *Kg = page + hoff;
                const char *Vg = page + (int64_t)T * kv_dim * es + hoff;
                /* Prefetch this head's slice of the next page: a whole page of
                 * work ahead, enough to cover DRAM latency when the walk jumps. */
                const char *pfK = NULL, *pfV = NULL;
                if (P->flags & 2) {
                    if (gi + 1 < ng) { pfK = Kg + row_bytes; pfV = Vg + row_bytes; }
                    else if (next_page) {
                        pfK = next_page + (int64_t)it->g0 * D * es;
                        pfV = next_page + ((int64_t)T * kv_dim + (int64_t)it->g0 * D) * es;
                    }
                } else if (next_page && !(P->flags & 16)) {
                    pfK = next_page + hoff;
                    pfV = next_page + (int64_t)T * kv_dim * es + hoff;
                }
                const float *qg = W.qp + (int64_t)gi * Mp * D;
                float *Og = W.O + (int64_t)gi * Mp * D;
                float *mg = W.m + gi * Mp, *lg = W.l + gi * Mp;
#if !PA_SIMD
                const float *Kf = (const float *)Kg, *Vf = (const float *)Vg;
                int64_t kst = kv_dim;
                if (P->dtype != PAGEDCY_F32) {
                    for (int t = 0; t < nt; t++) {
                        pagedcy_load_to_f32(P->dtype, W.kbuf + (int64_t)t * D, Kg + (int64_t)t * kv_dim * es, D);
                        pagedcy_load_to_f32(P->dtype, W.vbuf + (int64_t)t * D, Vg + (int64_t)t * kv_dim * es, D);
                    }
                    Kf = W.kbuf; Vf = W.vbuf; kst = D;
                }
#endif
#if PA_SIMD
                /* Many 4-row blocks reuse this slice: copy it once to a
                 * contiguous float32 buffer. Token rows in the pool sit kv_dim
                 * apart (often 4 KiB), so the raw slice maps onto a few L1
                 * sets and would be refetched from L2 by every block. */
                const void *Ks = Kg, *Vs = Vg;
                int64_t kst = kv_dim;
                int kdt = perm ? PA_BF16P : P->dtype;
                if (packed) {
                    pa_pack_kt_avx2(W.kbuf, Sld, Kg, kv_dim, nt, D, P->dtype);
                    for (int t = 0; t < nt; t++)
                        pa_pack_row_avx2(W.vbuf + (int64_t)t * D, Vg + (int64_t)t * kv_dim * es, D, P->dtype);
                    if (pfK) {
                        for (int t = 0; t < nt; t++)
                            for (int64_t bb = 0; bb < 2 * row_bytes; bb += 64)
                                _mm_prefetch((bb < row_bytes ? pfK + bb : pfV + bb - row_bytes) + (int64_t)t * kv_dim * es,
                                             _MM_HINT_T1);
                    }
                    /* three 4-row blocks at a time, over the union of their
                     * token ranges (rows mask what they do not see) */
                    for (int b0 = 0; b0 < nblk; b0 += 3) {
                        int ulo = T, uhi = 0;
                        for (int k = 0; k < 3; k++) {
                            if (W.blo[b0 + k] >= W.bhi[b0 + k]) continue;
                            if (W.blo[b0 + k] < ulo) ulo = W.blo[b0 + k];
                            if (W.bhi[b0 + k] > uhi) uhi = W.bhi[b0 + k];
                        }
                        if (ulo >= uhi) continue;
                        float *S0 = W.S + (int64_t)b0 * 4 * Sld;
                        PA_QK12(qg + (int64_t)b0 * 4 * D, D, W.kbuf, Sld, ulo, uhi,
                                     S0, S0 + 4 * Sld, S0 + 8 * Sld);
                        for (int k = 0; k < 3; k++) {
                            const int b4 = b0 + k;
                            float slope4[4], pos4[4];
                            for (int j = 0; j < 4; j++) {
                                const int v = b4 * 4 + j;
                                slope4[j] = (P->alibi && v < M) ? P->alibi[(it->g0 + gi) * G + W.vhh[v]] : 0.0f;
                                pos4[j] = (float)(tok0 - (delta + it->r0 + W.vrow[v]));
                            }
                            pa_softmax4_avx2(W.S + (int64_t)b4 * 4 * Sld, ulo >> 1, (uhi + 1) >> 1,
                                             W.vlo + b4 * 4, W.vhi + b4 * 4, P->soft_cap, slope4, pos4,
                                             mg + b4 * 4, lg + b4 * 4, W.alpha + b4 * 4);
                        }
                        PA_PV12(Og + (int64_t)b0 * 4 * D, D, W.alpha + b0 * 4, S0, S0 + 4 * Sld,
                                     S0 + 8 * Sld, W.vbuf, ulo & ~1, uhi);
                    }
                    continue;
                }
#else
                (void)pfK; (void)pfV;       /* the scalar path does not prefetch */
#endif
                int first = 1;
#if PA_SIMD
                /* This head's share of the next page's K and V rows, in
                 * address order, spread over the heads. Software prefetch
                 * covers only the start of each stretch; the hardware
                 * prefetcher, which stops at 4 KiB page edges, streams the
                 * rest without holding line-fill buffers. When the item has
                 * every KV head, the page's K/V block is one contiguous span
                 * and, in a 4 KiB-aligned pool, the stretches are its 4 KiB
                 * pages: the first KiB of each for float32, the first 2 KiB
                 * for 16-bit storage (which computes longer per byte, so it
                 * can keep more misses of its own in flight). Otherwise the
                 * stretches are rows: the first KiB of the item's heads.
                 * Measured (headline decode, 2 threads): against no software
                 * prefetch and whole rows, fp32 13% faster than either; fp16
                 * 4% faster with 2 KiB of each 4 KiB page than with 1 KiB of
                 * each 2 KiB row, which was 6% faster than whole rows. */
                pa_pfcur cK, cV;
                int use_pf = 0;
                if (next_page && !(P->flags & 16)) {
                    const char *base = next_page + (int64_t)it->g0 * D * es;
                    const int64_t span = 2 * (int64_t)T * kv_dim * es;
                    if (ng == P->Hkv && span % 4096 == 0 && (uintptr_t)base % 4096 == 0 && !(P->flags & 32)) {
                        const int nreg = (int)(span / 4096);
                        const int g0r = gi * nreg / ng, g1r = (gi + 1) * nreg / ng, gmr = (g0r + g1r) / 2;
                        const int64_t len = es == 4 ? 1024 : 2048;
                        pa_pf_init(&cK, base, 4096, len, g0r, gmr);
                        pa_pf_init(&cV, base, 4096, len, gmr, g1r);
                    } else {
                        const int r0 = gi * 2 * T / ng, r1 = (gi + 1) * 2 * T / ng, rm = (r0 + r1) / 2;
                        const int64_t head = (int64_t)ng * row_bytes < 1024 ? (int64_t)ng * row_bytes : 1024;
                        pa_pf_init(&cK, base, kv_dim * es, head, r0, rm);
                        pa_pf_init(&cV, base, kv_dim * es, head, rm, r1);
                    }
                    use_pf = 1;
                }
#endif
                for (int b4 = 0; b4 < nblk; b4++) {
                    if (W.blo[b4] >= W.bhi[b4]) continue;
#if PA_SIMD
                    PA_QK4(qg + (int64_t)b4 * 4 * D, D, Ks, kst, W.blo[b4] & ~1, W.bhi[b4],
                                W.S + (int64_t)b4 * 4 * Sld, Sld, first && use_pf ? &cK : NULL, P->flags, kdt);
#else
                    pa_qk4_scalar(qg + (int64_t)b4 * 4 * D, D, Kf, kst, W.blo[b4], W.bhi[b4],
                                  W.S + (int64_t)b4 * 4 * Sld, Sld);
#endif
#if PA_SIMD
                    {
                        float slope4[4], pos4[4];
                        for (int k = 0; k < 4; k++) {
                            const int v = b4 * 4 + k;
                            slope4[k] = (P->alibi && v < M) ? P->alibi[(it->g0 + gi) * G + W.vhh[v]] : 0.0f;
                            pos4[k] = (float)(tok0 - (delta + it->r0 + W.vrow[v]));
                        }
                        PA_SOFTMAX4(W.S + (int64_t)b4 * 4 * Sld, W.blo[b4] >> 1, (W.bhi[b4] + 1) >> 1,
                                         W.vlo + b4 * 4, W.vhi + b4 * 4, P->soft_cap, slope4, pos4,
                                         mg + b4 * 4, lg + b4 * 4, W.alpha + b4 * 4);
                    }
#else
                    const int tb = W.blo[b4] & ~7, te = (W.bhi[b4] + 7) & ~7;
                    for (int v = b4 * 4; v < b4 * 4 + 4; v++) {
                        float *s = W.S + (int64_t)v * Sld;
                        if (W.vlo[v] > W.vhi[v]) {
                            W.alpha[v] = 1.0f;
                            for (int t = tb; t < te; t++) s[t] = 0.0f;
                            continue;
                        }
                        int r = W.vrow[v], h = (it->g0 + gi) * G + W.vhh[v];
                        float slope = P->alibi ? P->alibi[h] : 0.0f;
                        float pos0 = (float)(tok0 - (delta + it->r0 + r));
                        W.alpha[v] = pa_softmax_row_scalar(s, tb, te, W.vlo[v], W.vhi[v], P->soft_cap,
                                                           slope, pos0, mg + v, lg + v);
                    }
#endif
#if PA_SIMD
                    PA_PV4(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, W.S + (int64_t)b4 * 4 * Sld, Sld,
                                Vs, kst, W.blo[b4] & ~1, W.bhi[b4], first && use_pf ? &cV : NULL,
                                P->flags, kdt);
#else
                    pa_pv4_scalar(Og + (int64_t)b4 * 4 * D, D, W.alpha + b4 * 4, W.S + (int64_t)b4 * 4 * Sld,
                                  Sld, Vf, kst, W.blo[b4], W.bhi[b4]);
#endif
                    first = 0;
                    (void)first;
                }
            }
        }
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
#if PA_SIMD
            if (perm) pa_swap_mid_scale(dst, o, D, inv);
            else pa_scale_copy_avx2(dst, o, D, inv);
#else
            for (int d = 0; d < D; d++) dst[d] = o[d] * inv;
#endif
            if (lse_dst) *lse_dst = lse;
        }
    }
}

#undef PA_QK4
#undef PA_PV4
#undef PA_SOFTMAX4
#undef PA_QK12
#undef PA_PV12
#undef PA_SFX
#undef PA_CAT
#undef PA_CAT2
#undef PA_ISA
#undef PA_FN_ATTR
#undef PA_SIMD
