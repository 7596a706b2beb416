"""asv benchmarks for the core: page pool, page table, per-token and bulk appends, gathers.

Copy throughput is reported next to ``np.copyto`` on the same number of bytes, so the
ratio (ours / memcpy) is what to read: absolute times drift on a shared machine.
"""
import time

import numpy as np

import pagedcy
from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PagePool, PageTable
from pagedcy.tools.bench import best_time


def _config(n_tokens, dtype="float32", eviction=EvictionPolicy.NONE, page_size=16):
    return PagedKVCacheConfig(page_size=page_size, max_pages=(n_tokens + page_size - 1) // page_size,
                              num_layers=4, num_kv_heads=8, head_dim=128, eviction=eviction,
                              dtype=dtype)


class PoolAllocFree:
    """alloc() then free() of every page of a 4096-page pool (one page per pair of calls)."""

    def setup(self):
        self.pool = PagePool(4096, 64)

    def time_alloc_free_all(self):
        pool = self.pool
        pages = [pool.alloc() for _ in range(4096)]
        for p in pages:
            pool.free(p)

    def time_alloc_many_free(self):
        pages = self.pool.alloc_many(4096)
        for p in pages:
            self.pool.free(p)

    def peakmem_pool_4096_pages(self):
        PagePool(4096, 64 * 1024).alloc_many(4096)


class TableResolve:
    """resolve() over a 1024-page table."""

    def setup(self):
        self.table = PageTable(16)
        for p in np.random.default_rng(0).permutation(1024):
            self.table.push_page(int(p))
        self.table.set_seq_len(16 * 1024)

    def time_resolve_1k(self):
        r = self.table.resolve
        for pos in range(0, 16 * 1024, 16):
            r(pos)

    def time_pop_front_push(self):
        t = self.table
        for _ in range(1024):
            t.push_page(t.pop_front_page())

    def peakmem_table_1m_pages(self):
        t = PageTable(16)
        for p in range(1 << 20):
            t.push_page(p)


class AppendPerToken:
    """append_kv_layer for every layer + advance, one token at a time (decode-style writes)."""

    params = [["float32", "float16"], [EvictionPolicy.NONE, EvictionPolicy.LRU]]
    param_names = ["dtype", "eviction"]

    def setup(self, dtype, eviction):
        self.n = 256
        self.cache = PagedKVCache(_config(self.n // 2 if eviction is EvictionPolicy.LRU else self.n,
                                          dtype, eviction))
        self.rows = np.random.default_rng(0).standard_normal((self.n, 8 * 128), dtype=np.float32)

    def time_append_256_tokens(self, dtype, eviction):
        self._append()

    def peakmem_append_256_tokens(self, dtype, eviction):
        self._append()

    def track_append_kv_layer_us_per_call(self, dtype, eviction):
        t0 = time.perf_counter()
        self._append()
        return (time.perf_counter() - t0) / (4 * self.n) * 1e6
    track_append_kv_layer_us_per_call.unit = "us"

    def _append(self):
        c = self.cache
        c.reset()
        rows = self.rows
        for t in range(self.n):
            r = rows[t]
            for layer in range(4):
                c.append_kv_layer(layer, r, r)
            c.advance()


class BulkAppendGather:
    """append_tokens (prefill) and gather_k over 4 layers x n tokens x kv_dim 1024."""

    params = [[1024, 8192], ["float32", "float16"]]
    param_names = ["n_tokens", "dtype"]

    def setup(self, n, dtype):
        self.cache = PagedKVCache(_config(n, dtype))
        rng = np.random.default_rng(0)
        self.k = rng.standard_normal((4, n, 1024), dtype=np.float32)
        self.cache.append_tokens(self.k, self.k)
        self.dst = np.empty((n, 1024), dtype=self.cache.pages().dtype)
        self.copy_src = np.empty_like(self.k)
        self.copy_dst = np.empty_like(self.k)

    def time_append_tokens(self, n, dtype):
        self.cache.reset()
        self.cache.append_tokens(self.k, self.k)

    def time_gather_k(self, n, dtype):
        self.cache.gather_k(0, self.dst)

    def time_numpy_copyto_same_bytes(self, n, dtype):
        # K and V for 4 layers: what append_tokens moves (in float32).
        np.copyto(self.copy_dst, self.copy_src)
        np.copyto(self.copy_dst, self.copy_src)

    def peakmem_append_tokens(self, n, dtype):
        c = PagedKVCache(_config(n, dtype))
        c.append_tokens(self.k, self.k)

    def peakmem_gather_k_new_array(self, n, dtype):
        self.cache.gather_k(0)

    def track_append_gbps(self, n, dtype):
        return _best_gbps(lambda: (self.cache.reset(), self.cache.append_tokens(self.k, self.k)),
                          2 * self.k.nbytes)
    track_append_gbps.unit = "GB/s"

    def track_gather_gbps(self, n, dtype):
        return _best_gbps(lambda: self.cache.gather_k(0, self.dst), self.dst.nbytes)
    track_gather_gbps.unit = "GB/s"

    def track_append_vs_copyto(self, n, dtype):
        ours = _best_gbps(lambda: (self.cache.reset(), self.cache.append_tokens(self.k, self.k)),
                          2 * self.k.nbytes)
        ref = _best_gbps(lambda: np.copyto(self.copy_dst, self.copy_src), self.k.nbytes)
        return ours / ref
    track_append_vs_copyto.unit = "ratio"


def _best_gbps(fn, nbytes, repeats=7):
    return nbytes / best_time(fn, repeats) / 1e9
