"""The KV page store's keys and values (no Redis needed): the header is checked field by
field, hostile bytes are only ever refused, and hashes and fingerprints are the same in
every process."""
import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engine_helpers import ToyModel
from pagedcy import PagedKVCacheConfig
from pagedcy.kvcache.kvstore_format import HEADER, PageCodec, model_fingerprint
from pagedcy.kvcache.prefix import PrefixCache
from pagedcy.kvcache.stats import Counters

CFG = PagedKVCacheConfig(page_size=4, max_pages=8, num_layers=2, num_kv_heads=2, head_dim=8)
CODEC = PageCodec(CFG, "f00d")
KEY = CODEC.key(b"\x01" * 16)


def _page(seed=0, cfg=CFG):
    return np.random.default_rng(seed).integers(0, 256, cfg.bytes_per_page(),
                                                dtype=np.uint8).tobytes()


def test_roundtrip_and_key():
    payload = _page()
    value = CODEC.encode(KEY, payload)
    assert len(value) == HEADER.size + CFG.bytes_per_page()
    assert bytes(CODEC.decode(KEY, value)) == payload
    assert KEY == "pagedcy:kv:v1:f00d:float32:4:" + "01" * 16
    with pytest.raises(ValueError, match="bytes"):
        CODEC.encode(KEY, payload[:-1])


def _field(value, index, new):
    fields = list(HEADER.unpack_from(value))
    fields[index] = new
    return HEADER.pack(*fields) + value[HEADER.size:]


@pytest.mark.parametrize("mutate, why", [
    (lambda v: v[:HEADER.size - 1], "shorter than the header"),
    (lambda v: v[:-1], "payload"),
    (lambda v: v + b"\0", "payload"),
    (lambda v: _field(v, 0, b"XXXX"), "layout version"),
    (lambda v: _field(v, 1, 2), "layout version"),
    (lambda v: _field(v, 2, 2), "geometry"),          # another dtype
    (lambda v: _field(v, 3, 3), "geometry"),          # layers
    (lambda v: _field(v, 6, 8), "geometry"),          # page size
    (lambda v: _field(v, 7, 1 << 62), "payload"),
    (lambda v: v[:-1] + bytes([v[-1] ^ 1]), "checksum"),
    (lambda v: _field(v, 9, b"\0" * 16), "another key"),
])
def test_each_check_refuses(mutate, why):
    value = CODEC.encode(KEY, _page())
    with pytest.raises(ValueError, match=why):
        CODEC.decode(KEY, mutate(value))


def test_value_moved_or_of_another_model_is_refused():
    value = CODEC.encode(KEY, _page())
    with pytest.raises(ValueError, match="another key"):
        CODEC.decode(CODEC.key(b"\x02" * 16), value)
    other = PageCodec(CFG, "beef")               # same geometry, another model
    with pytest.raises(ValueError, match="another key"):
        other.decode(other.key(b"\x01" * 16), value)
    f16 = PageCodec(PagedKVCacheConfig(4, 8, 2, 2, 8, dtype="float16"), "f00d")
    with pytest.raises(ValueError):
        f16.decode(KEY, value)
    with pytest.raises(TypeError):
        CODEC.decode(KEY, "not bytes")


def _valid_header(payload):
    return CODEC.encode(KEY, payload)[:HEADER.size]


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=HEADER.size + CFG.bytes_per_page() + 8),
    # a valid header over random bytes of any length (the checksum rarely matches)
    st.binary(max_size=CFG.bytes_per_page() + 8).map(
        lambda b: _valid_header(_page()) + b),
    # a valid value with bytes flipped, dropped or appended
    st.tuples(st.lists(st.tuples(st.integers(0, HEADER.size + CFG.bytes_per_page() - 1),
                                 st.integers(1, 255)), max_size=4),
              st.integers(-8, 8)).map(lambda m: _mutated(*m))))
