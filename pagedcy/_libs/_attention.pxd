# Declarations shared by _attention.pyx. No C-level API is exported: the
# kernel trusts its parameters, and only the Python entry points validate them
# (pagedcy_attn_params also carries private tuning bits that may change).
from libc.stdint cimport int32_t, int64_t

cdef extern from "pagedcy_attention.h":
    ctypedef struct pagedcy_attn_params:
        const float *q
        const int64_t *qo_indptr
        const char *kv
        int32_t dtype
        int64_t page_stride
        int64_t layer_offset
        int64_t v_offset
        int64_t tok_stride
        int64_t head_stride
        const int32_t *block_tables
        int64_t bt_stride
        const int64_t *kv_lens
        int32_t B, H, Hkv, D, T
        float scale, soft_cap
        int32_t causal, window_left
        const float *alibi
        float *out
        float *lse
        int32_t use_simd
        int32_t flags
        int32_t qk_i8

