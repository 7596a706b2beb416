from pagedcy._libs._sync cimport PyThread_type_lock
from pagedcy._libs._pool cimport PagePool
from pagedcy._libs._table cimport PageTable
from pagedcy._libs._store cimport KVPageStore

cdef class PagedKVCache:
    cdef readonly object config
    cdef KVPageStore store
    cdef PagePool pool       # store.pool; pool and table are private, guarded by lock
    cdef PageTable table
    cdef Py_ssize_t evicted
    cdef bint lru
    cdef bint pending        # append_kv_layer wrote position seq_len and advance() has not run
    cdef PyThread_type_lock lock

    cdef int c_ensure_page(self) noexcept nogil
    cdef int c_reserve(self, Py_ssize_t n_tokens) noexcept nogil
    cdef int c_append(self, Py_ssize_t layer, const float *k, const float *v,
                      Py_ssize_t n, Py_ssize_t src_layer_stride, Py_ssize_t nlayers,
                      bint advance) noexcept nogil
    cdef object exhausted(self)
