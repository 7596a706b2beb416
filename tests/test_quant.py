"""pagedcy._libs._quant (GGUF block formats) against gguf-py's reference (bit for bit), and
the GEMM on block weights (``_gemm.linear_rows``: register decode in the streaming tiles,
decode to scratch at the scalar level, the packed panel from 48 rows) against a float64
reference and itself across M, paths and threads."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402

from pagedcy._libs import _gemm, _quant  # noqa: E402
from pagedcy._libs._attention import simd_level  # noqa: E402
from pagedcy._libs._quant import (  # noqa: E402
    SUPPORTED_TYPES, _dequantize_tuned, block_info, dequantize, quantize)

LEVELS = [lv for lv in (2, 1, 0) if lv <= simd_level()]
TYPES = [T(t) for t in SUPPORTED_TYPES]
BLOCK_TYPES = [t for t in TYPES if block_info(t)[0] > 1]
# byte offsets of each block's fp16 scale fields (d, and m / dmin where the type has one)
SCALE_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
                T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
# fp16 bit patterns for scales: zeros, the smallest and largest subnormal, 1, +-65504
EXTREME_SCALES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF],
                          np.uint16)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _same(got, ref):
    """Bit-for-bit equal, except that a NaN only has to be a NaN (payloads may differ)."""
    got, ref = np.asarray(got, np.float32), np.asarray(ref, np.float32)
    assert got.shape == ref.shape
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(_bits(np.where(nan, 0, got)), _bits(np.where(nan, 0, ref)))


def _random_raw(rng, qtype, rows, k, scales=None, moderate=False):
    """Random blocks for ``rows`` rows of ``k`` elements: random quant bytes, fp16 scale fields
    drawn from ``scales`` (bit patterns; default: any finite fp16). F16 / BF16 / F32 get
    random finite values (``moderate``: normal ones, whose products stay finite)."""
    be, bb = block_info(qtype)
    if qtype == T.F32 or (moderate and be == 1):
        w = rng.standard_normal((rows, k), dtype=np.float32)
        if qtype == T.F32:
            return w.view(np.uint8)
        if qtype == T.F16:
            return w.astype(np.float16).view(np.uint8)
        return np.ascontiguousarray((w.view(np.uint32) >> 16).astype(np.uint16)).view(np.uint8)
    if qtype in (T.F16, T.BF16):
        bits = rng.integers(0, 2**16, (rows, k), dtype=np.uint16)
        exp = (bits >> 10) & 0x1F if qtype == T.F16 else (bits >> 7) & 0xFF
        bits[exp == exp.max(initial=0)] &= 0x83FF if qtype == T.F16 else 0x807F   # no inf / nan
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (rows, k // be * bb), dtype=np.uint8)
    blocks = raw.reshape(-1, bb)
    for off in SCALE_FIELDS[qtype]:
        if scales is None:
            h = rng.integers(0, 2**16, len(blocks), dtype=np.uint16)
            h[(h & 0x7C00) == 0x7C00] &= 0xBFFF                # finite
        else:
            h = rng.choice(scales, len(blocks)).astype(np.uint16)
        blocks[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw


def _reference(raw, qtype, shape):
    return gguf.quants.dequantize(raw, qtype).reshape(shape)


def test_supported_types_and_block_info_match_gguf():
    assert set(SUPPORTED_TYPES) == {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                                    T.Q4_K, T.Q5_K, T.Q6_K}
    for t in TYPES:
        assert block_info(t) == GGML_QUANT_SIZES[t]
        assert block_info(int(t)) == GGML_QUANT_SIZES[t]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decode_is_gguf_bit_for_bit(qtype, level):
    rng = np.random.default_rng(int(qtype) * 10 + level)
    for scales in (None, EXTREME_SCALES):
        k = 3 * 256 + (0 if block_info(qtype)[0] == 256 else 32 if block_info(qtype)[0] == 32 else 7)
        raw = _random_raw(rng, qtype, 5, k, scales)
        got = _dequantize_tuned(raw, qtype, (5, k), max_simd=level)
        assert got.dtype == np.float32 and got.shape == (5, k)
        ref = _reference(raw, qtype, (5, k))
        assert not np.isnan(ref).any()
        np.testing.assert_array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qtype", [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0],
                         ids=lambda t: t.name)
def test_decode_of_gguf_quantized_data(qtype, level):
    """Blocks as gguf-py's quantizer makes them from real-valued data (normal, with outliers
    and all-zero blocks)."""
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((6, 512), dtype=np.float32) * np.float32(3)
    x[1, :32] = 0
    x[2, 100] = 4e4
    x[3] *= np.float32(1e-6)
    raw = gguf.quants.quantize(x, qtype).view(np.uint8)
    got = _dequantize_tuned(raw, qtype, x.shape, max_simd=level)
    np.testing.assert_array_equal(_bits(got), _bits(_reference(raw, qtype, x.shape)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES + [T.F16, T.BF16, T.F32], ids=lambda t: t.name)
def test_nan_and_inf_scales_give_nan_and_inf_like_gguf(qtype, level):
    """A NaN or infinite scale (a corrupt file) decodes without crashing to the values gguf-py
    gives: NaN where it has NaN (payloads may differ: F16C quiets signalling NaNs), the same
    bits elsewhere. So do random F16 / BF16 / F32 bit patterns, NaNs and infinities included."""
    rng = np.random.default_rng(int(qtype) + 100)
    be, bb = block_info(qtype)
    k = 512
    if be == 1:
        raw = rng.integers(0, 256, (4, k * bb), dtype=np.uint8)
    else:
        raw = _random_raw(rng, qtype, 4, k, np.array([0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01, 0x3C00],
                                                     np.uint16))
    ref = _reference(raw, qtype, (4, k))
    assert np.isnan(ref).any() or be == 1
    _same(_dequantize_tuned(raw, qtype, (4, k), max_simd=level), ref)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decode_shapes_and_threads(qtype):
    rng = np.random.default_rng(3)
    be = block_info(qtype)[0]
    k = 256 if be > 1 else 33
    raw = _random_raw(rng, qtype, 1, k)
    one_d = dequantize(raw.reshape(-1), qtype, k)
    assert one_d.shape == (k,)
    np.testing.assert_array_equal(_bits(one_d), _bits(_reference(raw, qtype, (k,))))
    raw3 = _random_raw(rng, qtype, 6, k)
    assert dequantize(raw3, qtype, (2, 3, k)).shape == (2, 3, k)
    assert dequantize(raw3[:0], qtype, (0, k)).shape == (0, k)
    # big enough (> 1 MiB of output) that two threads split the rows
    rows = (1 << 20) // (4 * k) + 9
    big = _random_raw(rng, qtype, rows, k)
    a, b = dequantize(big, qtype, (rows, k), 1), dequantize(big, qtype, (rows, k), 2)
    np.testing.assert_array_equal(_bits(a), _bits(b))
    np.testing.assert_array_equal(_bits(a), _bits(_reference(big, qtype, (rows, k))))


UNSUPPORTED = [T.Q2_K, T.Q3_K, T.Q8_1, T.Q8_K, T.IQ2_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS, T.IQ1_M,
               T.TQ1_0, T.TQ2_0, T.MXFP4, T.I8, T.F64]


@pytest.mark.parametrize("qtype", UNSUPPORTED, ids=lambda t: t.name)
def test_unsupported_types_are_value_errors_naming_them(qtype):
    raw = np.zeros(4096, np.uint8)
    x = np.zeros((1, 256), np.float32)
    for call in (lambda: dequantize(raw, qtype, (256,)), lambda: block_info(qtype),
                 lambda: quantize(x, qtype)):
        with pytest.raises(ValueError, match=qtype.name):
            call()


def test_bad_arguments():
    raw = np.zeros((2, 34), np.uint8)
    for bad_type in (99999, -1, 2**40):
        with pytest.raises(ValueError, match="not supported"):
            dequantize(raw, bad_type, (2, 32))
    for bad_type in ("Q8_0", 8.0, None, True):
        with pytest.raises(TypeError):
            dequantize(raw, bad_type, (2, 32))
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize(raw, T.Q8_0, (2, 48))
    with pytest.raises(ValueError, match="bytes"):
        dequantize(raw, T.Q8_0, (3, 32))
    with pytest.raises(ValueError, match="negative"):
        dequantize(raw, T.Q8_0, (-2, 32))
    with pytest.raises(TypeError, match="uint8"):
        dequantize(raw.view(np.int8), T.Q8_0, (2, 32))
    with pytest.raises(TypeError, match="numpy array"):
        dequantize(bytes(68), T.Q8_0, (2, 32))
    with pytest.raises(ValueError, match="contiguous"):
        dequantize(np.zeros((2, 68), np.uint8)[:, ::2], T.Q8_0, (2, 32))
    with pytest.raises(TypeError):
        dequantize(raw, T.Q8_0, "2, 32")
    with pytest.raises(ValueError):
        dequantize(raw, T.Q8_0, (2, 32), num_threads=0)


# ---- quantize ---------------------------------------------------------------------------

def _quantize_cases(rng):
    tie = np.zeros((1, 32), np.float32)        # Q8_0: d = 1, so x / d ties at .5 exactly
    tie[0, :8] = [127, 2.5, -2.5, 0.5, -0.5, 126.5, -3.5, 1.5]
    tie4 = np.zeros((1, 32), np.float32)       # Q4_0: max = -8, d = 1: x + 8.5 at integers
    tie4[0, :8] = [-8, -0.5, 0.5, 6.5, -7.5, 7, 1, -1]
    first = np.full((1, 32), 3, np.float32)    # Q4_0 takes the first of equal magnitudes
    first[0, 5] = -3
    first[0, 2] = -3
    return [
        rng.standard_normal((8, 256), dtype=np.float32),
        np.zeros((3, 64), np.float32), -np.zeros((2, 32), np.float32),
        (rng.standard_normal((4, 64)) * 3e38).clip(-3.4e38, 3.4e38).astype(np.float32),
        (rng.standard_normal((4, 64)) * 1e-38).astype(np.float32),   # scale's inverse overflows
        (rng.standard_normal((4, 64)) * 1e-42).astype(np.float32),
        (rng.standard_normal((4, 64)) * 8e6).astype(np.float32),     # fp16 scale overflows
        rng.integers(-9, 10, (4, 64)).astype(np.float32), tie, tie4, first,
        rng.standard_normal(96, dtype=np.float32), rng.standard_normal((2, 3, 32), dtype=np.float32),
    ]


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_quantize_is_gguf_bit_for_bit(qtype):
    for x in _quantize_cases(np.random.default_rng(int(qtype))):
        got = quantize(x, qtype)
        ref = gguf.quants.quantize(x, qtype)
        assert got.dtype == np.uint8 and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)


@settings(max_examples=80, deadline=None)
@given(qtype=st.sampled_from([T.Q8_0, T.Q4_0]), seed=st.integers(0, 2**32 - 1),
       blocks=st.integers(1, 6), scale=st.sampled_from([1e-40, 1e-30, 1e-3, 1.0, 1e4, 1e30]),
       extra=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=8))
def test_quantize_random_is_gguf_bit_for_bit(qtype, seed, blocks, scale, extra):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(32 * blocks) * scale).astype(np.float32)
    x[:len(extra)] = extra
    np.testing.assert_array_equal(quantize(x, qtype), gguf.quants.quantize(x, qtype))


def test_quantize_threads_and_errors():
    x = np.random.default_rng(5).standard_normal((1024, 512), dtype=np.float32)
    for qtype in (T.Q8_0, T.Q4_0):
        np.testing.assert_array_equal(quantize(x, qtype, 1), quantize(x, qtype, 2))
    x[700, 3] = np.nan
    for value in (np.nan, np.inf, -np.inf):
        x[700, 3] = value
        with pytest.raises(ValueError, match="finite"):
            quantize(x, T.Q8_0, 2)
        with pytest.raises(ValueError, match="finite"):
            quantize(x[700:701], T.Q4_0, 1)
    with pytest.raises(ValueError, match="Q8_0 or Q4_0"):
        quantize(x, T.Q4_K)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(np.zeros(48, np.float32), T.Q8_0)
    with pytest.raises(TypeError, match="float32"):
        quantize(np.zeros(32), T.Q8_0)
    with pytest.raises(TypeError):
        quantize([0.0] * 32, T.Q8_0)


# ---- the GEMM on block weights (_gemm.linear_rows) -------------------------------------

FMT_NAMES = {v: k for k, v in _gemm.BLOCK_FORMATS.items()}


def _linear(x, raw, qtype, out, threads=1, level=2):
    return _gemm._linear_rows_tuned(x, raw, FMT_NAMES[int(qtype)], out, threads, level)


def _check_linear(out, x, w):
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30
    assert (np.abs(out - ref) <= bound).all(), np.max(np.abs(out - ref) / bound)


def test_every_block_type_is_a_gemm_format():
    assert sorted(FMT_NAMES) == sorted(int(t) for t in BLOCK_TYPES)


@settings(max_examples=80, deadline=None)
@given(qtype=st.sampled_from(BLOCK_TYPES), m=st.integers(1, 60), n=st.integers(1, 40),
       kb=st.integers(1, 9), level=st.sampled_from(LEVELS), threads=st.integers(1, 2),
       seed=st.integers(0, 2**32 - 1))
def test_linear_matches_float64(qtype, m, n, kb, level, threads, seed):
    """Every block type, level, both paths (M from 48 packs): within 1e-5 of float64 on the
    dequantized weight, relative to |x| @ |W|."""
    rng = np.random.default_rng(seed)
    k = kb * block_info(qtype)[0]
    raw = _random_raw(rng, qtype, n, k, moderate=True).reshape(n, -1)
    w = dequantize(raw, qtype, (n, k))
    x = rng.standard_normal((m, k), dtype=np.float32)
    out = np.full((m, n), np.nan, np.float32)
    assert _linear(x, raw, qtype, out, threads, level) is out
    _check_linear(out, x, w)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_linear_of_a_one_hot_batch_is_the_weight(qtype, level):
    """x = identity rows pick weight columns out exactly (every K block's decode, k0 > 0 past
    the first 512 elements, equals dequantize bit for bit), with extreme scales; M = 1 .. 3
    rows of the identity go through the streaming tiles, all of it through the packed path.
    (Compared as values: a -0 weight sums to +0, the accumulators start at +0.)"""
    rng = np.random.default_rng(int(qtype))
    k = 1280
    raw = _random_raw(rng, qtype, 11, k, scales=EXTREME_SCALES).reshape(11, -1)
    want = dequantize(raw, qtype, (11, k)).T
    eye = np.eye(k, dtype=np.float32)
    out = np.empty((k, 11), np.float32)
    _linear(eye, raw, qtype, out, 1, level)
    np.testing.assert_array_equal(out, want)
    for r0 in (0, 255, 511, 1000, 1277):
        for m in (1, 2, 3):
            o = np.empty((m, 11), np.float32)
            _linear(eye[r0:r0 + m], raw, qtype, o, 1, level)
            np.testing.assert_array_equal(o, want[r0:r0 + m])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_linear_row_does_not_depend_on_batch_path_or_threads(qtype, level):
    """A row of the output is the same bits alone (M = 1: register decode), inside any batch
    (streaming tiles of 1 to 3 rows, 4 or 8 weight rows), in the packed path (M >= 48) and
    on 2 threads; and equals the float32 GEMM on the dequantized weight."""
    rng = np.random.default_rng(11)
    n, k = 1030, 1536      # over 1 MiB of weight, so two threads really split it
    raw = _random_raw(rng, qtype, n, k, moderate=True).reshape(n, -1)
    w = dequantize(raw, qtype, (n, k))
    x = rng.standard_normal((64, k), dtype=np.float32)
    alone = np.empty((64, n), np.float32)
    for i in range(64):
        _linear(x[i:i + 1], raw, qtype, alone[i:i + 1], 1, level)
    _check_linear(alone, x, w)
    dense = np.empty_like(alone)
    _gemm._linear_rows_tuned(x, w, "f32", dense, 1, level)
    np.testing.assert_array_equal(_bits(dense), _bits(alone))
    for m in (2, 3, 4, 5, 8, 13, 47, 48, 64):
        for threads in (1, 2):
            out = np.empty((m, n), np.float32)
            _linear(x[:m], raw, qtype, out, threads, level)
            np.testing.assert_array_equal(_bits(out), _bits(alone[:m]), err_msg=f"m={m} t={threads}")


@pytest.mark.parametrize("cap", ["scalar", "avx2"])
def test_linear_at_every_simd_cap(cap):
    """PAGEDCY_SIMD caps the tiles too: under each cap, M = 1 and M = 60 (packed) agree with
    the float32 GEMM on the dequantized weight bit for bit, for every block type."""
    import os
    import subprocess
    import sys
    code = ("import numpy as np; from pagedcy._libs import _gemm, _quant\n"
            "r = np.random.default_rng(0)\n"
            "for f, t in _gemm.BLOCK_FORMATS.items():\n"
            "    be, bb = _quant.block_info(t); k = 2 * 256 + 256; n = 21\n"
            "    raw = r.integers(0, 256, (n, k // be * bb), dtype=np.uint8)\n"
            "    b = raw.reshape(-1, bb); offs = {14: (208,), 12: (0, 2), 13: (0, 2), 3: (0, 2), 7: (0, 2)}\n"
            "    for o in offs.get(t, (0,)): b[:, o:o + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)\n"
            "    w = _quant.dequantize(raw, t, (n, k)); x = r.standard_normal((60, k), dtype=np.float32)\n"
            "    for m in (1, 2, 3, 60):\n"
            "        o = np.empty((m, n), np.float32); e = np.empty_like(o)\n"
            "        _gemm.linear_rows(x[:m], raw, f, o); _gemm.linear_rows(x[:m], w, 'f32', e)\n"
            "        assert np.array_equal(o.view(np.uint32), e.view(np.uint32)), (f, m)\n")
    env = dict(os.environ, PAGEDCY_SIMD=cap)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_module_surface():
    assert _quant.__doc__ and all(getattr(_quant, f).__doc__ for f in (
        "dequantize", "quantize", "block_info"))
    assert not hasattr(_quant, "linear")     # the GEMM computes with block weights
