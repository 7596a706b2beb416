"""Fuzz every public entry point with random junk: only documented exceptions may come out.

Documented: TypeError, ValueError, IndexError, PoolExhaustedError (a MemoryError), and
KeyError for lookups by an unknown request id. Anything else (or a crash) fails.
Bounded by Hypothesis' example count, so the whole file runs in seconds.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedcy
from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PagePool, PageTable
from pagedcy._libs._store import KVPageStore
from pagedcy.kvcache.executor import PagedAttentionExecutor, PagedExecutorConfig
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager, paged_attention

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
    t.update(_attention_targets(cache))
    t.update(_manager_targets())
    return t


def _attention_targets(cache):
    pages = cache.pages()
    q = np.ones((2, 4, 4), np.float32)
    ind = np.array([0, 1, 2], np.int32)
    bt = np.array([[0, 1], [1, 0]], np.int32)
    lens = np.array([5, 3], np.int32)
    attn = pagedcy.batch_paged_attention
    return {
        "attn_all": lambda a: attn(a[0], a[1], a[2], a[3], a[4], a[5 % len(a)]),
        "attn_query": lambda a: attn(a[0], ind, pages, 0, bt, lens),
        "attn_indptr": lambda a: attn(q, a[0], pages, 0, bt, lens),
        "attn_pages": lambda a: attn(q, ind, a[0], 0, bt, lens),
        "attn_layer": lambda a: attn(q, ind, pages, a[0], bt, lens),
        "attn_tables": lambda a: attn(q, ind, pages, 0, a[0], lens),
        "attn_lens": lambda a: attn(q, ind, pages, 0, bt, a[0]),
        "attn_options": lambda a: attn(q, ind, pages, 0, bt, lens, scale=a[0], causal=a[1],
                                       window_left=a[2], soft_cap=a[3], alibi_slopes=a[4]),
        "attn_out": lambda a: attn(q, ind, pages, 0, bt, lens, out=a[0], num_threads=a[1]),
        "cache_attention": lambda a: cache.attention(a[0], a[1]),
        "merge_states": lambda a: pagedcy.merge_states(a[0], a[1], a[2], a[3]),
    }


def _manager_targets():
    cfg = PagedKVCacheConfig(page_size=4, max_pages=8, num_layers=2, num_kv_heads=2, head_dim=4)
    mgr = PagedKVCacheManager(cfg, enable_prefix_cache=True, swap_pages=4)
    h = mgr.allocate(AllocationRequest("a", initial_tokens=6))
    mgr.write_kv_tokens(h, 0, 0, np.ones((6, 8), np.float32), np.ones((6, 8), np.float32))
    ex = PagedAttentionExecutor(PagedExecutorConfig(vocab_size=16, num_layers=2, num_heads=4,
                                                    num_kv_heads=2, head_dim=4,
                                                    max_sequence_length=32), mgr)
    q = np.ones((1, 4, 4), np.float32)
    return {
        "mgr_allocate": lambda a: mgr.deallocate(mgr.allocate(AllocationRequest(*a[:4]))),
        "mgr_allocate_blocks": lambda a: mgr.allocate_blocks(a[0], a[1]),
        "mgr_allocate_blocks_h": lambda a: mgr.allocate_blocks(h, a[0]),
        "mgr_extend": lambda a: mgr.extend(h, a[0]),
        "mgr_write_kv": lambda a: mgr.write_kv(h, a[0], a[1], a[2], a[3]),
        "mgr_write_kv_tokens": lambda a: mgr.write_kv_tokens(h, a[0], a[1], a[2], a[3]),
        "mgr_read_kv": lambda a: mgr.read_kv(h, a[0], a[1], a[2]),
        "mgr_set_num_tokens": lambda a: h.set_num_tokens(a[0]),
        "mgr_attention": lambda a: mgr.attention(a[0], a[1], [h], a[2]),
        "mgr_attention_q": lambda a: mgr.attention(0, q, a[0]),
        "mgr_get_handle": lambda a: mgr.get_handle(a[0]),
        "mgr_deallocate_junk": lambda a: mgr.deallocate(a[0]),
        "mgr_fork_junk": lambda a: mgr.fork(a[0], a[1]),
        "mgr_swap_out_junk": lambda a: mgr.swap_out(a[0]),
        "mgr_swap_in_junk": lambda a: mgr.swap_in(a[0]),
        "mgr_swap_cycle": lambda a: _swap_cycle(mgr, h, a),
        "mgr_prepare_step": lambda a: mgr.prepare_step(a[0], a[1]),
        "mgr_prepare_step_h": lambda a: mgr.prepare_step([h], a[0]),
        "mgr_commit_step": lambda a: mgr.commit_step(a[0], a[1]),
        "paged_attention": lambda a: paged_attention(a[0], a[1], 4, 2, 4, mgr, h, a[2], a[3]),
        "exec_prefill": lambda a: ex.prefill(a[0]),
        "exec_decode": lambda a: ex.decode(a[0], a[1]),
    }


def _swap_cycle(mgr, h, a):
    """Swap a real fork of ``h`` out, then swap in whatever the junk picks: the swapped
    handle, its request id, a resident handle, a deallocated one or the junk itself.
    Whatever happens, a handle that came back holds h's data and no page leaks."""
    child = mgr.fork(h)
    gone = mgr.fork(h)
    mgr.deallocate(gone)
    try:
        mgr.swap_out(child)
        pick = a[1] if isinstance(a[1], int) and not isinstance(a[1], bool) else len(repr(a[1]))
        target = [child, child.request_id, h, gone, a[0]][pick % 5]
        try:
            mgr.swap_in(target)
        finally:
            # junk can never name the child (its id is a fresh "req-<n>" string)
            assert child.is_swapped() == (pick % 5 not in (0, 1))
            if child.is_swapped():
                mgr.swap_in(child)
        for layer in range(mgr.config.num_layers):
            for got, want in zip(mgr.read_kv(child, layer, 0, h.num_tokens()),
                                 mgr.read_kv(h, layer, 0, h.num_tokens())):
                np.testing.assert_array_equal(got, want)
    finally:
        mgr.deallocate(child)
        mgr.check_invariants()


@pytest.mark.parametrize("name", sorted(_targets()))
@settings(max_examples=int(os.environ.get("PAGEDCY_FUZZ_EXAMPLES", "60")), deadline=None, suppress_health_check=list(HealthCheck))
@given(args=st.lists(junk, min_size=5, max_size=5))
def test_only_documented_exceptions(name, args):
    fn = _targets()[name]
    try:
        fn(args)
    except DOCUMENTED:
        pass
