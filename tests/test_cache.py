"""PagedKVCache against plain NumPy references: roundtrips, dtypes, bulk path, sliding window."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PoolExhaustedError

from core_helpers import (CacheModel, assert_bits_equal, check_window, stored_as_f32,
                          stored_bits)

NONE, LRU = EvictionPolicy.NONE, EvictionPolicy.LRU


def make(page_size=4, max_pages=8, num_layers=2, heads=2, head_dim=4, eviction=NONE,
         dtype="float32"):
    cfg = PagedKVCacheConfig(page_size, max_pages, num_layers, heads, head_dim,
                             eviction=eviction, dtype=dtype)
    return cfg, PagedKVCache(cfg)


def token_rows(rng, num_layers, n, kv_dim, scale=3.0):
    k = (rng.standard_normal((num_layers, n, kv_dim)) * scale).astype(np.float32)
    v = (rng.standard_normal((num_layers, n, kv_dim)) * scale).astype(np.float32)
    return k, v


def snapshot(cache, num_layers):
    """Everything observable about a cache, for 'unchanged after failure' checks."""
    return (cache.seq_len(), cache.evicted_tokens(), cache.num_pages(), cache.free_pages(),
            cache.page_ids().tolist(), cache.free_page_ids().tolist(), cache.used_memory_bytes(),
            [bits_tuple(cache.gather_k(l)) for l in range(num_layers)],
            [bits_tuple(cache.gather_v(l)) for l in range(num_layers)])


def bits_tuple(a):
    a = np.ascontiguousarray(a)
    return (a.shape, a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32).tobytes())


# -- roundtrip ---------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(page_size=st.integers(1, 6), max_pages=st.integers(1, 6), num_layers=st.integers(1, 3),
       heads=st.integers(1, 3), head_dim=st.integers(1, 5), n=st.integers(0, 40),
       seed=st.integers(0, 2**32 - 1))
def test_per_token_roundtrip_matches_numpy(page_size, max_pages, num_layers, heads, head_dim, n,
                                           seed):
    cfg, cache = make(page_size, max_pages, num_layers, heads, head_dim)
    kv_dim = cfg.kv_dim()
    rng = np.random.default_rng(seed)
    k, v = token_rows(rng, num_layers, n, kv_dim)
    appended = 0
    for t in range(n):
        if appended == cfg.max_tokens():
            with pytest.raises(PoolExhaustedError):
                cache.append_kv_layer(0, k[0, t], v[0, t])
            break
        for layer in range(num_layers):
            # Alternate the two accepted token shapes: [kv_dim] and [heads, head_dim].
            kt = k[layer, t] if t % 2 else k[layer, t].reshape(heads, head_dim)
            cache.append_kv_layer(layer, kt, v[layer, t])
        cache.advance()
        appended += 1
    assert cache.seq_len() == appended
    assert cache.num_pages() == -(-appended // page_size)
    assert cache.free_pages() == max_pages - cache.num_pages()
    for layer in range(num_layers):
        gk, gv = cache.gather_k(layer), cache.gather_v(layer)
        assert gk.shape == (appended, kv_dim) and gk.dtype == np.float32
        assert np.array_equal(gk, k[layer, :appended])
        assert np.array_equal(gv, v[layer, :appended])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("which", ["k", "v"])
def test_gather_into_dst_1d_and_2d(dtype, which):
    cfg, cache = make(page_size=3, max_pages=5, dtype=dtype)
    kv_dim = cfg.kv_dim()
    k, v = token_rows(np.random.default_rng(1), 2, 11, kv_dim)
    cache.append_tokens(k, v)
    src = k if which == "k" else v
    gather = cache.gather_k if which == "k" else cache.gather_v
    sdt = cfg.storage_dtype()
    for layer in range(2):
        want = stored_bits(src[layer], dtype)
        for shape in [(11 * kv_dim,), (11, kv_dim)]:
            dst = np.full(shape, 7, dtype=sdt)
            out = gather(layer, dst)
            assert out is dst
            assert_bits_equal(dst, want.reshape(shape), f"{dtype} {shape}")
            dst32 = np.full(shape, np.nan, dtype=np.float32)
            assert gather(layer, dst32) is dst32
            assert np.array_equal(dst32, stored_as_f32(src[layer], dtype).reshape(shape))


def test_gather_of_empty_cache():
    cfg, cache = make()
    assert cache.gather_k(0).shape == (0, cfg.kv_dim())
    assert cache.gather_v(1, np.empty(0, np.float32)).shape == (0,)


def test_pages_layout_matches_documented_axes():
    cfg, cache = make(page_size=3, max_pages=4, num_layers=2, heads=2, head_dim=3)
    k, v = token_rows(np.random.default_rng(2), 2, 7, cfg.kv_dim())
    cache.append_tokens(k, v)
    pages = cache.pages()
    assert pages.shape == (4, 2, 2, 3, 2, 3)
    ids = cache.page_ids().tolist()
    for t in range(7):
        page, off = ids[t // 3], t % 3
        for layer in range(2):
            assert np.array_equal(pages[page, layer, 0, off], k[layer, t].reshape(2, 3))
            assert np.array_equal(pages[page, layer, 1, off], v[layer, t].reshape(2, 3))


# -- storage dtypes ----------------------------------------------------------------------------

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e5, -1e5, 6e-8, 2.9e-8, 3e-8,
                    1e-40, np.inf, -np.inf, 3.0e38, 1.00390625, 1.0039063, 1.01171875,
                    np.float32(1.0) + np.float32(2.0 ** -9), 1 / 3, 2 / 3],
                   dtype=np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_rounds_to_nearest_even(dtype):
    rng = np.random.default_rng(3)
    kv_dim = 16
    # Random floats across many magnitudes plus hand-picked ties, overflows and subnormals.
    vals = (rng.standard_normal(16 * 40) * np.exp2(rng.integers(-30, 30, 16 * 40))).astype(np.float32)
    ties = (rng.integers(0, 2**32, 16 * 20, dtype=np.uint64).astype(np.uint32)
            & np.uint32(0xFFFF0000) | np.uint32(0x8000)).view(np.float32)
    ties = ties[np.isfinite(ties)]
    allv = np.concatenate([SPECIAL, vals, ties])
    allv = np.concatenate([allv, np.zeros((-len(allv)) % kv_dim, np.float32)])
    n = len(allv) // kv_dim
    cfg, cache = make(page_size=5, max_pages=-(-n // 5) + 1, num_layers=1, heads=4, head_dim=4,
                      dtype=dtype)
    rows = allv.reshape(n, kv_dim)
    # Half the tokens per-token, half bulk: both paths must round the same way.
    half = n // 2
    for t in range(half):
        cache.append_kv_layer(0, rows[t], -rows[t])
        cache.advance()
    cache.append_tokens(rows[None, half:], -rows[None, half:])
    gk = cache.gather_k(0)
    assert gk.dtype == cfg.storage_dtype()
    assert_bits_equal(gk, stored_bits(rows, dtype), f"{dtype} K")
    assert_bits_equal(cache.gather_v(0), stored_bits(-rows, dtype), f"{dtype} V")
    k32 = cache.gather_k(0, np.empty((n, kv_dim), np.float32))
    assert np.array_equal(k32, stored_as_f32(rows, dtype))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_accepts_float64_and_float16_inputs(dtype):
    cfg, cache = make(page_size=2, max_pages=4, num_layers=1, heads=1, head_dim=8, dtype=dtype)
    x64 = np.linspace(-3, 3, 8) + 1e-9
    cache.append_kv_layer(0, x64, x64.astype(np.float16))
    cache.advance()
    # float64 input is converted to float32 first, then to the storage dtype.
    assert_bits_equal(cache.gather_k(0), stored_bits(x64.astype(np.float32)[None], dtype), "k")
    assert_bits_equal(cache.gather_v(0),
                      stored_bits(x64.astype(np.float16).astype(np.float32)[None], dtype), "v")


def test_memory_accounting_tracks_pages_and_dtype():
    for dtype, itemsize in [("float32", 4), ("float16", 2), ("bfloat16", 2)]:
        cfg, cache = make(page_size=4, max_pages=6, num_layers=3, heads=2, head_dim=8, dtype=dtype)
        per_page = 3 * 2 * 4 * 16 * itemsize
        assert cfg.bytes_per_page() == per_page
        assert cache.total_memory_bytes() == 6 * per_page
        assert cache.used_memory_bytes() == 0
        k, v = token_rows(np.random.default_rng(4), 3, 9, 16)
        cache.append_tokens(k, v)
        assert cache.used_memory_bytes() == 3 * per_page
        cache.reset()
        assert cache.used_memory_bytes() == 0
    f32 = PagedKVCacheConfig(8, 10, 4, 4, 32)
    f16 = PagedKVCacheConfig(8, 10, 4, 4, 32, dtype="float16")
    assert f16.bytes_per_page() * 2 == f32.bytes_per_page()
    assert PagedKVCache(f16).total_memory_bytes() * 2 == PagedKVCache(f32).total_memory_bytes()


# -- bulk path -----------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(page_size=st.integers(1, 5), max_pages=st.integers(1, 5), num_layers=st.integers(1, 3),
       lru=st.booleans(), chunks=st.lists(st.integers(0, 9), max_size=8),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]), seed=st.integers(0, 2**31))
def test_append_tokens_equals_per_token_path(page_size, max_pages, num_layers, lru, chunks, dtype,
                                             seed):
    cfg, bulk = make(page_size, max_pages, num_layers, 1, 3, LRU if lru else NONE, dtype)
    _, single = make(page_size, max_pages, num_layers, 1, 3, LRU if lru else NONE, dtype)
    rng = np.random.default_rng(seed)
    for n in chunks:
        k, v = token_rows(rng, num_layers, n, 3)
        try:
            bulk.append_tokens(k, v)
        except PoolExhaustedError:
            assert not lru
            # The bulk path is all-or-nothing, so the per-token twin must not be fed either.
            assert -(-(bulk.seq_len() + n) // page_size) > max_pages
            continue
        for t in range(n):
            for layer in range(num_layers):
                single.append_kv_layer(layer, k[layer, t], v[layer, t])
            single.advance()
        assert snapshot(bulk, num_layers) == snapshot(single, num_layers)


# -- LRU sliding window --------------------------------------------------------------------------

@pytest.mark.parametrize("page_size,max_pages,num_layers,dtype", [
    (4, 1, 2, "float32"), (1, 1, 1, "float32"), (1, 3, 2, "float16"), (3, 4, 3, "float32"),
    (16, 2, 1, "bfloat16"), (5, 7, 2, "float32")])
def test_lru_sliding_window_per_token(page_size, max_pages, num_layers, dtype):
    cfg, cache = make(page_size, max_pages, num_layers, 2, 2, LRU, dtype)
    model = CacheModel(page_size, max_pages, num_layers, lru=True)
    n = 3000
    # Token t's rows are all equal to t (exact in every dtype up to 256), so windows are checkable.
    vals = np.arange(n, dtype=np.float32) % 200
    for t in range(n):
        for layer in range(num_layers):
            row = np.full(4, vals[t] + layer, np.float32)
            cache.append_kv_layer(layer, row, -row)
            model.append_kv_layer(layer, row, -row)
        cache.advance()
        model.advance()
        assert cache.seq_len() == model.seq_len
        assert cache.evicted_tokens() == model.evicted
        assert cache.evicted_tokens() + cache.seq_len() == t + 1
        assert 0 < cache.seq_len() <= cfg.max_tokens()
        if t % 97 == 0 or t == n - 1:
            assert cache.page_ids().tolist() == model.table
            for layer in range(num_layers):
                check_window(cache.gather_k(layer), model.window(layer, "k"), 4, dtype, f"k t={t}")
                check_window(cache.gather_v(layer), model.window(layer, "v"), 4, dtype, f"v t={t}")
    assert cache.evicted_tokens() > 0 and cache.evicted_tokens() % page_size == 0
    assert cache.num_pages() == max_pages and cache.free_pages() == 0


@pytest.mark.parametrize("page_size,max_pages", [(4, 1), (1, 1), (2, 3), (7, 5), (32, 4)])
def test_lru_sliding_window_bulk_far_past_exhaustion(page_size, max_pages):
    cfg, cache = make(page_size, max_pages, 2, 1, 4, LRU)
    rng = np.random.default_rng(page_size * 100 + max_pages)
    ref_k = [[], []]
    total = 0
    sizes = list(rng.integers(0, 3 * cfg.max_tokens() + 2, 60)) + [cfg.max_tokens() * 5 + 1]
    for n in sizes:
        k, v = token_rows(rng, 2, int(n), 4)
        cache.append_tokens(k, v)
        total += int(n)
        for layer in range(2):
            ref_k[layer].extend(k[layer])
        ev, held = cache.evicted_tokens(), cache.seq_len()
        assert ev + held == total
        assert ev % page_size == 0
        # The window keeps at most max_tokens and drops whole pages only when needed.
        assert held <= cfg.max_tokens()
        if total > cfg.max_tokens():
            assert held > cfg.max_tokens() - page_size
        else:
            assert ev == 0
        for layer in range(2):
            want = np.array(ref_k[layer][ev:], np.float32).reshape(held, 4)
            assert np.array_equal(cache.gather_k(layer), want)
    assert total > 5 * cfg.max_tokens()


def test_lru_ten_thousand_appends_stay_cheap():
    # A linear-scan LRU (a list scan per touched page) or an O(n) pop_front would make this crawl;
    # no timing assertion, the suite's overall budget is the guard.
    cfg, cache = make(page_size=2, max_pages=64, num_layers=2, heads=1, head_dim=8, eviction=LRU)
    row = np.zeros(8, np.float32)
    for t in range(12_000):
        row[0] = t
        cache.append_kv_layer(0, row, row)
        cache.append_kv_layer(1, row, row)
        cache.advance()
    assert cache.seq_len() + cache.evicted_tokens() == 12_000
    got = cache.gather_k(1)[:, 0]
    assert np.array_equal(got, np.arange(cache.evicted_tokens(), 12_000, dtype=np.float32))


def test_lru_reset_clears_eviction_count():
    cfg, cache = make(page_size=2, max_pages=2, eviction=LRU)
    k, v = token_rows(np.random.default_rng(5), 2, 9, cfg.kv_dim())
    cache.append_tokens(k, v)
    assert cache.evicted_tokens() > 0
    cache.reset()
    assert (cache.seq_len(), cache.evicted_tokens(), cache.num_pages(), cache.free_pages()) == \
        (0, 0, 0, 2)
    assert sorted(cache.free_page_ids().tolist()) == [0, 1]
    cache.append_tokens(k[:, :3], v[:, :3])
    assert cache.evicted_tokens() == 0
    assert np.array_equal(cache.gather_v(1), v[1, :3])


# -- exhaustion with policy NONE ----------------------------------------------------------------

@pytest.mark.parametrize("page_size,max_pages", [(4, 1), (1, 1), (3, 3)])
def test_none_exhaustion_per_token_leaves_cache_unchanged(page_size, max_pages):
    cfg, cache = make(page_size, max_pages, 2, 2, 2, NONE)
    k, v = token_rows(np.random.default_rng(6), 2, cfg.max_tokens() + 1, 4)
    cache.append_tokens(k[:, :-1], v[:, :-1])
    before = snapshot(cache, 2)
    for layer in (0, 1):
        with pytest.raises(PoolExhaustedError) as info:
            cache.append_kv_layer(layer, k[layer, -1], v[layer, -1])
        assert str(info.value).startswith("PagePool exhausted")
        assert snapshot(cache, 2) == before
    with pytest.raises(ValueError):
        cache.advance()
    assert snapshot(cache, 2) == before


@pytest.mark.parametrize("prefill,n", [(0, 13), (5, 8), (11, 2), (12, 1), (3, 100)])
def test_none_exhaustion_bulk_writes_nothing(prefill, n):
    cfg, cache = make(page_size=3, max_pages=4, num_layers=2, heads=1, head_dim=4, eviction=NONE)
    rng = np.random.default_rng(prefill * 7 + n)
    k0, v0 = token_rows(rng, 2, prefill, 4)
    cache.append_tokens(k0, v0)
    before = snapshot(cache, 2)
    pages_before = cache.pages().copy()
    k, v = token_rows(rng, 2, n, 4)
    with pytest.raises(PoolExhaustedError) as info:
        cache.append_tokens(k, v)
    assert str(info.value).startswith("PagePool exhausted")
    assert snapshot(cache, 2) == before
    # Not a single byte of the pool may change, including pages the sequence does not hold.
    assert np.array_equal(cache.pages(), pages_before)


def test_exhaustion_counts_in_message():
    cfg, cache = make(page_size=2, max_pages=3, eviction=NONE)
    k, v = token_rows(np.random.default_rng(7), 2, 6, cfg.kv_dim())
    cache.append_tokens(k, v)
    with pytest.raises(PoolExhaustedError) as info:
        cache.append_kv_layer(0, k[0, 0], v[0, 0])
    msg = str(info.value)
    assert msg.startswith("PagePool exhausted") and "3" in msg


# -- reset ---------------------------------------------------------------------------------------

def test_reset_returns_every_page_and_cache_is_reusable():
    cfg, cache = make(page_size=2, max_pages=5)
    k, v = token_rows(np.random.default_rng(8), 2, 9, cfg.kv_dim())
    cache.append_tokens(k, v)
    assert cache.free_pages() == 0
    cache.reset()
    assert cache.seq_len() == 0 and cache.num_pages() == 0 and cache.free_pages() == 5
    assert sorted(cache.free_page_ids().tolist()) == list(range(5))
    assert cache.page_ids().tolist() == []
    assert cache.gather_k(0).shape == (0, cfg.kv_dim())
    cache.reset()
    assert cache.free_pages() == 5
    cache.append_tokens(k, v)
    assert np.array_equal(cache.gather_k(1), k[1]) and np.array_equal(cache.gather_v(0), v[0])


def test_max_tokens_and_config_passthrough():
    cfg, cache = make(page_size=3, max_pages=7)
    assert cache.max_tokens() == 21 == cfg.max_tokens()
    assert cache.config == cfg


# -- out of memory ---------------------------------------------------------------------------------

# Runs in a child: every allocation from the k-th on fails (CPython's _testcapi.set_nomemory),
# for k = 0, 1, 2, ... until the call succeeds. Each attempt must either succeed or raise
# MemoryError with the object unchanged. A failed page-table or free-list growth used to be
# swallowed as "unraisable" inside the nogil append loop, which then spun forever with the lock
# held, so the child also runs under a timeout.
OOM_SWEEP = r"""
import sys
import numpy as np
import _testcapi
import pagedcy as p

