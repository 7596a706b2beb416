"""Paged attention over the pagedcy page pool (batched decode + prefill).

The heavy lifting is in ``src/pagedcy_attention.h``; this module validates
everything coming from Python, then runs the kernel with the GIL released.
"""
import math

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free

from pagedcy._libs._team cimport pagedcy_atomic_or, pagedcy_claim, run_split, team_threads
from pagedcy._libs._threads import resolve_num_threads
from pagedcy._validate import (as_int, check_index, check_out, check_positive, finite_float,
                               float_array, int_array_nd)

cnp.import_array()

cdef extern from "pagedcy_attention.h":
    ctypedef struct pagedcy_attn_item:
        pass
    ctypedef struct pagedcy_attn_group:
        pass
    ctypedef struct pagedcy_attn_plan:
        pagedcy_attn_item *items
        pagedcy_attn_group *groups
        int64_t nitems, ngroups
        int64_t part_o_floats, part_lse_floats
        int64_t ws_floats
        int32_t nthreads
    int PAGEDCY_F32, PAGEDCY_F16, PAGEDCY_BF16, PAGEDCY_I8, PAGEDCY_I8_SCALE_BYTES
    int PAGEDCY_SIMD_AVX512
    enum:
        PA_TUNE_PF_L1
        PA_TUNE_PF_NEXT_HEAD
        PA_TUNE_NO_PACK
        PA_TUNE_PLAIN_ORDER
        PA_TUNE_NO_PF
        PA_TUNE_PF_ROWS
        PA_TUNE_NO_BF16_PERM
        PA_TUNE_PREFILL_M128
        PA_TUNE_PREFILL_M32
        PA_TUNE_PREFILL_M256
        PA_TUNE_NO_QK3
        PA_TUNE_PF_PARTIAL
        PA_TUNE_PREFILL_M512
        PA_TUNE_SUPER1
        PA_TUNE_SUPER2
        PA_TUNE_SUPER_F32
        PA_TUNE_SUPER_PAGE_ORDER
        PA_TUNE_NO_VNNI
        PA_TUNE_PACK1
        PA_TUNE_PACK2
    int pagedcy_use_simd() noexcept nogil
    int pagedcy_simd_level() noexcept nogil
    pagedcy_attn_plan *pagedcy_attn_make_plan(const pagedcy_attn_params *P, int nthreads,
                                              int64_t kv_chunk, double min_work) noexcept nogil
    double PAGEDCY_ATTN_MIN_PARALLEL_WORK, PAGEDCY_ATTN_TEAM_MIN_WORK
    void pagedcy_attn_free_plan(pagedcy_attn_plan *pl) noexcept nogil
    void pagedcy_attn_run_item(const pagedcy_attn_params *P, const pagedcy_attn_item *it,
                               float *ws, float *part_o, float *part_lse) noexcept nogil
    int pagedcy_attn_merge_group(const pagedcy_attn_params *P, const pagedcy_attn_group *g,
                                 const float *part_o, const float *part_lse) noexcept nogil
    void pagedcy_merge_one(int k, const float *const *v, const float *s, int D,
                           float *out, float *s_out) noexcept nogil
    void *pagedcy_aligned_alloc(size_t nbytes) noexcept nogil


#: Names of the private tuning switches (enum pagedcy_attn_tune) for
#: ``_batch_paged_attention_tuned(flags=...)``; results never depend on them.
_TUNE_FLAGS = {
    "pf_l1": PA_TUNE_PF_L1, "pf_next_head": PA_TUNE_PF_NEXT_HEAD, "no_pack": PA_TUNE_NO_PACK,
    "plain_order": PA_TUNE_PLAIN_ORDER, "no_prefetch": PA_TUNE_NO_PF, "pf_rows": PA_TUNE_PF_ROWS,
    "no_bf16_perm": PA_TUNE_NO_BF16_PERM, "prefill_m128": PA_TUNE_PREFILL_M128,
    "prefill_m32": PA_TUNE_PREFILL_M32, "prefill_m256": PA_TUNE_PREFILL_M256,
    "no_qk3": PA_TUNE_NO_QK3, "pf_partial": PA_TUNE_PF_PARTIAL,
    "prefill_m512": PA_TUNE_PREFILL_M512, "super1": PA_TUNE_SUPER1, "super2": PA_TUNE_SUPER2,
    "super_f32": PA_TUNE_SUPER_F32, "super_page_order": PA_TUNE_SUPER_PAGE_ORDER,
    "no_vnni": PA_TUNE_NO_VNNI, "pack1": PA_TUNE_PACK1, "pack2": PA_TUNE_PACK2,
}


