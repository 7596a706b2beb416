"""Every public entry point under bad input: a clear exception, never a crash, state unchanged.

Inputs that could crash the interpreter run in a subprocess so one bad call cannot take the
whole suite down; the test then asserts the child exited normally with the right exception.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pagedcy import (EvictionPolicy, KVPageStore, PagedKVCache, PagedKVCacheConfig, PagePool,
                     PageTable, PoolExhaustedError)

FIELDS = ("page_size", "max_pages", "num_layers", "num_kv_heads", "head_dim")
GOOD = dict(page_size=4, max_pages=4, num_layers=2, num_kv_heads=2, head_dim=4)
HUGE = [2**31, 2**63 - 1, 2**63, 2**64, 2**70, -2**63]
BAD_DTYPE_ARRAYS = [
    pytest.param(lambda s: np.ones(s, np.int64), id="int64"),
    pytest.param(lambda s: np.ones(s, np.int32), id="int32"),
    pytest.param(lambda s: np.ones(s, np.uint16), id="uint16"),
    pytest.param(lambda s: np.ones(s, np.complex64), id="complex64"),
    pytest.param(lambda s: np.ones(s, object), id="object"),
    pytest.param(lambda s: np.full(s, "1.0"), id="str"),
    pytest.param(lambda s: np.ones(s, bool), id="bool"),
]


def run_isolated(code):
    """Run ``code`` in a fresh interpreter; (returncode, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def expect_exception_isolated(setup, call, exc_names):
    """Assert ``call`` raises one of ``exc_names`` and the interpreter survives it."""
    code = f"""
import numpy as np
import pagedcy as p
{setup}
try:
    {call}
except BaseException as e:
    print("RAISED", type(e).__name__)
else:
    print("RETURNED")
"""
    rc, out, err = run_isolated(code)
    assert rc == 0, f"interpreter died (rc={rc}) on {call!r}: {err[-500:]}"
    assert any(f"RAISED {n}" in out for n in exc_names), f"{call!r}: {out.strip()} {err[-300:]}"


def cache_state(cache, num_layers=2):
    ks = [np.ascontiguousarray(cache.gather_k(l)).tobytes() for l in range(num_layers)]
    vs = [np.ascontiguousarray(cache.gather_v(l)).tobytes() for l in range(num_layers)]
    return (cache.seq_len(), cache.evicted_tokens(), cache.num_pages(), cache.free_pages(),
            cache.page_ids().tolist(), cache.free_page_ids().tolist(), ks, vs)


def pool_state(pool):
    return (pool.free_count(), pool.free_list().tolist(), pool.ref_counts().tolist(),
            pool.as_array().tobytes())


def table_state(t):
    return (t.num_pages(), t.seq_len(), t.physical_pages().tolist())


@pytest.fixture(params=[EvictionPolicy.NONE, EvictionPolicy.LRU], ids=["none", "lru"])
def filled_cache(request):
    cfg = PagedKVCacheConfig(**GOOD, eviction=request.param)
    cache = PagedKVCache(cfg)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 6, 8)).astype(np.float32)
    cache.append_tokens(k, k * 2)
    return cache


# -- config ------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (-2**40, ValueError),
                                     (2**31, ValueError), (2**70, ValueError)]
                         + [(b, TypeError) for b in (1.5, 4.0, np.float64(4.0), "4", None, True,
                                                     False, np.bool_(True), [4])])
def test_config_rejects_non_positive_or_non_int_sizes(field, bad, exc):
    with pytest.raises(exc) as info:
        PagedKVCacheConfig(**{**GOOD, field: bad})
    assert field in str(info.value)


def test_config_accepts_numpy_ints_and_is_immutable():
    cfg = PagedKVCacheConfig(np.int64(4), np.int32(3), np.uint8(2), 1, 8)
    assert (cfg.page_size, cfg.max_pages, cfg.num_layers) == (4, 3, 2)
    assert type(cfg.page_size) is int
    with pytest.raises(AttributeError):
        cfg.page_size = 8
    assert cfg.page_size == 4


@pytest.mark.parametrize("bad", ["fifo", 1, None, object()])
def test_config_rejects_bad_eviction(bad):
    with pytest.raises(TypeError):
        PagedKVCacheConfig(**GOOD, eviction=bad)


@pytest.mark.parametrize("bad", ["int16", np.int32, "float64", np.complex64, None, "bf17"])
def test_config_rejects_bad_dtype(bad):
    with pytest.raises(TypeError):
        PagedKVCacheConfig(**GOOD, dtype=bad)


def test_config_rejects_absurd_pool():
    with pytest.raises(ValueError):
        PagedKVCacheConfig(page_size=2**20, max_pages=2**20, num_layers=64, num_kv_heads=64,
                           head_dim=256)


# -- PagePool ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args,exc", [
    ((0, 4), ValueError), ((-1, 4), ValueError), ((4, 0), ValueError), ((4, -3), ValueError),
    ((4.0, 4), TypeError), ((4, 2.5), TypeError), ((True, 4), TypeError), ((4, None), TypeError),
    (("4", 4), TypeError), ((2**31, 4), ValueError),
])
def test_pool_constructor_rejects(args, exc):
    with pytest.raises(exc):
        PagePool(*args)


@pytest.mark.parametrize("args", [(2**70, 4), (4, 2**70), (2**30, 2**30)])
def test_pool_constructor_rejects_huge_without_allocating(args):
    # Sizes past int64 or a pool past 2**46 bytes must fail up front, not try to allocate.
    with pytest.raises((ValueError, IndexError, OverflowError)):
        PagePool(*args)


