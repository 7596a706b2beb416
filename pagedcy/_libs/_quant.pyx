"""GGUF block formats (llama.cpp's GGML types) computed natively.

A GGUF tensor is kept as stored: ``raw``, a uint8 array of its bytes, rows of consecutive
blocks (``block_info``). ``dequantize`` widens it to float32 exactly as
``gguf.quants.dequantize`` does (bit for bit, every instruction set), and ``quantize`` makes Q8_0 / Q4_0
blocks from float32 (a safetensors checkpoint loaded with ``quantization="q8_0"`` or
``"q4_0"``), bit for bit as ``gguf.quants.quantize``. The GEMM computes with the blocks as
stored: ``pagedcy._libs._gemm.linear_rows`` (decoded in registers at decode sizes).

Types are GGML's numbers (``gguf.GGMLQuantizationType`` members are accepted):
``SUPPORTED_TYPES`` lists them; anything else (Q2_K, Q3_K, IQ*, TQ*, ...) is a ValueError
naming the type.
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t

from pagedcy._libs._args cimport int_arg
from pagedcy._libs._layers cimport _f32
from pagedcy._libs._openmp cimport PAGEDCY_OPENMP
from pagedcy._libs._gemm import PARALLEL_MACS, PARALLEL_WEIGHT_BYTES
from pagedcy._libs._threads import resolve_num_threads

cnp.import_array()

# GGML type number -> name, for the types pagedcy decodes
_NAMES = {0: "F32", 1: "F16", 30: "BF16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1",
          8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
SUPPORTED_TYPES = tuple(_NAMES)
_QUANTIZE_TYPES = (8, 2)          # Q8_0, Q4_0
# Rows per thread (dequantize) start on this boundary.
cdef int _ROW_ALIGN = 4


def _type_name(int t):
    if t in _NAMES:
        return _NAMES[t]
    try:                       # gguf knows every GGML type's name; pagedcy does not need it
        import gguf
        return gguf.GGMLQuantizationType(t).name
    except (ImportError, ValueError):
        return f"type {t}"


cdef const pagedcy_rowfmt *_format(object ggml_type, object max_simd) except NULL:
    t = int_arg(ggml_type, "ggml_type")
    cdef int level = min(int_arg(max_simd, "max_simd"), pagedcy_simd_level())
    cdef const pagedcy_rowfmt *fmt = NULL
    if -2**31 <= t < 2**31:
        fmt = pagedcy_quant_rowfmt(t, max(level, 0))
    if fmt == NULL:
        supported = ", ".join(_NAMES.values())
        raise ValueError(f"GGML type {_type_name(t) if -2**31 <= t < 2**31 else t} ({t}) is not "
                         f"supported: pagedcy decodes {supported}")
    return fmt


def block_info(ggml_type):
    """``(block_elems, block_bytes)`` of a supported GGML type: a row of K elements takes
    ``K // block_elems * block_bytes`` bytes (``(1, 4)`` for F32, ``(32, 34)`` for Q8_0,
    ``(256, 144)`` for Q4_K). ValueError for an unsupported type."""
    cdef const pagedcy_rowfmt *fmt = _format(ggml_type, 0)
    return int(fmt.block), int(fmt.block_bytes)


cdef tuple _rows_k(object shape, const pagedcy_rowfmt *fmt, object ggml_type):
    """``shape`` (the logical shape, K last) as (rows, K), K checked against the block."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or len(shape) == 0:
        raise TypeError(f"shape must be a non-empty tuple of ints, got {shape!r}")
    dims = [int_arg(s, "shape") for s in shape]
    if any(s < 0 for s in dims):
        raise ValueError(f"shape must not be negative, got {tuple(dims)}")
    rows = 1
    K = dims.pop()
    for s in dims:
        rows *= s
    dims.append(K)
    if K % fmt.block:
        raise ValueError(f"a {_type_name(int_arg(ggml_type, 'ggml_type'))} row has a multiple of "
                         f"{fmt.block} elements, got {K}")
    return rows, K, tuple(dims)


cdef cnp.ndarray _u8(object a, str name):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != cnp.NPY_UINT8:
        raise TypeError(f"{name} must be uint8 (the stored bytes: use .view(np.uint8)), got {arr.dtype}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous")
    return arr


cdef int _threads(object num_threads, double work_bytes, double macs, int64_t units) except -1:
    """Threads for a call: one unless it moves PARALLEL_WEIGHT_BYTES or does PARALLEL_MACS
    (as _gemm decides), at most one per unit of work."""
    cdef int nt = resolve_num_threads(num_threads)     # checked even when unused
    if not PAGEDCY_OPENMP or (work_bytes < PARALLEL_WEIGHT_BYTES and macs < PARALLEL_MACS):
        return 1
    return <int>max(1, min(nt, units))


