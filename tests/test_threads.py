"""Several Python threads hammering one PagePool / one PagedKVCache.

Workers run in rounds separated by a barrier; the barrier action checks whole-object invariants
while nobody is mutating (page_ids()/free_page_ids() are separate calls, so they are only
comparable at a quiescent point). Reads made during a round are checked as they happen.

Tokens are large (kv_dim 1024, 64 tokens per bulk append = 256 KiB per layer) so the core
drops the GIL inside the copies and threads really overlap.
"""
import itertools
import random
import threading

import numpy as np
import pytest

from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PagePool, PoolExhaustedError

BLOCK = 64          # tokens per bulk append
HEADS, HEAD_DIM = 8, 128
KV_DIM = HEADS * HEAD_DIM


def run_rounds(n_threads, rounds, work, check):
    """Run ``work(tid, round, rng)`` in threads, ``check()`` between rounds; re-raise failures."""
    errors = []

    def action():
        try:
            check()
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)
            raise

    barrier = threading.Barrier(n_threads, action=action, timeout=120)

    def worker(tid):
        rng = random.Random(tid * 7919)
        try:
            for r in range(rounds):
                work(tid, r, rng)
                barrier.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:      # noqa: BLE001
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]


# -- PagePool ---------------------------------------------------------------------------------

def test_pool_alloc_free_incref_from_threads():
    max_pages = 64
    pool = PagePool(max_pages, 4096)   # 16 KiB pages: page_data writes below are real copies
    owner_lock = threading.Lock()
    owner = [None] * max_pages         # which thread holds the page (None = free)
    expected_refs = [0] * max_pages

    def take(tid, p):
        with owner_lock:
            assert owner[p] is None, f"page {p} handed to thread {tid} while held by {owner[p]}"
            owner[p] = tid
            expected_refs[p] = 1

    def work(tid, _round, rng):
        held = {}
        for _ in range(300):
            op = rng.random()
            if op < 0.35:
                p = pool.alloc()
                if p is not None:
                    take(tid, p)
                    held[p] = 1
                    pool.page_data_mut(p)[:] = tid   # private page: nobody else may see it change
            elif op < 0.45:
                got = pool.alloc_many(rng.randint(0, 4))
                if got is not None:
                    for p in got.tolist():
                        take(tid, p)
                        held[p] = 1
                        pool.page_data_mut(p)[:] = tid
            elif op < 0.6 and held:
                p = rng.choice(list(held))
                pool.incref(p)
                held[p] += 1
                with owner_lock:
                    expected_refs[p] += 1
            elif held:
                p = rng.choice(list(held))
                assert pool.page_data(p)[0] == tid and pool.page_data(p)[-1] == tid
                if held[p] == 1:
                    del held[p]
                    with owner_lock:
                        owner[p] = None
                        expected_refs[p] = 0
                else:
                    held[p] -= 1
                    with owner_lock:
                        expected_refs[p] -= 1
                pool.free(p)
            # Only this thread frees or increfs its pages, so its own refcounts are stable.
            for p, c in list(held.items())[:3]:
                assert pool.ref_count(p) == c
        for p, c in held.items():
            with owner_lock:
                owner[p] = None
                expected_refs[p] = 0
            for _ in range(c):
                pool.free(p)

    def check():
        free = pool.free_list().tolist()
        assert len(free) == len(set(free)) == pool.free_count() == max_pages
        assert sorted(free) == list(range(max_pages))
        assert pool.ref_counts().tolist() == [0] * max_pages
        assert owner == [None] * max_pages

    run_rounds(4, 6, work, check)
    check()