@pytest.mark.parametrize("dtype", ["int16", np.float64, "f64", None])
def test_pool_rejects_bad_dtype(dtype):
    with pytest.raises(TypeError):
        PagePool(4, 4, dtype=dtype)


def test_pool_rejects_bad_buffers():
    need = 4 * 4 * 4
    with pytest.raises(ValueError):
        PagePool(4, 4, buffer=bytearray(need - 1))
    with pytest.raises(TypeError):
        PagePool(4, 4, buffer=bytes(need))            # read-only
    ro = np.zeros(need, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        PagePool(4, 4, buffer=ro)
    with pytest.raises(TypeError):
        PagePool(4, 4, buffer=np.zeros(2 * need, np.uint8)[::2])   # non-contiguous
    with pytest.raises(TypeError):
        PagePool(4, 4, buffer=np.zeros((need, 2), np.uint8)[:, :1])
    with pytest.raises(TypeError):
        PagePool(4, 4, buffer=12345)


def test_pool_external_buffer_is_shared_not_copied():
    buf = np.zeros(3 * 5 * 4, np.uint8)
    pool = PagePool(3, 5, buffer=buf)
    pool.page_data_mut(2)[:] = 1.5
    assert np.array_equal(buf.view(np.float32)[10:], np.full(5, 1.5, np.float32))
    assert not buf.view(np.float32)[:10].any()


@pytest.mark.parametrize("method", ["free", "incref", "ref_count", "is_free", "page_data",
                                    "page_data_mut"])
@pytest.mark.parametrize("bad,exc", [(-1, IndexError), (4, IndexError), (1.0, TypeError),
                                     (True, TypeError), (np.bool_(False), TypeError),
                                     ("1", TypeError), (None, TypeError), (np.float32(1), TypeError)]
                         + [(h, IndexError) for h in HUGE])
def test_pool_page_arguments(method, bad, exc):
    pool = PagePool(4, 4)
    pool.alloc()
    pool.alloc()
    before = pool_state(pool)
    with pytest.raises(exc):
        getattr(pool, method)(bad)
    assert pool_state(pool) == before


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (1.0, TypeError), (True, TypeError),
                                     (None, TypeError), (2**70, (ValueError, IndexError))])
def test_pool_alloc_many_arguments(bad, exc):
    pool = PagePool(4, 4)
    pool.alloc()
    before = pool_state(pool)
    with pytest.raises(exc):
        pool.alloc_many(bad)
    assert pool_state(pool) == before


@pytest.mark.parametrize("src,dst", [(0, 4), (-1, 0), (0, 2**70), (1.0, 0), (0, True)])
def test_pool_copy_page_arguments(src, dst):
    pool = PagePool(4, 4)
    pool.page_data_mut(0)[:] = 3
    before = pool_state(pool)
    with pytest.raises((IndexError, TypeError)):
        pool.copy_page(src, dst)
    assert pool_state(pool) == before


def test_pool_as_array_bad_shape():
    pool = PagePool(4, 6)
    with pytest.raises(ValueError):
        pool.as_array((4, 5))


# -- PageTable ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-4, ValueError), (2**31, ValueError),
                                     (2.0, TypeError), (True, TypeError), (None, TypeError)])
def test_table_constructor_rejects(bad, exc):
    with pytest.raises(exc):
        PageTable(bad)


def filled_table():
    t = PageTable(4)
    t.push_page(3)
    t.push_page(1)
    t.set_seq_len(6)
    return t


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (2**31, ValueError), (2**40, ValueError),
                                     (1.0, TypeError), (True, TypeError), (None, TypeError),
                                     ("2", TypeError), (2**70, (ValueError, IndexError))])
def test_table_push_page_rejects(bad, exc):
    t = filled_table()
    before = table_state(t)
    with pytest.raises(exc):
        t.push_page(bad)
    assert table_state(t) == before


@pytest.mark.parametrize("bad,exc", [(-1, IndexError), (8, IndexError), (2**40, IndexError),
                                     (1.0, TypeError), (True, TypeError), (None, TypeError)]
                         + [(h, IndexError) for h in HUGE])
def test_table_resolve_rejects(bad, exc):
    t = filled_table()
    before = table_state(t)
    with pytest.raises(exc):
        t.resolve(bad)
    assert table_state(t) == before


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (9, ValueError), (2**40, ValueError),
                                     (1.0, TypeError), (True, TypeError), (None, TypeError),
                                     (2**70, (ValueError, IndexError))])
def test_table_set_seq_len_rejects(bad, exc):
    t = filled_table()
    before = table_state(t)
    with pytest.raises(exc):
        t.set_seq_len(bad)
    assert table_state(t) == before


# -- PagedKVCache --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [None, dict(GOOD), (4, 4, 2, 2, 4), "config"])
def test_cache_needs_a_config(bad):
    with pytest.raises(TypeError):
        PagedKVCache(bad)


@pytest.mark.parametrize("layer,exc", [(-1, IndexError), (2, IndexError), (1.0, TypeError),
                                       (True, TypeError), (None, TypeError), ("0", TypeError)]
                         + [(h, IndexError) for h in HUGE])
