"""Many sequences over one page pool: handles, prefix caching, copy-on-write fork, swap.

Mirrors ferrum-kv's ``PagedKvCacheManager`` (the design behind the seed executor) over
pagedcy's :class:`~pagedcy.KVPageStore`. Pages are the blocks: ``block_size() ==
config.page_size`` and a page holds that many tokens of K and V for every layer.

Page ownership (the invariant the tests check after every step):

* a page on the pool's free list has pool refcount 0 and belongs to nobody;
* a page held by handles has pool refcount == the number of handles whose block table
  contains it (``fork`` and prefix hits share pages by ``incref``; nothing is copied
  until somebody writes to a shared page);
* a prefix-cached page that no handle holds any more is *evictable*: it keeps its hash
  and exactly one pool reference owned by the cache (so the pool's LIFO free list can
  never hand it out behind the LRU's back) until a prefix hit takes it back or an
  allocation evicts it (oldest first) and drops its hash.

All metadata changes happen under one ``threading.RLock`` per manager; bulk copies and
the attention kernel run outside it without the GIL, so threads overlap. A handle must
not be used by one thread while another deallocates, forks or swaps that same handle.
"""
import enum
import hashlib
import itertools
import threading
from collections import OrderedDict, Counter

import numpy as np

from pagedcy import _validate
from pagedcy._libs._store import KVPageStore
from pagedcy._libs._manager_ops import build_block_table, write_token_rows
from pagedcy.config import PagedKVCacheConfig
from pagedcy.errors import PoolExhaustedError
from pagedcy.serving.step import StepSlots, step_slots

__all__ = ["AllocationRequest", "PagedKVCacheHandle", "PagedKVCacheManager", "MemoryPressure",
           "CacheStats", "StepSlots", "paged_attention"]


def _kernel():
    # Imported lazily so the manager (allocation, swap, prefix cache) works in a build
    # that is still missing the attention extension.
    from pagedcy._libs._attention import batch_paged_attention
    return batch_paged_attention


class MemoryPressure(enum.IntEnum):
    """How full the primary pool is (evictable prefix-cache pages count as free).

    LOW below ``high_watermark``, HIGH from it, CRITICAL from ``critical_watermark``.
    Ordered, so ``pressure >= MemoryPressure.HIGH`` works.
    """

    LOW = 0
    HIGH = 1
    CRITICAL = 2


class AllocationRequest:
    """What :meth:`PagedKVCacheManager.allocate` should reserve.

    request_id: any hashable id (None: the manager assigns ``"req-<n>"``).
    initial_tokens: tokens the new handle holds (``num_tokens()``); pages for them are
    allocated. With ``prompt_tokens`` it defaults to (and must be at least) the prompt length.
    max_sequence_length: upper bound for ``num_tokens()`` over the handle's life (None: no bound).
    prompt_tokens: 1-D integer token ids; enables prefix-cache lookup and registration.
    cache_salt: optional bytes/str mixed into the first page's hash so different tenants
    (or LoRA adapters) never share cached pages.

    Raises ValueError for negative counts or ``initial_tokens`` above ``max_sequence_length``,
    TypeError for non-integer counts/tokens.
    """

    __slots__ = ("request_id", "initial_tokens", "max_sequence_length", "prompt_tokens", "cache_salt")

    def __init__(self, request_id=None, initial_tokens=0, max_sequence_length=None,
                 prompt_tokens=None, cache_salt=None):
        self.request_id = request_id
        init = _validate.check_count(initial_tokens, "initial_tokens")
        if prompt_tokens is not None:
            pt = _validate.token_id_array(prompt_tokens, "prompt_tokens")
            if pt.ndim != 1:
                raise TypeError("prompt_tokens must be a 1-D integer sequence")
            if pt.size and pt.min() < 0:
                raise ValueError("prompt_tokens must be non-negative")
            pt = pt.astype(np.int64)
            init = max(init, int(pt.shape[0]))
            prompt_tokens = pt
        self.initial_tokens = init
        if max_sequence_length is not None:
            max_sequence_length = _validate.check_count(max_sequence_length, "max_sequence_length")
            if init > max_sequence_length:
                raise ValueError(f"initial_tokens {init} exceeds max_sequence_length "
                                 f"{max_sequence_length}")
        self.max_sequence_length = max_sequence_length
        self.prompt_tokens = prompt_tokens
        if isinstance(cache_salt, str):
            cache_salt = cache_salt.encode()
        if cache_salt is not None and not isinstance(cache_salt, (bytes, bytearray)):
            raise TypeError("cache_salt must be bytes, str or None")
        self.cache_salt = bytes(cache_salt) if cache_salt is not None else None

    def __repr__(self):
        n = None if self.prompt_tokens is None else len(self.prompt_tokens)
        return (f"AllocationRequest(request_id={self.request_id!r}, initial_tokens="
                f"{self.initial_tokens}, max_sequence_length={self.max_sequence_length}, "
                f"prompt_tokens=<{n} tokens>)")


