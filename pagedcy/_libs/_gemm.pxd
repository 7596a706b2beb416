# Float32 GEMM kernel (pagedcy_gemm.h): columns [n0, n1) of A @ W^T on the calling thread.
from libc.stdint cimport int64_t

cdef extern from "pagedcy_gemm.h" nogil:
    void pagedcy_gemm_nt_rows(int simd, int M, int n0, int n1, int K, const float *A, int64_t lda,
                              const float *W, int64_t ldw, float *C, int64_t ldc)
