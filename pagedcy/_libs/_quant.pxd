# GGUF block formats (pagedcy_quant.h): row decoders and Q8_0 / Q4_0 quantizers, callable
# without the GIL (the GEMM, pagedcy_gemm.h, computes with them: _gemm.linear_rows).
from libc.stdint cimport int64_t, uint8_t

from pagedcy._libs._rowfmt cimport pagedcy_row_decode_fn, pagedcy_rowfmt

cdef extern from "pagedcy_quant.h" nogil:
    int pagedcy_simd_level()
    const pagedcy_rowfmt *pagedcy_quant_rowfmt(int ggml_type, int simd_level)
    void pagedcy_quant_decode_rows(const pagedcy_rowfmt *fmt, const uint8_t *raw, int64_t row_bytes,
                                   int64_t r0, int64_t r1, int64_t K, float *out)
    int pagedcy_quantize_blocks(int ggml_type, const float *x, int64_t nblocks, uint8_t *out)
