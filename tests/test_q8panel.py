"""Panel-repacked GGUF weights (``pagedcy._libs._q8panel``, pagedcy_gemm_q8p.h) and
``PanelWeight``: the repack keeps every bit of the file (rows come back exactly), and the
int8-activation GEMM on panels gives the bits of the plain C reference on the raw rows
(``_gemm.linear_rows_q8`` at the scalar level) on every path: the decode kernels (1-4 rows a
call, partial last panels), the packed tile from 8 rows, 1 and 2 threads, every SIMD level
this CPU has. Together with tests/test_q8a.py (that reference against float64 within the
stated bound) this ties the panels to the definition."""
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from pagedcy._libs import _gemm, _q8panel  # noqa: E402
from pagedcy.models.linear import BlockWeight, PanelWeight, concat_weights  # noqa: E402

from test_gemm import split_threads  # noqa: E402
from test_q8a import LEVELS, QTYPES, _bits, _weights  # noqa: E402
from test_quant import EXTREME_SCALES  # noqa: E402


def _k(rng, fmt, kb):
    """K of kb 256-blocks, plus an odd number of 32-element blocks for the 32-element formats."""
    return 256 * kb + (32 * int(rng.integers(0, 8)) if not fmt.endswith("_k") else 0)


def _reference(x, raw, fmt):
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    return _gemm._linear_rows_q8_tuned(x, raw, fmt, out, 1, 0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), kb=st.integers(1, 3), fmt=st.sampled_from(sorted(QTYPES)),
       seed=st.integers(0, 2**16))
