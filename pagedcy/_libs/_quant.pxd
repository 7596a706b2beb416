# GGUF block formats (pagedcy_quant.h): row decoders, Q8_0 / Q4_0 quantizers and the
# decode-size linear (pagedcy_quant_linear.h), callable without the GIL.
from libc.stdint cimport int64_t, uint8_t

from pagedcy._libs._rowfmt cimport pagedcy_row_decode_fn, pagedcy_rowfmt

cdef extern from "pagedcy_quant.h" nogil:
    int pagedcy_simd_level()
    const pagedcy_rowfmt *pagedcy_quant_rowfmt(int ggml_type, int simd_level)
    void pagedcy_quant_decode_rows(const pagedcy_rowfmt *fmt, const uint8_t *raw, int64_t row_bytes,
                                   int64_t r0, int64_t r1, int64_t K, float *out)
    int pagedcy_quantize_blocks(int ggml_type, const float *x, int64_t nblocks, uint8_t *out)

cdef extern from "pagedcy_quant_linear.h" nogil:
    void pagedcy_quant_linear_rows(int ggml_type, int simd, int64_t M, int64_t n0,
                                   int64_t n1, int64_t K, const float *x, int64_t ldx,
                                   const uint8_t *W, int64_t row_bytes, float *out, int64_t ldo)
