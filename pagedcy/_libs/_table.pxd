from libc.stdint cimport int32_t
from pagedcy._libs._sync cimport PyThread_type_lock

cdef class PageTable:
    cdef readonly Py_ssize_t page_size
    cdef int32_t *buf        # entries live in buf[head:head+count], no wrap-around
    cdef Py_ssize_t cap, head, count
    cdef Py_ssize_t _seq_len
    cdef PyThread_type_lock lock

    # The nogil core takes no lock: the Python API below holds the table's own lock around
    # it; an owner that keeps a table private (PagedKVCache) holds its own lock instead.
    cdef int c_reserve(self, Py_ssize_t n) noexcept nogil
    cdef int c_push(self, int32_t page) noexcept nogil
    cdef Py_ssize_t c_pop_back(self) noexcept nogil
    cdef Py_ssize_t c_pop_front(self) noexcept nogil
    cdef int c_set_seq_len(self, Py_ssize_t n) noexcept nogil
    cdef void c_clear(self) noexcept nogil
    cdef inline int32_t *entries(self) noexcept nogil:
        return self.buf + self.head
    cdef inline Py_ssize_t num_entries(self) noexcept nogil:
        return self.count
    cdef inline Py_ssize_t c_seq_len(self) noexcept nogil:
        return self._seq_len
    cdef inline Py_ssize_t capacity_tokens(self) noexcept nogil:
        return self.count * self.page_size
