"""PagedAttentionExecutor: its numbers (batch 1) against an independent float64
re-implementation of its math, batching, prefix-cached prefill, status/info records."""
import dataclasses
import json
import math
import warnings

import numpy as np
import pytest

from pagedcy import PagedKVCacheConfig, PoolExhaustedError
from pagedcy.kvcache.executor import (DecodeOutput, ExecutorCapabilities, ExecutorStatus, ModelInfo,
                                      PagedAttentionExecutor, PagedExecutorConfig, PrefillOutput,
                                      token_embeddings)
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager


# ---- independent reference of the executor's math (plain loops / float64) ----------------
def ref_embedding(token, kv_size):
    # sin of ((token + 1) * (i + 1)) with the product rounded to float32.
    return np.array([math.sin(float(np.float32(token + 1.0) * np.float32(i + 1.0)))
                     for i in range(kv_size)])


def ref_query(emb, num_heads, num_kv_heads, head_dim):
    q = []
    for kv_h in range(num_kv_heads):
        for _ in range(num_heads // num_kv_heads):
            q.extend(emb[kv_h * head_dim:(kv_h + 1) * head_dim])
    return np.array(q).reshape(num_heads, head_dim)


def ref_attention(qs, ks, vs, num_heads, num_kv_heads, head_dim):
    """qs [q, H, D], ks/vs [kv, KVH, D]; causal, bottom-right aligned."""
    nq, nkv = len(qs), len(ks)
    out = np.zeros((nq, num_heads, head_dim))
    rep = num_heads // num_kv_heads
    for i in range(nq):
        last = nkv - nq + i
        for h in range(num_heads):
            kh = h // rep
            s = np.array([qs[i, h] @ ks[j, kh] for j in range(last + 1)]) / math.sqrt(head_dim)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[i, h] = sum(p[j] * vs[j, kh] for j in range(last + 1))
    return out


def ref_logits(attn_row, vocab):
    lg = np.zeros(vocab)
    for i, val in enumerate(attn_row.reshape(-1)):
        lg[i % vocab] += val
    return lg


def ref_run(cfg, prompt, decode_tokens):
    """Logits of a reference prefill of ``prompt`` then decodes, all float64."""
    kvs = cfg.num_kv_heads * cfg.head_dim
    embs = [ref_embedding(t, kvs) for t in prompt]
    kv = np.array(embs).reshape(len(prompt), cfg.num_kv_heads, cfg.head_dim)
    qs = np.array([ref_query(e, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) for e in embs])
    out = ref_attention(qs, kv, kv, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    pre = np.array([ref_logits(o, cfg.vocab_size) for o in out])
    dec = []
    for t in decode_tokens:
        e = ref_embedding(t, kvs)
        embs.append(e)
        kv = np.array(embs).reshape(len(embs), cfg.num_kv_heads, cfg.head_dim)
        q = ref_query(e, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)[None]
        o = ref_attention(q, kv, kv, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        dec.append(ref_logits(o[0], cfg.vocab_size))
    return pre, np.array(dec)


def make(cfg=None, page_size=4, max_pages=64, **mgr_kw):
    cfg = cfg or PagedExecutorConfig()
    m = PagedKVCacheManager(PagedKVCacheConfig(page_size, max_pages, cfg.num_layers,
                                               cfg.num_kv_heads, cfg.head_dim), **mgr_kw)
    return PagedAttentionExecutor(cfg, m), m


# ---- tests ----------------------------------------------------------------------------
def test_embedding_matches_f32_product_formula():
    with pytest.raises(TypeError):
        token_embeddings([1.5], 32)
    e = token_embeddings([0, 7, 41], 32)
    for row, t in zip(e, [0, 7, 41]):
        np.testing.assert_allclose(row, ref_embedding(t, 32), rtol=0, atol=1e-7)
    assert e.dtype == np.float32


@pytest.mark.parametrize("cfg", [PagedExecutorConfig(),
                                 PagedExecutorConfig(vocab_size=50, num_layers=3, num_heads=8,
                                                     num_kv_heads=2, head_dim=8)])
def test_batch1_matches_float64_reference(cfg):
    ex, m = make(cfg)
    prompt = [5, 17, 3, 99, 250, 1, 0]
    dec_tokens = [42, 7, 7, 200, 13]          # crosses page boundaries (page_size 4)
    ref_pre, ref_dec = ref_run(cfg, prompt, dec_tokens)
    out = ex.prefill(np.array([prompt], dtype=np.int64))
    assert isinstance(out, PrefillOutput)
    assert out.logits.shape == (1, len(prompt), cfg.vocab_size) and out.logits.dtype == np.float32
    np.testing.assert_allclose(out.logits[0], ref_pre, atol=1e-5, rtol=1e-5)
    h = out.kv_cache
    assert h.num_tokens() == len(prompt)
    for i, t in enumerate(dec_tokens):
        d = ex.decode(np.array([t]), [h])
        assert isinstance(d, DecodeOutput) and d.logits.shape == (1, cfg.vocab_size)
        np.testing.assert_allclose(d.logits[0], ref_dec[i], atol=1e-5, rtol=1e-5)
    assert h.num_tokens() == len(prompt) + len(dec_tokens)
    # K/V of every layer hold the embeddings.
    for layer in range(cfg.num_layers):
        k, v = m.read_kv(h, layer, 0, h.num_tokens())
        e = token_embeddings(prompt + dec_tokens, cfg.num_kv_heads * cfg.head_dim)
        np.testing.assert_array_equal(k.reshape(len(e), -1), e)
        np.testing.assert_array_equal(v.reshape(len(e), -1), e)


def test_rows_are_independent_sequences_and_decode_is_batched():
    ex, m = make(PagedExecutorConfig(num_heads=4, num_kv_heads=2))
    prompts = np.array([[1, 2, 3, 4, 5], [9, 9, 8, 7, 1], [0, 0, 0, 0, 0]])
    out = ex.prefill(prompts)
    hs = out.kv_cache
    assert len(hs) == 3 and len({h.request_id for h in hs}) == 3
    # Each row equals a batch-1 run of its own prompt.
    ex1, _ = make(PagedExecutorConfig(num_heads=4, num_kv_heads=2))
    singles = [ex1.prefill(p[None]) for p in prompts]
    for b in range(3):
        np.testing.assert_allclose(out.logits[b], singles[b].logits[0], atol=1e-6)
    calls = []
    orig = m.attention
    m.attention = lambda *a, **k: calls.append(1) or orig(*a, **k)
    d = ex.decode(np.array([[3], [4], [5]]), hs)
    assert len(calls) == 1 and d.logits.shape == (3, 256)
    for b, t in enumerate([3, 4, 5]):
        s = ex1.decode([t], [singles[b].kv_cache])
        np.testing.assert_allclose(d.logits[b], s.logits[0], atol=1e-6)


def test_ragged_batch_decode_different_lengths():
    cfg = PagedExecutorConfig(num_layers=1)
    ex, m = make(cfg)
    hs = [ex.prefill(np.arange(n) % 50).kv_cache for n in (1, 4, 9, 13)]
    d = ex.decode(np.array([5, 6, 7, 8]), hs)
    for b, n in enumerate((1, 4, 9, 13)):
        _, ref_dec = ref_run(cfg, list(np.arange(n) % 50), [5 + b])
        np.testing.assert_allclose(d.logits[b], ref_dec[0], atol=1e-5)
    assert [h.num_tokens() for h in hs] == [2, 5, 10, 14]


def test_prefill_with_prefix_cache_computes_only_suffix_same_logits():
    ex, m = make(enable_prefix_cache=True)
    prompt = np.arange(11) + 3
    first = ex.prefill(prompt)
    h2 = m.allocate(AllocationRequest(prompt_tokens=prompt))
    assert h2.num_cached_tokens() == 8
    writes = []
    orig = m.write_kv_tokens
    m.write_kv_tokens = lambda h, layer, start, k, v: writes.append((start, len(k))) or orig(h, layer, start, k, v)
    second = ex.prefill(prompt[None], [h2])
    assert writes and all(w == (8, 3) for w in writes)
    np.testing.assert_allclose(second.logits, first.logits, atol=1e-6)
    # Shared pages are the same physical pages.
    assert list(h2.block_table()[:2]) == list(first.kv_cache.block_table()[:2])
    # A mismatching prompt on a prefix-cached handle is refused.
    h3 = m.allocate(AllocationRequest(prompt_tokens=prompt))
    with pytest.raises(ValueError):
        ex.prefill((prompt + 1)[None], [h3])


def test_decode_allocates_blocks_and_fails_cleanly_when_full():
    ex, m = make(page_size=2, max_pages=3)
    h = ex.prefill([1, 2, 3, 4]).kv_cache
    assert h.num_blocks() == 2
    ex.decode([5], [h])
    assert h.num_blocks() == 3
    ex.decode([6], [h])
    with pytest.raises(PoolExhaustedError):
        ex.decode([7], [h])
    assert h.num_tokens() == 6 and h.num_blocks() == 3
    m.check_invariants()


def test_bad_inputs():
    ex, m = make()
    with pytest.raises(ValueError):
        ex.prefill(np.zeros((1, 0), dtype=np.int64))
    with pytest.raises(TypeError):
        ex.prefill(np.array([1.5, 2.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no ComplexWarning from a silent cast first
        for bad in (np.zeros(0, complex), np.zeros(0, bool), np.array([], dtype=object)):
            with pytest.raises(TypeError):
                ex.decode(bad, [])
            with pytest.raises(TypeError):
                ex.prefill(bad)
    with pytest.raises(ValueError):
        ex.prefill([-1, 2])
    with pytest.raises(ValueError):
        ex.prefill(np.zeros(600, dtype=np.int64))       # > max_sequence_length 512
    h = ex.prefill([1, 2, 3]).kv_cache
    with pytest.raises(ValueError):
        ex.decode([1, 2], [h])                           # 2 rows, 1 handle
    with pytest.raises(ValueError):
        ex.decode([1, 2], [h, h])
    with pytest.raises(ValueError):
        ex.prefill([1, 2], [h])                           # handle already holds 3 tokens
    with pytest.raises(ValueError):
        PagedExecutorConfig(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError):
        PagedAttentionExecutor(PagedExecutorConfig(head_dim=16), m)
    assert h.num_tokens() == 3
    m.check_invariants()


def test_info_capabilities_status():
    ex, m = make()
    st = ex.status()
    assert isinstance(st, ExecutorStatus)
    assert st.prefill_operations == 0 and st.avg_decode_time_ms == 0.0
    assert st.last_operation is None
    h = ex.prefill([1, 2, 3, 4, 5]).kv_cache
    ex.decode([1], h)
    st = ex.status()
    assert st.prefill_operations == 1 and st.decode_operations == 1
    assert st.avg_prefill_time_ms > 0 and st.avg_decode_time_ms > 0
    assert st.last_operation == "decode" and st.current_batch_size == 1
    mu = st.memory_usage
    bpp = m.config.bytes_per_page()
    assert mu.used_bytes == 2 * bpp and mu.allocated_bytes == 64 * bpp
    assert mu.peak_bytes >= mu.used_bytes
    assert abs(mu.utilization_percent - 100 * 2 / 64) < 1e-9
    info = ex.info()
    assert isinstance(info, ModelInfo) and info.model_id == "paged-test-model"
    assert info.hidden_size == ex.config.num_heads * ex.config.head_dim
    caps = ex.capabilities()
    assert isinstance(caps, ExecutorCapabilities) and caps.supports_continuous_batching
    assert caps.supports_prefix_caching == m.prefix_cache_enabled
    # real bytes: 4 kv heads * 8 dims * (K, V) * 2 layers * 4 bytes
    assert caps.memory_requirements.kv_cache_memory_per_token == 4 * 8 * 2 * 2 * 4
    # records are frozen and turn into plain dicts for JSON
    for rec in (st, info, caps):
        with pytest.raises(dataclasses.FrozenInstanceError):
            rec.version = "x"
    assert dataclasses.asdict(st)["memory_usage"]["used_bytes"] == 2 * bpp
    json.dumps(dataclasses.asdict(caps))
    assert ex.prefill_count() == 1 and ex.decode_count() == 1
