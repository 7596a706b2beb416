"""Prefix caching: chained page hashes, sharing, evictable LRU, salts, reset."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedcy import PagedKVCacheConfig, PoolExhaustedError
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager

PS = 4


def mgr(max_pages=16, **kw):
    return PagedKVCacheManager(PagedKVCacheConfig(PS, max_pages, 2, 1, 4),
                               enable_prefix_cache=True, **kw)


def kv_of(tokens, positions):
    """Deterministic K/V of (token, position): what a model would compute."""
    t = np.asarray(tokens, np.float32)[:, None]
    p = np.asarray(positions, np.float32)[:, None]
    return t * 10 + p * 0.01 + np.arange(4, dtype=np.float32)


def prefill(m, prompt, salt=None, rid=None):
    h = m.allocate(AllocationRequest(request_id=rid, prompt_tokens=prompt, cache_salt=salt))
    c = h.num_cached_tokens()
    rows = kv_of(prompt[c:], np.arange(c, len(prompt)))
    for layer in range(2):
        m.write_kv_tokens(h, layer, c, rows, rows + layer)
    return h


def check_data(m, h, prompt):
    for layer in range(2):
        k, v = m.read_kv(h, layer, 0, len(prompt))
        want = kv_of(prompt, np.arange(len(prompt)))
        np.testing.assert_array_equal(k.reshape(len(prompt), -1), want)
        np.testing.assert_array_equal(v.reshape(len(prompt), -1), want + layer)


def test_hit_shares_physical_pages_and_refcounts():
    m = mgr()
    prompt = np.arange(10) + 100                       # 2 full pages + 2 tokens
    a = prefill(m, prompt)
    assert a.num_cached_tokens() == 0
    assert len(m.cached_page_hashes()) == 2            # the partial page is not cached
    b = prefill(m, prompt)
    assert b.num_cached_tokens() == 8
    assert list(b.block_table()[:2]) == list(a.block_table()[:2])
    assert b.block_table()[2] != a.block_table()[2]
    rc = m.pool.ref_counts()
    assert rc[a.block_table()[0]] == 2 and rc[a.block_table()[2]] == 1
    check_data(m, b, prompt)
    s = m.stats()
    assert s.prefix_queries == 20 and s.prefix_hits == 8 and s.prefix_hit_rate == 0.4
    m.check_invariants()


def test_longer_prompt_shares_prefix_and_divergence_stops_matching():
    m = mgr(max_pages=32)
    base = np.arange(13)
    prefill(m, base)
    longer = np.concatenate([base[:12], [77, 78, 79, 80, 81, 82]])
    h = prefill(m, longer)
    assert h.num_cached_tokens() == 12
    check_data(m, h, longer)
    diverged = base.copy()
    diverged[5] = 999                                  # second page differs
    h2 = prefill(m, diverged)
    assert h2.num_cached_tokens() == 4                 # chained: page 3 can't match either
    check_data(m, h2, diverged)


def test_at_least_one_prompt_token_left_to_compute():
    m = mgr()
    prompt = np.arange(8)                              # exactly 2 full pages
    prefill(m, prompt)
    h = m.allocate(AllocationRequest(prompt_tokens=prompt))
    assert h.num_cached_tokens() == 4                  # not 8: the last token must run


def test_pages_registered_only_when_every_layer_is_written():
    m = mgr()
    prompt = np.arange(9)
    h = m.allocate(AllocationRequest(prompt_tokens=prompt))
    rows = kv_of(prompt, np.arange(9))
    m.write_kv_tokens(h, 0, 0, rows, rows)
    assert m.cached_page_hashes() == {}
    m.write_kv_tokens(h, 1, 0, rows[:5], rows[:5] + 1)
    assert len(m.cached_page_hashes()) == 1
    m.write_kv_tokens(h, 1, 5, rows[5:], rows[5:] + 1)
    assert len(m.cached_page_hashes()) == 2


def test_evictable_lru_reuse_and_eviction():
    m = mgr(max_pages=6)
    p1, p2 = np.arange(9), np.arange(9) + 50
    a = prefill(m, p1)
    b = prefill(m, p2)
    a_pages, b_pages = a.block_table().tolist(), b.block_table().tolist()
    m.deallocate(a)
    m.deallocate(b)
    # Cached full pages stay allocated but evictable; the partial pages are free.
    assert m.cached_blocks() == 4 and m.free_blocks() == 6 and m.used_blocks() == 0
    assert set(m.evictable_pages()) == set(a_pages[:2] + b_pages[:2])
    m.check_invariants()
    # A hit pulls pages back out of the evictable queue (no copy, same pages).
    a2 = prefill(m, p1)
    assert a2.num_cached_tokens() == 8 and a2.block_table().tolist()[:2] == a_pages[:2]
    assert m.cached_blocks() == 2
    m.deallocate(a2)
    # p1's pages were freed last -> most recent; a new allocation evicts p2's first.
    order = m.evictable_pages()
    assert order[:2] == [b_pages[1], b_pages[0]] or set(order[:2]) == set(b_pages[:2])
    big = m.allocate(AllocationRequest(initial_tokens=4 * 4))   # 2 free + 2 evicted
    assert m.stats().evictions == 2
    assert set(big.block_table().tolist()) & set(b_pages[:2]) == set(b_pages[:2])
    m.deallocate(big)
    miss = m.allocate(AllocationRequest(prompt_tokens=p2))
    assert miss.num_cached_tokens() == 0
    m.deallocate(miss)
    hit = m.allocate(AllocationRequest(prompt_tokens=p1))
    assert hit.num_cached_tokens() == 8
    m.check_invariants()


def test_allocation_failure_with_hits_changes_nothing():
    m = mgr(max_pages=4)
    prompt = np.arange(9)
    a = prefill(m, prompt)
    before = (m.pool.ref_counts().tolist(), m.evictable_pages(), m.free_blocks())
    with pytest.raises(PoolExhaustedError):
        m.allocate(AllocationRequest(prompt_tokens=np.concatenate([prompt[:8], np.arange(20)])))
    assert (m.pool.ref_counts().tolist(), m.evictable_pages(), m.free_blocks()) == before
    assert not m.can_allocate(AllocationRequest(prompt_tokens=np.arange(40)))
    assert m.can_allocate(AllocationRequest(prompt_tokens=prompt))
    m.deallocate(a)
    m.check_invariants()


def test_salt_separates_tenants():
    m = mgr()
    prompt = np.arange(9)
    prefill(m, prompt, salt=b"alice")
    assert m.allocate(AllocationRequest(prompt_tokens=prompt, cache_salt="bob")).num_cached_tokens() == 0
    assert m.allocate(AllocationRequest(prompt_tokens=prompt)).num_cached_tokens() == 0
    assert m.allocate(AllocationRequest(prompt_tokens=prompt, cache_salt="alice")).num_cached_tokens() == 8


def test_write_into_cached_page_copies_first():
    m = mgr()
    prompt = np.arange(9)
    a = prefill(m, prompt)
    page0 = a.block_table()[0]
    m.write_kv(a, 0, 1, np.full(4, -1.0), np.full(4, -1.0))   # a's own, but hashed page
    assert a.block_table()[0] != page0 and m.stats().cow_copies == 1
    b = m.allocate(AllocationRequest(prompt_tokens=prompt))
    assert b.num_cached_tokens() == 8 and b.block_table()[0] == page0
    check_data(m, b, prompt[:8])                     # the cache kept the clean data
    assert m.read_kv(a, 0, 1, 1)[0][0, 0, 0] == -1.0
    m.check_invariants()


def test_reset_prefix_cache_and_disabled_cache():
    m = mgr()
    prompt = np.arange(9)
    a = prefill(m, prompt)
    m.deallocate(prefill(m, np.arange(9) + 30))
    assert m.cached_blocks() == 2
    assert m.reset_prefix_cache() == 2
    assert m.cached_blocks() == 0 and m.cached_page_hashes() == {}
    assert m.allocate(AllocationRequest(prompt_tokens=prompt)).num_cached_tokens() == 0
    m.deallocate(a)
    m.check_invariants()
    off = PagedKVCacheManager(PagedKVCacheConfig(PS, 8, 2, 1, 4))
    prefill(off, prompt)
    assert prefill(off, prompt).num_cached_tokens() == 0 and off.cached_page_hashes() == {}


def test_identical_prompts_in_flight_do_not_double_register():
    m = mgr()
    prompt = np.arange(9)
    a = m.allocate(AllocationRequest(prompt_tokens=prompt))
    b = m.allocate(AllocationRequest(prompt_tokens=prompt))   # nothing registered yet
    assert b.num_cached_tokens() == 0
    for h in (a, b):
        rows = kv_of(prompt, np.arange(9))
        for layer in range(2):
            m.write_kv_tokens(h, layer, 0, rows, rows + layer)
    assert len(m.cached_page_hashes()) == 2
    m.deallocate(a)
    m.deallocate(b)
    assert m.cached_blocks() == 2
    m.check_invariants()


@st.composite
def shared_block_prompts(draw):
    """Prompts built from a few 4-token blocks in random orders (so the same block shows
    up at different positions and after different blocks), each with a short tail."""
    blocks = draw(st.lists(st.lists(st.integers(0, 5), min_size=PS, max_size=PS),
                           min_size=2, max_size=4, unique_by=tuple))
    prompts = []
    for _ in range(draw(st.integers(2, 7))):
        order = draw(st.lists(st.integers(0, len(blocks) - 1), min_size=1, max_size=4))
        tail = draw(st.lists(st.integers(0, 5), max_size=PS - 1))
        prompts.append(sum((blocks[i] for i in order), []) + tail)
    return prompts


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(shared_block_prompts(), st.booleans())
def test_hit_only_where_every_earlier_token_matches(prompts, release):
    """A page is a prefix hit exactly when some earlier prompt has the same tokens up to
    and including that page: same page content after a different history is a miss
    (its K/V were computed in another context)."""
    m = mgr(max_pages=64)                              # room for everything: no evictions
    seen = []
    for prompt in prompts:
        prompt = np.array(prompt)
        full = (len(prompt) - 1) // PS                  # pages a hit may cover
        want = 0
        for k in range(full, 0, -1):
            if any(len(s) >= k * PS and np.array_equal(s[:k * PS], prompt[:k * PS])
                   for s in seen):
                want = k * PS
                break
        h = prefill(m, prompt)
        assert h.num_cached_tokens() == want, (prompt.tolist(), [s.tolist() for s in seen])
        check_data(m, h, prompt)       # K/V of (token, position): a wrong-context page differs
        seen.append(prompt)
        if release:
            m.deallocate(h)
        m.check_invariants()
