# GEMM kernel (pagedcy_gemm.h): columns [n0, n1) of A @ W^T on the calling thread, for a
# float32 weight (pagedcy_gemm_nt_rows) or one in any row format (pagedcy_gemm_rows_fmt:
# a format plugs in as a pagedcy_rowfmt decoder). Both return 0, -1 when out of memory, -2
# for a format whose block does not divide the kernel's K block.
from libc.stdint cimport int8_t, int32_t, int64_t

from pagedcy._libs._rowfmt cimport pagedcy_row_decode_fn, pagedcy_rowfmt

cdef extern from "pagedcy_gemm.h" nogil:
    int pagedcy_gemm_nt_rows(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                             const float *W, int64_t ldw, float *C, int64_t ldc)
    int pagedcy_gemm_rows_fmt(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                              const void *W, int64_t w_row_bytes, const pagedcy_rowfmt *fmt,
                              float *C, int64_t ldc)
    const pagedcy_rowfmt pagedcy_rowfmt_f32, pagedcy_rowfmt_f16, pagedcy_rowfmt_bf16

# Threads for an [M, K] x [N, K]^T call (PARALLEL_WEIGHT_BYTES / PARALLEL_MACS), shared with
# the panel GEMM (_q8panel).
cdef int _nthreads(int N, int K, int M, int nt) noexcept

# The int8-activation GEMM (pagedcy_gemm_q8a.h): activations quantized per 32 elements (pg_q8a),
# raw GGUF rows here; _q8panel runs the same definition on panel-repacked weights.
cdef extern from "pagedcy_gemm_q8a.h" nogil:
    ctypedef struct pg_q8a:
        int K
        const int8_t *qa
        const float *da
        const int32_t *s16
    void pg_q8a_quantize(int level, int M, int K, const float *A, int64_t lda, int8_t *qa, float *da,
                         int32_t *s16)
    int pg_q8a_quantize_tls(int level, int M, int K, const float *A, int64_t lda, pg_q8a *a)
    int pagedcy_gemm_q8a(int simd, int F, int M, int n0, int n1, const pg_q8a *a, const void *W,
                         int64_t w_row_bytes, float *C, int64_t ldc)
