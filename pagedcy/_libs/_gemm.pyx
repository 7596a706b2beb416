"""Projections ``x @ weight.T`` on pagedcy's own GEMM kernel, float32 activations and a
float32, float16 or bfloat16 weight.

``linear(x, weight, out)`` is the forward pass's projection, with ``weight`` stored as
checkpoints store it (``[out_features, in_features]``, like ``torch.nn.functional.linear``);
``linear_rows(x, weight, fmt, out)`` takes the weight in a 16-bit storage format and widens
it inside the kernel (f16/bf16 read half the bytes of f32: decode steps are bound by memory).
Both run pagedcy's kernel (``pagedcy_gemm.h``: AVX-512 or AVX2, picked at run time) on
pagedcy's OpenMP threads: with few rows it streams the weight once (with few rows OpenBLAS
repacks the whole weight on every call: a 16-row decode step's projections ran at 75
GFLOP/s against ~200 here), with many it packs it for a register-blocked micro-kernel
(``pagedcy_gemm_pack.h``), in the same summation order, so a row's result does not depend on
what else is in the batch. Between BLAS calls OpenBLAS's threads spin, taking the cores from
the attention and elementwise kernels' OpenMP threads (a 2048-token prefill step's attention
took 120 ms after OpenBLAS GEMMs, 63 ms with OpenBLAS on one thread): another reason to keep
GEMMs here. NumPy's BLAS serves ``linear`` only on CPUs without AVX2; ``linear_kernel`` is
the kernel alone, on any CPU (scalar C without AVX2).
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int32_t, int64_t

from pagedcy._libs._layers cimport _f32, _overlap
from pagedcy._libs._openmp cimport PAGEDCY_OPENMP
from pagedcy._libs._team cimport pagedcy_atomic_or, run_split
from pagedcy._libs._threads import resolve_num_threads

cnp.import_array()

cdef extern from "pagedcy_gemm.h" nogil:
    int pagedcy_simd_level()
    const pagedcy_rowfmt *pagedcy_rowfmt_for_dtype(int dtype)
    int PAGEDCY_F32, PAGEDCY_F16, PAGEDCY_BF16

cdef extern from "pagedcy_quant.h" nogil:
    const pagedcy_rowfmt *pagedcy_quant_rowfmt(int ggml_type, int simd_level)


# A call runs on one thread unless its weight has PARALLEL_WEIGHT_BYTES as float32 (the memory-bound
# case, few rows) or it does PARALLEL_MACS multiply-adds (compute-bound, many rows): waking an
# OpenMP worker costs about what one thread takes to stream a weight of that size. Measured
# on the 2-core EPYC VM under pagedcy's wait policy: a 1-row forward of the benchmark model
# took 5.2 ms at 1 MiB, 6.0 ms at 4 MiB, 7.4 ms on one thread throughout.
PARALLEL_WEIGHT_BYTES = 1 << 20
PARALLEL_MACS = 8 << 20
# Weight rows per thread start on this boundary: whole micro-panels of the packed path
# (32 rows on AVX-512, 16 on AVX2) and whole row blocks of the streaming one.
cdef int _ROW_ALIGN = 32
_INT_MAX = 2**31 - 1
# Storage formats of linear_rows: name -> (pagedcy_convert.h dtype code, accepted dtypes).
FORMATS = {"f32": (PAGEDCY_F32, (np.float32,)), "f16": (PAGEDCY_F16, (np.float16, np.uint16)),
           "bf16": (PAGEDCY_BF16, (np.uint16,))}
# GGUF block formats of linear_rows (weight: raw uint8 rows [N, row_bytes] as the file stores
# them): name -> GGML type number. Their decoders (pagedcy_quant.h) plug into the same kernel.
BLOCK_FORMATS = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
                 "q6_k": 14}

# Block formats with an int8-activation kernel (pagedcy_gemm_q8a.h): linear_rows_q8 (and the
# panel weights of _q8panel). Every block format.
Q8A_FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")

# x splits into row ranges of whole micro-tiles (12 rows on AVX-512, 6 on AVX2), each at
# least the packed path's row count (pagedcy_gemm.h's PG_PACK_MIN_M), when it has more rows
# than W.
cdef int _M_ALIGN = 12
cdef int _SPLIT_M_MIN = 96


cdef inline int _rows_part(int simd, int m0, int m1, int N, int K, const float *xp,
                           const void *wp, int64_t row_bytes, const pagedcy_rowfmt *fmt,
                           float *op) noexcept nogil:
    """Rows [m0, m1) of x @ W^T on the calling thread."""
    if m1 <= m0:
        return 0
    return pagedcy_gemm_rows_fmt(simd, m1 - m0, 0, N, K, xp + <int64_t>m0 * K, K, wp, row_bytes,
                                 fmt, op + <int64_t>m0 * N, N)


ctypedef struct _RowsJob:
    int simd, M, N, K, blocks
    const float *xp
    const void *wp
    int64_t row_bytes
    const pagedcy_rowfmt *fmt
    float *op
    int rc            # the threads' error codes or-ed


cdef void _rows_job(void *arg, int t, int nt) noexcept nogil:
    """Share t of nt of W's rows, in whole row blocks (``run_split``'s job)."""
    cdef _RowsJob *j = <_RowsJob *>arg
    pagedcy_atomic_or(&j.rc, pagedcy_gemm_rows_fmt(
        j.simd, j.M, _ROW_ALIGN * (j.blocks * t // nt), min(j.N, _ROW_ALIGN * (j.blocks * (t + 1) // nt)),
        j.K, j.xp, j.K, j.wp, j.row_bytes, j.fmt, j.op, j.N))


cdef int _kernel(cnp.ndarray x, cnp.ndarray w, const pagedcy_rowfmt *fmt, cnp.ndarray out,
                 int nt, int simd) except -1:
    cdef int M = x.shape[0], K = x.shape[1], N = w.shape[0], t, blocks, rc = 0
    cdef const float *xp = <const float *>cnp.PyArray_DATA(x)
    cdef const void *wp = cnp.PyArray_DATA(w)
    cdef float *op = <float *>cnp.PyArray_DATA(out)
    cdef int64_t row_bytes = <int64_t>K // fmt.block * fmt.block_bytes
    cdef _RowsJob job
    if M == 0 or N == 0:
        return 0
    blocks = (N + _ROW_ALIGN - 1) // _ROW_ALIGN
    if nt > blocks:
        nt = blocks
    # Weights count as float32 bytes: a block or 16-bit format is decoded as it streams, at
    # a half to a third of float32's bytes a second, so a 0.9 MB Q5_0 matrix (640 x 2048)
    # costs one thread what a 3.6 MB float32 one does (88 us, 45 us on two threads).
    if not PAGEDCY_OPENMP or (4.0 * N * K < PARALLEL_WEIGHT_BYTES
                              and <double>M * N * K < PARALLEL_MACS):
        nt = 1
    if nt == 1:
        with nogil:
            rc = pagedcy_gemm_rows_fmt(simd, M, 0, N, K, xp, K, wp, row_bytes, fmt, op, N)
    elif M > N and M >= nt * _SPLIT_M_MIN:
        # Many rows of x and few of W (a prefill step through a 512 x 512 projection): split
        # x, not W. Split by W, every thread packs all of x for its few W rows (2048 x 512:
        # 1.78x on 2 threads instead of 2x). Rows are independent, so the bits are the same.
        blocks = (M + _M_ALIGN - 1) // _M_ALIGN
        if nt > blocks:
            nt = blocks
        for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            rc |= _rows_part(simd, _M_ALIGN * (blocks * t // nt),
                             min(M, _M_ALIGN * (blocks * (t + 1) // nt)), N, K, xp, wp,
                             row_bytes, fmt, op)
    else:       # split W (a step's team, when the caller runs on one, takes the same split)
        job.simd, job.M, job.N, job.K, job.blocks, job.rc = simd, M, N, K, blocks, 0
        job.xp, job.wp, job.row_bytes, job.fmt, job.op = xp, wp, row_bytes, fmt, op
        with nogil:
            run_split(_rows_job, &job, nt)
        rc = job.rc
    if rc:
        raise MemoryError("out of memory for the GEMM's packing buffers")
    return 0


cdef tuple _check(object x, object weight, object out, str fmt="f32"):
    cdef cnp.ndarray xa = _f32(x, "x", (None, None))
    cdef cnp.ndarray wa
    if fmt == "f32":
        wa = _f32(weight, "weight", (None, xa.shape[1]))
    elif fmt in BLOCK_FORMATS:
        wa = _weight_blocks(weight, fmt, xa.shape[1])
    else:
        wa = _weight16(weight, fmt, xa.shape[1])
    cdef cnp.ndarray oa = _f32(out, "out", (xa.shape[0], wa.shape[0]), True)
    if max(xa.shape[0], xa.shape[1], wa.shape[0]) > _INT_MAX:
        raise ValueError("matrix dimensions must be below 2**31")
    if _overlap(oa, xa) or _overlap(oa, wa):
        raise ValueError("out must not overlap x or weight")
    return xa, wa, oa


cdef cnp.ndarray _weight16(object weight, str fmt, Py_ssize_t k):
    """The [N, k] 16-bit weight of format fmt ("f16" or "bf16"), checked."""
    if not isinstance(weight, np.ndarray):
        raise TypeError(f"weight must be a numpy array, got {type(weight).__name__}")
    cdef cnp.ndarray wa = <cnp.ndarray>weight
    allowed = FORMATS[fmt][1]
    if wa.dtype.type not in allowed or not cnp.PyArray_ISNOTSWAPPED(wa):
        names = " or ".join(np.dtype(d).name for d in allowed)
        raise TypeError(f"a {fmt} weight must be {names} in native byte order, got {wa.dtype.str}")
    if wa.ndim != 2 or wa.shape[1] != k:
        raise ValueError(f"weight must have shape [?, {k}], got {(<object>wa).shape}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(wa):
        raise ValueError("weight must be C-contiguous")
    return wa


cdef cnp.ndarray _weight_blocks(object weight, str fmt, Py_ssize_t k):
    """The [N, row_bytes] uint8 rows of block format fmt holding k values each, checked."""
    if not isinstance(weight, np.ndarray):
        raise TypeError(f"weight must be a numpy array, got {type(weight).__name__}")
    cdef cnp.ndarray wa = <cnp.ndarray>weight
    cdef const pagedcy_rowfmt *f = pagedcy_quant_rowfmt(BLOCK_FORMATS[fmt], 0)
    if wa.dtype != np.uint8:
        raise TypeError(f"a {fmt} weight must be its raw uint8 rows, got {wa.dtype}")
    if k % f.block:
        raise ValueError(f"{fmt} rows hold a multiple of {f.block} values; x has {k} columns")
    if wa.ndim != 2 or wa.shape[1] != k // f.block * f.block_bytes:
        raise ValueError(f"{fmt} rows of {k} values take {k // f.block * f.block_bytes} bytes; "
                         f"weight has shape {(<object>wa).shape}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(wa):
        raise ValueError("weight must be C-contiguous")
    return wa


cdef const pagedcy_rowfmt *_rowfmt(object fmt, int simd) except NULL:
    """The row format named fmt, its decoder at instruction-set cap simd."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt in BLOCK_FORMATS:
        return pagedcy_quant_rowfmt(BLOCK_FORMATS[fmt], simd)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {sorted(FORMATS) + sorted(BLOCK_FORMATS)}, "
                         f"got {fmt!r}")
    return pagedcy_rowfmt_for_dtype(FORMATS[fmt][0])


