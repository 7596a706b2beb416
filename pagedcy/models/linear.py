"""Weight matrices that know their storage format and compute ``out = x @ W.T``.

A projection is ``[N, K]`` (output-major, as checkpoints store it) in one of:

- :class:`DenseWeight`: float32, run by ``pagedcy._libs._gemm.linear``;
- :class:`HalfWeight`: float16 or bfloat16 bit patterns kept as stored (2 bytes a value);
- :class:`BlockWeight`: a GGUF block format (Q8_0, Q4_0, Q4_K, ...), raw bytes ``[N, row_bytes]``
  as the file stores them, with float32 activations;
- :class:`PanelWeight`: a GGUF block format repacked once into panels of 16 rows, with
  int8 activations (as llama.cpp computes them);
- :class:`StackedWeight`: rows of parts in different formats (a fused q|k|v from a Q4_K_M file
  whose v rows are Q6_K), each part run on its own and written to its columns of ``out``.

All compute in float32 (``x`` float32 ``[M, K]`` -> ``out`` float32 ``[M, N]``). Loaders
(safetensors, GGUF) build these objects; the forward pass only calls ``linear`` and
``take_rows``, so a new format is a new class here, not a change to the model.

Every format computes on the one GEMM, ``pagedcy._libs._gemm``: float32 through ``linear``, the
others through ``linear_rows``, which widens 16-bit rows and decodes GGUF blocks in registers
at decode sizes and into its packed panel at prefill sizes, in one summation order for every
M (a row's result does not depend on the batch). Each weight resolves its kernel's format
name once, at construction: a format the GEMM does not compute is refused there.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from pagedcy._libs import _gemm, _q8panel, _quant

__all__ = ["Weight", "DenseWeight", "HalfWeight", "BlockWeight", "PanelWeight", "StackedWeight",
           "concat_weights", "HALF_FORMATS"]

HALF_FORMATS = ("float16", "bfloat16")

_tls = threading.local()     # per-thread scratch: a StackedWeight part's output


def _scratch(name: str, n: int) -> np.ndarray:
    """A float32 buffer of ``n`` elements, reused by this thread (grown, never shrunk)."""
    buf = getattr(_tls, name, None)
    if buf is None or buf.size < n:
        buf = np.empty(n, np.float32)
        setattr(_tls, name, buf)
    return buf[:n]


def _check_io(x, out, n: int, k: int) -> int:
    """Validate ``x`` float32 [M, K] and ``out`` float32 [M, N] (C-contiguous); return M."""
    for name, a, cols in (("x", x, k), ("out", out, n)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
        if a.dtype != np.float32:
            raise TypeError(f"{name} must be float32, got {a.dtype}")
        if a.ndim != 2 or a.shape[1] != cols or not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous [M, {cols}], got shape {a.shape}")
    if x.shape[0] != out.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows, out {out.shape[0]}")
    if not out.flags.writeable:
        raise ValueError("out must be writable")
    return x.shape[0]


_ALIGN = 64     # bytes: a cache line, and the width of an AVX-512 load


def aligned_copy(a: np.ndarray, always: bool = False) -> np.ndarray:
    """A C-contiguous copy of ``a`` starting on a 64-byte boundary, in NumPy's own memory
    (huge pages for large arrays); ``a`` itself when it is C-contiguous and aligned already,
    unless ``always``.

    The GEMM's tiles load weight rows 64 bytes at a time, and NumPy's large allocations
    start 16 bytes into a cache line, so every such load of a row spanned two lines: a
    16-row decode step through a 512 x 512 float32 projection ran at 209 GFLOP/s from such
    an array and 276 from an aligned one, the 32000-row LM head 206 against 268 (Intel Xeon,
    2 threads)."""
    if not always and a.flags.c_contiguous and a.ctypes.data % _ALIGN == 0:
        return a
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


def aligned_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (float32 by default)
    starting on a 64-byte boundary (the GEMM reads rows of its activations 64 bytes at a
    time too: see :func:`aligned_copy`)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(nbytes + _ALIGN, np.uint8)
    off = -buf.ctypes.data % _ALIGN
    return buf[off:off + nbytes].view(dtype).reshape(shape)


def _own_aligned(a: np.ndarray) -> np.ndarray:
    """``a`` moved to 64-byte-aligned memory when it owns its memory (a copy made for this
    weight: concatenated, widened, rounded); views (a memory-mapped file's tensors) stay."""
    return aligned_copy(a) if a.flags.owndata else a


def _widen_half(bits: np.ndarray, fmt: str, dst: np.ndarray) -> None:
    """Widen 16-bit patterns ``bits`` (uint16) of format ``fmt`` into float32 ``dst`` (exact)."""
    if fmt == "bfloat16":
        np.left_shift(bits, np.uint32(16), out=dst.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(dst, bits.view(np.float16))


def _gemm_format(fmt: str) -> str:
    """The GEMM's name of storage format ``fmt`` (a 16-bit format or a GGUF block type's
    lower-case name); ValueError for one it does not compute."""
    name = {"float16": "f16", "bfloat16": "bf16"}.get(fmt, fmt)
    if name not in _gemm.FORMATS and name not in _gemm.BLOCK_FORMATS:
        known = sorted(set(HALF_FORMATS) | set(_gemm.BLOCK_FORMATS))
        raise ValueError(f"no GEMM computes {fmt!r} weights; supported: {', '.join(known)}")
    return name


class Weight:
    """Base of the weight classes: ``shape`` (N, K), ``format`` (its storage's name),
    ``nbytes`` (bytes held), ``linear``, ``take_rows`` and ``dense``. A subclass sets the
    three attributes and implements ``_linear`` and ``_take``."""

    shape: tuple[int, int]
    format: str
    nbytes: int

    def linear(self, x: np.ndarray, out: np.ndarray, num_threads=None) -> np.ndarray:
        """``out[...] = x @ W.T``: ``x`` float32 ``[M, K]``, ``out`` float32 ``[M, N]``,
        both C-contiguous. Returns ``out``."""
        return self._linear(x, out, num_threads)

    def _linear(self, x, out, num_threads):
        raise NotImplementedError

    def take_rows(self, ids, out: np.ndarray) -> np.ndarray:
        """``out[i] = W[ids[i]]`` widened to float32 (``out`` ``[len(ids), K]``): the embedding
        lookup. IndexError for an id outside ``[0, N)``. Returns ``out``."""
        rows = np.asarray(ids)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"row ids must be in [0, {self.shape[0]})")
        self._take(rows, out)
        return out

    def _take(self, rows, out):
        raise NotImplementedError

    def dense(self) -> np.ndarray:
        """A float32 ``[N, K]`` copy (for tests and conversions)."""
        out = np.empty(self.shape, np.float32)
        return self.take_rows(np.arange(self.shape[0]), out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.format}, shape={self.shape})"


