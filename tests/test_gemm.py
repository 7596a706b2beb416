"""pagedcy._libs._gemm (the projection kernel) against a float64 NumPy reference."""
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcy._libs import _gemm, _team
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


# -- weight row formats and the packed path ---------------------------------------------------

FMTS = ["f32", "f16", "bf16"]


def _stored(w, fmt):
    """(raw weight in format fmt, the float32 weight it widens to)."""
    if fmt == "f32":
        return w, w
    if fmt == "f16":
        raw = w.astype(np.float16)
        return raw, raw.astype(np.float32)
    raw = (w.view(np.uint32) >> 16).astype(np.uint16)         # any 16 bits are a bfloat16
    return raw, (raw.astype(np.uint32) << 16).view(np.float32)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 130), k=st.integers(1, 1300), n=st.integers(1, 150),
       threads=st.integers(1, 3), level=st.sampled_from(LEVELS), fmt=st.sampled_from(FMTS),
       seed=st.integers(0, 2**16))
def test_formats_match_float32_on_the_widened_weight(m, k, n, threads, level, fmt, seed):
    """Both paths (streaming below 48 rows, packed from 48), every level and format: the
    result is the float32 kernel's on the widened weight, bit for bit, and near float64."""
    x, w, out = _case(np.random.default_rng(seed), m, k, n)
    raw, wide = _stored(w, fmt)
    assert _gemm._linear_rows_tuned(x, raw, fmt, out, threads, level) is out
    ref = np.empty_like(out)
    _linear_kernel_tuned(x, wide, ref, 1, level)
    assert np.array_equal(out, ref)
    _check(out, x, wide)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", FMTS)
def test_a_row_does_not_depend_on_the_path(level, fmt):
    """Row i of a batch of M rows equals row i computed alone, bit for bit, for M on both
    sides of the streaming/packed threshold and of the packed tiles (6 x 16, 12 x 32), K over
    three K blocks (512 each) and N over several weight panels, on 1 and 2 threads."""
    rng = np.random.default_rng(5)
    x, w, _ = _case(rng, 200, 1100, 70)
    raw, _ = _stored(w, fmt)
    alone = np.empty((200, 70), np.float32)
    for i in range(200):
        _gemm._linear_rows_tuned(x[i:i + 1], raw, fmt, alone[i:i + 1], 1, level)
    for m in (1, 8, 33, 47, 48, 64, 77, 200):
        for threads in (1, 2):
            out = np.empty((m, 70), np.float32)
            _gemm._linear_rows_tuned(x[:m], raw, fmt, out, threads, level)
            assert np.array_equal(out, alone[:m]), (m, threads)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", ["f32", "bf16", "q8_0", "q4_k"])
def test_rows_of_x_split_across_threads_give_the_same_bits(level, fmt):
    """With more rows of x than of W the threads split x, not W (each packs only its rows):
    every thread count gives the one-thread bits, on both sides of the split's minimum and
    with ranges that end inside a micro-tile, and the float64 result."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(17)
    for m, n, k in ((191, 40, 512), (192, 40, 512), (401, 70, 1280), (1000, 12, 256)):
        x, w, _ = _case(rng, m, k, n)
        if fmt in ("f32", "bf16"):
            raw, wide = _stored(w, fmt)
        elif fmt == "q8_0":
            raw = quantize(w, QT.Q8_0)
            wide = dequantize(raw, QT.Q8_0).astype(np.float32)
        else:                    # gguf cannot quantize Q4_K: random blocks, scales set
            raw = rng.integers(0, 256, (n, k // 256 * 144), dtype=np.uint8)
            blocks = raw.reshape(n, k // 256, 144)
            blocks[:, :, 0:4] = np.array([0.02, 0.01], np.float16).view(np.uint8)
            wide = dequantize(raw, QT.Q4_K).astype(np.float32)
        one = np.empty((m, n), np.float32)
        _gemm._linear_rows_tuned(x, raw, fmt, one, 1, level)
        for threads in (2, 3):
            out = np.empty((m, n), np.float32)
            _gemm._linear_rows_tuned(x, raw, fmt, out, threads, level)
            assert np.array_equal(out, one), (m, n, k, threads)
        _check(one, x, wide)


PACK_LEVELS = [lv for lv in LEVELS if lv > 0]


@pytest.mark.skipif(not PACK_LEVELS, reason="the packed path needs AVX2")
@settings(max_examples=40, deadline=None)
@given(m=st.integers(48, 400), k=st.integers(1, 1600), n=st.integers(1, 200), threads=st.integers(2, 3),
       level=st.sampled_from(PACK_LEVELS or [1]), fmt=st.sampled_from(FMTS), seed=st.integers(0, 2**16))
def test_packed_sizes_on_threads_give_the_one_thread_bits(m, k, n, threads, level, fmt, seed):
    """Packed sizes on several threads (x or W split between them, K over several blocks of
    512, shares that end inside a tile): the one-thread bits, in a region of the call's own
    and on a step's team."""
    x, w, out = _case(np.random.default_rng(seed), m, k, n)
    raw, wide = _stored(w, fmt)
    one = np.empty_like(out)
    _gemm._linear_rows_tuned(x, raw, fmt, one, 1, level)
    _gemm._linear_rows_tuned(x, raw, fmt, out, threads, level)
    assert np.array_equal(out, one)
    out[...] = np.nan
    _team.run_in_team(lambda: _gemm._linear_rows_tuned(x, raw, fmt, out, threads, level), threads)
    assert np.array_equal(out, one)
    _check(one, x, wide)