def linear_kernel(x, weight, out, num_threads=None):
    """``out[...] = x @ weight.T`` with pagedcy's kernel: ``x`` float32 ``[M, K]``, ``weight``
    float32 ``[N, K]``, ``out`` float32 ``[M, N]``, all C-contiguous, ``out`` overlapping
    neither. Weight rows are split over ``num_threads`` OpenMP threads. TypeError for a
    non-array or non-float32 input, ValueError for shapes, contiguity or overlap. Returns
    ``out``."""
    return _linear_rows_tuned(x, weight, "f32", out, num_threads)


def _linear_kernel_tuned(x, weight, out, num_threads=None, max_simd=2):
    """Private: ``linear_kernel`` with the instruction set capped at ``max_simd`` (0 scalar,
    1 AVX2, 2 AVX-512), for tests and benchmarks."""
    return _linear_rows_tuned(x, weight, "f32", out, num_threads, max_simd)


def _linear_rows_tuned(x, weight, fmt, out, num_threads=None, max_simd=2):
    """Private: ``linear_rows`` on pagedcy's kernel on any CPU, the instruction set capped at
    ``max_simd`` (0 scalar, 1 AVX2, 2 AVX-512), for tests and benchmarks."""
    cdef int simd = min(int(max_simd), pagedcy_simd_level())
    cdef const pagedcy_rowfmt *f = _rowfmt(fmt, simd)
    xa, wa, oa = _check(x, weight, out, fmt)
    cdef int nt = resolve_num_threads(num_threads)
    _kernel(xa, wa, f, oa, nt, simd)
    return out


