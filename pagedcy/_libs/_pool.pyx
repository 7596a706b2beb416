"""PagePool: one contiguous page buffer with a LIFO free list and reference counts."""
import operator

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, uintptr_t
from libc.string cimport memcpy
from cpython.mem cimport PyMem_Malloc, PyMem_Free

from pagedcy._libs._sync cimport new_lock, acquire, release, PyThread_free_lock
from pagedcy import dtypes as _dtypes

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
    cdef Py_ssize_t n = as_index(nbytes, "nbytes"), offset
    if n < 0:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    raw = np.zeros(n + ALIGN, dtype=np.uint8)
    # Unsigned arithmetic: with cdivision a negative operand would give a negative offset.
    offset = <Py_ssize_t>((ALIGN - (<uintptr_t>cnp.PyArray_DATA(raw)) % ALIGN) % ALIGN)
    return raw[offset:offset + n]


cdef Py_ssize_t as_index(object value, str name) except? -1:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    except OverflowError:
        raise IndexError(f"{name} {value} is out of range") from None


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

    Raises ValueError for non-positive sizes, TypeError for a bad dtype/buffer.
    """

    def __cinit__(self, max_pages, floats_per_page, dtype="float32", buffer=None):
        self.lock = new_lock()

    def __init__(self, max_pages, floats_per_page, dtype="float32", buffer=None):
        cdef Py_ssize_t i, nbytes
        if self.stack != NULL:
            raise RuntimeError("PagePool is already initialised")
        mp = as_index(max_pages, "max_pages")
        fpp = as_index(floats_per_page, "floats_per_page")
        if mp <= 0 or mp >= 2**31:
            raise ValueError(f"max_pages must be in [1, 2**31), got {mp}")
        if fpp <= 0 or fpp >= 2**40:
            raise ValueError(f"floats_per_page must be in [1, 2**40), got {fpp}")
        name = _dtypes.normalize_dtype(dtype) if not (isinstance(dtype, np.dtype) and dtype == np.uint16) else "bfloat16"
        self.dtype_code = _dtypes.DTYPE_CODES[name]
        self._dtype = _dtypes.storage_dtype(name)
        self.itemsize = _dtypes.itemsize(name)
        if mp * fpp * self.itemsize >= 2**46:
            raise ValueError("pool too large")
        self.max_pages = mp
        self.floats_per_page = fpp
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
            except (TypeError, ValueError) as e:
                raise TypeError(f"buffer must be a writable contiguous buffer: {e}") from None
            if not view.flags.c_contiguous or not view.flags.writeable:
                raise TypeError("buffer must be writable and C-contiguous")
            if view.shape[0] < nbytes:
                raise ValueError(f"buffer holds {view.shape[0]} bytes, the pool needs {nbytes}")
            self._buffer = view[:nbytes]
        self.data = <char *>cnp.PyArray_DATA(self._buffer)
        self.stack = <int32_t *>PyMem_Malloc(mp * sizeof(int32_t))
        self.refs = <int32_t *>PyMem_Malloc(mp * sizeof(int32_t))
        if self.stack == NULL or self.refs == NULL:
            raise MemoryError("cannot allocate the free list")
        for i in range(mp):
            self.stack[i] = <int32_t>(mp - 1 - i)
            self.refs[i] = 0
        self.n_free = mp

    def __dealloc__(self):
        PyMem_Free(self.stack)
        PyMem_Free(self.refs)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    # -- nogil core ---------------------------------------------------------
    cdef Py_ssize_t c_alloc(self) noexcept nogil:
        """Pop a free page (refcount 1) or return -1 when exhausted."""
        if self.n_free == 0:
            return -1
        self.n_free -= 1
        cdef Py_ssize_t p = self.stack[self.n_free]
        self.refs[p] = 1
        return p

    cdef int c_release(self, Py_ssize_t page) noexcept nogil:
        """Drop one reference; 1 if the page went back to the free list, 0 if still shared.
        The caller has checked that the page is allocated."""
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.stack[self.n_free] = <int32_t>page
            self.n_free += 1
            return 1
        return 0

    cdef int check_page(self, object page, bint allocated) except -1:
        cdef Py_ssize_t p = as_index(page, "page")
        if p < 0 or p >= self.max_pages:
            raise IndexError(f"page {p} out of range [0, {self.max_pages})")
        if allocated and self.refs[p] == 0:
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
        return None if p < 0 else p

    def alloc_many(self, n):
        """Take ``n`` pages at once (int32 array), or None and no change if fewer are free."""
        cdef Py_ssize_t i, k = as_index(n, "n")
        if k < 0:
            raise ValueError(f"n must be >= 0, got {k}")
        if k > self.max_pages:
            return None
        out = np.empty(k, dtype=np.int32)
        cdef int32_t[::1] o = out
        acquire(self.lock)
        try:
            if k > self.n_free:
                return None
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
        acquire(self.lock)
        try:
            self.check_page(page, True)
            self.c_release(page)
        finally:
            release(self.lock)

    def incref(self, page):
        """Add a reference to an allocated page (shared by another owner)."""
        acquire(self.lock)
        try:
            self.check_page(page, True)
            self.refs[<Py_ssize_t>page] += 1
        finally:
            release(self.lock)

    def ref_count(self, page):
        """Number of references held on ``page`` (0 when free)."""
        self.check_page(page, False)
        return self.refs[<Py_ssize_t>page]

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
        acquire(self.lock)
        try:
            out = np.empty(self.n_free, dtype=np.int32)
            if self.n_free:
                memcpy(cnp.PyArray_DATA(out), self.stack, self.n_free * sizeof(int32_t))
        finally:
            release(self.lock)
        return out

    def ref_counts(self):
        """Reference count of every page as an int32 array of length ``max_pages``."""
        out = np.empty(self.max_pages, dtype=np.int32)
        memcpy(cnp.PyArray_DATA(out), self.refs, self.max_pages * sizeof(int32_t))
        return out

    def page_data(self, page):
        """Read-only zero-copy view of one page: 1-D, ``floats_per_page`` values."""
        v = self.page_data_mut(page)
        v.flags.writeable = False
        return v

    def page_data_mut(self, page):
        """Writable zero-copy view of one page: 1-D, ``floats_per_page`` values."""
        self.check_page(page, False)
        cdef Py_ssize_t p = page
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
        self.check_page(src, False)
        self.check_page(dst, False)
        cdef char *s = self.page_ptr(src)
        cdef char *d = self.page_ptr(dst)
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
