"""PagedKVCache: a single-sequence paged KV cache with optional sliding-window (LRU) eviction."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t

from pagedcy._libs._sync cimport PyThread_type_lock, new_lock, acquire, release, PyThread_free_lock
from pagedcy._libs._pool cimport PagePool
from pagedcy._libs._table cimport PageTable
from pagedcy._libs._store cimport KVPageStore, NOGIL_BYTES
from pagedcy._libs._args cimport index_arg
from pagedcy import _validate
from pagedcy.config import EvictionPolicy, PagedKVCacheConfig
from pagedcy.errors import PoolExhaustedError

cnp.import_array()


cdef class PagedKVCache:
    """Paged KV cache for one sequence, with on-demand page allocation.

    PagedKVCache(config)

    Tokens are appended layer by layer (``append_kv_layer`` then ``advance``) or in
    bulk (``append_tokens``). When a page is needed and the pool is empty:

    * ``EvictionPolicy.NONE`` raises :class:`PoolExhaustedError` and changes nothing;
    * ``EvictionPolicy.LRU`` drops the oldest page: the cache becomes a sliding
      window, ``seq_len()`` counts the tokens still held, ``gather_*`` return them
      oldest first and ``evicted_tokens()`` says how many were dropped from the front.

    Every method is safe to call from several Python threads.
    """

    def __init__(self, config):
        # everything is built in __cinit__; this gives the constructor its signature
        pass

    # Built in __cinit__, not __init__: an object made by __new__ or by a subclass whose
    # __init__ skips ours would otherwise reach the nogil core with store/table None.
    def __cinit__(self, config):
        self.lock = new_lock()
        if not isinstance(config, PagedKVCacheConfig):
            raise TypeError(f"config must be a PagedKVCacheConfig, got {type(config).__name__}")
        self.config = config
        self.store = KVPageStore(config)
        self.pool = self.store.pool
        self.table = PageTable(config.page_size)
        self.lru = config.eviction == EvictionPolicy.LRU
        self.evicted = 0

    def __dealloc__(self):
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    # -- nogil core: self.lock held; the pool and table are private to this cache --------
    cdef int c_ensure_page(self) noexcept nogil:
        """Make the table's capacity exceed seq_len by mapping one more page, evicting the
        oldest page if the pool is empty and the policy allows.
        0 ok, -1 exhausted, -2 out of memory; nothing changes unless it returns 0."""
        cdef Py_ssize_t p
        if self.table.c_reserve(self.table.num_entries() + 1) < 0:
            return -2                          # now the push below cannot fail
        p = self.pool.c_alloc()
        if p == -2:
            return -2
        if p == -1:
            if not self.lru or self.table.num_entries() == 0:
                return -1
            # The front page is full (pages fill in order), so dropping it drops page_size tokens.
            p = self.table.c_pop_front()
            self.evicted += self.table.page_size
        self.table.c_push(<int32_t>p)
        return 0

    cdef int c_reserve(self, Py_ssize_t n_tokens) noexcept nogil:
        """Allocate now whatever appending n_tokens would need (table and free-list room),
        so the append itself cannot run out of memory half-way: 0, or -2 (no change)."""
        cdef Py_ssize_t ps = self.table.page_size
        cdef Py_ssize_t need = (self.table.c_seq_len() + n_tokens + ps - 1) // ps \
            - self.table.num_entries()
        if need <= 0:
            return 0
        if self.table.c_reserve(min(self.table.num_entries() + need, self.pool.max_pages)) < 0 \
                or self.pool.c_reserve(need) < 0:
            return -2
        return 0

    cdef int c_append(self, Py_ssize_t layer, const float *k, const float *v,
                      Py_ssize_t n, Py_ssize_t src_layer_stride, Py_ssize_t nlayers,
                      bint advance) noexcept nogil:
        """Write n tokens at seq_len for layers [layer, layer+nlayers) (source rows contiguous,
        src_layer_stride floats between layers), mapping pages as needed; seq_len moves
        only when ``advance``. Returns 0, or c_ensure_page's error code."""
        cdef Py_ssize_t ps = self.table.page_size, kvd = self.store.kv_dim
        cdef Py_ssize_t done = 0, run, l, rc, held
        while done < n:
            held = self.table.c_seq_len()
            if held == self.table.capacity_tokens():
                rc = self.c_ensure_page()
                if rc < 0:
                    return rc
                held = self.table.c_seq_len()
            run = self.table.capacity_tokens() - held
            if run > n - done:
                run = n - done
            for l in range(nlayers):
                self.store.c_write(self.table.entries(), layer + l, held, run,
                                   k + l * src_layer_stride + done * kvd,
                                   v + l * src_layer_stride + done * kvd)
            done += run
            if advance:
                self.table.c_set_seq_len(held + run)
        return 0

    cdef object exhausted(self):
        return PoolExhaustedError(
            f"PagePool exhausted ({self.pool.allocated_count()} pages allocated, "
            f"{self.pool.free_count()} free, max_pages={self.pool.max_pages}, eviction=None)")

    # -- Python API ---------------------------------------------------------
    def seq_len(self):
        """Number of tokens held (after eviction, the window's length)."""
        return self.table.c_seq_len()

    def evicted_tokens(self):
        """Tokens dropped from the front by LRU eviction; absolute position = this + index."""
        return self.evicted

    def max_tokens(self):
        """Token capacity of the pool (``config.max_tokens()``)."""
        return self.config.max_tokens()

    def num_pages(self):
        """Pages mapped by this sequence."""
        return self.table.num_entries()

    def free_pages(self):
        """Free pages left in the pool."""
        return self.pool.free_count()

    def page_ids(self):
        """Physical pages of the sequence in logical order (int32 array; a block-table row)."""
        # Under the cache's lock: appends grow the table with only that lock held.
        acquire(self.lock)
        try:
            return self.table.physical_pages()
        finally:
            release(self.lock)

    def free_page_ids(self):
        """The pool's free list (int32 array)."""
        acquire(self.lock)
        try:
            return self.pool.free_list()
        finally:
            release(self.lock)

    def pages(self):
        """The page storage as a zero-copy array
        ``[max_pages, num_layers, 2, page_size, num_kv_heads, head_dim]`` (storage dtype)."""
        return self.store.pages()

    def append_kv_layer(self, layer, k, v):
        """Write one token's K and V (``[kv_dim]`` or ``[num_kv_heads, head_dim]``, float) for
        ``layer`` at position ``seq_len()``; call ``advance()`` after all layers.

        Maps a new page when the position starts one. Raises IndexError (layer),
        TypeError/ValueError (dtype/shape) and PoolExhaustedError (no page, policy NONE);
        the cache is unchanged after any error.
        """
        cdef Py_ssize_t L = index_arg(layer, self.store.num_layers, "layer")
        kk = self.store.rows(k, "k", 1)
        vv = self.store.rows(v, "v", 1)
        cdef const float *kp = <const float *>cnp.PyArray_DATA(kk)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(vv)
        cdef int rc
        acquire(self.lock)
        rc = self.c_append(L, kp, vp, 1, 0, 1, False)
        if rc == 0:
            self.pending = True
        release(self.lock)
        if rc == -1:
            raise self.exhausted()
        if rc == -2:
            raise MemoryError("cannot map a page: out of memory")

    def advance(self):
        """Count the token written by ``append_kv_layer`` (seq_len += 1).

        Raises ValueError unless append_kv_layer wrote a token since the last advance."""
        acquire(self.lock)
        try:
            # pending means append_kv_layer mapped the page position seq_len lives in
            if not self.pending or self.table.c_set_seq_len(self.table.c_seq_len() + 1) < 0:
                raise ValueError("advance() without a token: append_kv_layer() it first")
            self.pending = False
        finally:
            release(self.lock)

    def append_tokens(self, k, v):
        """Append ``n`` tokens to every layer and advance by ``n`` (the prefill path).

        ``k``, ``v``: ``[num_layers, n, kv_dim]`` or ``[num_layers, n, num_kv_heads, head_dim]``
        floats (float32 C-contiguous is copied straight in, with the GIL released).
        Raises PoolExhaustedError with policy NONE when the pool cannot hold them (and
        writes nothing); with LRU the oldest pages are dropped as needed.
        """
        cfg = self.config
        kk = _validate.as_f32_rows(k, "k", cfg.num_kv_heads, cfg.head_dim, None, (cfg.num_layers,))
        vv = _validate.as_f32_rows(v, "v", cfg.num_kv_heads, cfg.head_dim, kk.shape[1],
                                   (cfg.num_layers,))
        cdef Py_ssize_t n = kk.shape[1], need, ps = self.table.page_size
        if n == 0:
            return
        cdef const float *kp = <const float *>cnp.PyArray_DATA(kk)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(vv)
        cdef Py_ssize_t stride = n * self.store.kv_dim, nl = self.store.num_layers
        cdef int rc
        acquire(self.lock)
        try:
            need = (self.table.c_seq_len() + n + ps - 1) // ps - self.table.num_entries()
            if not self.lru and need > self.pool.n_free:
                raise self.exhausted()
            rc = self.c_reserve(n)
            if rc == 0:
                if n * nl * self.store.row_bytes >= NOGIL_BYTES:
                    with nogil:
                        rc = self.c_append(0, kp, vp, n, stride, nl, True)
                else:
                    rc = self.c_append(0, kp, vp, n, stride, nl, True)
                self.pending = False
        finally:
            release(self.lock)
        if rc < 0:        # only c_reserve can fail: c_append then has every page's room
            raise MemoryError(f"cannot map {need} pages: out of memory")

    def _gather(self, layer, int which, dst):
        cdef Py_ssize_t L = index_arg(layer, self.store.num_layers, "layer")
        cdef Py_ssize_t n, kvd = self.store.kv_dim, width
        cdef char *out
        cdef bint f32
        acquire(self.lock)
        try:
            n = self.table.c_seq_len()
            dt = self.pool.dtype
            if dst is None:
                # int8 rows without their scales mean nothing: hand back the values
                dst = np.empty((n, kvd), dtype=np.float32 if dt == np.int8 else dt)
            else:
                if not isinstance(dst, np.ndarray):
                    raise TypeError(f"dst must be a numpy.ndarray, got {type(dst).__name__}")
                if dst.dtype != dt and dst.dtype != np.float32:
                    raise TypeError(f"dst must have dtype {dt} (or float32), got {dst.dtype}")
                # stored int8 rows carry their scales: row_elems, not kv_dim, per token
                width = kvd if dst.dtype == np.float32 else self.store.row_elems
                if dst.shape not in ((n * width,), (n, width)):
                    raise ValueError(f"dst has shape {dst.shape}, expected ({n * width},) or ({n}, {width})")
                if not dst.flags.c_contiguous or not dst.flags.writeable:
                    raise ValueError("dst must be C-contiguous and writable")
            f32 = dst.dtype == np.float32 and dt != np.float32
            out = <char *>cnp.PyArray_DATA(dst)
            if n * self.store.row_bytes >= NOGIL_BYTES:
                with nogil:
                    self.store.c_read(self.table.entries(), L, which, 0, n, out, f32)
            else:
                self.store.c_read(self.table.entries(), L, which, 0, n, out, f32)
        finally:
            release(self.lock)
        return dst

    def gather_k(self, layer, dst=None):
        """K of ``layer`` for the held tokens, oldest first.

        Fills ``dst`` (``[seq_len * kv_dim]`` or ``[seq_len, kv_dim]``, C-contiguous, storage
        dtype or float32) and returns it, or returns a new ``[seq_len, kv_dim]`` array (float32,
        dequantized, for an int8 cache, whose stored rows, ``[seq_len, row_elems]`` int8 with
        each head's scale, an int8 ``dst`` receives)."""
        return self._gather(layer, 0, dst)

    def gather_v(self, layer, dst=None):
        """V of ``layer`` for the held tokens, oldest first (see ``gather_k``)."""
        return self._gather(layer, 1, dst)

    def reset(self):
        """Return every page to the pool and forget the sequence (evicted_tokens back to 0)."""
        cdef Py_ssize_t i
        cdef const int32_t *pages
        acquire(self.lock)
        pages = self.table.entries()
        for i in range(self.table.num_entries()):
            self.pool.c_release(pages[i])
        self.table.c_clear()
        self.evicted = 0
        self.pending = False
        release(self.lock)

    def total_memory_bytes(self):
        """Bytes of the whole pool (capacity, not use)."""
        return self.config.total_bytes()

    def used_memory_bytes(self):
        """Bytes of the pages currently allocated."""
        return self.pool.allocated_count() * self.config.bytes_per_page()

    def attention(self, query, layer, **options):
        """Attention of ``query`` (``[q_len, num_heads, head_dim]`` float32, the last q_len
        held tokens' queries) over the held tokens of ``layer``, reading K/V straight from
        the pages. Options as :func:`pagedcy.batch_paged_attention`. Returns
        ``[q_len, num_heads, head_dim]`` (and the LSE with ``return_lse=True``)."""
        from pagedcy._libs._attention import _plain_options, batch_paged_attention
        q = np.asarray(query)
        if q.ndim == 2:
            q = q[None]
        if q.ndim != 3:
            raise ValueError(f"query must be [q_len, num_heads, head_dim], got shape {q.shape}")
        # Hold the lock through the kernel so no append/evict rewrites a page it reads; the
        # arguments become plain values first, since a user's __float__ or __index__ that
        # called back into this cache would wait on the lock forever.
        cdef Py_ssize_t L = index_arg(layer, self.store.num_layers, "layer")
        opts = _plain_options(**options)
        acquire(self.lock)
        try:
            return batch_paged_attention(
                q, np.array([0, q.shape[0]], dtype=np.int32), self.store.pages(), L,
                self.table.physical_pages()[None, :],
                np.array([self.table.c_seq_len()], dtype=np.int32), **opts)
        finally:
            release(self.lock)

    def __repr__(self):
        return (f"PagedKVCache(seq_len={self.table.c_seq_len()}, pages={self.table.num_entries()}, "
                f"free={self.pool.free_count()}, evicted_tokens={self.evicted})")
