# The row-format type (pagedcy_rowfmt.h) that the GEMM's packing (_gemm) and the GGUF block
# formats (_quant) share: a format is a decoder of row ranges to float32.
from libc.stdint cimport int64_t

cdef extern from "pagedcy_rowfmt.h" nogil:
    ctypedef void (*pagedcy_row_decode_fn)(const void *row, int64_t k0, int64_t nk, float *dst)
    ctypedef struct pagedcy_rowfmt:
        pagedcy_row_decode_fn decode
        int64_t block
        int64_t block_bytes
