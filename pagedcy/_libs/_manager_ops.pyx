"""Hot paths of :mod:`pagedcy.serving.manager` that would otherwise loop in Python per sequence.

A decode step touches every running sequence once: it writes one K/V row per sequence
and then needs the batch's padded block table. Doing that with one NumPy call per
sequence costs microseconds each; these helpers do it in one call (the row writes
without the GIL).
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

from pagedcy._libs._store cimport KVPageStore, pagedcy_kv_store

cnp.import_array()


def write_token_rows(KVPageStore store, pages, offsets, layer, keys, values):
    """Write row ``i`` of ``keys``/``values`` (float32 ``[n, kv_dim]``, C-contiguous) into
    slot ``offsets[i]`` of page ``pages[i]`` of ``layer`` -- one token for each of ``n``
    sequences, in one GIL-free loop.

    pages, offsets: int32 ``[n]``. Raises IndexError for a page, offset or layer out of
    range and ValueError/TypeError for shapes/dtypes; nothing is written then.
    """
    cdef cnp.ndarray p = np.ascontiguousarray(pages, dtype=np.int32)
    cdef cnp.ndarray o = np.ascontiguousarray(offsets, dtype=np.int32)
    cdef cnp.ndarray k = np.ascontiguousarray(keys, dtype=np.float32)
    cdef cnp.ndarray v = np.ascontiguousarray(values, dtype=np.float32)
    cdef Py_ssize_t n = p.shape[0], i, kvd = store.kv_dim
    cdef Py_ssize_t L = layer
    if p.ndim != 1 or o.ndim != 1 or o.shape[0] != n:
        raise ValueError("pages and offsets must be 1-D of the same length")
    if k.ndim != 2 or v.ndim != 2 or k.shape[0] != n or v.shape[0] != n \
            or k.shape[1] != kvd or v.shape[1] != kvd:
        raise ValueError(f"keys/values must be [{n}, {kvd}]")
    if L < 0 or L >= store.num_layers:
        raise IndexError(f"layer {L} out of range [0, {store.num_layers})")
    cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(p)
    cdef const int32_t *op = <const int32_t *>cnp.PyArray_DATA(o)
    cdef const float *kp = <const float *>cnp.PyArray_DATA(k)
    cdef const float *vp = <const float *>cnp.PyArray_DATA(v)
    cdef Py_ssize_t maxp = store.pool.max_pages, ps = store.page_size
    for i in range(n):
        if pp[i] < 0 or pp[i] >= maxp:
            raise IndexError(f"page {pp[i]} out of range [0, {maxp})")
        if op[i] < 0 or op[i] >= ps:
            raise IndexError(f"offset {op[i]} out of range [0, {ps})")
    cdef int code = store.pool.dtype_code
    with nogil:
        for i in range(n):
            pagedcy_kv_store(code, store.row_ptr(pp[i], L, 0, op[i]), kp + i * kvd, kvd, store.head_dim)
            pagedcy_kv_store(code, store.row_ptr(pp[i], L, 1, op[i]), vp + i * kvd, kvd, store.head_dim)


def build_block_table(list tables, Py_ssize_t width):
    """Stack per-sequence int32 block tables (1-D, C-contiguous, length <= ``width``)
    into a zero-padded int32 ``[len(tables), width]`` array for the attention kernel.
    Padding is page 0, which the kernel never reads past a row's ``kv_len``."""
    cdef Py_ssize_t b, n, B = len(tables)
    out = np.zeros((B, width), dtype=np.int32)
    cdef int32_t *dst = <int32_t *>cnp.PyArray_DATA(out)
    cdef cnp.ndarray t
    for b in range(B):
        t = <cnp.ndarray?>tables[b]
        if cnp.PyArray_TYPE(t) != cnp.NPY_INT32 or not cnp.PyArray_IS_C_CONTIGUOUS(t) or t.ndim != 1:
            raise TypeError("block tables must be 1-D C-contiguous int32 arrays")
        n = t.shape[0]
        if n > width:
            raise ValueError(f"block table {b} has {n} entries, more than width {width}")
        if n:
            memcpy(dst + b * width, cnp.PyArray_DATA(t), n * sizeof(int32_t))
    return out
