# C-level entry points of pagedcy._libs._attention, for other Cython modules:
#     from pagedcy._libs._attention cimport pagedcy_attn_params, paged_attention_nogil
from libc.stdint cimport int32_t, int64_t

cdef extern from "pagedcy_attention.h":
    ctypedef struct pagedcy_attn_params:
        const float *q
        const int64_t *qo_indptr
        const char *kv
        int32_t dtype
        int64_t page_stride
        int64_t layer_offset
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


# Runs the kernel on already-validated parameters (see batch_paged_attention
# for the contract). kv_chunk: 0 automatic KV splitting, > 0 split size in
# tokens, < 0 no splitting. Returns 0, or -1 when scratch memory could not be
# allocated. Safe to call without the GIL; spawns its own OpenMP team.
cdef int paged_attention_nogil(const pagedcy_attn_params *P, int num_threads,
                               int64_t kv_chunk) noexcept nogil
