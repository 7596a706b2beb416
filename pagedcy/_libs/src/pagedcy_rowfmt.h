/* A weight row format: how one row of a row-major [N, K] weight is stored and how
 * to widen a range of it to float32. The GEMM's packing routines and the block
 * formats (GGUF's Q8_0, Q4_K, ...) meet here: a format supplies a decoder, the
 * GEMM (pagedcy_gemm.h) packs through it, so no kernel family per format. */
#ifndef PAGEDCY_ROWFMT_H
#define PAGEDCY_ROWFMT_H

#include <stdint.h>

/* Write elements [k0, k0 + nk) of the row stored at `row` to dst[0 .. nk) as
 * float32. k0 is a multiple of the format's block; so is nk, unless k0 + nk is
 * the end of the row. */
typedef void (*pagedcy_row_decode_fn)(const void *row, int64_t k0, int64_t nk, float *dst);

typedef struct {
    pagedcy_row_decode_fn decode;
    int64_t block;        /* elements per block (1 for f32, f16 and bf16) */
    int64_t block_bytes;  /* bytes per block: a row of K elements takes K / block * block_bytes */
    int qtile;            /* a GGUF block format's GGML type (pagedcy_quant.h) when the GEMM's
                             streaming tiles decode it in registers (pagedcy_gemm_qtile.h), else 0 */
} pagedcy_rowfmt;

#endif