def test_repack_keeps_every_bit_of_the_rows(n, kb, fmt, seed):
    rng = np.random.default_rng(seed)
    k = _k(rng, fmt, kb)
    raw, _ = _weights(rng, fmt, n, k)
    panel = _q8panel.repack(raw, fmt)
    assert panel.nbytes == _q8panel.panel_bytes(fmt, n, k) == -(-n // 16) * 16 * raw.shape[1]
    assert panel.ctypes.data % 64 == 0
    np.testing.assert_array_equal(_q8panel.rows(panel, fmt, n, k, np.arange(n)), raw)
    ids = rng.integers(0, n, 5)
    np.testing.assert_array_equal(_q8panel.rows(panel, fmt, n, k, ids), raw[ids])


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 70), kb=st.integers(1, 3),
       fmt=st.sampled_from(sorted(QTYPES)), level=st.sampled_from(LEVELS),
       threads=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_panels_give_the_reference_bits(m, n, kb, fmt, level, threads, seed):
    rng = np.random.default_rng(seed)
    k = _k(rng, fmt, kb)
    raw, _ = _weights(rng, fmt, n, k)
    x = rng.standard_normal((m, k), dtype=np.float32) * np.float32(rng.choice([1e-3, 1.0, 1e3]))
    out = np.full((m, n), np.nan, np.float32)
    assert _q8panel._linear_tuned(x, _q8panel.repack(raw, fmt), fmt, n, out, threads, level) is out
    np.testing.assert_array_equal(_bits(out), _bits(_reference(x, raw, fmt)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", sorted(QTYPES))
def test_every_row_count_and_thread_count_alike(fmt, level):
    """Rows 1..13 and 40 (decode kernels of 1-4 rows a call) and 130 (the packed tile, from
    PG_Q8P_TILE_M = 128), over 1030 rows of W (a partial last panel and an odd panel count),
    1 and 2 threads: the reference's bits, and a row's result the same whatever else is in
    the batch."""
    rng = np.random.default_rng(3)
    n, k = 1030, 1536 if fmt.endswith("_k") else 1568
    raw, _ = _weights(rng, fmt, n, k)
    panel = _q8panel.repack(raw, fmt)
    x = rng.standard_normal((130, k), dtype=np.float32)
    ref = _reference(x, raw, fmt)
    for m in list(range(1, 14)) + [40, 130]:
        for threads in (1, 2):
            out = np.empty((m, n), np.float32)
            _q8panel._linear_tuned(x[:m], panel, fmt, n, out, threads, level)
            np.testing.assert_array_equal(_bits(out), _bits(ref[:m]), err_msg=f"m={m} t={threads}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", sorted(QTYPES))
def test_extreme_scales_and_non_finite_activations(fmt, level):
    """Subnormal, zero and +-65504 fp16 scales, and rows of x holding inf and NaN: NaN where the
    reference has NaN, its bits elsewhere."""
    rng = np.random.default_rng(9)
    n, k = 48, 512
    raw, _ = _weights(rng, fmt, n, k, scales=EXTREME_SCALES)
    x = rng.standard_normal((9, k), dtype=np.float32)
    x[1, 7], x[2, 300], x[3, :32] = np.inf, np.nan, 0
    ref = _reference(x, raw, fmt)
    nan = np.isnan(ref)
    for m in (1, 4, 9):
        out = np.empty((m, n), np.float32)
        _q8panel._linear_tuned(x[:m], _q8panel.repack(raw, fmt), fmt, n, out, 1, level)
        np.testing.assert_array_equal(np.isnan(out), nan[:m])
        np.testing.assert_array_equal(_bits(np.where(nan[:m], 0, out)), _bits(np.where(nan[:m], 0, ref[:m])))


def test_bad_input_is_a_clear_error():
    rng = np.random.default_rng(0)
    raw, _ = _weights(rng, "q4_k", 20, 512)
    panel = _q8panel.repack(raw, "q4_k")
    x, out = np.zeros((2, 512), np.float32), np.empty((2, 20), np.float32)
    with pytest.raises(ValueError, match="fmt must be one of"):
        _q8panel.repack(raw, "f16")
    with pytest.raises(TypeError):
        _q8panel.repack(raw.astype(np.int8), "q4_k")
    with pytest.raises(ValueError):
        _q8panel.repack(raw[:, :100], "q4_k")
    with pytest.raises(ValueError):
        _q8panel.repack(raw, "q4_k", k=256)
    with pytest.raises(TypeError):
        _q8panel.linear(x, panel.reshape(2, -1), "q4_k", 20, out)
    with pytest.raises(ValueError, match="takes"):
        _q8panel.linear(x, panel[:-1], "q4_k", 20, out)
    with pytest.raises(ValueError, match="takes"):
        _q8panel.linear(x, panel, "q4_k", 40, np.empty((2, 40), np.float32))
    with pytest.raises(ValueError):
        _q8panel.linear(np.zeros((2, 500), np.float32), panel, "q4_k", 20, out)
    with pytest.raises(TypeError):
        _q8panel.linear(x.astype(np.float64), panel, "q4_k", 20, out)
    with pytest.raises(ValueError):
        _q8panel.linear(x, panel, "q4_k", 20, np.empty((2, 21), np.float32))
    with pytest.raises(ValueError):
        _q8panel.linear(x, panel, "q4_k", -1, out)
    with pytest.raises(IndexError):
        _q8panel.rows(panel, "q4_k", 20, 512, [20])
    with pytest.raises(IndexError):
        _q8panel.rows(panel, "q4_k", 20, 512, [-1])
    empty = np.empty((0, 20), np.float32)
    assert _q8panel.linear(np.empty((0, 512), np.float32), panel, "q4_k", 20, empty) is empty
    zero = np.full((2, 20), np.nan, np.float32)
    _q8panel.linear(x, panel, "q4_k", 20, zero)
    np.testing.assert_array_equal(zero, 0)


@pytest.mark.parametrize("fmt", sorted(QTYPES))
def test_panel_weight_is_the_block_weight_with_int8_activations(fmt):
    rng = np.random.default_rng(1)
    raw, w = _weights(rng, fmt, 37, 512)
    pw, bw = PanelWeight(raw, fmt.upper()), BlockWeight(raw, fmt.upper())
    assert pw.shape == bw.shape == (37, 512) and pw.format == fmt and pw.int8_activations
    assert pw.nbytes == 48 * raw.shape[1]
    ids = np.array([36, 0, 17, 17])
    np.testing.assert_array_equal(pw.take_rows(ids, np.empty((4, 512), np.float32)),
                                  bw.take_rows(ids, np.empty((4, 512), np.float32)))
    x = rng.standard_normal((3, 512), dtype=np.float32)
    np.testing.assert_array_equal(pw.linear(x, np.empty((3, 37), np.float32)), _reference(x, raw, fmt))
    with pytest.raises(ValueError, match="not a block format"):
        PanelWeight(np.zeros((2, 64), np.uint8), "F16")
    with pytest.raises(ValueError, match="no int8-activation kernel"):
        PanelWeight(np.zeros((2, 84), np.uint8), "Q2_K")


@pytest.mark.parametrize("sizes", [(32, 16, 16), (20, 16, 16), (16, 16, 5)])
def test_concatenated_panel_weights_are_the_concatenated_rows(sizes):
    """q|k|v fused: whole panels concatenate as they are, a part with a partial panel
    before others is repacked from its rows; either way the rows of the parts, in order."""
    rng = np.random.default_rng(2)
    raws = [_weights(rng, "q6_k", n, 512)[0] for n in sizes]
    fused = concat_weights([PanelWeight(r, "Q6_K") for r in raws])
    assert isinstance(fused, PanelWeight) and fused.shape == (sum(sizes), 512)
    whole = np.concatenate(raws)
    np.testing.assert_array_equal(fused.rows(np.arange(sum(sizes))), whole)
    x = rng.standard_normal((2, 512), dtype=np.float32)
    np.testing.assert_array_equal(fused.linear(x, np.empty((2, sum(sizes)), np.float32)),
                                  _reference(x, whole, "q6_k"))


@settings(max_examples=30, deadline=None)
@given(fmts=st.lists(st.sampled_from(sorted(QTYPES)), min_size=1, max_size=4),
       sizes=st.lists(st.integers(1, 70), min_size=4, max_size=4),
       m=st.sampled_from([1, 2, 3, 5, 17, 130]), level=st.sampled_from(LEVELS),
       threads=st.integers(1, 2), chunks=st.sampled_from([None, 1, 2, 3, 7]), seed=st.integers(0, 2**16))
def test_stacked_parts_in_one_call_are_each_part_alone(fmts, sizes, m, level, threads, chunks, seed):
    """linear_parts over parts of mixed formats and row counts (partial panels, panel
    pairs split between threads across part boundaries, in fixed shares or in chunks claimed
    in turn): each part's columns hold the bits of the part alone, at decode sizes and at the
    tile's (130 rows)."""
    with split_threads(chunks):
        _check_stacked_parts(fmts, sizes, m, level, threads, seed)


def _check_stacked_parts(fmts, sizes, m, level, threads, seed):
    rng = np.random.default_rng(seed)
    k = 512 if any(f.endswith("_k") for f in fmts) else 256 + 32 * int(rng.integers(0, 8))
    raws = [_weights(rng, f, n, k)[0] for f, n in zip(fmts, sizes)]
    x = rng.standard_normal((m, k), dtype=np.float32)
    parts = [(_q8panel.repack(r, f), f, r.shape[0]) for r, f in zip(raws, fmts)]
    out = np.full((m, sum(r.shape[0] for r in raws)), np.nan, np.float32)
    assert _q8panel._linear_parts_tuned(x, parts, out, threads, level) is out
    ref = np.concatenate([_reference(x, r, f) for r, f in zip(raws, fmts)], axis=1)
    np.testing.assert_array_equal(_bits(out), _bits(ref))


def test_stacked_panel_weights_run_as_one_and_refuse_bad_parts():
    rng = np.random.default_rng(4)
    raws = [_weights(rng, f, n, 512)[0] for f, n in (("q5_0", 40), ("q8_0", 8), ("q4_k", 24))]
    fused = concat_weights([PanelWeight(r, f.upper()) for r, f in zip(raws, ("q5_0", "q8_0", "q4_k"))])
    assert fused.format == "q5_0+q8_0+q4_k" and fused.shape == (72, 512)
    x = rng.standard_normal((3, 512), dtype=np.float32)
    ref = np.concatenate([_reference(x, r, f) for r, f in zip(raws, ("q5_0", "q8_0", "q4_k"))], axis=1)
    np.testing.assert_array_equal(_bits(fused.linear(x, np.empty((3, 72), np.float32))), _bits(ref))
    panel = _q8panel.repack(raws[0], "q5_0")
    out = np.empty((3, 40), np.float32)
    for parts, err in (([], TypeError), ("q5_0", TypeError), ([(panel, "q5_0")], TypeError),
                       ([(panel, "q5_0", 40)] * 9, TypeError),
                       ([(panel, "f16", 40)], ValueError), ([(panel, "q5_0", 41)], ValueError),
                       ([(panel, "q5_0", 40), (panel, "q5_0", 40)], ValueError),
                       ([(panel[:-1], "q5_0", 40)], ValueError)):
        with pytest.raises(err):
            _q8panel.linear_parts(x, parts, out)
    with pytest.raises(ValueError):
        _q8panel.linear_parts(x[:, :500], [(panel, "q5_0", 40)], out)
    with pytest.raises(ValueError, match="overlap"):
        _q8panel.linear_parts(x, [(panel, "q5_0", 40)], panel[:480].view(np.float32).reshape(3, 40))
    np.testing.assert_array_equal(_bits(_q8panel.linear_parts(x, [(panel, "q5_0", 40)], out)),
                                  _bits(ref[:, :40]))


def test_only_a_file_mapping_gives_its_pages_back(tmp_path):
    """After the repack a memory-mapped source's pages are dropped (MADV_DONTNEED) and read
    back from the file unchanged; an array in anonymous memory is never touched (there the
    same advice would zero it)."""
    rng = np.random.default_rng(4)
    raw, _ = _weights(rng, "q8_0", 256, 1024)
    keep = raw.copy()
    PanelWeight(raw, "Q8_0")
    np.testing.assert_array_equal(raw, keep)
    raw.flags.writeable = False
    PanelWeight(raw, "Q8_0")
    np.testing.assert_array_equal(raw, keep)
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(8192) + keep.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, np.uint8, count=keep.size, offset=8192).reshape(keep.shape)
    pw = PanelWeight(view, "Q8_0")
    np.testing.assert_array_equal(view, keep)                 # refaulted from the file
    np.testing.assert_array_equal(pw.rows(np.arange(256)), keep)
    del view, pw
    mm.close()


_PREFETCH_CHILD = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_q8a import LEVELS, _bits, _weights
from test_q8panel import _reference
from pagedcy._libs import _q8panel
rng = np.random.default_rng(11)
for fmt in ("q4_k", "q5_k", "q6_k"):
    raw, _ = _weights(rng, fmt, 100, 2048)            # 2048-byte prefetches run past a row's end
    panel = _q8panel.repack(raw, fmt)
    x = rng.standard_normal((5, 2048), dtype=np.float32)
    ref = _bits(_reference(x, raw, fmt))
    for level in LEVELS:
        for m in (1, 4, 5):
            for threads in (1, 2):
                out = np.empty((m, 100), np.float32)
                _q8panel._linear_tuned(x[:m], panel, fmt, 100, out, threads, level)
                assert np.array_equal(_bits(out), ref[:m]), (fmt, level, m, threads)
print("ok")
"""


@pytest.mark.parametrize("prefetch", ["0", "1"])
def test_k_quant_prefetch_on_and_off_give_the_same_bits(prefetch):
    """PAGEDCY_Q8P_PREFETCH forces the K-quant panels' software prefetch off or on (by
    default it follows the CPU): both give the reference's bits, on every level here."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PAGEDCY_Q8P_PREFETCH=prefetch)
    out = subprocess.run([sys.executable, "-c", _PREFETCH_CHILD, here], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"
