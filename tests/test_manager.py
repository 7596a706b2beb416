"""PagedKVCacheManager: allocation, K/V I/O, batched attention, paged_attention, stats,
pressure, bad inputs and threads."""
import threading
import warnings

import numpy as np
import pytest

from pagedcy import PagedKVCacheConfig, PoolExhaustedError
from pagedcy.kvcache.manager import (AllocationRequest, CacheStats, MemoryPressure, PagedKVCacheHandle,
                             PagedKVCacheManager, paged_attention)


def mgr(page_size=4, max_pages=32, layers=2, kvh=2, hd=8, dtype="float32", **kw):
    return PagedKVCacheManager(PagedKVCacheConfig(page_size, max_pages, layers, kvh, hd,
                                                  dtype=dtype), **kw)


def ref_attn(q, k, v, causal=True):
    """q [nq, H, D], k/v [n, KVH, D] float64 reference, bottom-right causal."""
    nq, H, D = q.shape
    n, KVH, _ = k.shape
    r = H // KVH
    out = np.zeros((nq, H, D))
    for i in range(nq):
        last = n - nq + i if causal else n - 1
        for h in range(H):
            s = k[:last + 1, h // r] @ q[i, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:last + 1, h // r]
    return out


def fill(m, h, rng, n=None, start=0):
    n = h.num_tokens() - start if n is None else n
    kv = {}
    for layer in range(m.config.num_layers):
        k = rng.standard_normal((n, m.config.kv_dim())).astype(np.float32)
        v = rng.standard_normal((n, m.config.kv_dim())).astype(np.float32)
        m.write_kv_tokens(h, layer, start, k, v)
        kv[layer] = (k, v)
    return kv


def test_allocate_basics_and_handle_api():
    m = mgr()
    h = m.allocate(AllocationRequest(request_id="a", initial_tokens=10))
    assert isinstance(h, PagedKVCacheHandle)
    assert h.request_id == "a" and h.num_tokens() == 10 and h.num_blocks() == 3
    bt = h.block_table()
    assert bt.dtype == np.int32 and list(bt) == [0, 1, 2] and not bt.flags.writeable
    assert h.ref_count() == 1 and h.num_cached_tokens() == 0 and not h.is_swapped()
    assert m.get_handle("a") is h and m.list_handles() == [h] and m.get_handle("zz") is None
    assert m.block_size() == 4 and m.free_blocks() == 29
    h.set_num_tokens(12)
    with pytest.raises(ValueError):
        h.set_num_tokens(13)
    with pytest.raises(ValueError):
        h.set_num_tokens(-1)
    auto = m.allocate(AllocationRequest())
    assert auto.num_blocks() == 0 and auto.request_id != "a"
    with pytest.raises(ValueError):
        m.allocate(AllocationRequest(request_id="a"))
    m.deallocate("a")
    m.deallocate(auto)
    assert m.free_blocks() == 32 and m.list_handles() == []
    with pytest.raises(ValueError):
        h.num_blocks() if False else m.deallocate(h)
    with pytest.raises(KeyError):
        m.deallocate("a")
    m.check_invariants()


def test_write_read_roundtrip_across_pages_and_single_token_write():
    m = mgr()
    rng = np.random.default_rng(1)
    h = m.allocate(AllocationRequest(initial_tokens=11))
    kv = fill(m, h, rng)
    for layer, (k, v) in kv.items():
        rk, rv = m.read_kv(h, layer, 0, 11)
        assert rk.shape == (11, 2, 8)
        np.testing.assert_array_equal(rk.reshape(11, -1), k)
        np.testing.assert_array_equal(rv.reshape(11, -1), v)
    key = rng.standard_normal((2, 8))                        # [num_kv_heads, head_dim], f64
    m.write_kv(h, 1, 5, key, key * 2)
    rk, rv = m.read_kv(h, 1, 5, 1)
    np.testing.assert_array_equal(rk[0], key.astype(np.float32))
    np.testing.assert_array_equal(rv[0], (key * 2).astype(np.float32))
    rk, _ = m.read_kv(h, 1, 4, 3, float32=False)
    assert rk.dtype == np.float32
    for float32 in (True, False):                             # an empty read is no error
        ek, ev = m.read_kv(h, 1, 3, 0, float32=float32)
        assert ek.shape == ev.shape == (0, 2, 8)


def test_positions_past_blocks_are_errors_not_crashes():
    m = mgr()
    h = m.allocate(AllocationRequest(initial_tokens=5))      # 2 blocks: capacity 8
    row = np.zeros(16, np.float32)
    with pytest.raises(IndexError):
        m.write_kv(h, 0, 8, row, row)
    with pytest.raises(IndexError):
        m.write_kv(h, 0, -1, row, row)
    with pytest.raises(IndexError):
        m.write_kv(h, 2, 0, row, row)                          # layer
    with pytest.raises(ValueError):
        m.write_kv_tokens(h, 0, 6, np.zeros((3, 16)), np.zeros((3, 16)))
    with pytest.raises(ValueError):
        m.read_kv(h, 0, 6, 3)
    with pytest.raises(ValueError):
        m.write_kv(h, 0, 0, np.zeros(15), np.zeros(15))
    with pytest.raises(TypeError):
        m.write_kv(h, 0, 0, np.zeros(16, np.int32), np.zeros(16, np.int32))
    with pytest.raises(IndexError):
        m.write_kv_batch([h], 0, np.array([8]), np.zeros((1, 16)), np.zeros((1, 16)))
    m.check_invariants()


def test_allocate_blocks_all_or_nothing_and_extend():
    m = mgr(max_pages=8)
    h = m.allocate(AllocationRequest(initial_tokens=4))
    other = m.allocate(AllocationRequest(initial_tokens=16))
    assert m.free_blocks() == 3
    before = (list(h.block_table()), m.pool.free_list().tolist(), m.free_blocks())
    with pytest.raises(PoolExhaustedError):
        m.allocate_blocks(h, 4)
    assert (list(h.block_table()), m.pool.free_list().tolist(), m.free_blocks()) == before
    assert m.stats()["failures"] == 1
    got = m.allocate_blocks(h, 3)
    assert len(got) == 3 and list(h.block_table()[1:]) == got and m.free_blocks() == 0
    with pytest.raises(PoolExhaustedError):
        m.extend(other, 1)
    assert other.num_tokens() == 16
    m.deallocate(h)
    assert m.extend(other, 5) and other.num_tokens() == 21 and other.num_blocks() == 6
    assert m.extend(other, 2) == [] and other.num_tokens() == 23
    capped = m.allocate(AllocationRequest(initial_tokens=1, max_sequence_length=2))
    with pytest.raises(ValueError):
        m.extend(capped, 2)
    with pytest.raises(ValueError):
        capped.set_num_tokens(3)
    assert m.can_allocate(AllocationRequest(initial_tokens=4)) is True
    assert m.can_allocate(AllocationRequest(initial_tokens=5)) is False
    m.check_invariants()


def test_pages_reused_after_free_and_no_leak_over_cycles():
    m = mgr(max_pages=16)
    rng = np.random.default_rng(0)
    h = m.allocate(AllocationRequest(initial_tokens=12))
    pages = set(h.block_table().tolist())
    m.deallocate(h)
    h2 = m.allocate(AllocationRequest(initial_tokens=12))
    assert set(h2.block_table().tolist()) == pages
    m.deallocate(h2)
    live = []
    for i in range(500):
        if live and (rng.random() < 0.5 or m.free_blocks() < 4):
            m.deallocate(live.pop(rng.integers(len(live))))
        else:
            live.append(m.allocate(AllocationRequest(initial_tokens=int(rng.integers(0, 16)))))
    for h in live:
        m.deallocate(h)
    assert m.free_blocks() == 16 and m.pool.free_count() == 16
    m.check_invariants()


def test_isolation_of_two_sequences():
    m = mgr()
    a = m.allocate(AllocationRequest(initial_tokens=7))
    b = m.allocate(AllocationRequest(initial_tokens=7))
    assert not set(a.block_table()) & set(b.block_table())
    one, two = np.ones((7, 16), np.float32), np.full((7, 16), 2, np.float32)
    for layer in range(2):
        m.write_kv_tokens(a, layer, 0, one, one)
        m.write_kv_tokens(b, layer, 0, two, two)
    assert (m.read_kv(a, 1, 0, 7)[0] == 1).all() and (m.read_kv(b, 1, 0, 7)[1] == 2).all()
    q = np.ones((2, 4, 8), np.float32)
    out = m.attention(1, q, [a, b])
    np.testing.assert_allclose(out[0], 1, rtol=1e-6)
    np.testing.assert_allclose(out[1], 2, rtol=1e-6)


def test_uniform_attention_gives_mean_of_v():
    m = mgr(kvh=1, hd=4)
    h = m.allocate(AllocationRequest(initial_tokens=10))
    k = np.ones((10, 4), np.float32)              # identical keys: uniform weights
    v = np.arange(40, dtype=np.float32).reshape(10, 4)
    m.write_kv_tokens(h, 0, 0, k, v)
    out = paged_attention(np.ones(4, np.float32), 1, 1, 1, 4, m, h, 0, 10)
    assert out.shape == (1, 1, 4)
    np.testing.assert_allclose(out[0, 0], v.mean(axis=0), rtol=1e-5)


def test_causal_prefill_and_attention_across_pages_match_reference():
    m = mgr(page_size=4, kvh=2, hd=8)
    rng = np.random.default_rng(3)
    h = m.allocate(AllocationRequest(initial_tokens=13))
    kv = fill(m, h, rng)
    q = rng.standard_normal((13, 4, 8)).astype(np.float32)
    k, v = (x.reshape(13, 2, 8).astype(np.float64) for x in kv[1])
    out = paged_attention(q, 13, 4, 2, 8, m, h, 1, 13)
    np.testing.assert_allclose(out, ref_attn(q.astype(np.float64), k, v), atol=1e-5)
    # Row 0 of a causal prefill sees only token 0: output is v[0].
    np.testing.assert_allclose(out[0], np.repeat(v[0], 2, axis=0), atol=1e-6)
    # Flat query, shorter kv_len (a prefix), non-causal.
    out2 = paged_attention(q[:2].reshape(-1), 2, 4, 2, 8, m, h, 1, 9, causal=False)
    np.testing.assert_allclose(out2, ref_attn(q[:2].astype(np.float64), k[:9], v[:9], False),
                               atol=1e-5)


def test_batched_attention_matches_per_sequence():
    m = mgr(max_pages=64)
    rng = np.random.default_rng(5)
    hs, kvs = [], []
    for n in (1, 3, 8, 17, 30):
        h = m.allocate(AllocationRequest(initial_tokens=n))
        hs.append(h)
        kvs.append(fill(m, h, rng))
    q_lens = [1, 2, 8, 1, 5]
    q = rng.standard_normal((sum(q_lens), 4, 8)).astype(np.float32)
    out = m.attention(0, q, hs, q_lens=q_lens)
    o = 0
    for h, ql, kv in zip(hs, q_lens, kvs):
        n = h.num_tokens()
        k, v = (x.reshape(n, 2, 8).astype(np.float64) for x in kv[0])
        np.testing.assert_allclose(out[o:o + ql], ref_attn(q[o:o + ql].astype(np.float64), k, v),
                                   atol=1e-5)
        o += ql
    tables, lens = m.batch_tables(hs)
    assert tables.shape == (5, 8) and list(lens) == [1, 3, 8, 17, 30]
    with pytest.raises(ValueError):
        m.attention(0, q, hs)                                # rows != sum(q_lens)
    with pytest.raises(ValueError):
        m.attention(0, q[:3], hs[:1], q_lens=[3])            # q_len > num_tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # refused, not cast with a warning
        for bad, exc in [([1.5, 2, 8, 1, 4.5], TypeError), (np.ones(5, complex), TypeError),
                         ([True] * 5, TypeError), ([2**70, 1, 1, 1, 1], TypeError),
                         ([2**32 + 1, 2, 8, 1, 5], ValueError), ([1, 2, 8, 1, -1], ValueError),
                         (np.array([2**64 - 1, 2, 8, 1, 5], np.uint64), ValueError)]:
            with pytest.raises(exc):
                m.attention(0, q, hs, q_lens=bad)


def test_paged_attention_validation():
    m = mgr()
    h = m.allocate(AllocationRequest(initial_tokens=5))
    fill(m, h, np.random.default_rng(0))
    q = np.zeros(4 * 8, np.float32)
    with pytest.raises(ValueError):
        paged_attention(q, 1, 4, 2, 8, m, h, 0, 0)            # kv_len 0
    with pytest.raises(ValueError):
        paged_attention(q, 1, 4, 2, 8, m, h, 0, 6)            # beyond written tokens
    with pytest.raises(ValueError):
        paged_attention(q[:-1], 1, 4, 2, 8, m, h, 0, 5)       # wrong query length
    with pytest.raises(ValueError):
        paged_attention(q, 1, 3, 2, 8, m, h, 0, 5)            # heads not a multiple
    with pytest.raises(ValueError):
        paged_attention(q, 1, 4, 4, 4, m, h, 0, 5)            # geometry mismatch
    with pytest.raises(IndexError):
        paged_attention(q, 1, 4, 2, 8, m, h, 5, 5)            # layer
    out = np.empty((1, 4, 8), np.float32)
    r = paged_attention(q, 1, 4, 2, 8, m, h, 0, 5, out=out, num_threads=1)
    assert r is out


def test_stats_real_bytes_and_pressure_callback():
    m = mgr(max_pages=20, dtype="float16", high_watermark=0.5, critical_watermark=0.9)
    bpp = 2 * 2 * 4 * 2 * 8 * 2                   # layers*KV*page*kvh*hd*2 bytes (f16)
    assert m.config.bytes_per_page() == bpp and m.total_memory_bytes() == 20 * bpp
    events = []
    m.set_pressure_callback(lambda new, old: events.append((old, new)))
    assert m.check_pressure() == MemoryPressure.LOW
    a = m.allocate(AllocationRequest(initial_tokens=40))      # 10 pages: 50%
    assert m.check_pressure() == MemoryPressure.HIGH
    b = m.allocate(AllocationRequest(initial_tokens=32))      # 18 pages: 90%
    assert m.check_pressure() == MemoryPressure.CRITICAL
    m.deallocate(b)
    m.deallocate(a)
    assert events == [(MemoryPressure.LOW, MemoryPressure.HIGH),
                      (MemoryPressure.HIGH, MemoryPressure.CRITICAL),
                      (MemoryPressure.CRITICAL, MemoryPressure.HIGH),
                      (MemoryPressure.HIGH, MemoryPressure.LOW)]
    s = m.stats()
    assert isinstance(s, CacheStats)
    assert s.allocations == 2 and s.deallocations == 2 and s.used_bytes == 0
    assert s.peak_bytes == 18 * bpp and s.peak_used_blocks == 18 and s.total_bytes == 20 * bpp
    assert s["pressure"] == MemoryPressure.LOW
    m.set_pressure_callback(None)
    with pytest.raises(TypeError):
        m.set_pressure_callback(3)
    with pytest.raises(ValueError):
        mgr(high_watermark=0.9, critical_watermark=0.5)


def test_bad_requests_leave_state_unchanged():
    m = mgr(max_pages=4)
    with pytest.raises(TypeError):
        m.allocate({"initial_tokens": 3})
    with pytest.raises(ValueError):
        AllocationRequest(initial_tokens=-1)
    with pytest.raises(TypeError):
        AllocationRequest(initial_tokens=1.5)
    with pytest.raises(ValueError):
        AllocationRequest(initial_tokens=10, max_sequence_length=5)
    with pytest.raises(TypeError):
        AllocationRequest(prompt_tokens=[1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # refused before any cast could warn
        for bad in (np.zeros(0, complex), np.zeros(0, bool), [[1, 2]]):
            with pytest.raises(TypeError):
                AllocationRequest(prompt_tokens=bad)
    assert AllocationRequest(prompt_tokens=[]).initial_tokens == 0
    with pytest.raises(PoolExhaustedError):
        m.allocate(AllocationRequest(initial_tokens=17))
    assert m.free_blocks() == 4 and m.list_handles() == []
    other = mgr()
    h = other.allocate(AllocationRequest(initial_tokens=1))
    with pytest.raises(ValueError):
        m.write_kv(h, 0, 0, np.zeros(16), np.zeros(16))        # foreign handle
    m.check_invariants()


def test_float16_and_bfloat16_storage():
    for dt in ("float16", "bfloat16"):
        m = mgr(dtype=dt)
        h = m.allocate(AllocationRequest(initial_tokens=6))
        x = np.linspace(-2, 2, 6 * 16, dtype=np.float32).reshape(6, 16)
        m.write_kv_tokens(h, 0, 0, x, x)
        k, _ = m.read_kv(h, 0, 0, 6)
        np.testing.assert_allclose(k.reshape(6, 16), x, atol=2e-2)
        out = m.attention(0, np.ones((1, 4, 8), np.float32), [h])
        assert np.isfinite(out).all()


def test_thread_hammering_keeps_invariants():
    m = mgr(max_pages=64, swap_pages=32, enable_prefix_cache=True)
    errors = []
    prompt = np.arange(9)

    def worker(seed):
        rng = np.random.default_rng(seed)
        mine = []
        try:
            for it in range(150):
                r = rng.random()
                try:
                    if r < 0.3 or not mine:
                        h = m.allocate(AllocationRequest(
                            initial_tokens=int(rng.integers(1, 12)),
                            prompt_tokens=prompt if rng.random() < 0.5 else None))
                        mine.append(h)
                        val = np.full((h.num_tokens(), 16), seed, np.float32)
                        for layer in range(2):
                            m.write_kv_tokens(h, layer, 0, val, val)
                    elif r < 0.45:
                        h = mine[int(rng.integers(len(mine)))]
                        if not h.is_swapped():
                            mine.append(m.fork(h))
                    elif r < 0.55:
                        h = mine[int(rng.integers(len(mine)))]
                        if h.is_swapped():
                            m.swap_in(h)
                        else:
                            m.swap_out(h)
                    elif r < 0.75:
                        h = mine[int(rng.integers(len(mine)))]
                        if not h.is_swapped() and h.num_tokens():
                            m.attention(0, np.ones((1, 4, 8), np.float32), [h])
                            m.write_kv(h, 1, h.num_tokens() - 1, np.ones(16), np.ones(16))
                    else:
                        m.deallocate(mine.pop(int(rng.integers(len(mine)))))
                except PoolExhaustedError:
                    pass
            for h in mine:
                m.deallocate(h)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors, errors
    assert m.list_handles() == []
    m.check_invariants()
    assert m.free_blocks() == 64 and m.swap_free_blocks() == 32
