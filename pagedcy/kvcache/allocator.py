"""The block allocator: one page pool plus the LRU of evictable prefix-cache pages.

A page on the pool's free list has refcount 0 and belongs to nobody. A page held by
handles has refcount == the number of handles holding it. A prefix-cached page that no
handle holds any more is *evictable*: it keeps its hash and exactly one pool reference,
owned here, so the pool's LIFO free list can never hand it out behind the LRU's back,
until a prefix hit takes it back (:meth:`BlockAllocator.reclaim`) or :meth:`take` evicts
it (oldest first) and the prefix cache forgets its hash.
"""
from collections import OrderedDict

import numpy as np

from pagedcy.errors import PoolExhaustedError

__all__ = ["BlockAllocator"]

_NONE = np.zeros(0, dtype=np.intp)
_NONE.flags.writeable = False


class BlockAllocator:
    """Takes and releases pages of ``pool`` for a manager.

    BlockAllocator(pool, cache, counters)

    pool: the :class:`~pagedcy.PagePool`; cache: the
    :class:`~pagedcy.kvcache.prefix.PrefixCache` (consulted on release and copy-on-write,
    told of evictions); counters: the manager's
    :class:`~pagedcy.kvcache.stats.Counters` (failures, evictions, cow_copies).
    Not locked: the manager serialises calls.
    """

    def __init__(self, pool, cache, counters):
        self._pool = pool
        self._cache = cache
        self._counters = counters
        self._evictable = OrderedDict()    # page -> None, least recently released first
        self.peak = 0                      # largest used() seen by note_peak()

    # -- accounting ------------------------------------------------------------------------
    @property
    def total(self):
        """Pages in the pool."""
        return self._pool.max_pages

    def available(self):
        """Pages :meth:`take` can get: free plus evictable."""
        return self._pool.free_count() + len(self._evictable)

    def used(self):
        """Pages held by at least one handle."""
        return self._pool.allocated_count() - len(self._evictable)

    def num_evictable(self):
        """Evictable prefix-cache pages."""
        return len(self._evictable)

    def evictable_pages(self):
        """Evictable pages, the next to be evicted first (a list copy)."""
        return list(self._evictable)

    def is_evictable(self, page):
        """True if ``page`` is evictable (held only by the cache)."""
        return page in self._evictable

    def note_peak(self):
        """Update :attr:`peak` after an operation that may have grown :meth:`used`."""
        used = self.used()
        if used > self.peak:
            self.peak = used

    def need(self, n, available=None):
        """PoolExhaustedError (counted as a failure) unless ``n`` pages are available
        (``available`` overrides :meth:`available`)."""
        avail = self.available() if available is None else available
        if n > avail:
            self._counters.failures += 1
            raise PoolExhaustedError(f"need {n} blocks, {avail} available "
                                     f"(of {self._pool.max_pages})")

    # -- taking and releasing ------------------------------------------------------------
    def take(self, n):
        """``n`` private pages (refcount 1): free ones first, then the oldest evictable.
        The caller has checked :meth:`need`."""
        if n <= 0:
            return []
        k = min(n, self._pool.free_count())
        got = self._pool.alloc_many(k).tolist() if k else []
        while len(got) < n:
            page, _ = self._evictable.popitem(last=False)
            # The cache's reference becomes the new owner's: the page never hits the free list.
            self._cache.forget(page)
            self._counters.evictions += 1
            got.append(page)
        return got

    def reclaim(self, pages):
        """Add one holder to each of ``pages`` (prefix hits): an evictable page's cache
        reference becomes the holder's, any other page gets an incref."""
        for p in pages:
            if p in self._evictable:
                del self._evictable[p]
            else:
                self._pool.incref(p)

    def share(self, pages):
        """Add one holder to each of ``pages`` (a fork): incref."""
        for p in pages:
            self._pool.incref(p)

    def release(self, page):
        """Drop one holder of ``page``; a cached page whose last holder leaves stays
        allocated (the cache's reference) at the most recent end of the evictable LRU."""
        if page in self._cache and self._pool.ref_count(page) == 1:
            self._evictable[page] = None
        else:
            self._pool.free(page)

    def release_all(self, pages):
        """Release ``pages`` last first: a prompt's tail is the least likely to be
        shared again, so it should be evicted first (vLLM frees in reverse too)."""
        for p in reversed(pages):
            self.release(p)

    def drop_evictable(self):
        """Free every evictable page (the cache is being reset); returns how many."""
        n = len(self._evictable)
        for page in self._evictable:
            self._pool.free(page)
        self._evictable.clear()
        return n

    # -- copy-on-write ---------------------------------------------------------------------
    def make_private(self, pages):
        """Copy-on-write before a write to ``pages`` (int32 ``[n]``, one entry per block
        about to be written; a page may appear once for each of its holders writing it).

        Entry i needs a private, unhashed copy if its page is prefix-cached or shared
        with a holder that keeps it; when every holder of an unhashed page writes it,
        the last entry keeps the original. All or nothing: PoolExhaustedError before any
        copy. Returns ``(indices, new_pages)``: entries that got a copy and their pages.
        """
        pool = self._pool
        n = pages.shape[0]
        if n <= 8:
            # a write within a few pages (the common case): no NumPy unless a page is shared
            pl = pages.tolist()
            cache = self._cache
            if not any(pool.ref_count(p) > 1 or p in cache for p in pl):
                return _NONE, []
            rc = np.array([pool.ref_count(p) for p in pl], dtype=np.int32)
        else:
            rc = pool.ref_counts()[pages]
        cached = self._cache.cached_mask(pages)
        todo = np.nonzero((rc > 1) | cached)[0]
        if not todo.size:
            return todo, []
        cand = pages[todo]
        if cand.shape[0] > 1:
            _, inv, touches = np.unique(cand, return_inverse=True, return_counts=True)
            last = np.zeros(cand.shape[0], dtype=bool)
            last[cand.shape[0] - 1 - np.unique(cand[::-1], return_index=True)[1]] = True
            todo = todo[~(~cached[todo] & (touches[inv] == rc[todo]) & last)]
            if not todo.size:
                return todo, []
        self.need(todo.shape[0])
        new = self.take(todo.shape[0])
        for p, q in zip(pages[todo].tolist(), new):
            pool.copy_page(p, q)
            self.release(p)
        self._counters.cow_copies += len(new)
        self.note_peak()
        return todo, new

    def check(self, ref_counts, held):
        """AssertionError unless pool refcounts equal ``held`` (int array: handles holding
        each page) plus the evictable pages' one reference each, every evictable page is
        cached and held by no handle, and the free list matches the refcounts."""
        want = held.copy()
        for p in self._evictable:
            if want[p]:
                raise AssertionError(f"evictable page {p} is held by a handle")
            want[p] += 1
            if p not in self._cache:
                raise AssertionError(f"evictable page {p} has no hash")
        bad = np.nonzero(ref_counts != want)[0]
        if bad.size:
            p = int(bad[0])
            raise AssertionError(f"page {p}: pool refcount {ref_counts[p]}, expected {want[p]}")
        if self._pool.free_count() != int((ref_counts == 0).sum()):
            raise AssertionError("free list length disagrees with refcounts")
