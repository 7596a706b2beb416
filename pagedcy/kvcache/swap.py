"""Swap space: a secondary page pool (in RAM or a memory-mapped file) that sequences'
pages move to and from, bit-exact."""
import numpy as np

from pagedcy._libs._store import KVPageStore
from pagedcy.config import PagedKVCacheConfig
from pagedcy.errors import PoolExhaustedError

__all__ = ["SwapSpace"]


class SwapSpace:
    """``num_pages`` pages with the primary config's geometry and dtype.

    SwapSpace(config, num_pages, path=None, counters=None)

    path: back the pool with a memory-mapped file there (created/overwritten) instead of
    RAM. counters: the manager's :class:`~pagedcy.kvcache.stats.Counters` (swap_outs,
    swap_ins, failures). Not locked: the manager serialises calls.
    """

    def __init__(self, config, num_pages, path=None, counters=None):
        scfg = PagedKVCacheConfig(config.page_size, num_pages, config.num_layers,
                                  config.num_kv_heads, config.head_dim, dtype=config.dtype)
        self.path = path
        self._map = None
        if path is not None:
            self._map = np.memmap(path, dtype=np.uint8, mode="w+", shape=(scfg.total_bytes(),))
        # In memory (buffer None) the store allocates its own aligned, lazily-zeroed pool.
        self.store = KVPageStore(scfg, self._map)
        self._pool = self.store.pool
        self._counters = counters

    def total_blocks(self):
        """Pages in the swap pool."""
        return self._pool.max_pages

    def used_blocks(self):
        """Swap pages holding a swapped-out sequence."""
        return self._pool.allocated_count()

    def free_blocks(self):
        """Free swap pages."""
        return self._pool.free_count()

    def put(self, src_store, table):
        """Copy the pages ``table`` (int32 ``[n]``) of ``src_store`` into fresh swap pages;
        returns their ids (list). PoolExhaustedError (counted, nothing changed) if the swap
        pool has fewer than ``n`` free pages."""
        n = table.shape[0]
        dst = self._pool.alloc_many(n)
        if dst is None:
            self._counters.failures += 1
            raise PoolExhaustedError(f"swap pool has {self._pool.free_count()} "
                                     f"free pages, {n} needed")
        if n:
            self.store.copy_pages_from(src_store, table, dst)
        self._counters.swap_outs += 1
        return dst.tolist()

    def take_back(self, dst_store, swap_pages, dst_pages):
        """Copy ``swap_pages`` into ``dst_pages`` of ``dst_store`` and free them."""
        if swap_pages:
            dst_store.copy_pages_from(self.store, swap_pages, dst_pages)
        self.free(swap_pages)
        self._counters.swap_ins += 1

    def free(self, swap_pages):
        """Free swap pages (a swapped-out sequence is released)."""
        for p in swap_pages:
            self._pool.free(p)
