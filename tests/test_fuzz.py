"""Fuzz every public entry point with random junk: only documented exceptions may come out.

Documented: TypeError, ValueError, IndexError, PoolExhaustedError (a MemoryError), and
KeyError for lookups by an unknown request id. Anything else (or a crash) fails.
Bounded by Hypothesis' example count, so the whole file runs in seconds.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedcy
from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PagePool, PageTable
from pagedcy._store import KVPageStore

DOCUMENTED = (TypeError, ValueError, IndexError, pagedcy.PoolExhaustedError, KeyError)

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_,
          np.complex64, object]


@st.composite
def arrays(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
    dtype = draw(st.sampled_from(DTYPES))
    size = int(np.prod(shape)) if shape else 1
    if size > 2000:
        shape, size = (7,), 7
    arr = np.arange(size).reshape(shape).astype(dtype) if dtype is not object else \
        np.array([None] * size, dtype=object).reshape(shape)
    if draw(st.booleans()) and arr.ndim and arr.shape[-1] > 1:
        arr = arr[..., ::2]            # non-contiguous
    if draw(st.booleans()):
        arr.flags.writeable = False
    return arr


junk = st.one_of(
    st.integers(-2**70, 2**70), st.integers(-3, 40), st.floats(allow_nan=True),
    st.booleans(), st.none(), st.text(max_size=3), arrays(),
    st.lists(st.integers(-2, 10), max_size=5), st.tuples(st.integers(0, 3), st.integers(0, 3)))


def _config():
    return PagedKVCacheConfig(page_size=4, max_pages=6, num_layers=2, num_kv_heads=2, head_dim=4,
                              eviction=EvictionPolicy.NONE)


def _valid_rows(n=1):
    return np.ones((n, 8), dtype=np.float32)


def _targets():
    """(name, callable(args)) for every public entry point, on fresh small objects."""
    cfg = _config()
    pool = PagePool(6, 16)
    pool.alloc()
    table = PageTable(4)
    table.push_page(1)
    cache = PagedKVCache(cfg)
    cache.append_tokens(np.ones((2, 5, 8), np.float32), np.ones((2, 5, 8), np.float32))
    lru = PagedKVCache(PagedKVCacheConfig(4, 2, 2, 2, 4, eviction=EvictionPolicy.LRU))
    store = KVPageStore(cfg)
    t = {
        "config": lambda a: PagedKVCacheConfig(*a[:5]),
        "config_kw": lambda a: PagedKVCacheConfig(4, 4, 1, 1, 4, eviction=a[0], dtype=a[1]),
        "pool_new": lambda a: PagePool(a[0], a[1], a[2]),
        "pool_free": lambda a: pool.free(a[0]),
        "pool_incref": lambda a: pool.incref(a[0]),
        "pool_alloc_many": lambda a: pool.alloc_many(a[0]),
        "pool_page_data": lambda a: pool.page_data(a[0]),
        "pool_copy": lambda a: pool.copy_page(a[0], a[1]),
        "pool_as_array": lambda a: pool.as_array(a[0]),
        "table_new": lambda a: PageTable(a[0]),
        "table_resolve": lambda a: table.resolve(a[0]),
        "table_push": lambda a: table.push_page(a[0]),
        "table_set_seq_len": lambda a: table.set_seq_len(a[0]),
        "cache_append": lambda a: cache.append_kv_layer(a[0], a[1], a[2]),
        "cache_append_valid_rows": lambda a: cache.append_kv_layer(a[0], _valid_rows()[0], a[1]),
        "cache_append_tokens": lambda a: cache.append_tokens(a[0], a[1]),
        "lru_append_tokens": lambda a: lru.append_tokens(a[0], a[0]),
        "cache_gather": lambda a: cache.gather_k(a[0], a[1]),
        "cache_gather_v": lambda a: cache.gather_v(0, a[0]),
        "store_write": lambda a: store.write(a[0], a[1], a[2], a[3], a[4]),
        "store_write_rows": lambda a: store.write(np.arange(2, dtype=np.int32), 0, a[0],
                                                  _valid_rows(2), a[1]),
        "store_read": lambda a: store.read(a[0], a[1], a[2], a[3], a[4]),
        "store_copy": lambda a: store.copy_pages_from(store, a[0], a[1]),
    }
    return t


@pytest.mark.parametrize("name", sorted(_targets()))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(args=st.lists(junk, min_size=5, max_size=5))
def test_only_documented_exceptions(name, args):
    fn = _targets()[name]
    try:
        fn(args)
    except DOCUMENTED:
        pass
