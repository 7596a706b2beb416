"""Soak: a million pool/cache operations keep the resident set flat (no leak)."""
import os
import sys

import numpy as np
import pytest

from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PagePool, PoolExhaustedError

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_million_operations_rss_flat():
    pool = PagePool(64, 256)
    cfg = PagedKVCacheConfig(page_size=4, max_pages=8, num_layers=2, num_kv_heads=2, head_dim=8,
                             eviction=EvictionPolicy.LRU)
    cache = PagedKVCache(cfg)
    strict = PagedKVCache(PagedKVCacheConfig(4, 2, 2, 2, 8))
    row = np.ones(16, dtype=np.float32)
    bulk = np.ones((2, 3, 16), dtype=np.float32)

    def run(rounds):
        ops = 0
        for i in range(rounds):
            pages = [pool.alloc() for _ in range(8)]
            for p in pages:
                pool.free(p)
            many = pool.alloc_many(16)
            for p in many:
                pool.free(p)
            cache.append_kv_layer(0, row, row)
            cache.append_kv_layer(1, row, row)
            cache.advance()
            cache.append_tokens(bulk, bulk)
            try:
                strict.append_tokens(bulk, bulk)
            except PoolExhaustedError:
                strict.reset()
            if i % 64 == 0:
                cache.gather_k(i % 2)
            ops += 8 + 8 + 16 + 16 + 3 + 1 + 1
        return ops

    run(2_000)  # warm up allocator pools and caches
    before = rss_bytes()
    ops = run(19_000)
    after = rss_bytes()
    assert ops >= 1_000_000
    assert pool.free_count() == 64
    # A leak of even 8 bytes per operation would show as 8 MB.
    assert after - before < 4 * 2**20, f"RSS grew by {(after - before) / 2**20:.1f} MiB over {ops} ops"
    assert sys.getrefcount(row) < 10
