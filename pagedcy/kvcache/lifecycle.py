"""Handle lifecycle: allocate (with prefix hits), grow, fork, swap out/in and release.

:class:`SequenceLifecycle` coordinates the block allocator, prefix cache, swap space and
handle table of one manager; :class:`~pagedcy.kvcache.manager.PagedKVCacheManager`'s
methods of the same names document the arguments and errors. Not locked: the manager
holds its lock around every call.
"""
import itertools

import numpy as np

from pagedcy import _validate
from pagedcy.kvcache.handle import PagedKVCacheHandle
from pagedcy.kvcache.request import AllocationRequest

__all__ = ["SequenceLifecycle"]


class SequenceLifecycle:
    """Creates, resizes, forks, swaps and releases the handles of one manager.

    SequenceLifecycle(parts): parts is the manager's
    :class:`~pagedcy.kvcache.parts.ManagerParts`.
    """

    def __init__(self, parts):
        self._p = parts
        self.config = parts.config
        self.page_size = parts.config.page_size

    # -- allocation -----------------------------------------------------------------------
    def _plan(self, request):
        if not isinstance(request, AllocationRequest):
            raise TypeError(f"request must be an AllocationRequest, got {type(request).__name__}")
        hashes, matched = self._p.prefix.lookup(request.prompt_tokens, request.cache_salt)
        new = -(-request.initial_tokens // self.page_size) - len(matched)
        # matched evictable pages come out of the evictable LRU, so they are not free too
        avail = self._p.allocator.available() - sum(map(self._p.allocator.is_evictable, matched))
        return hashes, matched, new, avail

    def can_allocate(self, request):
        """:meth:`PagedKVCacheManager.can_allocate`."""
        _, _, new, avail = self._plan(request)
        return request.request_id not in self._p.handles and new <= avail

    def _new_handle(self, rid, max_len, blocks, num_tokens, cached, prompt):
        p = self._p
        h = PagedKVCacheHandle(p.manager, p.lock, p.store.pool, self.page_size, rid, max_len)
        h._set_blocks(blocks)
        h._num_tokens, h._cached, h._prompt = num_tokens, cached, prompt
        self._p.handles.add(h)
        return h

    def allocate(self, request):
        """:meth:`PagedKVCacheManager.allocate`."""
        hashes, matched, new, avail = self._plan(request)
        rid = self._p.handles.new_id(request.request_id)
        alloc = self._p.allocator
        alloc.need(new, avail)
        alloc.reclaim(matched)
        prompt = request.prompt_tokens
        if prompt is not None:
            prompt = prompt.view()
            prompt.flags.writeable = False
        h = self._new_handle(rid, request.max_sequence_length, matched + alloc.take(new),
                             request.initial_tokens, len(matched) * self.page_size, prompt)
        if prompt is not None:
            h._progress = self._p.prefix.start(len(prompt), hashes, matched,
                                               self.config.num_layers)
        self._p.counters.allocations += 1
        alloc.note_peak()
        return h

    def allocate_blocks(self, handle, n):
        """:meth:`PagedKVCacheManager.allocate_blocks`."""
        return self._grow(self._p.handles.resident(handle), _validate.check_count(n, "n"))

    def _grow(self, h, n):
        if not n:
            return []          # keep the handle's cached block table
        self._p.allocator.need(n)
        pages = self._p.allocator.take(n)
        h._set_blocks(h._blocks + pages)
        self._p.allocator.note_peak()
        return pages

    def extend(self, handle, additional_tokens):
        """:meth:`PagedKVCacheManager.extend`."""
        h = self._p.handles.resident(handle)
        add = _validate.check_count(additional_tokens, "additional_tokens")
        n = h._num_tokens + add
        if h._max_len is not None and n > h._max_len:
            raise ValueError(f"{n} tokens exceed max_sequence_length {h._max_len}")
        pages = self._grow(h, max(0, -(-n // self.page_size) - len(h._blocks)))
        h._num_tokens = n
        return pages

    def deallocate(self, handle_or_request_id):
        """:meth:`PagedKVCacheManager.deallocate`."""
        h = self._p.handles.get(handle_or_request_id)
        if h._swap_blocks is not None:
            self._p.swap.free(h._swap_blocks)
            h._swap_blocks = None
        self._p.allocator.release_all(h._blocks)
        h._set_blocks([])
        h._alive = False
        h._progress = None
        self._p.handles.remove(h)
        self._p.counters.deallocations += 1

    def fork(self, handle, request_id=None):
        """:meth:`PagedKVCacheManager.fork`."""
        h = self._p.handles.resident(handle)
        request_id = self._p.handles.new_id(request_id)
        self._p.allocator.share(h._blocks)
        c = self._new_handle(request_id, h._max_len, list(h._blocks), h._num_tokens,
                             h._cached, h._prompt)
        self._p.counters.forks += 1
        return c

    def reset_prefix_cache(self):
        """:meth:`PagedKVCacheManager.reset_prefix_cache`."""
        n = self._p.allocator.drop_evictable()
        self._p.prefix.clear()
        for h in self._p.handles.values():
            h._progress = None
        return n

    # -- swap -------------------------------------------------------------------------------
    def swap_out(self, handle):
        """:meth:`PagedKVCacheManager.swap_out`."""
        h = self._p.handles.resident(handle)
        if self._p.swap is None:
            raise ValueError("this manager has no swap space (swap_pages=0)")
        h._swap_blocks = self._p.swap.put(self._p.store, h.block_table())
        self._p.allocator.release_all(h._blocks)
        h._set_blocks([])
        h._progress = None     # its pages change identity: no later registration

    def swap_in(self, handle):
        """:meth:`PagedKVCacheManager.swap_in`."""
        h = self._p.handles.get(handle)
        if h._swap_blocks is None:
            raise ValueError(f"handle {h.request_id!r} is not swapped out")
        self._p.allocator.need(len(h._swap_blocks))
        pages = self._p.allocator.take(len(h._swap_blocks))
        self._p.swap.take_back(self._p.store, h._swap_blocks, pages)
        h._swap_blocks = None
        h._set_blocks(pages)
        self._p.allocator.note_peak()

    def check_invariants(self):
        """:meth:`PagedKVCacheManager.check_invariants`: pool refcounts, evictable pages
        and prefix maps against the handles' block tables, swap pages against the
        swapped-out handles."""
        rc = self._p.store.pool.ref_counts()
        hs = self._p.handles.values()
        held = np.bincount(np.fromiter(itertools.chain.from_iterable(h._blocks for h in hs),
                                       np.intp), minlength=rc.shape[0]).astype(rc.dtype)
        self._p.allocator.check(rc, held)
        self._p.prefix.check(rc)
        if self._p.swap is not None:
            sw = sum(len(h._swap_blocks) for h in hs if h._swap_blocks is not None)
            if sw != self._p.swap.used_blocks():
                raise AssertionError("swap pool pages leaked")
