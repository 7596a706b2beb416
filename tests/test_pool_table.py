"""PagePool and PageTable: allocation order, refcounts, views, errors that leave state unchanged."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagedcy import PagePool, PageTable
from pagedcy._libs._pool import PAGE_ALIGN, aligned_zeros

DTYPES = ["float32", "float16", "bfloat16"]


def pool_state(pool):
    return (pool.free_count(), pool.allocated_count(), pool.free_list().tolist(),
            pool.ref_counts().tolist())


# -- PagePool ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_fresh_pool_hands_out_pages_in_order(n):
    pool = PagePool(n, 8)
    assert [pool.alloc() for _ in range(n)] == list(range(n))
    assert pool.alloc() is None
    assert pool.free_count() == 0 and pool.allocated_count() == n


def test_free_list_is_lifo_across_cycles():
    pool = PagePool(8, 4)
    got = [pool.alloc() for _ in range(8)]
    for p in (3, 6, 1):
        pool.free(p)
    # The last freed page comes back first.
    assert [pool.alloc(), pool.alloc(), pool.alloc()] == [1, 6, 3]
    assert pool.alloc() is None
    assert sorted(got) == list(range(8))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 150), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000)),
                                     max_size=300))
def test_pool_matches_stack_model(max_pages, ops):
    """Random alloc/free/incref sequences against a Python stack + refcount model (long
    enough to cross the pool's internal growth steps several times)."""
    pool = PagePool(max_pages, 3)
    stack = list(range(max_pages - 1, -1, -1))
    refs = [0] * max_pages
    for op, r in ops:
        is_alloc = op > 0            # allocate 3 times out of 4, so the pool fills up
        allocated = [i for i in range(max_pages) if refs[i]]
        if is_alloc or not allocated:
            want = stack.pop() if stack else None
            if want is not None:
                refs[want] = 1
            assert pool.alloc() == want
        elif r % 3 == 0:
            p = allocated[r % len(allocated)]
            pool.incref(p)
            refs[p] += 1
        else:
            p = allocated[r % len(allocated)]
            pool.free(p)
            refs[p] -= 1
            if refs[p] == 0:
                stack.append(p)
        assert pool.free_list().tolist() == stack
        assert pool.ref_counts().tolist() == refs
        assert pool.free_count() == len(stack)
        assert pool.allocated_count() == max_pages - len(stack)
    assert [pool.is_free(i) for i in range(max_pages)] == [c == 0 for c in refs]
    assert [pool.ref_count(i) for i in range(max_pages)] == refs


def traced_bytes_of(fn):
    """(result of fn(), peak bytes it allocated through Python's and NumPy's allocators)."""
    import tracemalloc
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_pool_construction_is_independent_of_max_pages():
    # The free list and reference counts grow with the pages handed out, not with max_pages:
    # a pool of 2**24 pages over a caller's buffer allocates next to nothing up front (it used
    # to write an 8-byte free-list entry and refcount for every page in __init__).
    n = 2**24
    buf = np.zeros(n * 2, np.uint8)
    pool, nbytes = traced_bytes_of(lambda: PagePool(n, 1, "float16", buffer=buf))
    assert nbytes < 64 * 1024, nbytes
    assert pool.free_count() == n and pool.allocated_count() == 0
    pages, nbytes = traced_bytes_of(lambda: [pool.alloc() for _ in range(1000)])
    assert pages == list(range(1000))
    assert nbytes < 64 * 1024 + 1000 * 100, nbytes          # the list of ints itself, + O(pages)
    assert pool.free_list()[-3:].tolist() == [1002, 1001, 1000]


def test_pool_of_2_31_minus_1_pages_over_a_sparse_file(tmp_path):
    # The largest pool over a sparse file: nothing touches its pages, so this needs neither
    # 4 GiB of memory nor of disk. Every observable bit of a fresh pool holds.
    n = 2**31 - 1
    path = tmp_path / "pool.bin"
    with open(path, "wb") as f:
        f.truncate(n * 2)
    buf = np.memmap(path, dtype=np.uint8, mode="r+", shape=(n * 2,))
    pool, nbytes = traced_bytes_of(lambda: PagePool(n, 1, "float16", buffer=buf))
    assert nbytes < 64 * 1024, nbytes
    assert (pool.free_count(), pool.allocated_count(), len(pool)) == (n, 0, n)
    assert [pool.alloc(), pool.alloc(), pool.alloc()] == [0, 1, 2]
    pool.free(1)
    pool.incref(2)
    assert (pool.ref_count(1), pool.ref_count(2), pool.ref_count(n - 1)) == (0, 2, 0)
    assert pool.is_free(n - 1) and not pool.is_free(0)
    assert pool.alloc() == 1 and pool.alloc() == 3
    assert pool.free_count() == n - 4
    got = pool.alloc_many(5)
    assert got.tolist() == [4, 5, 6, 7, 8]
    pool.page_data_mut(n - 1)[:] = 2.5
    assert pool.as_array()[n - 1, 0] == 2.5 and pool.page_data(n - 1)[0] == 2.5
    del pool, buf


def test_refcount_shared_page_needs_every_free():
    pool = PagePool(2, 4)
    p = pool.alloc()
    assert pool.ref_count(p) == 1
    pool.incref(p)
    pool.incref(p)
    assert pool.ref_count(p) == 3
    pool.free(p)
    pool.free(p)
    assert not pool.is_free(p) and pool.free_count() == 1
    pool.free(p)
    assert pool.is_free(p) and pool.ref_count(p) == 0 and pool.free_count() == 2
    with pytest.raises(ValueError):
        pool.free(p)


def test_incref_of_free_page_is_an_error():
    pool = PagePool(3, 4)
    before = pool_state(pool)
    with pytest.raises(ValueError):
        pool.incref(1)
    assert pool_state(pool) == before


@pytest.mark.parametrize("bad", [-1, 4, 5, 2**31, 2**63 - 1, 2**64, -2**63])
def test_free_out_of_range_raises_index_error_and_keeps_pool(bad):
    pool = PagePool(4, 4)
    pool.alloc()
    pool.alloc()
    before = pool_state(pool)
    with pytest.raises(IndexError):
        pool.free(bad)
    assert pool_state(pool) == before


def test_double_free_raises_value_error_and_keeps_pool():
    pool = PagePool(4, 4)
    a, b = pool.alloc(), pool.alloc()
    pool.free(a)
    before = pool_state(pool)
    with pytest.raises(ValueError):
        pool.free(a)
    assert pool_state(pool) == before
    # A never-allocated page is also "already free".
    with pytest.raises(ValueError):
        pool.free(3)
    assert pool_state(pool) == before
    assert pool.alloc() == a and pool.alloc() == 2


@pytest.mark.parametrize("max_pages,taken,n", [(5, 0, 5), (5, 2, 3), (5, 2, 4), (5, 5, 1),
                                               (3, 0, 0), (3, 3, 0), (4, 1, 9)])
def test_alloc_many_all_or_nothing(max_pages, taken, n):
    pool = PagePool(max_pages, 2)
    for _ in range(taken):
        pool.alloc()
    before = pool_state(pool)
    expect = [pool.free_list().tolist()[::-1][i] for i in range(n)] if n <= max_pages - taken else None
    got = pool.alloc_many(n)
    if expect is None:
        assert got is None
        assert pool_state(pool) == before
    else:
        assert got is not None and got.dtype == np.int32
        assert got.tolist() == expect
        assert pool.free_count() == max_pages - taken - n
        assert all(pool.ref_count(int(p)) == 1 for p in got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_page_views_are_zero_copy(dtype):
    pool = PagePool(3, 16, dtype=dtype)
    ro = pool.page_data(1)
    rw = pool.page_data_mut(1)
    assert ro.shape == (16,) and rw.shape == (16,)
    assert not ro.flags.writeable
    assert rw.flags.writeable
    with pytest.raises(ValueError):
        ro[0] = 1
    pattern = (np.arange(16, dtype=np.uint32) * 2654435761 + 12345).astype(np.uint32)
    pattern = pattern.astype(np.uint16 if pool.itemsize == 2 else np.uint32)
    rw.view(pattern.dtype)[:] = pattern
    # The write shows up in the read-only view and in the whole-pool array, and nowhere else.
    assert np.array_equal(ro.view(pattern.dtype), pattern)
    whole = pool.as_array()
    assert whole.shape == (3, 16)
    assert np.array_equal(whole[1].view(pattern.dtype), pattern)
    assert not whole[0].view(pattern.dtype).any() and not whole[2].view(pattern.dtype).any()
    # And writes through as_array show up in the page views.
    whole[2].view(pattern.dtype)[:] = pattern[::-1]
    assert np.array_equal(pool.page_data(2).view(pattern.dtype), pattern[::-1])


def test_buffer_is_4k_aligned_and_sized():
    """Regression: the alignment offset was once (-addr) % ALIGN in C arithmetic (cdivision),
    negative for most addresses: the pool's buffer became an empty slice past the end of its
    allocation, as_array() failed and every page write went out of bounds.

    Many pools of many sizes: a fix-up that only works for some heap addresses fails here."""
    for dtype in DTYPES:
        for max_pages, fpp in [(1, 1), (3, 5), (4, 128), (7, 1000), (2, 4096 * 16)]:
            for _ in range(8):
                pool = PagePool(max_pages, fpp, dtype=dtype)
                arr = pool.as_array()
                assert arr.shape == (max_pages, fpp)
                assert arr.ctypes.data % 4096 == 0 and PAGE_ALIGN == 4096
                assert pool.nbytes == max_pages * fpp * pool.itemsize == arr.nbytes
                assert pool.page_data(0).ctypes.data == arr.ctypes.data
                assert pool.page_data(max_pages - 1).ctypes.data + pool.itemsize * fpp \
                    == arr.ctypes.data + arr.nbytes


@pytest.mark.parametrize("nbytes", [1, 63, 4095, 4096, 4097, 3 * 2**20 + 5])
def test_aligned_zeros(nbytes):
    a = aligned_zeros(nbytes)
    assert a.dtype == np.uint8 and a.shape == (nbytes,) and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % 4096 == 0
    assert not a.any()


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (1.5, TypeError), ("8", TypeError), (True, TypeError)])
def test_aligned_zeros_rejects(bad, exc):
    with pytest.raises(exc):
        aligned_zeros(bad)


