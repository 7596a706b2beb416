"""The int8-activation GEMM (``_gemm.linear_rows_q8``, pagedcy_gemm_q8a.h) on Q4_K, Q6_K and
Q8_0 weights: the activation quantizer against a NumPy model of its definition (bit for
bit), every path (packed tile, MR tails, threads, SIMD levels) against the plain C path (bit for
bit), and the result against float64 on gguf's dequantization and the unquantized x within
the bound the definition gives."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from pagedcy._libs import _gemm  # noqa: E402
from pagedcy._libs._attention import simd_level  # noqa: E402
from pagedcy._libs._quant import dequantize  # noqa: E402

from test_quant import EXTREME_SCALES, _bits, _random_raw  # noqa: E402

LEVELS = [lv for lv in (2, 1, 0) if lv <= simd_level()]
QTYPES = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0,
          "q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K}
F32_EPS = 2.0 ** -24


def _quantize_model(x):
    """pagedcy_gemm_q8a.h's activation quantization in NumPy float32."""
    g = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(g).max(axis=2)
    with np.errstate(divide="ignore", over="ignore"):
        ids = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    v = np.clip((g * ids[:, :, None]).astype(np.float32), -127, 127)
    qa = np.rint(v).astype(np.int8)
    s16 = qa.reshape(x.shape[0], -1, 16).astype(np.int32).sum(axis=2)
    return qa.reshape(x.shape), (amax / np.float32(127)).astype(np.float32), s16


def _linear(x, raw, fmt, out, threads, level):
    return _gemm._linear_rows_q8_tuned(x, raw, fmt, out, threads, level)


def _bound(x, w):
    """Per-output bound of |int8 path - x @ w.T| (float64): each activation moves by at most
    amax / 254, plus float32 rounding of the scales, products and the chain."""
    m, k = x.shape
    amax = np.abs(x.reshape(m, -1, 32)).max(axis=2).astype(np.float64)
    aw = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1, 32).sum(axis=2)     # [n, G]
    quant = (amax / 254.0) @ aw.T
    mag = (np.abs(x.astype(np.float64)) + np.repeat(amax / 254.0, 32, axis=1)) @ np.abs(w.astype(np.float64)).T
    groups = k // 16
    return quant * (1 + 1e-6) + (groups + 4) * 2 * F32_EPS * mag


def _weights(rng, fmt, n, k, scales=None):
    raw = _random_raw(rng, QTYPES[fmt], n, k, scales=scales, moderate=True).reshape(n, -1)
    return raw, dequantize(raw, QTYPES[fmt], (n, k))


