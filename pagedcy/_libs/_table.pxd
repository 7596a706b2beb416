from libc.stdint cimport int32_t
from pagedcy._libs._sync cimport PyThread_type_lock

cdef class PageTable:
    cdef readonly Py_ssize_t page_size
    cdef int32_t *buf        # ring-free deque: entries live in buf[head:head+count]
    cdef Py_ssize_t cap, head, count
    cdef Py_ssize_t _seq_len
    cdef PyThread_type_lock lock

    cdef int c_push(self, int32_t page) except -1 nogil
    cdef Py_ssize_t c_pop_back(self) noexcept nogil
    cdef Py_ssize_t c_pop_front(self) noexcept nogil
    cdef inline int32_t *entries(self) noexcept nogil:
        return self.buf + self.head
    cdef inline Py_ssize_t capacity_tokens(self) noexcept nogil:
        return self.count * self.page_size
