"""Float32 projections ``x @ weight.T`` on pagedcy's own GEMM kernel.

``linear(x, weight, out)`` is the forward pass's projection, with ``weight`` stored as
checkpoints store it (``[out_features, in_features]``, like ``torch.nn.functional.linear``).
It runs pagedcy's register-blocked kernel (``pagedcy_gemm.h``: AVX-512 or AVX2, picked at
run time) on pagedcy's OpenMP threads, for a decode step's few rows as for a prefill's
thousands; NumPy's BLAS only on CPUs without AVX2. Why not BLAS: with few rows OpenBLAS
repacks the whole weight on every call (a 16-row decode step's projections ran at 75 GFLOP/s
against ~200 here), and between BLAS calls its threads spin, taking the cores from the
attention and elementwise kernels' OpenMP threads (a 2048-token prefill step's attention took
120 ms after OpenBLAS GEMMs, 63 ms with OpenBLAS on one thread). ``linear_kernel`` is the
kernel alone, on any CPU (scalar C without AVX2).
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange

from pagedcy._libs._layers cimport _f32, _overlap
from pagedcy._libs._openmp cimport PAGEDCY_OPENMP
from pagedcy._libs._threads import resolve_num_threads

cnp.import_array()

cdef extern from "pagedcy_gemm.h" nogil:
    int pagedcy_simd_level()

# A call runs on one thread unless its weight has PARALLEL_WEIGHT_BYTES (the memory-bound
# case, few rows) or it does PARALLEL_MACS multiply-adds (compute-bound, many rows): waking an
# OpenMP worker costs about what one thread takes to stream a weight of that size. Measured
# on the 2-core EPYC VM under pagedcy's wait policy: a 1-row forward of the benchmark model
# took 5.2 ms at 1 MiB, 6.0 ms at 4 MiB, 7.4 ms on one thread throughout.
PARALLEL_WEIGHT_BYTES = 1 << 20
PARALLEL_MACS = 8 << 20
# Weight rows per thread start on this boundary (whole 8-row blocks).
cdef int _ROW_ALIGN = 8
_INT_MAX = 2**31 - 1


cdef int _kernel(cnp.ndarray x, cnp.ndarray w, cnp.ndarray out, int nt, int simd) except -1:
    cdef int M = x.shape[0], K = x.shape[1], N = w.shape[0], t, blocks
    cdef const float *xp = <const float *>cnp.PyArray_DATA(x)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(w)
    cdef float *op = <float *>cnp.PyArray_DATA(out)
    if M == 0 or N == 0:
        return 0
    blocks = (N + _ROW_ALIGN - 1) // _ROW_ALIGN
    if nt > blocks:
        nt = blocks
    if not PAGEDCY_OPENMP or (4.0 * N * K < PARALLEL_WEIGHT_BYTES and <double>M * N * K < PARALLEL_MACS):
        nt = 1
    if nt == 1:
        with nogil:
            pagedcy_gemm_nt_rows(simd, M, 0, N, K, xp, K, wp, K, op, N)
        return 0
    for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
        pagedcy_gemm_nt_rows(simd, M, _ROW_ALIGN * (blocks * t // nt),
                             min(N, _ROW_ALIGN * (blocks * (t + 1) // nt)), K, xp, K, wp, K, op, N)
    return 0


cdef tuple _check(object x, object weight, object out):
    cdef cnp.ndarray xa = _f32(x, "x", (None, None))
    cdef cnp.ndarray wa = _f32(weight, "weight", (None, xa.shape[1]))
    cdef cnp.ndarray oa = _f32(out, "out", (xa.shape[0], wa.shape[0]), True)
    if max(xa.shape[0], xa.shape[1], wa.shape[0]) > _INT_MAX:
        raise ValueError("matrix dimensions must be below 2**31")
    if _overlap(oa, xa) or _overlap(oa, wa):
        raise ValueError("out must not overlap x or weight")
    return xa, wa, oa


def linear_kernel(x, weight, out, num_threads=None):
    """``out[...] = x @ weight.T`` with pagedcy's kernel: ``x`` float32 ``[M, K]``, ``weight``
    float32 ``[N, K]``, ``out`` float32 ``[M, N]``, all C-contiguous, ``out`` overlapping
    neither. Weight rows are split over ``num_threads`` OpenMP threads. TypeError for a
    non-array or non-float32 input, ValueError for shapes, contiguity or overlap. Returns
    ``out``."""
    return _linear_kernel_tuned(x, weight, out, num_threads)


def _linear_kernel_tuned(x, weight, out, num_threads=None, max_simd=2):
    """Private: ``linear_kernel`` with the instruction set capped at ``max_simd`` (0 scalar,
    1 AVX2, 2 AVX-512), for tests and benchmarks."""
    xa, wa, oa = _check(x, weight, out)
    cdef int nt = resolve_num_threads(num_threads)
    cdef int simd = min(int(max_simd), pagedcy_simd_level())
    _kernel(xa, wa, oa, nt, simd)
    return out


def linear(x, weight, out, num_threads=None):
    """``out[...] = x @ weight.T``: ``x`` float32 ``[M, K]``, ``weight`` float32 ``[N, K]``
    (output-major, as checkpoints store projections), ``out`` float32 ``[M, N]``, all
    C-contiguous. pagedcy's kernel on a CPU with AVX2 (or AVX-512), else ``np.matmul``.
    Errors as ``linear_kernel``. Returns ``out``."""
    xa, wa, oa = _check(x, weight, out)
    cdef int simd = pagedcy_simd_level()
    if simd >= 1:
        _kernel(xa, wa, oa, resolve_num_threads(num_threads), simd)
    else:
        np.matmul(xa, wa.T, out=oa)
    return out
