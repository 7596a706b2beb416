"""Many sequences over one page pool: handles, prefix caching, copy-on-write fork, swap.

:class:`PagedKVCacheManager` is a thin, locked front over small parts that each own
their state, the way ``numpy.random.Generator`` wraps a ``BitGenerator``
(:class:`~pagedcy.kvcache.parts.ManagerParts` bundles them): a
:class:`~pagedcy.kvcache.allocator.BlockAllocator` (the pool plus the evictable LRU), a
:class:`~pagedcy.kvcache.prefix.PrefixCache` (chained page hashes), an optional
:class:`~pagedcy.kvcache.swap.SwapSpace`, a :class:`~pagedcy.kvcache.handle.HandleTable`
(the live :class:`PagedKVCacheHandle` objects) and :class:`~pagedcy.kvcache.stats.Counters`.
Two coordinators work on them: :class:`~pagedcy.kvcache.lifecycle.SequenceLifecycle`
(allocate, extend, fork, swap, release) and :class:`~pagedcy.kvcache.kv_access.KVAccess`
(K/V writes and reads with copy-on-write, engine-step slots, attention); a
:class:`~pagedcy.kvcache.pressure.PressureMonitor` reports memory pressure. Pages are the
blocks: ``block_size() == config.page_size`` and a page holds that many tokens of K and V
for every layer.

Page ownership (the invariant :meth:`PagedKVCacheManager.check_invariants` checks): a
free page has refcount 0; a page held by handles has refcount == the number of handles
whose block table contains it (``fork`` and prefix hits share pages by reference;
nothing is copied until somebody writes to a shared page); an evictable prefix-cache
page has exactly one reference, the cache's.

All metadata changes happen under one ``threading.RLock`` per manager; bulk copies and
the attention kernel run without the GIL, so threads overlap. A handle must not be used
by one thread while another deallocates, forks or swaps that same handle.
"""
import numpy as np

from pagedcy import _validate
from pagedcy._libs._store import KVPageStore
from pagedcy.config import PagedKVCacheConfig
from pagedcy.kvcache.handle import PagedKVCacheHandle
from pagedcy.kvcache.kv_access import KVAccess, attention_kernel
from pagedcy.kvcache.lifecycle import SequenceLifecycle
from pagedcy.kvcache.parts import ManagerParts
from pagedcy.kvcache.pressure import MemoryPressure, PressureMonitor
from pagedcy.kvcache.request import AllocationRequest
from pagedcy.kvcache.stats import CacheStats
from pagedcy.kvcache.step import StepSlots

__all__ = ["AllocationRequest", "PagedKVCacheHandle", "PagedKVCacheManager", "MemoryPressure",
           "CacheStats", "StepSlots", "paged_attention"]