def test_pool_invariants_mid_flight():
    # Between rounds every thread still holds its pages: the pool must account for all of them.
    max_pages = 48
    pool = PagePool(max_pages, 256)
    holdings = [dict() for _ in range(4)]

    def work(tid, _round, rng):
        held = holdings[tid]
        for _ in range(400):
            if rng.random() < 0.5:
                p = pool.alloc()
                if p is not None:
                    held[p] = held.get(p, 0) + 1
            elif held:
                p = rng.choice(list(held))
                if rng.random() < 0.3:
                    pool.incref(p)
                    held[p] += 1
                else:
                    pool.free(p)
                    held[p] -= 1
                    if held[p] == 0:
                        del held[p]

    def check():
        refs = pool.ref_counts().tolist()
        free = pool.free_list().tolist()
        mine = {}
        for h in holdings:
            for p, c in h.items():
                assert p not in mine, f"page {p} held by two threads"
                mine[p] = c
        assert len(free) == len(set(free)) == pool.free_count()
        assert set(free) | set(mine) == set(range(max_pages))
        assert not set(free) & set(mine)
        assert refs == [mine.get(p, 0) for p in range(max_pages)]
        assert pool.allocated_count() == len(mine)

    run_rounds(4, 8, work, check)


# -- PagedKVCache -------------------------------------------------------------------------------

def check_rows(k, v, appended, whole_blocks):
    """Rows must be whole (all 1024 values equal), V == -K, and ids something appended."""
    if k.shape[0] == 0:
        return
    ids = k[:, 0]
    assert (k == ids[:, None]).all(), "torn K row"
    assert (v == -ids[:, None]).all(), "V row does not belong to its K row"
    ids = ids.astype(np.int64)
    unknown = set(ids.tolist()) - appended - {0}
    assert not unknown, f"rows that were never appended: {sorted(unknown)[:5]}"
    if whole_blocks:
        # Bulk appends are atomic and evictions drop whole pages (BLOCK is a multiple of the
        # page size), so the window is a run of whole 64-token blocks, each in order.
        assert len(ids) % BLOCK == 0
        blocks = ids.reshape(-1, BLOCK)
        assert ((blocks - blocks[:, :1]) == np.arange(BLOCK)).all(), "block out of order"
        assert (blocks[:, 0] % BLOCK == 1).all()


