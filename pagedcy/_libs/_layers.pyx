"""Elementwise transformer kernels on preallocated float32 buffers.

The model's forward pass runs its projections as BLAS matmuls; everything between them
(RMSNorm with the residual add, q/k/v bias + per-head q/k norm + RoPE + split, SiLU(gate)*up
or GELU-tanh(gate)*up)
runs here as GIL-free C loops over rows that write into buffers the caller owns, instead of
chains of NumPy temporaries. Rows are spread over OpenMP threads only when a call has enough
work to pay for the fork/join (a prefill, not a decode step).
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int32_t

from pagedcy._libs._openmp cimport PAGEDCY_OPENMP
from pagedcy._libs._threads import resolve_num_threads
from pagedcy._validate import check_positive, finite_float

cnp.import_array()

# Below this many float32 elements per call, one thread. When the models' GEMMs were NumPy's,
# an OpenMP region next to OpenBLAS's own threads could wait milliseconds for a descheduled
# worker (the benchmark model's 4 x 256-token prefill: 35 ms in these kernels on one thread,
# 620 ms split over two), so only calls of several million elements split. The models now
# run every projection on pagedcy's own GEMM and OpenMP runtime: a 2048-token step's
# RMSNorm (2048 x 512) takes 0.43 ms on one thread and 0.22 ms on two (Intel Xeon).
PARALLEL_ELEMENTS = 1 << 19


cdef void rms_row(const float *x, float *residual, const float *weight, float eps,
                  float *out, Py_ssize_t d) noexcept nogil:
    """out = weight * r / sqrt(mean(r^2) + eps) with r = x, or r = (residual += x) when
    residual is not NULL. out may alias x (the sum is taken before any write)."""
    pagedcy_rms_row(x, residual, weight, eps, out, d)


cdef inline void _head(const float *src, const float *bias, const float *norm, float eps,
                       const float *c, const float *s, float *dst, Py_ssize_t D) noexcept nogil:
    # bias, then the per-head RMSNorm (Qwen3), then RoPE, as transformers orders them.
    cdef Py_ssize_t j, half = D // 2
    cdef float a, b
    if bias != NULL:
        for j in range(D):
            dst[j] = src[j] + bias[j]
    else:
        for j in range(D):
            dst[j] = src[j]
    if norm != NULL:
        rms_row(dst, NULL, norm, eps, dst, D)
    # rotate_half (neox style): the pairs are (j, j + D/2), not adjacent lanes.
    for j in range(half):
        a = dst[j]
        b = dst[j + half]
        dst[j] = a * c[j] - b * s[j]
        dst[j + half] = b * c[j] + a * s[j]


cdef void qkv_rope_row(const float *qkv, const float *bias, const float *cos_row,
                       const float *sin_row, const float *q_norm, const float *k_norm, float eps,
                       float *q_out, float *k_out, float *v_out, Py_ssize_t num_heads,
                       Py_ssize_t num_kv_heads, Py_ssize_t head_dim) noexcept nogil:
    """Split one fused q|k|v projection row, add the bias, norm and rotate q and k."""
    cdef Py_ssize_t h, j, D = head_dim
    cdef Py_ssize_t qw = num_heads * D, kw = num_kv_heads * D
    for h in range(num_heads):
        _head(qkv + h * D, bias + h * D if bias != NULL else NULL, q_norm, eps,
              cos_row, sin_row, q_out + h * D, D)
    for h in range(num_kv_heads):
        _head(qkv + qw + h * D, bias + qw + h * D if bias != NULL else NULL, k_norm, eps,
              cos_row, sin_row, k_out + h * D, D)
    if bias != NULL:
        for j in range(kw):
            v_out[j] = qkv[qw + kw + j] + bias[qw + kw + j]
    else:
        for j in range(kw):
            v_out[j] = qkv[qw + kw + j]


# -- Python boundary: validate everything, then trust the nogil loops -------------------

cdef cnp.ndarray _f32(object a, str name, tuple shape, bint writable=False):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISNOTSWAPPED(arr):
        raise TypeError(f"{name} must be float32 in native byte order, got {arr.dtype.str}")
    got = (<object>a).shape
    if len(got) != len(shape) or any(s is not None and got[i] != s for i, s in enumerate(shape)):
        want = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {got}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return arr


cdef bint _overlap(cnp.ndarray a, cnp.ndarray b):
    """Whether two C-contiguous arrays share bytes (their ranges are exact)."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(a), nb = cnp.PyArray_NBYTES(b)
    return na > 0 and nb > 0 and pa < pb + nb and pb < pa + na