class DenseWeight(Weight):
    """A float32 ``[N, K]`` matrix (``data``, C-contiguous), on pagedcy's GEMM."""

    format = "float32"

    def __init__(self, data: np.ndarray):
        self.data = _own_aligned(np.ascontiguousarray(data, dtype=np.float32))
        if self.data.ndim != 2:
            raise ValueError(f"a weight must be 2-D, got shape {self.data.shape}")
        self.shape, self.nbytes = self.data.shape, self.data.nbytes

    def _linear(self, x, out, num_threads):
        return _gemm.linear(x, self.data, out, num_threads)

    def _take(self, rows, out):
        np.take(self.data, rows, axis=0, out=out)


class HalfWeight(Weight):
    """A float16 or bfloat16 ``[N, K]`` matrix kept as stored: ``bits`` uint16 patterns
    (2 bytes a value), widened to float32 only in registers or a bounded scratch.

    ``data``: a float16 array, an ``ml_dtypes.bfloat16`` array, or uint16 bit patterns with
    ``fmt`` naming them ("float16" or "bfloat16")."""

    def __init__(self, data: np.ndarray, fmt: str | None = None):
        if fmt is None:
            fmt = {"float16": "float16", "bfloat16": "bfloat16"}.get(np.dtype(data.dtype).name)
        if fmt not in HALF_FORMATS:
            raise ValueError(f"a 16-bit weight's format must be one of {HALF_FORMATS}, got {fmt!r}")
        if np.dtype(data.dtype).itemsize != 2 or data.ndim != 2:
            raise ValueError(f"a 16-bit weight needs a 2-D array of 2-byte values, got "
                             f"{data.dtype} {data.shape}")
        self.bits = _own_aligned(np.ascontiguousarray(data)).view(np.uint16)
        self.format, self._kernel_fmt = fmt, _gemm_format(fmt)
        self.shape, self.nbytes = self.bits.shape, self.bits.nbytes

    def _linear(self, x, out, num_threads):
        return _gemm.linear_rows(x, self.bits, self._kernel_fmt, out, num_threads)

    def _take(self, rows, out):
        _widen_half(np.take(self.bits, rows, axis=0), self.format, out)