@pytest.mark.skipif(not PACK_LEVELS, reason="the packed path needs AVX2")
@pytest.mark.parametrize("level", PACK_LEVELS)
def test_packed_path_over_several_blocks_of_x(level):
    """More rows than one packed block of x holds (4 MiB: 2048 rows at K 512), over three K
    blocks, on 2 threads; and a call nested in a team of fewer threads than it asks for:
    the one-thread bits."""
    rng = np.random.default_rng(23)
    x, w, out = _case(rng, 2100, 1100, 90)
    one = np.empty_like(out)
    _linear_kernel_tuned(x, w, one, 1, level)
    _linear_kernel_tuned(x, w, out, 2, level)
    assert np.array_equal(out, one)
    out[...] = np.nan
    _team.run_in_team(lambda: _linear_kernel_tuned(x[:300], w, out[:300], 3, level), 2)
    assert np.array_equal(out[:300], one[:300])
    _check(one, x, w)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [2, 64])
def test_special_values_propagate_on_both_paths(level, m):
    x = np.ones((m, 600), np.float32)
    w = np.ones((70, 600), np.float32)
    x[1, 100] = np.inf
    w[5, 550] = np.nan
    out = np.empty((m, 70), np.float32)
    _linear_kernel_tuned(x, w, out, 2, level)
    assert np.isnan(out[:, 5]).all()
    assert np.isposinf(np.delete(out[1], 5)).all()
    rest = np.delete(np.delete(out, 1, axis=0), 5, axis=1)
    assert np.array_equal(rest, np.full_like(rest, 600))


def test_half_weights_keep_inf_and_nan():
    """f16 and bf16 weights with infinities, NaN and subnormals widen exactly."""
    x = np.random.default_rng(1).standard_normal((50, 40), dtype=np.float32)
    w16 = np.random.default_rng(2).standard_normal((9, 40)).astype(np.float16)
    w16[0, 3], w16[1, 7], w16[2, 0], w16[3, 39] = np.inf, -np.inf, np.nan, np.float16(3e-7)
    for fmt, raw in (("f16", w16), ("f16", w16.view(np.uint16)),
                     ("bf16", (w16.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))):
        _, wide = _stored(w16.astype(np.float32), fmt) if fmt == "bf16" else (raw, w16.astype(np.float32))
        for m in (1, 50):
            out, ref = np.empty((m, 9), np.float32), np.empty((m, 9), np.float32)
            _gemm.linear_rows(x[:m], raw, fmt, out)
            linear_kernel(x[:m], wide, ref)
            np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("cap", ["scalar", "avx2"])
