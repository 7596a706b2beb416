"""Copy-on-write fork and swap out/in (RAM and memory-mapped file), bit for bit."""
import numpy as np
import pytest

from pagedcy import PagedKVCacheConfig, PoolExhaustedError
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager


def mgr(max_pages=16, dtype="float32", **kw):
    return PagedKVCacheManager(PagedKVCacheConfig(4, max_pages, 2, 2, 4, dtype=dtype), **kw)


def fill(m, h, seed):
    rng = np.random.default_rng(seed)
    out = []
    for layer in range(2):
        k = rng.standard_normal((h.num_tokens(), 8)).astype(np.float32)
        v = rng.standard_normal((h.num_tokens(), 8)).astype(np.float32)
        m.write_kv_tokens(h, layer, 0, k, v)
        out.append((k, v))
    return out


def snapshot(m, h):
    return [m.read_kv(h, layer, 0, h.num_tokens(), float32=False) for layer in range(2)]


def same(a, b):
    for (k1, v1), (k2, v2) in zip(a, b):
        assert k1.tobytes() == k2.tobytes() and v1.tobytes() == v2.tobytes()


def test_fork_shares_pages_then_copy_on_write_both_ways():
    m = mgr()
    parent = m.allocate(AllocationRequest(initial_tokens=10))
    fill(m, parent, 0)
    before = snapshot(m, parent)
    child = m.fork(parent)
    assert child.block_table().tolist() == parent.block_table().tolist()
    assert parent.ref_count() == 2 and child.ref_count() == 2 and child.num_tokens() == 10
    assert m.used_blocks() == 3
    # Child writes into shared page 1: it gets a private copy, parent unchanged.
    m.write_kv(child, 1, 5, np.full(8, 7.0), np.full(8, 8.0))
    assert child.block_table()[1] != parent.block_table()[1]
    assert child.block_table()[0] == parent.block_table()[0]
    same(snapshot(m, parent), before)
    ck, cv = m.read_kv(child, 1, 0, 10)
    assert (ck[5] == 7).all() and (cv[5] == 8).all()
    np.testing.assert_array_equal(ck[:5].reshape(5, -1), before[1][0][:5].reshape(5, -1))   # copied data
    np.testing.assert_array_equal(ck[6:].reshape(4, -1), before[1][0][6:].reshape(4, -1))
    # Parent writes into still-shared page 0: parent copies, child keeps the old data.
    m.write_kv_tokens(parent, 0, 0, np.zeros((2, 8)), np.zeros((2, 8)))
    assert parent.block_table()[0] != child.block_table()[0]
    np.testing.assert_array_equal(m.read_kv(child, 0, 0, 2)[0].reshape(2, -1),
                                  before[0][0][:2].reshape(2, -1))
    # The last shared page (2) is now only the other's after one side writes it.
    m.write_kv(parent, 0, 9, np.ones(8), np.ones(8))
    m.write_kv(child, 0, 9, np.full(8, 2.0), np.full(8, 2.0))   # now private: in place
    assert m.stats().cow_copies == 3 and m.used_blocks() == 6
    assert parent.ref_count() == 1 and child.ref_count() == 1
    m.check_invariants()
    m.deallocate(parent)
    m.deallocate(child)
    assert m.free_blocks() == 16
    m.check_invariants()


def test_fork_chain_and_batched_write_cow():
    m = mgr()
    a = m.allocate(AllocationRequest(initial_tokens=6))
    fill(m, a, 1)
    b = m.fork(a)
    c = m.fork(b)
    assert m.pool.ref_counts()[a.block_table()[0]] == 3
    rows = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    m.write_kv_batch([a, b, c], 0, np.array([5, 5, 5]), rows, -rows)
    for i, h in enumerate((a, b, c)):
        k, v = m.read_kv(h, 0, 5, 1)
        np.testing.assert_array_equal(k.reshape(-1), rows[i])
        np.testing.assert_array_equal(v.reshape(-1), -rows[i])
    assert len({h.block_table()[1] for h in (a, b, c)}) == 3
    m.check_invariants()


def test_cow_copy_fails_cleanly_when_pool_full():
    m = mgr(max_pages=2)
    a = m.allocate(AllocationRequest(initial_tokens=8))
    b = m.fork(a)
    with pytest.raises(PoolExhaustedError):
        m.write_kv(b, 0, 0, np.ones(8), np.ones(8))
    assert b.block_table().tolist() == a.block_table().tolist()
    m.check_invariants()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("on_disk", [False, True])