class _ChangeGuard:
    """``with guard:`` holds the manager lock for a change, then reports a pressure change
    outside the lock (not when the change raised). A class, not a generator: it runs on
    every allocation and extension."""

    __slots__ = ("_lock", "_notify")

    def __init__(self, lock, notify):
        self._lock = lock
        self._notify = notify

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, exc_type, exc, tb):
        self._lock.release()
        if exc_type is None:
            self._notify()


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
        self._pressure = PressureMonitor(high_watermark, critical_watermark)
        swap_pages = _validate.check_count(swap_pages, "swap_pages")
        self.config = config
        self.page_size = config.page_size
        self._store = KVPageStore(config)
        self._pool = self._store.pool
        p = ManagerParts.build(self, config, self._store, enable_prefix_cache=enable_prefix_cache,
                               swap_pages=swap_pages, swap_path=swap_path)
        self._lock, self._counters, self._prefix = p.lock, p.counters, p.prefix
        self._alloc, self._swap, self._handles = p.allocator, p.swap, p.handles
        self._life = SequenceLifecycle(p)
        self._kv = KVAccess(p)
        self._change = _ChangeGuard(self._lock, self._notify)

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
        return self._swap.store if self._swap is not None else None

    @property
    def prefix_cache_enabled(self):
        """True if the manager was made with ``enable_prefix_cache=True``."""
        return self._prefix.enabled

    def total_blocks(self):
        """Pages in the primary pool."""
        return self._alloc.total

    def free_blocks(self):
        """Pages an allocation can get: truly free plus evictable prefix-cache pages."""
        with self._lock:
            return self._alloc.available()

    def used_blocks(self):
        """Pages held by at least one handle."""
        with self._lock:
            return self._alloc.used()

    def cached_blocks(self):
        """Evictable prefix-cache pages (held by no handle, kept for future hits)."""
        return self._alloc.num_evictable()

    def total_memory_bytes(self):
        """Bytes of the primary pool in the storage dtype."""
        return self.config.total_bytes()

    def used_memory_bytes(self):
        """Bytes of the pages held by handles (storage dtype)."""
        return self.used_blocks() * self.config.bytes_per_page()

    def peak_memory_bytes(self):
        """Largest ``used_memory_bytes()`` seen so far."""
        return self._alloc.peak * self.config.bytes_per_page()

    def list_handles(self):
        """Live handles in allocation order."""
        with self._lock:
            return self._handles.values()

    def get_handle(self, request_id):
        """The live handle of ``request_id``, or None."""
        with self._lock:
            return self._handles.lookup(request_id)

    def __len__(self):
        return len(self._handles)

    # -- pressure ---------------------------------------------------------------
    def check_pressure(self):
        """Current :class:`MemoryPressure` from the used fraction of the primary pool."""
        with self._lock:
            used = self._alloc.used()
        return self._pressure.level(used / self._alloc.total)

    def set_pressure_callback(self, fn):
        """Call ``fn(new_level, old_level)`` whenever an operation changes the pressure
        level, from the thread that changed it, under the manager's (re-entrant) lock so
        that levels arrive in the order they happened: ``fn`` may call the manager, and
        should be quick. ``None`` removes it."""
        self._pressure.set_callback(fn)

    def _notify(self):
        # update inside the lock: computed outside, two threads' levels could land in the
        # wrong order and leave the last callback disagreeing with check_pressure()
        with self._lock:
            self._pressure.update(self._alloc.used() / self._alloc.total)

    # -- prefix cache -------------------------------------------------------------
    def cached_page_hashes(self):
        """{page: hash} of every page in the prefix cache (held or evictable); a copy."""
        with self._lock:
            return self._prefix.page_hashes()

    def match_prefix(self, tokens):
        """``(hashes, n)``: the chained hashes of the full pages of ``tokens`` (1-D int)
        and how many leading ones the prefix cache holds now (at most ``(len - 1) //
        page_size``), counting nothing. ``([], 0)`` with the prefix cache off."""
        with self._lock:
            return self._prefix.leading(tokens)

    def set_page_listener(self, fn):
        """Call ``fn(hash, page)`` (under the manager lock, so quickly) whenever a full
        prompt page enters the prefix cache: every layer of it is written and it is
        immutable until evicted (writes to it copy first). ``None`` removes it."""
        self._prefix.listener = fn

    def page_bytes(self, page):
        """A copy of one page's raw bytes (every layer's K and V, as the pool holds them)."""
        with self._lock:
            return self._pool.page_data(page).view(np.uint8).tobytes()

    def evictable_pages(self):
        """Evictable pages, the next to be evicted first (a list copy)."""
        with self._lock:
            return self._alloc.evictable_pages()

    # -- allocation, fork, swap ------------------------------------------------------
    def can_allocate(self, request):
        """True if ``allocate(request)`` would succeed now (counting prefix hits)."""
        with self._lock:
            return self._life.can_allocate(request)

    def allocate(self, request):
        """Reserve pages for ``request`` (:class:`AllocationRequest`) and return its handle.

        With ``prompt_tokens`` and the prefix cache on, every leading full page whose
        chained hash is cached is shared (refcount up, no copy) and
        ``handle.num_cached_tokens()`` says how many tokens need no prefill.
        Raises PoolExhaustedError (nothing changed) when pages run out, ValueError for a
        request_id already in use, TypeError for a non-request.
        """
        with self._change:
            return self._life.allocate(request)

    def allocate_blocks(self, handle, n):
        """Append ``n`` fresh blocks to ``handle``; returns their page ids (list).
        All or nothing: PoolExhaustedError leaves the handle and the pool unchanged."""
        with self._change:
            return self._life.allocate_blocks(handle, n)

    def extend(self, handle, additional_tokens):
        """Grow ``handle`` by ``additional_tokens`` tokens (``num_tokens()`` included),
        allocating blocks as needed; returns the new page ids. All or nothing
        (PoolExhaustedError); ValueError past ``max_sequence_length``."""
        with self._change:
            return self._life.extend(handle, additional_tokens)

    def deallocate(self, handle_or_request_id):
        """Release a sequence: its pages lose one reference each (prefix-cached pages whose
        last holder this was become evictable), swap pages are freed. KeyError for an
        unknown request id, ValueError for a handle already deallocated."""
        with self._change:
            self._life.deallocate(handle_or_request_id)

    def fork(self, handle, request_id=None):
        """A new handle sharing every page of ``handle`` (refcounts up, nothing copied) with
        the same token count; the first write to a shared page copies it (copy-on-write).
        ValueError for a swapped handle or a request_id in use."""
        with self._lock:
            return self._life.fork(handle, request_id)

    def reset_prefix_cache(self):
        """Forget every cached hash; evictable pages go back to the free list. Pages still
        held by handles stay, unhashed. Returns the number of pages freed."""
        with self._change:
            return self._life.reset_prefix_cache()

    def swap_out(self, handle):
        """Copy the sequence's pages to the swap pool and release its primary pages.
        PoolExhaustedError if the swap pool is too small (nothing changes), ValueError
        without swap space or if already swapped out."""
        with self._change:
            self._life.swap_out(handle)

    def swap_in(self, handle):
        """Bring a swapped-out sequence back into fresh primary pages (bit-exact), freeing
        its swap pages. PoolExhaustedError (nothing changes) if the primary pool lacks
        room, ValueError if the handle is not swapped out."""
        with self._change:
            self._life.swap_in(handle)

    def swap_free_blocks(self):
        """Free pages in the swap pool (0 without swap space)."""
        return self._swap.free_blocks() if self._swap is not None else 0

    # -- K/V data, engine step, attention --------------------------------------------
    def write_kv(self, handle, layer, position, key, value):
        """Write one token's K and V (``[num_kv_heads*head_dim]`` or ``[num_kv_heads,
        head_dim]``, any float dtype) at ``position`` of ``layer``. Shared or cached pages
        are copied first (copy-on-write). IndexError for a position past the allocated
        blocks or a bad layer, ValueError for a swapped handle or bad shapes, TypeError for
        non-float data, PoolExhaustedError if a copy-on-write copy finds no page."""
        return self._kv.write_kv(handle, layer, position, key, value)

    def write_kv_tokens(self, handle, layer, start, keys, values):
        """Write ``n`` tokens' K and V (``[n, kv_dim]`` or ``[n, num_kv_heads, head_dim]``)
        at positions ``start .. start+n-1`` of ``layer``; big copies run without the GIL.
        Errors as :meth:`write_kv` (ValueError for a range past the allocated blocks)."""
        return self._kv.write_kv_tokens(handle, layer, start, keys, values)

    def write_kv_batch(self, handles, layer, positions, keys, values):
        """Write one token for each of ``B`` handles: row ``i`` of ``keys``/``values``
        (``[B, kv_dim]`` or ``[B, num_kv_heads, head_dim]``) at ``positions[i]`` of
        ``handles[i]``, in one GIL-free call (the decode-step hot path). Copy-on-write as
        :meth:`write_kv`. IndexError for a position past a handle's blocks; nothing
        changes if any check fails."""
        return self._kv.write_kv_batch(handles, layer, positions, keys, values)

    def load_pages(self, handle, first_block, payloads):
        """Fill blocks ``first_block ..`` of ``handle`` with ``payloads`` (one page's raw
        bytes each, as :meth:`page_bytes` gives them) and count their tokens as written in
        every layer, so full prompt pages enter the prefix cache. The blocks must be the
        handle's own fresh pages (not shared, not cached). All or nothing: ValueError for
        a payload of the wrong size, blocks past the handle's or a shared/cached page."""
        return self._kv.load_pages(handle, first_block, payloads)

    def read_kv(self, handle, layer, start, n, *, float32=True):
        """Read ``n`` tokens from ``start`` of ``layer``: ``(keys, values)`` each
        ``[n, num_kv_heads, head_dim]`` (float32, or the storage dtype with
        ``float32=False``). ValueError for a range past the allocated blocks or a
        swapped handle, IndexError for a bad layer."""
        return self._kv.read_kv(handle, layer, start, n, float32=float32)

    def prepare_step(self, handles, q_lens):
        """Slots for one engine step over ``handles``, each adding its last ``q_lens[i]``
        tokens (already counted by ``num_tokens()``, e.g. via :meth:`extend`).

        Copies every block those tokens touch that is shared (fork) or prefix-cached
        (copy-on-write), so the caller may write the returned slots directly, e.g. with
        ``pagedcy._libs._manager_ops.write_token_rows(store, slots.slot_pages,
        slots.slot_offsets, layer, keys, values)``; then call :meth:`commit_step`.
        Returns :class:`StepSlots`. TypeError for non-handles or non-integer q_lens,
        ValueError for a handle given twice, swapped out, deallocated or another
        manager's, or a q_len outside ``[1, num_tokens()]``; PoolExhaustedError when a
        copy finds no page. Nothing changes on error.
        """
        slots = self._kv.prepare_step(handles, q_lens)
        self._notify()       # copy-on-write may have taken pages
        return slots

    def commit_step(self, handles, q_lens):
        """Record that every layer of the step's positions (the last ``q_lens[i]`` tokens of
        ``handles[i]``) is written: full prompt pages become prefix-cache entries exactly as
        after :meth:`write_kv_tokens` of each layer. Errors as :meth:`prepare_step`
        (validated first; nothing changes on error)."""
        return self._kv.commit_step(handles, q_lens)

    def batch_tables(self, handles):
        """``(block_tables int32 [B, max_blocks], kv_lens int32 [B])`` for ``handles``
        (kv_len = ``num_tokens()``), as the attention kernel takes them."""
        return self._kv.batch_tables(handles)

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
        return self._kv.attention(layer, query, handles, q_lens, **kernel_options)

    # -- stats ---------------------------------------------------------------------------
    def stats(self):
        """A :class:`CacheStats` snapshot (see its docstring for the keys)."""
        with self._lock:
            return CacheStats.collect(self.config, self._alloc, self._counters, self._handles,
                                      self._swap, self._pressure)

    def check_invariants(self):
        """Verify the page-ownership invariant (see the module docstring); raises
        AssertionError describing the first violation. For tests and leak checks."""
        with self._lock:
            self._life.check_invariants()
        return True

    def __repr__(self):
        return (f"PagedKVCacheManager(blocks={self._alloc.total}, free={self.free_blocks()}, "
                f"handles={len(self._handles)}, prefix_cache={self._prefix.enabled})")


def paged_attention(query, q_tokens, num_heads, num_kv_heads, head_dim, manager, handle, layer,
                    kv_len, *, scale=None, causal=True, out=None, num_threads=None):
    """Attention of ``q_tokens`` query rows of one sequence over its first ``kv_len``
    cached tokens.

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
    tables, lens = manager.batch_tables([handle])
    if kv_len > lens[0]:
        raise ValueError(f"kv_len {kv_len} exceeds the {int(lens[0])} tokens of "
                         f"{getattr(handle, 'request_id', handle)!r}")
    layer = _validate.check_index(layer, cfg.num_layers, "layer")
    return attention_kernel()(q, np.array([0, q_tokens], dtype=np.int32), manager.store.pages(),
                              layer, tables, np.array([kv_len], dtype=np.int32), scale=scale,
                              causal=causal, out=out, num_threads=num_threads)
