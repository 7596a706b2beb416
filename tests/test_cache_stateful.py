"""Hypothesis state machine: PagedKVCache against the plain-Python CacheModel.

Pools are tiny (1..4 pages of 1..5 tokens) so exhaustion and LRU eviction happen in most runs.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PoolExhaustedError

from core_helpers import CacheModel, ModelExhausted, check_window


class CacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.integers(1, 5), max_pages=st.integers(1, 4),
                num_layers=st.integers(1, 3), heads=st.integers(1, 2), head_dim=st.integers(1, 3),
                lru=st.booleans(), dtype=st.sampled_from(["float32", "float32", "float16",
                                                          "bfloat16"]))
    def setup(self, page_size, max_pages, num_layers, heads, head_dim, lru, dtype):
        self.cfg = PagedKVCacheConfig(page_size, max_pages, num_layers, heads, head_dim,
                                      eviction=EvictionPolicy.LRU if lru else EvictionPolicy.NONE,
                                      dtype=dtype)
        self.cache = PagedKVCache(self.cfg)
        self.model = CacheModel(page_size, max_pages, num_layers, lru)
        self.kv_dim = heads * head_dim
        self.counter = 0

    def fresh_rows(self, shape):
        # Distinct small integers: exact in float16/bfloat16 up to 256, so each row is
        # identifiable after rounding; wrap keeps them exact.
        n = int(np.prod(shape))
        vals = (np.arange(self.counter, self.counter + n) % 251).astype(np.float32) - 125
        self.counter += n
        return vals.reshape(shape)

    def expect(self, model_call, cache_call):
        try:
            model_call()
        except ModelExhausted:
            with pytest.raises(PoolExhaustedError):
                cache_call()
            return False
        cache_call()
        return True

    @rule()
    def append_token_all_layers(self):
        rows = self.fresh_rows((2, self.cfg.num_layers, self.kv_dim))
        for layer in range(self.cfg.num_layers):
            ok = self.expect(lambda: self.model.append_kv_layer(layer, rows[0, layer], rows[1, layer]),
                             lambda: self.cache.append_kv_layer(layer, rows[0, layer],
                                                                rows[1, layer]))
            if not ok:
                return
        self.model.advance()
        self.cache.advance()

    @rule(data=st.data())
    def append_subset_then_advance(self, data):
        layers = data.draw(st.lists(st.integers(0, self.cfg.num_layers - 1), min_size=1,
                                    max_size=4))
        for layer in layers:
            rows = self.fresh_rows((2, self.kv_dim))
            ok = self.expect(lambda: self.model.append_kv_layer(layer, rows[0], rows[1]),
                             lambda: self.cache.append_kv_layer(layer, rows[0], rows[1]))
            if not ok:
                return
        self.model.advance()
        self.cache.advance()

    @rule(n=st.integers(0, 20), split_heads=st.booleans())
    def append_tokens(self, n, split_heads):
        k = self.fresh_rows((self.cfg.num_layers, n, self.kv_dim))
        v = self.fresh_rows((self.cfg.num_layers, n, self.kv_dim))
        shape = (self.cfg.num_layers, n, self.cfg.num_kv_heads, self.cfg.head_dim)
        kc, vc = (k.reshape(shape), v.reshape(shape)) if split_heads else (k, v)
        self.expect(lambda: self.model.append_tokens(k, v),
                    lambda: self.cache.append_tokens(kc, vc))

    @rule(data=st.data(), which=st.sampled_from("kv"), into=st.sampled_from(
        ["new", "dst1d", "dst2d", "f32"]))
    def gather(self, data, which, into):
        layer = data.draw(st.integers(0, self.cfg.num_layers - 1))
        n = self.model.seq_len
        fn = self.cache.gather_k if which == "k" else self.cache.gather_v
        sdt = self.cfg.storage_dtype()
        if into == "new":
            got = fn(layer)
            assert got.dtype == sdt and got.shape == (n, self.kv_dim)
        elif into == "f32":
            got = fn(layer, np.empty((n, self.kv_dim), np.float32))
            check_window(got, self.model.window(layer, which), self.kv_dim, "float32",
                         f"gather_{which}({layer}) f32")
            return
        else:
            shape = (n * self.kv_dim,) if into == "dst1d" else (n, self.kv_dim)
            dst = np.empty(shape, sdt)
            got = fn(layer, dst)
            assert got is dst
        check_window(got, self.model.window(layer, which), self.kv_dim, self.cfg.dtype,
                     f"gather_{which}({layer})")

    @precondition(lambda self: self.model.seq_len > 0 or self.model.pending)
    @rule()
    def reset(self):
        self.model.reset()
        self.cache.reset()

    @invariant()
    def counts_match(self):
        if not hasattr(self, "cache"):
            return
        m, c = self.model, self.cache
        assert c.seq_len() == m.seq_len
        assert c.evicted_tokens() == m.evicted
        assert c.num_pages() == len(m.table)
        assert c.free_pages() == len(m.free)
        assert c.used_memory_bytes() == len(m.table) * self.cfg.bytes_per_page()

    @invariant()
    def pages_partition_the_pool(self):
        if not hasattr(self, "cache"):
            return
        held = self.cache.page_ids().tolist()
        free = self.cache.free_page_ids().tolist()
        assert len(set(held)) == len(held), f"page mapped twice: {held}"
        assert len(set(free)) == len(free), f"page freed twice: {free}"
        assert not set(held) & set(free)
        assert set(held) | set(free) == set(range(self.cfg.max_pages))
        # The exact physical ids follow the LIFO pool and front-page eviction of the reference design.
        assert held == self.model.table
        assert free == self.model.free


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
