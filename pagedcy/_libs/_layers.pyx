"""Elementwise transformer kernels on preallocated float32 buffers.

The model's forward pass runs its projections as BLAS matmuls; everything between them
(RMSNorm with the residual add, q/k/v bias + per-head q/k norm + RoPE + split, SiLU(gate)*up)
runs here as GIL-free C loops over rows that write into buffers the caller owns, instead of
chains of NumPy temporaries. Rows are spread over OpenMP threads only when a call has enough
work to pay for the fork/join (a prefill, not a decode step).
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.math cimport sqrt, expf
from libc.stdint cimport int32_t

from pagedcy._libs._openmp cimport PAGEDCY_OPENMP
from pagedcy._libs._threads import resolve_num_threads

cnp.import_array()

# Below this many float32 elements per call, one thread: an OpenMP fork/join costs a few
# microseconds, more than a decode step's elementwise work on one core.
PARALLEL_ELEMENTS = 1 << 16


cdef void rms_row(const float *x, float *residual, const float *weight, float eps,
                  float *out, Py_ssize_t d) noexcept nogil:
    """out = weight * r / sqrt(mean(r^2) + eps) with r = x, or r = (residual += x) when
    residual is not NULL. out may alias x (the sum is taken before any write)."""
    cdef Py_ssize_t j
    cdef double ss = 0.0
    cdef float v, inv
    cdef const float *src = x
    if residual != NULL:
        for j in range(d):
            v = residual[j] + x[j]
            residual[j] = v
            ss += <double>v * v
        src = residual
    else:
        for j in range(d):
            ss += <double>x[j] * x[j]
    inv = <float>(1.0 / sqrt(ss / d + eps))
    for j in range(d):
        out[j] = weight[j] * (src[j] * inv)


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


cdef void silu_mul_row(const float *gate_up, float *out, Py_ssize_t width) noexcept nogil:
    """out[j] = silu(gate[j]) * up[j] for a row laid out as gate | up."""
    cdef Py_ssize_t j
    cdef float g
    for j in range(width):
        g = gate_up[j]
        out[j] = g / (<float>1.0 + expf(-g)) * gate_up[width + j]


# -- Python boundary: validate everything, then trust the nogil loops -------------------

cdef cnp.ndarray _f32(object a, str name, tuple shape, bint writable=False):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32:
        raise TypeError(f"{name} must be float32, got {arr.dtype}")
    got = (<object>a).shape
    if len(got) != len(shape) or any(s is not None and got[i] != s for i, s in enumerate(shape)):
        want = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {got}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return arr


cdef inline const float *_opt(object a, str name, tuple shape) except? NULL:
    if a is None:
        return NULL
    return <const float *>cnp.PyArray_DATA(_f32(a, name, shape))


cdef int _threads(object num_threads, Py_ssize_t elements) except -1:
    if not PAGEDCY_OPENMP or elements < PARALLEL_ELEMENTS:
        return 1
    return resolve_num_threads(num_threads)


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
        if ra is xa or ra is oa or np.shares_memory(ra, xa) or np.shares_memory(ra, oa):
            raise ValueError("residual must not overlap x or out")
        res = <float *>cnp.PyArray_DATA(ra)
    cdef float e = eps
    if not (e > 0 and e < 1e30):
        raise ValueError(f"eps must be a positive finite float, got {eps!r}")
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
    H = int(num_heads)
    Hk = int(num_kv_heads)
    if H < 1 or Hk < 1:
        raise ValueError("num_heads and num_kv_heads must be >= 1")
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
    outs = (qa, ka, va)
    for a_i in range(3):
        if np.shares_memory(outs[a_i], xa):
            raise ValueError("outputs must not overlap qkv")
        for b_i in range(a_i):
            if np.shares_memory(outs[a_i], outs[b_i]):
                raise ValueError("q_out, k_out and v_out must not overlap")
    if not isinstance(positions, np.ndarray) or positions.dtype != np.int32:
        raise TypeError("positions must be an int32 numpy array")
    if positions.shape != (n,) or not positions.flags.c_contiguous:
        raise ValueError(f"positions must be C-contiguous with shape ({n},)")
    cdef const int32_t[::1] pos = positions
    cdef Py_ssize_t P = ca.shape[0]
    if n and (positions.min() < 0 or positions.max() >= P):
        raise IndexError(f"positions must be in [0, {P}), the rows of the cos/sin tables")
    cdef const float *bp = _opt(bias, "bias", (W,))
    cdef const float *qn = _opt(q_norm, "q_norm", (D,))
    cdef const float *kn = _opt(k_norm, "k_norm", (D,))
    cdef float e = eps
    if not (e > 0 and e < 1e30):
        raise ValueError(f"eps must be a positive finite float, got {eps!r}")
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
    cdef cnp.ndarray ga = _f32(gate_up, "gate_up", (None, None))
    cdef Py_ssize_t n = ga.shape[0], w2 = ga.shape[1], i
    if w2 % 2:
        raise ValueError(f"gate_up must have an even number of columns, got {w2}")
    cdef Py_ssize_t w = w2 // 2
    cdef cnp.ndarray oa = _f32(out, "out", (n, w), True)
    if np.shares_memory(oa, ga):
        raise ValueError("out must not overlap gate_up")
    cdef int nt = _threads(num_threads, n * w2)
    cdef const float *gp = <const float *>cnp.PyArray_DATA(ga)
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    if nt > 1:
        for i in prange(n, nogil=True, num_threads=nt, schedule="static"):
            silu_mul_row(gp + i * w2, op + i * w, w)
    else:
        with nogil:
            for i in range(n):
                silu_mul_row(gp + i * w2, op + i * w, w)