def linear_rows(x, weight, fmt, out, num_threads=None):
    """``out[...] = x @ widen(weight).T`` for a weight in storage format ``fmt``: ``"f32"``
    (float32), ``"f16"`` (float16, or its bits as uint16), ``"bf16"`` (bfloat16 bits as
    uint16), or a GGUF block format (``BLOCK_FORMATS``: ``"q8_0"``, ``"q4_k"``, ...; weight its
    raw uint8 rows ``[N, row_bytes]``); ``x`` float32 ``[M, K]``, ``weight`` ``[N, K]`` values,
    ``out`` float32 ``[M, N]``, all C-contiguous. Bit for bit ``linear`` on the weight widened
    to float32 (with AVX2), one summation order for every M.
    TypeError for a wrong dtype or a non-str ``fmt``, ValueError for an unknown ``fmt``,
    shapes, contiguity or overlap. Returns ``out``."""
    return _linear_rows_tuned(x, weight, fmt, out, num_threads)


def linear(x, weight, out, num_threads=None):
    """``out[...] = x @ weight.T``: ``x`` float32 ``[M, K]``, ``weight`` float32 ``[N, K]``
    (output-major, as checkpoints store projections), ``out`` float32 ``[M, N]``, all
    C-contiguous. pagedcy's kernel on a CPU with AVX2 (or AVX-512), else ``np.matmul``.
    Errors as ``linear_kernel``. Returns ``out``."""
    xa, wa, oa = _check(x, weight, out)
    cdef int simd = pagedcy_simd_level()
    if simd >= 1:
        _kernel(xa, wa, pagedcy_rowfmt_for_dtype(PAGEDCY_F32), oa,
                resolve_num_threads(num_threads), simd)
    else:
        np.matmul(xa, wa.T, out=oa)
    return out


