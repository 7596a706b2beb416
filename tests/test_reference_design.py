"""One-for-one Python twins of the reference design's tests (same names, same assertions).

The reference design fills caller-owned float buffers in gather_*; here those buffers are
1-D float32 ``dst`` arrays, which the core must fill in place.
"""
import numpy as np
import pytest

from pagedcy import (EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PagePool, PageTable,
                     PoolExhaustedError)


def cache_with_token(max_pages):
    """A fresh cache and the constant token the reference tests append (K ones, V twos)."""
    config = make_config(max_pages)
    k = np.full(config.kv_dim(), 1.0, np.float32)
    return PagedKVCache(config), k, k * 2


def append_same_token(cache, k, v, times=1):
    """Append the token (k, v) to both layers and advance, ``times`` times."""
    for _ in range(times):
        for layer in range(2):
            cache.append_kv_layer(layer, k, v)
        cache.advance()


def assert_layer0_rows(cache, n, kv_dim, k_expected, tol):
    """Gather layer 0 into caller-owned buffers; K[step, i] must be k_expected(step, i) and
    V = K + 0.5, within tol."""
    k_buf = np.zeros(n * kv_dim, np.float32)
    v_buf = np.zeros(n * kv_dim, np.float32)
    cache.gather_k(0, k_buf)
    cache.gather_v(0, v_buf)
    for step in range(n):
        for i in range(kv_dim):
            k_want = k_expected(step, i)
            k_got, v_got = k_buf[step * kv_dim + i], v_buf[step * kv_dim + i]
            assert abs(k_got - k_want) < tol, f"K step={step}, i={i}: {k_want} vs {k_got}"
            assert abs(v_got - (k_want + 0.5)) < tol, f"V step={step}, i={i}: {k_want + 0.5} vs {v_got}"


def make_config(max_pages):
    return PagedKVCacheConfig(page_size=4, max_pages=max_pages, num_layers=2, num_kv_heads=2,
                              head_dim=4, eviction=EvictionPolicy.NONE)


def test_paged_append_gather_roundtrip():
    config = make_config(4)
    kv_dim = config.kv_dim()
    assert kv_dim == 8
    cache = PagedKVCache(config)

    for step in range(3):
        for layer in range(2):
            marker = float(step * 10 + layer)
            cache.append_kv_layer(layer, np.full(kv_dim, marker, np.float32),
                                  np.full(kv_dim, marker + 0.5, np.float32))
        cache.advance()
    assert cache.seq_len() == 3

    k_buf = np.zeros(3 * kv_dim, np.float32)
    v_buf = np.zeros(3 * kv_dim, np.float32)
    cache.gather_k(0, k_buf)
    cache.gather_v(0, v_buf)
    assert k_buf[0] == 0.0
    assert v_buf[0] == 0.5
    assert k_buf[kv_dim] == 10.0
    assert v_buf[kv_dim] == 10.5
    assert k_buf[2 * kv_dim] == 20.0
    assert v_buf[2 * kv_dim] == 20.5

    cache.gather_k(1, k_buf)
    cache.gather_v(1, v_buf)
    assert k_buf[0] == 1.0
    assert v_buf[0] == 1.5


def test_paged_page_allocation():
    cache, k, v = cache_with_token(8)
    assert cache.num_pages() == 0
    assert cache.free_pages() == 8

    append_same_token(cache, k, v)
    assert cache.num_pages() == 1
    assert cache.free_pages() == 7

    append_same_token(cache, k, v, times=3)
    assert cache.num_pages() == 1
    assert cache.seq_len() == 4

    append_same_token(cache, k, v)
    assert cache.num_pages() == 2
    assert cache.free_pages() == 6


def test_paged_reset():
    cache, k, v = cache_with_token(4)
    append_same_token(cache, k, v, times=6)
    assert cache.num_pages() > 0

    cache.reset()
    assert cache.seq_len() == 0
    assert cache.num_pages() == 0
    assert cache.free_pages() == 4


def test_paged_cross_page_boundary():
    config = make_config(4)
    kv_dim = config.kv_dim()
    cache = PagedKVCache(config)

    for step in range(6):
        for layer in range(2):
            k = np.array([step * 100.0 + i for i in range(kv_dim)], np.float32)
            v = np.array([step * 100.0 + i + 0.5 for i in range(kv_dim)], np.float32)
            cache.append_kv_layer(layer, k, v)
        cache.advance()
    assert cache.num_pages() == 2

    assert_layer0_rows(cache, 6, kv_dim, lambda step, i: step * 100.0 + i, 1e-6)


def test_paged_non_multiple_gather_kv():
    config = make_config(8)
    kv_dim = config.kv_dim()
    page_size = config.page_size
    seq_len = page_size * 2 + 3
    cache = PagedKVCache(config)

    for step in range(seq_len):
        for layer in range(2):
            # f32 arithmetic like the reference design, so the stored values are the same floats.
            k = np.array([np.float32(step) * np.float32(10.0) + np.float32(layer)
                          + np.float32(i) * np.float32(0.1) for i in range(kv_dim)], np.float32)
            v = k + np.float32(0.5)
            cache.append_kv_layer(layer, k, v)
        cache.advance()
    assert cache.seq_len() == seq_len

    assert_layer0_rows(cache, seq_len, kv_dim, lambda step, i: step * 10.0 + 0.0 + i * 0.1, 1e-5)


def test_paged_memory_accounting():
    config = PagedKVCacheConfig(page_size=256, max_pages=16, num_layers=28, num_kv_heads=8,
                                head_dim=128, eviction=EvictionPolicy.NONE)
    expected_per_page = 28 * 2 * 256 * 1024 * 4
    assert config.bytes_per_page() == expected_per_page

    cache = PagedKVCache(config)
    assert cache.total_memory_bytes() == 16 * expected_per_page
    assert cache.used_memory_bytes() == 0


def test_paged_no_eviction_panics_on_exhaustion():
    cache, k, v = cache_with_token(1)
    append_same_token(cache, k, v, times=4)

    with pytest.raises(PoolExhaustedError) as info:
        for layer in range(2):
            cache.append_kv_layer(layer, k, v)
    assert str(info.value).startswith("PagePool exhausted")
    assert isinstance(info.value, MemoryError)


def test_page_pool_alloc_free_cycle():
    pool = PagePool(4, 16)
    assert pool.free_count() == 4

    p0 = pool.alloc()
    _p1 = pool.alloc()
    assert p0 is not None and _p1 is not None
    assert pool.free_count() == 2
    assert pool.allocated_count() == 2

    pool.free(p0)
    assert pool.free_count() == 3

    p2 = pool.alloc()
    assert p2 == p0


def test_page_table_resolve():
    table = PageTable(4)
    table.push_page(10)
    table.push_page(5)
    table.set_seq_len(6)

    assert table.resolve(0) == (10, 0)
    assert table.resolve(3) == (10, 3)
    assert table.resolve(4) == (5, 0)
    assert table.resolve(5) == (5, 1)
