"""GGUFFile: agrees with gguf.GGUFReader on valid files; every malformed file (truncated,
wrong magic/version, bad counts, sizes, offsets, types) raises a ValueError naming the problem,
with memory bounded by the file's size, never by the counts it claims."""
import os
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from pagedcy.models.gguf_file import GGUFFile                   # noqa: E402
from pagedcy.models.gguf_model import read_gguf                 # noqa: E402

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def _str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _kv(key, vtype, payload):
    return _str(key) + struct.pack("<I", vtype) + payload


def _ti(name, dims, gtype=0, offset=0):
    return (_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<II", gtype, 0)[:4] + struct.pack("<Q", offset))


def _file(path, kvs=(), infos=(), data=b"", version=3, n_tensors=None, n_kv=None, magic=b"GGUF"):
    """Hand-built GGUF bytes: header, ``kvs`` (encoded), tensor ``infos`` (encoded), padding to
    32 bytes, ``data``."""
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    body += b"\0" * (-len(body) % 32)
    with open(path, "wb") as f:
        f.write(body + data)
    return path


def _arch():
    return _kv("general.architecture", STR, _str("llama"))


def _valid(tmp_path):
    """A small converter-style file: metadata of every kind plus F32 and Q8_0 tensors."""
    from gguf.quants import quantize

    path = os.fspath(tmp_path / "valid.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_float32("x.f", 0.5)
    w.add_bool("x.b", True)
    w.add_string("x.s", "héllo ✓")
    w.add_array("x.ints", [1, -2, 3])
    w.add_array("x.strs", ["a", "", "日本"])
    w.add_array("x.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((4, 64), dtype=np.float32))
    w.add_tensor("blk.0.ffn_up.weight",
                 quantize(rng.standard_normal((3, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", rng.standard_normal(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_agrees_with_gguf_reader(tmp_path):
    path = _valid(tmp_path)
    ref = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert f.version == 3 and f.file_size == os.path.getsize(path)
        for name, field in ref.fields.items():
            if name.startswith("GGUF.") or name == "x.nested":   # GGUFReader flattens nesting
                continue
            want, got = field.contents(), f.metadata[name]
            if isinstance(got, np.ndarray):
                got = got.tolist()
            elif isinstance(got, list):
                got = [g.tolist() if isinstance(g, np.ndarray) else g for g in got]
            assert got == (pytest.approx(want) if isinstance(want, float) else want), name
        assert [a.tolist() for a in f.metadata["x.nested"]] == [[1, 2], [3]]
        assert list(f.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            ours = f.tensors[t.name]
            assert ours.ggml_type == int(t.tensor_type)
            assert ours.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
            assert ours.raw.tobytes() == np.asarray(t.data).tobytes()
            assert not ours.raw.flags.writeable and ours.raw.base is not None   # a view


def test_truncated_at_every_offset(tmp_path):
    path = _valid(tmp_path)
    blob = open(path, "rb").read()
    ref = gguf.GGUFReader(path)
    last = max(t.data_offset + t.n_bytes for t in ref.tensors)     # end of the last tensor
    header = min(t.data_offset for t in ref.tensors)
    del ref
    cut_path = tmp_path / "cut.gguf"
    for cut in list(range(0, header + 64)) + list(range(header + 64, len(blob), 7)):
        cut_path.write_bytes(blob[:cut])
        if cut >= last:                 # only trailing padding lost: still a valid file
            GGUFFile(cut_path).close()
            continue
        with pytest.raises(ValueError, match="truncated|corrupt|not a GGUF"):
            GGUFFile(cut_path)


@pytest.mark.parametrize("magic,version,match", [
    (b"GGUG", 3, "not a GGUF file"), (b"\0\0\0\0", 3, "not a GGUF file"),
    (b"GGUF", 1, "unsupported GGUF version 1"), (b"GGUF", 4, "unsupported GGUF version 4"),
    (b"GGUF", 0x03000000, "big-endian"),
])
def test_magic_and_version(tmp_path, magic, version, match):
    path = _file(tmp_path / "m.gguf", [_arch()], magic=magic, version=version)
    with pytest.raises(ValueError, match=match):
        GGUFFile(path)


def test_version_2_reads(tmp_path):
    path = _file(tmp_path / "v2.gguf", [_arch()], [_ti("t", [4])], data=b"\0" * 16, version=2)
    with GGUFFile(path) as f:
        assert f.version == 2 and f.tensors["t"].shape == (4,)


BIG = 2**60
BAD_HEADERS = {
    "n_tensors 2**40": (dict(n_tensors=2**40), "tensor count"),
    "n_tensors 2**64-1": (dict(n_tensors=2**64 - 1), "tensor count"),
    "n_kv 2**60": (dict(n_kv=BIG), "metadata count"),
    "key length past EOF": (dict(kvs=[struct.pack("<Q", BIG) + b"k" * 64]), "metadata key"),
    "string value past EOF": (dict(kvs=[_kv("k", STR, struct.pack("<Q", BIG))]), "value of 'k'"),
    "array count 2**60": (dict(kvs=[_kv("k", ARR, struct.pack("<IQ", U32, BIG))]), "length of array 'k'"),
    "string array count": (dict(kvs=[_kv("k", ARR, struct.pack("<IQ", STR, BIG))]), "length of array 'k'"),
    "unknown value type": (dict(kvs=[_kv("k", 13, b"\0" * 8)]), "unknown value type 13"),
    "unknown array type": (dict(kvs=[_kv("k", ARR, struct.pack("<IQ", 99, 1))]), "unknown type 99"),
    "deep nesting": (dict(kvs=[_kv("k", ARR, struct.pack("<IQ", ARR, 1) * 6 + struct.pack("<IQ", U32, 0))]),
                     "nests arrays"),
    "duplicate key": (dict(kvs=[_arch(), _arch()]), "appears twice"),
    "invalid UTF-8": (dict(kvs=[_kv("k", STR, _str(b"\xff\xfe"))]), "not UTF-8"),
    "n_dims 5": (dict(infos=[_ti("t", [1, 1, 1, 1, 1])]), "5 dimensions"),
    "n_dims 0": (dict(infos=[_ti("t", [])]), "0 dimensions"),
    "zero dimension": (dict(infos=[_ti("t", [4, 0])]), "dimensions"),
    "dimension product overflows": (dict(infos=[_ti("t", [2**40, 2**40])]), "dimensions"),
    "dimension 2**64-1": (dict(infos=[_ti("t", [2**64 - 1])]), "dimensions"),
    "unknown tensor type": (dict(infos=[_ti("t", [32], gtype=99)]), "unknown ggml type 99"),
    "row not whole blocks": (dict(infos=[_ti("t", [33], gtype=8)]), "block size 32"),
    "tensor past EOF": (dict(infos=[_ti("t", [64], offset=0)], data=b"\0" * 100), "past the end"),
    "offset past EOF": (dict(infos=[_ti("t", [4], offset=2**62)], data=b"\0" * 16), "past the end"),
    "misaligned offset": (dict(infos=[_ti("t", [4], offset=4)], data=b"\0" * 64), "alignment"),
    "overlapping tensors": (dict(infos=[_ti("a", [16]), _ti("b", [16], offset=32)], data=b"\0" * 128),
                            "overlaps"),
    "duplicate tensor": (dict(infos=[_ti("a", [4]), _ti("a", [4], offset=32)], data=b"\0" * 64),
                         "appears twice"),
    "bad alignment": (dict(kvs=[_kv("general.alignment", U32, struct.pack("<I", 24))]), "power of two"),
    "alignment wrong type": (dict(kvs=[_kv("general.alignment", STR, _str("32"))]), "power of two"),
    "tensor name past EOF": (dict(infos=[struct.pack("<Q", BIG)]), "tensor name"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_bad_header(tmp_path, case):
    kwargs, match = BAD_HEADERS[case]
    kwargs = dict(kwargs)
    kvs = kwargs.pop("kvs", [_arch()])
    path = _file(tmp_path / "bad.gguf", kvs, **kwargs)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=match):
            GGUFFile(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{case}: {peak} bytes traced"


def test_huge_counts_stay_bounded_in_rss(tmp_path):
    """A header claiming 2**40 tensors (and one claiming a 2**40-item array) costs no more
    than a few MB of resident memory: measured in a fresh process, whose peak RSS is not
    already inflated by earlier tests."""
    import subprocess
    import sys

    import pagedcy

    paths = [_file(tmp_path / "a.gguf", [_arch()], n_tensors=2**40),
             _file(tmp_path / "b.gguf", [_kv("k", ARR, struct.pack("<IQ", STR, 2**40))]),
             _file(tmp_path / "c.gguf", [_arch()], [_ti("t", [2**31, 2**17])], data=b"\0" * 64)]
    code = (f"import resource, sys\nfrom pagedcy.models.gguf_file import GGUFFile\n"
            f"before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"for p in {[os.fspath(p) for p in paths]!r} * 20:\n"
            f"    try:\n        GGUFFile(p)\n    except ValueError:\n        pass\n"
            f"    else:\n        sys.exit('no ValueError for ' + p)\n"
            f"print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(pagedcy.__file__)))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root), timeout=120).stdout
    assert int(out.split()[-1]) < 4 * 1024          # KiB


def test_empty_and_missing(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile(tmp_path / "empty.gguf")
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path)              # a directory is not a file


@pytest.fixture(scope="module")
def valid_blob(tmp_path_factory):
    path = _valid(tmp_path_factory.mktemp("fuzz"))
    with GGUFFile(path) as f:
        header = f.data_offset
    return _Blob(open(path, "rb").read(), header)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_headers(valid_blob, tmp_path, data):
    """Random byte edits in the header (and random truncation): only ValueError, and a file
    that opens has tensors whose bytes can all be read."""
    blob, header = valid_blob
    b = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, header - 1))
        if data.draw(st.booleans()):
            b[pos] = data.draw(st.integers(0, 255))
        else:          # a plausible-looking large 64-bit value
            v = data.draw(st.sampled_from([0, 1, 5, 2**31, 2**32 - 1, 2**40, 2**63, 2**64 - 1]))
            b[pos:pos + 8] = struct.pack("<Q", v)[:max(0, min(8, header - pos))]
    if data.draw(st.booleans()):
        b = b[:data.draw(st.integers(0, len(b)))]
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(b))
    tracemalloc.start()
    try:
        try:
            with GGUFFile(path) as f:
                total = sum(int(t.raw.sum()) for t in f.tensors.values() if t.raw is not None)
                assert total >= 0
            read_gguf(path).close()
        except ValueError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.fixture(scope="module")
def model_blob(tmp_path_factory):
    from pagedcy.models import write_random_checkpoint
    from pagedcy.tools.gguf_fixture import write_gguf

    d = tmp_path_factory.mktemp("fuzz_model")
    ckpt = write_random_checkpoint(d / "hf", "LlamaForCausalLM", hidden_size=64, intermediate_size=64,
                                   num_hidden_layers=1)
    path = write_gguf(ckpt, d / "m.gguf", tensor_type="Q8_0")
    with GGUFFile(path) as f:
        header = f.data_offset
    return _Blob(open(path, "rb").read(), header)


class _Blob(tuple):
    """(bytes, header size) with a short repr, so a failing example prints readably."""

    def __new__(cls, blob, header):
        return super().__new__(cls, (blob, header))

    def __repr__(self):
        return f"<GGUF of {len(self[0])} bytes, header {self[1]}>"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_converted_model(model_blob, tmp_path, data):
    """Byte edits anywhere in a converted model's header: read_gguf, the config, the tensor
    map and the tokenizer raise only ValueError."""
    blob, header = model_blob
    b = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        b[data.draw(st.integers(0, header - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(b))
    try:
        with read_gguf(path) as f:
            f.tokenizer().encode("hello world")
            for t in f.tensors.values():
                t.dequantize()
    except ValueError:
        pass