def test_swap_out_in_bit_exact(tmp_path, dtype, on_disk):
    path = str(tmp_path / "swap.bin") if on_disk else None
    m = mgr(dtype=dtype, swap_pages=8, swap_path=path)
    h = m.allocate(AllocationRequest(initial_tokens=11))
    fill(m, h, 2)
    other = m.allocate(AllocationRequest(initial_tokens=4))
    fill(m, other, 3)
    before, before_other = snapshot(m, h), snapshot(m, other)
    m.swap_out(h)
    assert h.is_swapped() and h.num_blocks() == 3 and len(h.block_table()) == 0
    assert m.used_blocks() == 1 and m.swap_free_blocks() == 5
    with pytest.raises(ValueError):
        m.write_kv(h, 0, 0, np.ones(8), np.ones(8))
    with pytest.raises(ValueError):
        m.read_kv(h, 0, 0, 1)
    with pytest.raises(ValueError):
        m.swap_out(h)
    with pytest.raises(ValueError):
        m.attention(0, np.ones((1, 2, 4), np.float32), [h])
    # Reuse the freed primary pages for something else meanwhile.
    filler = m.allocate(AllocationRequest(initial_tokens=12))
    fill(m, filler, 4)
    m.deallocate(filler)
    if on_disk:
        import os
        assert os.path.getsize(path) == m.swap_store.config.total_bytes()
    m.swap_in(h)
    assert not h.is_swapped() and m.swap_free_blocks() == 8 and h.num_tokens() == 11
    same(snapshot(m, h), before)
    same(snapshot(m, other), before_other)
    with pytest.raises(ValueError):
        m.swap_in(h)
    out = m.attention(1, np.ones((1, 4, 4), np.float32), [h])
    assert np.isfinite(out).all()
    m.check_invariants()


def test_swap_limits_and_errors():
    no_swap = mgr()
    h = no_swap.allocate(AllocationRequest(initial_tokens=4))
    with pytest.raises(ValueError):
        no_swap.swap_out(h)
    m = mgr(max_pages=4, swap_pages=2)
    big = m.allocate(AllocationRequest(initial_tokens=12))
    with pytest.raises(PoolExhaustedError):
        m.swap_out(big)                                      # 3 pages, swap holds 2
    assert not big.is_swapped() and m.swap_free_blocks() == 2
    small = m.allocate(AllocationRequest(initial_tokens=4))
    m.swap_out(small)
    m.allocate(AllocationRequest(initial_tokens=4))           # primary now full
    with pytest.raises(PoolExhaustedError):
        m.swap_in(small)
    assert small.is_swapped()
    m.deallocate(small)                                      # frees its swap pages
    assert m.swap_free_blocks() == 2
    m.check_invariants()


def test_swap_out_of_forked_sequence_keeps_sibling():
    m = mgr(swap_pages=8)
    a = m.allocate(AllocationRequest(initial_tokens=7))
    fill(m, a, 5)
    snap = snapshot(m, a)
    b = m.fork(a)
    m.swap_out(b)
    assert a.ref_count() == 1
    same(snapshot(m, a), snap)
    m.write_kv(a, 0, 0, np.zeros(8), np.zeros(8))             # no COW needed any more
    assert m.stats().cow_copies == 0
    m.swap_in(b)
    same(snapshot(m, b), snap)
    m.check_invariants()


def test_swap_of_prefix_cached_sequence():
    m = PagedKVCacheManager(PagedKVCacheConfig(4, 16, 1, 1, 4), enable_prefix_cache=True,
                            swap_pages=8)
    prompt = np.arange(9)
    rows = np.repeat(prompt[:, None], 4, axis=1).astype(np.float32)
    a = m.allocate(AllocationRequest(prompt_tokens=prompt))
    m.write_kv_tokens(a, 0, 0, rows, rows)
    b = m.allocate(AllocationRequest(prompt_tokens=prompt))
    assert b.num_cached_tokens() == 8
    m.write_kv_tokens(b, 0, 8, rows[8:], rows[8:])
    m.swap_out(b)
    m.deallocate(a)                  # cached pages become evictable (b's copy is in swap)
    assert m.cached_blocks() == 2
    m.swap_in(b)
    np.testing.assert_array_equal(m.read_kv(b, 0, 0, 9)[0].reshape(9, 4), rows)
    m.check_invariants()
