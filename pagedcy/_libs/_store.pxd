from libc.stdint cimport int32_t, int64_t
from pagedcy._libs._pool cimport PagePool

cdef extern from "pagedcy_convert.h" nogil:
    void pagedcy_kv_store(int dtype, void *dst, const float *src, size_t n, size_t head_dim)
    void pagedcy_kv_load(int dtype, float *dst, const void *src, size_t n, size_t head_dim)
    void pagedcy_kv_store_rows(int dtype, char *dst, int64_t dst_stride, const float *src,
                               int64_t src_stride, int64_t nrows, size_t head_dim)
    void pagedcy_kv_load_rows(int dtype, char *dst, int64_t dst_stride, const char *src,
                              int64_t src_stride, int64_t nrows, size_t head_dim, int to_f32)

cdef class KVPageStore:
    cdef readonly object config
    cdef readonly PagePool pool
    cdef readonly Py_ssize_t num_layers, page_size, num_kv_heads, head_dim, kv_dim
    cdef readonly Py_ssize_t row_elems          # stored elements per token row (int8: + scales)
    cdef readonly str layout                    # "HND" (head-major pages) or "NHD"
    cdef Py_ssize_t row_bytes, head_bytes, layer_bytes
    # byte strides inside a layer of a page: token to token, K to V, head to head
    cdef Py_ssize_t tok_stride, v_offset, head_stride
    cdef int code

    cdef inline char *row_ptr(self, Py_ssize_t page, Py_ssize_t layer, int which,
                              Py_ssize_t head, Py_ssize_t offset) noexcept nogil:
        """The stored (token ``offset``, KV head ``head``) row of K (which 0) or V (1)."""
        return (self.pool.page_ptr(page) + layer * self.layer_bytes + which * self.v_offset
                + head * self.head_stride + offset * self.tok_stride)
    cdef void c_write_token(self, Py_ssize_t page, Py_ssize_t layer, Py_ssize_t offset,
                            const float *k, const float *v) noexcept nogil
    cdef void c_write(self, const int32_t *table, Py_ssize_t layer, Py_ssize_t start,
                      Py_ssize_t n, const float *k, const float *v) noexcept nogil
    cdef void c_read(self, const int32_t *table, Py_ssize_t layer, int which, Py_ssize_t start,
                     Py_ssize_t n, char *dst, bint to_f32) noexcept nogil
    cdef int check_table(self, const int32_t *table, Py_ssize_t npages) except -1
    cdef object rows(self, object x, str name, Py_ssize_t n_rows)

# Copies smaller than this keep the GIL: dropping and retaking it costs more than the copy.
cdef Py_ssize_t NOGIL_BYTES
