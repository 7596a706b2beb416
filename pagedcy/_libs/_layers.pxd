cimport numpy as cnp

# Row kernels of the transformer layers: plain C on float32 rows, callable without the GIL.
cdef void rms_row(const float *x, float *residual, const float *weight, float eps,
                  float *out, Py_ssize_t d) noexcept nogil
cdef void qkv_rope_row(const float *qkv, const float *bias, const float *cos_row,
                       const float *sin_row, const float *q_norm, const float *k_norm, float eps,
                       float *q_out, float *k_out, float *v_out, Py_ssize_t num_heads,
                       Py_ssize_t num_kv_heads, Py_ssize_t head_dim) noexcept nogil

cdef extern from "pagedcy_layers.h" nogil:
    float pagedcy_expf(float x)
    int pagedcy_rows_build()
    void pagedcy_silu_mul_row(const float *gate_up, float *out, Py_ssize_t width)
    void pagedcy_gelu_tanh_mul_row(const float *gate_up, float *out, Py_ssize_t width)
    void pagedcy_rms_row(const float *x, float *residual, const float *weight, float eps,
                         float *out, Py_ssize_t d)

# Boundary checks shared with the other float32 row-kernel modules (_gemm).
cdef cnp.ndarray _f32(object a, str name, tuple shape, bint writable=*)
cdef bint _overlap(cnp.ndarray a, cnp.ndarray b)
