"""PagePool: one contiguous page buffer with a LIFO free list and reference counts."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, uintptr_t
from libc.string cimport memcpy
from cpython.mem cimport PyMem_RawRealloc, PyMem_RawFree

from pagedcy._libs._sync cimport new_lock, acquire, release, PyThread_free_lock
from pagedcy._libs._args cimport index_arg
from pagedcy import _validate, dtypes as _dtypes

cnp.import_array()

# Pools start on a 4 KiB boundary, so every K/V token row of a power-of-two
# size sits inside one 4 KiB page: the hardware prefetchers stop at 4 KiB page
# edges, and rows that straddle them cost decode time (measured with the
# headline decode, 2 threads: a pool 64 bytes past a 4 KiB edge, where the old
# 64-byte alignment left it, was 5% slower in float32 and 8% in float16).
PAGE_ALIGN = 4096
cdef Py_ssize_t ALIGN = PAGE_ALIGN


def aligned_zeros(nbytes):
    """Zero-filled ``uint8`` array of ``nbytes`` bytes starting on a 4 KiB boundary.

    The allocation PagePool uses for its own buffer; views of it
    (``.view(dtype).reshape(shape)``) make page arrays laid out as the pool's.
    Memory is mapped lazily, so untouched pages cost nothing.
    """
    cdef Py_ssize_t n = _validate.check_count(nbytes, "nbytes"), offset
    raw = np.zeros(n + ALIGN, dtype=np.uint8)
    # Unsigned arithmetic: with cdivision a negative operand would give a negative offset.
    offset = <Py_ssize_t>((ALIGN - (<uintptr_t>cnp.PyArray_DATA(raw)) % ALIGN) % ALIGN)
    return raw[offset:offset + n]


cdef class PagePool:
    """Fixed-size slab of KV pages with a LIFO free list.

    PagePool(max_pages, floats_per_page, dtype="float32", buffer=None)

    All pages live in one contiguous, 4 KiB-aligned buffer of
    ``max_pages * floats_per_page`` values of ``dtype`` (float32, float16 or
    bfloat16). A fresh pool hands out pages 0, 1, 2, ...; freed pages are reused
    last-in first-out. Each allocated page carries a reference count (1 after
    ``alloc``; ``incref`` shares it, ``free`` drops one reference and returns the
    page to the free list at zero).

    ``buffer`` may be any writable C-contiguous buffer of at least the pool's
    size in bytes (e.g. a ``numpy.memmap`` for a pool that spills to disk).

    Construction costs the same for any ``max_pages``: the free list and reference
    counts grow with the pages handed out.

    Raises TypeError for non-integer sizes and a bad dtype/buffer, ValueError for
    sizes out of range.
    """

    def __init__(self, max_pages, floats_per_page, dtype="float32", buffer=None):
        # everything is built in __cinit__; this gives the constructor its signature
        pass

    # Built in __cinit__ so that no PagePool exists without its buffer (see PagedKVCache).
    def __cinit__(self, max_pages, floats_per_page, dtype="float32", buffer=None):
        cdef Py_ssize_t nbytes
        self.lock = new_lock()
        mp = _validate.check_positive(max_pages, "max_pages", 2**31)
        fpp = _validate.check_positive(floats_per_page, "floats_per_page", 2**40)
        name = _dtypes.normalize_dtype(dtype) if not (isinstance(dtype, np.dtype) and dtype == np.uint16) else "bfloat16"
        self.dtype_code = _dtypes.DTYPE_CODES[name]
        self._dtype = _dtypes.storage_dtype(name)
        self.itemsize = _dtypes.itemsize(name)
        if mp * fpp * self.itemsize >= 2**46:
            raise ValueError("pool too large")
        self.page_bytes = fpp * self.itemsize
        nbytes = mp * self.page_bytes
        if buffer is None:
            self._buffer = aligned_zeros(nbytes)
        else:
            if isinstance(buffer, np.ndarray) and not buffer.flags.c_contiguous:
                raise TypeError("buffer must be C-contiguous")
            try:
                view = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) \
                    else buffer.reshape(-1).view(np.uint8)
            except (TypeError, ValueError, BufferError) as e:
                raise TypeError(f"buffer must be a writable contiguous buffer: {e}") from None
            if not view.flags.c_contiguous or not view.flags.writeable:
                raise TypeError("buffer must be writable and C-contiguous")
            if view.shape[0] < nbytes:
                raise ValueError(f"buffer holds {view.shape[0]} bytes, the pool needs {nbytes}")
            self._buffer = view[:nbytes]
        self.data = <char *>cnp.PyArray_DATA(self._buffer)
        self.max_pages = mp
        self.floats_per_page = fpp
        self.n_free = mp

    def __dealloc__(self):
        PyMem_RawFree(self.stack)
        PyMem_RawFree(self.refs)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    # -- nogil core ---------------------------------------------------------
    cdef int c_reserve(self, Py_ssize_t n) noexcept nogil:
        """Make the next ``n`` allocations need no memory: 0, or -1 when out of memory
        (nothing changed). Raw allocator: callers may hold no GIL."""
        cdef Py_ssize_t recycled = self.n_free - (self.max_pages - self.fresh)
        cdef Py_ssize_t need = self.fresh + min(max(n - recycled, 0), self.max_pages - self.fresh)
        cdef Py_ssize_t new_cap
        cdef int32_t *p
        if need <= self.cap:
            return 0
        new_cap = min(max(need, 2 * self.cap, 16), self.max_pages)
        p = <int32_t *>PyMem_RawRealloc(self.stack, new_cap * sizeof(int32_t))
        if p == NULL:
            return -1
        self.stack = p
        # refs past fresh stay unwritten until their page is handed out (c_ref reads 0 there).
        p = <int32_t *>PyMem_RawRealloc(self.refs, new_cap * sizeof(int32_t))
        if p == NULL:
            return -1                 # stack is just larger than cap: harmless
        self.refs = p
        self.cap = new_cap
        return 0

    cdef Py_ssize_t c_alloc(self) noexcept nogil:
        """Pop a free page (refcount 1); -1 when exhausted, -2 out of memory (no change)."""
        cdef Py_ssize_t p, recycled = self.n_free - (self.max_pages - self.fresh)
        if self.n_free == 0:
            return -1
        if recycled > 0:
            p = self.stack[recycled - 1]
        else:
            if self.fresh == self.cap and self.c_reserve(1) < 0:
                return -2
            p = self.fresh
            self.fresh += 1
        self.n_free -= 1
        self.refs[p] = 1
        return p

    cdef int c_release(self, Py_ssize_t page) noexcept nogil:
        """Drop one reference; 1 if the page went back to the free list, 0 if still shared.
        The caller has checked that the page is allocated."""
        self.refs[page] -= 1
        if self.refs[page] == 0:
            # page < fresh, so fewer than fresh pages are recycled: stack has room.
            self.stack[self.n_free - (self.max_pages - self.fresh)] = <int32_t>page
            self.n_free += 1
            return 1
        return 0

    cdef Py_ssize_t check_page(self, object page) except -1:
        """``page`` as an index of this pool (TypeError / IndexError). It may run the
        caller's ``__index__``, so callers convert before they take the lock."""
        return index_arg(page, self.max_pages, "page")

    cdef int check_allocated(self, Py_ssize_t p) except -1:
        """ValueError unless page ``p`` (in range) is allocated; callers hold the lock."""
        if self.c_ref(p) == 0:
            raise ValueError(f"page {p} is not allocated (double free?)")
        return 0

    # -- Python API ---------------------------------------------------------
    @property
    def dtype(self):
        """NumPy dtype of the stored values."""
        return self._dtype

    @property
    def nbytes(self):
        """Size of the page buffer in bytes."""
        return self.max_pages * self.page_bytes

    def alloc(self):
        """Take a free page: its index, or None when the pool is exhausted."""
        cdef Py_ssize_t p
        acquire(self.lock)
        p = self.c_alloc()
        release(self.lock)
        if p == -2:
            raise MemoryError("cannot grow the pool's free list")
        return None if p < 0 else p

    def alloc_many(self, n):
        """Take ``n`` pages at once (int32 array), or None and no change if fewer are free."""
        cdef Py_ssize_t i, k = _validate.check_count(n, "n")
        if k > self.max_pages:
            return None
        out = np.empty(k, dtype=np.int32)
        cdef int32_t[::1] o = out
        acquire(self.lock)
        try:
            if k > self.n_free:
                return None
            if self.c_reserve(k) < 0:
                raise MemoryError("cannot grow the pool's free list")
            for i in range(k):
                o[i] = <int32_t>self.c_alloc()
        finally:
            release(self.lock)
        return out

    def free(self, page):
        """Drop one reference to ``page``; at zero it returns to the free list.

        Raises IndexError if out of range and ValueError if the page is already
        free (double free); the pool is unchanged then.
        """
        cdef Py_ssize_t p = self.check_page(page)
        acquire(self.lock)
        try:
            self.check_allocated(p)
            self.c_release(p)
        finally:
            release(self.lock)

    def incref(self, page):
        """Add a reference to an allocated page (shared by another owner)."""
        cdef Py_ssize_t p = self.check_page(page)
        acquire(self.lock)
        try:
            self.check_allocated(p)
            self.refs[p] += 1
        finally:
            release(self.lock)

    def ref_count(self, page):
        """Number of references held on ``page`` (0 when free)."""
        cdef Py_ssize_t p = self.check_page(page)
        acquire(self.lock)
        try:
            return self.c_ref(p)
        finally:
            release(self.lock)

    def is_free(self, page):
        """True when ``page`` is on the free list."""
        return self.ref_count(page) == 0

    def free_count(self):
        """Number of free pages."""
        return self.n_free

    def allocated_count(self):
        """Number of allocated pages (``max_pages - free_count()``)."""
        return self.max_pages - self.n_free

    def free_list(self):
        """The free list as an int32 array, the next page to be handed out last."""
        cdef Py_ssize_t i, untouched
        cdef int32_t *dst
        acquire(self.lock)
        try:
            out = np.empty(self.n_free, dtype=np.int32)
            dst = <int32_t *>cnp.PyArray_DATA(out)
            untouched = self.max_pages - self.fresh
            for i in range(untouched):
                dst[i] = <int32_t>(self.max_pages - 1 - i)
            if self.n_free > untouched:
                memcpy(dst + untouched, self.stack, (self.n_free - untouched) * sizeof(int32_t))
        finally:
            release(self.lock)
        return out

    def ref_counts(self):
        """Reference count of every page as an int32 array of length ``max_pages``."""
        out = np.zeros(self.max_pages, dtype=np.int32)
        acquire(self.lock)
        if self.fresh:
            memcpy(cnp.PyArray_DATA(out), self.refs, self.fresh * sizeof(int32_t))
        release(self.lock)
        return out

    def page_data(self, page):
        """Read-only zero-copy view of one page: 1-D, ``floats_per_page`` values."""
        v = self.page_data_mut(page)
        v.flags.writeable = False
        return v

    def page_data_mut(self, page):
        """Writable zero-copy view of one page: 1-D, ``floats_per_page`` values."""
        cdef Py_ssize_t p = self.check_page(page)
        return self._buffer[p * self.page_bytes:(p + 1) * self.page_bytes].view(self._dtype)

    def as_array(self, shape=None):
        """The whole buffer as a writable zero-copy array ``[max_pages, floats_per_page]``
        or reshaped to ``shape`` (whose first axis must be max_pages)."""
        arr = self._buffer.view(self._dtype).reshape(self.max_pages, self.floats_per_page)
        if shape is not None:
            arr = arr.reshape(shape)
        return arr

    def copy_page(self, src, dst):
        """Copy the contents of page ``src`` into page ``dst`` (both in range)."""
        cdef char *s = self.page_ptr(self.check_page(src))
        cdef char *d = self.page_ptr(self.check_page(dst))
        cdef Py_ssize_t n = self.page_bytes
        if s != d:
            with nogil:
                memcpy(d, s, n)

    def __len__(self):
        return self.max_pages

    def __repr__(self):
        return (f"PagePool(max_pages={self.max_pages}, floats_per_page={self.floats_per_page}, "
                f"dtype={_dtypes.normalize_dtype(self._dtype) if self._dtype != np.uint16 else 'bfloat16'}, "
                f"free={self.n_free})")