ctypedef struct _AttnJob:
    const pagedcy_attn_params *P
    pagedcy_attn_plan *pl
    float *ws
    float *part_o
    float *part_lse
    long long next_item, next_group
    int merr          # the merges' error codes or-ed


cdef void _attn_items_job(void *arg, int t, int nt) noexcept nogil:
    """Thread t's share of the plan's items, claimed one at a time (``run_split``'s job: a
    dynamic schedule of chunk 1; ws slot t is this share's alone)."""
    cdef _AttnJob *j = <_AttnJob *>arg
    cdef long long i = pagedcy_claim(&j.next_item)
    while i < j.pl.nitems:
        pagedcy_attn_run_item(j.P, &j.pl.items[i], j.ws + t * j.pl.ws_floats, j.part_o, j.part_lse)
        i = pagedcy_claim(&j.next_item)


cdef void _attn_merge_job(void *arg, int t, int nt) noexcept nogil:
    """The merge groups, claimed one at a time."""
    cdef _AttnJob *j = <_AttnJob *>arg
    cdef long long i = pagedcy_claim(&j.next_group)
    while i < j.pl.ngroups:
        pagedcy_atomic_or(&j.merr, pagedcy_attn_merge_group(j.P, &j.pl.groups[i], j.part_o, j.part_lse))
        i = pagedcy_claim(&j.next_group)


# Least work (cost units x head_dim) for more than one thread, on a step's team (its threads
# spin) and otherwise (they may sleep); _set_min_parallel_work changes them for A/B runs.
cdef double _team_min_work = PAGEDCY_ATTN_TEAM_MIN_WORK
cdef double _min_work = PAGEDCY_ATTN_MIN_PARALLEL_WORK


def _set_min_parallel_work(team, other):
    """Private: set the least work for several threads on a team and off one; returns the
    previous pair."""
    global _team_min_work, _min_work
    prev = (_team_min_work, _min_work)
    t, o = float(team), float(other)
    if not (t >= 0 and o >= 0):
        raise ValueError("the least parallel work must be >= 0")
    _team_min_work, _min_work = t, o
    return prev


cdef int _run_kernel(const pagedcy_attn_params *P, int num_threads, int64_t kv_chunk) noexcept nogil:
    """Plan, run every item on an OpenMP team, merge the splits. Returns 0, or
    -1 when scratch memory could not be allocated."""
    cdef double min_work = _team_min_work if team_threads() == num_threads else _min_work
    cdef pagedcy_attn_plan *pl = pagedcy_attn_make_plan(P, num_threads, kv_chunk, min_work)
    if pl == NULL:
        return -1
    cdef int nt = num_threads
    if nt > pl.nthreads:
        nt = pl.nthreads
    if nt > pl.nitems:
        nt = <int>pl.nitems if pl.nitems > 0 else 1
    cdef float *ws = <float *>pagedcy_aligned_alloc(<size_t>(nt * pl.ws_floats) * sizeof(float))
    cdef float *part_o = <float *>pagedcy_aligned_alloc(<size_t>pl.part_o_floats * sizeof(float))
    cdef float *part_lse = <float *>pagedcy_aligned_alloc(<size_t>pl.part_lse_floats * sizeof(float))
    cdef int rc = 0
    cdef _AttnJob job
    if ws == NULL or part_o == NULL or part_lse == NULL:
        rc = -1
    else:       # on nt threads of their own, or of the step's team the caller runs on
        job.P, job.pl, job.ws, job.part_o, job.part_lse = P, pl, ws, part_o, part_lse
        job.next_item = job.next_group = 0
        job.merr = 0
        run_split(_attn_items_job, &job, nt)
        if pl.ngroups > 0:
            run_split(_attn_merge_job, &job, nt)
            if job.merr != 0:
                rc = -1
    free(ws)
    free(part_o)
    free(part_lse)
    pagedcy_attn_free_plan(pl)
    return rc


cdef int _kv_dtype_code(cnp.ndarray kv) except -1:
    dt = kv.dtype
    if dt == np.float32:
        return PAGEDCY_F32
    if dt == np.float16:
        return PAGEDCY_F16
    if dt.name == "bfloat16" or dt == np.uint16:
        return PAGEDCY_BF16
    if dt == np.int8:
        return PAGEDCY_I8
    raise TypeError("kv_pages dtype must be float32, float16, bfloat16 (or uint16 bf16 bits) or int8, "
                    f"got {dt}")


