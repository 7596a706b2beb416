"""Shared helpers for the attention tests: a float64 NumPy reference and a
random paged-batch generator."""
import math

import numpy as np

from pagedcy import dtypes
from pagedcy._libs._pool import aligned_zeros


def bf16_round(x):
    """float32 -> (bf16 bits as uint16, the float32 values they represent)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = np.isnan(x)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = 0x7FC0
    back = (r.astype(np.uint32) << 16).view(np.float32)
    return r, back


def quantize_int8(x):
    """int8 rows ``[..., D + 4]`` of ``x`` as the store writes them, and the float64 values
    they stand for (the reference's K/V)."""
    rows = dtypes.quantize_int8(x)
    return rows, dtypes.dequantize_int8(rows).astype(np.float64)


def make_batch(rng, *, q_lens, kv_lens, num_heads, num_kv_heads, head_dim, page_size,
               num_layers=2, layer=1, dtype="float32", extra_pages=3, pad_cols=2, aligned=None,
               layout=None):
    """Random paged batch. Unused page slots and unused block-table entries
    hold NaN / -1 so any read past a sequence's end shows up in the output.
    ``aligned``: pages start on a 4 KiB boundary as a pool's do (the kernel
    prefetches by 4 KiB page then) or 16 bytes past one, as plain NumPy
    arrays often do; None draws one of the two from ``rng``. ``layout``: "NHD"
    (a C-order array) or "HND" (head-major memory, the strided view a store's
    ``pages()`` returns); None draws one from ``rng``.

    Returns (query, qo_indptr, kv_pages, block_tables, kv_lens, K, V) where K/V
    are per-sequence float64 [kv_len, Hkv, D] arrays of the values as stored
    (int8: dequantized; its pages have head_dim + 4 on the last axis).
    """
    B = len(q_lens)
    npages = [(n + page_size - 1) // page_size for n in kv_lens]
    total_pages = sum(npages) + extra_pages
    perm = rng.permutation(total_pages)
    maxp = max(npages + [0]) + pad_cols
    bt = np.full((B, max(maxp, 1)), -1, dtype=np.int32)
    pages = np.full((total_pages, num_layers, 2, page_size, num_kv_heads, head_dim), np.nan,
                    dtype=np.float32)
    Ks, Vs = [], []
    nxt = 0
    for b in range(B):
        n = kv_lens[b]
        k = rng.standard_normal((n, num_kv_heads, head_dim)).astype(np.float32)
        v = rng.standard_normal((n, num_kv_heads, head_dim)).astype(np.float32)
        for p in range(npages[b]):
            pid = perm[nxt]
            nxt += 1
            bt[b, p] = pid
            lo, hi = p * page_size, min(n, (p + 1) * page_size)
            pages[pid, layer, 0, : hi - lo] = k[lo:hi]
            pages[pid, layer, 1, : hi - lo] = v[lo:hi]
            # other layers hold garbage that must never be read
            pages[pid, :layer, :, : hi - lo] = 3e4
            pages[pid, layer + 1:, :, : hi - lo] = -3e4
        Ks.append(k)
        Vs.append(v)
    if dtype == "float16":
        pages = pages.astype(np.float16)
        Ks = [k.astype(np.float16) for k in Ks]
        Vs = [v.astype(np.float16) for v in Vs]
    elif dtype == "bfloat16":
        bits, back = bf16_round(pages)
        pages = bits
        Ks = [bf16_round(k)[1] for k in Ks]
        Vs = [bf16_round(v)[1] for v in Vs]
    elif dtype == "int8":
        # unused slots (NaN) become all-zero rows with scale 0
        pages = quantize_int8(pages)[0]
        Ks = [quantize_int8(k)[1] for k in Ks]
        Vs = [quantize_int8(v)[1] for v in Vs]
    if aligned is None:
        aligned = bool(rng.integers(2))
    # a copy at a chosen distance past a 4 KiB boundary: 0, or 16 (not even 64-byte aligned)
    off = 0 if aligned else 16
    if layout is None:
        layout = ("NHD", "HND")[int(rng.integers(2))]
    raw = aligned_zeros(pages.nbytes + off)
    if layout == "NHD":
        view = raw[off:].view(pages.dtype).reshape(pages.shape)
    else:
        P, L, _, T, Hkv, R = pages.shape
        view = raw[off:].view(pages.dtype).reshape(P, L, Hkv, 2, T, R).transpose(0, 1, 3, 4, 2, 5)
    view[...] = pages
    pages = view
    total_q = sum(q_lens)
    q = rng.standard_normal((total_q, num_heads, head_dim)).astype(np.float32)
    indptr = np.zeros(B + 1, dtype=np.int32)
    indptr[1:] = np.cumsum(q_lens)
    Ks = [k.astype(np.float64) for k in Ks]
    Vs = [v.astype(np.float64) for v in Vs]
    return q, indptr, pages, bt, np.asarray(kv_lens, dtype=np.int32), Ks, Vs


def reference(q, indptr, Ks, Vs, *, scale=None, causal=True, window_left=-1, soft_cap=0.0,
              alibi=None):
    """float64 paged-attention reference: explicit mask per (row, key)."""
    total_q, H, D = q.shape
    out = np.zeros((total_q, H, D))
    lse = np.full((total_q, H), -np.inf)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    for b in range(len(Ks)):
        K, V = Ks[b], Vs[b]
        n, Hkv = K.shape[0], K.shape[1]
        G = H // Hkv
        lo, hi = indptr[b], indptr[b + 1]
        ql = hi - lo
        qb = q[lo:hi].astype(np.float64)
        i_abs = n - ql + np.arange(ql)
        j = np.arange(n)
        vis = np.ones((ql, n), dtype=bool)
        if causal:
            vis &= j[None, :] <= i_abs[:, None]
        if window_left >= 0:
            vis &= j[None, :] >= i_abs[:, None] - window_left
        for h in range(H):
            g = h // G
            s = qb[:, h] @ K[:, g].T * scale
            if soft_cap > 0:
                s = soft_cap * np.tanh(s / soft_cap)
            if alibi is not None:
                s = s + float(alibi[h]) * (j[None, :] - i_abs[:, None])
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=1, initial=-np.inf)
            ok = np.isfinite(m)
            p = np.where(ok[:, None], np.exp(s - np.where(ok, m, 0)[:, None]), 0.0)
            l = p.sum(axis=1)
            o = p @ V[:, g]
            out[lo:hi, h] = np.where(ok[:, None], o / np.where(ok, l, 1)[:, None], 0.0)
            lse[lo:hi, h] = np.where(ok, m + np.log(np.where(ok, l, 1)), -np.inf)
    return out, lse
