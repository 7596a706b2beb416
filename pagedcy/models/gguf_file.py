"""GGUFFile: a GGUF file's metadata and memory-mapped tensors, every offset and size checked.

The header is parsed here rather than by ``gguf.GGUFReader``, which sizes its arrays from the
counts a file claims (a header stating 2**40 tensors or a 2**60-byte string makes it allocate
or walk off the end). This reader checks each count against the bytes left before reading the
items, so a corrupt or hostile file costs memory proportional to its own size and raises a
ValueError naming the problem. Tensor data is never read: each :class:`GGUFTensor` is a
read-only uint8 view of the memory map. Block sizes below are GGML's (``ggml.h``), which
``gguf.GGML_QUANT_SIZES`` also lists; ``gguf.quants`` dequantizes (:meth:`GGUFTensor.dequantize`).
Little-endian GGUF v2 and v3 files are read (their layouts are identical).
"""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np

__all__ = ["GGUFFile", "GGUFTensor", "SUPPORTED_TYPES"]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4                 # GGML_MAX_DIMS
_MAX_NAME = 1 << 16           # longer keys/tensor names are corruption, not models
_MAX_ELEMENTS = 1 << 48       # more elements than any tensor; keeps size arithmetic sane
_MAX_NESTING = 4              # arrays of arrays of ...

