from libc.stdint cimport int32_t
from pagedcy._libs._sync cimport PyThread_type_lock

cdef class PagePool:
    cdef readonly Py_ssize_t max_pages
    cdef readonly Py_ssize_t floats_per_page
    cdef readonly Py_ssize_t itemsize
    cdef readonly int dtype_code
    cdef object _dtype
    cdef object _buffer
    cdef char *data
    cdef Py_ssize_t page_bytes
    cdef int32_t *stack
    cdef int32_t *refs
    cdef Py_ssize_t n_free
    cdef PyThread_type_lock lock

    cdef Py_ssize_t c_alloc(self) noexcept nogil
    cdef int c_release(self, Py_ssize_t page) noexcept nogil
    cdef inline char *page_ptr(self, Py_ssize_t page) noexcept nogil:
        return self.data + page * self.page_bytes
    cdef int check_page(self, object page, bint allocated) except -1

cdef Py_ssize_t as_index(object value, str name) except? -1
