"""The int8 KV cache: quantization on write, the kernels on int8 pages, and the
serving layer (manager, fork/CoW, swap, prefix cache) on an int8 pool."""
import os
import sys

import numpy as np
import pytest

from pagedcy import PagedKVCacheConfig
from pagedcy._libs._attention import _batch_paged_attention_tuned as tuned_attention
from pagedcy._libs._attention import simd_level
from pagedcy._libs._manager_ops import write_token_rows
from pagedcy._libs._store import KVPageStore
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager

sys.path.insert(0, os.path.dirname(__file__))
from attn_helpers import quantize_int8, reference  # noqa: E402

LEVELS = sorted({0, 1, 2} & set(range(simd_level() + 1)))


def _store(dtype, Hkv=2, D=64, T=16, pages=24, layers=2):
    return KVPageStore(PagedKVCacheConfig(T, pages, layers, Hkv, D, dtype=dtype))


def test_bytes_per_token_at_head_dim_128():
    # int8 rows: 128 values + a 4-byte scale = 132 bytes against 512 for float32
    i8 = PagedKVCacheConfig(16, 4, 2, 8, 128, dtype="int8").bytes_per_page()
    f32 = PagedKVCacheConfig(16, 4, 2, 8, 128, dtype="float32").bytes_per_page()
    assert i8 / f32 == pytest.approx(132 / 512) and i8 / f32 <= 0.27


def test_store_writes_the_documented_format():
    st = _store("int8")
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((37, 2, 64)) * rng.uniform(0.01, 100, (37, 2, 1))).astype(np.float32)
    v = rng.standard_normal((37, 2, 64)).astype(np.float32)
    bt = rng.permutation(24)[:3].astype(np.int32)
    st.write(bt, 1, 0, k, v)
    pages = st.pages()
    assert pages.dtype == np.int8 and pages.shape == (24, 2, 2, 16, 2, 68)
    rows = np.concatenate([pages[p, 1, 0] for p in bt])[:37]
    want, deq = quantize_int8(k)
    assert rows.tobytes() == want.tobytes()
    # q * s is exact in float64, so its float32 rounding is the float32 product
    np.testing.assert_array_equal(st.read(bt, 1, "k", 0, 37, float32=True),
                                  deq.astype(np.float32).reshape(37, -1))
    np.testing.assert_array_equal(st.read(bt, 1, "k", 0, 37), want.reshape(37, -1))
    # symmetric quantization error: at most half a step of each row's scale
    step = np.abs(k).max(axis=-1, keepdims=True) / 127
    assert np.all(np.abs(deq - k) <= step / 2 * (1 + 1e-5))


def test_write_token_rows_quantizes_too():
    st = _store("int8")
    rng = np.random.default_rng(1)
    k = rng.standard_normal((5, 128)).astype(np.float32)
    pages = np.array([3, 3, 7, 1, 7], np.int32)
    offs = np.array([0, 5, 2, 15, 3], np.int32)
    write_token_rows(st, pages, offs, 0, k, -k)
    want = quantize_int8(k.reshape(5, 2, 64))[0]
    got = st.pages()[pages, 0, 0, offs]
    assert got.tobytes() == want.tobytes()
    assert st.pages()[pages, 0, 1, offs].tobytes() == quantize_int8(-k.reshape(5, 2, 64))[0].tobytes()


