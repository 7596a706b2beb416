# The int8-activation GEMM on panel-repacked GGUF weights (pagedcy_gemm_q8p.h).
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t

cdef extern from "pagedcy_gemm_q8a.h" nogil:
    ctypedef struct pg_q8a:
        int K
        const int8_t *qa
        const float *da
        const int32_t *s16
    int pg_q8a_quantize_tls(int level, int M, int K, const float *A, int64_t lda, pg_q8a *a)
    void pagedcy_q8p_rows(int F, const uint8_t *P, int K, const int64_t *ids, int count, uint8_t *out)
    void pg_q8p_tune(int pfd, int loc)
    int pagedcy_q8p_repack(int F, const uint8_t *W, int64_t wrb, int N, int K, int p0, int p1, uint8_t *P)
    int pagedcy_gemm_q8p(int simd, int F, int M, int p0, int p1, const pg_q8a *a, const uint8_t *P,
                         int N, float *C, int64_t ldc)
