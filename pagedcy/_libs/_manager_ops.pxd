from libc.stdint cimport int32_t
from pagedcy._libs._store cimport KVPageStore

# The nogil core of write_token_rows: row i of k/v (store.kv_dim floats each) into slot
# offsets[i] of page pages[i] of layer. Trusts its input: pages, offsets and layer are
# checked by the caller (write_token_rows does, at the Python boundary).
cdef void c_write_rows(KVPageStore store, const int32_t *pages, const int32_t *offsets,
                       Py_ssize_t n, Py_ssize_t layer, const float *k, const float *v) noexcept nogil