def dequantize(raw, ggml_type, shape, num_threads=None):
    """The float32 values of a GGUF tensor: ``raw`` (uint8, C-contiguous, any shape) holds
    its bytes as stored, ``shape`` its logical shape (K last; rows of K elements each of
    ``K // block_elems * block_bytes`` bytes). Equals ``gguf.quants.dequantize`` bit for bit
    (NaN scales give NaN, maybe another NaN payload). Returns a new float32 array of
    ``shape``. TypeError for a non-uint8 ``raw`` or a non-integer type; ValueError for an
    unsupported type, a K that is not a multiple of the block or a byte count that does not
    match."""
    return _dequantize_tuned(raw, ggml_type, shape, num_threads)


def _dequantize_tuned(raw, ggml_type, shape, num_threads=None, max_simd=2):
    """Private: ``dequantize`` with the instruction set capped at ``max_simd`` (0 plain C,
    1 AVX2, 2 AVX-512), for tests and benchmarks."""
    cdef const pagedcy_rowfmt *fmt = _format(ggml_type, max_simd)
    rows, K, dims = _rows_k(shape, fmt, ggml_type)
    cdef cnp.ndarray ra = _u8(raw, "raw")
    cdef int64_t row_bytes = K // fmt.block * fmt.block_bytes
    if cnp.PyArray_NBYTES(ra) != rows * row_bytes:
        raise ValueError(f"{_type_name(int_arg(ggml_type, 'ggml_type'))} of shape {dims} takes "
                         f"{rows * row_bytes} bytes, raw has {cnp.PyArray_NBYTES(ra)}")
    cdef cnp.ndarray out = np.empty(dims, np.float32)
    cdef int64_t nrows = rows, k = K, blocks = (nrows + _ROW_ALIGN - 1) // _ROW_ALIGN, r0, r1
    cdef const uint8_t *rp = <const uint8_t *>cnp.PyArray_DATA(ra)
    cdef float *op = <float *>cnp.PyArray_DATA(out)
    cdef int nt = _threads(num_threads, 4.0 * nrows * k, 0.0, blocks), t
    if nrows == 0 or k == 0:
        return out
    if nt == 1:
        with nogil:
            pagedcy_quant_decode_rows(fmt, rp, row_bytes, 0, nrows, k, op)
        return out
    for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
        r0 = _ROW_ALIGN * (blocks * t // nt)
        r1 = min(nrows, _ROW_ALIGN * (blocks * (t + 1) // nt))
        pagedcy_quant_decode_rows(fmt, rp, row_bytes, r0, r1, k, op + r0 * k)
    return out


def quantize(x, ggml_type, num_threads=None):
    """GGUF blocks of float32 ``x`` (C-contiguous, K = ``x.shape[-1]`` a multiple of 32) as
    ``ggml_type`` Q8_0 (8) or Q4_0 (2): a new uint8 array of shape
    ``x.shape[:-1] + (K // 32 * block_bytes,)``, equal to ``gguf.quants.quantize`` bit for
    bit. TypeError for non-float32 ``x``; ValueError for another type, a bad K or a NaN /
    infinity in ``x`` (gguf-py's bytes for those depend on the platform)."""
    cdef const pagedcy_rowfmt *fmt = _format(ggml_type, 0)
    t = int_arg(ggml_type, "ggml_type")
    if t not in _QUANTIZE_TYPES:
        raise ValueError(f"quantize makes Q8_0 or Q4_0 blocks, not {_type_name(t)}")
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy array, got {type(x).__name__}")
    cdef cnp.ndarray xa = _f32(x, "x", (None,) * max(1, (<cnp.ndarray>x).ndim))
    rows, K, dims = _rows_k((<object>xa).shape, fmt, ggml_type)
    cdef int64_t nblocks = rows * K // 32, per, b0, b1
    cdef cnp.ndarray out = np.empty(dims[:len(dims) - 1] + (K // 32 * fmt.block_bytes,), np.uint8)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef uint8_t *op = <uint8_t *>cnp.PyArray_DATA(out)
    cdef int bb = fmt.block_bytes, qt = t, rc = 0, i
    cdef int nt = _threads(num_threads, 4.0 * rows * K, 0.0, max(1, nblocks // 1024))
    if nt == 1:
        with nogil:
            rc = pagedcy_quantize_blocks(qt, xp, nblocks, op)
    else:
        per = (nblocks + nt - 1) // nt
        for i in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            b0 = min(nblocks, i * per)
            b1 = min(nblocks, b0 + per)
            if pagedcy_quantize_blocks(qt, xp + 32 * b0, b1 - b0, op + bb * b0) != 0:
                rc = -2
    if rc != 0:
        raise ValueError("x must be finite to quantize (it holds a NaN or an infinity)")
    return out