class PagedKVCacheHandle:
    """One sequence's view of the cache: its block table and token count.

    Obtained from :meth:`PagedKVCacheManager.allocate` / ``fork``; every operation on the
    K/V data goes through the manager. After ``deallocate`` every method raises ValueError.
    """

    __slots__ = ("_mgr", "request_id", "_blocks", "_table", "_num_tokens", "_cached",
                 "_max_len", "_swap_blocks", "_prompt", "_hashes", "_n_hashed", "_marks",
                 "_alive", "__weakref__")

    def __init__(self, mgr, request_id, max_len):
        self._mgr = mgr
        self.request_id = request_id
        self._blocks = []          # physical page ids, logical order
        self._table = None         # cached read-only int32 copy of _blocks
        self._num_tokens = 0
        self._cached = 0
        self._max_len = max_len
        self._swap_blocks = None   # swap-pool page ids while swapped out
        self._prompt = None
        self._hashes = ()          # chained hashes of the full prompt pages
        self._n_hashed = 0         # pages [0, _n_hashed) are registered or matched
        self._marks = None         # per layer: prompt tokens written contiguously so far
        self._alive = True

    def _check(self):
        if not self._alive:
            raise ValueError(f"handle {self.request_id!r} was deallocated")

    def _set_blocks(self, blocks):
        self._blocks = blocks
        self._table = None

    def num_tokens(self):
        """Tokens the sequence holds (positions ``0 .. num_tokens()-1``; attention's kv_len)."""
        return self._num_tokens

    def set_num_tokens(self, n):
        """Set the token count. ValueError if ``n`` < 0, above the allocated capacity
        (``num_blocks() * block_size()``) or above ``max_sequence_length``."""
        with self._mgr._lock:
            self._check()
            n = _validate.check_count(n, "num_tokens")
            cap = self.capacity()
            if n > cap:
                raise ValueError(f"num_tokens {n} exceeds the {cap} tokens of the allocated blocks")
            if self._max_len is not None and n > self._max_len:
                raise ValueError(f"num_tokens {n} exceeds max_sequence_length {self._max_len}")
            self._num_tokens = n

    def capacity(self):
        """Tokens the allocated blocks can hold (also while swapped out)."""
        nb = len(self._swap_blocks) if self._swap_blocks is not None else len(self._blocks)
        return nb * self._mgr.page_size

    def num_blocks(self):
        """Number of blocks (pages) the sequence holds (in the swap pool while swapped out)."""
        return len(self._swap_blocks) if self._swap_blocks is not None else len(self._blocks)

    def block_table(self):
        """The physical page ids in logical order: read-only int32 ``[num_blocks()]``
        (empty while swapped out). A new array after every change; never mutated."""
        t = self._table
        if t is None:
            t = np.array(self._blocks, dtype=np.int32)
            t.flags.writeable = False
            self._table = t
        return t

    def ref_count(self):
        """The smallest pool reference count over the handle's pages: 1 when at least one
        page is private, ``k`` when every page is shared by ``k`` holders (right after a
        fork, 2). A handle without pages (or swapped out) reports 1 -- only itself."""
        with self._mgr._lock:
            if not self._blocks:
                return 1
            rc = self._mgr._pool.ref_counts()
            return int(rc[self.block_table()].min())

    def num_cached_tokens(self):
        """Prompt tokens served from the prefix cache at allocation (a multiple of the
        block size, always < the prompt length); the caller computes only the rest."""
        return self._cached

    def is_swapped(self):
        """True while the sequence's pages live in the swap pool."""
        return self._swap_blocks is not None

    def is_alive(self):
        """False once deallocated."""
        return self._alive

    def __repr__(self):
        state = "swapped" if self.is_swapped() else ("freed" if not self._alive else "resident")
        return (f"PagedKVCacheHandle({self.request_id!r}, tokens={self._num_tokens}, "
                f"blocks={self.num_blocks()}, cached={self._cached}, {state})")


class CacheStats(dict):
    """Snapshot of a manager's counters; a dict that also allows attribute access.

    Keys: total_blocks, free_blocks (truly free + evictable), used_blocks (held by handles),
    cached_blocks (evictable prefix pages), peak_used_blocks, num_handles, num_swapped,
    allocations, deallocations, failures (allocations/extensions refused for lack of pages),
    evictions (cached pages dropped to make room), prefix_queries / prefix_hits (in tokens:
    prompt tokens looked up / served from cache), prefix_hit_rate, cow_copies, forks,
    swap_outs, swap_ins, swap_total_blocks, swap_used_blocks, block_size, bytes_per_block,
    total_bytes, used_bytes, peak_bytes (real bytes of the storage dtype), utilization
    (used/total), pressure (MemoryPressure).
    """

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _block_hash(parent, tokens, salt):
    h = hashlib.blake2b(digest_size=16)
    h.update(parent)
    if salt:
        h.update(b"salt:" + salt)
    h.update(tokens.tobytes())
    return h.digest()