def test_widening_at_every_level(cap):
    """The f16/bf16 decoders follow PAGEDCY_SIMD: each capped level widens exactly."""
    import os
    import subprocess
    import sys
    code = ("import numpy as np; from pagedcy._libs import _gemm\n"
            "r = np.random.default_rng(0); x = r.standard_normal((60, 530), dtype=np.float32)\n"
            "w = r.standard_normal((33, 530), dtype=np.float32)\n"
            "h = w.astype(np.float16); b = (w.view(np.uint32) >> 16).astype(np.uint16)\n"
            "for raw, wide, f in ((h, h.astype(np.float32), 'f16'),"
            " (b, (b.astype(np.uint32) << 16).view(np.float32), 'bf16')):\n"
            "    for m in (1, 60):\n"
            "        o = np.empty((m, 33), np.float32); e = np.empty_like(o)\n"
            "        _gemm._linear_rows_tuned(x[:m], raw, f, o); _gemm._linear_kernel_tuned(x[:m], wide, e)\n"
            "        assert np.array_equal(o, e), (f, m)\n")
    env = dict(os.environ, PAGEDCY_SIMD=cap)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_linear_rows_bad_input():
    x, w, out = _case(np.random.default_rng(0), 2, 8, 4)
    h = w.astype(np.float16)
    with pytest.raises(TypeError):
        _gemm.linear_rows(x, w, "f16", out)                  # float32 is not an f16 weight
    with pytest.raises(TypeError):
        _gemm.linear_rows(x, h, "bf16", out)                 # bf16 takes uint16 bits
    with pytest.raises(TypeError):
        _gemm.linear_rows(x, h, 16, out)
    with pytest.raises(ValueError):
        _gemm.linear_rows(x, h, "q4", out)
    with pytest.raises(ValueError):
        _gemm.linear_rows(x, h[:, :7].copy(), "f16", out)
    with pytest.raises(ValueError):
        _gemm.linear_rows(x, h[:, ::2], "f16", np.empty((2, 4), np.float32)[:, :])
    with pytest.raises(TypeError):
        _gemm.linear_rows(x, h.tolist(), "f16", out)
    with pytest.raises(TypeError):
        _gemm.linear_rows(x, h.astype(">f2"), "f16", out)
    _gemm.linear_rows(x, h, "f16", out)                      # still works afterwards
    _check(out, x, h.astype(np.float32))


@contextlib.contextmanager
def split_threads(chunks):
    """Every call with threads > 1 splits (PARALLEL_WEIGHT_BYTES off) in fixed shares
    (chunks None) or, where a kernel takes them (the panel GEMVs at decode sizes), in
    ``chunks`` chunks a thread claimed in turn."""
    prev, size = _team._set_dynamic(2**62 if chunks is None else 0, chunks or 1), _gemm.PARALLEL_WEIGHT_BYTES
    _gemm.PARALLEL_WEIGHT_BYTES = 0
    try:
        yield
    finally:
        _gemm.PARALLEL_WEIGHT_BYTES = size
        _team._set_dynamic(*prev)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 60), k=st.integers(1, 300), n=st.integers(1, 1100), threads=st.integers(2, 3),
       level=st.sampled_from(LEVELS), fmt=st.sampled_from(FMTS), seed=st.integers(0, 2**16))
def test_w_split_between_threads_gives_the_one_thread_bits(m, k, n, threads, level, fmt, seed):
    """W's row blocks shared out between threads even below PARALLEL_WEIGHT_BYTES: the
    one-thread result, bit for bit (the dense GEMV keeps fixed shares: see _team.pyx)."""
    x, w, out = _case(np.random.default_rng(seed), m, k, n)
    raw, _ = _stored(w, fmt)
    one = np.empty_like(out)
    _gemm._linear_rows_tuned(x, raw, fmt, one, 1, level)
    with split_threads(None):
        _gemm._linear_rows_tuned(x, raw, fmt, out, threads, level)
    assert np.array_equal(out, one)


def test_dynamic_split_settings_are_checked():
    with pytest.raises(ValueError):
        _team._set_dynamic(-1, 4)
    with pytest.raises(ValueError):
        _team._set_dynamic(0, 0)
    prev = _team._set_dynamic(123, 5)
    assert _team._set_dynamic(*prev) == (123, 5)
