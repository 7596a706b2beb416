"""batch_paged_attention at the engine model's shapes (8 query heads, 2 KV heads,
head_dim 64, page 16) against the float64 reference: the page walk's whole-page
fast path (visibility arrays kept across pages) meets partial last pages,
sliding windows (pages that turn partial again), causal diagonals, KV splits
and every dtype and SIMD level."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_attention import run_case  # noqa: E402

H, HKV, D, T = 8, 2, 64, 16


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("window_left", [-1, 0, 5, 16, 33])
def test_decode_every_length(dtype, window_left):
    # decode rows over 1..70 cached tokens: whole pages, a partial last page,
    # windows starting inside a page
    rng = np.random.default_rng(70 + (window_left + 1) * 7)
    kv = list(range(1, 71))
    run_case(rng, q_lens=[1] * len(kv), kv_lens=kv, H=H, Hkv=HKV, D=D, T=T, dtype=dtype,
             window_left=window_left)


@pytest.mark.parametrize("q_len", [2, 3, 4, 5, 17, 70])
@pytest.mark.parametrize("window_left", [-1, 7, 40])
@pytest.mark.parametrize("causal", [True, False])
def test_multi_row_and_prefill(q_len, window_left, causal):
    # q_len * G <= 16 stays a decode item (up to 4 rows); more is a packed
    # prefill item whose rows leave the whole-page path on the diagonal
    rng = np.random.default_rng(q_len * 31 + window_left + 2 * causal)
    run_case(rng, q_lens=[q_len, 1, q_len], kv_lens=[q_len + 37, 50, q_len], H=H, Hkv=HKV, D=D, T=T,
             causal=causal, window_left=window_left)


@pytest.mark.parametrize("chunk", [16, 32, 48])
@pytest.mark.parametrize("threads", [1, 2])
def test_splits(chunk, threads):
    # split items start at page boundaries inside the sequence (t0 > 0)
    rng = np.random.default_rng(chunk + threads)
    run_case(rng, q_lens=[1, 1, 3, 40], kv_lens=[130, 17, 99, 140], H=H, Hkv=HKV, D=D, T=T,
             kv_chunk=chunk, num_threads=threads, window_left=70)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_soft_cap_alibi_every_level(level):
    rng = np.random.default_rng(level)
    run_case(rng, q_lens=[1, 1, 20, 4], kv_lens=[33, 64, 90, 19], H=H, Hkv=HKV, D=D, T=T,
             soft_cap=5.0, alibi=True, max_simd=level)
    run_case(rng, q_lens=[1, 1, 20, 4], kv_lens=[33, 64, 90, 19], H=H, Hkv=HKV, D=D, T=T,
             window_left=9, max_simd=level)
