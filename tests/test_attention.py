"""Correctness tests of pagedcy._libs._attention against a float64 NumPy reference."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedcy._libs._attention import (_TUNE_FLAGS, batch_paged_attention, merge_states,
                                      simd_enabled, simd_level)
from pagedcy._libs._attention import _batch_paged_attention_tuned as tuned_attention
from pagedcy._libs._bandwidth import _page_walk_sum, fma_rate, page_read_bandwidth, read_bandwidth

sys.path.insert(0, os.path.dirname(__file__))
from attn_helpers import make_batch, reference  # noqa: E402

# int8 is compared with the reference on its dequantized values: float32 accuracy
TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-3, "int8": 1e-5}
# Instruction sets this machine runs, best first: a run_case without an
# explicit max_simd checks each of them against the reference (the scalar
# path has its own tests via max_simd=0).
SIMD_LEVELS = [lv for lv in (2, 1) if lv <= simd_level()] or [0]


def run_case(rng, *, q_lens, kv_lens, H, Hkv, D, T, dtype="float32", causal=True,
             window_left=-1, soft_cap=0.0, alibi=False, scale=None, layout=None, **kw):
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=q_lens, kv_lens=kv_lens, num_heads=H,
                                             num_kv_heads=Hkv, head_dim=D, page_size=T, dtype=dtype,
                                             layout=layout)
    slopes = (rng.uniform(0.01, 0.5, H).astype(np.float32)) if alibi else None
    ro, rl = reference(q, ind, K, V, causal=causal, window_left=window_left, soft_cap=soft_cap,
                       alibi=slopes, scale=scale)
    tol = TOL[dtype]
    for level in [None] if "max_simd" in kw else SIMD_LEVELS:
        extra = {} if level is None else {"max_simd": level}
        o, lse = tuned_attention(q, ind, pages, 1, bt, kl, causal=causal,
                                       window_left=window_left, soft_cap=soft_cap,
                                       alibi_slopes=slopes, scale=scale, return_lse=True,
                                       **kw, **extra)
        assert o.dtype == np.float32 and o.shape == q.shape
        assert lse.dtype == np.float32 and lse.shape == q.shape[:2]
        np.testing.assert_allclose(o, ro, rtol=tol, atol=tol, err_msg=f"simd level {level}")
        np.testing.assert_allclose(lse, rl, rtol=tol, atol=tol, err_msg=f"simd level {level}")
    return o, lse


# --- page layouts ----------------------------------------------------------

@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("level", [0, 1, 2])
def test_page_layouts(layout, dtype, level):
    """Token-major (C-order) and head-major (a store's pages()) pools, decode
    and prefill in one batch, every instruction set, against the reference."""
    if level > simd_level():
        pytest.skip("instruction set not available on this CPU")
    rng = np.random.default_rng(level * 10 + len(dtype))
    run_case(rng, q_lens=[1, 1, 40, 3], kv_lens=[70, 33, 90, 5], H=8, Hkv=2, D=64, T=16,
             dtype=dtype, layout=layout, max_simd=level)


@pytest.mark.parametrize("flags", [0, ["super_f32"], ["super2", "super_f32"], ["super1"],
                                   ["super_f32", "super_page_order"]])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("mods", [{}, {"alibi": True, "soft_cap": 20.0}, {"window_left": 37}])
def test_pages_per_step(flags, dtype, mods):
    """Head-major decode takes up to 4 whole pages per softmax step: every grouping
    (1, 2, 4; token-major or page after page) with ALiBi, soft cap and windows that cut
    pages, on page counts that leave partial groups, against the reference."""
    rng = np.random.default_rng(len(str(flags)) + len(dtype))
    run_case(rng, q_lens=[1, 1, 2, 1], kv_lens=[16 * 9, 16 * 5 + 3, 100, 16], H=8, Hkv=2, D=32, T=16,
             dtype=dtype, layout="HND", flags=flags, **mods)


@pytest.mark.parametrize("dtype,flags", [("float16", 0), ("bfloat16", 0), ("bfloat16", ["no_bf16_perm"]),
                                         ("bfloat16", ["no_qk3"]), ("float16", ["super2"]),
                                         ("float32", 0), ("float32", ["super2"])])
@pytest.mark.parametrize("H,Hkv", [(8, 8), (8, 2), (16, 2)])
@pytest.mark.parametrize("D", [24, 40, 64, 128, 256])
def test_token_major_steps(dtype, flags, H, Hkv, D):
    """Float K/V on head-major pages read token-major in multi-page steps (AVX2 and
    AVX-512): GQA 1/4/8, head dims that are and are not multiples of 16 (the 8-wide P.V
    pass), 1 and 2 query rows, page counts that leave partial groups (9 pages: 4 + 4 + 1)
    and a partial last page, so the 6-token score blocks straddle page boundaries and
    end in the pair tail, against the float64 reference at every SIMD level."""
    rng = np.random.default_rng(D * 100 + H + Hkv + len(str(flags)) + len(dtype))
    run_case(rng, q_lens=[1, 2, 1, 1], kv_lens=[16 * 9, 16 * 6 + 5, 16 * 4, 16 * 2], H=H, Hkv=Hkv, D=D,
             T=16, dtype=dtype, layout="HND", causal=False, flags=flags)
    # an odd page size's worth of virtual tokens per step is impossible (T % 2 == 0 is
    # required), but 6-token blocks over 2 pages of 4 tokens (8 = 6 + pair) are not
    run_case(rng, q_lens=[1, 1], kv_lens=[4 * 7, 4 * 3 + 1], H=H, Hkv=Hkv, D=D, T=4, dtype=dtype,
             layout="HND", causal=False, flags=flags)


def test_page_subset_view():
    """Every other page of a pool (a strided view) reads the pages it names."""
    rng = np.random.default_rng(7)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 5], kv_lens=[40, 30], num_heads=4,
                                             num_kv_heads=2, head_dim=32, page_size=8)
    spread = np.full((2 * pages.shape[0],) + pages.shape[1:], np.nan, np.float32)
    spread[::2] = pages
    got = batch_paged_attention(q, ind, spread[::2], 1, bt, kl)
    np.testing.assert_allclose(got, batch_paged_attention(q, ind, pages, 1, bt, kl), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, reference(q, ind, K, V)[0], rtol=1e-5, atol=1e-5)


# --- shapes, GQA ratios, head dims ---------------------------------------

@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 4), (8, 2), (16, 2), (8, 1), (32, 8)])
@pytest.mark.parametrize("D", [64, 80, 96, 128, 256])
def test_gqa_head_dims(H, Hkv, D):
    rng = np.random.default_rng(H * 1000 + Hkv * 10 + D)
    run_case(rng, q_lens=[1, 1, 5, 1], kv_lens=[1, 15, 40, 129], H=H, Hkv=Hkv, D=D, T=16)


@pytest.mark.parametrize("T", [1, 3, 16, 32])
@pytest.mark.parametrize("causal", [True, False])
def test_kv_len_edges(T, causal):
    rng = np.random.default_rng(T)
    lens = [1, max(T - 1, 1), T, T + 1, 7 * T + 3, 300]
    run_case(rng, q_lens=[1] * len(lens), kv_lens=lens, H=8, Hkv=2, D=64, T=T, causal=causal)
    run_case(rng, q_lens=[min(3, n) for n in lens], kv_lens=lens, H=8, Hkv=2, D=64, T=T,
             causal=causal)


@pytest.mark.parametrize("causal", [True, False])
def test_mixed_decode_prefill(causal):
    rng = np.random.default_rng(7)
    run_case(rng, q_lens=[1, 37, 1, 0, 130, 2], kv_lens=[50, 37, 1, 0, 200, 2], H=8, Hkv=2, D=64,
             T=16, causal=causal)


@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (32, 1)])
def test_prefill_long(H, Hkv):
    rng = np.random.default_rng(11)
    run_case(rng, q_lens=[300], kv_lens=[300], H=H, Hkv=Hkv, D=64, T=16)
    run_case(rng, q_lens=[100], kv_lens=[333], H=H, Hkv=Hkv, D=64, T=16, causal=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), T=st.sampled_from([3, 8, 16, 24]),
       pack=st.sampled_from([0, ["pack1"], ["pack2"]]), level=st.sampled_from([0, 1, 2]),
       dtype=st.sampled_from(["float32", "float16", "bfloat16", "int8"]),
       q_len=st.integers(8, 150), extra=st.integers(0, 90), window=st.sampled_from([-1, 5, 37]),
       chunk=st.sampled_from([0, -1, 48]), mod=st.sampled_from(["none", "alibi", "cap"]),
       causal=st.booleans())
def test_packed_steps_of_several_pages(seed, T, pack, level, dtype, q_len, extra, window, chunk, mod,
                                       causal):
    """Prefill items pack up to PA_PACK_PAGES pages per step (pack1 / pack2: at most one /
    two; page sizes that are not a multiple of 8 always one): steps that end in a partial
    page, start inside the sequence (KV splits), are cut by the causal diagonal or a window,
    at every instruction set, against the float64 reference."""
    level = min(level, simd_level())
    rng = np.random.default_rng(seed)
    run_case(rng, q_lens=[q_len, 1, 9], kv_lens=[q_len + extra, 30, 9 + extra], H=8, Hkv=2, D=32,
             T=T, dtype=dtype, causal=causal, window_left=window, flags=pack, kv_chunk=chunk,
             alibi=mod == "alibi", soft_cap=5.0 if mod == "cap" else 0.0, max_simd=level)


# --- score modifiers --------------------------------------------------------

@pytest.mark.parametrize("window_left", [0, 1, 5, 16, 40, 1000])
@pytest.mark.parametrize("causal", [True, False])
def test_window(window_left, causal):
    rng = np.random.default_rng(window_left)
    run_case(rng, q_lens=[1, 20, 70], kv_lens=[100, 20, 90], H=8, Hkv=2, D=64, T=16,
             causal=causal, window_left=window_left)


@pytest.mark.parametrize("soft_cap", [0.5, 5.0, 30.0])
def test_soft_cap(soft_cap):
    rng = np.random.default_rng(3)
    # large scale so the cap actually bends scores, including near-zero ones
    run_case(rng, q_lens=[1, 9], kv_lens=[77, 40], H=8, Hkv=4, D=64, T=16, soft_cap=soft_cap,
             scale=0.5)
    run_case(rng, q_lens=[1, 9], kv_lens=[77, 40], H=8, Hkv=4, D=64, T=16, soft_cap=soft_cap,
             scale=1e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_alibi(causal):
    rng = np.random.default_rng(5)
    run_case(rng, q_lens=[1, 33, 4], kv_lens=[90, 33, 60], H=8, Hkv=2, D=64, T=16, causal=causal,
             alibi=True)


def test_all_modifiers_together():
    rng = np.random.default_rng(9)
    run_case(rng, q_lens=[1, 25, 3], kv_lens=[90, 60, 3], H=16, Hkv=4, D=96, T=8, alibi=True,
             soft_cap=20.0, window_left=12, scale=0.2)


def test_custom_scale():
    rng = np.random.default_rng(13)
    run_case(rng, q_lens=[2, 1], kv_lens=[50, 10], H=4, Hkv=2, D=64, T=16, scale=-0.3)


# --- storage dtypes -----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("D", [64, 80, 128, 20])
def test_half_storage(dtype, D):
    rng = np.random.default_rng(D)
    run_case(rng, q_lens=[1, 1, 17], kv_lens=[5, 100, 40], H=8, Hkv=2, D=D, T=16, dtype=dtype)
    run_case(rng, q_lens=[1, 1, 17], kv_lens=[5, 100, 40], H=8, Hkv=2, D=D, T=16, dtype=dtype,
             max_simd=0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_few_row_blocks(dtype):
    # 2..7 four-row blocks per KV head: read straight from the pool (no
    # packing), which for bf16 also means the permuted-unpack loads
    rng = np.random.default_rng(17)
    run_case(rng, q_lens=[1, 3, 2], kv_lens=[40, 70, 2], H=16, Hkv=2, D=64, T=16, dtype=dtype)
    run_case(rng, q_lens=[1, 3], kv_lens=[33, 50], H=16, Hkv=2, D=128, T=16, dtype=dtype,
             causal=False, alibi=True)


def test_ml_dtypes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 4], kv_lens=[30, 20], num_heads=4,
                                             num_kv_heads=2, head_dim=64, page_size=16,
                                             dtype="bfloat16")
    o1 = batch_paged_attention(q, ind, pages, 1, bt, kl)
    o2 = batch_paged_attention(q, ind, pages.view(ml_dtypes.bfloat16), 1, bt, kl)
    np.testing.assert_array_equal(o1, o2)


# --- execution strategies agree -------------------------------------------------

@pytest.mark.parametrize("chunk", [-1, 16, 32, 48, 1000])
@pytest.mark.parametrize("threads", [1, 2])
def test_kv_split_and_threads(chunk, threads):
    rng = np.random.default_rng(chunk + 100 * threads)
    for causal in (True, False):
        run_case(rng, q_lens=[1, 1, 70, 3], kv_lens=[300, 16, 200, 70], H=8, Hkv=2, D=64, T=16,
                 causal=causal, window_left=-1 if causal else 50, num_threads=threads,
                 kv_chunk=chunk)


def test_auto_split_single_long_sequence():
    rng = np.random.default_rng(21)
    run_case(rng, q_lens=[1], kv_lens=[5000], H=8, Hkv=2, D=64, T=16, num_threads=2)
    run_case(rng, q_lens=[2], kv_lens=[3001], H=4, Hkv=4, D=64, T=16, num_threads=2)


@pytest.mark.parametrize("D", [64, 80, 20])
def test_scalar_matches_simd(D):
    rng = np.random.default_rng(D)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 30, 2], kv_lens=[70, 30, 90],
                                             num_heads=8, num_kv_heads=2, head_dim=D, page_size=16)
    kw = dict(alibi_slopes=np.linspace(0.1, 0.3, 8, dtype=np.float32), soft_cap=10.0, window_left=40)
    a, la = batch_paged_attention(q, ind, pages, 1, bt, kl, return_lse=True, **kw)
    b, lb = tuned_attention(q, ind, pages, 1, bt, kl, return_lse=True, max_simd=0, **kw)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-5)
    ro, rl = reference(q, ind, K, V, alibi=kw["alibi_slopes"], soft_cap=10.0, window_left=40)
    np.testing.assert_allclose(b, ro, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env,want_level", [
    ({"PAGEDCY_FORCE_SCALAR": "1"}, 0),
    ({"PAGEDCY_SIMD": "scalar"}, 0),
    ({"PAGEDCY_SIMD": "avx2"}, min(1, simd_level())),
])
def test_simd_env_caps_subprocess(env, want_level):
    code = (
        "import sys, numpy as np; sys.path.insert(0, %r)\n"
        "from attn_helpers import make_batch, reference\n"
        "from pagedcy._libs._attention import batch_paged_attention, simd_enabled, simd_level\n"
        "from pagedcy._libs._threads import simd_path\n"
        "assert simd_level() == %d, (simd_level(), simd_path())\n"
        "assert simd_enabled() == (simd_level() > 0)\n"
        "rng = np.random.default_rng(0)\n"
        "q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 9], kv_lens=[50, 20], num_heads=8,"
        " num_kv_heads=2, head_dim=64, page_size=16, dtype='float16')\n"
        "o = batch_paged_attention(q, ind, pages, 1, bt, kl)\n"
        "ro, _ = reference(q, ind, K, V)\n"
        "np.testing.assert_allclose(o, ro, rtol=1e-3, atol=1e-3)\n"
        "print('ok')\n" % (os.path.dirname(__file__), want_level))
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("PAGEDCY_FORCE_SCALAR", "PAGEDCY_SIMD")}
    full_env.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("level", [0, 1, 2])
def test_every_simd_level_on_the_headline_shape(level):
    # 32/8 heads, head_dim 128, random page order: the benchmark's shape, at
    # page-boundary lengths, for fp32 and both 16-bit formats
    if level > simd_level():
        pytest.skip(f"this CPU (or PAGEDCY_SIMD) stops at SIMD level {simd_level()}")
    rng = np.random.default_rng(40 + level)
    for dtype in ("float32", "float16", "bfloat16", "int8"):
        run_case(rng, q_lens=[1, 1, 1, 1], kv_lens=[16, 17, 31, 200], H=32, Hkv=8, D=128, T=16,
                 dtype=dtype, max_simd=level, num_threads=2)


# --- API details ---------------------------------------------------------------

def test_out_argument_and_return_forms():
    rng = np.random.default_rng(2)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 3], kv_lens=[20, 10], num_heads=4,
                                             num_kv_heads=2, head_dim=64, page_size=16)
    out = np.full(q.shape, 7.0, dtype=np.float32)
    r = batch_paged_attention(q, ind, pages, 1, bt, kl, out=out)
    assert r is out
    ro, _ = reference(q, ind, K, V)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    # float64 / float16 queries are converted
    r64 = batch_paged_attention(q.astype(np.float64), ind, pages, 1, bt, kl.astype(np.int64))
    np.testing.assert_allclose(r64, ro, rtol=1e-5, atol=1e-5)
    # non-contiguous query is copied
    qn = np.repeat(q, 2, axis=2)[:, :, ::2]
    np.testing.assert_allclose(batch_paged_attention(qn, ind, pages, 1, bt, kl), ro,
                               rtol=1e-5, atol=1e-5)


def test_empty_inputs():
    rng = np.random.default_rng(4)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[0, 2, 0], kv_lens=[0, 5, 7], num_heads=4,
                                             num_kv_heads=2, head_dim=64, page_size=16)
    o, l = batch_paged_attention(q, ind, pages, 1, bt, kl, return_lse=True)
    ro, rl = reference(q, ind, K, V)
    np.testing.assert_allclose(o, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l, rl, rtol=1e-5, atol=1e-5)
    # no queries at all
    e = batch_paged_attention(np.zeros((0, 4, 64), np.float32), np.zeros(1, np.int32), pages, 1,
                              np.zeros((0, 4), np.int32), np.zeros(0, np.int32))
    assert e.shape == (0, 4, 64)


def test_lse_matches_reference_and_merge_split_halves():
    rng = np.random.default_rng(6)
    H, Hkv, D, T = 8, 2, 64, 16
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 1], kv_lens=[160, 97], num_heads=H,
                                             num_kv_heads=Hkv, head_dim=D, page_size=T)
    full, lfull = batch_paged_attention(q, ind, pages, 1, bt, kl, causal=False, return_lse=True)
    # first half: the first 3 pages of each sequence; second half: the rest,
    # via a block table that starts later (positions only matter for the mask)
    cut = 3 * T
    bt2 = np.full_like(bt, -1)
    n2 = [(n - cut + T - 1) // T for n in kl]
    for b in range(2):
        bt2[b, :n2[b]] = bt[b, 3:3 + n2[b]]
    va, sa = batch_paged_attention(q, ind, pages, 1, bt, np.array([cut, cut], np.int32),
                                   causal=False, return_lse=True)
    vb, sb = batch_paged_attention(q, ind, pages, 1, bt2, kl - cut, causal=False, return_lse=True)
    v, s = merge_states(va, sa, vb, sb)
    np.testing.assert_allclose(v, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, lfull, rtol=1e-5, atol=1e-5)
    v2, s2 = merge_states([va, vb], [sa, sb])
    np.testing.assert_allclose(v2, v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s2, s, rtol=1e-6, atol=1e-6)


def test_merge_states_empty_partials():
    rng = np.random.default_rng(8)
    v = rng.standard_normal((3, 2, 8)).astype(np.float32)
    s = rng.standard_normal((3, 2)).astype(np.float32)
    empty_v = np.full_like(v, np.nan)      # an empty partial's values must not leak
    empty_s = np.full_like(s, -np.inf)
    mv, ms = merge_states(v, s, empty_v, empty_s)
    np.testing.assert_allclose(mv, v, rtol=1e-6)
    np.testing.assert_allclose(ms, s, rtol=1e-6)
    mv, ms = merge_states(empty_v, empty_s, empty_v, empty_s)
    assert np.all(mv == 0) and np.all(ms == -np.inf)
    # three-way merge equals the closed form
    vs = [rng.standard_normal((3, 2, 8)).astype(np.float32) for _ in range(3)]
    ss = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(3)]
    mv, ms = merge_states(vs, ss)
    stot = np.logaddexp.reduce(np.stack(ss).astype(np.float64), axis=0)
    want = sum(np.exp(si - stot)[..., None] * vi for si, vi in zip(ss, vs))
    np.testing.assert_allclose(ms, stot, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mv, want, rtol=1e-5, atol=1e-6)


def test_merge_states_errors():
    v = np.zeros((2, 3, 4), np.float32)
    s = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError):
        merge_states(v, s, v[:1], s[:1])
    with pytest.raises(ValueError):
        merge_states(v, s[:, :2], v, s)
    with pytest.raises(TypeError):
        merge_states(v.astype(np.int32), s, v, s)
    with pytest.raises(TypeError):
        merge_states(v, s)
    with pytest.raises(ValueError):
        merge_states([v, v], [s])
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # shapes are refused before the float32 cast
        with pytest.raises(ValueError):
            merge_states(0.0, 3.4028235677973366e+38, 0.0, 0.0)
        with pytest.raises(ValueError):
            merge_states(v, np.full((3, 2), 1e300), v, s)


def test_read_bandwidth():
    bw = read_bandwidth(nbytes=8 * 2**20, num_threads=1, repeats=2)
    assert bw > 0.1
    with pytest.raises(ValueError):
        read_bandwidth(nbytes=10)
    with pytest.raises(ValueError):
        read_bandwidth(repeats=0)
    ones = np.ones(4096, np.float32)
    # a tiny buffer only exercises the path: its GB/s is all fork/join noise
    bw = read_bandwidth(num_threads=2, repeats=1, buffer=ones)
    assert np.isfinite(bw) and bw > 0
    with pytest.raises(TypeError):
        read_bandwidth(buffer=ones.astype(np.float64))
    with pytest.raises(ValueError):
        read_bandwidth(buffer=ones[::2])
    with pytest.raises(ValueError):
        read_bandwidth(buffer=ones[:100])
    with pytest.raises(ValueError):                    # the checksum sees a buffer not all ones
        read_bandwidth(buffer=np.zeros(4096, np.float32))


@pytest.mark.parametrize("simd", [0, 1, 2])
def test_fma_rate(simd):
    # the probe checks its own chains' checksum (a dropped FMA raises); here only the API
    r = fma_rate(1, simd, repeats=1, rounds=20000)
    assert np.isfinite(r) and r > 0
    with pytest.raises(ValueError):
        fma_rate(1, 3)
    with pytest.raises(ValueError):
        fma_rate(1, -1)
    with pytest.raises(ValueError):
        fma_rate(1, 1, repeats=0)
    with pytest.raises(TypeError):
        fma_rate(1, 1.5)


def _walk_reference(x, page_bytes, streams, row_bytes, seed):
    """float64 sum of page_read_bandwidth's reads, in its order: a page read twice or
    skipped, or a row read from the wrong place, changes the sum of distinct values."""
    pf, rf = page_bytes // 4, row_bytes // 4
    npages = x.size // pf
    order = np.random.default_rng(seed).permutation(npages)
    total = 0.0
    for g in range(0, npages, streams):
        group = order[g:g + streams]
        for r in range(pf // rf):
            for p in group:
                total += x[p * pf + r * rf:p * pf + (r + 1) * rf].astype(np.float64).sum()
    return total, npages * pf


@settings(max_examples=40, deadline=None)
@given(npages=st.integers(1, 12), extra=st.integers(0, 300), rows=st.integers(1, 4),
       row_lines=st.integers(1, 3), streams=st.integers(1, 5), seed=st.integers(0, 3))
def test_page_walk_reads_every_page_once(npages, extra, rows, row_lines, streams, seed):
    row_bytes = 64 * row_lines
    page_bytes = rows * row_bytes
    # integers, so float32 sums are exact; each page's sum is 64 * (page + 1) * floats plus
    # less than 8 * floats of noise, so reading one page twice and another not shows
    n = npages * page_bytes // 4 + extra
    pf = page_bytes // 4
    page = np.minimum(np.arange(n) // pf, npages)
    x = (np.random.default_rng(seed).integers(-7, 8, n) + 64 * (page + 1)).astype(np.float32)
    want, nread = _walk_reference(x, page_bytes, streams, row_bytes, seed)
    assert nread <= n
    got = _page_walk_sum(x, page_bytes, streams, row_bytes, seed)
    assert got == want


def test_page_walk_skips_a_partial_page():
    page_bytes, npages = 1024, 6
    x = np.repeat(np.arange(1, npages + 1, dtype=np.float32), page_bytes // 4)
    y = np.concatenate([x, np.full(100, 1e6, np.float32)])
    for seed in range(3):
        assert _page_walk_sum(y, page_bytes, 4, 512, seed) == float(x.sum())


def test_page_read_bandwidth():
    ones = np.ones(64 * 1024, np.float32)              # 256 KiB: 2 pages of 128 KiB
    for threads in (1, 2):
        bw = page_read_bandwidth(num_threads=threads, repeats=1, buffer=ones)
        assert np.isfinite(bw) and bw > 0
    assert page_read_bandwidth(4096, 8 * 2**20, num_threads=1, repeats=1, streams=3) > 0.1
    with pytest.raises(ValueError):                    # the checksum sees a buffer not all ones
        page_read_bandwidth(4096, buffer=np.zeros(4096, np.float32))
    with pytest.raises(TypeError):
        page_read_bandwidth(buffer=ones.astype(np.float64))
    with pytest.raises(ValueError):
        page_read_bandwidth(buffer=ones[::2])
    with pytest.raises(ValueError):                    # no whole page
        page_read_bandwidth(page_bytes=2**20, buffer=ones)
    with pytest.raises(ValueError):
        page_read_bandwidth(nbytes=100)
    with pytest.raises(ValueError):
        _page_walk_sum(ones, 1024, 4, 768)


# --- validation -------------------------------------------------------------------

@pytest.fixture
def good():
    rng = np.random.default_rng(0)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 2], kv_lens=[20, 5], num_heads=4,
                                             num_kv_heads=2, head_dim=64, page_size=16,
                                             extra_pages=0)
    return dict(query=q, qo_indptr=ind, kv_pages=pages, layer=1, block_tables=bt, kv_lens=kl)


def _call(args, **kw):
    a = dict(args)
    a.update(kw)
    return batch_paged_attention(a.pop("query"), a.pop("qo_indptr"), a.pop("kv_pages"),
                                 a.pop("layer"), a.pop("block_tables"), a.pop("kv_lens"), **a)


def test_good_call_runs(good):
    assert np.all(np.isfinite(_call(good)))


@pytest.mark.parametrize("mutate,exc", [
    (lambda g: dict(query=g["query"].astype(np.int32)), TypeError),
    (lambda g: dict(query=g["query"][0]), ValueError),
    (lambda g: dict(query=g["query"][:, :, :32]), ValueError),                 # head_dim mismatch
    (lambda g: dict(query=np.zeros((3, 3, 64), np.float32)), ValueError),       # 3 % 2 heads
    (lambda g: dict(kv_pages=g["kv_pages"].astype(np.float64)), TypeError),
    (lambda g: dict(kv_pages=np.zeros(g["kv_pages"].shape, np.int16)), TypeError),
    (lambda g: dict(kv_pages=g["kv_pages"][0]), ValueError),
    (lambda g: dict(kv_pages=g["kv_pages"][:, :, :1]), ValueError),
    (lambda g: dict(kv_pages=np.zeros(g["kv_pages"].shape[:-1] + (2 * g["kv_pages"].shape[-1],),
                                      g["kv_pages"].dtype)[..., ::2]), ValueError),  # strided rows
    (lambda g: dict(kv_pages=g["kv_pages"][::-1]), ValueError),                 # negative stride
    (lambda g: dict(kv_pages=g["kv_pages"].tolist()), TypeError),
    (lambda g: dict(layer=2), IndexError),
    (lambda g: dict(layer=-1), IndexError),
    (lambda g: dict(layer=1.0), TypeError),
    (lambda g: dict(block_tables=g["block_tables"].astype(np.float32)), TypeError),
    (lambda g: dict(block_tables=g["block_tables"][0]), ValueError),
    (lambda g: dict(block_tables=g["block_tables"][:1]), ValueError),
    (lambda g: dict(block_tables=np.where(g["block_tables"] == g["block_tables"][0, 1], 99,
                                          g["block_tables"])), IndexError),
    (lambda g: dict(block_tables=np.where(g["block_tables"] == g["block_tables"][1, 0], -1,
                                          g["block_tables"])), IndexError),
    (lambda g: dict(block_tables=g["block_tables"][:, :1]), ValueError),        # capacity
    (lambda g: dict(kv_lens=np.array([20, -1], np.int32)), ValueError),
    (lambda g: dict(kv_lens=np.array([20, 1], np.int32)), ValueError),         # q_len > kv_len
    (lambda g: dict(kv_lens=np.array([20], np.int32)), ValueError),
    (lambda g: dict(kv_lens=np.array([20.0, 5.0])), TypeError),
    (lambda g: dict(qo_indptr=np.array([0, 1], np.int32)), ValueError),
    (lambda g: dict(qo_indptr=np.array([1, 1, 3], np.int32)), ValueError),
    (lambda g: dict(qo_indptr=np.array([0, 2, 1], np.int32)), ValueError),
    (lambda g: dict(qo_indptr=np.array([0, 1, 4], np.int32)), ValueError),
    (lambda g: dict(qo_indptr=np.array([[0, 1, 3]], np.int32)), ValueError),
    (lambda g: dict(alibi_slopes=np.ones(3, np.float32)), ValueError),
    (lambda g: dict(alibi_slopes=np.array(["a"] * 4)), TypeError),
    (lambda g: dict(window_left=-2), ValueError),
    (lambda g: dict(soft_cap=-1.0), ValueError),
    (lambda g: dict(soft_cap=float("nan")), ValueError),
    (lambda g: dict(scale=float("inf")), ValueError),
    (lambda g: dict(scale=float("nan")), ValueError),
    (lambda g: dict(out=np.zeros((3, 4, 64), np.float64)), TypeError),
    (lambda g: dict(out=np.zeros((3, 4, 32), np.float32)), ValueError),
    (lambda g: dict(out=np.zeros((3, 4, 128), np.float32)[:, :, ::2]), ValueError),
    (lambda g: dict(num_threads=0), ValueError),
])
def test_bad_inputs(good, mutate, exc):
    with pytest.raises(exc):
        _call(good, **mutate(good))


# --- property test -------------------------------------------------------------------

@st.composite
def batches(draw):
    Hkv = draw(st.sampled_from([1, 2, 4]))
    G = draw(st.sampled_from([1, 2, 4, 8]))
    D = draw(st.sampled_from([8, 16, 64, 80, 12]))
    T = draw(st.sampled_from([1, 2, 5, 8, 16]))
    B = draw(st.integers(1, 4))
    kv_lens = draw(st.lists(st.integers(0, 80), min_size=B, max_size=B))
    q_lens = [draw(st.integers(0, min(n, 20))) for n in kv_lens]
    return dict(Hkv=Hkv, H=Hkv * G, D=D, T=T, kv_lens=kv_lens, q_lens=q_lens,
                causal=draw(st.booleans()),
                window_left=draw(st.sampled_from([-1, -1, 0, 3, 17])),
                soft_cap=draw(st.sampled_from([0.0, 0.0, 2.0])),
                alibi=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float32", "float32", "float16", "bfloat16", "int8"])),
                chunk=draw(st.sampled_from([0, -1, 1, 16, 40])),
                threads=draw(st.sampled_from([1, 2])),
                simd=draw(st.sampled_from([0, 1, 2])),
                seed=draw(st.integers(0, 2**31)))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_property_matches_reference(c):
    rng = np.random.default_rng(c["seed"])
    run_case(rng, q_lens=c["q_lens"], kv_lens=c["kv_lens"], H=c["H"], Hkv=c["Hkv"], D=c["D"],
             T=c["T"], dtype=c["dtype"], causal=c["causal"], window_left=c["window_left"],
             soft_cap=c["soft_cap"], alibi=c["alibi"], num_threads=c["threads"],
             kv_chunk=c["chunk"], max_simd=c["simd"])


def _cpu_simd_level():
    """The level the CPU flags in /proc/cpuinfo allow (None where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return None
    flags = set(line.split(":", 1)[-1].split())
    if {"avx512f", "avx512dq", "avx512vl", "avx512bw", "avx2", "fma", "f16c"} <= flags:
        return 2
    return 1 if {"avx2", "fma", "f16c"} <= flags else 0


def test_simd_level_is_the_cpus_best():
    # without PAGEDCY_SIMD / PAGEDCY_FORCE_SCALAR the kernels run the best
    # instruction set the CPU has (a detection bug would silently cost speed)
    want = _cpu_simd_level()
    if want is None or os.environ.get("PAGEDCY_SIMD") or os.environ.get("PAGEDCY_FORCE_SCALAR"):
        pytest.skip("no /proc/cpuinfo, or the SIMD level is capped by the environment")
    assert simd_level() == want
    assert simd_enabled() is (want > 0)


@pytest.mark.parametrize("name", sorted(_TUNE_FLAGS))
def test_every_tuning_flag_matches_reference(name):
    # the private switches change the work split, packing, prefetching and
    # kernel variants, never the result: a decode batch, a prefill batch and
    # bf16 (whose AVX2 decode loads have their own lane order)
    rng = np.random.default_rng(len(name))
    for dtype in ("float32", "bfloat16", "int8"):
        for level in SIMD_LEVELS + [0]:
            run_case(rng, q_lens=[1, 40, 3], kv_lens=[90, 70, 33], H=8, Hkv=2, D=64, T=16,
                     dtype=dtype, num_threads=2, max_simd=level, flags=(name,))


def test_unknown_tuning_flag():
    good = make_batch(np.random.default_rng(0), q_lens=[1], kv_lens=[5], num_heads=2,
                      num_kv_heads=1, head_dim=8, page_size=4)[:5]
    with pytest.raises(ValueError, match="unknown tuning flag"):
        tuned_attention(*good[:3], 1, *good[3:], flags=("no_such_flag",))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("Hkv, D", [(2, 64), (2, 80), (4, 128)])
def test_prefetch_pattern_never_changes_results(dtype, aligned, Hkv, D):
    # The kernel prefetches the next page by 4 KiB page (aligned pools, items with
    # every KV head -- one thread here -- and K/V blocks of 2*16*Hkv*D*itemsize a
    # multiple of 4 KiB), by row (otherwise, or with the private flag "pf_rows"), whole
    # or only the start of each ("pf_partial"), or not at all ("no_prefetch"):
    # prefetches never touch the numbers, so all give the same bits, and the
    # reference agrees.
    rng = np.random.default_rng(Hkv * 1000 + D)
    q, ind, pages, bt, kl, K, V = make_batch(rng, q_lens=[1, 1, 3, 1], kv_lens=[70, 33, 97, 16],
                                             num_heads=4 * Hkv, num_kv_heads=Hkv, head_dim=D,
                                             page_size=16, dtype=dtype, aligned=aligned)
    assert (pages.ctypes.data % 4096 == 0) == aligned
    ro, _ = reference(q, ind, K, V)
    for level, threads in [(lv, t) for lv in SIMD_LEVELS for t in (1, 2)]:
        outs = [tuned_attention(q, ind, pages, 1, bt, kl, num_threads=threads, max_simd=level,
                                flags=fl)
                for fl in ((), ("pf_rows",), ("no_prefetch",), ("pf_partial",), ("pf_rows", "pf_partial"))]
        assert all(np.array_equal(outs[0], o) for o in outs[1:])
        np.testing.assert_allclose(outs[0], ro, rtol=TOL[dtype], atol=TOL[dtype])
