"""pagedcy._libs._layers kernels against NumPy float64 references, and their input checks."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagedcy._libs import _layers

SET = settings(max_examples=40, deadline=None)


def rms_ref(x, w, eps):
    x = x.astype(np.float64)
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def rope_ref(x, pos, inv):
    """rotate_half RoPE in float64: x [n, heads, D], pos [n]."""
    half = x.shape[-1] // 2
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


@SET
@given(n=st.integers(0, 70), d=st.integers(1, 300), fused=st.booleans(), seed=st.integers(0, 2**16),
       threads=st.sampled_from([1, 2]))
def test_rms_norm(n, d, fused, seed, threads):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d), dtype=np.float32) * 3
    w = rng.standard_normal(d, dtype=np.float32)
    res = rng.standard_normal((n, d), dtype=np.float32)
    res0 = res.copy()
    out = np.full((n, d), np.nan, np.float32)
    _layers.rms_norm(x, w, 1e-5, out, res if fused else None, threads)
    if fused:
        want_res = res0.astype(np.float64) + x
        np.testing.assert_allclose(res, want_res, rtol=1e-6, atol=1e-6)
        want = rms_ref(want_res, w, 1e-5)
    else:
        want = rms_ref(x, w, 1e-5)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_threaded_path_in_place():
    """Calls above PARALLEL_ELEMENTS split rows over threads: same results."""
    rng = np.random.default_rng(0)
    d = 512
    n = _layers.PARALLEL_ELEMENTS // d + 3
    x = rng.standard_normal((n, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    want = rms_ref(x, w, 1e-6)
    _layers.rms_norm(x, w, 1e-6, x, None, 2)  # out may be x itself
    np.testing.assert_allclose(x, want, rtol=2e-5, atol=2e-5)
    gu = 3 * x  # [n, d] = gate | up, above the threshold too
    out = np.empty((n, d // 2), np.float32)
    _layers.silu_mul(gu, out, 2)
    g, u = gu[:, :d // 2].astype(np.float64), gu[:, d // 2:].astype(np.float64)
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


@SET
@given(n=st.integers(0, 40), heads=st.integers(1, 4), group=st.integers(1, 3),
       half=st.integers(1, 20), bias=st.booleans(), qk=st.booleans(), seed=st.integers(0, 2**16),
       threads=st.sampled_from([1, 2]))
def test_qkv_rope(n, heads, group, half, bias, qk, seed, threads):
    rng = np.random.default_rng(seed)
    D, Hk = 2 * half, heads
    H = Hk * group
    W = (H + 2 * Hk) * D
    qkv = rng.standard_normal((n, W), dtype=np.float32)
    P = 64
    inv = 1.0 / (10000.0 ** (np.arange(half) / half))
    ang = np.arange(P)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = rng.integers(0, P, n).astype(np.int32)
    b = rng.standard_normal(W, dtype=np.float32) if bias else None
    qn = rng.standard_normal(D, dtype=np.float32) if qk else None
    kn = rng.standard_normal(D, dtype=np.float32) if qk else None
    q, k, v = (np.full(s, np.nan, np.float32) for s in ((n, H, D), (n, Hk * D), (n, Hk * D)))
    _layers.qkv_rope(qkv, pos, cos, sin, q, k, v, H, Hk, b, qn, kn, 1e-6, threads)
    x = qkv.astype(np.float64) + (b if bias else 0)
    xq, xk, xv = x[:, :H * D].reshape(n, H, D), x[:, H * D:(H + Hk) * D].reshape(n, Hk, D), \
        x[:, (H + Hk) * D:]
    if qk:
        xq, xk = rms_ref(xq, qn, 1e-6), rms_ref(xk, kn, 1e-6)
    np.testing.assert_allclose(q, rope_ref(xq, pos, inv), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k, rope_ref(xk, pos, inv).reshape(n, Hk * D), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(v, xv, rtol=1e-6, atol=1e-6)


def _silu_ref(g):
    return g / (1 + np.exp(-g))


def _gelu_tanh_ref(g):   # transformers' gelu_pytorch_tanh
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("kernel, ref", [("silu_mul", _silu_ref),
                                         ("gelu_tanh_mul", _gelu_tanh_ref)])
@SET
@given(n=st.integers(0, 70), width=st.integers(1, 300), seed=st.integers(0, 2**16),
       threads=st.sampled_from([1, 2]))
def test_activation_mul(kernel, ref, n, width, seed, threads):
    """act(gate) * up against float64, for each activation kernel."""
    rng = np.random.default_rng(seed)
    gu = (rng.standard_normal((n, 2 * width)) * 6).astype(np.float32)
    out = np.full((n, width), np.nan, np.float32)
    getattr(_layers, kernel)(gu, out, threads)
    g, u = gu[:, :width].astype(np.float64), gu[:, width:].astype(np.float64)
    np.testing.assert_allclose(out, ref(g) * u, rtol=1e-5, atol=1e-6)


def test_silu_mul_extremes():
    gu = np.array([[-1e30, 1e30, 0.0, 2.0, 3.0, 1.0]], np.float32)
    out = np.empty((1, 3), np.float32)
    _layers.silu_mul(gu, out)
    assert np.all(np.isfinite(out[:, 1:])) and out[0, 0] == 0.0 and out[0, 2] == 0.0


def test_gelu_tanh_mul_extremes():
    gu = np.array([[-1e30, 1e30, 0.0, -30.0, 2.0, 3.0, 1.0, 1.0]], np.float32)
    out = np.empty((1, 4), np.float32)
    _layers.gelu_tanh_mul(gu, out)
    assert out[0, 0] == 0.0 and out[0, 1] == np.float32(1e30) * np.float32(3) and out[0, 2] == 0.0
    assert -1e-30 < out[0, 3] <= 0.0             # no cancellation in 1 + tanh(u) for g << 0


@pytest.mark.parametrize("cap", ["scalar", "avx2"])
def test_rows_at_every_level(cap):
    """The row kernels follow PAGEDCY_SIMD as the attention and GEMM kernels do (they were
    target_clones, which the loader picks from the CPU alone): each capped build runs, against
    float64 on widths around the vector tails, and the extremes give the same bits on every
    build."""
    import os
    import subprocess
    import sys
    code = (
        "import numpy as np\n"
        "from pagedcy._libs import _layers\n"
        "print(_layers._rows_build())\n"
        "r = np.random.default_rng(7)\n"
        "for w in (1, 7, 8, 15, 16, 17, 31, 33, 64, 100, 257):\n"
        "    gu = (r.standard_normal((3, 2 * w)) * 6).astype(np.float32)\n"
        "    g, u = gu[:, :w].astype(np.float64), gu[:, w:].astype(np.float64)\n"
        "    out = np.full((3, w), np.nan, np.float32)\n"
        "    _layers.silu_mul(gu, out)\n"
        "    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)\n"
        "    _layers.gelu_tanh_mul(gu, out)\n"
        "    want = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))) * u\n"
        "    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)\n"
        "    x = (r.standard_normal((3, w)) * 3).astype(np.float32)\n"
        "    wt = r.standard_normal(w).astype(np.float32)\n"
        "    o = np.empty_like(x)\n"
        "    _layers.rms_norm(x, wt, 1e-5, o)\n"
        "    x64 = x.astype(np.float64)\n"
        "    want = wt * x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5)\n"
        "    np.testing.assert_allclose(o, want, rtol=2e-5, atol=2e-5)\n"
        "ext = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -87.5, 88.5, 2.0] * 2\n"
        "gu = np.array([ext + [1.0] * len(ext)], np.float32)\n"
        "for k in (_layers.silu_mul, _layers.gelu_tanh_mul):\n"
        "    out = np.empty((1, len(ext)), np.float32)\n"
        "    k(gu, out)\n"
        "    print(out.tobytes().hex())\n")
    outs = {}
    for level in (cap, None):   # the capped build, then the machine's best
        env = {k: v for k, v in os.environ.items() if k not in ("PAGEDCY_SIMD", "PAGEDCY_FORCE_SCALAR")}
        if level:
            env["PAGEDCY_SIMD"] = level
        outs[level] = subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120,
                                     capture_output=True, text=True).stdout
    capped, best = outs[cap].split("\n"), outs[None].split("\n")
    assert capped[1:] == best[1:]      # NaN, infinities, the clamps: the same bits on every build
    # the build the rows took: the cap's, or the machine's best if that is lower
    assert int(capped[0]) == min({"scalar": 0, "avx2": 1}[cap], int(best[0]))
    from pagedcy._libs._attention import simd_level
    assert int(best[0]) == simd_level()


def _rope_args(n=3, H=4, Hk=2, D=8, P=16):
    f = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    return dict(qkv=f(n, (H + 2 * Hk) * D), positions=np.zeros(n, np.int32), cos=f(P, D // 2),
                sin=f(P, D // 2), q_out=f(n, H, D), k_out=f(n, Hk * D), v_out=f(n, Hk * D),
                num_heads=H, num_kv_heads=Hk)


@pytest.mark.parametrize("change, exc", [
    (dict(qkv=np.zeros((3, 64), np.float64)), TypeError),
    (dict(qkv=[[0.0] * 64] * 3), TypeError),
    (dict(qkv=np.zeros((3, 63), np.float32)), ValueError),
    (dict(qkv=np.zeros((64, 3), np.float32).T), ValueError),
    (dict(positions=np.zeros(3, np.int64)), TypeError),
    (dict(positions=np.zeros(4, np.int32)), ValueError),
    (dict(positions=np.full(3, 16, np.int32)), IndexError),
    (dict(positions=np.full(3, -1, np.int32)), IndexError),
    (dict(sin=np.zeros((15, 4), np.float32)), ValueError),
    (dict(q_out=np.zeros((3, 4, 7), np.float32)), ValueError),
    (dict(k_out=np.zeros((3, 16), np.float32)[:, ::1].copy()[:2]), ValueError),
    (dict(num_kv_heads=0), ValueError),
    (dict(bias=np.zeros(63, np.float32)), ValueError),
    (dict(q_norm=np.zeros(8, np.float16)), TypeError),
    (dict(eps=-1.0), ValueError),
])
def test_qkv_rope_bad_input(change, exc):
    args = _rope_args()
    args.update(change)
    with pytest.raises(exc):
        _layers.qkv_rope(**args)


def test_qkv_rope_overlap_and_odd_head_dim():
    args = _rope_args()
    args["v_out"] = args["k_out"]
    with pytest.raises(ValueError, match="overlap"):
        _layers.qkv_rope(**args)
    args = _rope_args(D=7)
    args["cos"] = args["sin"] = np.zeros((16, 3), np.float32)
    with pytest.raises(ValueError, match="even"):
        _layers.qkv_rope(**args)


def test_rms_norm_and_silu_bad_input():
    x = np.zeros((2, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(TypeError):
        _layers.rms_norm(x.astype(np.float64), w, 1e-6, x)
    with pytest.raises(ValueError):
        _layers.rms_norm(x, np.ones(7, np.float32), 1e-6, x)
    with pytest.raises(ValueError):
        _layers.rms_norm(np.zeros((8, 2), np.float32).T, w, 1e-6, x)
    with pytest.raises(ValueError):
        _layers.rms_norm(x, w, 0.0, x.copy())
    with pytest.raises(ValueError, match="overlap"):
        _layers.rms_norm(x, w, 1e-6, x.copy(), x)
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _layers.rms_norm(x, w, 1e-6, ro)
    for act_mul in (_layers.silu_mul, _layers.gelu_tanh_mul):
        with pytest.raises(ValueError):
            act_mul(np.zeros((2, 7), np.float32), np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError):
            act_mul(np.zeros((2, 8), np.float32), np.zeros((2, 3), np.float32))
        with pytest.raises(TypeError):
            act_mul(np.zeros((2, 8), np.int32), np.zeros((2, 4), np.float32))
        gu = np.zeros((2, 8), np.float32)
        with pytest.raises(ValueError, match="overlap"):
            act_mul(gu[:1], gu.reshape(-1)[4:8].reshape(1, 4))