cdef int _check_ragged(const int64_t[::1] ind, const int64_t[::1] lens, int64_t total_q,
                       int64_t maxp, int64_t T) except -1:
    """qo_indptr / kv_lens rules, in one typed pass: a handful of NumPy calls
    would cost more than a small decode step (measured 18 us against 1 us at B=4)."""
    cdef Py_ssize_t B = lens.shape[0], b
    cdef int64_t ql
    if ind[0] != 0:
        raise ValueError(f"qo_indptr must start at 0, got {ind[0]}")
    if ind[B] != total_q:
        raise ValueError(f"qo_indptr must end at total_q = {total_q}, got {ind[B]}")
    for b in range(B):
        ql = ind[b + 1] - ind[b]
        if ind[b + 1] < ind[b]:
            raise ValueError(f"qo_indptr must be non-decreasing (entry {b + 1})")
        if lens[b] < 0:
            raise ValueError(f"kv_lens must be >= 0, got {lens[b]} for sequence {b}")
        if lens[b] > maxp * T:
            raise ValueError(f"kv_len {lens[b]} of sequence {b} exceeds block_tables capacity "
                             f"{maxp} pages * {T} = {maxp * T}")
        if ql > lens[b]:
            raise ValueError(f"sequence {b} has q_len {ql} > kv_len {lens[b]}")
    return 0


ctypedef fused page_id_t:
    int32_t
    int64_t


cdef int _check_pages(const page_id_t[:, ::1] bt, const int64_t[::1] lens, int64_t T,
                      int64_t max_pages) except -1:
    """Every page id a sequence needs (ceil(kv_len / page_size) of them) is in the pool."""
    cdef Py_ssize_t b, p, n
    for b in range(bt.shape[0]):
        n = (lens[b] + T - 1) // T
        for p in range(n):
            if bt[b, p] < 0 or bt[b, p] >= max_pages:
                raise IndexError(f"block_tables[{b}, {p}] = {bt[b, p]} is outside [0, {max_pages})")
    return 0


def _ragged_batch(qo_indptr, kv_lens, block_tables, int64_t total_q, int64_t T, int64_t max_pages):
    """(qo_indptr int64, kv_lens int64, block_tables int32 [B, >= 1]), all
    C-contiguous, after checking them; only the first ceil(kv_len / T) ids of
    a block-table row are read, so only those must be valid pages."""
    ind = int_array_nd(qo_indptr, "qo_indptr", 1)
    lens = int_array_nd(kv_lens, "kv_lens", 1)
    bt = int_array_nd(block_tables, "block_tables", 2)
    cdef int64_t B = lens.shape[0]
    if ind.shape[0] != B + 1:
        raise ValueError(f"qo_indptr must have length B+1 = {B + 1}, got {ind.shape[0]}")
    if bt.shape[0] != B:
        raise ValueError(f"block_tables must have {B} rows (one per sequence), got {bt.shape[0]}")
    if B > (1 << 30):
        raise ValueError("too many sequences")
    ind64 = np.ascontiguousarray(ind, dtype=np.int64)      # uint64 beyond int64 wraps
    lens64 = np.ascontiguousarray(lens, dtype=np.int64)    # negative: rejected below
    _check_ragged(ind64, lens64, total_q, bt.shape[1], T)
    if bt.dtype == np.int32 and bt.flags.c_contiguous:
        _check_pages[int32_t](bt, lens64, T, max_pages)
        bt32 = bt
    else:
        bt64 = np.ascontiguousarray(bt, dtype=np.int64)
        _check_pages[int64_t](bt64, lens64, T, max_pages)
        bt32 = bt64.astype(np.int32)
    if bt.shape[1] == 0:
        bt32 = np.zeros((B, 1), np.int32)
    return ind64, lens64, bt32


