"""Handle lifecycle: allocate (with prefix hits), grow, fork, swap out/in and release.

:class:`SequenceLifecycle` coordinates the block allocator, prefix cache, swap space and
handle table of one manager; :class:`~pagedcy.serving.manager.PagedKVCacheManager`'s
methods of the same names document the arguments and errors. Not locked: the manager
holds its lock around every call.
"""
import itertools

import numpy as np

from pagedcy import _validate
from pagedcy.serving.handle import PagedKVCacheHandle
from pagedcy.serving.request import AllocationRequest

__all__ = ["SequenceLifecycle"]


class SequenceLifecycle:
    """Creates, resizes, forks, swaps and releases the handles of one manager.

    SequenceLifecycle(manager, config, store, handles, allocator, prefix_cache, swap,
                      counters, lock)

    manager and lock are what new handles report to; swap may be None.
    """

    def __init__(self, manager, config, store, handles, allocator, prefix_cache, swap,
                 counters, lock):
        self._mgr = manager
        self._lock = lock
        self.config = config
        self.page_size = config.page_size
        self._store = store
        self._handles = handles
        self._alloc = allocator
        self._prefix = prefix_cache
        self._swap = swap
        self._counters = counters

    # -- allocation -----------------------------------------------------------------------
    def _plan(self, request):
        if not isinstance(request, AllocationRequest):
            raise TypeError(f"request must be an AllocationRequest, got {type(request).__name__}")
        hashes, matched = self._prefix.lookup(request.prompt_tokens, request.cache_salt)
        new = -(-request.initial_tokens // self.page_size) - len(matched)
        # matched evictable pages come out of the evictable LRU, so they are not free too
        avail = self._alloc.available() - sum(map(self._alloc.is_evictable, matched))
        return hashes, matched, new, avail

    def can_allocate(self, request):
        """:meth:`PagedKVCacheManager.can_allocate`."""
        _, _, new, avail = self._plan(request)
        return request.request_id not in self._handles and new <= avail

    def _new_handle(self, rid, max_len, blocks, num_tokens, cached, prompt):
        h = PagedKVCacheHandle(self._mgr, self._lock, self._store.pool, self.page_size, rid,
                               max_len)
        h._set_blocks(blocks)
        h._num_tokens, h._cached, h._prompt = num_tokens, cached, prompt
        self._handles.add(h)
        return h

    def allocate(self, request):
        """:meth:`PagedKVCacheManager.allocate`."""
        hashes, matched, new, avail = self._plan(request)
        rid = self._handles.new_id(request.request_id)
        self._alloc.need(new, avail)
        self._alloc.reclaim(matched)
        prompt = request.prompt_tokens
        if prompt is not None:
            prompt = prompt.view()
            prompt.flags.writeable = False
        h = self._new_handle(rid, request.max_sequence_length, matched + self._alloc.take(new),
                             request.initial_tokens, len(matched) * self.page_size, prompt)
        if prompt is not None:
            h._progress = self._prefix.start(len(prompt), hashes, matched,
                                             self.config.num_layers)
        self._counters.allocations += 1
        self._alloc.note_peak()
        return h

    def allocate_blocks(self, handle, n):
        """:meth:`PagedKVCacheManager.allocate_blocks`."""
        return self._grow(self._handles.resident(handle), _validate.check_count(n, "n"))

    def _grow(self, h, n):
        self._alloc.need(n)
        pages = self._alloc.take(n)
        h._set_blocks(h._blocks + pages)
        self._alloc.note_peak()
        return pages

    def extend(self, handle, additional_tokens):
        """:meth:`PagedKVCacheManager.extend`."""
        h = self._handles.resident(handle)
        add = _validate.check_count(additional_tokens, "additional_tokens")
        n = h._num_tokens + add
        if h._max_len is not None and n > h._max_len:
            raise ValueError(f"{n} tokens exceed max_sequence_length {h._max_len}")
        pages = self._grow(h, max(0, -(-n // self.page_size) - len(h._blocks)))
        h._num_tokens = n
        return pages

    def deallocate(self, handle_or_request_id):
        """:meth:`PagedKVCacheManager.deallocate`."""
        h = self._handles.get(handle_or_request_id)
        if h._swap_blocks is not None:
            self._swap.free(h._swap_blocks)
            h._swap_blocks = None
        self._alloc.release_all(h._blocks)
        h._set_blocks([])
        h._alive = False
        h._progress = None
        self._handles.remove(h)
        self._counters.deallocations += 1

    def fork(self, handle, request_id=None):
        """:meth:`PagedKVCacheManager.fork`."""
        h = self._handles.resident(handle)
        request_id = self._handles.new_id(request_id)
        self._alloc.share(h._blocks)
        c = self._new_handle(request_id, h._max_len, list(h._blocks), h._num_tokens,
                             h._cached, h._prompt)
        self._counters.forks += 1
        return c

    def reset_prefix_cache(self):
        """:meth:`PagedKVCacheManager.reset_prefix_cache`."""
        n = self._alloc.drop_evictable()
        self._prefix.clear()
        for h in self._handles.values():
            h._progress = None
        return n

    # -- swap -------------------------------------------------------------------------------
    def swap_out(self, handle):
        """:meth:`PagedKVCacheManager.swap_out`."""
        h = self._handles.resident(handle)
        if self._swap is None:
            raise ValueError("this manager has no swap space (swap_pages=0)")
        h._swap_blocks = self._swap.put(self._store, h.block_table())
        self._alloc.release_all(h._blocks)
        h._set_blocks([])
        h._progress = None     # its pages change identity: no later registration

    def swap_in(self, handle):
        """:meth:`PagedKVCacheManager.swap_in`."""
        h = self._handles.get(handle)
        if h._swap_blocks is None:
            raise ValueError(f"handle {h.request_id!r} is not swapped out")
        self._alloc.need(len(h._swap_blocks))
        pages = self._alloc.take(len(h._swap_blocks))
        self._swap.take_back(self._store, h._swap_blocks, pages)
        h._swap_blocks = None
        h._set_blocks(pages)
        self._alloc.note_peak()

    def check_invariants(self):
        """:meth:`PagedKVCacheManager.check_invariants`: pool refcounts, evictable pages
        and prefix maps against the handles' block tables, swap pages against the
        swapped-out handles."""
        rc = self._store.pool.ref_counts()
        hs = self._handles.values()
        held = np.bincount(np.fromiter(itertools.chain.from_iterable(h._blocks for h in hs),
                                       np.intp), minlength=rc.shape[0]).astype(rc.dtype)
        self._alloc.check(rc, held)
        self._prefix.check(rc)
        if self._swap is not None:
            sw = sum(len(h._swap_blocks) for h in hs if h._swap_blocks is not None)
            if sw != self._swap.used_blocks():
                raise AssertionError("swap pool pages leaked")
