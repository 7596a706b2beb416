# The int8-activation GEMM on panel-repacked GGUF weights (pagedcy_gemm_q8p.h).
from libc.stdint cimport int64_t, uint8_t

from pagedcy._libs._gemm cimport pg_q8a

cdef extern from "pagedcy_gemm_q8a.h" nogil:
    int PG_Q8P_TILE_M     # rows from which the panels run the packed tile, not the decode kernels
    void pagedcy_q8p_rows(int F, const uint8_t *P, int K, const int64_t *ids, int count, uint8_t *out)
    int pagedcy_q8p_repack(int F, const uint8_t *W, int64_t wrb, int N, int K, int p0, int p1, uint8_t *P)
    int pagedcy_gemm_q8p(int simd, int F, int M, int p0, int p1, const pg_q8a *a, const uint8_t *P,
                         int N, float *C, int64_t ldc)
