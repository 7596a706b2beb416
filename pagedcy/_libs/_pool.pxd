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
    # The free list is pages [fresh, max_pages) in descending order (never handed out, so
    # never stored anywhere), topped by the stack of freed pages stack[0:n_free - (max_pages -
    # fresh)]. stack and refs hold cap >= fresh entries and grow with fresh, never with
    # max_pages: construction is O(1) and a page nobody took costs nothing.
    cdef int32_t *stack
    cdef int32_t *refs       # refs[p] for p < fresh; pages >= fresh have 0 references
    cdef Py_ssize_t cap, fresh
    cdef Py_ssize_t n_free
    cdef PyThread_type_lock lock

    cdef int c_reserve(self, Py_ssize_t n) noexcept nogil
    cdef Py_ssize_t c_alloc(self) noexcept nogil
    cdef int c_release(self, Py_ssize_t page) noexcept nogil
    cdef inline int32_t c_ref(self, Py_ssize_t page) noexcept nogil:
        return self.refs[page] if page < self.fresh else 0
    cdef inline char *page_ptr(self, Py_ssize_t page) noexcept nogil:
        return self.data + page * self.page_bytes
    cdef Py_ssize_t check_page(self, object page) except -1
    cdef int check_allocated(self, Py_ssize_t p) except -1