cdef inline const float *_opt(object a, str name, tuple shape) except? NULL:
    if a is None:
        return NULL
    return <const float *>cnp.PyArray_DATA(_f32(a, name, shape))


cdef float _eps(object eps) except? -1:
    cdef double e = finite_float(eps, "eps")
    if not (e > 0 and e < 1e30):
        raise ValueError(f"eps must be a positive finite float, got {eps!r}")
    return e


cdef int _threads(object num_threads, Py_ssize_t elements) except -1:
    cdef int nt = resolve_num_threads(num_threads)     # checked even when unused
    return 1 if not PAGEDCY_OPENMP or elements < PARALLEL_ELEMENTS else nt


def rms_norm(x, weight, eps, out, residual=None, num_threads=None):
    """RMSNorm of each row of ``x`` (float32 ``[n, d]``) times ``weight`` (float32 ``[d]``)
    into ``out`` (float32 ``[n, d]``; may be ``x`` itself).

    With ``residual`` (float32 ``[n, d]``, not aliasing ``x``/``out``), first
    ``residual += x`` and normalise the sum: the pre-norm block's residual add fused in.
    All arrays C-contiguous. TypeError for a non-array or non-float32 input, ValueError for
    a shape, contiguity or non-positive/non-finite eps.
    """
    cdef cnp.ndarray xa = _f32(x, "x", (None, None))
    cdef Py_ssize_t n = xa.shape[0], d = xa.shape[1], i
    cdef cnp.ndarray wa = _f32(weight, "weight", (d,))
    cdef cnp.ndarray oa = _f32(out, "out", (n, d), True)
    cdef float *res = NULL
    if residual is not None:
        ra = _f32(residual, "residual", (n, d), True)
        if _overlap(ra, xa) or _overlap(ra, oa):
            raise ValueError("residual must not overlap x or out")
        res = <float *>cnp.PyArray_DATA(ra)
    cdef float e = _eps(eps)
    cdef int nt = _threads(num_threads, n * d)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    if nt > 1:
        for i in prange(n, nogil=True, num_threads=nt, schedule="static"):
            rms_row(xp + i * d, res + i * d if res != NULL else NULL, wp, e, op + i * d, d)
    else:
        with nogil:
            for i in range(n):
                rms_row(xp + i * d, res + i * d if res != NULL else NULL, wp, e, op + i * d, d)