cdef int _nthreads(int N, int K, int M, int nt) noexcept:
    """Threads for an [M, K] x [N, K]^T call (see PARALLEL_WEIGHT_BYTES)."""
    cdef int blocks = (N + _ROW_ALIGN - 1) // _ROW_ALIGN
    if nt > blocks:
        nt = blocks
    if not PAGEDCY_OPENMP or (4.0 * N * K < PARALLEL_WEIGHT_BYTES and <double>M * N * K < PARALLEL_MACS):
        nt = 1
    return nt


def _quantize_activations(x, max_simd=2):
    """Private: ``(qa, da, s16)`` of float32 ``x [M, K]`` (K a multiple of 32) as
    ``linear_rows_q8`` quantizes it: int8 ``[M, K]``, float32 ``[M, K/32]``, int32 ``[M, K/16]``
    (pagedcy_gemm_q8a.h defines them), the instruction set capped at ``max_simd``."""
    cdef cnp.ndarray xa = _f32(x, "x", (None, None))
    cdef Py_ssize_t M = xa.shape[0], K = xa.shape[1]
    if K % 32:
        raise ValueError(f"x must have a multiple of 32 columns, got {K}")
    cdef cnp.ndarray qa = np.empty((M, K), np.int8)
    cdef cnp.ndarray da = np.empty((M, K // 32), np.float32)
    cdef cnp.ndarray s16 = np.empty((M, K // 16), np.int32)
    cdef int level = min(int(max_simd), pagedcy_simd_level())
    with nogil:
        pg_q8a_quantize(level, <int>M, <int>K, <const float *>cnp.PyArray_DATA(xa), K,
                        <int8_t *>cnp.PyArray_DATA(qa), <float *>cnp.PyArray_DATA(da),
                        <int32_t *>cnp.PyArray_DATA(s16))
    return qa, da, s16


def _linear_rows_q8_tuned(x, weight, fmt, out, num_threads=None, max_simd=2):
    """Private: ``linear_rows_q8`` with the instruction set capped at ``max_simd`` (0 scalar,
    1 AVX2, 2 AVX-512 VNNI), for tests and benchmarks."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in Q8A_FORMATS:
        raise ValueError(f"fmt must be one of {list(Q8A_FORMATS)}, got {fmt!r}")
    xa, wa, oa = _check(x, weight, out, fmt)
    cdef int simd = min(int(max_simd), pagedcy_simd_level())
    cdef int F = BLOCK_FORMATS[fmt]
    cdef int M = xa.shape[0], K = xa.shape[1], N = wa.shape[0], t, rc = 0
    if M == 0 or N == 0:
        return out
    qa, da, s16 = _quantize_activations(xa, simd)
    cdef pg_q8a act
    act.K = K
    act.qa = <const int8_t *>cnp.PyArray_DATA(qa)
    act.da = <const float *>cnp.PyArray_DATA(da)
    act.s16 = <const int32_t *>cnp.PyArray_DATA(s16)
    cdef const void *wp = cnp.PyArray_DATA(wa)
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef int64_t rb = wa.shape[1]
    cdef int nt = _nthreads(N, K, M, resolve_num_threads(num_threads))
    cdef int blocks = (N + _ROW_ALIGN - 1) // _ROW_ALIGN
    if nt == 1:
        with nogil:
            rc = pagedcy_gemm_q8a(simd, F, M, 0, N, &act, wp, rb, op, N)
    else:
        for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            rc |= pagedcy_gemm_q8a(simd, F, M, _ROW_ALIGN * (blocks * t // nt),
                                   min(N, _ROW_ALIGN * (blocks * (t + 1) // nt)), &act, wp, rb, op, N)
    if rc:
        raise MemoryError("out of memory for the GEMM's packing buffers")
    return out


def linear_rows_q8(x, weight, fmt, out, num_threads=None):
    """``out[...] = x @ W.T`` for a GGUF block weight ``fmt`` in ``Q8A_FORMATS`` (``"q4_k"``,
    ``"q6_k"``, ``"q8_0"``; weight its raw uint8 rows ``[N, row_bytes]``) with int8
    activations, as llama.cpp computes: each row of float32 ``x [M, K]`` is quantized per 32
    elements (scale ``max|x| / 127``) and multiplied with integer dot products; ``out``
    float32 ``[M, N]``. Error per output at most ``sum_g max|x_g| / 254 * sum_{k in g} |w_k|``
    plus float32 rounding; every path (M, threads, SIMD level) gives the same bits.
    TypeError / ValueError as ``linear_rows``. Returns ``out``."""
    return _linear_rows_q8_tuned(x, weight, fmt, out, num_threads)