def test_copy_page_copies_contents():
    pool = PagePool(3, 8)
    pool.page_data_mut(0)[:] = np.arange(8)
    pool.copy_page(0, 2)
    assert np.array_equal(pool.page_data(2), np.arange(8, dtype=np.float32))
    assert not pool.page_data(1).any()
    pool.copy_page(2, 2)
    assert np.array_equal(pool.page_data(2), np.arange(8, dtype=np.float32))


def test_pool_attributes():
    pool = PagePool(5, 12, dtype="float16")
    assert pool.max_pages == 5 and pool.floats_per_page == 12 and pool.itemsize == 2
    assert pool.dtype == np.float16
    assert len(pool) == 5


# -- PageTable --------------------------------------------------------------------------------

def table_state(t):
    return (t.num_pages(), t.seq_len(), t.capacity(), t.physical_pages().tolist())


def test_table_push_pop_and_physical_pages():
    t = PageTable(3)
    assert t.num_pages() == 0 and t.seq_len() == 0 and t.physical_pages().tolist() == []
    for p in (7, 2, 9):
        t.push_page(p)
    pages = t.physical_pages()
    assert pages.dtype.kind in "iu"
    assert pages.tolist() == [7, 2, 9]
    # physical_pages is a copy, not a view of the table.
    pages[0] = 100
    assert t.physical_pages().tolist() == [7, 2, 9]
    assert t.pop_page() == 9
    assert t.pop_front_page() == 7
    assert t.physical_pages().tolist() == [2]
    assert t.pop_page() == 2
    assert t.pop_page() is None and t.pop_front_page() is None