def state(c):
    return (c.seq_len(), c.evicted_tokens(), c.num_pages(), c.free_pages(),
            c.page_ids().tolist(), c.free_page_ids().tolist(),
            [c.gather_k(l).tobytes() + c.gather_v(l).tobytes() for l in range(2)])

def sweep(policy, how, n, prefill):
    cfg = p.PagedKVCacheConfig(page_size=1, max_pages=4096, num_layers=2, num_kv_heads=1,
                               head_dim=4, eviction=policy)
    rows = np.arange(2 * n * 4, dtype=np.float32).reshape(2, n, 4) + 1000
    row = np.full(4, 7.0, np.float32)
    failures = 0
    for k in range(100000):
        cache = p.PagedKVCache(cfg)
        for t in range(prefill):     # 16: page table and free list are both full now
            cache.append_tokens(np.full((2, 1, 4), t, np.float32), np.full((2, 1, 4), -t, np.float32))
        before = state(cache)
        _testcapi.set_nomemory(k, 0)
        try:
            if how == "layer":
                cache.append_kv_layer(0, row, row)
                cache.append_kv_layer(1, row, row)
                cache.advance()
            else:
                cache.append_tokens(rows, rows * 2)
        except MemoryError:
            _testcapi.remove_mem_hooks()
            failures += 1
            after = state(cache)
            assert after == before, (policy, how, k, after[:4], before[:4])
            continue
        finally:
            _testcapi.remove_mem_hooks()
        added = 1 if how == "layer" else n
        assert cache.seq_len() == prefill + added, (how, k, cache.seq_len())
        want = row if how == "layer" else rows[1, -1]
        assert np.array_equal(cache.gather_k(1)[-1], want)
        # and the cache goes on working after the failures
        more = np.ones((2, 3, 4), np.float32)
        cache.append_tokens(more, more)
        assert cache.seq_len() == prefill + 3 + added
        return failures
    raise AssertionError("never succeeded")