#: ggml type number -> (name, elements per block, bytes per block) for the types pagedcy loads.
SUPPORTED_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
}
#: Other types ggml defines (name, block, bytes): recognised so the error can name them.
_OTHER_TYPES = {
    9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# GGUF metadata value types -> struct format (scalars); 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
            10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY, _BOOL, _F32 = 8, 9, 7, 6


class GGUFTensor:
    """One tensor of a GGUF file, still in the file's encoding.

    ``name`` (str), ``ggml_type`` (int, a key of :data:`SUPPORTED_TYPES` once loaded),
    ``shape``: the logical shape in Hugging Face order (``(out, in)`` for a 2-D weight: GGUF
    lists dimensions innermost first), ``raw``: a read-only uint8 array ``[rows, row_bytes]``
    (``rows`` = product of ``shape[:-1]``), normally a view of the file's memory map.
    """

    __slots__ = ("name", "ggml_type", "shape", "raw")

    def __init__(self, name: str, ggml_type: int, shape: tuple[int, ...], raw: np.ndarray):
        self.name, self.ggml_type, self.shape, self.raw = name, ggml_type, tuple(shape), raw

    @property
    def type_name(self) -> str:
        """The ggml type's name, e.g. ``"Q4_K"``."""
        return type_name(self.ggml_type)

    def dequantize(self) -> np.ndarray:
        """The tensor as a new float32 array of ``shape`` (through ``gguf.quants``)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return np.asarray(dequantize(self.raw, GGMLQuantizationType(self.ggml_type)), dtype=np.float32).reshape(self.shape)

    def with_raw(self, name: str, raw: np.ndarray) -> "GGUFTensor":
        """The same tensor under a new name and with replaced (same-shaped) raw rows."""
        if raw.shape != self.raw.shape:
            raise ValueError(f"raw rows {raw.shape} do not match {self.raw.shape}")
        return GGUFTensor(name, self.ggml_type, self.shape, raw)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, {self.type_name}, shape={self.shape})"


def type_name(ggml_type: int) -> str:
    """Name of a ggml type number (``"type 99"`` for one ggml does not define)."""
    known = SUPPORTED_TYPES.get(ggml_type) or _OTHER_TYPES.get(ggml_type)
    return known[0] if known else f"type {ggml_type}"


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf, pos=0):
        self.buf, self.pos, self.size = buf, pos, len(buf)

    def need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"truncated GGUF file: {what} needs {n} bytes at offset {self.pos}, "
                             f"the file has {self.size}")

    def scalar(self, fmt, what):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def count(self, what, item_bytes):
        """A uint64 count of items of at least ``item_bytes`` bytes each, checked against
        the bytes left so nothing is allocated for items that cannot be there."""
        n = self.scalar("<Q", what)
        left = self.size - self.pos
        if n * item_bytes > left:
            raise ValueError(f"corrupt GGUF file: {what} is {n}, but only {left} bytes follow "
                             f"(at least {item_bytes} per item)")
        return n

    def string(self, what, limit=None):
        n = self.scalar("<Q", f"length of {what}")
        if limit is not None and n > limit:
            raise ValueError(f"corrupt GGUF file: {what} is {n} bytes long (limit {limit})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"corrupt GGUF file: {what} is not UTF-8") from None


def _min_size(vtype):
    """Fewest bytes a value of type ``vtype`` occupies (for count checks)."""
    if vtype == _STRING:
        return 8
    if vtype == _ARRAY:
        return 12
    return struct.calcsize(_SCALARS[vtype])


def _value(cur, vtype, key, depth=0):
    """One metadata value: int/float/bool/str, a list (strings, arrays) or a 1-D NumPy copy."""
    if vtype in _SCALARS:
        v = cur.scalar(_SCALARS[vtype], f"value of {key!r}")
        if vtype == _F32:   # the shortest decimal that rounds to it: 1e-06, not 9.99999997e-07
            return float(str(np.float32(v)))
        return bool(v) if vtype == _BOOL else v
    if vtype == _STRING:
        return cur.string(f"value of {key!r}")
    if vtype != _ARRAY:
        raise ValueError(f"corrupt GGUF file: metadata {key!r} has unknown value type {vtype}")
    if depth >= _MAX_NESTING:
        raise ValueError(f"corrupt GGUF file: metadata {key!r} nests arrays deeper than {_MAX_NESTING}")
    etype = cur.scalar("<I", f"array type of {key!r}")
    if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
        raise ValueError(f"corrupt GGUF file: metadata {key!r} is an array of unknown type {etype}")
    n = cur.count(f"length of array {key!r}", _min_size(etype))
    if etype in _SCALARS:
        nbytes = n * struct.calcsize(_SCALARS[etype])
        arr = np.frombuffer(cur.buf, dtype=_NUMPY[etype], count=n, offset=cur.pos).copy()
        cur.pos += nbytes
        return arr.astype(bool) if etype == _BOOL else arr
    if etype == _STRING:
        return [cur.string(f"item of {key!r}") for _ in range(n)]
    return [_value(cur, _ARRAY, key, depth + 1) for _ in range(n)]


class GGUFFile:
    """The parsed header and memory-mapped tensors of a GGUF file.

    ``metadata``: dict key -> value (int, float, bool, str, list of str, 1-D NumPy array for
    numeric arrays); ``tensors``: dict GGUF tensor name -> :class:`GGUFTensor` in file order;
    ``version``, ``alignment``, ``data_offset``, ``file_size`` (ints). Tensors of a type pagedcy
    does not load are listed (their ``raw`` is None) so a caller can name them:
    :meth:`check_types`. FileNotFoundError for a missing file, ValueError for a malformed one.
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no GGUF file at {path!r}")
        self.path = path
        self._mm = None
        with open(path, "rb") as f:
            self.file_size = os.fstat(f.fileno()).st_size
            if self.file_size < 24:
                raise ValueError(f"truncated GGUF file: {self.file_size} bytes, a header needs 24")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(memoryview(self._mm))
        except BaseException:
            self.close()
            raise

    def _parse(self, buf):
        cur = _Cursor(buf)
        if bytes(buf[:4]) != _MAGIC:
            raise ValueError(f"not a GGUF file: magic {bytes(buf[:4])!r}, expected {_MAGIC!r}")
        cur.pos = 4
        self.version = cur.scalar("<I", "version")
        if self.version not in _VERSIONS:
            if struct.unpack(">I", struct.pack("<I", self.version))[0] in _VERSIONS:
                raise ValueError("big-endian GGUF files are not supported")
            raise ValueError(f"unsupported GGUF version {self.version}; supported: 2, 3")
        n_tensors = cur.scalar("<Q", "tensor count")
        n_kv = cur.count("metadata count", 8 + 4 + 1)
        self.metadata = {}
        for _ in range(n_kv):
            key = cur.string("metadata key", _MAX_NAME)
            if key in self.metadata:
                raise ValueError(f"corrupt GGUF file: metadata key {key!r} appears twice")
            self.metadata[key] = _value(cur, cur.scalar("<I", f"type of {key!r}"), key)
        left = cur.size - cur.pos
        if n_tensors * (8 + 4 + 4 + 8) > left:
            raise ValueError(f"corrupt GGUF file: tensor count is {n_tensors}, but only {left} "
                             "bytes follow the metadata")
        align = self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or align < 1 or align & (align - 1):
            raise ValueError(f"corrupt GGUF file: general.alignment must be a power of two, got {align!r}")
        self.alignment = align
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        self.data_offset = -(-cur.pos // align) * align
        self.tensors = {}
        end = self.data_offset
        for name, gtype, shape, offset, nbytes in sorted(infos, key=lambda t: t[3]):
            if name in self.tensors:
                raise ValueError(f"corrupt GGUF file: tensor {name!r} appears twice")
            start = self.data_offset + offset
            if offset % align:
                raise ValueError(f"corrupt GGUF file: tensor {name!r} offset {offset} is not a "
                                 f"multiple of the alignment {align}")
            if start < end:
                raise ValueError(f"corrupt GGUF file: tensor {name!r} overlaps the previous tensor")
            end = start + nbytes
            if end > self.file_size:
                raise ValueError(f"truncated GGUF file: tensor {name!r} ends at byte {end}, "
                                 f"past the end of the file ({self.file_size} bytes)")
            raw = None
            if gtype in SUPPORTED_TYPES:
                row = SUPPORTED_TYPES[gtype]
                row_bytes = shape[-1] // row[1] * row[2]
                raw = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes, offset=start)
                raw = raw.reshape(nbytes // row_bytes, row_bytes)
            self.tensors[name] = GGUFTensor(name, gtype, shape, raw)
        order = {t[0]: i for i, t in enumerate(infos)}
        self.tensors = dict(sorted(self.tensors.items(), key=lambda kv: order[kv[0]]))

    def _tensor_info(self, cur):
        name = cur.string("tensor name", _MAX_NAME)
        n_dims = cur.scalar("<I", f"dimension count of tensor {name!r}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise ValueError(f"corrupt GGUF file: tensor {name!r} has {n_dims} dimensions "
                             f"(1 to {_MAX_DIMS} allowed)")
        dims = [cur.scalar("<Q", f"dimensions of tensor {name!r}") for _ in range(n_dims)]
        gtype = cur.scalar("<I", f"type of tensor {name!r}")
        offset = cur.scalar("<Q", f"offset of tensor {name!r}")
        elements = 1
        for d in dims:
            elements *= d
            if d < 1 or elements > _MAX_ELEMENTS:
                raise ValueError(f"corrupt GGUF file: tensor {name!r} has dimensions {dims}")
        info = SUPPORTED_TYPES.get(gtype) or _OTHER_TYPES.get(gtype)
        if info is None:
            raise ValueError(f"corrupt GGUF file: tensor {name!r} has unknown ggml type {gtype}")
        _, block, block_bytes = info
        if dims[0] % block:
            raise ValueError(f"corrupt GGUF file: tensor {name!r} ({info[0]}) has a row of "
                             f"{dims[0]} elements, not a multiple of its block size {block}")
        return name, gtype, tuple(reversed(dims)), offset, elements // block * block_bytes

    def check_types(self, names=None) -> None:
        """ValueError naming the first tensor (of ``names``, default all) whose type pagedcy
        does not load, with the supported types."""
        for name in self.tensors if names is None else names:
            t = self.tensors[name]
            if t.raw is None:
                supported = ", ".join(v[0] for v in SUPPORTED_TYPES.values())
                raise ValueError(f"tensor {name!r} has ggml type {t.type_name}, which pagedcy "
                                 f"does not load; supported: {supported}")

    def close(self) -> None:
        """Release the memory map. Views still held (``GGUFTensor.raw``) keep it alive until
        they are dropped; the file is then unmapped by the garbage collector."""
        mm, self._mm = self._mm, None
        self.tensors = {}
        if mm is not None:
            try:
                mm.close()
            except BufferError:   # exported views exist: they own the mapping now
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
