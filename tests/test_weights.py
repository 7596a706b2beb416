"""The weight classes of pagedcy.models.linear: ``linear`` against a float64 product of the
widened weight, the chunked fallback against widening the whole weight (bit for bit),
``take_rows``, ``nbytes``, fused concatenation and mixed-format stacks."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagedcy.models import linear as L
from pagedcy.models.weights import bf16_bits_to_f32, to_bf16_bits

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402


def _weights(w):
    """Every format of float32 matrix ``w`` (K a multiple of 32 for the block formats)."""
    out = [L.DenseWeight(w), L.HalfWeight(w.astype(np.float16)),
           L.HalfWeight(to_bf16_bits(w), "bfloat16")]
    if w.shape[1] % 32 == 0:
        out += [L.BlockWeight(quantize(w, QT.Q8_0), QT.Q8_0, w.shape[1]),
                L.BlockWeight(quantize(w, QT.Q4_0), "q4_0", w.shape[1])]
    return out


def _check_linear(wt, x):
    ref = wt.dense().astype(np.float64)
    out = np.full((x.shape[0], wt.shape[0]), np.nan, np.float32)
    assert wt.linear(x, out, 1) is out
    want = x.astype(np.float64) @ ref.T
    scale = np.abs(x).astype(np.float64) @ np.abs(ref).T      # bound on the rounding error
    assert np.all(np.abs(out - want) <= 1e-5 * scale + 1e-30)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 70), kb=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_linear_matches_float64(m, n, kb, seed):
    rng = np.random.default_rng(seed)
    k = 32 * kb
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal((m, k), dtype=np.float32)
    for wt in _weights(w):
        _check_linear(wt, x)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(1, 50), seed=st.integers(0, 2**31))
def test_take_rows_and_dense(n, k, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32)
    ids = rng.integers(0, n, 7)
    exact = {"float32": w, "float16": w.astype(np.float16).astype(np.float32),
             "bfloat16": bf16_bits_to_f32(to_bf16_bits(w))}
    for wt in _weights(w):
        full = exact.get(wt.format)
        if full is None:
            full = dequantize(wt.raw, wt.qtype)
        np.testing.assert_array_equal(wt.dense(), full)
        out = np.empty((7, k), np.float32)
        np.testing.assert_array_equal(wt.take_rows(ids, out), full[ids])
        with pytest.raises(IndexError):
            wt.take_rows(np.array([n]), np.empty((1, k), np.float32))


def test_nbytes_and_formats():
    w = np.ones((64, 256), np.float32)
    got = {wt.format: (wt.nbytes, wt.shape) for wt in _weights(w)}
    assert got == {"float32": (64 * 256 * 4, (64, 256)), "float16": (64 * 256 * 2, (64, 256)),
                   "bfloat16": (64 * 256 * 2, (64, 256)),
                   "q8_0": (64 * 8 * 34, (64, 256)), "q4_0": (64 * 8 * 18, (64, 256))}


def test_concat_keeps_one_format_and_stacks_mixed_ones():
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal((n, 64), dtype=np.float32) for n in (16, 8, 8)]
    x = rng.standard_normal((3, 64), dtype=np.float32)
    for i in range(3):
        same = [_weights(p)[i] for p in parts]
        fused = L.concat_weights(same)
        assert type(fused) is type(same[0]) and fused.format == same[0].format
        assert fused.shape == (32, 64) and fused.nbytes == sum(p.nbytes for p in same)
        np.testing.assert_array_equal(fused.dense(), np.concatenate([p.dense() for p in same]))
    q = L.BlockWeight(quantize(parts[0], QT.Q8_0), QT.Q8_0, 64)
    mixed = L.concat_weights([q, L.HalfWeight(parts[1].astype(np.float16)), L.DenseWeight(parts[2])])
    assert isinstance(mixed, L.StackedWeight) and mixed.format == "q8_0+float16+float32"
    runs = L.concat_weights([q, q, L.DenseWeight(parts[2])])     # consecutive q8_0 parts fuse
    assert runs.format == "q8_0+float32" and [p.shape[0] for p in runs.parts] == [32, 8]
    dense = mixed.dense()
    out = np.empty((3, 32), np.float32)
    mixed.linear(x, out)
    want = np.empty((3, 32), np.float32)
    L.DenseWeight(dense).linear(x, want)
    np.testing.assert_array_equal(out, want)
    ids = np.array([31, 0, 17, 16, 15])
    np.testing.assert_array_equal(mixed.take_rows(ids, np.empty((5, 64), np.float32)), dense[ids])
    with pytest.raises(ValueError, match="same columns"):
        L.concat_weights([L.DenseWeight(parts[0]), L.DenseWeight(parts[0][:, :32])])


def test_bad_inputs_raise():
    w = L.HalfWeight(np.zeros((4, 8), np.float16))
    with pytest.raises(TypeError):
        w.linear(np.zeros((2, 8), np.float64), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError):
        w.linear(np.zeros((2, 7), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError):
        w.linear(np.zeros((2, 8), np.float32), np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="format"):
        L.HalfWeight(np.zeros((4, 8), np.uint16), "float8")
    with pytest.raises(ValueError, match="multiple of 32"):
        L.BlockWeight(np.zeros((4, 34), np.uint8), "q8_0", 40)
    with pytest.raises(ValueError, match="bytes"):
        L.BlockWeight(np.zeros((4, 33), np.uint8), "q8_0", 32)
    with pytest.raises(ValueError, match="unknown"):
        L.BlockWeight(np.zeros((4, 34), np.uint8), "q9_9", 32)


def test_native_entry_point_is_used_and_unknown_formats_are_refused(monkeypatch):
    """16-bit and block weights call ``_gemm.linear_rows`` with their stored rows and the
    GEMM's format name; a format the GEMM does not list is refused when the weight is made."""
    from pagedcy._libs import _gemm

    calls = []

    def fake(x, rows, fmt, out, num_threads):
        calls.append((fmt, rows.dtype))
        out[...] = 7.0
        return out

    w = np.ones((4, 32), np.float32)
    weights = _weights(w)[1:]
    monkeypatch.setattr(_gemm, "linear_rows", fake)
    x = np.ones((2, 32), np.float32)
    for wt in weights:
        out = np.zeros((2, 4), np.float32)
        wt.linear(x, out)
        assert np.all(out == 7.0)
    assert calls == [("f16", np.uint16), ("bf16", np.uint16), ("q8_0", np.uint8),
                     ("q4_0", np.uint8)]
    monkeypatch.setattr(_gemm, "BLOCK_FORMATS", {"q4_0": 2})
    with pytest.raises(ValueError, match="no GEMM computes 'q8_0'"):
        L.BlockWeight(quantize(w, QT.Q8_0), QT.Q8_0, 32)
    with pytest.raises(ValueError, match="no GEMM computes 'q2_k'"):
        L.BlockWeight(np.zeros((4, 84), np.uint8), "q2_k", 256)


