"""Hot paths of :mod:`pagedcy.kvcache.manager` that would otherwise loop in Python per sequence.

A decode step touches every running sequence once: it writes one K/V row per sequence
and then needs the batch's padded block table. Doing that with one NumPy call per
sequence costs microseconds each; these helpers do it in one call (the row writes
without the GIL).
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

from pagedcy._libs._store cimport KVPageStore
from pagedcy._libs._args cimport index_arg
from pagedcy import _validate

cnp.import_array()


cdef void c_write_rows(KVPageStore store, const int32_t *pages, const int32_t *offsets,
                       Py_ssize_t n, Py_ssize_t layer, const float *k, const float *v) noexcept nogil:
    """Row i of k/v (kv_dim floats each) into slot offsets[i] of page pages[i]; all checked."""
    cdef Py_ssize_t i, kvd = store.kv_dim
    for i in range(n):
        store.c_write_token(pages[i], layer, offsets[i], k + i * kvd, v + i * kvd)


cdef cnp.ndarray _ids(object x, str name, Py_ssize_t upper):
    # int32 C-contiguous 1-D arrays (what the manager passes) are checked in C; anything
    # else goes through the shared validator, which range-checks before narrowing.
    cdef cnp.ndarray a
    cdef const int32_t *p
    cdef Py_ssize_t i
    if type(x) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>x) == cnp.NPY_INT32 \
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>x) and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
        a = <cnp.ndarray>x
        p = <const int32_t *>cnp.PyArray_DATA(a)
        for i in range(cnp.PyArray_SIZE(a)):
            if p[i] < 0 or p[i] >= upper:
                break
        else:
            return a
    return _validate.index_array(x, name, upper)


def write_token_rows(KVPageStore store not None, pages, offsets, layer, keys, values):
    """Write row ``i`` of ``keys``/``values`` (``[n, kv_dim]`` or ``[n, num_kv_heads,
    head_dim]``, float; float32 C-contiguous is used in place) into slot ``offsets[i]``
    of page ``pages[i]`` of ``layer`` -- one token for each of ``n`` sequences, in one
    GIL-free loop.

    pages, offsets: integer ``[n]`` (int32 C-contiguous is used in place). Raises
    IndexError for a page, offset or layer out of range, ValueError for shapes and
    TypeError for dtypes; nothing is written then.
    """
    cdef Py_ssize_t L = index_arg(layer, store.num_layers, "layer")
    cdef cnp.ndarray p = _ids(pages, "pages", store.pool.max_pages)
    cdef cnp.ndarray o = _ids(offsets, "offsets", store.page_size)
    if p.ndim != 1 or o.ndim != 1 or o.shape[0] != p.shape[0]:
        raise ValueError(f"pages and offsets must be 1-D of the same length, got shapes "
                         f"{(<object>p).shape} and {(<object>o).shape}")
    cdef Py_ssize_t n = p.shape[0]
    cdef cnp.ndarray k = store.rows(keys, "keys", n)
    cdef cnp.ndarray v = store.rows(values, "values", n)
    cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(p)
    cdef const int32_t *op = <const int32_t *>cnp.PyArray_DATA(o)
    cdef const float *kp = <const float *>cnp.PyArray_DATA(k)
    cdef const float *vp = <const float *>cnp.PyArray_DATA(v)
    with nogil:
        c_write_rows(store, pp, op, n, L, kp, vp)


def build_block_table(list tables not None, width):
    """Stack per-sequence int32 block tables (1-D, C-contiguous, length <= ``width``)
    into a zero-padded int32 ``[len(tables), width]`` array for the attention kernel.
    Padding is page 0, which the kernel never reads past a row's ``kv_len``."""
    cdef Py_ssize_t b, n, B = len(tables)
    cdef Py_ssize_t W = _validate.check_count(width, "width", 2**31 - 1)
    out = np.zeros((B, W), dtype=np.int32)
    cdef int32_t *dst = <int32_t *>cnp.PyArray_DATA(out)
    cdef cnp.ndarray t
    for b in range(B):
        t = <cnp.ndarray?>tables[b]
        if (cnp.PyArray_TYPE(t) != cnp.NPY_INT32 or not cnp.PyArray_ISNOTSWAPPED(t)
                or not cnp.PyArray_IS_C_CONTIGUOUS(t) or t.ndim != 1):
            raise TypeError("block tables must be 1-D C-contiguous int32 arrays in native byte order")
        n = t.shape[0]
        if n > W:
            raise ValueError(f"block table {b} has {n} entries, more than width {W}")
        if n:
            memcpy(dst + b * W, cnp.PyArray_DATA(t), n * sizeof(int32_t))
    return out
