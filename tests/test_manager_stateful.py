"""Hypothesis state machine: allocate (with prefix hits) / prefill / write / fork /
write-after-fork / extend / swap_out / swap_in / deallocate / engine steps (prefill and
batched writes through prepare_step slots + commit_step) against a plain-Python model.

After every step: each page is free (refcount 0, in no table), evictable (refcount 1,
hashed, in no table) or owned with refcount == number of handles whose table holds it;
swap pages add up; and every resident sequence reads back exactly what was written.
"""
import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from pagedcy import PagedKVCacheConfig, PoolExhaustedError
from pagedcy._libs._manager_ops import write_token_rows
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager

PS, PAGES, LAYERS, KVD, SWAP = 4, 20, 2, 2, 12
PREFIXES = [list(range(8)), list(range(8)) + [50, 51, 52, 53], [9, 9, 9, 9, 1, 2, 3, 4]]


def prompt_kv(tokens, start, layer):
    """What a model computes at prompt positions: a function of (token, position, layer)."""
    t = np.asarray(tokens, np.float32)[:, None]
    p = np.arange(start, start + len(tokens), dtype=np.float32)[:, None]
    k = t + 1000 * layer + 0.001 * p + np.arange(KVD, dtype=np.float32)
    return k, -k


class Seq:
    def __init__(self, h, prompt):
        self.h = h
        self.prompt = prompt
        self.data = np.full((LAYERS, 2, h.num_blocks() * PS, KVD), np.nan, np.float32)
        self.prefilled = prompt is None

    def grow(self, cap):
        extra = cap - self.data.shape[2]
        if extra > 0:
            pad = np.full((LAYERS, 2, extra, KVD), np.nan, np.float32)
            self.data = np.concatenate([self.data, pad], axis=2)


class ManagerMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self):
        super().__init__()
        self.m = PagedKVCacheManager(PagedKVCacheConfig(PS, PAGES, LAYERS, 1, KVD),
                                     enable_prefix_cache=True, swap_pages=SWAP)
        self.model = {}          # request_id -> Seq
        self.rng = np.random.default_rng(0)

    def _state(self):
        m = self.m
        return (m.pool.ref_counts().tolist(), m.evictable_pages(), m.swap_free_blocks(),
                {rid: (s.h.block_table().tolist(), s.h.num_tokens(), s.h.is_swapped())
                 for rid, s in self.model.items()})

    def _alive(self, rid):
        return rid in self.model

    # -- rules ------------------------------------------------------------------------
    @rule(target=seqs, which=st.integers(-1, len(PREFIXES) - 1),
          suffix=st.lists(st.integers(0, 3), max_size=6), extra=st.integers(0, 9))
    def allocate(self, which, suffix, extra):
        prompt = None if which < 0 else PREFIXES[which] + suffix
        before = self._state()
        try:
            if prompt is None:
                h = self.m.allocate(AllocationRequest(initial_tokens=extra))
            else:
                h = self.m.allocate(AllocationRequest(prompt_tokens=prompt))
        except PoolExhaustedError:
            assert self._state() == before
            return None
        s = Seq(h, prompt)
        c = h.num_cached_tokens()
        if prompt is not None:
            assert c % PS == 0 and c < len(prompt)
            for layer in range(LAYERS):
                k, v = prompt_kv(prompt[:c], 0, layer)
                s.data[layer, 0, :c], s.data[layer, 1, :c] = k, v
        else:
            assert c == 0
        self.model[h.request_id] = s
        return h.request_id

    @rule(rid=seqs)
    def prefill(self, rid):
        s = self.model.get(rid)
        if s is None or s.prefilled or s.h.is_swapped():
            return
        c = s.h.num_cached_tokens()
        for layer in range(LAYERS):
            k, v = prompt_kv(s.prompt[c:], c, layer)
            before = self._state()
            try:
                self.m.write_kv_tokens(s.h, layer, c, k, v)
            except PoolExhaustedError:
                assert self._state() == before
                return
            s.data[layer, 0, c:len(s.prompt)], s.data[layer, 1, c:len(s.prompt)] = k, v
        s.prefilled = True

    @rule(rid=seqs, start=st.integers(0, 40), n=st.integers(1, 6), layer=st.integers(0, 1),
          seed=st.integers(0, 2**16))
    def write(self, rid, start, n, layer, seed):
        s = self.model.get(rid)
        if s is None or s.h.is_swapped():
            return
        cap = s.h.num_blocks() * PS
        if cap == 0:
            return
        # Overwriting a prompt region before its prefill would poison what it registers.
        lo = 0 if s.prefilled else len(s.prompt)
        if lo >= cap:
            return
        start = lo + start % (cap - lo)
        n = min(n, cap - start)
        rng = np.random.default_rng(seed)
        k = rng.standard_normal((n, KVD)).astype(np.float32)
        v = rng.standard_normal((n, KVD)).astype(np.float32)
        before = self._state()
        try:
            if n == 1 and seed % 2:
                self.m.write_kv(s.h, layer, start, k[0], v[0])
            else:
                self.m.write_kv_tokens(s.h, layer, start, k, v)
        except PoolExhaustedError:
            assert self._state() == before
            return
        s.data[layer, 0, start:start + n], s.data[layer, 1, start:start + n] = k, v

    @rule(rid=seqs)
    def step_prefill(self, rid):
        """The engine's prefill: one step writes every layer into the slots, then commits."""
        s = self.model.get(rid)
        if s is None or s.prefilled or s.h.is_swapped() or s.h.num_tokens() != len(s.prompt):
            return
        c = s.h.num_cached_tokens()
        before = self._state()
        try:
            slots = self.m.prepare_step([s.h], [len(s.prompt) - c])
        except PoolExhaustedError:
            assert self._state() == before
            return
        assert slots.positions.tolist() == list(range(c, len(s.prompt)))
        for layer in range(LAYERS):
            k, v = prompt_kv(s.prompt[c:], c, layer)
            write_token_rows(self.m.store, slots.slot_pages, slots.slot_offsets, layer, k, v)
            s.data[layer, 0, c:len(s.prompt)], s.data[layer, 1, c:len(s.prompt)] = k, v
        self.m.commit_step([s.h], [len(s.prompt) - c])
        s.prefilled = True

    @rule(rids=st.lists(seqs, min_size=1, max_size=4), q=st.integers(1, 5),
          seed=st.integers(0, 2**16))
    def step_write(self, rids, q, seed):
        """One step over several sequences, each writing its last tokens through the slots."""
        hs, ql, seqs = [], [], []
        for rid in dict.fromkeys(rids):
            s = self.model.get(rid)
            if s is None or s.h.is_swapped():
                continue
            lo = 0 if s.prefilled else len(s.prompt)   # never poison an unwritten prompt
            n = min(q, s.h.num_tokens() - lo)
            if n > 0:
                hs.append(s.h), ql.append(n), seqs.append(s)
        if not hs:
            return
        before = self._state()
        try:
            slots = self.m.prepare_step(hs, ql)
        except PoolExhaustedError:
            assert self._state() == before
            return
        rng = np.random.default_rng(seed)
        for layer in range(LAYERS):
            k = rng.standard_normal((sum(ql), KVD)).astype(np.float32)
            write_token_rows(self.m.store, slots.slot_pages, slots.slot_offsets, layer, k, -k)
            for b, s in enumerate(seqs):
                rows = slice(slots.qo_indptr[b], slots.qo_indptr[b + 1])
                pos = slots.positions[rows]
                s.data[layer, 0, pos], s.data[layer, 1, pos] = k[rows], -k[rows]
        self.m.commit_step(hs, ql)

    @rule(target=seqs, rid=seqs)
    def fork(self, rid):
        s = self.model.get(rid)
        if s is None or s.h.is_swapped():
            return None
        c = self.m.fork(s.h)
        assert c.block_table().tolist() == s.h.block_table().tolist()
        child = Seq(c, None)
        child.data = s.data.copy()
        self.model[c.request_id] = child
        return c.request_id

    @rule(rid=seqs, add=st.integers(0, 9))
    def extend(self, rid, add):
        s = self.model.get(rid)
        if s is None or s.h.is_swapped():
            return
        before = self._state()
        try:
            self.m.extend(s.h, add)
        except PoolExhaustedError:
            assert self._state() == before
            return
        s.grow(s.h.num_blocks() * PS)

    @rule(rid=seqs)
    def swap_out(self, rid):
        s = self.model.get(rid)
        if s is None or s.h.is_swapped():
            return
        before = self._state()
        try:
            self.m.swap_out(s.h)
        except PoolExhaustedError:
            assert self._state() == before
            return
        assert s.h.is_swapped()

    @rule(rid=seqs)
    def swap_in(self, rid):
        s = self.model.get(rid)
        if s is None or not s.h.is_swapped():
            return
        before = self._state()
        try:
            self.m.swap_in(s.h)
        except PoolExhaustedError:
            assert self._state() == before
            return
        assert not s.h.is_swapped()

    @rule(rid=consumes(seqs))
    def deallocate(self, rid):
        s = self.model.pop(rid, None)
        if s is not None:
            self.m.deallocate(s.h if len(self.model) % 2 else rid)   # by handle or by id

    # -- invariants ---------------------------------------------------------------------
    @invariant()
    def pages_accounted(self):
        m = self.m
        rc = m.pool.ref_counts()
        held = np.zeros(PAGES, np.int64)
        swap_held = 0
        for s in self.model.values():
            if s.h.is_swapped():
                swap_held += s.h.num_blocks()
                assert len(s.h.block_table()) == 0
            for p in s.h.block_table():
                held[p] += 1
        ev = set(m.evictable_pages())
        hashed = m.cached_page_hashes()
        for p in range(PAGES):
            if p in ev:
                assert held[p] == 0 and rc[p] == 1 and p in hashed, p
            else:
                assert rc[p] == held[p], (p, rc[p], held[p])
        assert m.pool.free_count() == int((rc == 0).sum())
        assert m.free_blocks() == m.pool.free_count() + len(ev)
        assert SWAP - m.swap_free_blocks() == swap_held
        assert len(m.list_handles()) == len(self.model)
        m.check_invariants()

    @invariant()
    def data_reads_back(self):
        for s in self.model.values():
            if s.h.is_swapped() or s.h.num_blocks() == 0:
                continue
            cap = s.h.num_blocks() * PS
            assert s.data.shape[2] == cap
            for layer in range(LAYERS):
                k, v = self.m.read_kv(s.h, layer, 0, cap)
                for which, got in ((0, k), (1, v)):
                    want = s.data[layer, which]
                    known = ~np.isnan(want[:, 0])
                    np.testing.assert_array_equal(got.reshape(cap, KVD)[known], want[known])

    def teardown(self):
        for s in list(self.model.values()):
            self.m.deallocate(s.h)
        self.m.reset_prefix_cache()
        assert self.m.pool.free_count() == PAGES and self.m.swap_free_blocks() == SWAP


# too_slow measures data generation, which a loaded host slows (it failed twice right
# after a benchmark, with no falsifying example); every rule but allocate needs a sequence,
# so a run's first draws are often filtered (about 1 in 25 runs tripped filter_too_much,
# again with no example). The other checks stay on.
ManagerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                            deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.filter_too_much])
TestManagerMachine = ManagerMachine.TestCase