cdef class AttentionBatch:
    """A ragged batch's layout checked once, for the layers of one forward (FlashInfer's
    plan / run): ``qo_indptr`` int ``[B+1]``, ``block_tables`` int ``[B, W]`` and ``kv_lens``
    int ``[B]`` as ``batch_paged_attention`` takes them, over a pool of at least ``max_pages``
    pages of ``page_size`` tokens. The same checks as ``batch_paged_attention``, once (they
    cost ~3 us a call, more than a small decode step's kernel); ``run`` then checks only the
    query, the pages' geometry against this layout, and the options. The arrays are copied:
    later changes to the caller's do not reach the batch."""
    cdef object _ind, _lens, _bt
    cdef int64_t _total_q, _page_size, _max_pages

    @property
    def qo_indptr(self):
        """int64 ``[B+1]``: a copy of the checked qo_indptr (what ``run`` reads stays as
        checked)."""
        return self._ind.copy()

    @property
    def kv_lens(self):
        """int64 ``[B]``: a copy of the checked kv_lens (what ``run`` reads stays as
        checked)."""
        return self._lens.copy()

    @property
    def block_tables(self):
        """int32 ``[B, W]``: a copy of the checked block_tables (what ``run`` reads stays as
        checked)."""
        return self._bt.copy()

    @property
    def total_q(self):
        """Query rows of the batch (qo_indptr's last entry)."""
        return self._total_q

    @property
    def page_size(self):
        """Tokens a page of the pool holds."""
        return self._page_size

    @property
    def max_pages(self):
        """Pages the pool must have at least (every page id is below it)."""
        return self._max_pages

    def __init__(self, qo_indptr, block_tables, kv_lens, *, page_size, max_pages):
        T = check_positive(page_size, "page_size", 1 << 30)
        P = check_positive(max_pages, "max_pages", 1 << 62)
        ind = int_array_nd(qo_indptr, "qo_indptr", 1)
        if ind.shape[0] < 1:
            raise ValueError("qo_indptr must have length B+1 >= 1")
        total_q = int(ind[ind.shape[0] - 1])
        ind64, lens64, bt32 = _ragged_batch(ind, kv_lens, block_tables, total_q, T, P)
        # the copies (views of the caller's arrays otherwise): checked values stay checked
        self._ind, self._lens, self._bt = ind64.copy(), lens64.copy(), bt32.copy()
        self._total_q, self._page_size, self._max_pages = total_q, T, P

    def run(self, query, kv_pages, layer, *, scale=None, causal=True, window_left=-1,
            soft_cap=0.0, alibi_slopes=None, out=None, return_lse=False, num_threads=None,
            quantize_query=False):
        """``batch_paged_attention(query, qo_indptr, kv_pages, layer, block_tables, kv_lens,
        ...)`` with this batch's layout: ``query`` float ``[total_q, num_heads, head_dim]``,
        ``kv_pages`` of ``page_size``-token pages, at least ``max_pages`` of them. Same
        options, result and errors."""
        return _attention(query, self, None, kv_pages, layer, None, None, scale, causal,
                          window_left, soft_cap, alibi_slopes, out, return_lse, num_threads, 0,
                          PAGEDCY_SIMD_AVX512, 0, 1, quantize_query)


def _tune_bits(flags):
    if isinstance(flags, str):
        flags = (flags,)
    if isinstance(flags, (tuple, list, set, frozenset)):
        bits = 0
        for name in flags:
            if name not in _TUNE_FLAGS:
                raise ValueError(f"unknown tuning flag {name!r}; known: {sorted(_TUNE_FLAGS)}")
            bits |= _TUNE_FLAGS[name]
        return bits
    return as_int(flags, "flags")