def qkv_rope(qkv, positions, cos, sin, q_out, k_out, v_out, num_heads, num_kv_heads,
             bias=None, q_norm=None, k_norm=None, eps=1e-6, num_threads=None):
    """Split fused projections ``qkv`` (float32 ``[n, (H + 2*Hkv) * D]``, q | k | v) into
    ``q_out`` (float32 ``[n, H, D]``), ``k_out`` and ``v_out`` (float32 ``[n, Hkv * D]``),
    adding ``bias`` (``[(H + 2*Hkv) * D]``) if given, RMS-normalising each q and k head with
    ``q_norm``/``k_norm`` (``[D]``, eps ``eps``) if given, then rotating q and k with RoPE
    (rotate_half layout) at ``positions`` (int32 ``[n]``) from the tables ``cos``/``sin``
    (float32 ``[P, D/2]``; every position must be < P).

    TypeError for dtypes, ValueError for shapes, odd head_dim or overlapping outputs,
    IndexError for a position outside the tables.
    """
    H = check_positive(num_heads, "num_heads", 2**20)
    Hk = check_positive(num_kv_heads, "num_kv_heads", 2**20)
    cdef cnp.ndarray qa = _f32(q_out, "q_out", (None, H, None), True)
    cdef Py_ssize_t n = qa.shape[0], D = qa.shape[2], i
    if D % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {D}")
    cdef Py_ssize_t W = (H + 2 * Hk) * D, kw = Hk * D, half = D // 2
    cdef cnp.ndarray xa = _f32(qkv, "qkv", (n, W))
    cdef cnp.ndarray ka = _f32(k_out, "k_out", (n, kw), True)
    cdef cnp.ndarray va = _f32(v_out, "v_out", (n, kw), True)
    cdef cnp.ndarray ca = _f32(cos, "cos", (None, half))
    cdef cnp.ndarray sa = _f32(sin, "sin", (ca.shape[0], half))
    if _overlap(qa, xa) or _overlap(ka, xa) or _overlap(va, xa):
        raise ValueError("outputs must not overlap qkv")
    if _overlap(qa, ka) or _overlap(qa, va) or _overlap(ka, va):
        raise ValueError("q_out, k_out and v_out must not overlap")
    if not isinstance(positions, np.ndarray) or positions.dtype != np.int32:
        raise TypeError("positions must be an int32 numpy array")
    if positions.shape != (n,) or not positions.flags.c_contiguous:
        raise ValueError(f"positions must be C-contiguous with shape ({n},)")
    cdef const int32_t[::1] pos = positions
    cdef Py_ssize_t P = ca.shape[0]
    for i in range(n):
        if pos[i] < 0 or pos[i] >= P:
            raise IndexError(f"position {pos[i]} is outside [0, {P}), the rows of the cos/sin tables")
    cdef const float *bp = _opt(bias, "bias", (W,))
    cdef const float *qn = _opt(q_norm, "q_norm", (D,))
    cdef const float *kn = _opt(k_norm, "k_norm", (D,))
    cdef float e = _eps(eps)
    cdef int nt = _threads(num_threads, n * W)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *cp = <const float *>cnp.PyArray_DATA(ca)
    cdef const float *sp = <const float *>cnp.PyArray_DATA(sa)
    cdef float *qp = <float *>cnp.PyArray_DATA(qa)
    cdef float *kp = <float *>cnp.PyArray_DATA(ka)
    cdef float *vp = <float *>cnp.PyArray_DATA(va)
    cdef Py_ssize_t Hs = H, Hks = Hk
    if nt > 1:
        for i in prange(n, nogil=True, num_threads=nt, schedule="static"):
            qkv_rope_row(xp + i * W, bp, cp + pos[i] * half, sp + pos[i] * half, qn, kn, e,
                         qp + i * Hs * D, kp + i * kw, vp + i * kw, Hs, Hks, D)
    else:
        with nogil:
            for i in range(n):
                qkv_rope_row(xp + i * W, bp, cp + pos[i] * half, sp + pos[i] * half, qn, kn, e,
                             qp + i * Hs * D, kp + i * kw, vp + i * kw, Hs, Hks, D)


def silu_mul(gate_up, out, num_threads=None):
    """``out = silu(gate) * up`` where each row of ``gate_up`` (float32 ``[n, 2*I]``) is
    gate | up and ``out`` is float32 ``[n, I]`` (not overlapping ``gate_up``).
    TypeError for dtypes, ValueError for shapes, contiguity or overlap."""
    _act_mul(gate_up, out, num_threads, pagedcy_silu_mul_row)


def gelu_tanh_mul(gate_up, out, num_threads=None):
    """``out = gelu_tanh(gate) * up`` (GELU's tanh approximation, transformers'
    ``gelu_pytorch_tanh``) with ``gate_up`` and ``out`` as :func:`silu_mul`'s."""
    _act_mul(gate_up, out, num_threads, pagedcy_gelu_tanh_mul_row)


ctypedef void (*_act_row_fn)(const float *gate_up, float *out, Py_ssize_t width) noexcept nogil


cdef _act_mul(gate_up, out, num_threads, _act_row_fn row):
    """Check gate_up [n, 2*I] and out [n, I], then run ``row`` on every row."""
    cdef cnp.ndarray ga = _f32(gate_up, "gate_up", (None, None))
    cdef Py_ssize_t n = ga.shape[0], w2 = ga.shape[1], i
    if w2 % 2:
        raise ValueError(f"gate_up must have an even number of columns, got {w2}")
    cdef Py_ssize_t w = w2 // 2
    cdef cnp.ndarray oa = _f32(out, "out", (n, w), True)
    if _overlap(oa, ga):
        raise ValueError("out must not overlap gate_up")
    cdef int nt = _threads(num_threads, n * w2)
    cdef const float *gp = <const float *>cnp.PyArray_DATA(ga)
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    if nt > 1:
        for i in prange(n, nogil=True, num_threads=nt, schedule="static"):
            row(gp + i * w2, op + i * w, w)
    else:
        with nogil:
            for i in range(n):
                row(gp + i * w2, op + i * w, w)


def _rows_build():
    """The build the row kernels (rms_norm, silu_mul, gelu_tanh_mul) take: 2 AVX-512, 1 AVX2 +
    FMA, 0 the baseline; ``PAGEDCY_SIMD`` caps it as it caps the other kernels."""
    return pagedcy_rows_build()
