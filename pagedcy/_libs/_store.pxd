from libc.stdint cimport int32_t
from pagedcy._libs._pool cimport PagePool

cdef extern from "pagedcy_convert.h" nogil:
    void pagedcy_kv_store(int dtype, void *dst, const float *src, size_t n, size_t head_dim)
    void pagedcy_kv_load(int dtype, float *dst, const void *src, size_t n, size_t head_dim)

cdef class KVPageStore:
    cdef readonly object config
    cdef readonly PagePool pool
    cdef readonly Py_ssize_t num_layers, page_size, num_kv_heads, head_dim, kv_dim
    cdef readonly Py_ssize_t row_elems          # stored elements per token row (int8: + scales)
    cdef Py_ssize_t row_bytes, half_bytes, layer_bytes
    cdef int code

    cdef inline char *row_ptr(self, Py_ssize_t page, Py_ssize_t layer, int which,
                              Py_ssize_t offset) noexcept nogil:
        return (self.pool.page_ptr(page) + layer * self.layer_bytes + which * self.half_bytes
                + offset * self.row_bytes)
    cdef void c_write(self, const int32_t *table, Py_ssize_t layer, Py_ssize_t start,
                      Py_ssize_t n, const float *k, const float *v) noexcept nogil
    cdef void c_read(self, const int32_t *table, Py_ssize_t layer, int which, Py_ssize_t start,
                     Py_ssize_t n, char *dst, bint to_f32) noexcept nogil
    cdef int check_table(self, const int32_t *table, Py_ssize_t npages) except -1
    cdef object rows(self, object x, str name, Py_ssize_t n_rows)

# Copies smaller than this keep the GIL: dropping and retaking it costs more than the copy.
cdef Py_ssize_t NOGIL_BYTES