def test_append_and_gather_reject_bad_layer(filled_cache, layer, exc):
    before = cache_state(filled_cache)
    row = np.ones(8, np.float32)
    with pytest.raises(exc):
        filled_cache.append_kv_layer(layer, row, row)
    with pytest.raises(exc):
        filled_cache.gather_k(layer)
    with pytest.raises(exc):
        filled_cache.gather_v(layer, np.empty((6, 8), np.float32))
    assert cache_state(filled_cache) == before


@pytest.mark.parametrize("make_bad", BAD_DTYPE_ARRAYS)
def test_append_kv_layer_rejects_bad_dtype(filled_cache, make_bad):
    before = cache_state(filled_cache)
    good = np.ones(8, np.float32)
    with pytest.raises(TypeError):
        filled_cache.append_kv_layer(0, make_bad(8), good)
    with pytest.raises(TypeError):
        filled_cache.append_kv_layer(0, good, make_bad((2, 4)))
    assert cache_state(filled_cache) == before


@pytest.mark.parametrize("make_bad", BAD_DTYPE_ARRAYS)
def test_append_tokens_rejects_bad_dtype(filled_cache, make_bad):
    before = cache_state(filled_cache)
    good = np.ones((2, 3, 8), np.float32)
    with pytest.raises(TypeError):
        filled_cache.append_tokens(make_bad((2, 3, 8)), good)
    with pytest.raises(TypeError):
        filled_cache.append_tokens(good, make_bad((2, 3, 2, 4)))
    assert cache_state(filled_cache) == before


@pytest.mark.parametrize("shape", [(), (7,), (9,), (8, 1), (4, 2), (2, 2, 2), (0,),
                                   (16,), (2, 8)])
def test_append_kv_layer_rejects_bad_shape(filled_cache, shape):
    before = cache_state(filled_cache)
    good = np.ones(8, np.float32)
    with pytest.raises(ValueError):
        filled_cache.append_kv_layer(1, np.ones(shape, np.float32), good)
    with pytest.raises(ValueError):
        filled_cache.append_kv_layer(1, good, np.ones(shape, np.float32))
    assert cache_state(filled_cache) == before


@pytest.mark.parametrize("kshape,vshape", [
    ((1, 3, 8), (1, 3, 8)), ((3, 3, 8), (3, 3, 8)), ((2, 3, 7), (2, 3, 7)), ((2, 3, 8), (2, 4, 8)),
    ((2, 3, 8), (2, 3, 2, 3)), ((3, 8), (3, 8)), ((2, 3, 8, 1), (2, 3, 8, 1)), ((2, 8), (2, 8)),
    ((2, 3, 4, 2), (2, 3, 4, 2))])
def test_append_tokens_rejects_bad_shape(filled_cache, kshape, vshape):
    before = cache_state(filled_cache)
    with pytest.raises(ValueError):
        filled_cache.append_tokens(np.ones(kshape, np.float32), np.ones(vshape, np.float32))
    assert cache_state(filled_cache) == before


def test_append_rejects_none_and_scalars(filled_cache):
    before = cache_state(filled_cache)
    for bad in (None, 1.0, "abc"):
        with pytest.raises((TypeError, ValueError)):
            filled_cache.append_kv_layer(0, bad, np.ones(8, np.float32))
        with pytest.raises((TypeError, ValueError)):
            filled_cache.append_tokens(np.ones((2, 1, 8), np.float32), bad)
    assert cache_state(filled_cache) == before


def test_non_contiguous_inputs_are_written_correctly():
    cfg = PagedKVCacheConfig(3, 6, 2, 2, 4, dtype="float32")
    cache = PagedKVCache(cfg)
    rng = np.random.default_rng(1)
    big = rng.standard_normal((2, 10, 16)).astype(np.float32)
    k = big[:, :, ::2]                 # strided last axis
    v = np.asfortranarray(big[:, :, 8:])
    assert not k.flags.c_contiguous and not v.flags.c_contiguous
    cache.append_tokens(k, v)
    row_k = big[0, 0, ::2][::-1]       # negative stride
    row_v = big[1, 0].reshape(2, 8)[:, ::2]
    cache.append_kv_layer(0, row_k, row_v)
    cache.append_kv_layer(1, row_k, row_v)
    cache.advance()
    for layer in range(2):
        assert np.array_equal(cache.gather_k(layer)[:10], k[layer])
        assert np.array_equal(cache.gather_v(layer)[:10], v[layer])
        assert np.array_equal(cache.gather_k(layer)[10], row_k)
        assert np.array_equal(cache.gather_v(layer)[10], row_v.reshape(-1))
    # Inputs were not modified by the call.
    assert np.array_equal(k, big[:, :, ::2])


def test_float64_and_list_inputs_convert():
    cfg = PagedKVCacheConfig(2, 4, 1, 1, 3)
    cache = PagedKVCache(cfg)
    cache.append_kv_layer(0, [0.5, 1.5, 2.5], np.array([1, 2, 3], np.float64))
    cache.advance()
    assert cache.gather_k(0).tolist() == [[0.5, 1.5, 2.5]]
    assert cache.gather_v(0).tolist() == [[1.0, 2.0, 3.0]]


