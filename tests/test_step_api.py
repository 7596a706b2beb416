"""The engine step API: prepare_step -> write the slots -> commit_step.

Every property is checked against the per-layer path (``write_kv_tokens``) on a twin
manager fed the same operations: same data, same attention, same copy-on-write, same
prefix-cache registrations.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedcy
from pagedcy import PagedKVCacheConfig, PoolExhaustedError
from pagedcy._libs._manager_ops import write_token_rows
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager, StepSlots

PS = 4
LAYERS = 2
KVH, HD = 2, 4


def mgr(max_pages=48, **kw):
    return PagedKVCacheManager(PagedKVCacheConfig(PS, max_pages, LAYERS, KVH, HD),
                               enable_prefix_cache=True, **kw)


def rows_of(tokens, positions, layer):
    """Deterministic K/V rows ``[n, kv_dim]`` of (token, position, layer)."""
    t = np.asarray(tokens, np.float32)[:, None]
    p = np.asarray(positions, np.float32)[:, None]
    return t * 10 + p * 0.01 + layer * 0.5 + np.arange(KVH * HD, dtype=np.float32) * 1e-3


def step_write(m, handles, q_lens, tokens_per_handle):
    """One engine step: prepare, write every layer into the slots, commit. Returns the slots."""
    slots = m.prepare_step(handles, q_lens)
    toks = np.concatenate([np.asarray(t)[-q:] for t, q in zip(tokens_per_handle, q_lens)]
                          + [np.zeros(0, np.int64)])
    for layer in range(LAYERS):
        k = rows_of(toks, slots.positions, layer)
        write_token_rows(m.store, slots.slot_pages, slots.slot_offsets, layer, k, -k)
    m.commit_step(handles, q_lens)
    return slots


def layer_write(m, handles, q_lens, tokens_per_handle):
    """The same step through write_kv_tokens, layer by layer."""
    for layer in range(LAYERS):
        for h, q, t in zip(handles, q_lens, tokens_per_handle):
            start = h.num_tokens() - q
            k = rows_of(np.asarray(t)[-q:], np.arange(start, h.num_tokens()), layer)
            m.write_kv_tokens(h, layer, start, k, -k)


def read_all(m, h):
    return [m.read_kv(h, layer, 0, h.num_tokens()) for layer in range(LAYERS)]


def assert_same_kv(m1, h1, m2, h2):
    for (k1, v1), (k2, v2) in zip(read_all(m1, h1), read_all(m2, h2)):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(v1, v2)


def test_slots_agree_with_block_tables():
    m = mgr()
    rng = np.random.default_rng(0)
    hs = [m.allocate(AllocationRequest(initial_tokens=int(n))) for n in rng.integers(1, 30, 7)]
    q_lens = [int(rng.integers(1, h.num_tokens() + 1)) for h in hs]
    slots = m.prepare_step(hs, q_lens)
    assert isinstance(slots, StepSlots) and pagedcy.StepSlots is StepSlots
    for name in ("positions", "slot_pages", "slot_offsets", "qo_indptr", "block_tables", "kv_lens"):
        a = getattr(slots, name)
        assert a.dtype == np.int32 and a.flags.c_contiguous, name
    assert slots.num_tokens == sum(q_lens) and slots.batch_size == len(hs)
    assert list(slots.qo_indptr) == list(np.concatenate([[0], np.cumsum(q_lens)]))
    assert list(slots.kv_lens) == [h.num_tokens() for h in hs]
    for b, (h, q) in enumerate(zip(hs, q_lens)):
        table = h.block_table()
        assert list(slots.block_tables[b, :table.shape[0]]) == list(table)
        rows = slice(slots.qo_indptr[b], slots.qo_indptr[b + 1])
        want = np.arange(h.num_tokens() - q, h.num_tokens())
        assert list(slots.positions[rows]) == list(want)
        assert list(slots.slot_pages[rows]) == list(table[want // PS])
        assert list(slots.slot_offsets[rows]) == list(want % PS)
    m.check_invariants()


def test_slot_writes_equal_layer_writes_and_attention():
    a, b = mgr(), mgr()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 50, int(n)) for n in (9, 1, 14, 5)]
    ha = [a.allocate(AllocationRequest(initial_tokens=len(p))) for p in prompts]
    hb = [b.allocate(AllocationRequest(initial_tokens=len(p))) for p in prompts]
    q_lens = [len(p) for p in prompts]
    slots = step_write(a, ha, q_lens, prompts)
    layer_write(b, hb, q_lens, prompts)
    for x, y in zip(ha, hb):
        assert_same_kv(a, x, b, y)
    q = rng.standard_normal((sum(q_lens), 2 * KVH, HD)).astype(np.float32)
    for layer in range(LAYERS):
        want = b.attention(layer, q, hb, q_lens=q_lens)
        got = pagedcy.batch_paged_attention(q, slots.qo_indptr, a.store.pages(), layer,
                                            slots.block_tables, slots.kv_lens)
        np.testing.assert_array_equal(got, want)
    # one decode row each: positions num_tokens()-1 after extend
    toks = [np.append(p, 7) for p in prompts]
    for m, hs in ((a, ha), (b, hb)):
        for h in hs:
            m.extend(h, 1)
    step_write(a, ha, [1] * 4, toks)
    layer_write(b, hb, [1] * 4, toks)
    for x, y in zip(ha, hb):
        assert_same_kv(a, x, b, y)
    a.check_invariants()


def test_copy_on_write_of_forked_pages_keeps_the_sibling():
    m = mgr()
    prompt = np.arange(6)
    parent = m.allocate(AllocationRequest(initial_tokens=6))
    step_write(m, [parent], [6], [prompt])
    before = read_all(m, parent)
    child = m.fork(parent)
    m.extend(child, 1)
    slots = m.prepare_step([child], [1])         # touches page 1, shared with the parent
    assert slots.slot_pages[0] != parent.block_table()[1]
    assert slots.slot_pages[0] == child.block_table()[1]
    assert child.block_table()[0] == parent.block_table()[0]   # untouched page still shared
    write_token_rows(m.store, slots.slot_pages, slots.slot_offsets, 0,
                     np.full((1, KVH * HD), 9, np.float32), np.full((1, KVH * HD), 9, np.float32))
    for (k0, v0), (k1, v1) in zip(before, read_all(m, parent)):
        np.testing.assert_array_equal(k0, k1)
        np.testing.assert_array_equal(v0, v1)
    k, _ = m.read_kv(child, 0, 0, 7)
    np.testing.assert_array_equal(k[:6], before[0][0])      # the copy kept the shared rows
    assert (k[6] == 9).all()
    assert m.stats().cow_copies == 1
    m.check_invariants()


def test_both_holders_writing_a_shared_page_in_one_step_copy_once():
    m = mgr()
    a = m.allocate(AllocationRequest(initial_tokens=3))
    step_write(m, [a], [3], [[1, 2, 3]])
    b = m.fork(a)
    m.extend(a, 1)
    m.extend(b, 1)
    slots = m.prepare_step([a, b], [1, 1])
    assert slots.slot_pages[0] != slots.slot_pages[1]
    assert m.stats().cow_copies == 1                 # the last writer keeps the original
    assert m.pool.ref_count(int(slots.slot_pages[0])) == 1
    assert m.pool.ref_count(int(slots.slot_pages[1])) == 1
    k = np.stack([np.full(KVH * HD, 5, np.float32), np.full(KVH * HD, 6, np.float32)])
    for layer in range(LAYERS):
        write_token_rows(m.store, slots.slot_pages, slots.slot_offsets, layer, k, k)
    ka, _ = m.read_kv(a, 1, 0, 4)
    kb, _ = m.read_kv(b, 1, 0, 4)
    assert (ka[3] == 5).all() and (kb[3] == 6).all()
    np.testing.assert_array_equal(ka[:3], kb[:3])
    m.check_invariants()


def test_holder_outside_the_step_keeps_the_shared_page():
    m = mgr()
    a = m.allocate(AllocationRequest(initial_tokens=3))
    step_write(m, [a], [3], [[1, 2, 3]])
    b, c = m.fork(a), m.fork(a)                      # three holders of page 0
    before = read_all(m, c)
    m.extend(a, 1)
    m.extend(b, 1)
    slots = m.prepare_step([a, b], [1, 1])           # c is not in the step
    assert m.stats().cow_copies == 2
    assert c.block_table()[0] not in slots.slot_pages.tolist()
    k = np.full((2, KVH * HD), 7, np.float32)
    for layer in range(LAYERS):
        write_token_rows(m.store, slots.slot_pages, slots.slot_offsets, layer, k, k)
    m.extend(c, 1)
    for layer, (k0, v0) in enumerate(before):
        kc, vc = m.read_kv(c, layer, 0, 3)
        np.testing.assert_array_equal(kc, k0)
        np.testing.assert_array_equal(vc, v0)
    m.check_invariants()


def test_copy_on_write_of_prefix_cached_pages():
    m = mgr()
    prompt = np.arange(10) + 3
    a = m.allocate(AllocationRequest(prompt_tokens=prompt))
    step_write(m, [a], [10], [prompt])
    cached = m.cached_page_hashes()
    assert len(cached) == 2
    pages0 = list(a.block_table()[:2])
    # recompute the whole prompt in place (e.g. after a model change): the cached pages
    # are copied, so the cache keeps serving the originals
    slots = m.prepare_step([a], [10])
    assert not set(slots.slot_pages[:8].tolist()) & set(pages0)
    k = np.zeros((10, KVH * HD), np.float32)
    for layer in range(LAYERS):
        write_token_rows(m.store, slots.slot_pages, slots.slot_offsets, layer, k, k)
    m.commit_step([a], [10])
    b = m.allocate(AllocationRequest(prompt_tokens=prompt))
    assert b.num_cached_tokens() == 8 and list(b.block_table()[:2]) == pages0
    for layer in range(LAYERS):
        kb, vb = m.read_kv(b, layer, 0, 8)
        want = rows_of(prompt[:8], np.arange(8), layer)
        np.testing.assert_array_equal(kb.reshape(8, -1), want)
        np.testing.assert_array_equal(vb.reshape(8, -1), -want)
    m.check_invariants()


def test_commit_registers_prompt_pages_like_layer_writes_chunked():
    a, b = mgr(), mgr()
    prompt = np.arange(19) % 7 + 1
    # the engine path: prompt known up front, K/V computed in chunks of 5
    ha = a.allocate(AllocationRequest(prompt_tokens=prompt, initial_tokens=len(prompt)))
    hb = b.allocate(AllocationRequest(prompt_tokens=prompt, initial_tokens=len(prompt)))
    for start in range(0, len(prompt), 5):
        q = min(5, len(prompt) - start)
        for m, h in ((a, ha), (b, hb)):
            h.set_num_tokens(start + q)
        step_write(a, [ha], [q], [prompt[:start + q]])
        layer_write(b, [hb], [q], [prompt[:start + q]])
        assert sorted(a.cached_page_hashes().values()) == sorted(b.cached_page_hashes().values())
    assert len(a.cached_page_hashes()) == 4
    for m in (a, b):
        h = m.allocate(AllocationRequest(prompt_tokens=np.append(prompt, 99)))
        assert h.num_cached_tokens() == 16
    assert_same_kv(a, ha, b, hb)


def test_prepare_without_commit_registers_nothing():
    m = mgr()
    prompt = np.arange(9)
    h = m.allocate(AllocationRequest(prompt_tokens=prompt))
    m.prepare_step([h], [9])
    assert m.cached_page_hashes() == {}
    assert m.allocate(AllocationRequest(prompt_tokens=prompt)).num_cached_tokens() == 0


def state(m):
    return ([list(h.block_table()) for h in m.list_handles()], m.pool.ref_counts().tolist(),
            dict(m.cached_page_hashes()), [h.num_tokens() for h in m.list_handles()],
            m.stats().cow_copies)


@pytest.mark.parametrize("method", ["prepare_step", "commit_step"])
def test_bad_input_raises_and_changes_nothing(method, tmp_path):
    m = mgr(swap_pages=8)
    a = m.allocate(AllocationRequest(prompt_tokens=np.arange(6)))
    c = m.fork(a)
    s = m.allocate(AllocationRequest(initial_tokens=2))
    m.swap_out(s)
    d = m.allocate(AllocationRequest(initial_tokens=2))
    m.deallocate(d)
    other = mgr().allocate(AllocationRequest(initial_tokens=2))
    fn = getattr(m, method)
    before = state(m)
    cases = [
        (TypeError, a, [1]),                    # a handle, not a sequence of them
        (TypeError, 5, [1]),
        (TypeError, ["a"], [1]),                # request ids are not handles here
        (TypeError, [a], [1.0]),
        (TypeError, [a], ["1"]),
        (ValueError, [a, a], [1, 1]),
        (ValueError, [a, c], [1]),
        (ValueError, [a], [[1]]),
        (ValueError, [a], [0]),
        (ValueError, [a, c], [1, 7]),           # more than num_tokens()
        (ValueError, [a], [-1]),
        (ValueError, [a, s], [1, 1]),           # swapped out
        (ValueError, [a, d], [1, 1]),           # deallocated
        (ValueError, [other], [1]),             # another manager's handle
        (TypeError, [a], [2**80]),
    ]
    for exc, hs, ql in cases:
        with pytest.raises(exc):
            fn(hs, ql)
        assert state(m) == before, (hs, ql)
    m.check_invariants()


def test_copy_on_write_exhaustion_changes_nothing():
    m = mgr(max_pages=4)
    a = m.allocate(AllocationRequest(initial_tokens=8))
    b = m.fork(a)
    m.allocate(AllocationRequest(initial_tokens=7))         # 2 pages left... now 0
    before = state(m)
    with pytest.raises(PoolExhaustedError):
        m.prepare_step([a, b], [5, 5])      # needs 2 copies for a (b keeps), none free
    assert state(m) == before
    m.check_invariants()


def test_empty_step():
    m = mgr()
    s = m.prepare_step([], [])
    assert s.num_tokens == 0 and s.batch_size == 0 and list(s.qo_indptr) == [0]
    m.commit_step([], np.zeros(0, np.int64))


@st.composite
def workloads(draw):
    """Prompts drawn from a few shared pieces, processed in random chunk sizes,
    with forks that decode on."""
    pieces = [draw(st.lists(st.integers(0, 9), min_size=1, max_size=6)) for _ in range(3)]
    prompts = []
    for _ in range(draw(st.integers(1, 4))):
        seq = sum((pieces[i] for i in draw(st.lists(st.integers(0, 2), min_size=1, max_size=3))),
                  [])
        prompts.append(seq)
    chunks = draw(st.lists(st.integers(1, 6), min_size=8, max_size=8))
    forks = draw(st.lists(st.booleans(), min_size=4, max_size=4))
    decodes = draw(st.integers(0, 5))
    return prompts, chunks, forks, decodes


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(workloads())
def test_step_path_matches_layer_path(work):
    prompts, chunks, forks, decodes = work
    a, b = mgr(max_pages=64), mgr(max_pages=64)
    live = {a: [], b: []}
    for i, prompt in enumerate(prompts):
        for m in (a, b):
            h = m.allocate(AllocationRequest(prompt_tokens=prompt))
            h.set_num_tokens(h.num_cached_tokens())
            live[m].append([h, list(prompt)])
        assert live[a][-1][0].num_cached_tokens() == live[b][-1][0].num_cached_tokens()
        # chunked prefill of the rest, all live prompts in one batch per step
        for c in chunks:
            batch = [j for j, (h, t) in enumerate(live[a]) if h.num_tokens() < len(t)]
            if not batch:
                break
            for m in (a, b):
                hs, ql, toks = [], [], []
                for j in batch:
                    h, t = live[m][j]
                    q = min(c, len(t) - h.num_tokens())
                    h.set_num_tokens(h.num_tokens() + q)
                    hs.append(h), ql.append(q), toks.append(t[:h.num_tokens()])
                (step_write if m is a else layer_write)(m, hs, ql, toks)
        if forks[i % 4]:
            for m in (a, b):
                h, t = live[m][-1]
                if h.num_tokens() == len(t):
                    live[m].append([m.fork(h), list(t)])
    for step in range(decodes):
        for m in (a, b):
            hs, toks = [], []
            for h, t in live[m]:
                if h.num_tokens() == len(t):
                    t.append(step + 11 * len(hs))
                    m.extend(h, 1)
                    hs.append(h), toks.append(t)
            (step_write if m is a else layer_write)(m, hs, [1] * len(hs), toks)
    for (ha, _), (hb, _) in zip(live[a], live[b]):
        assert_same_kv(a, ha, b, hb)
        assert ha.num_blocks() == hb.num_blocks()
    sa, sb = a.stats(), b.stats()
    assert (sa.cow_copies, sa.used_blocks, sa.cached_blocks) == \
        (sb.cow_copies, sb.used_blocks, sb.cached_blocks)
    assert sorted(a.cached_page_hashes().values()) == sorted(b.cached_page_hashes().values())
    a.check_invariants()
    b.check_invariants()