class PagedKVCacheManager:
    """Multi-sequence paged KV cache over one :class:`KVPageStore`.

    PagedKVCacheManager(config, *, enable_prefix_cache=False, swap_pages=0, swap_path=None,
                        high_watermark=0.8, critical_watermark=0.95)

    config: :class:`PagedKVCacheConfig` (its eviction policy is ignored: the manager never
    drops tokens of a live sequence; it raises :class:`PoolExhaustedError` instead).
    enable_prefix_cache: share full prompt pages between requests (vLLM-style chained hashes).
    swap_pages: size of the secondary pool used by ``swap_out``; ``swap_path``: back it
    with a memory-mapped file there (created/overwritten) instead of RAM.
    high_watermark/critical_watermark: used fractions where ``check_pressure`` turns
    HIGH / CRITICAL (0 < high <= critical <= 1).

    Raises TypeError for a bad config, ValueError for bad sizes/watermarks.
    """

    def __init__(self, config, *, enable_prefix_cache=False, swap_pages=0, swap_path=None,
                 high_watermark=0.8, critical_watermark=0.95):
        if not isinstance(config, PagedKVCacheConfig):
            raise TypeError(f"config must be a PagedKVCacheConfig, got {type(config).__name__}")
        if not (0.0 < high_watermark <= critical_watermark <= 1.0):
            raise ValueError("need 0 < high_watermark <= critical_watermark <= 1")
        self.config = config
        self.page_size = config.page_size
        self._store = KVPageStore(config)
        self._pool = self._store.pool
        self._lock = threading.RLock()
        self._handles = {}
        self._ids = itertools.count()
        self._prefix = bool(enable_prefix_cache)
        self._hash_to_page = {}
        self._page_hash = {}
        self._evictable = OrderedDict()   # page -> hash, least recently freed first
        swap_pages = _validate.check_count(swap_pages, "swap_pages")
        self._swap_store = None
        self._swap_path = swap_path
        self._swap_map = None
        if swap_pages:
            scfg = PagedKVCacheConfig(config.page_size, swap_pages, config.num_layers,
                                      config.num_kv_heads, config.head_dim, dtype=config.dtype)
            if swap_path is not None:
                self._swap_map = np.memmap(swap_path, dtype=np.uint8, mode="w+",
                                           shape=(scfg.total_bytes(),))
            # In memory (buffer None) the store allocates its own aligned, lazily-zeroed pool.
            self._swap_store = KVPageStore(scfg, self._swap_map)
        self._high = float(high_watermark)
        self._critical = float(critical_watermark)
        self._callback = None
        self._last_pressure = MemoryPressure.LOW
        self._c = Counter()
        self._peak = 0

    # -- geometry / accounting --------------------------------------------------
    def block_size(self):
        """Tokens per block (== ``config.page_size``)."""
        return self.page_size

    @property
    def store(self):
        """The primary :class:`KVPageStore` (its ``pages()`` is what the kernel reads)."""
        return self._store

    @property
    def pool(self):
        """The primary :class:`PagePool` (read its refcounts; do not alloc/free directly)."""
        return self._pool

    @property
    def swap_store(self):
        """The swap :class:`KVPageStore`, or None without swap space."""
        return self._swap_store

    def total_blocks(self):
        """Pages in the primary pool."""
        return self._pool.max_pages

    def free_blocks(self):
        """Pages an allocation can get: truly free plus evictable prefix-cache pages."""
        with self._lock:
            return self._pool.free_count() + len(self._evictable)

    def used_blocks(self):
        """Pages held by at least one handle."""
        with self._lock:
            return self._pool.allocated_count() - len(self._evictable)

    def cached_blocks(self):
        """Evictable prefix-cache pages (held by no handle, kept for future hits)."""
        return len(self._evictable)

    def total_memory_bytes(self):
        """Bytes of the primary pool in the storage dtype."""
        return self.config.total_bytes()

    def used_memory_bytes(self):
        """Bytes of the pages held by handles (storage dtype)."""
        return self.used_blocks() * self.config.bytes_per_page()

    def peak_memory_bytes(self):
        """Largest ``used_memory_bytes()`` seen so far."""
        return self._peak * self.config.bytes_per_page()

    def list_handles(self):
        """Live handles in allocation order."""
        with self._lock:
            return list(self._handles.values())

    def get_handle(self, request_id):
        """The live handle of ``request_id``, or None."""
        with self._lock:
            return self._handles.get(request_id)

    def __len__(self):
        return len(self._handles)

    # -- pressure ---------------------------------------------------------------
    def check_pressure(self):
        """Current :class:`MemoryPressure` from the used fraction of the primary pool."""
        with self._lock:
            used = self._pool.allocated_count() - len(self._evictable)
        frac = used / self._pool.max_pages
        if frac >= self._critical:
            return MemoryPressure.CRITICAL
        if frac >= self._high:
            return MemoryPressure.HIGH
        return MemoryPressure.LOW

    def set_pressure_callback(self, fn):
        """Call ``fn(new_level, old_level)`` whenever an operation changes the pressure
        level (called outside the manager lock, from the thread that changed it).
        ``None`` removes it."""
        if fn is not None and not callable(fn):
            raise TypeError("callback must be callable or None")
        self._callback = fn

    def _after_change(self):
        used = self._pool.allocated_count() - len(self._evictable)
        if used > self._peak:
            self._peak = used

    def _notify(self):
        level = self.check_pressure()
        old = self._last_pressure
        if level != old:
            self._last_pressure = level
            cb = self._callback
            if cb is not None:
                cb(level, old)

    # -- page primitives (lock held) ------------------------------------------
    def _take_pages(self, n):
        """n private pages (refcount 1): free ones first, then evict the oldest cached
        pages. The caller has checked ``free_blocks() >= n``."""
        if n <= 0:
            return []
        k = min(n, self._pool.free_count())
        got = self._pool.alloc_many(k).tolist() if k else []
        while len(got) < n:
            page, h = self._evictable.popitem(last=False)
            # The cache's reference becomes the new owner's: the page never hits the free list.
            del self._page_hash[page]
            del self._hash_to_page[h]
            self._c["evictions"] += 1
            got.append(page)
        return got

    def _release(self, page):
        """Drop one handle reference to ``page``; a hashed page whose last holder leaves
        stays allocated (the cache's reference) at the MRU end of the evictable queue."""
        if page in self._page_hash and self._pool.ref_count(page) == 1:
            self._evictable[page] = self._page_hash[page]
        else:
            self._pool.free(page)

    def _need(self, n):
        avail = self._pool.free_count() + len(self._evictable)
        if n > avail:
            self._c["failures"] += 1
            raise PoolExhaustedError(f"need {n} blocks, {avail} available "
                                     f"(of {self._pool.max_pages})")

    def _handle(self, h):
        if isinstance(h, PagedKVCacheHandle):
            if h._mgr is not self:
                raise ValueError("handle belongs to another manager")
            h._check()
            return h
        try:
            return self._handles[h]
        except (KeyError, TypeError):
            raise KeyError(f"no live handle with request_id {h!r}") from None

    def _resident(self, h):
        h = self._handle(h)
        if h._swap_blocks is not None:
            raise ValueError(f"handle {h.request_id!r} is swapped out; swap_in first")
        return h

    # -- prefix cache -------------------------------------------------------------
    def _prompt_hashes(self, prompt, salt):
        ps = self.page_size
        out = []
        parent = b"pagedcy-root"
        for i in range(len(prompt) // ps):
            parent = _block_hash(parent, prompt[i * ps:(i + 1) * ps], salt if i == 0 else None)
            out.append(parent)
        return out

    def _match(self, hashes, prompt_len):
        # Leave at least one prompt token uncached: its query produces the first logits.
        limit = min(len(hashes), (prompt_len - 1) // self.page_size)
        pages = []
        for i in range(limit):
            p = self._hash_to_page.get(hashes[i])
            if p is None:
                break
            pages.append(p)
        return pages

    def _register_written(self, h):
        """Hash the prompt pages whose every layer has been written (vLLM registers a
        block once it is full of computed tokens)."""
        done = min(h._marks) // self.page_size
        done = min(done, len(h._hashes))
        for i in range(h._n_hashed, done):
            page = h._blocks[i]
            hsh = h._hashes[i]
            if hsh not in self._hash_to_page and page not in self._page_hash:
                self._hash_to_page[hsh] = page
                self._page_hash[page] = hsh
        h._n_hashed = max(h._n_hashed, done)
        if h._n_hashed >= len(h._hashes):
            h._marks = None  # nothing left to register

    def reset_prefix_cache(self):
        """Forget every cached hash; evictable pages go back to the free list. Pages still
        held by handles stay, unhashed. Returns the number of pages freed."""
        with self._lock:
            n = len(self._evictable)
            for page in self._evictable:
                self._pool.free(page)
            self._evictable.clear()
            self._hash_to_page.clear()
            self._page_hash.clear()
            for h in self._handles.values():
                h._marks = None
                h._n_hashed = len(h._hashes)
        self._notify()
        return n

    def cached_page_hashes(self):
        """{page: hash} of every page in the prefix cache (held or evictable); a copy."""
        with self._lock:
            return dict(self._page_hash)

    def evictable_pages(self):
        """Evictable pages, the next to be evicted first (a list copy)."""
        with self._lock:
            return list(self._evictable)

    # -- allocation -----------------------------------------------------------------
    def _new_request_id(self, rid):
        """``rid`` if it is free (ValueError if in use), or a fresh ``req-<n>`` for None.
        Caller holds the lock."""
        if rid is None:
            rid = f"req-{next(self._ids)}"
            while rid in self._handles:
                rid = f"req-{next(self._ids)}"
        elif rid in self._handles:
            raise ValueError(f"request_id {rid!r} is already allocated")
        return rid

    def _plan(self, request):
        if not isinstance(request, AllocationRequest):
            raise TypeError(f"request must be an AllocationRequest, got {type(request).__name__}")
        need = -(-request.initial_tokens // self.page_size)
        hashes, matched = [], []
        if self._prefix and request.prompt_tokens is not None and len(request.prompt_tokens):
            hashes = self._prompt_hashes(request.prompt_tokens, request.cache_salt)
            matched = self._match(hashes, len(request.prompt_tokens))
        from_evictable = sum(1 for p in matched if p in self._evictable)
        new = need - len(matched)
        return need, hashes, matched, new, from_evictable

    def can_allocate(self, request):
        """True if ``allocate(request)`` would succeed now (counting prefix hits)."""
        with self._lock:
            need, _, matched, new, from_ev = self._plan(request)
            if request.request_id is not None and request.request_id in self._handles:
                return False
            return new <= self._pool.free_count() + len(self._evictable) - from_ev

    def allocate(self, request):
        """Reserve pages for ``request`` (:class:`AllocationRequest`) and return its handle.

        With ``prompt_tokens`` and the prefix cache on, every leading full page whose
        chained hash is cached is shared (refcount up, no copy) and
        ``handle.num_cached_tokens()`` says how many tokens need no prefill.
        Raises PoolExhaustedError (nothing changed) when pages run out, ValueError for a
        request_id already in use, TypeError for a non-request.
        """
        with self._lock:
            need, hashes, matched, new, from_ev = self._plan(request)
            rid = self._new_request_id(request.request_id)
            avail = self._pool.free_count() + len(self._evictable) - from_ev
            if new > avail:
                self._c["failures"] += 1
                raise PoolExhaustedError(f"need {new} blocks, {avail} available "
                                         f"(of {self._pool.max_pages})")
            for p in matched:
                if p in self._evictable:
                    del self._evictable[p]       # the cache's reference becomes ours
                else:
                    self._pool.incref(p)
            h = PagedKVCacheHandle(self, rid, request.max_sequence_length)
            h._set_blocks(matched + self._take_pages(new))
            h._num_tokens = request.initial_tokens
            h._cached = len(matched) * self.page_size
            if request.prompt_tokens is not None:
                h._prompt = request.prompt_tokens
                plen = len(request.prompt_tokens)
                self._c["prefix_queries"] += plen
                self._c["prefix_hits"] += h._cached
                if hashes and len(matched) < len(hashes):
                    h._hashes = hashes
                    h._n_hashed = len(matched)
                    h._marks = [h._cached] * self.config.num_layers
            self._handles[rid] = h
            self._c["allocations"] += 1
            self._after_change()
        self._notify()
        return h

    def allocate_blocks(self, handle, n):
        """Append ``n`` fresh blocks to ``handle``; returns their page ids (list).
        All or nothing: PoolExhaustedError leaves the handle and the pool unchanged."""
        with self._lock:
            pages = self._grow(self._resident(handle), _validate.check_count(n, "n"))
        self._notify()
        return pages

    def _grow(self, h, n):
        self._need(n)
        pages = self._take_pages(n)
        h._set_blocks(h._blocks + pages)
        self._after_change()
        return pages

    def extend(self, handle, additional_tokens):
        """Grow ``handle`` by ``additional_tokens`` tokens (``num_tokens()`` included),
        allocating blocks as needed; returns the new page ids. All or nothing
        (PoolExhaustedError); ValueError past ``max_sequence_length``."""
        with self._lock:
            h = self._resident(handle)
            add = _validate.check_count(additional_tokens, "additional_tokens")
            n = h._num_tokens + add
            if h._max_len is not None and n > h._max_len:
                raise ValueError(f"{n} tokens exceed max_sequence_length {h._max_len}")
            pages = self._grow(h, max(0, -(-n // self.page_size) - len(h._blocks)))
            h._num_tokens = n
        self._notify()
        return pages

    def deallocate(self, handle_or_request_id):
        """Release a sequence: its pages lose one reference each (prefix-cached pages whose
        last holder this was become evictable), swap pages are freed. KeyError for an
        unknown request id, ValueError for a handle already deallocated."""
        with self._lock:
            h = self._handle(handle_or_request_id)
            if h._swap_blocks is not None:
                for p in h._swap_blocks:
                    self._swap_store.pool.free(p)
                h._swap_blocks = None
            # Reverse order: the tail of a prompt is the least likely to be shared again,
            # so it should be the first evicted (vLLM frees blocks in reverse too).
            for p in reversed(h._blocks):
                self._release(p)
            h._set_blocks([])
            h._alive = False
            h._marks = None
            del self._handles[h.request_id]
            self._c["deallocations"] += 1
        self._notify()

    def fork(self, handle, request_id=None):
        """A new handle sharing every page of ``handle`` (refcounts up, nothing copied) with
        the same token count; the first write to a shared page copies it (copy-on-write).
        ValueError for a swapped handle or a request_id in use."""
        with self._lock:
            h = self._resident(handle)
            request_id = self._new_request_id(request_id)
            for p in h._blocks:
                self._pool.incref(p)
            c = PagedKVCacheHandle(self, request_id, h._max_len)
            c._set_blocks(list(h._blocks))
            c._num_tokens = h._num_tokens
            c._cached = h._cached
            c._prompt = h._prompt
            self._handles[request_id] = c
            self._c["forks"] += 1
        return c

    # -- swap -------------------------------------------------------------------------
    def swap_out(self, handle):
        """Copy the sequence's pages to the swap pool and release its primary pages.
        PoolExhaustedError if the swap pool is too small (nothing changes), ValueError
        without swap space or if already swapped out."""
        with self._lock:
            h = self._resident(handle)
            if self._swap_store is None:
                raise ValueError("this manager has no swap space (swap_pages=0)")
            n = len(h._blocks)
            dst = self._swap_store.pool.alloc_many(n)
            if dst is None:
                self._c["failures"] += 1
                raise PoolExhaustedError(f"swap pool has {self._swap_store.pool.free_count()} "
                                         f"free pages, {n} needed")
            if n:
                self._swap_store.copy_pages_from(self._store, h.block_table(), dst)
            for p in reversed(h._blocks):
                self._release(p)
            h._set_blocks([])
            h._swap_blocks = dst.tolist()
            h._marks = None            # its pages change identity: no later registration
            h._n_hashed = len(h._hashes)
            self._c["swap_outs"] += 1
        self._notify()

    def swap_in(self, handle):
        """Bring a swapped-out sequence back into fresh primary pages (bit-exact), freeing
        its swap pages. PoolExhaustedError (nothing changes) if the primary pool lacks
        room, ValueError if the handle is not swapped out."""
        with self._lock:
            h = self._handle(handle)
            if h._swap_blocks is None:
                raise ValueError(f"handle {h.request_id!r} is not swapped out")
            n = len(h._swap_blocks)
            self._need(n)
            pages = self._take_pages(n)
            if n:
                self._store.copy_pages_from(self._swap_store, h._swap_blocks, pages)
            for p in h._swap_blocks:
                self._swap_store.pool.free(p)
            h._swap_blocks = None
            h._set_blocks(pages)
            self._c["swap_ins"] += 1
            self._after_change()
        self._notify()

    def swap_free_blocks(self):
        """Free pages in the swap pool (0 without swap space)."""
        return self._swap_store.pool.free_count() if self._swap_store is not None else 0

    # -- K/V data ---------------------------------------------------------------------
    def _own_range(self, h, first, last):
        """Give ``h`` private, unhashed copies of its pages ``first..last`` that are shared
        or prefix-cached, so a write cannot leak into another sequence or the cache."""
        blocks = h._blocks
        rc = self._pool.ref_counts() if last - first > 4 else None
        todo = []
        for i in range(first, last + 1):
            p = blocks[i]
            r = rc[p] if rc is not None else self._pool.ref_count(p)
            if r > 1 or p in self._page_hash:
                todo.append(i)
        if not todo:
            return
        self._need(len(todo))
        new = self._take_pages(len(todo))
        blocks = list(blocks)
        for i, q in zip(todo, new):
            p = blocks[i]
            self._pool.copy_page(p, q)
            self._release(p)
            blocks[i] = q
            self._c["cow_copies"] += 1
        h._set_blocks(blocks)
        self._after_change()

    def _prepare_write(self, h, layer, start, n):
        layer = _validate.check_index(layer, self.config.num_layers, "layer")
        cap = len(h._blocks) * self.page_size
        if start + n > cap:
            raise ValueError(f"positions {start}..{start + n - 1} are past the {cap} tokens of "
                             f"the blocks of {h.request_id!r}")
        if n:
            self._own_range(h, start // self.page_size, (start + n - 1) // self.page_size)
        return layer

    def _after_write(self, h, layer, start, n):
        m = h._marks
        if m is not None and start <= m[layer] < start + n:
            m[layer] = start + n
            self._register_written(h)

    def write_kv(self, handle, layer, position, key, value):
        """Write one token's K and V (``[num_kv_heads*head_dim]`` or ``[num_kv_heads,
        head_dim]``, any float dtype) at ``position`` of ``layer``. Shared or cached pages
        are copied first (copy-on-write). IndexError for a position past the allocated
        blocks or a bad layer, ValueError for a swapped handle or bad shapes, TypeError for
        non-float data, PoolExhaustedError if a copy-on-write copy finds no page."""
        cfg = self.config
        k = _validate.as_f32_rows(key, "key", cfg.num_kv_heads, cfg.head_dim, 1)
        v = _validate.as_f32_rows(value, "value", cfg.num_kv_heads, cfg.head_dim, 1)
        with self._lock:
            h = self._resident(handle)
            pos = _validate.as_int(position, "position")
            cap = len(h._blocks) * self.page_size
            if pos < 0 or pos >= cap:
                raise IndexError(f"position {pos} out of range [0, {cap}) of {h.request_id!r}")
            layer = self._prepare_write(h, layer, pos, 1)
            self._store.write(h.block_table(), layer, pos, k, v)
            self._after_write(h, layer, pos, 1)

    def write_kv_tokens(self, handle, layer, start, keys, values):
        """Write ``n`` tokens' K and V (``[n, kv_dim]`` or ``[n, num_kv_heads, head_dim]``)
        at positions ``start .. start+n-1`` of ``layer``; big copies run without the GIL.
        Errors as :meth:`write_kv` (ValueError for a range
        past the allocated blocks)."""
        cfg = self.config
        k = _validate.as_f32_rows(keys, "keys", cfg.num_kv_heads, cfg.head_dim)
        v = _validate.as_f32_rows(values, "values", cfg.num_kv_heads, cfg.head_dim, k.shape[0])
        n = k.shape[0]
        start = _validate.check_count(start, "start")
        # The copy runs under the manager lock (the store drops the GIL for it, so other
        # threads still run): a concurrent deallocate/fork of this handle can then never
        # hand its pages to someone else mid-copy.
        with self._lock:
            h = self._resident(handle)
            layer = self._prepare_write(h, layer, start, n)
            if n:
                self._store.write(h.block_table(), layer, start, k, v)
                self._after_write(h, layer, start, n)

    def write_kv_batch(self, handles, layer, positions, keys, values):
        """Write one token for each of ``B`` handles: row ``i`` of ``keys``/``values``
        (``[B, kv_dim]`` or ``[B, num_kv_heads, head_dim]``) at ``positions[i]`` of
        ``handles[i]``, in one GIL-free call (the decode-step hot path). Copy-on-write as
        :meth:`write_kv`. IndexError for a position past a handle's blocks; nothing is
        written if any check fails (copy-on-write copies already made are kept)."""
        cfg = self.config
        hs = list(handles)
        B = len(hs)
        k = _validate.as_f32_rows(keys, "keys", cfg.num_kv_heads, cfg.head_dim, B)
        v = _validate.as_f32_rows(values, "values", cfg.num_kv_heads, cfg.head_dim, B)
        pos = np.asarray(positions)
        if pos.shape != (B,) or (B and pos.dtype.kind not in "iu"):
            raise ValueError(f"positions must be {B} integers")
        layer = _validate.check_index(layer, cfg.num_layers, "layer")
        ps = self.page_size
        with self._lock:
            hs = [self._resident(h) for h in hs]
            if len({id(h) for h in hs}) != B:
                raise ValueError("a handle appears twice in one batched write")
            pl = pos.tolist()
            for h, p in zip(hs, pl):
                if p < 0 or p >= len(h._blocks) * ps:
                    raise IndexError(f"position {p} out of range [0, {len(h._blocks) * ps}) "
                                     f"of {h.request_id!r}")
            rc = self._pool.ref_counts()
            ph = self._page_hash
            for h, p in zip(hs, pl):
                pg = h._blocks[p // ps]
                if rc[pg] > 1 or pg in ph:
                    self._own_range(h, p // ps, p // ps)
                    rc = self._pool.ref_counts()
            pages = np.fromiter((h._blocks[p // ps] for h, p in zip(hs, pl)), np.int32, B)
            offs = (pos % ps).astype(np.int32)
            write_token_rows(self._store, pages, offs, layer, k, v)
            for h, p in zip(hs, pl):
                if h._marks is not None:
                    self._after_write(h, layer, p, 1)

    # -- engine step --------------------------------------------------------------------
    def _step_batch(self, handles, q_lens):
        """Validated ``(handles, q_lens int64 [B], kv_lens int64 [B])`` of one step."""
        if isinstance(handles, PagedKVCacheHandle):
            raise TypeError("handles must be a sequence of PagedKVCacheHandle, got one handle")
        try:
            hs = list(handles)
        except TypeError:
            raise TypeError("handles must be a sequence of PagedKVCacheHandle") from None
        B = len(hs)
        for h in hs:
            # one cheap test per handle on the hot path; the slow path names the problem
            if type(h) is not PagedKVCacheHandle or h._mgr is not self or not h._alive \
                    or h._swap_blocks is not None:
                if not isinstance(h, PagedKVCacheHandle):
                    raise TypeError(f"handles must be PagedKVCacheHandle objects, got "
                                    f"{type(h).__name__}")
                self._resident(h)
        if len(set(hs)) != B:
            raise ValueError("a handle appears twice in one step")
        ql = np.asarray(q_lens)
        if ql.size == 0 and ql.dtype.kind == "f":     # [] arrives as float64
            ql = ql.astype(np.int64)
        ql = _validate.int_array(ql, "q_lens")
        if ql.shape != (B,):
            raise ValueError(f"q_lens must have shape ({B},), got {ql.shape}")
        kv = np.fromiter((h._num_tokens for h in hs), np.int64, B)
        bad = np.nonzero((ql < 1) | (ql > kv))[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"q_len {int(ql[i])} of {hs[i].request_id!r} must be in "
                             f"[1, {int(kv[i])}] (its num_tokens())")
        return hs, ql.astype(np.int64), kv

    def _own_step(self, hs, tables, first, nblocks):
        """Copy-on-write for one step: give each handle private, unhashed copies of the
        blocks ``first[b] .. first[b]+nblocks[b]-1`` it is about to write, patching
        ``tables`` (int32 ``[B, W]``) in place. All or nothing (PoolExhaustedError)."""
        seq = np.repeat(np.arange(len(hs), dtype=np.intp), nblocks)
        starts = np.repeat(np.cumsum(nblocks) - nblocks, nblocks)
        blk = np.arange(seq.shape[0], dtype=np.intp) - starts + np.repeat(first, nblocks)
        pages = tables[seq, blk]
        rc = self._pool.ref_counts()[pages]
        ph = self._page_hash
        hashed = (np.fromiter((p in ph for p in pages.tolist()), bool, pages.shape[0])
                  if ph else np.zeros(pages.shape[0], dtype=bool))
        todo = np.nonzero((rc > 1) | hashed)[0]
        if not todo.size:
            return
        # An unhashed page that every one of its holders writes in this step needs one
        # copy fewer than it has holders: the last writer keeps the original.
        cand = pages[todo]
        _, inv, touches = np.unique(cand, return_inverse=True, return_counts=True)
        last = np.zeros(cand.shape[0], dtype=bool)
        last[cand.shape[0] - 1 - np.unique(cand[::-1], return_index=True)[1]] = True
        keep = ~hashed[todo] & (touches[inv] == rc[todo]) & last
        todo = todo[~keep]
        if not todo.size:
            return
        self._need(todo.shape[0])
        new = self._take_pages(todo.shape[0])
        changed = {}
        for j, q in zip(todo.tolist(), new):
            b = int(seq[j])
            blocks = changed.get(b)
            if blocks is None:
                blocks = changed[b] = list(hs[b]._blocks)
            p = blocks[blk[j]]
            self._pool.copy_page(p, q)
            self._release(p)
            blocks[blk[j]] = q
        for b, blocks in changed.items():
            hs[b]._set_blocks(blocks)
        tables[seq[todo], blk[todo]] = new
        self._c["cow_copies"] += len(new)
        self._after_change()

    def prepare_step(self, handles, q_lens):
        """Slots for one engine step over ``handles``, each adding its last ``q_lens[i]``
        tokens (already counted by ``num_tokens()``, e.g. via :meth:`extend`).

        Copies every block those tokens touch that is shared (fork) or prefix-cached
        (copy-on-write), so the caller may write the returned slots directly, e.g. with
        ``pagedcy._libs._manager_ops.write_token_rows(store, slots.slot_pages,
        slots.slot_offsets, layer, keys, values)``; then call :meth:`commit_step`.
        Returns :class:`StepSlots`. TypeError for non-handles or non-integer q_lens,
        ValueError for a handle given twice, swapped out or deallocated, or a q_len
        outside ``[1, num_tokens()]``; PoolExhaustedError when a copy finds no page.
        Nothing changes on error.
        """
        ps = self.page_size
        with self._lock:
            hs, ql, kv = self._step_batch(handles, q_lens)
            tabs = [h.block_table() for h in hs]
            tables = build_block_table(tabs, max((t.shape[0] for t in tabs), default=0) or 1)
            first = (kv - ql) // ps
            self._own_step(hs, tables, first, (kv - 1) // ps - first + 1)
            slots = step_slots(tables, kv, ql, ps)
        self._notify()
        return slots

    def commit_step(self, handles, q_lens):
        """Record that every layer of the step's positions (the last ``q_lens[i]`` tokens of
        ``handles[i]``) is written: full prompt pages become prefix-cache entries exactly as
        after :meth:`write_kv_tokens` of each layer. Errors as :meth:`prepare_step`
        (validated first; nothing changes on error)."""
        with self._lock:
            hs, ql, kv = self._step_batch(handles, q_lens)
            for h, q, n in zip(hs, ql.tolist(), kv.tolist()):
                m = h._marks
                if m is None:
                    continue
                moved = False
                for layer, mark in enumerate(m):
                    if n - q <= mark < n:
                        m[layer] = n
                        moved = True
                if moved:
                    self._register_written(h)

    def read_kv(self, handle, layer, start, n, *, float32=True):
        """Read ``n`` tokens from ``start`` of ``layer``: ``(keys, values)`` each
        ``[n, num_kv_heads, head_dim]`` (float32, or the storage dtype with
        ``float32=False``). ValueError for a range past the allocated blocks or a
        swapped handle, IndexError for a bad layer."""
        cfg = self.config
        start = _validate.check_count(start, "start")
        n = _validate.check_count(n, "n")
        with self._lock:
            h = self._resident(handle)
            layer = _validate.check_index(layer, cfg.num_layers, "layer")
            cap = len(h._blocks) * self.page_size
            if start + n > cap:
                raise ValueError(f"positions {start}..{start + n - 1} are past the {cap} "
                                 f"tokens of the blocks of {h.request_id!r}")
            table = h.block_table()
            k = self._store.read(table, layer, 0, start, n, float32=float32)
            v = self._store.read(table, layer, 1, start, n, float32=float32)
        shape = (n, cfg.num_kv_heads, cfg.head_dim)
        return k.reshape(shape), v.reshape(shape)

    # -- attention ----------------------------------------------------------------------
    def batch_tables(self, handles):
        """``(block_tables int32 [B, max_blocks], kv_lens int32 [B])`` for ``handles``
        (kv_len = ``num_tokens()``), as the attention kernel takes them."""
        with self._lock:
            hs = [self._resident(h) for h in handles]
            tabs = [h.block_table() for h in hs]
            lens = np.fromiter((h._num_tokens for h in hs), np.int32, len(hs))
        width = max((t.shape[0] for t in tabs), default=0) or 1
        return build_block_table(tabs, width), lens

    def attention(self, layer, query, handles, q_lens=None, **kernel_options):
        """One batched paged-attention call over many sequences (continuous batching).

        query: float ``[total_q, num_heads, head_dim]``; sequence ``i`` owns the next
        ``q_lens[i]`` rows (default: 1 each, a decode step) and attends over its
        ``num_tokens()`` tokens, the queries being the last ``q_lens[i]`` positions
        (causal by default). ``kernel_options``: scale, causal, window_left, soft_cap,
        alibi_slopes, out, return_lse, num_threads of ``batch_paged_attention``.
        Returns float32 ``[total_q, num_heads, head_dim]`` (and lse with return_lse).
        ValueError for inconsistent lengths (q_len > num_tokens, rows != sum(q_lens)) or
        a swapped handle.
        """
        hs = list(handles)
        B = len(hs)
        q = np.asarray(query)
        if q.ndim != 3:
            raise ValueError(f"query must be [total_q, num_heads, head_dim], got {q.shape}")
        if q_lens is None:
            ql = np.ones(B, dtype=np.int64)
        else:
            # validated as given: a cast first would floor floats, drop imaginary parts
            # and wrap integers too large for int64
            ql = _validate.int_array(q_lens, "q_lens").reshape(-1)
            if ql.shape[0] != B:
                raise ValueError(f"q_lens has {ql.shape[0]} entries for {B} handles")
            if B and (ql.min() < 0 or ql.max() > q.shape[0]):
                raise ValueError(f"q_lens must be in [0, {q.shape[0]}] (the query's rows)")
            ql = ql.astype(np.int64)
        indptr = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(ql, out=indptr[1:])
        if indptr[-1] != q.shape[0]:
            raise ValueError(f"query has {q.shape[0]} rows, q_lens add up to {int(indptr[-1])}")
        tables, lens = self.batch_tables(hs)
        bad = np.nonzero(ql > lens)[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"q_len {int(ql[i])} of {hs[i].request_id!r} exceeds its "
                             f"{int(lens[i])} tokens")
        layer = _validate.check_index(layer, self.config.num_layers, "layer")
        return _kernel()(q, indptr, self._store.pages(), layer, tables, lens, **kernel_options)

    # -- stats ---------------------------------------------------------------------------
    def stats(self):
        """A :class:`CacheStats` snapshot (see its docstring for the keys)."""
        with self._lock:
            c = self._c
            bpp = self.config.bytes_per_page()
            used = self._pool.allocated_count() - len(self._evictable)
            sp = self._swap_store.pool if self._swap_store is not None else None
            q = c["prefix_queries"]
            return CacheStats(
                total_blocks=self._pool.max_pages,
                free_blocks=self._pool.free_count() + len(self._evictable),
                used_blocks=used, cached_blocks=len(self._evictable),
                peak_used_blocks=self._peak,
                num_handles=len(self._handles),
                num_swapped=sum(1 for h in self._handles.values() if h._swap_blocks is not None),
                allocations=c["allocations"], deallocations=c["deallocations"],
                failures=c["failures"], evictions=c["evictions"],
                prefix_queries=q, prefix_hits=c["prefix_hits"],
                prefix_hit_rate=(c["prefix_hits"] / q) if q else 0.0,
                cow_copies=c["cow_copies"], forks=c["forks"],
                swap_outs=c["swap_outs"], swap_ins=c["swap_ins"],
                swap_total_blocks=sp.max_pages if sp is not None else 0,
                swap_used_blocks=sp.allocated_count() if sp is not None else 0,
                block_size=self.page_size, bytes_per_block=bpp,
                total_bytes=self.config.total_bytes(), used_bytes=used * bpp,
                peak_bytes=self._peak * bpp,
                utilization=used / self._pool.max_pages,
                pressure=self.check_pressure(),
            )

    def check_invariants(self):
        """Verify the page-ownership invariant (see the module docstring); raises
        AssertionError describing the first violation. For tests and leak checks."""
        with self._lock:
            rc = self._pool.ref_counts()
            want = np.zeros_like(rc)
            for h in self._handles.values():
                for p in h._blocks:
                    want[p] += 1
            for p in self._evictable:
                if want[p]:
                    raise AssertionError(f"evictable page {p} is held by a handle")
                want[p] += 1
                if self._page_hash.get(p) is None:
                    raise AssertionError(f"evictable page {p} has no hash")
            bad = np.nonzero(rc != want)[0]
            if bad.size:
                p = int(bad[0])
                raise AssertionError(f"page {p}: pool refcount {rc[p]}, expected {want[p]}")
            if self._pool.free_count() != int((rc == 0).sum()):
                raise AssertionError("free list length disagrees with refcounts")
            for hsh, p in self._hash_to_page.items():
                if self._page_hash.get(p) != hsh or rc[p] == 0:
                    raise AssertionError(f"hash map broken at page {p}")
            if self._swap_store is not None:
                sw = sum(len(h._swap_blocks) for h in self._handles.values()
                         if h._swap_blocks is not None)
                if sw != self._swap_store.pool.allocated_count():
                    raise AssertionError("swap pool pages leaked")
        return True

    def __repr__(self):
        return (f"PagedKVCacheManager(blocks={self._pool.max_pages}, free={self.free_blocks()}, "
                f"handles={len(self._handles)}, prefix_cache={self._prefix})")


def paged_attention(query, q_tokens, num_heads, num_kv_heads, head_dim, manager, handle, layer,
                    kv_len, *, scale=None, causal=True, out=None, num_threads=None):
    """Attention of ``q_tokens`` query rows of one sequence over its first ``kv_len``
    cached tokens (ferrum-kv's ``paged_attention``, same argument order).

    query: float, flat ``[q_tokens*num_heads*head_dim]`` or ``[q_tokens, num_heads,
    head_dim]``; the rows are the last ``q_tokens`` positions of the ``kv_len`` (causal,
    bottom-right aligned). Returns float32 ``[q_tokens, num_heads, head_dim]`` (``out``
    if given). ValueError: kv_len == 0, kv_len beyond ``handle.num_tokens()``,
    q_tokens == 0 or > kv_len, a query of the wrong size, head counts that disagree with
    the manager's config or num_heads not a multiple of num_kv_heads.
    """
    if not isinstance(manager, PagedKVCacheManager):
        raise TypeError("manager must be a PagedKVCacheManager")
    cfg = manager.config
    q_tokens = _validate.as_int(q_tokens, "q_tokens")
    num_heads = _validate.as_int(num_heads, "num_heads")
    kv_len = _validate.as_int(kv_len, "kv_len")
    if _validate.as_int(num_kv_heads, "num_kv_heads") != cfg.num_kv_heads \
            or _validate.as_int(head_dim, "head_dim") != cfg.head_dim:
        raise ValueError(f"num_kv_heads/head_dim {num_kv_heads}/{head_dim} do not match the "
                         f"cache's {cfg.num_kv_heads}/{cfg.head_dim}")
    if num_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} must be a positive multiple of num_kv_heads "
                         f"{num_kv_heads}")
    if kv_len <= 0:
        raise ValueError(f"kv_len must be > 0, got {kv_len}")
    if q_tokens <= 0 or q_tokens > kv_len:
        raise ValueError(f"q_tokens must be in [1, kv_len={kv_len}], got {q_tokens}")
    q = _validate.float_array(query, "query")
    if q.size != q_tokens * num_heads * head_dim:
        raise ValueError(f"query has {q.size} values, expected q_tokens*num_heads*head_dim = "
                         f"{q_tokens * num_heads * head_dim}")
    q = q.reshape(q_tokens, num_heads, head_dim)
    with manager._lock:
        h = manager._resident(handle)
        if kv_len > h._num_tokens:
            raise ValueError(f"kv_len {kv_len} exceeds the {h._num_tokens} tokens of "
                             f"{h.request_id!r}")
        layer = _validate.check_index(layer, cfg.num_layers, "layer")
        table = h.block_table()
    tables = np.ascontiguousarray(table.reshape(1, -1))
    return _kernel()(q, np.array([0, q_tokens], dtype=np.int32), manager.store.pages(), layer,
                     tables, np.array([kv_len], dtype=np.int32), scale=scale, causal=causal,
                     out=out, num_threads=num_threads)
