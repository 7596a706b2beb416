"""KVPageStore page layouts: head-major ("HND", the default) and token-major ("NHD")
hold the same logical pages, and every path (write, per-token write, read, pages(),
the attention kernel, the model adapter) agrees on where a row lives."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcy import PagedKVCacheConfig
from pagedcy._libs._attention import batch_paged_attention
from pagedcy._libs._store import KVPageStore
from pagedcy.models.pages import PagesAdapter

from attn_helpers import reference


def _config(dtype="float32", T=4, Hkv=3, D=8, L=2, pages=12):
    return PagedKVCacheConfig(page_size=T, max_pages=pages, num_layers=L, num_kv_heads=Hkv,
                              head_dim=D, dtype=dtype)


def test_default_is_head_major_in_memory():
    st_ = KVPageStore(_config())
    assert st_.layout == "HND"
    p = st_.pages()
    assert p.shape == (12, 2, 2, 4, 3, 8) and not p.flags.c_contiguous
    # memory order [page, layer, head, K/V, token, dim]: a head's rows of a page are contiguous
    assert p.transpose(0, 1, 4, 2, 3, 5).flags.c_contiguous
    assert KVPageStore(_config(), layout="NHD").pages().flags.c_contiguous


def test_bad_layout():
    with pytest.raises(ValueError):
        KVPageStore(_config(), layout="hnd")


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float16", "bfloat16", "int8"]))
def test_layouts_agree(data, dtype):
    """Random writes land at the same logical (page, layer, K/V, token, head) in both
    layouts, read back equal, and give the kernel the same attention."""
    T, Hkv, D = data.draw(st.sampled_from([1, 3, 4])), data.draw(st.sampled_from([1, 2, 3])), 8
    cfg = _config(dtype, T=T, Hkv=Hkv, D=D)
    stores = [KVPageStore(cfg, layout=lay) for lay in ("HND", "NHD")]
    for s in stores:
        s.pages()[...] = 0
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    table = rng.permutation(cfg.max_pages).astype(np.int32)
    for _ in range(data.draw(st.integers(1, 6))):
        start = int(rng.integers(0, cfg.max_pages * T - 1))
        n = int(rng.integers(1, cfg.max_pages * T - start + 1))
        layer = int(rng.integers(0, 2))
        k = rng.standard_normal((n, Hkv, D)).astype(np.float32)
        v = rng.standard_normal((n, Hkv, D)).astype(np.float32)
        for s in stores:
            s.write(table, layer, start, k, v)
            for which, x in ((0, k), (1, v)):
                got = s.read(table, layer, which, start, n, float32=True)
                if dtype == "float32":
                    np.testing.assert_array_equal(got, x.reshape(n, -1))
                else:
                    np.testing.assert_allclose(got, x.reshape(n, -1), rtol=2e-2, atol=2e-2)
    a, b = (s.pages() for s in stores)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    # the same attention from both
    q = rng.standard_normal((2, 2 * Hkv, D)).astype(np.float32)
    ind = np.array([0, 1, 2])
    lens = np.array([cfg.max_pages * T // 2, cfg.max_pages * T // 3])
    bt = np.stack([table[: cfg.max_pages // 2 + 1], table[cfg.max_pages // 2 - 1:]])
    lens = np.minimum(lens, bt.shape[1] * T)
    # the kernel takes whole head-major pages several at a time: rounding may differ
    np.testing.assert_allclose(batch_paged_attention(q, ind, a, 1, bt, lens),
                               batch_paged_attention(q, ind, b, 1, bt, lens), rtol=1e-5, atol=1e-6)


def test_head_major_kernel_matches_reference():
    """A sequence written through a default store, read by the kernel from pages()."""
    rng = np.random.default_rng(3)
    cfg = _config(T=16, Hkv=2, D=64, L=1, pages=20)
    s = KVPageStore(cfg)
    table = rng.permutation(20).astype(np.int32)
    n = 150
    k = rng.standard_normal((n, 2, 64)).astype(np.float32)
    v = rng.standard_normal((n, 2, 64)).astype(np.float32)
    s.write(table, 0, 0, k[:100], v[:100])
    s.write(table, 0, 100, k[100:], v[100:])
    q = rng.standard_normal((3, 8, 64)).astype(np.float32)
    got = batch_paged_attention(q, np.array([0, 3]), s.pages(), 0, table[None], np.array([n]))
    want = reference(q, np.array([0, 3]), [k.astype(np.float64)], [v.astype(np.float64)])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_adapter_takes_either_layout_and_refuses_others():
    ad = PagesAdapter(2, 3, 8)
    for lay in ("HND", "NHD"):
        src = KVPageStore(_config(), layout=lay)
        store = ad.store_for(src.pages())
        assert store.layout == lay
        k = np.arange(3 * 8, dtype=np.float32).reshape(1, 3, 8)
        store.write(np.arange(12, dtype=np.int32), 1, 5, k, -k)
        np.testing.assert_array_equal(src.pages()[1, 1, 0, 1], k[0])   # token 5 = page 1 slot 1
        np.testing.assert_array_equal(src.pages()[1, 1, 1, 1], -k[0])
    bad = np.zeros((12, 2, 2, 4, 3, 16), np.float32)[..., ::2]
    with pytest.raises(ValueError):
        ad.store_for(bad)