def batch_paged_attention(query, qo_indptr, kv_pages, layer, block_tables, kv_lens, *,
                          scale=None, causal=True, window_left=-1, soft_cap=0.0,
                          alibi_slopes=None, out=None, return_lse=False, num_threads=None,
                          quantize_query=False):
    """Attention of a ragged batch of queries over paged K/V.

    query: float ``[total_q, num_heads, head_dim]`` (converted to float32);
    sequence ``b`` owns rows ``qo_indptr[b]:qo_indptr[b+1]``.
    qo_indptr: int ``[B+1]``, starts at 0, non-decreasing, ends at total_q.
    kv_pages: ``[max_pages, num_layers, 2, page_size, num_kv_heads, head_dim]``
    (any strides with contiguous rows: a C-order array, or a store's head-major
    ``pages()`` view) float32 / float16 / bfloat16 (uint16 = bf16 bits), or int8
    ``[..., num_kv_heads, head_dim + 4]``: each head row is head_dim int8 values
    then its float32 scale (bytes), standing for values * scale (a store with
    ``dtype="int8"`` writes them).
    layer: layer index. block_tables: int ``[B, max_pages_per_seq]`` page ids
    (only the first ``ceil(kv_len/page_size)`` of a row are read).
    kv_lens: int ``[B]``; each ``q_len <= kv_len``.

    Scores are ``q.k * scale`` (default ``1/sqrt(head_dim)``), then
    ``soft_cap*tanh(s/soft_cap)`` if ``soft_cap > 0``, then ALiBi
    ``slope[h]*(j - i_abs)``; query row i of a sequence sits at absolute
    position ``i_abs = kv_len - q_len + i``; ``causal`` keeps keys ``j <= i_abs``,
    ``window_left >= 0`` keeps ``j >= i_abs - window_left``. Query head h uses KV
    head ``h // (num_heads // num_kv_heads)``.

    quantize_query: with int8 kv_pages, score with integer dot products
    (AVX2 vpmaddwd on int16, AVX-VNNI / AVX512-VNNI vpdpbusd; the scalar path too):
    each scaled query vector q is rounded to int8 with its own scale
    ``s = max|q| / 127``, so a score moves by at most
    ``E = max|q| / 254 * sum_d |k[t][d]|`` (k dequantized) against the float
    path, the lse by at most ``E`` and an output element by at most
    ``(exp(2E) - 1) * max_t |v[t][d]|`` (E the largest over the visible keys).
    On the AVX2 kernels (vpmaddwd, AVX-VNNI vpdpwssd), with AVX512-VNNI and
    on the scalar path P.V runs on integers too: the softmax weights, times
    each V row's scale, are rounded to int16 per row and chunk of 64 tokens,
    which adds at most
    ``64 * 128 / 65534 * s_v < s_v / 8`` per output element (s_v the largest
    V row scale: max|v| / 1016 for quantizer-made rows).
    Used for decode-sized blocks when head_dim % 32 == 0 (prefill blocks of
    32+ query vectors per KV head score in float32); no effect on float pages.

    Returns ``out`` float32 ``[total_q, num_heads, head_dim]`` (written in place
    when ``out`` is given), or ``(out, lse)`` with ``lse`` float32
    ``[total_q, num_heads]`` (natural log; -inf for a row that sees no key)
    when ``return_lse``.

    Raises TypeError (dtypes), ValueError (shapes, ranges, non-contiguous
    kv_pages rows or out, q_len > kv_len, ...), IndexError (layer or a needed page id
    out of range), MemoryError.
    """
    return _attention(query, None, qo_indptr, kv_pages, layer, block_tables, kv_lens, scale, causal,
                      window_left, soft_cap, alibi_slopes, out, return_lse, num_threads, 0,
                      PAGEDCY_SIMD_AVX512, 0, 1, quantize_query)


def _plain_options(*, scale=None, causal=True, window_left=-1, soft_cap=0.0, alibi_slopes=None,
                   out=None, return_lse=False, num_threads=None, quantize_query=False):
    """Private: ``batch_paged_attention``'s options as plain Python and NumPy values (the
    kernel's own conversion), so a caller that must hold a lock through the kernel can run
    every ``__index__``, ``__float__``, ``__bool__`` or ``__array__`` of the user's before
    it takes it. TypeError/ValueError; range and shape checks stay with the kernel."""
    return dict(scale=None if scale is None else finite_float(scale, "scale"), causal=bool(causal),
                window_left=as_int(window_left, "window_left"),
                soft_cap=finite_float(soft_cap, "soft_cap", min_value=0.0),
                alibi_slopes=None if alibi_slopes is None else np.asarray(alibi_slopes),
                out=out, return_lse=bool(return_lse), num_threads=resolve_num_threads(num_threads),
                quantize_query=bool(quantize_query))


def _batch_paged_attention_tuned(query, qo_indptr, kv_pages, layer, block_tables, kv_lens, *,
                                 scale=None, causal=True, window_left=-1, soft_cap=0.0,
                                 alibi_slopes=None, out=None, return_lse=False, num_threads=None,
                                 kv_chunk=0, max_simd=2, flags=0, repeat=1, quantize_query=False):
    """Private: ``batch_paged_attention`` with the switches tests, bench and asv use.

    kv_chunk: tokens per KV split (0 automatic, < 0 never split). max_simd: cap
    on the instruction set (0 scalar, 1 AVX2, 2 AVX-512). flags: tuning bits, an
    int or names from ``_TUNE_FLAGS``. repeat: run the kernel that many times
    without the GIL (microbenchmarks without Python overhead).
    """
    return _attention(query, None, qo_indptr, kv_pages, layer, block_tables, kv_lens, scale, causal,
                      window_left, soft_cap, alibi_slopes, out, return_lse, num_threads,
                      as_int(kv_chunk, "kv_chunk"), as_int(max_simd, "max_simd"), _tune_bits(flags),
                      max(1, as_int(repeat, "repeat")), quantize_query)