def test_native_block_and_half_weights_equal_the_widened_weight_for_every_batch():
    """The GEMM's row decoders give, bit for bit, the float32 GEMM on the widened weight, for
    every M (streaming and packed paths): batch invariance across formats."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((70, 1024), dtype=np.float32)
    for wt in _weights(w)[1:]:
        dense = L.DenseWeight(wt.dense())
        for m in (1, 5, 47, 48, 130):
            x = rng.standard_normal((m, 1024), dtype=np.float32)
            got, want = np.empty((m, 70), np.float32), np.empty((m, 70), np.float32)
            wt.linear(x, got, 2)
            dense.linear(x, want, 2)
            np.testing.assert_array_equal(got, want, err_msg=f"{wt.format} M={m}")


def test_weights_own_aligned_copies_and_keep_views():
    """A float32 / 16-bit weight made from an array it owns (concatenated, widened, rounded)
    holds it on a 64-byte boundary, values unchanged; one made from a view of other memory
    (a memory-mapped file's tensor) keeps the view, no copy."""
    rng = np.random.default_rng(8)
    buf = np.empty(512 * 64 * 4 + 64, np.uint8)
    off = (16 - buf.ctypes.data) % 64           # 16 bytes past a line, as NumPy's large arrays
    for make in (lambda a: L.DenseWeight(a), lambda a: L.HalfWeight(a.astype(np.float16))):
        src = rng.standard_normal((512, 64)).astype(np.float32)
        w = make(src)
        held = w.data if isinstance(w, L.DenseWeight) else w.bits
        assert held.ctypes.data % 64 == 0
        np.testing.assert_array_equal(w.dense(), src if isinstance(w, L.DenseWeight)
                                      else src.astype(np.float16).astype(np.float32))
    view = buf[off:off + 512 * 64 * 4].view(np.float32).reshape(512, 64)
    view[...] = rng.standard_normal((512, 64))
    assert view.ctypes.data % 64 == 16 and not view.flags.owndata
    w = L.DenseWeight(view)
    assert np.shares_memory(w.data, view)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.empty((3, 512), np.float32)
    np.testing.assert_allclose(w.linear(x, out), x.astype(np.float64) @ view.T.astype(np.float64),
                               rtol=1e-5, atol=1e-4)
    a = np.ones((4, 4), np.float32)[:, :2]      # not C-contiguous: copied, aligned
    assert L.aligned_copy(a).flags.c_contiguous and L.aligned_copy(a).ctypes.data % 64 == 0