@pytest.mark.parametrize("dst_fn,exc", [
    (lambda n, d: np.empty((n, d), np.float64), TypeError),
    (lambda n, d: np.empty((n, d), np.int32), TypeError),
    (lambda n, d: np.empty((n, d), np.float16), TypeError),
    (lambda n, d: np.empty((n, d), np.complex64), TypeError),
    (lambda n, d: [0.0] * (n * d), TypeError),
    (lambda n, d: np.empty((n + 1, d), np.float32), ValueError),
    (lambda n, d: np.empty((n, d + 1), np.float32), ValueError),
    (lambda n, d: np.empty((n * d - 1,), np.float32), ValueError),
    (lambda n, d: np.empty((d, n), np.float32), ValueError),
    (lambda n, d: np.empty((1, n, d), np.float32), ValueError),
    (lambda n, d: np.empty((n, 2 * d), np.float32)[:, ::2], ValueError),
    (lambda n, d: np.empty((d, n), np.float32).T, ValueError),
    (lambda n, d: readonly(np.empty((n, d), np.float32)), ValueError),
])
def test_gather_rejects_bad_dst(filled_cache, dst_fn, exc):
    before = cache_state(filled_cache)
    dst = dst_fn(6, 8)
    snap = np.array(dst, copy=True) if isinstance(dst, np.ndarray) else None
    with pytest.raises(exc):
        filled_cache.gather_k(0, dst)
    with pytest.raises(exc):
        filled_cache.gather_v(1, dst)
    assert cache_state(filled_cache) == before
    if snap is not None:
        assert snap.tobytes() == np.asarray(dst).tobytes(), "a rejected dst was written"


def readonly(a):
    a.flags.writeable = False
    return a


def test_half_cache_dst_rules():
    cfg = PagedKVCacheConfig(**GOOD, dtype="float16")
    cache = PagedKVCache(cfg)
    cache.append_tokens(np.ones((2, 3, 8), np.float32), np.ones((2, 3, 8), np.float32))
    assert cache.gather_k(0, np.empty((3, 8), np.float16)).dtype == np.float16
    assert cache.gather_k(0, np.empty((3, 8), np.float32)).dtype == np.float32
    for bad in (np.float64, np.uint16, np.int16):
        with pytest.raises(TypeError):
            cache.gather_k(0, np.empty((3, 8), bad))


def test_int8_cache_gather():
    # Stored int8 rows are row_elems wide (each head's values, then its scale): a default
    # gather dequantizes, an int8 dst takes the stored rows, a kv_dim-wide int8 dst is refused.
    from pagedcy.dtypes import dequantize_int8, quantize_int8
    cfg = PagedKVCacheConfig(**GOOD, dtype="int8")
    cache = PagedKVCache(cfg)
    k = np.random.default_rng(0).standard_normal((2, 7, 8)).astype(np.float32)
    cache.append_tokens(k, -k)
    want = quantize_int8(k[1].reshape(7, 2, 4))
    got = cache.gather_k(1)
    assert got.dtype == np.float32 and got.shape == (7, 8)
    assert np.array_equal(got, dequantize_int8(want).reshape(7, 8))
    raw = cache.gather_k(1, np.empty((7, 2 * 8), np.int8))
    assert np.array_equal(raw.reshape(7, 2, 8), want)
    assert np.array_equal(cache.gather_v(0, np.empty(7 * 8, np.float32)),
                          dequantize_int8(quantize_int8(-k[0].reshape(7, 2, 4))).reshape(-1))
    for shape in ((7, 8), (7 * 8,), (7, 17)):
        with pytest.raises(ValueError):
            cache.gather_k(0, np.empty(shape, np.int8))
    assert np.array_equal(cache.gather_k(1), got)