@pytest.mark.parametrize("policy", [EvictionPolicy.LRU, EvictionPolicy.NONE])
def test_cache_bulk_appends_gathers_resets_from_threads(policy):
    cfg = PagedKVCacheConfig(16, 16, 2, HEADS, HEAD_DIM, eviction=policy)
    cache = PagedKVCache(cfg)
    blocks = itertools.count()
    appended = set()
    appended_lock = threading.Lock()

    def work(tid, _round, rng):
        for _ in range(25):
            op = rng.random()
            if op < 0.5:
                base = next(blocks) * BLOCK + 1
                ids = np.arange(base, base + BLOCK, dtype=np.float32)
                k = np.broadcast_to(ids[None, :, None], (2, BLOCK, KV_DIM)).copy()
                with appended_lock:
                    appended.update(range(base, base + BLOCK))
                try:
                    cache.append_tokens(k, -k)
                except PoolExhaustedError:
                    assert policy is EvictionPolicy.NONE
                    cache.reset()
            elif op < 0.9:
                layer = rng.randrange(2)
                # Ids are registered before their append starts, so a snapshot taken after a
                # gather covers every id that gather can contain. K and V come from separate
                # calls (another append may land in between), so each is checked on its own.
                k = cache.gather_k(layer)
                with appended_lock:
                    seen = set(appended)
                check_rows(k, -k, seen, True)
                v = cache.gather_v(layer)
                with appended_lock:
                    seen = set(appended)
                check_rows(-v, v, seen, True)
            else:
                cache.reset()

    def check():
        n, ps = cache.seq_len(), cfg.page_size
        held, free = cache.page_ids().tolist(), cache.free_page_ids().tolist()
        assert len(set(held)) == len(held) and len(set(free)) == len(free)
        assert not set(held) & set(free)
        assert set(held) | set(free) == set(range(cfg.max_pages))
        assert cache.num_pages() == len(held) == -(-n // ps)
        assert cache.free_pages() == len(free)
        assert n <= cfg.max_tokens() and n % BLOCK == 0
        assert cache.evicted_tokens() % ps == 0
        if policy is EvictionPolicy.NONE:
            assert cache.evicted_tokens() == 0
        for layer in range(2):
            k, v = cache.gather_k(layer), cache.gather_v(layer)
            check_rows(k, v, appended, True)
            # Both layers of one bulk append hold the same ids.
            assert np.array_equal(k[:, 0], cache.gather_k(1 - layer)[:, 0])

    run_rounds(4, 8, work, check)
    check()


@pytest.mark.parametrize("policy", [EvictionPolicy.LRU, EvictionPolicy.NONE])
def test_cache_mixed_per_token_and_bulk_from_threads(policy):
    # Per-token writers race with bulk writers, so a position may be advanced over without
    # being written (seen as zeros or a stale earlier row) -- but rows are never torn and the
    # page accounting must stay exact.
    cfg = PagedKVCacheConfig(16, 12, 2, HEADS, HEAD_DIM, eviction=policy)
    cache = PagedKVCache(cfg)
    ids = itertools.count(1)
    appended = set()
    appended_lock = threading.Lock()

    def new_ids(n):
        got = [next(ids) for _ in range(n)]
        with appended_lock:
            appended.update(got)
        return np.array(got, np.float32)

    def work(tid, _round, rng):
        for _ in range(20):
            op = rng.random()
            try:
                if op < 0.3:
                    x = new_ids(BLOCK)
                    k = np.broadcast_to(x[None, :, None], (2, BLOCK, KV_DIM)).copy()
                    cache.append_tokens(k, -k)
                elif op < 0.6:
                    for _ in range(8):
                        x = new_ids(1)
                        row = np.full(KV_DIM, x[0], np.float32)
                        for layer in range(2):
                            cache.append_kv_layer(layer, row, -row)
                        try:
                            cache.advance()
                        except ValueError:
                            pass    # another thread's append moved seq_len to a page end
                elif op < 0.95:
                    layer = rng.randrange(2)
                    k = cache.gather_k(layer)
                    with appended_lock:
                        seen = set(appended)
                    check_rows(k, -k, seen, False)
                    v = cache.gather_v(layer)
                    with appended_lock:
                        seen = set(appended)
                    check_rows(-v, v, seen, False)
                else:
                    cache.reset()
            except PoolExhaustedError:
                assert policy is EvictionPolicy.NONE
                cache.reset()

    def check():
        n, ps = cache.seq_len(), cfg.page_size
        held, free = cache.page_ids().tolist(), cache.free_page_ids().tolist()
        assert len(set(held)) == len(held) and len(set(free)) == len(free)
        assert not set(held) & set(free)
        assert set(held) | set(free) == set(range(cfg.max_pages))
        assert cache.free_pages() == len(free) == cfg.max_pages - cache.num_pages()
        # A page may be mapped ahead of seq_len by an append_kv_layer whose advance was lost.
        assert len(held) * ps >= n > (len(held) - 2) * ps
        for layer in range(2):
            k, v = cache.gather_k(layer), cache.gather_v(layer)
            assert k.shape == v.shape == (n, KV_DIM)
            check_rows(k, v, appended, False)

    run_rounds(4, 5, work, check)
    check()


def test_gathers_never_see_a_half_written_bulk_append():
    # One writer alternates two fill patterns over a full window; readers must see each row as
    # one pattern or the other, never a mix inside a row, and every layer-0 K row in a gather
    # must come from a single append_tokens call (all rows equal) because appends replace the
    # whole window atomically under the cache lock.
    cfg = PagedKVCacheConfig(64, 1, 1, HEADS, HEAD_DIM, eviction=EvictionPolicy.LRU)
    cache = PagedKVCache(cfg)
    stop = threading.Event()
    errors = []

    def writer():
        try:
            for i in range(200):
                val = float(i % 2 + 1)
                k = np.full((1, 64, KV_DIM), val, np.float32)
                cache.reset()
                cache.append_tokens(k, -k)
        except BaseException as e:      # noqa: BLE001
            errors.append(e)
        finally:
            stop.set()

    def reader():
        try:
            while not stop.is_set():
                k = cache.gather_k(0)
                if k.shape[0]:
                    assert k.shape[0] == 64
                    assert (k == k[0, 0]).all(), "gather saw a mix of two appends"
                    assert k[0, 0] in (1.0, 2.0)
        except BaseException as e:      # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader)
                                                   for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[0]


def test_page_lists_read_while_appends_grow_the_table_and_free_list():
    """page_ids()/free_page_ids() copy the table and the free list while other threads'
    appends (GIL released) grow both by reallocation: each snapshot must be whole. With
    page_size 1 on a fresh NONE pool the pages are handed out in order, so a snapshot is
    [0, k) held and [max-1 .. k] free for some k."""
    cfg = PagedKVCacheConfig(1, 2048, 2, HEADS, HEAD_DIM)
    cache = PagedKVCache(cfg)
    rows = np.ones((2, 16, KV_DIM), np.float32)       # 256 KiB per call: the GIL is dropped
    done = threading.Event()
    errors = []

    def writer():
        try:
            while True:
                try:
                    cache.append_tokens(rows, rows)
                except PoolExhaustedError:
                    return
        except BaseException as e:      # noqa: BLE001
            errors.append(e)
        finally:
            done.set()

    def reader():
        try:
            while not done.is_set():
                held = cache.page_ids()
                assert np.array_equal(held, np.arange(len(held))), held[:20]
                free = cache.free_page_ids()
                k = cfg.max_pages - len(free)
                assert np.array_equal(free, np.arange(cfg.max_pages - 1, k - 1, -1)), free[-20:]
        except BaseException as e:      # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and not errors, errors[:1]
    assert cache.num_pages() == cfg.max_pages


# -- the manager ---------------------------------------------------------------------------

def test_block_table_never_returns_a_copy_of_older_blocks():
    # the deterministic half of the race above: a cached copy of a replaced list is ignored
    from pagedcy import AllocationRequest, PagedKVCacheManager
    m = PagedKVCacheManager(PagedKVCacheConfig(1, 8, 1, 1, 4))
    h = m.allocate(AllocationRequest("a", 2))
    stale = h.block_table()
    m.extend(h, 1)
    h._table = (list(stale.tolist()), stale)          # what a racing reader used to store
    assert h.block_table().tolist() == list(h._blocks) and len(h.block_table()) == 3


def test_pressure_callbacks_run_under_the_manager_lock():
    # Levels used to be computed under the lock and delivered after it, so two threads'
    # levels could arrive in the wrong order (the last callback then disagreed with
    # check_pressure(), seen in 4 of 5 stress runs). Under the lock they arrive in order.
    from pagedcy import AllocationRequest, PagedKVCacheManager
    m = PagedKVCacheManager(PagedKVCacheConfig(1, 4, 1, 1, 4), high_watermark=0.5,
                            critical_watermark=1.0)
    seen = []

    def callback(new, old):
        got = []
        t = threading.Thread(target=lambda: got.append(m._lock.acquire(blocking=False)))
        t.start()
        t.join()
        if got[0]:
            m._lock.release()
        seen.append((new, got[0]))
        m.stats()                                  # re-entrant: the callback may use the manager

    m.set_pressure_callback(callback)
    a = m.allocate(AllocationRequest("a", 1))
    b = m.allocate(AllocationRequest("b", 1))      # 2 of 4 pages: HIGH
    m.deallocate(b)
    m.deallocate(a)
    assert [lvl for lvl, _ in seen] == [1, 0] and not any(free for _, free in seen)