for policy in ("none", "lru"):
    for how, n in (("layer", 1), ("bulk", 5), ("bulk", 300)):
        for prefill in (8, 16):
            print(policy, how, n, prefill, "failures", sweep(policy, how, n, prefill), flush=True)

# The pool and the table on their own: MemoryError, no change, then they work again.
def pool_state(pool):
    return pool.free_count(), pool.free_list().tolist(), pool.ref_counts().tolist()

for how in ("alloc", "alloc_many", "push_page"):
    for k in range(1000):
        pool, table = p.PagePool(100, 2), p.PageTable(4)
        pages = [pool.alloc() for _ in range(16)]     # the free list's first block is used up
        for q in pages[:8]:                            # and the table's
            table.push_page(q)
        if how == "alloc_many":
            pool.free(3)                               # one recycled page, then fresh ones
        before = pool_state(pool), table.physical_pages().tolist()
        _testcapi.set_nomemory(k, 0)
        try:
            got = (pool.alloc() if how == "alloc" else pool.alloc_many(4) if how == "alloc_many"
                   else table.push_page(99))
        except MemoryError:
            _testcapi.remove_mem_hooks()
            assert (pool_state(pool), table.physical_pages().tolist()) == before, (how, k)
            continue
        finally:
            _testcapi.remove_mem_hooks()
        want = {"alloc": 16, "alloc_many": [3, 16, 17, 18], "push_page": None}[how]
        assert (got.tolist() if how == "alloc_many" else got) == want, (how, got)
        print(how, "failures", k, flush=True)
        break
    else:
        raise AssertionError(how + " never succeeded")
print("OK")
"""


def test_out_of_memory_while_mapping_pages_is_memory_error_and_changes_nothing():
    import subprocess
    import sys
    pytest.importorskip("_testcapi")
    proc = subprocess.run([sys.executable, "-c", OOM_SWEEP], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    # every case did hit allocation failures before it succeeded
    for line in proc.stdout.splitlines()[:-1]:
        assert int(line.split()[-1]) > 0, line