def test_nonfinite_values_saturate_within_their_row():
    # Documented behaviour: NaN stores 0, +-Inf store +-127 times the row's scale, which
    # comes from the row's finite values. Other rows (tokens, heads) are untouched.
    st = _store("int8")
    rng = np.random.default_rng(2)
    k = rng.standard_normal((20, 2, 64)).astype(np.float32)
    v = rng.standard_normal((20, 2, 64)).astype(np.float32)
    bad_k, bad_v = k.copy(), v.copy()
    bad_k[3, 0, 5] = np.nan
    bad_k[4, 1, 0] = np.inf
    bad_v[4, 1, 9] = -np.inf
    bad_v[7, 0, :] = np.nan                       # a row with nothing finite: all zeros
    bt = np.array([5, 9], np.int32)
    st.write(bt, 0, 0, bad_k, bad_v)
    rk = st.read(bt, 0, "k", 0, 20, float32=True).reshape(20, 2, 64)
    rv = st.read(bt, 0, "v", 0, 20, float32=True).reshape(20, 2, 64)
    clean_k, clean_v = (quantize_int8(x)[1].astype(np.float32) for x in (k, v))
    touched = {(3, 0), (4, 1), (7, 0)}
    for t in range(20):
        for h in range(2):
            if (t, h) not in touched:
                np.testing.assert_array_equal(rk[t, h], clean_k[t, h])
                np.testing.assert_array_equal(rv[t, h], clean_v[t, h])
    s = np.abs(np.delete(k[3, 0], 5)).max() / 127
    assert rk[3, 0, 5] == 0 and np.isclose(rk[4, 1, 0], 127 * np.abs(k[4, 1, 1:]).max() / 127)
    assert rv[4, 1, 9] == pytest.approx(-np.abs(np.delete(v[4, 1], 9)).max(), rel=1e-6)
    assert np.all(rv[7, 0] == 0) and s > 0
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    for level in LEVELS:
        o = tuned_attention(q, [0, 1], st.pages(), 0, bt[None], [20], max_simd=level)
        assert np.isfinite(o).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("q_len", [1, 40])
