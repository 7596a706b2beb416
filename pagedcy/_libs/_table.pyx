"""PageTable: logical page → physical page mapping of one sequence."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memmove
from cpython.mem cimport PyMem_RawMalloc, PyMem_RawRealloc, PyMem_RawFree

from pagedcy._libs._sync cimport new_lock, acquire, release, PyThread_free_lock
from pagedcy._libs._args cimport index_arg, int_arg
from pagedcy import _validate

cnp.import_array()


cdef class PageTable:
    """Logical-to-physical page mapping for one sequence.

    PageTable(page_size)

    Logical page ``j`` covers tokens ``[j*page_size, (j+1)*page_size)``. Pages are
    kept in a contiguous int32 array with a moving head, so ``push_page``,
    ``pop_page`` and ``pop_front_page`` are all O(1) (amortised) and the live
    entries can be handed to the attention kernel as a block-table row.
    """

    def __init__(self, page_size):
        # everything is built in __cinit__; this gives the constructor its signature
        pass

    # Built in __cinit__ so that no PageTable exists without its entries (see PagedKVCache).
    def __cinit__(self, page_size):
        self.lock = new_lock()
        self.page_size = _validate.check_positive(page_size, "page_size", 2**31)
        self.cap = 8
        self.buf = <int32_t *>PyMem_RawMalloc(self.cap * sizeof(int32_t))
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        PyMem_RawFree(self.buf)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    # -- nogil core ---------------------------------------------------------
    cdef int c_reserve(self, Py_ssize_t n) noexcept nogil:
        """Room for ``n`` entries: until count exceeds n, pushes (after any pops) never
        allocate. 0, or -1 when out of memory (nothing changed)."""
        cdef int32_t *nb
        cdef Py_ssize_t new_cap
        # Twice n: a push that finds the end full then has at least n slots free at the front,
        # slides down instead of growing, and the slides cost O(1) amortised.
        if 2 * n <= self.cap:
            return 0
        new_cap = max(2 * self.cap, 2 * n)
        nb = <int32_t *>PyMem_RawRealloc(self.buf, new_cap * sizeof(int32_t))
        if nb == NULL:
            return -1
        self.buf = nb
        self.cap = new_cap
        return 0

    cdef int c_push(self, int32_t page) noexcept nogil:
        """Append an entry: 0, or -1 when out of memory (nothing changed)."""
        if self.head + self.count == self.cap:
            if self.c_reserve(self.count + 1) < 0:
                return -1
            if self.head + self.count == self.cap:
                memmove(self.buf, self.buf + self.head, self.count * sizeof(int32_t))
                self.head = 0
        self.buf[self.head + self.count] = page
        self.count += 1
        return 0

    cdef Py_ssize_t c_pop_back(self) noexcept nogil:
        if self.count == 0:
            return -1
        self.count -= 1
        cdef Py_ssize_t p = self.buf[self.head + self.count]
        if self._seq_len > self.count * self.page_size:
            self._seq_len = self.count * self.page_size
        return p

    cdef Py_ssize_t c_pop_front(self) noexcept nogil:
        if self.count == 0:
            return -1
        cdef Py_ssize_t p = self.buf[self.head]
        self.head += 1
        self.count -= 1
        if self.count == 0:
            self.head = 0
        if self._seq_len > self.count * self.page_size:
            self._seq_len = self.count * self.page_size
        return p

    cdef int c_set_seq_len(self, Py_ssize_t n) noexcept nogil:
        """Set the token count: 0, or -1 (nothing changed) unless 0 <= n <= capacity."""
        if n < 0 or n > self.count * self.page_size:
            return -1
        self._seq_len = n
        return 0

    cdef void c_clear(self) noexcept nogil:
        self.head = 0
        self.count = 0
        self._seq_len = 0

    # -- Python API ---------------------------------------------------------
    def num_pages(self):
        """Number of logical pages mapped."""
        return self.count

    def seq_len(self):
        """Number of valid tokens tracked by this table."""
        return self._seq_len

    def capacity(self):
        """Tokens the mapped pages can hold: ``num_pages() * page_size``."""
        return self.count * self.page_size

    def resolve(self, token_pos):
        """Map a token position to ``(physical_page, offset)``.

        Raises IndexError when ``token_pos`` is negative or past the mapped pages.
        """
        pos = int_arg(token_pos, "token_pos")
        cdef Py_ssize_t p
        acquire(self.lock)
        try:
            p = index_arg(pos, self.count * self.page_size, "token position")
            return self.buf[self.head + p // self.page_size], p % self.page_size
        finally:
            release(self.lock)

    def push_page(self, physical_idx):
        """Map the next logical page to ``physical_idx`` (0 <= physical_idx < 2**31)."""
        cdef Py_ssize_t p = _validate.check_count(physical_idx, "physical_idx", 2**31 - 1)
        cdef int rc
        acquire(self.lock)
        rc = self.c_push(<int32_t>p)
        release(self.lock)
        if rc < 0:
            raise MemoryError("cannot grow the page table")

    def pop_page(self):
        """Remove the last page: its physical index, or None if empty. Clamps seq_len."""
        acquire(self.lock)
        p = self.c_pop_back()
        release(self.lock)
        return None if p < 0 else p

    def pop_front_page(self):
        """Remove the first (oldest) page: its physical index, or None if empty. Clamps seq_len."""
        acquire(self.lock)
        p = self.c_pop_front()
        release(self.lock)
        return None if p < 0 else p

    def set_seq_len(self, n):
        """Set the token count; ValueError unless ``0 <= n <= capacity()``."""
        v = int_arg(n, "n")
        acquire(self.lock)
        try:
            if v < 0 or v > self.count * self.page_size:
                raise ValueError(f"seq_len {v} is outside [0, {self.count * self.page_size}] "
                                 f"(the mapped pages' capacity)")
            self.c_set_seq_len(v)
        finally:
            release(self.lock)

    def physical_pages(self):
        """Physical page indices in logical order, as a new int32 array."""
        acquire(self.lock)
        try:
            out = np.empty(self.count, dtype=np.int32)
            if self.count:
                memcpy(cnp.PyArray_DATA(out), self.buf + self.head, self.count * sizeof(int32_t))
        finally:
            release(self.lock)
        return out

    def clear(self):
        """Drop all mappings and set seq_len to 0 (does not free pages in any pool)."""
        acquire(self.lock)
        self.c_clear()
        release(self.lock)

    def __len__(self):
        return self.count

    def __repr__(self):
        return (f"PageTable(page_size={self.page_size}, num_pages={self.count}, "
                f"seq_len={self._seq_len})")
