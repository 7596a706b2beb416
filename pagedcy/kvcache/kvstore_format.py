"""The KV page store's keys and values: what one full prompt page looks like in Redis.

Key: ``pagedcy:kv:v1:{model}:{dtype}:{page_size}:{hash}``: the page's chained prefix hash
(:func:`pagedcy.kvcache.prefix.block_hash`, blake2b over the parent hash and the tokens'
little-endian int64 bytes, so the same in every process and on every machine), scoped by
the model's fingerprint (:func:`model_fingerprint`), the KV storage dtype, the page size
and :data:`LAYOUT_VERSION` (the pool's page layout, HND).

Value: a fixed little-endian header (:data:`HEADER`), then the page's raw bytes exactly as
the pool holds them (every layer's K and V). No pickle: :meth:`PageCodec.decode` checks the
magic, the version, the geometry, the payload length, a crc32 of the payload and a digest
of the key the value was written under (a value copied to another key, or written by
another model, is refused), and only then hands back the payload, which is exactly one
page long.
"""
import dataclasses
import hashlib
import struct
import zlib

import numpy as np

from pagedcy import dtypes as _dtypes

__all__ = ["HEADER", "LAYOUT_VERSION", "MAGIC", "PageCodec", "model_fingerprint"]

#: the pool's page layout this format stores (bump when the page layout changes)
LAYOUT_VERSION = 1
MAGIC = b"PDKV"
#: magic, version, dtype code, layers, kv heads, row elements per head, page size,
#: payload bytes, crc32 of the payload, 16-byte digest of the key
HEADER = struct.Struct("<4sHHIIIIQI16s")
_DTYPE_CODES = {"float32": 1, "float16": 2, "bfloat16": 3, "int8": 4}
_SAMPLES = 16          # windows hashed per large weight array
_WINDOW = 4096         # bytes per window


def _sample_array(h, name, a):
    """Hash ``a``'s name, dtype, shape and bytes (all of a small array; ``_SAMPLES``
    evenly spaced windows of a large one)."""
    h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    n = flat.shape[0]
    if n <= _SAMPLES * _WINDOW:
        h.update(flat.tobytes())
        return
    for i in range(_SAMPLES):
        off = (n - _WINDOW) * i // (_SAMPLES - 1)
        h.update(flat[off:off + _WINDOW].tobytes())


def _stored(name, v):
    """``(name, array)`` of a value that holds weights: an ndarray, or a weight object's
    storage (``pagedcy.models.linear``: ``data``, ``bits``, ``raw``, ``panel``, a stack's ``parts``),
    named with its format so a float32 and a quantized copy of one checkpoint differ."""
    if isinstance(v, np.ndarray):
        yield name, v
        return
    fmt = getattr(v, "format", None)
    if not isinstance(fmt, str):
        return
    for i, part in enumerate(getattr(v, "parts", ())):
        yield from _stored(f"{name}.{i}", part)
    for attr in ("data", "bits", "raw", "panel"):
        a = getattr(v, attr, None)
        if isinstance(a, np.ndarray):
            yield f"{name}:{fmt}", a


def _weight_arrays(model):
    """``(name, array)`` of the model's weights: its ndarray and weight-object attributes
    and those of the dataclasses in its list attributes (a ``CausalLM``'s layers), in a
    fixed order."""
    attrs = vars(model) if hasattr(model, "__dict__") else {}
    for key in sorted(attrs):
        v = attrs[key]
        if isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    for f in dataclasses.fields(item):
                        yield from _stored(f"{key}.{i}.{f.name}", getattr(item, f.name))
        else:
            yield from _stored(key, v)


def model_fingerprint(model, extra=None):
    """A 16-hex-digit digest naming the K/V a model computes, equal in every process:
    its config (the ``config`` attribute's fields), its class, ``weight_bytes``, a
    sample of every weight array (:func:`_weight_arrays`: all of a small array, 16
    windows of 4 KiB of a large one, so another checkpoint of the same config gets
    other keys), the pagedcy version and ``extra`` (a dict of options that change the
    numbers, e.g. a weight dtype)."""
    from pagedcy._version import __version__
    h = hashlib.blake2b(digest_size=8)
    cfg = getattr(model, "config", None)
    fields = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else vars(cfg or object())
    h.update(repr(sorted((k, repr(v)) for k, v in fields.items())).encode())
    h.update(f"{type(model).__qualname__}:{getattr(model, 'weight_bytes', 0)}:{__version__}"
             .encode())
    h.update(repr(sorted((extra or {}).items())).encode())
    for name, a in _weight_arrays(model):
        _sample_array(h, name, a)
    return h.hexdigest()


class PageCodec:
    """Keys and values of one model's pages.

    PageCodec(config, fingerprint): config is the pool's ``PagedKVCacheConfig``
    (geometry, dtype, page size); fingerprint: :func:`model_fingerprint`.
    Attributes: ``prefix`` (every key starts with it), ``page_bytes``.
    """

    def __init__(self, config, fingerprint):
        dtype = str(config.dtype)
        if dtype not in _DTYPE_CODES:
            raise ValueError(f"the KV store cannot hold pages of dtype {dtype!r}")
        self.page_bytes = int(config.bytes_per_page())
        self.prefix = f"pagedcy:kv:v{LAYOUT_VERSION}:{fingerprint}:{dtype}:{config.page_size}:"
        self._geometry = (_DTYPE_CODES[dtype], config.num_layers, config.num_kv_heads,
                          _dtypes.head_row_elems(dtype, config.head_dim), config.page_size)

    def key(self, page_hash):
        """The key of the page whose chained hash is ``page_hash`` (bytes)."""
        return self.prefix + page_hash.hex()

    @staticmethod
    def _tag(key):
        return hashlib.blake2b(key.encode(), digest_size=16).digest()

    def encode(self, key, payload):
        """The value stored under ``key``: header + ``payload`` (one page's bytes)."""
        if len(payload) != self.page_bytes:
            raise ValueError(f"a page has {self.page_bytes} bytes, got {len(payload)}")
        head = HEADER.pack(MAGIC, LAYOUT_VERSION, *self._geometry, len(payload),
                           zlib.crc32(payload), self._tag(key))
        return head + payload

    def decode(self, key, value):
        """The page bytes (a memoryview of exactly ``page_bytes``) of ``value`` read
        from ``key``. ValueError naming the first check that fails (short, wrong magic or
        version, other geometry or dtype, wrong length, bad checksum, another key's value);
        TypeError if ``value`` is not bytes-like."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"a stored value must be bytes, got {type(value).__name__}")
        mv = memoryview(value).cast("B")
        if mv.nbytes < HEADER.size:
            raise ValueError(f"value of {mv.nbytes} bytes is shorter than the header")
        magic, version, code, layers, heads, row, ps, n, crc, tag = HEADER.unpack_from(mv)
        if magic != MAGIC or version != LAYOUT_VERSION:
            raise ValueError("not a pagedcy KV page of this layout version")
        if (code, layers, heads, row, ps) != self._geometry:
            raise ValueError(f"page geometry {(code, layers, heads, row, ps)} is not "
                             f"{self._geometry} (another model, dtype or page size)")
        if n != self.page_bytes or mv.nbytes != HEADER.size + n:
            raise ValueError(f"payload of {mv.nbytes - HEADER.size} bytes (header says {n}), "
                             f"a page has {self.page_bytes}")
        payload = mv[HEADER.size:]
        if zlib.crc32(payload) != crc:
            raise ValueError("page checksum mismatch (a corrupt value)")
        if tag != self._tag(key):
            raise ValueError("the value was written for another key")
        return payload