def test_matches_dequantized_reference_and_stays_close_to_float32(level, q_len):
    # The kernel is exact (float32 rounding) on the dequantized K/V, and on N(0,1) data
    # int8 storage moves the output by well under 2% of its norm.
    rng = np.random.default_rng(level * 10 + q_len)
    n, H, Hkv, D = 300, 16, 4, 128
    k = rng.standard_normal((n, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((n, Hkv, D)).astype(np.float32)
    q = rng.standard_normal((q_len, H, D)).astype(np.float32)
    bt = rng.permutation(24)[:19].astype(np.int32)
    outs = {}
    for dtype in ("int8", "float32"):
        st = _store(dtype, Hkv=Hkv, D=D)
        st.write(bt, 1, 0, k, v)
        outs[dtype] = tuned_attention(q, [0, q_len], st.pages(), 1, bt[None], [n], max_simd=level,
                                      num_threads=2)
    ref, _ = reference(q, np.array([0, q_len]), [quantize_int8(k)[1]], [quantize_int8(v)[1]])
    np.testing.assert_allclose(outs["int8"], ref, rtol=1e-5, atol=1e-5)
    rel = np.linalg.norm(outs["int8"] - outs["float32"]) / np.linalg.norm(outs["float32"])
    assert rel <= 2e-2, rel


def test_manager_fork_cow_swap_and_prefix_cache_on_int8():
    cfg = PagedKVCacheConfig(4, 16, 2, 2, 16, dtype="int8")
    m = PagedKVCacheManager(cfg, enable_prefix_cache=True, swap_pages=8)
    rng = np.random.default_rng(3)
    prompt = np.arange(10)
    data = {L: (rng.standard_normal((10, 32)).astype(np.float32),
                rng.standard_normal((10, 32)).astype(np.float32)) for L in range(2)}
    a = m.allocate(AllocationRequest(prompt_tokens=prompt))
    for L in range(2):
        m.write_kv_tokens(a, L, 0, *data[L])
    raw = [m.read_kv(a, L, 0, 10, float32=False) for L in range(2)]
    assert raw[0][0].dtype == np.int8 and raw[0][0].shape == (10, 2, 20)
    # a prefix hit shares the two full prompt pages
    b = m.allocate(AllocationRequest(prompt_tokens=prompt))
    assert b.num_cached_tokens() == 8
    # fork, then copy-on-write: the parent keeps its bytes
    c = m.fork(a)
    m.write_kv(c, 0, 2, np.full(32, 5.0), np.full(32, -5.0))
    assert all(x.tobytes() == y.tobytes() for x, y in zip(m.read_kv(a, 0, 0, 10, float32=False), raw[0]))
    kc, vc = m.read_kv(c, 0, 2, 1)
    np.testing.assert_array_equal(kc, 5.0)
    np.testing.assert_array_equal(vc, -5.0)
    # swap out and back: bit-exact
    m.swap_out(a)
    m.swap_in(a)
    for L in range(2):
        got = m.read_kv(a, L, 0, 10, float32=False)
        assert got[0].tobytes() == raw[L][0].tobytes() and got[1].tobytes() == raw[L][1].tobytes()
    # attention through the manager agrees with the reference on the dequantized values
    q = rng.standard_normal((1, 4, 16)).astype(np.float32)
    out = m.attention(1, q, [a])
    K = [quantize_int8(data[1][0].reshape(10, 2, 16))[1]]
    V = [quantize_int8(data[1][1].reshape(10, 2, 16))[1]]
    ref, _ = reference(q, np.array([0, 1]), K, V)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    m.check_invariants()


# ---- quantize_query: integer q.k on int8-quantized queries --------------------------------
from pagedcy._libs._attention import _vnni_paths  # noqa: E402
from attn_helpers import make_batch  # noqa: E402

# (max_simd, tuning flags, VNNI kernel it needs): every dot-product kernel of the path
QK8_PATHS = {
    "scalar": (0, 0, None),
    "avx2_maddubs": (1, "no_vnni", None),
    "avx_vnni": (1, 0, "avx_vnni"),
    "avx512_no_vnni": (2, "no_vnni", None),
    "avx512_vnni": (2, 0, "avx512_vnni"),
}


# The integer P.V's share of the documented bound: 64 * 128 / 65534 times the largest V row
# scale (max|v[t]| / 127 for quantizer-made rows), per output element.
PV8_FACTOR = 64 * 128 / 65534 / 127


def _pv8_bound(V):
    """Output bound of the integer P.V (pagedcy_attn_types.h) for one sequence's V [T, D]."""
    return PV8_FACTOR * np.abs(V).max()


def _qk8_bound(q, indptr, Ks, Vs, scale):
    """Per (query row, head): E, the documented bound on a score's error (max over the
    sequence's keys of max|q*scale| / 254 * sum_d |k[t][d]|), and the output bound
    (exp(2E) - 1) * max_t |v[t][d]| per element, plus the integer P.V's."""
    total_q, H, D = q.shape
    E = np.zeros((total_q, H))
    out_b = np.zeros((total_q, H, D))
    for b in range(len(Ks)):
        K, V = Ks[b], Vs[b]
        G = H // K.shape[1]
        for h in range(H):
            g = h // G
            qs = np.abs(q[indptr[b]:indptr[b + 1], h].astype(np.float32) * np.float32(scale)).max(axis=1)
            e = qs.astype(np.float64) / 254 * np.abs(K[:, g]).sum(axis=1).max()
            E[indptr[b]:indptr[b + 1], h] = e
            out_b[indptr[b]:indptr[b + 1], h] = (np.expm1(2 * e)[:, None] * np.abs(V[:, g]).max(axis=0)
                                                 + _pv8_bound(V[:, g]))
    return E, out_b


@pytest.mark.parametrize("path", sorted(QK8_PATHS))
@pytest.mark.parametrize("seed", range(4))
def test_quantized_query_within_the_documented_bound(path, seed):
    level, flags, needs = QK8_PATHS[path]
    if level > simd_level():
        pytest.skip(f"{path}: the CPU's SIMD level is {simd_level()}")
    if needs and needs not in _vnni_paths():
        pytest.skip(f"{path}: this CPU (or build) has no {needs}")
    rng = np.random.default_rng(seed)
    D = (32, 64, 128, 256)[seed]
    Hkv = int(rng.integers(1, 4))
    G = int(rng.choice([1, 4, 8]))
    B = int(rng.integers(1, 4))
    q_lens = [int(x) for x in rng.integers(1, 3, B)]
    kv_lens = [int(max(ql, x)) for ql, x in zip(q_lens, rng.integers(1, 150, B))]
    q, ind, pages, bt, lens, Ks, Vs = make_batch(
        rng, q_lens=q_lens, kv_lens=kv_lens, num_heads=G * Hkv, num_kv_heads=Hkv, head_dim=D,
        page_size=int(rng.choice([8, 16])), dtype="int8")
    q *= rng.uniform(0.5, 3)                       # scores far from 0: softmax is not flat
    scale = 1 / np.sqrt(D)
    ref, ref_lse = reference(q, ind, Ks, Vs)
    got, lse = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=level, flags=flags,
                               quantize_query=True, return_lse=True, num_threads=2)
    plain = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=level, flags=flags)
    E, out_b = _qk8_bound(q, ind, Ks, Vs, scale)
    tol = 2e-5                                    # float32 rounding of the rest of the kernel
    assert np.all(np.abs(lse - ref_lse) <= E * (1 + 1e-3) + tol * np.maximum(1, np.abs(ref_lse)))
    assert np.all(np.abs(got - ref) <= out_b * (1 + 1e-3) + tol)
    # the option took effect: the rounding of q shows against the float path
    assert not np.array_equal(got, plain)