cdef _attention(query, AttentionBatch batch, qo_indptr, kv_pages, layer, block_tables, kv_lens,
                scale, causal, window_left, soft_cap, alibi_slopes, out, return_lse, num_threads,
                int64_t kv_chunk, int64_t max_simd, int64_t flags, Py_ssize_t repeat, quantize_query):
    """batch_paged_attention's body (a cdef call: no keyword parsing twice): the layout
    from ``batch`` (checked already) or else checked here from qo_indptr, block_tables and
    kv_lens."""
    cdef pagedcy_attn_params P
    q = float_array(query, "query")
    if q.ndim != 3:
        raise ValueError(f"query must be 3-D [total_q, num_heads, head_dim], got shape {q.shape}")
    q = np.ascontiguousarray(q, dtype=np.float32)
    cdef int64_t total_q = q.shape[0]
    cdef int64_t H = q.shape[1]
    cdef int64_t D = q.shape[2]
    # --- kv pages
    if not isinstance(kv_pages, np.ndarray):
        raise TypeError(f"kv_pages must be a numpy array, got {type(kv_pages).__name__}")
    cdef cnp.ndarray kv = kv_pages
    if kv.ndim != 6:
        raise ValueError("kv_pages must be 6-D [max_pages, num_layers, 2, page_size, num_kv_heads, "
                         f"head_dim], got shape {kv_pages.shape}")
    cdef int dtype_code = _kv_dtype_code(kv)
    # Any strides whose rows (last axis) are contiguous: the store's pages()
    # is a head-major view of this shape (see _store.pyx).
    kv_strides = kv_pages.strides
    if kv_strides[5] != kv.itemsize or any(st < 0 or st % kv.itemsize for st in kv_strides):
        raise ValueError("kv_pages rows (last axis) must be contiguous and its strides non-negative "
                         f"multiples of the item size, got strides {kv_strides}")
    if (<Py_ssize_t>cnp.PyArray_DATA(kv)) % kv.itemsize:
        raise ValueError("kv_pages data is not aligned to its item size")
    cdef int64_t max_pages = kv.shape[0]
    cdef int64_t L = kv.shape[1]
    cdef int64_t T = kv.shape[3]
    cdef int64_t Hkv = kv.shape[4]
    if kv.shape[2] != 2:
        raise ValueError(f"kv_pages axis 2 must have length 2 (K, V), got {kv.shape[2]}")
    # an int8 head row carries its scale after the head_dim values
    cdef int64_t row = D + (PAGEDCY_I8_SCALE_BYTES if dtype_code == PAGEDCY_I8 else 0)
    if kv.shape[5] != row:
        raise ValueError(f"head_dim mismatch: query has {D}, so kv_pages' last axis must be {row}"
                         f"{' (int8 values + a float32 scale)' if row != D else ''}, got {kv.shape[5]}")
    if T < 1 or Hkv < 1 or D < 1:
        raise ValueError(f"kv_pages has an empty page_size/num_kv_heads/head_dim: {kv_pages.shape}")
    if H < 1 or H % Hkv != 0:
        raise ValueError(f"num_heads ({H}) must be a positive multiple of num_kv_heads ({Hkv})")
    if T > (1 << 30) or D > (1 << 20) or H > (1 << 20):
        raise ValueError("page_size / head_dim / num_heads too large")
    lay = check_index(layer, L, "layer")
    if batch is None:
        ind64, lens64, bt32 = _ragged_batch(qo_indptr, kv_lens, block_tables, total_q, T, max_pages)
    else:
        if batch._page_size != T or batch._max_pages > max_pages:
            raise ValueError(f"the batch was checked for pages of {batch._page_size} tokens and a pool "
                             f"of {batch._max_pages}; kv_pages has {T}-token pages and {max_pages}")
        if batch._total_q != total_q:
            raise ValueError(f"query has {total_q} rows, the batch's qo_indptr ends at {batch._total_q}")
        ind64, lens64, bt32 = batch._ind, batch._lens, batch._bt
    cdef int64_t B = lens64.shape[0]
    # --- options
    opt = _plain_options(scale=scale, causal=causal, window_left=window_left, soft_cap=soft_cap,
                         alibi_slopes=alibi_slopes, return_lse=return_lse, num_threads=num_threads,
                         quantize_query=quantize_query)
    fscale = 1.0 / math.sqrt(D) if opt["scale"] is None else opt["scale"]
    fcap = opt["soft_cap"]
    wl = opt["window_left"]
    if wl < -1:
        raise ValueError(f"window_left must be >= -1, got {wl}")
    if wl > (1 << 31) - 1:
        wl = -1        # wider than any sequence: same as no window
    alibi = opt["alibi_slopes"]
    if alibi is not None:
        if alibi.dtype.kind not in "fiu":
            raise TypeError(f"alibi_slopes must be a float array, got dtype {alibi.dtype}")
        if alibi.shape != (H,):
            raise ValueError(f"alibi_slopes must have shape ({H},), got {alibi.shape}")
        alibi = np.ascontiguousarray(alibi, dtype=np.float32)
    o = np.empty((total_q, H, D), dtype=np.float32) if out is None else check_out(out, (total_q, H, D), np.float32)
    lse = np.empty((total_q, H), dtype=np.float32) if opt["return_lse"] else None
    cdef int nthreads = opt["num_threads"]
    cdef int rc = 0
    cdef Py_ssize_t _r

    if total_q > 0:
        P.q = <const float *>cnp.PyArray_DATA(q)
        P.qo_indptr = <const int64_t *>cnp.PyArray_DATA(ind64)
        P.kv = <const char *>cnp.PyArray_DATA(kv)
        P.dtype = dtype_code
        P.page_stride = kv.strides[0]
        P.layer_offset = lay * kv.strides[1]
        P.v_offset = kv.strides[2]
        P.tok_stride = kv.strides[3]
        P.head_stride = kv.strides[4]
        P.block_tables = <const int32_t *>cnp.PyArray_DATA(bt32)
        P.bt_stride = bt32.shape[1]
        P.kv_lens = <const int64_t *>cnp.PyArray_DATA(lens64)
        P.B = <int32_t>B
        P.H = <int32_t>H
        P.Hkv = <int32_t>Hkv
        P.D = <int32_t>D
        P.T = <int32_t>T
        P.scale = fscale
        P.soft_cap = fcap
        P.causal = 1 if opt["causal"] else 0
        P.window_left = <int32_t>wl
        P.alibi = <const float *>cnp.PyArray_DATA(alibi) if alibi is not None else NULL
        P.out = <float *>cnp.PyArray_DATA(o)
        P.lse = <float *>cnp.PyArray_DATA(lse) if lse is not None else NULL
        P.use_simd = <int32_t>max(0, min(pagedcy_simd_level(), max_simd))
        P.flags = <int32_t>flags
        P.qk_i8 = 1 if opt["quantize_query"] else 0
        with nogil:
            for _r in range(repeat):
                rc = _run_kernel(&P, nthreads, kv_chunk)
                if rc != 0:
                    break
        if rc != 0:
            raise MemoryError("paged attention: could not allocate scratch memory")
    if lse is not None:
        return o, lse
    return o