def test_hostile_values_are_only_refused(value):
    try:
        out = CODEC.decode(KEY, value)
    except ValueError:
        return
    # accepted: then it is exactly one page, and the checksum matched
    assert out.nbytes == CFG.bytes_per_page()
    assert zlib.crc32(out) == struct.unpack_from("<I", value, HEADER.size - 20)[0]


def _mutated(flips, cut):
    v = bytearray(CODEC.encode(KEY, _page(1)))
    for i, x in flips:
        v[i] ^= x
    return bytes(v[:cut] if cut < 0 else v + b"\7" * cut)


def test_hostile_value_never_writes_outside_its_page():
    """load_pages takes only exact pages: a decoded payload fills one page, the
    neighbours keep their bytes, and a short/long payload is refused before any copy."""
    from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager
    mgr = PagedKVCacheManager(CFG, enable_prefix_cache=True)
    h = mgr.allocate(AllocationRequest(prompt_tokens=np.arange(9)))
    before = [mgr.page_bytes(p) for p in range(CFG.max_pages)]
    with pytest.raises(ValueError, match="bytes"):
        mgr.load_pages(h, 0, [_page()[:-1]])
    with pytest.raises(ValueError, match="bytes"):
        mgr.load_pages(h, 0, [_page() + b"\0"])
    with pytest.raises(ValueError, match="past"):
        mgr.load_pages(h, 2, [_page(), _page()])
    assert [mgr.page_bytes(p) for p in range(CFG.max_pages)] == before
    page = int(h.block_table()[1])
    mgr.load_pages(h, 1, [CODEC.decode(KEY, CODEC.encode(KEY, _page(3)))])
    for p in range(CFG.max_pages):
        assert mgr.page_bytes(p) == (_page(3) if p == page else before[p])
    mgr.deallocate(h)
    mgr.check_invariants()


_PROBE = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from engine_helpers import ToyModel
from pagedcy.kvcache.kvstore_format import model_fingerprint
from pagedcy.kvcache.prefix import PrefixCache
from pagedcy.kvcache.stats import Counters
from pagedcy.models import load_model
hashes = PrefixCache(4, 8, True, Counters()).prompt_hashes(np.arange(17, dtype=np.int32))
print(json.dumps([[h.hex() for h in hashes], model_fingerprint(ToyModel(seed=3)),
                  model_fingerprint(load_model({ckpt!r}))]))
"""


def test_hashes_and_fingerprints_equal_across_processes(tmp_path):
    from pagedcy.models import load_model, write_random_checkpoint
    ckpt = write_random_checkpoint(str(tmp_path / "a"), tokenizer=False, seed=1)
    code = _PROBE.format(tests=str(__import__("pathlib").Path(__file__).parent), ckpt=ckpt)
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], check=True,
                                      capture_output=True, text=True,
                                      env={**__import__("os").environ,
                                           "PYTHONHASHSEED": str(seed)}).stdout)
            for seed in (1, 2)]
    assert runs[0] == runs[1]
    hashes = PrefixCache(4, 8, True, Counters()).prompt_hashes(np.arange(17, dtype=np.int64))
    assert runs[0][0] == [h.hex() for h in hashes]          # int32 or int64 tokens alike
    assert runs[0][1] == model_fingerprint(ToyModel(seed=3))
    assert runs[0][2] == model_fingerprint(load_model(ckpt))


def test_fingerprint_tells_checkpoints_of_one_config_apart(tmp_path):
    from pagedcy.models import load_model, write_random_checkpoint
    a = load_model(write_random_checkpoint(str(tmp_path / "a"), tokenizer=False, seed=1))
    b = load_model(write_random_checkpoint(str(tmp_path / "b"), tokenizer=False, seed=2))
    assert a.config == b.config
    assert model_fingerprint(a) != model_fingerprint(b)
    assert model_fingerprint(a) != model_fingerprint(a, {"dtype": "bfloat16"})
    assert model_fingerprint(ToyModel(seed=0)) != model_fingerprint(ToyModel(seed=1))
