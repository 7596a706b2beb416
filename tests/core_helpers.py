"""Shared helpers for the core tests: independent NumPy references and a plain-Python cache model.

Nothing here imports pagedcy: expected values must never come from the code under test.
"""
import numpy as np

STORAGE_DTYPES = ("float32", "float16", "bfloat16")


# -- dtype references -------------------------------------------------------------------------

def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16, done on the raw bits with integer ops.

    NaN is excluded by the callers (payload handling is implementation-defined); the carry
    out of the mantissa correctly rolls into the exponent (so huge values round to inf).
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> np.uint64(16)) & np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + lsb) >> np.uint64(16)
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def stored_bits(x, dtype):
    """The exact 16/32-bit patterns a store of float32 ``x`` in ``dtype`` must hold."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.view(np.uint32)
    if dtype == "float16":
        with np.errstate(over="ignore"):  # overflow to inf is the expected rounding
            return x.astype(np.float16).view(np.uint16)
    if dtype == "bfloat16":
        return f32_to_bf16_bits(x)
    raise AssertionError(dtype)


def stored_as_f32(x, dtype):
    """float32 value of ``x`` after a round trip through ``dtype`` storage."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def bits_of(arr):
    """Raw bit patterns of an array of any 2- or 4-byte dtype (bf16 may be ml_dtypes or uint16)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.itemsize == 4:
        return arr.view(np.uint32)
    if arr.dtype.itemsize == 2:
        return arr.view(np.uint16)
    raise AssertionError(arr.dtype)


def assert_bits_equal(got, want_bits, msg=""):
    got_bits = bits_of(got).reshape(np.shape(want_bits))
    if not np.array_equal(got_bits, want_bits):
        bad = np.argwhere(got_bits != want_bits)
        raise AssertionError(f"{msg}: {len(bad)} values differ, first at {bad[0].tolist()}: "
                             f"got {got_bits[tuple(bad[0])]:#x}, want {want_bits[tuple(bad[0])]:#x}")


# -- a plain-Python model of PagedKVCache -----------------------------------------------------

class ModelExhausted(Exception):
    pass


class CacheModel:
    """Reference semantics of a single-sequence paged cache (the reference design, with LRU
    eviction as a sliding window).

    Physical pages follow the reference design: a LIFO free stack that hands out 0, 1, 2, ... when fresh;
    reset returns the table's pages to the stack in logical order; LRU eviction pops the
    front page of the table and maps it again at the back. Token rows live in per-layer
    Python lists indexed by absolute position; ``None`` marks a row nobody wrote (its content
    is whatever the reused page held, so reads of it are not compared).
    """

    def __init__(self, page_size, max_pages, num_layers, lru):
        self.ps = page_size
        self.max_pages = max_pages
        self.num_layers = num_layers
        self.lru = lru
        self.free = list(range(max_pages - 1, -1, -1))
        self.table = []
        self.total = 0          # tokens ever committed (absolute end position)
        self.evicted = 0
        self.k = [[] for _ in range(num_layers)]
        self.v = [[] for _ in range(num_layers)]
        self.pending = {}       # layer -> (k_row, v_row) written at position seq_len, not advanced

    @property
    def seq_len(self):
        return self.total - self.evicted

    def _need_page_for(self, rel_pos):
        """Map a page so relative position ``rel_pos`` is covered (mutates)."""
        if rel_pos < len(self.table) * self.ps:
            return
        if self.free:
            self.table.append(self.free.pop())
        elif self.lru and self.table:
            self.table.append(self.table.pop(0))
            self.evicted += self.ps
        else:
            raise ModelExhausted()

    def append_kv_layer(self, layer, k_row, v_row):
        self._need_page_for(self.seq_len)
        self.pending[layer] = (np.array(k_row, dtype=np.float32), np.array(v_row, dtype=np.float32))

    def advance(self):
        if self.seq_len + 1 > len(self.table) * self.ps:
            raise ValueError("advance past mapped pages")
        for layer in range(self.num_layers):
            kv = self.pending.get(layer)
            self.k[layer].append(None if kv is None else kv[0])
            self.v[layer].append(None if kv is None else kv[1])
        self.pending = {}
        self.total += 1

    def append_tokens(self, k, v):
        """k, v: [num_layers, n, kv_dim]. All-or-nothing under policy NONE."""
        n = k.shape[1]
        if n == 0:
            return
        if not self.lru:
            need = -(-(self.seq_len + n) // self.ps) - len(self.table)
            if need > len(self.free):
                raise ModelExhausted()
        for i in range(n):
            self._need_page_for(self.seq_len)
            for layer in range(self.num_layers):
                self.k[layer].append(np.array(k[layer, i], dtype=np.float32))
                self.v[layer].append(np.array(v[layer, i], dtype=np.float32))
            self.total += 1
        self.pending = {}

    def reset(self):
        for p in self.table:
            self.free.append(p)
        self.table = []
        self.total = 0
        self.evicted = 0
        self.k = [[] for _ in range(self.num_layers)]
        self.v = [[] for _ in range(self.num_layers)]
        self.pending = {}

    def window(self, layer, which):
        rows = (self.k if which == "k" else self.v)[layer]
        return rows[self.evicted:self.total]


def check_window(got, rows, kv_dim, dtype="float32", msg=""):
    """Compare a gathered [seq_len, kv_dim] array to model rows (skipping unwritten rows)."""
    got = np.asarray(got).reshape(len(rows), kv_dim)
    for i, row in enumerate(rows):
        if row is None:
            continue
        want = stored_bits(row, dtype)
        if not np.array_equal(bits_of(got[i]), want):
            raise AssertionError(f"{msg}: row {i} differs: got {got[i][:4]}..., want {row[:4]}...")