cdef extern from *:
    """
    static int pagedcy_attn_vnni_paths(void) {
        int r = 0;
    #if PAGEDCY_ATTN_HAVE_AVX2 && defined(PAGEDCY_ATTN_HAVE_AVXVNNI)
        r |= pa_cpu_has_avxvnni() ? 1 : 0;
    #endif
    #if PAGEDCY_ATTN_HAVE_AVX512 && defined(PAGEDCY_ATTN_HAVE_AVX512VNNI)
        r |= pagedcy_cpu_has_avx512vnni() ? 2 : 0;
    #endif
        return r;
    }
    """
    int pagedcy_attn_vnni_paths() noexcept nogil


def _vnni_paths():
    """Private (tests, bench): the VNNI dot-product kernels the int8 ``quantize_query``
    path can use here: a set of "avx_vnni" and "avx512_vnni" (CPU and build)."""
    cdef int r = pagedcy_attn_vnni_paths()
    return {n for bit, n in ((1, "avx_vnni"), (2, "avx512_vnni")) if r & bit}


def simd_enabled():
    """True when SIMD kernels (AVX2/FMA/F16C or AVX-512) are in use: the CPU
    supports them and neither PAGEDCY_FORCE_SCALAR nor PAGEDCY_SIMD=scalar is set."""
    return bool(pagedcy_use_simd())


