"""PageTable: logical page → physical page mapping of one sequence."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memmove
from cpython.mem cimport PyMem_RawMalloc, PyMem_RawRealloc, PyMem_RawFree

from pagedcy._libs._sync cimport new_lock, acquire, release, PyThread_free_lock
from pagedcy._libs._pool cimport as_index

cnp.import_array()


cdef class PageTable:
    """Logical-to-physical page mapping for one sequence.

    PageTable(page_size)

    Logical page ``j`` covers tokens ``[j*page_size, (j+1)*page_size)``. Pages are
    kept in a contiguous int32 array with a moving head, so ``push_page``,
    ``pop_page`` and ``pop_front_page`` are all O(1) (amortised) and the live
    entries can be handed to the attention kernel as a block-table row.
    """

    def __cinit__(self, page_size):
        self.lock = new_lock()

    def __init__(self, page_size):
        if self.buf != NULL:
            raise RuntimeError("PageTable is already initialised")
        ps = as_index(page_size, "page_size")
        if ps <= 0 or ps >= 2**31:
            raise ValueError(f"page_size must be a positive integer, got {ps}")
        self.page_size = ps
        self.cap = 8
        self.buf = <int32_t *>PyMem_RawMalloc(self.cap * sizeof(int32_t))
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        PyMem_RawFree(self.buf)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    # -- nogil core ---------------------------------------------------------
    cdef int c_push(self, int32_t page) except -1 nogil:
        cdef int32_t *nb
        if self.head + self.count == self.cap:
            if self.head >= self.count:
                # Enough slack at the front: slide down instead of growing (keeps O(1) amortised).
                memmove(self.buf, self.buf + self.head, self.count * sizeof(int32_t))
                self.head = 0
            else:
                nb = <int32_t *>PyMem_RawRealloc(self.buf, 2 * self.cap * sizeof(int32_t))
                if nb == NULL:
                    with gil:
                        raise MemoryError("cannot grow the page table")
                self.buf = nb
                self.cap *= 2
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
        cdef Py_ssize_t pos = as_index(token_pos, "token_pos")
        acquire(self.lock)
        try:
            if pos < 0 or pos >= self.count * self.page_size:
                raise IndexError(f"token position {pos} is outside the mapped pages "
                                 f"[0, {self.count * self.page_size})")
            return self.buf[self.head + pos // self.page_size], pos % self.page_size
        finally:
            release(self.lock)

    def push_page(self, physical_idx):
        """Map the next logical page to ``physical_idx`` (0 <= physical_idx < 2**31)."""
        cdef Py_ssize_t p = as_index(physical_idx, "physical_idx")
        if p < 0 or p >= 2**31:
            raise ValueError(f"physical page index must be in [0, 2**31), got {p}")
        acquire(self.lock)
        try:
            self.c_push(<int32_t>p)
        finally:
            release(self.lock)

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
        cdef Py_ssize_t v = as_index(n, "n")
        acquire(self.lock)
        try:
            if v < 0 or v > self.count * self.page_size:
                raise ValueError(f"seq_len {v} is outside [0, {self.count * self.page_size}] "
                                 f"(the mapped pages' capacity)")
            self._seq_len = v
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
        self.head = 0
        self.count = 0
        self._seq_len = 0
        release(self.lock)

    def __len__(self):
        return self.count

    def __repr__(self):
        return (f"PageTable(page_size={self.page_size}, num_pages={self.count}, "
                f"seq_len={self._seq_len})")
