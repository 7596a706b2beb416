"""pagedcy._libs._gemm (the projection kernel) against a float64 NumPy reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcy._libs import _gemm
from pagedcy._libs._attention import simd_level
from pagedcy._libs._gemm import _linear_kernel_tuned, linear, linear_kernel

# every instruction set this machine runs, scalar included
LEVELS = [lv for lv in (2, 1, 0) if lv <= simd_level()]


def _case(rng, m, k, n):
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    return x, w, np.full((m, n), np.nan, np.float32)


def _check(out, x, w):
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    # float32 sums of k terms of size ~1: error grows like sqrt(k) ulps of the row norm
    tol = 1e-6 * np.sqrt(x.shape[1] + 1) * (np.abs(x).max(initial=1) * np.abs(w).max(initial=1)) * 8
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(1, 512, 768), (2, 64, 8), (3, 17, 9), (4, 16, 6), (5, 100, 33),
                                   (16, 1408, 512), (13, 1030, 2817), (64, 512, 130), (70, 7, 1),
                                   (1, 1, 1), (9, 15, 49)])
def test_matches_float64_reference(level, threads, m, k, n):
    rng = np.random.default_rng(m * 1000 + k + n)
    x, w, out = _case(rng, m, k, n)
    assert _linear_kernel_tuned(x, w, out, threads, level) is out
    _check(out, x, w)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 300), n=st.integers(1, 300),
       threads=st.integers(1, 3), level=st.sampled_from(LEVELS), seed=st.integers(0, 2**16))
def test_random_shapes(m, k, n, threads, level, seed):
    x, w, out = _case(np.random.default_rng(seed), m, k, n)
    _linear_kernel_tuned(x, w, out, threads, level)
    _check(out, x, w)


@pytest.mark.parametrize("level", LEVELS)
def test_a_row_does_not_depend_on_the_batch(level):
    """Each output is one dot product summed in an order fixed by K and the instruction set:
    a row comes out bit for bit the same alone, in any batch size, on any thread count (what
    makes a decode step's tokens independent of what else is batched with them)."""
    rng = np.random.default_rng(7)
    x, w, _ = _case(rng, 37, 700, 300)
    alone = np.empty((1, 300), np.float32)
    for m in (1, 2, 3, 4, 5, 8, 13, 37):
        for threads in (1, 2):
            out = np.empty((m, 300), np.float32)
            _linear_kernel_tuned(x[:m], w, out, threads, level)
            for i in range(m):
                _linear_kernel_tuned(x[i:i + 1], w, alone, 1, level)
                assert np.array_equal(out[i], alone[0]), (m, threads, i)


def test_linear_agrees_for_decode_and_prefill_sizes():
    rng = np.random.default_rng(3)
    for m in (1, 64, 65, 300, 1100):
        x, w, out = _case(rng, m, 96, 40)
        assert linear(x, w, out) is out
        _check(out, x, w)


def test_special_values_propagate():
    x = np.ones((2, 20), np.float32)
    w = np.ones((3, 20), np.float32)
    x[0, 5] = np.inf
    w[2, 19] = np.nan
    out = np.empty((2, 3), np.float32)
    linear_kernel(x, w, out)
    assert np.isinf(out[0, 0]) and np.isnan(out[0, 2]) and np.isnan(out[1, 2])
    assert np.array_equal(out[1, :2], [20, 20])


def test_empty_dimensions():
    out = np.full((0, 4), 1, np.float32)
    linear_kernel(np.empty((0, 3), np.float32), np.ones((4, 3), np.float32), out)
    out = np.full((2, 4), 5, np.float32)
    linear_kernel(np.empty((2, 0), np.float32), np.ones((4, 0), np.float32), out)
    assert np.array_equal(out, np.zeros((2, 4)))


@pytest.mark.parametrize("fn", [linear, linear_kernel])
def test_bad_input(fn):
    x, w, out = _case(np.random.default_rng(0), 2, 8, 4)
    with pytest.raises(TypeError):
        fn(x.tolist(), w, out)
    with pytest.raises(TypeError):
        fn(x.astype(np.float64), w, out)
    with pytest.raises(ValueError):
        fn(x, w[:, :7].copy(), out)                 # inner dimensions differ
    with pytest.raises(ValueError):
        fn(x, w, np.empty((2, 5), np.float32))      # wrong output shape
    with pytest.raises(ValueError):
        fn(np.asfortranarray(np.ones((2, 8), np.float32)), w, out)
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        fn(x, w, ro)
    buf = np.zeros(16, np.float32)
    with pytest.raises(ValueError):                 # out overlaps x
        fn(buf.reshape(2, 8), w, buf[8:].reshape(2, 4))
    with pytest.raises(ValueError):                 # non-contiguous out
        fn(x, w, np.empty((2, 8), np.float32)[:, ::2])
    with pytest.raises(TypeError):
        fn(x, w, out, num_threads="2")
    with pytest.raises(ValueError):
        fn(x, w, out, num_threads=0)
    fn(x, w, out)                                   # still works afterwards
    _check(out, x, w)


def test_module_constants():
    assert _gemm.PARALLEL_WEIGHT_BYTES >= 1 and _gemm.PARALLEL_MACS >= 1


@pytest.mark.parametrize("level", LEVELS)
def test_many_rows_cross_the_row_chunks(level):
    """Prefill-sized batches go through the kernel in chunks of rows (pagedcy_gemm.h): rows on
    both sides of every chunk boundary, at K that gives several chunk sizes."""
    rng = np.random.default_rng(11)
    for m, k, n in ((700, 512, 70), (333, 1408, 20), (9000, 8, 12)):
        x, w, out = _case(rng, m, k, n)
        _linear_kernel_tuned(x, w, out, 2, level)
        _check(out, x, w)