def _block_rows(raw: np.ndarray, qtype, cols: int | None):
    """``(raw, qtype, cols)`` checked: raw uint8 rows ``[N, row_bytes]`` of GGML type ``qtype``
    (a ``gguf.GGMLQuantizationType`` or its name) holding ``cols`` values each (None: from the
    row bytes). ValueError for a type that is not a block format or a shape that does not fit."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if isinstance(qtype, str):
        try:
            qtype = GGMLQuantizationType[qtype.upper()]
        except KeyError:
            raise ValueError(f"unknown GGML type {qtype!r}") from None
    qtype = GGMLQuantizationType(qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if block == 1:
        raise ValueError(f"{qtype.name} is not a block format: use DenseWeight/HalfWeight")
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if cols is None:
        cols = raw.shape[-1] // type_size * block if raw.ndim == 2 else 0
    cols = int(cols)
    if cols <= 0 or cols % block:
        raise ValueError(f"{qtype.name} rows need a multiple of {block} columns, got {cols}")
    if raw.ndim != 2 or raw.shape[1] != cols // block * type_size:
        raise ValueError(f"{qtype.name} rows of {cols} values take {cols // block * type_size} "
                         f"bytes; got raw shape {raw.shape}")
    return raw, qtype, cols


def _take_block_rows(raw: np.ndarray, qtype, out: np.ndarray) -> None:
    """Block rows ``raw`` uint8 ``[n, row_bytes]`` of GGML type ``qtype`` decoded into float32
    ``out`` ``[n, K]``: pagedcy's decoder, bit for bit ``gguf.quants.dequantize`` (whose NumPy
    code took ~0.1 ms for one embedding row, about 1% of a Gemma 3 270M decode step)."""
    if raw.shape[0]:
        # one thread for a decode step's few rows: resolving the default costs more than them
        nt = 1 if raw.shape[0] < 64 else None
        out[...] = _quant.dequantize(raw, int(qtype), out.shape, nt)


class BlockWeight(Weight):
    """A GGUF block-format ``[N, K]`` matrix: ``raw`` uint8 ``[N, row_bytes]`` as the file
    stores it (each row ``K / block`` blocks; a memory-mapped file's view stays a view),
    ``qtype`` a ``gguf.GGMLQuantizationType`` (or its name, e.g. "Q8_0"), ``cols`` = K (None:
    from the row bytes). ``format`` is the type's lower-case name. ``linear`` decodes the
    blocks in the GEMM's registers and multiplies float32 activations (bit for bit the float32
    GEMM on the dequantized weight); :class:`PanelWeight` is the int8-activation form."""

    int8_activations = False

    def __init__(self, raw: np.ndarray, qtype, cols: int | None = None):
        self.raw, self.qtype, cols = _block_rows(raw, qtype, cols)
        self.format = self.qtype.name.lower()
        self._kernel_fmt = _gemm_format(self.format)
        self.shape, self.nbytes = (self.raw.shape[0], cols), self.raw.nbytes

    def _linear(self, x, out, num_threads):
        return _gemm.linear_rows(x, self.raw, self._kernel_fmt, out, num_threads)

    def _take(self, rows, out):
        _take_block_rows(np.take(self.raw, rows, axis=0), self.qtype, out)


class PanelWeight(Weight):
    """A GGUF ``[N, K]`` matrix of a format with int8-activation kernels (``PANEL_FORMATS``:
    every block format), repacked once into panels of 16 rows (``panel``, uint8, the size
    of the file's rows rounded up to 16 rows: :mod:`pagedcy._libs._q8panel`). ``linear``
    quantizes each row of x to int8 per 32 elements and multiplies with integer dot products,
    as llama.cpp does: each output within ``sum_g max|x_g| / 254 * sum_{k in g} |w_k|`` of the
    float32 result (``_q8panel.linear``). ``raw``, ``qtype``, ``cols`` as :class:`BlockWeight`;
    the rows read from a memory-mapped file are handed back to the OS after the repack
    (the panels replace them in RAM)."""

    int8_activations = True

    def __init__(self, raw: np.ndarray, qtype, cols: int | None = None):
        raw, self.qtype, cols = _block_rows(raw, qtype, cols)
        self.format = self.qtype.name.lower()
        if self.format not in PANEL_FORMATS:
            raise ValueError(f"{self.qtype.name} has no int8-activation kernel; panel formats: "
                             f"{', '.join(f.upper() for f in PANEL_FORMATS)}")
        self.shape = (raw.shape[0], cols)
        self.panel = _q8panel.repack(raw, self.format, cols)
        self.nbytes = self.panel.nbytes
        _drop_file_pages(raw)

    @classmethod
    def _from_panel(cls, panel: np.ndarray, qtype, shape) -> PanelWeight:
        self = cls.__new__(cls)
        self.qtype, self.format, self.shape = qtype, qtype.name.lower(), tuple(shape)
        self.panel, self.nbytes = panel, panel.nbytes
        return self

    def rows(self, ids) -> np.ndarray:
        """Rows ``ids`` as the file stored them: uint8 ``[len(ids), row_bytes]``."""
        return _q8panel.rows(self.panel, self.format, *self.shape, ids)

    def _linear(self, x, out, num_threads):
        return _q8panel.linear(x, self.panel, self.format, self.shape[0], out, num_threads)

    def _take(self, rows, out):
        _take_block_rows(self.rows(rows), self.qtype, out)


#: GGUF formats :class:`PanelWeight` holds (those with int8-activation kernels)
PANEL_FORMATS = _gemm.Q8A_FORMATS


def _drop_file_pages(a: np.ndarray) -> None:
    """Tell the OS this process no longer needs the pages of ``a`` when ``a`` is a view of a
    read-only memory-mapped file (a GGUF tensor that was just copied): they leave its RSS
    and come back from the page cache if read again. Anything else is left alone
    (MADV_DONTNEED on anonymous memory would zero it)."""
    import mmap

    base: object = a
    while isinstance(base, np.ndarray):
        base = base.base
    mm = getattr(base, "obj", None) if isinstance(base, memoryview) else None
    if not isinstance(mm, mmap.mmap) or not hasattr(mm, "madvise") or a.flags.writeable:
        return
    try:
        start = a.ctypes.data - np.frombuffer(mm, np.uint8, count=1).ctypes.data
    except (ValueError, TypeError):       # closed
        return
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, (start + a.nbytes) // page * page
    if 0 <= lo < hi <= len(mm):
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class StackedWeight(Weight):
    """Rows of ``parts`` (weights with the same K, any formats) stacked: ``linear`` runs
    each part into a scratch and copies it to its columns of ``out``, or, when every part is
    a :class:`PanelWeight`, all of them in one call straight into ``out``
    (``_q8panel.linear_parts``: one parallel region, as one weight would take). Used only
    when a fused projection's parts differ in format; same-format parts concatenate instead
    (:func:`concat_weights`)."""

    def __init__(self, parts):
        self.parts = list(parts)
        ks = {p.shape[1] for p in self.parts}
        if not self.parts or len(ks) != 1:
            raise ValueError("stacked weights need at least one part, all with the same columns")
        self.offsets = np.cumsum([0] + [p.shape[0] for p in self.parts])
        self.shape = (int(self.offsets[-1]), ks.pop())
        self.format = "+".join(p.format for p in self.parts)
        self.nbytes = sum(p.nbytes for p in self.parts)
        one_call = all(isinstance(p, PanelWeight) for p in self.parts) \
            and len(self.parts) <= _q8panel.MAX_LINEAR_PARTS
        self._panels = [(p.panel, p.format, p.shape[0]) for p in self.parts] if one_call else None

    def _linear(self, x, out, num_threads):
        if self._panels is not None:
            return _q8panel.linear_parts(x, self._panels, out, num_threads)
        m = _check_io(x, out, *self.shape)
        for p, lo, hi in zip(self.parts, self.offsets[:-1], self.offsets[1:]):
            o = _scratch("stacked", m * (hi - lo)).reshape(m, hi - lo)
            p.linear(x, o, num_threads)
            out[:, lo:hi] = o
        return out

    def _take(self, rows, out):
        part = np.searchsorted(self.offsets, rows, side="right") - 1
        for i, p in enumerate(self.parts):
            sel = np.flatnonzero(part == i)
            if sel.size:
                dst = np.empty((sel.size, self.shape[1]), np.float32)
                p.take_rows(rows[sel] - self.offsets[i], dst)
                out[sel] = dst


def concat_weights(parts) -> Weight:
    """One weight holding the rows of ``parts`` in order (a fused q|k|v or gate|up): runs of
    consecutive parts of one class and format concatenate their stored rows (rows are
    independent, so raw block rows concatenate too); several runs (mixed formats) give a
    :class:`StackedWeight` over them."""
    parts = list(parts)
    if not parts or len({p.shape[1] for p in parts}) != 1:
        raise ValueError(f"fused parts need the same columns, got {[p.shape for p in parts]}")
    runs: list[list[Weight]] = []
    for p in parts:
        if runs and _kind(p) == _kind(runs[-1][0]) and not isinstance(p, StackedWeight):
            runs[-1].append(p)
        else:
            runs.append([p])
    fused = [_concat_same(run) for run in runs]
    return fused[0] if len(fused) == 1 else StackedWeight(fused)


def _kind(w: Weight) -> tuple:
    """What parts must share to concatenate: class and format."""
    return type(w), w.format


def _concat_same(run: list[Weight]) -> Weight:
    """Parts of one class and format as one weight of that class."""
    first, parts = run[0], list[Any](run)     # one class throughout, as ``first``
    if len(run) == 1:
        return first
    if isinstance(first, DenseWeight):
        return DenseWeight(np.concatenate([p.data for p in parts]))
    if isinstance(first, HalfWeight):
        return HalfWeight(np.concatenate([p.bits for p in parts]), first.format)
    if isinstance(first, BlockWeight):
        return BlockWeight(np.concatenate([p.raw for p in parts]), first.qtype, first.shape[1])
    if isinstance(first, PanelWeight):
        shape = (sum(p.shape[0] for p in parts), first.shape[1])
        if all(p.shape[0] % 16 == 0 for p in parts[:-1]):      # whole panels: they concatenate
            return PanelWeight._from_panel(aligned_copy(np.concatenate([p.panel for p in parts])),
                                           first.qtype, shape)
        rows = np.concatenate([p.rows(np.arange(p.shape[0])) for p in parts])
        return PanelWeight(rows, first.qtype, first.shape[1])
    return StackedWeight(run)