@pytest.mark.parametrize("level", LEVELS)
def test_activation_quantization_is_its_definition(level):
    rng = np.random.default_rng(level)
    x = rng.standard_normal((7, 320), dtype=np.float32) * rng.choice([1e-3, 1, 1e4], (7, 1)).astype(np.float32)
    x[1, 32:64] = 0                       # amax 0: qa 0, da 0
    x[2, :32] = np.float32(1e-40)         # subnormal group
    x[3, 5] = -x[3, 5] * 1000             # one outlier
    qa, da, s16 = _gemm._quantize_activations(x, level)
    want = _quantize_model(x)
    np.testing.assert_array_equal(qa, want[0])
    np.testing.assert_array_equal(_bits(da), _bits(want[1]))
    np.testing.assert_array_equal(s16, want[2])
    assert np.abs(qa).max() <= 127


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 9), kb=st.integers(1, 4), n=st.integers(1, 70), fmt=st.sampled_from(sorted(QTYPES)),
       level=st.sampled_from(LEVELS), threads=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_matches_float64_within_the_stated_bound(m, kb, n, fmt, level, threads, seed):
    rng = np.random.default_rng(seed)
    k = 256 * kb + (32 * rng.integers(0, 8) if not fmt.endswith("_k") else 0)
    raw, w = _weights(rng, fmt, n, k)
    x = rng.standard_normal((m, k), dtype=np.float32)
    out = np.full((m, n), np.nan, np.float32)
    assert _linear(x, raw, fmt, out, threads, level) is out
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    err = np.abs(out - ref)
    bound = _bound(x, w)
    assert np.all(err <= bound), float((err / bound).max())
    # and the bound is tight enough to catch a wrong kernel: about 1% of sum |x| |w|
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    assert np.all(bound <= 0.03 * mag + 1e-30)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", sorted(QTYPES))
def test_every_path_gives_the_plain_c_bits(fmt, level):
    """One row alone, inside batches of every size (the tile's MR tails), over partial panels
    and row tails (n = 1030), on 1 and 2 threads, at this SIMD level: the same bits as the
    scalar C path computes the definition. 32-element blocks get an odd count.
    (tests/test_q8panel.py holds the panel weights' decode kernels to the same bits.)"""
    rng = np.random.default_rng(5)
    n, k = 1030, 1536 if fmt.endswith("_k") else 1568
    raw, _ = _weights(rng, fmt, n, k)
    x = rng.standard_normal((13, k), dtype=np.float32)
    ref = np.empty((13, n), np.float32)
    _linear(x, raw, fmt, ref, 1, 0)
    for i in range(3):
        one = np.empty((1, n), np.float32)
        _linear(x[i:i + 1], raw, fmt, one, 1, level)
        np.testing.assert_array_equal(_bits(one), _bits(ref[i:i + 1]))
    for m in (2, 3, 4, 7, 8, 9, 13):
        for threads in (1, 2):
            out = np.empty((m, n), np.float32)
            _linear(x[:m], raw, fmt, out, threads, level)
            np.testing.assert_array_equal(_bits(out), _bits(ref[:m]), err_msg=f"m={m} t={threads}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", sorted(QTYPES))
def test_extreme_scales_agree_across_paths(fmt, level):
    """Subnormal, zero and +-65504 fp16 scales: the tile equals the scalar path (NaN only
    has to be NaN, inf products included)."""
    rng = np.random.default_rng(9)
    n, k = 48, 512
    raw, _ = _weights(rng, fmt, n, k, scales=EXTREME_SCALES)
    x = rng.standard_normal((6, k), dtype=np.float32)
    ref = np.empty((6, n), np.float32)
    _linear(x, raw, fmt, ref, 1, 0)
    for m in (1, 6):
        out = np.empty((m, n), np.float32)
        _linear(x[:m], raw, fmt, out, 1, level)
        nan = np.isnan(ref[:m])
        np.testing.assert_array_equal(np.isnan(out), nan)
        np.testing.assert_array_equal(_bits(np.where(nan, 0, out)), _bits(np.where(nan, 0, ref[:m])))


def test_zero_rows_and_bad_input():
    rng = np.random.default_rng(0)
    raw, _ = _weights(rng, "q4_k", 8, 256)
    x = np.zeros((2, 256), np.float32)
    out = np.full((2, 8), np.nan, np.float32)
    _gemm.linear_rows_q8(x, raw, "q4_k", out)
    np.testing.assert_array_equal(out, 0)
    empty = np.empty((0, 8), np.float32)
    assert _gemm.linear_rows_q8(np.empty((0, 256), np.float32), raw, "q4_k", empty) is empty
    with pytest.raises(ValueError, match="fmt must be one of"):
        _gemm.linear_rows_q8(x, raw, "f16", out)
    with pytest.raises(TypeError):
        _gemm.linear_rows_q8(x, raw, 12, out)
    with pytest.raises(ValueError):
        _gemm.linear_rows_q8(np.zeros((2, 512), np.float32), raw, "q4_k", out)
    with pytest.raises(TypeError):
        _gemm.linear_rows_q8(x.astype(np.float64), raw, "q4_k", out)
    with pytest.raises(ValueError):
        _gemm.linear_rows_q8(x, raw, "q4_k", np.empty((2, 9), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        _gemm._quantize_activations(np.zeros((1, 48), np.float32))