def simd_level():
    """Instruction set of the kernels: 0 scalar, 1 AVX2+FMA+F16C, 2 AVX-512
    (F/DQ/VL/BW; decode micro-kernels), the CPU's best capped by PAGEDCY_SIMD."""
    return int(pagedcy_simd_level())


def merge_states(v_a, s_a, v_b=None, s_b=None):
    """Merge partial attention states by log-sum-exp (FlashInfer's merge_state).

    ``merge_states(v_a, s_a, v_b, s_b)`` with ``v`` float32 ``[n, heads, head_dim]``
    and ``s`` float32 ``[n, heads]`` (natural-log lse of each partial), or
    ``merge_states([v1, v2, ...], [s1, s2, ...])``. Returns ``(v, s)`` with
    ``v = sum_i exp(s_i - s) v_i`` and ``s = log(sum_i exp(s_i))``; a partial
    with ``s = -inf`` is empty and contributes nothing (all empty: v 0, s -inf).
    Raises TypeError / ValueError on bad dtypes or mismatched shapes.
    """
    if isinstance(v_a, (list, tuple)):
        if v_b is not None or s_b is not None:
            raise TypeError("list form takes exactly two arguments: merge_states(vs, ss)")
        vs, ss = list(v_a), list(s_a) if isinstance(s_a, (list, tuple)) else None
        if ss is None:
            raise TypeError("list form needs a list of lse arrays as the second argument")
    else:
        if v_b is None or s_b is None:
            raise TypeError("merge_states needs v_a, s_a, v_b, s_b (or two lists)")
        vs, ss = [v_a, v_b], [s_a, s_b]
    if len(vs) != len(ss) or len(vs) == 0:
        raise ValueError("need the same, non-zero number of v and s arrays")
    vs = [np.asarray(v) for v in vs]
    ss = [np.asarray(s) for s in ss]
    # kinds and shapes first, so nothing malformed gets as far as the float32 cast
    for v, s in zip(vs, ss):
        if v.dtype.kind != "f" or s.dtype.kind != "f":
            raise TypeError("v and s must be floating-point arrays")
    shape = vs[0].shape
    if len(shape) != 3:
        raise ValueError(f"v must be 3-D [n, heads, head_dim], got shape {shape}")
    for v, s in zip(vs, ss):
        if v.shape != shape:
            raise ValueError(f"v shapes differ: {shape} vs {v.shape}")
        if s.shape != shape[:2]:
            raise ValueError(f"s must have shape {shape[:2]}, got {s.shape}")
    va = [np.ascontiguousarray(v, dtype=np.float32) for v in vs]
    sa = [np.ascontiguousarray(s, dtype=np.float32) for s in ss]
    cdef int k = len(va)
    cdef int64_t rows = shape[0] * shape[1]
    cdef int D = shape[2]
    vout = np.empty(shape, dtype=np.float32)
    sout = np.empty(shape[:2], dtype=np.float32)
    ptr_v = np.zeros(k, dtype=np.intp)
    ptr_s = np.zeros(k, dtype=np.intp)
    for i in range(k):
        ptr_v[i] = <Py_ssize_t>cnp.PyArray_DATA(va[i])
        ptr_s[i] = <Py_ssize_t>cnp.PyArray_DATA(sa[i])
    stack_v = np.empty(k, dtype=np.intp)
    stack_s = np.empty(k, dtype=np.float32)
    cdef const float **pv = <const float **>cnp.PyArray_DATA(stack_v)
    cdef float *psv = <float *>cnp.PyArray_DATA(stack_s)
    cdef Py_ssize_t *bv = <Py_ssize_t *>cnp.PyArray_DATA(ptr_v)
    cdef Py_ssize_t *bs = <Py_ssize_t *>cnp.PyArray_DATA(ptr_s)
    cdef float *vo = <float *>cnp.PyArray_DATA(vout)
    cdef float *so = <float *>cnp.PyArray_DATA(sout)
    cdef int64_t r
    cdef int j
    with nogil:
        for r in range(rows):
            for j in range(k):
                pv[j] = (<const float *>bv[j]) + r * D
                psv[j] = (<const float *>bs[j])[r]
            pagedcy_merge_one(k, pv, psv, D, vo + r * D, so + r)
    return vout, sout
