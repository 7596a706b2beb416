"""KVPageStore: the page pool plus the KV page layout; every K/V byte moves through here.

Page layout (one page, all layers), by default head-major ("HND"):
``[num_layers, num_kv_heads, 2 (K, V), page_size, head_dim]``: a KV head's K rows of a page,
then its V rows, then the next head's. A decode step reads a sequence's pages head by head, so
it streams each page front to back; the token-major order ("NHD",
``[num_layers, 2, page_size, num_kv_heads, head_dim]``, a C-order array of the logical shape)
puts one head's rows 4 KiB apart at 8 heads of 128 float32, which the hardware prefetchers do
not follow (AMD EPYC Zen 4, 32 x 2048 float32 decode from DRAM: 1.09x faster head-major on
1 thread, 1.07x on 2; the "[NHD pages]" rows of ``python -m pagedcy bench``). ``pages()`` is the logical
``[max_pages, num_layers, 2, page_size, num_kv_heads, head_dim]`` view either way.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t
from libc.string cimport memcpy

from pagedcy._libs._pool cimport PagePool
from pagedcy import _validate
from pagedcy import dtypes as _dtypes
from pagedcy.config import PagedKVCacheConfig

cnp.import_array()

NOGIL_BYTES = 1 << 16

_WHICH = {0: 0, 1: 1, "k": 0, "v": 1, "K": 0, "V": 1}


cdef inline Py_ssize_t _page_run(Py_ssize_t pos, Py_ssize_t left, Py_ssize_t page_size,
                                  Py_ssize_t *off) noexcept nogil:
    """Tokens from ``pos`` to the end of its page, at most ``left``; ``off[0]`` = in-page offset."""
    off[0] = pos % page_size
    return min(page_size - off[0], left)


cdef class KVPageStore:
    """K/V page storage for a :class:`PagedKVCacheConfig` (owns one :class:`PagePool`).

    KVPageStore(config, buffer=None)

    ``buffer`` (optional) backs the pool, e.g. with a ``numpy.memmap`` to spill to disk.
    ``layout``: "HND" (head-major pages, the default and faster for decode) or "NHD"
    (token-major: a C-order ``[max_pages, num_layers, 2, page_size, num_kv_heads, head_dim]``
    buffer).
    Row methods take a block table (int32 physical page ids in logical order) and
    token positions relative to it.
    """

    def __init__(self, config, buffer=None, *, layout="HND"):
        # everything is built in __cinit__; this gives the constructor its signature
        pass

    # Built in __cinit__ so that no KVPageStore exists without its pool (see PagedKVCache).
    def __cinit__(self, config, buffer=None, *, layout="HND"):
        if not isinstance(config, PagedKVCacheConfig):
            raise TypeError(f"config must be a PagedKVCacheConfig, got {type(config).__name__}")
        if layout not in ("HND", "NHD"):
            raise ValueError(f"layout must be 'HND' or 'NHD', got {layout!r}")
        self.config = config
        self.pool = PagePool(config.max_pages, config.floats_per_page(), config.dtype, buffer)
        self.num_layers = config.num_layers
        self.page_size = config.page_size
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.kv_dim = config.kv_dim()
        self.code = self.pool.dtype_code
        self.row_elems = self.num_kv_heads * _dtypes.head_row_elems(config.dtype, self.head_dim)
        self.row_bytes = self.row_elems * self.pool.itemsize
        self.head_bytes = self.row_bytes // self.num_kv_heads
        self.layer_bytes = 2 * self.page_size * self.row_bytes
        self.layout = layout
        if layout == "HND":
            self.tok_stride = self.head_bytes
            self.v_offset = self.page_size * self.head_bytes
            self.head_stride = 2 * self.v_offset
        else:
            self.tok_stride = self.row_bytes
            self.v_offset = self.page_size * self.row_bytes
            self.head_stride = self.head_bytes

    # -- nogil core ---------------------------------------------------------
    cdef void c_write(self, const int32_t *table, Py_ssize_t layer, Py_ssize_t start,
                      Py_ssize_t n, const float *k, const float *v) noexcept nogil:
        """Write n float32 token rows (contiguous, kv_dim each) at positions start.. ."""
        cdef Py_ssize_t i = 0, pos = start, off, run, page, h, hd = self.head_dim
        while i < n:
            run = _page_run(pos, n - i, self.page_size, &off)
            page = table[pos // self.page_size]
            for h in range(self.num_kv_heads):
                pagedcy_kv_store_rows(self.code, self.row_ptr(page, layer, 0, h, off), self.tok_stride,
                                      k + i * self.kv_dim + h * hd, self.kv_dim, run, hd)
                pagedcy_kv_store_rows(self.code, self.row_ptr(page, layer, 1, h, off), self.tok_stride,
                                      v + i * self.kv_dim + h * hd, self.kv_dim, run, hd)
            i += run
            pos += run

    cdef void c_write_token(self, Py_ssize_t page, Py_ssize_t layer, Py_ssize_t offset,
                            const float *k, const float *v) noexcept nogil:
        """One token's K and V rows (kv_dim floats each) into slot ``offset`` of ``page``."""
        cdef Py_ssize_t hd = self.head_dim
        pagedcy_kv_store_rows(self.code, self.row_ptr(page, layer, 0, 0, offset), self.head_stride,
                              k, hd, self.num_kv_heads, hd)
        pagedcy_kv_store_rows(self.code, self.row_ptr(page, layer, 1, 0, offset), self.head_stride,
                              v, hd, self.num_kv_heads, hd)

    cdef void c_read(self, const int32_t *table, Py_ssize_t layer, int which, Py_ssize_t start,
                     Py_ssize_t n, char *dst, bint to_f32) noexcept nogil:
        """Copy n token rows of K (which=0) or V (1) into dst, converting to float32 if asked."""
        cdef Py_ssize_t i = 0, pos = start, off, run, page, h
        cdef Py_ssize_t out_row = self.kv_dim * 4 if to_f32 else self.row_bytes
        cdef Py_ssize_t out_head = self.head_dim * 4 if to_f32 else self.head_bytes
        while i < n:
            run = _page_run(pos, n - i, self.page_size, &off)
            page = table[pos // self.page_size]
            for h in range(self.num_kv_heads):
                pagedcy_kv_load_rows(self.code, dst + i * out_row + h * out_head, out_row,
                                     self.row_ptr(page, layer, which, h, off), self.tok_stride,
                                     run, self.head_dim, to_f32)
            i += run
            pos += run

    cdef int check_table(self, const int32_t *table, Py_ssize_t npages) except -1:
        cdef Py_ssize_t j
        for j in range(npages):
            if table[j] < 0 or table[j] >= self.pool.max_pages:
                raise IndexError(f"block table entry {j} = {table[j]} is not a page of the pool "
                                 f"[0, {self.pool.max_pages})")
        return 0

    cdef object rows(self, object x, str name, Py_ssize_t n_rows):
        """Float32 C-contiguous [n, kv_dim] rows; a zero-cost pass-through for the common case."""
        cdef cnp.ndarray a
        if type(x) is np.ndarray:
            a = <cnp.ndarray>x
            # the type number ignores byte order: a '>f4' array goes the converting way
            if (cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT32 and cnp.PyArray_ISNOTSWAPPED(a)
                    and cnp.PyArray_IS_C_CONTIGUOUS(a)
                    and cnp.PyArray_SIZE(a) == n_rows * self.kv_dim and n_rows >= 0
                    and ((a.ndim == 1 and n_rows == 1)
                         or (a.ndim == 2 and a.shape[0] == n_rows and a.shape[1] == self.kv_dim))):
                return a
        return _validate.as_f32_rows(x, name, self.num_kv_heads, self.head_dim,
                                     n_rows if n_rows >= 0 else None)

    # -- Python API ---------------------------------------------------------
    def pages(self):
        """All pages as a writable zero-copy array
        ``[max_pages, num_layers, 2, page_size, num_kv_heads, head_dim]`` of the storage dtype
        (int8: last axis ``head_dim + 4``, each head row's values then its float32 scale).
        Head-major stores ("HND") give a strided view (rows contiguous, not C-contiguous);
        ``batch_paged_attention`` reads it as it is."""
        cdef Py_ssize_t hd = self.row_elems // self.num_kv_heads
        if self.layout == "NHD":
            return self.pool.as_array((self.pool.max_pages, self.num_layers, 2, self.page_size,
                                       self.num_kv_heads, hd))
        return self.pool.as_array((self.pool.max_pages, self.num_layers, self.num_kv_heads, 2,
                                   self.page_size, hd)).transpose(0, 1, 3, 4, 2, 5)

    def _table(self, block_table, Py_ssize_t npages):
        bt = np.asarray(block_table)
        if bt.ndim != 1 or bt.dtype.kind not in "iu":
            raise TypeError("block_table must be a 1-D integer array")
        if bt.shape[0] < npages:
            raise ValueError(f"block table has {bt.shape[0]} pages, {npages} are needed")
        bt = bt[:npages]
        if bt.dtype != np.int32:
            # Range-checked before narrowing, or 2**32 + 1 would silently become page 1.
            return _validate.index_array(bt, "block table", self.pool.max_pages)
        bt = np.ascontiguousarray(bt)
        if npages:
            self.check_table(<const int32_t *>cnp.PyArray_DATA(bt), npages)
        return bt

    def write(self, block_table, layer, start, keys, values):
        """Write token rows ``keys``/``values`` (``[n, kv_dim]`` or ``[n, num_kv_heads, head_dim]``,
        float) of ``layer`` at positions ``start .. start+n`` of the sequence mapped by
        ``block_table`` (int32 page ids). Errors: IndexError (layer, page ids), ValueError
        (shapes, positions past the table), TypeError (dtypes)."""
        cdef Py_ssize_t L = _validate.check_index(layer, self.num_layers, "layer")
        cdef Py_ssize_t s = _validate.check_count(start, "start", 2**40)
        k = self.rows(keys, "keys", -1)
        v = self.rows(values, "values", k.shape[0])
        cdef Py_ssize_t n = k.shape[0]
        if n == 0:
            return
        bt = self._table(block_table, (s + n + self.page_size - 1) // self.page_size)
        cdef const int32_t *t = <const int32_t *>cnp.PyArray_DATA(bt)
        cdef const float *kp = <const float *>cnp.PyArray_DATA(k)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(v)
        if n * self.row_bytes >= NOGIL_BYTES:
            with nogil:
                self.c_write(t, L, s, n, kp, vp)
        else:
            self.c_write(t, L, s, n, kp, vp)

    def read(self, block_table, layer, which, start, n, out=None, float32=False):
        """Read ``n`` token rows of K (``which`` 0/'k') or V (1/'v') of ``layer`` from
        ``start`` into ``out`` (``[n, kv_dim]`` float32 when ``float32``, int8 dequantized;
        else the stored rows, ``[n, row_elems]`` of the storage dtype, ``row_elems == kv_dim``
        except for int8) or a new array; returns it."""
        cdef Py_ssize_t L = _validate.check_index(layer, self.num_layers, "layer")
        if isinstance(which, bool) or which not in _WHICH:
            raise ValueError(f"which must be 'k' or 'v', got {which!r}")
        cdef int w = _WHICH[which]
        cdef Py_ssize_t s = _validate.check_count(start, "start", 2**40)
        cdef Py_ssize_t cnt = _validate.check_count(n, "n")
        dt = np.dtype(np.float32) if float32 else self.pool.dtype
        cdef Py_ssize_t width = self.kv_dim if float32 else self.row_elems
        if out is not None:
            _validate.check_out(out, (cnt, width), dt)
        # The table bounds n before anything is allocated: a huge n with a short
        # table is a ValueError, not an attempt to allocate terabytes.
        bt = self._table(block_table, (s + cnt + self.page_size - 1) // self.page_size) if cnt else None
        if out is None:
            out = np.empty((cnt, width), dtype=dt)
        if cnt == 0:
            return out
        cdef const int32_t *t = <const int32_t *>cnp.PyArray_DATA(bt)
        cdef char *dst = <char *>cnp.PyArray_DATA(out)
        cdef bint f32 = float32
        if cnt * self.row_bytes >= NOGIL_BYTES:
            with nogil:
                self.c_read(t, L, w, s, cnt, dst, f32)
        else:
            self.c_read(t, L, w, s, cnt, dst, f32)
        return out

    def copy_pages_from(self, KVPageStore src not None, src_pages, dst_pages):
        """Copy whole pages ``src.pool[src_pages[i]]`` into ``self.pool[dst_pages[i]]``.
        Both stores must share the same config geometry and dtype."""
        if (src.pool.page_bytes != self.pool.page_bytes or src.code != self.code
                or src.layout != self.layout or src.row_bytes != self.row_bytes):
            raise ValueError("stores have different page geometry, layout or dtype")
        s = _validate.index_array(src_pages, "src_pages", src.pool.max_pages).reshape(-1)
        d = _validate.index_array(dst_pages, "dst_pages", self.pool.max_pages).reshape(-1)
        if s.shape[0] != d.shape[0]:
            raise ValueError("src_pages and dst_pages differ in length")
        cdef const int32_t[::1] sv = s
        cdef const int32_t[::1] dv = d
        cdef Py_ssize_t i, nb = self.pool.page_bytes, cnt = s.shape[0]
        with nogil:
            for i in range(cnt):
                memcpy(self.pool.page_ptr(dv[i]), src.pool.page_ptr(sv[i]), nb)
