"""AttentionBatch: a ragged layout checked once, then run per layer, gives the bits of
batch_paged_attention and refuses what batch_paged_attention refuses."""
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedcy._libs._attention import AttentionBatch, batch_paged_attention

sys.path.insert(0, os.path.dirname(__file__))
from attn_helpers import make_batch, reference  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), B=st.integers(1, 5), Hkv=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 4]), D=st.sampled_from([32, 64, 80]),
       T=st.sampled_from([1, 8, 16]), dtype=st.sampled_from(["float32", "float16", "bfloat16", "int8"]),
       window=st.sampled_from([-1, 0, 7]), threads=st.integers(1, 3))
def test_run_equals_batch_paged_attention(seed, B, Hkv, group, D, T, dtype, window, threads):
    """Every layer of a pool through one batch: the same bits as batch_paged_attention with
    the arrays, and float64's result within float32 accuracy."""
    rng = np.random.default_rng(seed)
    kv_lens = rng.integers(1, 70, B).tolist()
    q_lens = [int(rng.integers(1, n + 1)) if rng.random() < 0.3 else 1 for n in kv_lens]
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=q_lens, kv_lens=kv_lens, num_heads=Hkv * group,
                                             num_kv_heads=Hkv, head_dim=D, page_size=T, dtype=dtype)
    batch = AttentionBatch(ind, bt, kl, page_size=T, max_pages=pages.shape[0])
    assert batch.total_q == q.shape[0] and batch.page_size == T
    for layer in range(pages.shape[1]):
        want = batch_paged_attention(q, ind, pages, layer, bt, kl, window_left=window,
                                     soft_cap=3.0, num_threads=threads)
        out = np.empty_like(want)
        got = batch.run(q, pages, layer, window_left=window, soft_cap=3.0, out=out, num_threads=threads)
        assert got is out and np.array_equal(got, want, equal_nan=True)
    ro, rl = reference(q, ind, K, V, window_left=window)
    o, lse = batch.run(q, pages, 1, window_left=window, return_lse=True, num_threads=threads)
    tol = 1e-3 if dtype in ("float16", "bfloat16") else 1e-5
    np.testing.assert_allclose(o, ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, rl, rtol=tol, atol=tol)


def _case(seed=3):
    rng = np.random.default_rng(seed)
    return make_batch(rng, q_lens=[1, 5], kv_lens=[20, 9], num_heads=4, num_kv_heads=2,
                      head_dim=32, page_size=8)


def test_the_batch_keeps_its_own_copy():
    """Changing the caller's arrays after the check changes nothing the batch reads (a page
    id written later could point outside the pool)."""
    q, ind, pages, bt, kl, _, _ = _case()
    batch = AttentionBatch(ind, bt, kl, page_size=8, max_pages=pages.shape[0])
    want = batch.run(q, pages, 1)
    bt[:] = 10**6
    kl[:] = 10**6
    ind[-1] = 0
    assert np.array_equal(batch.run(q, pages, 1), want, equal_nan=True)


def test_layouts_refused_as_batch_paged_attention_refuses_them():
    q, ind, pages, bt, kl, _, _ = _case()
    P = pages.shape[0]
    bad = [
        (dict(qo_indptr=[1, 2, 6]), ValueError, "start at 0"),
        (dict(qo_indptr=[0, 4, 2]), ValueError, "non-decreasing"),
        (dict(qo_indptr=[0, 6]), ValueError, "length B\\+1"),
        (dict(qo_indptr=np.array([], np.int64)), ValueError, "B\\+1 >= 1"),
        (dict(kv_lens=[20, -1]), ValueError, "kv_lens must be >= 0"),
        (dict(kv_lens=[20, 4]), ValueError, "q_len 5 > kv_len 4"),
        (dict(kv_lens=[20, 10**6]), ValueError, "exceeds block_tables capacity"),
        (dict(block_tables=np.full_like(bt, P)), IndexError, "outside"),
        (dict(block_tables=bt[:1]), ValueError, "one per sequence"),
        (dict(qo_indptr=np.array([0.0, 1, 6])), TypeError, "integer"),
        (dict(page_size=0), ValueError, "page_size"),
        (dict(max_pages=-1), ValueError, "max_pages"),
    ]
    base = dict(qo_indptr=ind, block_tables=bt, kv_lens=kl, page_size=8, max_pages=P)
    for change, exc, match in bad:
        args = dict(base, **change)
        with pytest.raises(exc, match=match):
            AttentionBatch(args.pop("qo_indptr"), args.pop("block_tables"), args.pop("kv_lens"), **args)


def test_run_refuses_pages_and_queries_of_another_layout():
    """The pool must have the batch's page size and at least its pages; the query its rows.
    Each failure is a ValueError and the batch keeps working."""
    q, ind, pages, bt, kl, _, _ = _case()
    batch = AttentionBatch(ind, bt, kl, page_size=8, max_pages=pages.shape[0])
    want = batch.run(q, pages, 1)
    with pytest.raises(ValueError, match="pages of 8 tokens"):
        batch.run(q, pages.reshape(pages.shape[:3] + (4, 2) + pages.shape[4:])[:, :, :, :, 0], 1)
    with pytest.raises(ValueError, match="pool"):
        batch.run(q, pages[:-4], 1)
    with pytest.raises(ValueError, match="query has 5 rows"):
        batch.run(q[:5], pages, 1)
    with pytest.raises(IndexError):
        batch.run(q, pages, 2)
    with pytest.raises(TypeError):
        batch.run(q, pages.tolist(), 1)
    assert np.array_equal(batch.run(q, pages, 1), want, equal_nan=True)


def test_what_the_batch_exposes_cannot_change_what_it_reads():
    """The layout attributes are copies: writing into them (page ids outside the pool) does
    not reach the kernel."""
    q, ind, pages, bt, kl, _, _ = _case()
    batch = AttentionBatch(ind, bt, kl, page_size=8, max_pages=pages.shape[0])
    want = batch.run(q, pages, 1)
    assert np.array_equal(batch.block_tables[:, :1], bt[:, :1].astype(np.int32))
    assert np.array_equal(batch.qo_indptr, ind) and np.array_equal(batch.kv_lens, kl)
    batch.block_tables[:] = 10**6
    batch.kv_lens[:] = 10**6
    assert np.array_equal(batch.run(q, pages, 1), want, equal_nan=True)