def test_byte_swapped_arrays_are_converted_or_refused():
    # A '>f4' / '>i4' array has the type number of float32 / int32: the C fast paths
    # must not read its bytes as native values.
    from pagedcy import KVPageStore
    from pagedcy._libs import _gemm, _layers, _manager_ops
    cfg = PagedKVCacheConfig(**GOOD)
    k = np.arange(1, 17, dtype=np.float32).reshape(2, 8)
    kb = k.astype(">f4")
    cache = PagedKVCache(cfg)
    cache.append_kv_layer(0, kb[0], kb[0])
    cache.append_kv_layer(1, kb[1], kb[1])
    cache.advance()
    assert np.array_equal(cache.gather_k(0)[0], k[0]) and np.array_equal(cache.gather_v(1)[0], k[1])
    store = KVPageStore(cfg)
    store.write(np.array([0], np.int32), 0, 0, k, kb)
    assert np.array_equal(store.read(np.array([0], np.int32), 0, "v", 0, 2), k)
    store = KVPageStore(cfg)
    _manager_ops.write_token_rows(store, np.array([1], ">i4"), np.array([2], ">i4"), 0, kb[:1], kb[:1])
    assert np.array_equal(store.read(np.array([0, 1], np.int32), 0, "k", 6, 1)[0], k[0])
    with pytest.raises(IndexError):
        _manager_ops.write_token_rows(store, np.array([2**24], ">i4"), np.array([0], np.int32), 0, k[:1], k[:1])
    with pytest.raises(TypeError):
        _manager_ops.build_block_table([np.array([1, 2], ">i4")], 2)
    x, w = np.ones((3, 5), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(TypeError):
        _gemm.linear(x.astype(">f4"), w, np.zeros((3, 4), np.float32))
    with pytest.raises(TypeError):
        _layers.rms_norm(x, np.ones(5, ">f4"), 1e-6, np.zeros_like(x))


@pytest.mark.parametrize("make", [
    lambda: PagedKVCache.__new__(PagedKVCache),
    lambda: KVPageStore.__new__(KVPageStore),
    lambda: PagePool.__new__(PagePool),
    lambda: PageTable.__new__(PageTable),
    lambda: type("Sub", (PagedKVCache,), {"__init__": lambda self: None})(),
    lambda: type("Sub", (KVPageStore,), {"__init__": lambda self: None})(),
    lambda: PagedKVCache(PagedKVCacheConfig(**GOOD), 5),
])
def test_no_object_exists_half_built(make):
    # Everything is built in __cinit__: no object reaches the nogil core with its store,
    # table or pool missing (these used to crash the interpreter or read None's memory).
    with pytest.raises(TypeError):
        make()


def test_user_callbacks_may_call_back_into_a_locked_object():
    # An argument's __index__ / __float__ runs before the object takes its lock, so one
    # that calls back into the same object cannot wait on that lock forever.
    code = textwrap.dedent("""
        import numpy as np
        from pagedcy import PagePool, PagedKVCache, PagedKVCacheConfig
        pool = PagePool(4, 4)
        pool.alloc()
        class Page:
            def __index__(self):
                assert pool.ref_count(0) >= 0
                return 0
        pool.incref(Page()); pool.free(Page()); assert pool.ref_count(Page()) == 1
        c = PagedKVCache(PagedKVCacheConfig(4, 4, 1, 1, 4))
        c.append_tokens(np.ones((1, 2, 4), np.float32), np.ones((1, 2, 4), np.float32))
        class Scale:
            def __float__(self):
                c.page_ids()
                return 0.5
        class Layer:
            def __index__(self):
                c.page_ids()
                return 0
        a = c.attention(np.ones((1, 1, 4), np.float32), Layer(), scale=Scale(), causal=Scale(),
                        window_left=Layer(), num_threads=Layer().__index__() + 1)
        b = c.attention(np.ones((1, 1, 4), np.float32), 0, scale=0.5)
        assert np.array_equal(a, b)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_out_of_range_numbers_are_value_errors():
    from pagedcy._libs import _bandwidth, _layers
    x, o = np.ones((2, 8), np.float32), np.empty((2, 8), np.float32)
    with pytest.raises(ValueError):
        _layers.rms_norm(x, np.ones(8, np.float32), 10**400, o)
    with pytest.raises(ValueError):
        _layers.rms_norm(x, np.ones(8, np.float32), 1e-6, o, num_threads=0)   # small call too
    qkv, pos = np.ones((2, 16), np.float32), np.array([0, 1], np.int32)
    cs = np.ones((4, 2), np.float32)
    q, k = np.empty((2, 2, 4), np.float32), np.empty((2, 4), np.float32)
    for bad, exc in ((2.7, TypeError), ("2", TypeError), (float("inf"), TypeError), (0, ValueError)):
        with pytest.raises(exc):
            _layers.qkv_rope(qkv, pos, cs, cs, q, k, k.copy(), bad, 1)
    with pytest.raises(ValueError):
        _bandwidth.read_bandwidth(nbytes=4096, repeats=2**31)
    for f in (_bandwidth.read_bandwidth, _bandwidth.page_read_bandwidth):
        kw = {"page_bytes": 4096} if f is _bandwidth.page_read_bandwidth else {}
        with pytest.raises(ValueError):
            f(buffer=np.zeros(4096, np.float32), repeats=1, **kw)
    with pytest.raises(TypeError):
        PagePool(2, 4, buffer=memoryview(bytearray(128))[::2])


def test_advance_without_any_token_is_value_error():
    cache = PagedKVCache(PagedKVCacheConfig(**GOOD))
    with pytest.raises(ValueError):
        cache.advance()
    assert (cache.seq_len(), cache.num_pages(), cache.free_pages()) == (0, 0, 4)


def test_advance_at_full_page_is_value_error(filled_cache):
    # 6 tokens + 2 advances fill the second page exactly; the next advance has no page.
    filled_cache.append_kv_layer(0, np.ones(8, np.float32), np.ones(8, np.float32))
    filled_cache.advance()
    filled_cache.append_kv_layer(0, np.ones(8, np.float32), np.ones(8, np.float32))
    filled_cache.advance()
    assert filled_cache.seq_len() == 8
    before = cache_state(filled_cache)
    with pytest.raises(ValueError):
        filled_cache.advance()
    assert cache_state(filled_cache) == before


def test_advance_twice_after_one_append_is_value_error():
    """Regression: advance() once checked only that the mapped pages had room, not that a
    token was appended since the last advance/append_tokens, so a second advance() inside a
    partly filled page succeeded and exposed the stale bytes the page held (pages are not
    zeroed on reuse)."""
    cache = PagedKVCache(PagedKVCacheConfig(**GOOD))
    row = np.ones(8, np.float32)
    cache.append_kv_layer(0, row, row)
    cache.append_kv_layer(1, row, row)
    cache.advance()
    before = cache_state(cache)
    with pytest.raises(ValueError):
        cache.advance()
    assert cache_state(cache) == before


def test_advance_after_bulk_append_is_value_error():
    cache = PagedKVCache(PagedKVCacheConfig(**GOOD))
    cache.append_tokens(np.ones((2, 1, 8), np.float32), np.ones((2, 1, 8), np.float32))
    before = cache_state(cache)
    with pytest.raises(ValueError):
        cache.advance()
    assert cache_state(cache) == before


def test_failed_append_after_partial_layers_keeps_state():
    # An exhausted NONE cache with layer 0 of the next token not yet mapped: the error for
    # layer 0 must not leave a half-mapped page behind.
    cfg = PagedKVCacheConfig(**{**GOOD, "max_pages": 1})
    cache = PagedKVCache(cfg)
    cache.append_tokens(np.ones((2, 4, 8), np.float32), np.ones((2, 4, 8), np.float32))
    before = cache_state(cache)
    with pytest.raises(PoolExhaustedError):
        cache.append_kv_layer(0, np.zeros(8, np.float32), np.zeros(8, np.float32))
    with pytest.raises(PoolExhaustedError):
        cache.append_tokens(np.zeros((2, 1, 8), np.float32), np.zeros((2, 1, 8), np.float32))
    assert cache_state(cache) == before


# -- KVPageStore ---------------------------------------------------------------------------------

def store():
    return KVPageStore(PagedKVCacheConfig(**GOOD))


def store_state(s):
    return (s.pool.free_count(), s.pages().tobytes())


def rows(n=1, val=1.0):
    return np.full((n, 8), val, np.float32)


def test_store_needs_config():
    with pytest.raises(TypeError):
        KVPageStore(GOOD)


def test_store_write_read_roundtrip_reference():
    s = store()
    rng = np.random.default_rng(2)
    k = rng.standard_normal((7, 8)).astype(np.float32)
    v = rng.standard_normal((7, 2, 4)).astype(np.float32)
    bt = np.array([3, 0], np.int32)
    s.write(bt, 1, 1, k, v)
    assert np.array_equal(s.read(bt, 1, "k", 1, 7), k)
    assert np.array_equal(s.read(bt, 1, 1, 1, 7), v.reshape(7, 8))
    pages = s.pages()
    assert np.array_equal(pages[3, 1, 0, 1:4].reshape(3, 8), k[:3])
    assert np.array_equal(pages[0, 1, 1, 0:4].reshape(4, 8), v[3:].reshape(4, 8))
    assert not pages[1].any() and not pages[2].any() and not pages[3, 0].any()


@pytest.mark.parametrize("kw,exc", [
    (dict(layer=2), IndexError), (dict(layer=-1), IndexError), (dict(layer=1.0), TypeError),
    (dict(layer=True), TypeError), (dict(layer=2**70), IndexError),
    (dict(start=-1), ValueError), (dict(start=1.0), TypeError), (dict(start=True), TypeError),
    (dict(start=7), ValueError),                      # 7 + 2 rows need 3 pages, table has 2
    (dict(start=2**40), ValueError),
    (dict(bt=np.array([0, 4], np.int32), start=3), IndexError),
    (dict(bt=np.array([-1, 0], np.int64)), IndexError),
    (dict(bt=np.array([0.0, 1.0])), TypeError), (dict(bt=np.array([[0, 1]])), TypeError),
    (dict(bt=np.array([True, False])), TypeError), (dict(bt=np.array([0]), start=3), ValueError),
    (dict(k=np.ones((2, 8), np.int32)), TypeError), (dict(v=np.ones((2, 8), complex)), TypeError),
    (dict(k=np.ones((2, 7), np.float32)), ValueError), (dict(v=np.ones((3, 8), np.float32)), ValueError),
    (dict(k=np.ones((2, 8), object)), TypeError),
])
def test_store_write_rejects(kw, exc):
    s = store()
    args = dict(bt=np.array([0, 1], np.int32), layer=0, start=0, k=rows(2), v=rows(2))
    args.update(kw)
    before = store_state(s)
    with pytest.raises(exc):
        s.write(args["bt"], args["layer"], args["start"], args["k"], args["v"])
    assert store_state(s) == before


@pytest.mark.parametrize("bt", [np.array([2**32 + 1], np.int64), np.array([2**32], np.uint64),
                                np.array([-2**32 + 2], np.int64)])
def test_store_write_rejects_block_table_entries_that_wrap(bt):
    """Regression: KVPageStore once cast a 64-bit block table to int32 before the range
    check, so 2**32 + 1 wrapped to 1, passed, and write() silently wrote page 1."""
    s = store()
    before = store_state(s)
    with pytest.raises(IndexError):
        s.write(bt, 0, 0, rows(1), rows(1))
    assert store_state(s) == before


@pytest.mark.parametrize("kw,exc", [
    (dict(layer=2), IndexError), (dict(layer=None), TypeError), (dict(which="x"), ValueError),
    (dict(which=2), ValueError), (dict(which=None), ValueError), (dict(start=-1), ValueError),
    (dict(n=-1), ValueError), (dict(n=1.0), TypeError), (dict(n=9), ValueError),
    # a huge n is refused by the table's length before any output is allocated
    (dict(n=2**40), ValueError), (dict(bt=0, n=789891057), TypeError),
    (dict(bt=np.array([0, 9], np.int32), start=3), IndexError),
    (dict(bt=np.array([1], np.int32), start=3), ValueError),
    (dict(out=np.empty((2, 8), np.float64)), TypeError),
    (dict(out=np.empty((3, 8), np.float32)), ValueError),
    (dict(out=np.empty((16,), np.float32)), ValueError),
    (dict(out=np.empty((8, 2), np.float32).T), ValueError),
    (dict(out=readonly(np.empty((2, 8), np.float32))), ValueError),
    (dict(out=[[0.0] * 8] * 2), TypeError),
])
def test_store_read_rejects(kw, exc):
    s = store()
    s.write(np.array([0, 1], np.int32), 0, 0, rows(5, 2.0), rows(5, 3.0))
    args = dict(bt=np.array([0, 1], np.int32), layer=0, which="k", start=0, n=2, out=None)
    args.update(kw)
    before = store_state(s)
    with pytest.raises(exc):
        s.read(args["bt"], args["layer"], args["which"], args["start"], args["n"], out=args["out"])
    assert store_state(s) == before


def test_store_read_rejects_bool_which():
    s = store()
    with pytest.raises((TypeError, ValueError)):
        s.read(np.array([0], np.int32), 0, True, 0, 1)


@pytest.mark.parametrize("call", [
    "s.write(np.array([0], np.int32), 0, 2**63 - 1, np.ones((1, 8), np.float32), "
    "np.ones((1, 8), np.float32))",
    "s.read(np.array([0], np.int32), 0, 'k', 2**63 - 1, 1)",
])
def test_store_huge_start_does_not_crash(call):
    """Regression: write/read once computed start + n + page_size - 1 in Py_ssize_t; a start
    near 2**63 overflowed to a negative page count, the table checks were skipped and the
    copy indexed the block table out of bounds (a segfault)."""
    expect_exception_isolated(
        "s = p.KVPageStore(p.PagedKVCacheConfig(4, 4, 2, 2, 4))", call,
        ["ValueError", "IndexError", "OverflowError"])


@pytest.mark.parametrize("call", [
    "s.write(np.array([0], np.int32), 0, 2**64, np.ones((1, 8), np.float32), "
    "np.ones((1, 8), np.float32))",
    "s.read(np.array([0], np.int32), 0, 'k', 2**70, 1)",
    "s.read(np.array([0], np.int32), 0, 'k', 0, 2**62)",
])
def test_store_beyond_int64_is_an_exception(call):
    expect_exception_isolated("s = p.KVPageStore(p.PagedKVCacheConfig(4, 4, 2, 2, 4))", call,
                              ["ValueError", "IndexError", "OverflowError", "MemoryError"])


def test_store_copy_pages_from_roundtrip_and_errors():
    a, b = store(), store()
    a.write(np.array([2], np.int32), 1, 0, rows(4, 5.0), rows(4, 6.0))
    b.copy_pages_from(a, [2, 2], np.array([0, 3]))
    assert np.array_equal(b.pages()[0], a.pages()[2]) and np.array_equal(b.pages()[3], a.pages()[2])
    before = store_state(b)
    other = KVPageStore(PagedKVCacheConfig(**{**GOOD, "page_size": 2}))
    half = KVPageStore(PagedKVCacheConfig(**GOOD, dtype="float16"))
    for args, exc in [((other, [0], [0]), ValueError), ((half, [0], [0]), ValueError),
                      ((a, [0, 1], [0]), ValueError), ((a, [4], [0]), IndexError),
                      ((a, [0], [-1]), IndexError), ((a, [2**40], [0]), IndexError),
                      (("store", [0], [0]), TypeError), ((a.pool, [0], [0]), TypeError)]:
        with pytest.raises(exc):
            b.copy_pages_from(*args)
        assert store_state(b) == before


def test_store_copy_pages_from_none_does_not_crash():
    expect_exception_isolated("s = p.KVPageStore(p.PagedKVCacheConfig(4, 4, 2, 2, 4))",
                              "s.copy_pages_from(None, [0], [1])", ["TypeError"])


@pytest.mark.parametrize("src_pages,dst_pages", [([1.7], [0]), ([0], [True]), (["1"], [0]),
                                                 (np.array([0.0]), np.array([1.0]))])
def test_store_copy_pages_from_rejects_non_integer_ids(src_pages, dst_pages):
    a, b = store(), store()
    a.write(np.array([0, 1], np.int32), 0, 0, rows(8, 4.0), rows(8, 4.0))
    before = store_state(b)
    with pytest.raises(TypeError):
        b.copy_pages_from(a, src_pages, dst_pages)
    assert store_state(b) == before


# -- one rule for integer arguments, everywhere ---------------------------------------------------
#
# Every integer argument of the public API goes through pagedcy._validate, so the same mistake
# raises the same exception at every entry point, as in NumPy: a non-integer (float, str, None,
# bool, list) is a TypeError; a size or count out of range a ValueError; an index outside its
# container an IndexError. NumPy integers are accepted like ints.

NOT_INTEGERS = [1.5, 2.0, np.float64(2.0), "2", None, True, np.bool_(False), [2], object()]


def _call_entry_point(name, v):
    from pagedcy import resolve_num_threads
    from pagedcy._libs._bandwidth import read_bandwidth
    from pagedcy._libs._manager_ops import build_block_table, write_token_rows
    from pagedcy._libs._pool import aligned_zeros
    cfg = PagedKVCacheConfig(**GOOD)
    kind, _, attr = name.partition(".")
    if kind == "config":
        return PagedKVCacheConfig(**{**GOOD, attr: v})
    if kind == "PagePool":
        return PagePool(**{"max_pages": 4, "floats_per_page": 4, attr: v})
    if kind == "PageTable":
        return PageTable(v)
    if kind == "aligned_zeros":
        return aligned_zeros(v)
    if kind == "pool":
        pool = PagePool(4, 4)
        pool.alloc()
        pool.alloc()
        if attr == "alloc_many":
            return pool.alloc_many(v)
        if attr in ("copy_page.src", "copy_page.dst"):
            return pool.copy_page(*((v, 1) if attr.endswith("src") else (1, v)))
        return getattr(pool, attr)(v)
    if kind == "table":
        t = filled_table()
        return getattr(t, attr)(v)
    if kind == "store":
        s, bt = store(), np.array([0, 1], np.int32)
        method, _, arg = attr.partition(".")
        args = dict(layer=0, start=0, n=2)
        args[arg] = v
        if method == "write":
            return s.write(bt, args["layer"], args["start"], rows(2), rows(2))
        return s.read(bt, args["layer"], "k", args["start"], args["n"])
    if kind == "cache":
        cache = PagedKVCache(cfg)
        if attr == "append_kv_layer":
            return cache.append_kv_layer(v, rows(1)[0], rows(1)[0])
        return getattr(cache, attr)(v)
    if kind == "resolve_num_threads":
        return resolve_num_threads(v)
    if kind == "read_bandwidth":
        if attr == "repeats":
            return read_bandwidth(num_threads=1, repeats=v, buffer=np.ones(1024, np.float32))
        return read_bandwidth(v, num_threads=1, repeats=1)
    if kind == "page_read_bandwidth":
        from pagedcy._libs._bandwidth import page_read_bandwidth
        args = dict(page_bytes=1024, streams=2, row_bytes=512, repeats=1)
        args[attr] = v
        return page_read_bandwidth(num_threads=1, buffer=np.ones(2048, np.float32), **args)
    if kind == "write_token_rows":
        s = store()
        return write_token_rows(s, np.array([1], np.int32), np.array([2], np.int32), v,
                                rows(1), rows(1))
    if kind == "build_block_table":
        return build_block_table([np.array([3, 1], np.int32)], v)
    raise AssertionError(name)


# name: (a valid value, [(out-of-range value, exception), ...])
ENTRY_POINTS = {
    **{f"config.{f}": (2, [(0, ValueError), (-1, ValueError), (2**31, ValueError)]) for f in FIELDS},
    "PagePool.max_pages": (2, [(0, ValueError), (2**31, ValueError), (2**70, ValueError)]),
    "PagePool.floats_per_page": (2, [(0, ValueError), (-5, ValueError), (2**40, ValueError)]),
    "PageTable": (2, [(0, ValueError), (2**31, ValueError)]),
    "aligned_zeros": (2, [(-1, ValueError), (2**70, ValueError)]),
    "pool.alloc_many": (2, [(-1, ValueError), (2**70, ValueError)]),
    **{f"pool.{m}": (1, [(-1, IndexError), (4, IndexError), (2**70, IndexError)])
       for m in ("free", "incref", "ref_count", "is_free", "page_data", "page_data_mut",
                 "copy_page.src", "copy_page.dst")},
    "table.resolve": (2, [(-1, IndexError), (8, IndexError), (2**70, IndexError)]),
    "table.push_page": (2, [(-1, ValueError), (2**31, ValueError)]),
    "table.set_seq_len": (2, [(-1, ValueError), (9, ValueError), (2**70, ValueError)]),
    "store.write.layer": (1, [(-1, IndexError), (2, IndexError), (2**70, IndexError)]),
    "store.write.start": (1, [(-1, ValueError), (7, ValueError), (2**70, ValueError)]),
    "store.read.layer": (1, [(-1, IndexError), (2, IndexError)]),
    "store.read.start": (1, [(-1, ValueError), (7, ValueError)]),
    "store.read.n": (2, [(-1, ValueError), (9, ValueError), (2**70, ValueError)]),
    "cache.append_kv_layer": (1, [(-1, IndexError), (2, IndexError), (2**70, IndexError)]),
    "cache.gather_k": (1, [(-1, IndexError), (2, IndexError)]),
    "cache.gather_v": (1, [(-1, IndexError), (2, IndexError)]),
    "resolve_num_threads": (2, [(0, ValueError), (-3, ValueError)]),
    "read_bandwidth.repeats": (2, [(0, ValueError), (-1, ValueError)]),
    "read_bandwidth.nbytes": (4096, [(-1, ValueError), (4095, ValueError)]),
    "page_read_bandwidth.page_bytes": (1024, [(0, ValueError), (1000, ValueError), (16384, ValueError)]),
    "page_read_bandwidth.streams": (2, [(0, ValueError), (65, ValueError)]),
    "page_read_bandwidth.row_bytes": (512, [(0, ValueError), (100, ValueError), (384, ValueError)]),
    "page_read_bandwidth.repeats": (1, [(0, ValueError), (-1, ValueError)]),
    "write_token_rows": (1, [(-1, IndexError), (2, IndexError), (2**70, IndexError)]),
    "build_block_table": (2, [(-1, ValueError), (1, ValueError), (2**70, ValueError)]),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_integer_arguments_follow_one_rule(name):
    valid, out_of_range = ENTRY_POINTS[name]
    _call_entry_point(name, valid)
    _call_entry_point(name, np.int64(valid))            # NumPy integers are integers
    _call_entry_point(name, np.uint8(valid) if valid < 256 else np.int32(valid))
    for bad in NOT_INTEGERS:
        if bad is None and name == "resolve_num_threads":
            continue                                     # None asks for the default there
        with pytest.raises(TypeError):
            _call_entry_point(name, bad)
    for bad, exc in out_of_range:
        with pytest.raises(exc) as info:
            _call_entry_point(name, bad)
        assert type(info.value) is exc, (bad, info.value)