@pytest.mark.parametrize("path", sorted(QK8_PATHS))
@pytest.mark.parametrize("seed", range(3))
def test_integer_pv_chunks_within_the_bound(path, seed):
    # Large pages: a step's P.V spans several 64-token chunks (each its own int16 scale),
    # odd visible ranges end on half a token pair, and rows of 0 weight (padding) stay 0.
    level, flags, needs = QK8_PATHS[path]
    if level > simd_level():
        pytest.skip(f"{path}: the CPU's SIMD level is {simd_level()}")
    if needs and needs not in _vnni_paths():
        pytest.skip(f"{path}: this CPU (or build) has no {needs}")
    rng = np.random.default_rng(100 + seed)
    D = (64, 128, 32)[seed]
    q_lens = [1, 2, 1]
    kv_lens = [int(x) for x in rng.integers(60, 400, 3)]
    q, ind, pages, bt, lens, Ks, Vs = make_batch(
        rng, q_lens=q_lens, kv_lens=kv_lens, num_heads=6, num_kv_heads=2, head_dim=D,
        page_size=int(rng.choice([64, 128])), dtype="int8")
    ref, _ = reference(q, ind, Ks, Vs)
    got = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=level, flags=flags,
                          quantize_query=True, num_threads=2)
    _, out_b = _qk8_bound(q, ind, Ks, Vs, 1 / np.sqrt(D))
    assert np.all(np.abs(got - ref) <= out_b * (1 + 1e-3) + 2e-5)
    # against the scalar kernel: both within the P.V bound of each other (weights that
    # differ in float rounding may round to neighbouring int16 steps)
    base = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=0, quantize_query=True)
    pv_b = np.concatenate([np.broadcast_to(_pv8_bound(Vs[b]), (ql, 6, D)) for b, ql in enumerate(q_lens)])
    assert np.all(np.abs(got - base) <= 2 * pv_b + 2e-5)


@pytest.mark.parametrize("level", LEVELS)
def test_quantized_query_agrees_across_kernels_and_leaves_float_pages_alone(level):
    # Every kernel rounds q the same way, so they agree to float32 rounding plus twice the
    # integer P.V's bound (its int16 weights may round apart, and some paths keep a float
    # P.V); on float pages (and prefill blocks of 32+ query vectors per KV head) the option
    # changes nothing.
    rng = np.random.default_rng(7 + level)
    q, ind, pages, bt, lens, Ks, Vs = make_batch(
        rng, q_lens=[1, 2, 40], kv_lens=[300, 77, 90], num_heads=8, num_kv_heads=2, head_dim=128,
        page_size=16, dtype="int8")
    ref = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=0, quantize_query=True)
    for flags in (0, "no_vnni"):
        got = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=level, flags=flags,
                              quantize_query=True, num_threads=2)
        pv_b = np.concatenate([np.broadcast_to(_pv8_bound(Vs[b]), (ql, 8, 128))
                               for b, ql in enumerate([1, 2, 40])])
        assert np.all(np.abs(got - ref) <= 2 * pv_b + 1e-5 * np.abs(ref) + 2e-6)
    # the 40-row prefill sequence runs packed (float32 scores) either way
    plain = tuned_attention(q, ind, pages, 1, bt, lens, max_simd=level)
    np.testing.assert_allclose(ref[3:], plain[3:], rtol=1e-5, atol=2e-6)
    qf, indf, pf, btf, lensf, _, _ = make_batch(
        rng, q_lens=[1, 3], kv_lens=[50, 20], num_heads=4, num_kv_heads=2, head_dim=64,
        page_size=16, dtype="float16")
    a = tuned_attention(qf, indf, pf, 1, btf, lensf, max_simd=level, quantize_query=True)
    b = tuned_attention(qf, indf, pf, 1, btf, lensf, max_simd=level)
    np.testing.assert_array_equal(a, b)