def test_pop_clamps_seq_len_to_the_remaining_pages():
    t = PageTable(4)
    for p in range(3):
        t.push_page(p)
    t.set_seq_len(10)
    assert t.pop_page() == 2
    assert t.seq_len() == 8
    t.set_seq_len(5)
    assert t.pop_front_page() == 0
    # seq_len 5 > 1 page * 4 => clamped to 4.
    assert t.seq_len() == 4
    t.set_seq_len(3)
    assert t.pop_page() == 1
    assert t.seq_len() == 0


def test_pop_does_not_clamp_when_within_capacity():
    t = PageTable(4)
    for p in range(3):
        t.push_page(p)
    t.set_seq_len(6)
    assert t.pop_page() == 2
    assert t.seq_len() == 6


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.sampled_from("bfPs"), st.integers(0, 50)),
                                   max_size=60))
def test_table_matches_list_model(page_size, ops):
    t = PageTable(page_size)
    entries, seq_len = [], 0
    for op, x in ops:
        if op == "P":
            t.push_page(x)
            entries.append(x)
        elif op == "b":
            want = entries.pop() if entries else None
            assert t.pop_page() == want
            seq_len = min(seq_len, len(entries) * page_size)
        elif op == "f":
            want = entries.pop(0) if entries else None
            assert t.pop_front_page() == want
            seq_len = min(seq_len, len(entries) * page_size)
        else:
            n = x % (len(entries) * page_size + 2)
            if n <= len(entries) * page_size:
                t.set_seq_len(n)
                seq_len = n
            else:
                with pytest.raises(ValueError):
                    t.set_seq_len(n)
        assert table_state(t) == (len(entries), seq_len, len(entries) * page_size, entries)
        for pos in range(len(entries) * page_size):
            assert t.resolve(pos) == (entries[pos // page_size], pos % page_size)
        with pytest.raises(IndexError):
            t.resolve(len(entries) * page_size)


def test_set_seq_len_bounds():
    t = PageTable(4)
    with pytest.raises(ValueError):
        t.set_seq_len(1)
    t.push_page(0)
    t.set_seq_len(4)
    t.set_seq_len(0)
    before = table_state(t)
    for bad in (5, -1, 100):
        with pytest.raises(ValueError):
            t.set_seq_len(bad)
        assert table_state(t) == before


def test_resolve_out_of_range():
    t = PageTable(2)
    t.push_page(4)
    for bad in (-1, 2, 3, 10**6):
        with pytest.raises(IndexError):
            t.resolve(bad)
    assert t.resolve(1) == (4, 1)


def test_pop_front_is_constant_time_on_a_long_table():
    # A list.pop(0)-style table would take ~n^2/2 = 5e9 element moves here; O(1) pops finish.
    n = 100_000
    t = PageTable(1)
    for i in range(n):
        t.push_page(i)
    t.set_seq_len(n)
    for i in range(n):
        assert t.pop_front_page() == i
    assert t.num_pages() == 0 and t.seq_len() == 0
    # Interleaved push/pop_front (the sliding-window pattern) must also stay correct.
    for i in range(n):
        t.push_page(i % 1000)
        if i >= 3:
            assert t.pop_front_page() == (i - 3) % 1000
    assert t.physical_pages().tolist() == [(n - 3 + j) % 1000 for j in range(3)]


def test_clear_drops_mapping():
    t = PageTable(4)
    t.push_page(1)
    t.push_page(2)
    t.set_seq_len(7)
    t.clear()
    assert table_state(t) == (0, 0, 0, [])
    t.push_page(3)
    assert t.resolve(0) == (3, 0)


def test_cache_and_manager_pages_are_4k_aligned():
    # One allocation path for every pool: the single-sequence cache and the manager
    # hand the attention kernel 4 KiB-aligned page arrays.
    from pagedcy import PagedKVCache, PagedKVCacheConfig, PagedKVCacheManager
    for dtype in DTYPES:
        cfg = PagedKVCacheConfig(16, 9, 2, 3, 40, dtype=dtype)
        assert PagedKVCache(cfg).pages().ctypes.data % 4096 == 0
        assert PagedKVCacheManager(cfg).store.pages().ctypes.data % 4096 == 0
