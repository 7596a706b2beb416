"""GGUF block weights (every block format: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
repacked once into panels of 16 rows for the
int8-activation GEMM (``pagedcy_gemm_q8p.h``).

``panel = repack(raw, fmt)`` turns a weight's raw rows (uint8 ``[N, row_bytes]``, as the
GGUF file stores them) into panels: the 16 rows of a panel sit in the 16 lanes of one
vector, so a decode step's GEMV needs no per-row reductions or scale gathers (llama-3.2-1b
Q4_K_M's decode GEMVs on 2 threads of an AMD EPYC Zen 4: see pagedcy_gemm_q8p.h). A panel
weight takes 16 * row_bytes per 16 rows (the file's size, rounded up to 16 rows) and keeps
every bit of the file: ``rows(panel, ...)`` gives rows back exactly. ``linear(x, panel, fmt,
n, out)`` computes ``x @ W.T`` as ``_gemm.linear_rows_q8`` does on the raw rows, bit for bit:
the same int8 activations, integer sums and float chain, on every path and SIMD level.
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t

from pagedcy._libs._gemm cimport _nthreads, pg_q8a, pg_q8a_quantize_tls
from pagedcy._libs._layers cimport _f32, _overlap
from pagedcy._libs._team cimport pagedcy_atomic_or, pagedcy_split, pagedcy_split_next, run_split, split_of
from pagedcy._libs._gemm import BLOCK_FORMATS, Q8A_FORMATS
from pagedcy._libs._threads import resolve_num_threads

cnp.import_array()

cdef extern from "pagedcy_gemm.h" nogil:
    int pagedcy_simd_level()

# GGUF type -> (elements, bytes) per block of the formats with panels
_BLOCKS = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
           "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
_INT_MAX = 2**31 - 1


def _format(fmt):
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in Q8A_FORMATS:
        raise ValueError(f"fmt must be one of {list(Q8A_FORMATS)}, got {fmt!r}")
    return _BLOCKS[fmt]


def panel_bytes(fmt, n, k):
    """Bytes of the panels of an ``[n, k]`` weight of format ``fmt``: 16 rows' bytes per panel,
    ``ceil(n / 16)`` panels."""
    bs, bb = _format(fmt)
    if k <= 0 or k % bs:
        raise ValueError(f"{fmt} rows hold a positive multiple of {bs} values, got {k}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return (n + 15) // 16 * 16 * (k // bs * bb)


cdef cnp.ndarray _aligned(Py_ssize_t nbytes):
    buf = np.empty(nbytes + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + nbytes]


def repack(raw, fmt, k=None):
    """The panels of raw block rows ``raw`` (uint8 ``[N, row_bytes]``, C-contiguous) of format
    ``fmt`` (``Q8A_FORMATS``) holding ``k`` values each (default: from the row bytes): a new
    64-byte-aligned uint8 array of ``panel_bytes(fmt, N, k)`` bytes. TypeError / ValueError
    for a wrong dtype, shape or format."""
    bs, bb = _format(fmt)
    if not isinstance(raw, np.ndarray):
        raise TypeError(f"raw must be a numpy array, got {type(raw).__name__}")
    if raw.dtype != np.uint8:
        raise TypeError(f"raw must be uint8 block rows, got {raw.dtype}")
    if raw.ndim != 2:
        raise ValueError(f"raw must be 2-D [N, row_bytes], got shape {raw.shape}")
    if k is None:
        k = raw.shape[1] // bb * bs
    if k <= 0 or k % bs or raw.shape[1] != k // bs * bb:
        raise ValueError(f"{fmt} rows of {k} values take {k // bs * bb} bytes; raw has shape {raw.shape}")
    if raw.shape[0] > _INT_MAX or k > _INT_MAX:
        raise ValueError("matrix dimensions must be below 2**31")
    cdef cnp.ndarray ra = np.ascontiguousarray(raw)
    cdef cnp.ndarray pa = _aligned(panel_bytes(fmt, raw.shape[0], k))
    cdef int rc = 0, F = BLOCK_FORMATS[fmt], N = raw.shape[0], K = k, t
    cdef int P = (N + 15) // 16, nt = min(resolve_num_threads(None), P) if N * k >= 1 << 20 else 1
    cdef int64_t rb = raw.shape[1]
    cdef const uint8_t *wp = <const uint8_t *>cnp.PyArray_DATA(ra)
    cdef uint8_t *pp = <uint8_t *>cnp.PyArray_DATA(pa)
    if nt <= 1:
        with nogil:
            rc = pagedcy_q8p_repack(F, wp, rb, N, K, 0, P, pp)
    else:       # panels are independent: a load's repack on every thread
        for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            rc |= pagedcy_q8p_repack(F, wp, rb, N, K, P * t // nt, P * (t + 1) // nt, pp)
    if rc == -1:
        raise MemoryError("out of memory repacking a weight")
    return pa


cdef cnp.ndarray _panels(object panel, str fmt, Py_ssize_t n, Py_ssize_t k):
    if not isinstance(panel, np.ndarray):
        raise TypeError(f"panel must be a numpy array, got {type(panel).__name__}")
    cdef cnp.ndarray pa = <cnp.ndarray>panel
    if pa.dtype != np.uint8 or pa.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(pa):
        raise TypeError("panel must be a C-contiguous 1-D uint8 array (repack's result)")
    want = panel_bytes(fmt, n, k)
    if pa.shape[0] != want:
        raise ValueError(f"a {fmt} panel weight of {n} x {k} takes {want} bytes, got {pa.shape[0]}")
    return pa


def rows(panel, fmt, n, k, ids):
    """Rows ``ids`` (ints in ``[0, n)``) of an ``[n, k]`` panel weight as the file stored them:
    uint8 ``[len(ids), row_bytes]``. IndexError for an id out of range."""
    bs, bb = _format(fmt)
    cdef cnp.ndarray pa = _panels(panel, fmt, n, k)
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"row ids must be in [0, {n})")
    cdef cnp.ndarray ia = np.ascontiguousarray(idx)
    cdef cnp.ndarray out = np.empty((idx.size, k // bs * bb), np.uint8)
    cdef int F = BLOCK_FORMATS[fmt], K = k, count = idx.size
    with nogil:
        pagedcy_q8p_rows(F, <const uint8_t *>cnp.PyArray_DATA(pa), K, <const int64_t *>cnp.PyArray_DATA(ia),
                         count, <uint8_t *>cnp.PyArray_DATA(out))
    return out


def _linear_tuned(x, panel, fmt, n, out, num_threads=None, max_simd=2):
    """Private: ``linear`` with the instruction set capped at ``max_simd`` (0 scalar, 1 AVX2,
    2 AVX-512 VNNI), for tests and benchmarks."""
    return _linear_parts_tuned(x, ((panel, fmt, n),), out, num_threads, max_simd)


cdef int _run_parts(int simd, int M, int q0, int q1, const pg_q8a *act, int nparts, const int *F,
                    const int *pairs0, const uint8_t **P, const int *N, const int *col,
                    float *op, int ldc) noexcept nogil:
    """Panel pairs [q0, q1) of the parts laid end to end (part i holds pairs [pairs0[i],
    pairs0[i + 1])), each into its columns ``col[i]`` of ``op``; 0 or the first error."""
    cdef int i, a, b, rc = 0
    for i in range(nparts):
        a = max(q0, pairs0[i])
        b = min(q1, pairs0[i + 1])
        if a < b:
            rc |= pagedcy_gemm_q8p(simd, F[i], M, 2 * (a - pairs0[i]), 2 * (b - pairs0[i]), act, P[i],
                                   N[i], op + col[i], ldc)
    return rc


cdef enum:
    MAX_PARTS = 8     # a fused q|k|v has at most 3


ctypedef struct _PartsJob:
    int simd, M, total, nparts, ldc
    const pg_q8a *act
    const int *F
    const int *pairs0
    const uint8_t **P
    const int *N
    const int *col
    float *op
    pagedcy_split split   # of the panel pairs
    int rc            # the threads' error codes or-ed


cdef void _parts_job(void *arg, int t, int nt) noexcept nogil:
    """The panel pairs of thread t of nt (``run_split``'s job, split as ``split_of`` says)."""
    cdef _PartsJob *j = <_PartsJob *>arg
    cdef int a, b, state = 0, rc = 0
    while pagedcy_split_next(&j.split, t, nt, &state, &a, &b):
        rc |= _run_parts(j.simd, j.M, a, b, j.act, j.nparts, j.F, j.pairs0, j.P, j.N, j.col, j.op, j.ldc)
    pagedcy_atomic_or(&j.rc, rc)


#: Most parts ``linear_parts`` takes in one call.
MAX_LINEAR_PARTS = MAX_PARTS


def _linear_parts_tuned(x, parts, out, num_threads=None, max_simd=2):
    """Private: ``linear_parts`` with the instruction set capped at ``max_simd``."""
    cdef cnp.ndarray xa = _f32(x, "x", (None, None))
    cdef Py_ssize_t k = xa.shape[1]
    if not isinstance(parts, (list, tuple)) or not parts or len(parts) > MAX_PARTS:
        raise TypeError(f"parts must be a list or tuple of 1 to {MAX_PARTS} (panel, fmt, n)")
    # C arrays on the stack: a decode step makes this call ~4 times a layer
    cdef int nparts = len(parts), i = 0
    cdef int F[MAX_PARTS]
    cdef int N[MAX_PARTS]
    cdef int q[MAX_PARTS + 1]
    cdef int c[MAX_PARTS + 1]
    cdef const uint8_t *P[MAX_PARTS]
    cdef cnp.ndarray pa
    cdef double wbytes = 0      # the parts' panel bytes (split_of)
    held = []
    q[0] = c[0] = 0
    for part in parts:
        if not isinstance(part, tuple) or len(part) != 3:
            raise TypeError("each part must be a (panel, fmt, n) tuple")
        panel, fmt, n = part
        bs, bb = _format(fmt)
        if k % bs:
            raise ValueError(f"{fmt} rows hold a multiple of {bs} values; x has {k} columns")
        if not isinstance(n, int) or n < 0 or n > _INT_MAX:
            raise ValueError(f"n must be a non-negative int below 2**31, got {n!r}")
        pa = _panels(panel, fmt, n, k)
        held.append(pa)
        wbytes += pa.shape[0]
        F[i], N[i], P[i] = BLOCK_FORMATS[fmt], n, <const uint8_t *>cnp.PyArray_DATA(pa)
        if c[i] + <Py_ssize_t>n > _INT_MAX:
            raise ValueError("matrix dimensions must be below 2**31")
        q[i + 1], c[i + 1] = q[i] + (n + 31) // 32, c[i] + n
        i += 1
    cdef Py_ssize_t ntot = c[nparts]
    cdef cnp.ndarray oa = _f32(out, "out", (xa.shape[0], ntot), True)
    if max(xa.shape[0], k) > _INT_MAX:
        raise ValueError("matrix dimensions must be below 2**31")
    if _overlap(oa, xa) or any(_overlap(oa, pa) for pa in held):
        raise ValueError("out must not overlap x or the panel")
    cdef int M = xa.shape[0], K = k, t, rc = 0, total = q[nparts], ldc = ntot
    if M == 0 or ntot == 0:
        return out
    cdef int simd = min(int(max_simd), pagedcy_simd_level())
    cdef pg_q8a act
    with nogil:
        rc = pg_q8a_quantize_tls(simd, M, K, <const float *>cnp.PyArray_DATA(xa), K, &act)
    if rc:
        raise MemoryError("out of memory for the quantized activations")
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    # threads take runs of whole panel pairs (the AVX-512 tile's 32 rows) over all the parts:
    # one parallel region for a fused q|k|v whose parts differ in format
    cdef int nt = min(_nthreads(ntot, K, M, resolve_num_threads(num_threads)), total)
    cdef _PartsJob job
    job.simd, job.M, job.total, job.nparts, job.ldc, job.rc = simd, M, total, nparts, ldc, 0
    job.act, job.F, job.pairs0, job.P, job.N, job.col, job.op = &act, F, q, P, N, c, op
    job.split = split_of(total, nt, wbytes, M < PG_Q8P_TILE_M)
    with nogil:
        run_split(_parts_job, &job, nt)
    rc = job.rc
    if rc:
        raise MemoryError("out of memory for the GEMM's packing buffers")
    return out


def linear_parts(x, parts, out, num_threads=None):
    """``out[...] = x @ W.T`` for ``W`` the rows of several panel weights stacked (a fused
    q|k|v whose parts differ in format): ``parts`` a list of ``(panel, fmt, n)``, ``x``
    float32 ``[M, K]``, ``out`` float32 ``[M, sum(n)]``. One quantization of ``x`` and one
    parallel region over all the parts' panels; each part's columns get the bits ``linear``
    gives it alone. TypeError / ValueError as ``linear``. Returns ``out``."""
    return _linear_parts_tuned(x, parts, out, num_threads)


def linear(x, panel, fmt, n, out, num_threads=None):
    """``out[...] = x @ W.T`` for a panel weight ``panel`` (``repack``'s result) of ``n`` rows in
    format ``fmt``, with int8 activations: ``x`` float32 ``[M, K]``, ``out`` float32 ``[M, n]``,
    both C-contiguous. The bits of ``_gemm.linear_rows_q8`` on the raw rows (each row of x
    quantized per 32 elements, integer dot products; error per output at most ``sum_g
    max|x_g| / 254 * sum_{k in g} |w_k|`` plus float32 rounding). TypeError / ValueError for
    wrong dtypes, shapes or overlap. Returns ``out``."""
    return _linear_tuned(x, panel, fmt, n, out, num_threads)

