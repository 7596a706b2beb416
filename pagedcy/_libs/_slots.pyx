"""An engine step's slots: built from the batch's block tables, and checked before a model
writes through them.

A decode step of one sequence used ~25 NumPy calls to lay out its slots (``step_slots``)
and ~30 more to check them in the model's forward (~90 us in all on a tiny model, several
times that right after a large model's weights have streamed through the caches). Each
function here is one pass over the batch, with the checks' error types and messages.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t

cnp.import_array()


cdef int64_t _new_tokens(const int32_t[:, ::1] block_tables, const int64_t[::1] kv_lens,
                         const int64_t[::1] q_lens, int64_t page_size) except -1:
    """Checks ``1 <= q_lens[b] <= kv_lens[b] <= W * page_size`` (and the shapes); returns the
    sum of q_lens. ValueError otherwise."""
    cdef Py_ssize_t B = kv_lens.shape[0], W = block_tables.shape[1], b
    cdef int64_t n = 0, q, kv
    if q_lens.shape[0] != B or block_tables.shape[0] != B:
        raise ValueError("block_tables, kv_lens and q_lens must describe the same sequences")
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    for b in range(B):
        q, kv = q_lens[b], kv_lens[b]
        if q < 1 or q > kv or kv > W * page_size or kv >= (1 << 31):
            raise ValueError(f"sequence {b}: need 1 <= q_len ({q}) <= kv_len ({kv}) <= "
                             f"{W * page_size} (its block table's tokens)")
        n += q
    return n


def step_slot_arrays(const int32_t[:, ::1] block_tables not None, const int64_t[::1] kv_lens not None,
                     const int64_t[::1] q_lens not None, int64_t page_size):
    """``(positions, slot_pages, slot_offsets, qo_indptr)`` int32 of a batch whose sequence
    b adds its last ``q_lens[b]`` of ``kv_lens[b]`` tokens (block_tables ``[B, W]``): token
    i of sequence b sits at ``kv_lens[b] - q_lens[b] + (i - qo_indptr[b])``, in page
    ``block_tables[b, pos // page_size]`` at ``pos % page_size``. ValueError unless
    ``1 <= q_lens[b] <= kv_lens[b] <= W * page_size`` (checked before anything is read)."""
    cdef Py_ssize_t B = kv_lens.shape[0], b, i
    cdef int64_t n = _new_tokens(block_tables, kv_lens, q_lens, page_size), p, q, kv
    if n >= (1 << 31):
        raise ValueError("a step of 2**31 tokens or more")
    pos = np.empty(n, np.int32)
    pages = np.empty(n, np.int32)
    offs = np.empty(n, np.int32)
    indptr = np.empty(B + 1, np.int32)
    cdef int32_t[::1] P = pos, G = pages, O = offs, I = indptr
    n = 0
    I[0] = 0
    for b in range(B):
        q, kv = q_lens[b], kv_lens[b]
        for i in range(q):
            p = kv - q + i
            P[n] = <int32_t>p
            G[n] = block_tables[b, p // page_size]
            O[n] = <int32_t>(p % page_size)
            n += 1
        I[b + 1] = <int32_t>n
    return pos, pages, offs, indptr


def check_step_layout(const int32_t[::1] ids not None, const int32_t[::1] positions not None,
                      const int32_t[::1] qo_indptr not None, const int32_t[::1] kv_lens not None,
                      int64_t vocab_size, int64_t max_position):
    """A step's token ids, positions and ragged layout (int32, shapes ``[n]``, ``[n]``,
    ``[B+1]``, ``[B]``, checked by the caller): every id in ``[0, vocab_size)``; qo_indptr
    from 0 to n, every sequence >= 1 row; kv_lens >= each sequence's rows and below
    ``max_position``; positions ``kv_len - q_len .. kv_len - 1`` of each sequence (where
    the attention kernel puts its rows). ValueError naming the first that fails."""
    cdef Py_ssize_t n = ids.shape[0], B = kv_lens.shape[0], b, i
    cdef int64_t q, start
    if positions.shape[0] != n or qo_indptr.shape[0] != B + 1:
        raise ValueError(f"positions must have {n} entries and qo_indptr {B + 1}")
    for i in range(n):
        if ids[i] < 0 or ids[i] >= vocab_size:
            raise ValueError(f"token ids must be in [0, {vocab_size})")
    if qo_indptr[0] != 0 or qo_indptr[B] != n:
        raise ValueError(f"qo_indptr must start at 0, end at {n} and give every sequence >= 1 row")
    for b in range(B):
        if qo_indptr[b + 1] - qo_indptr[b] < 1:
            raise ValueError(f"qo_indptr must start at 0, end at {n} and give every sequence >= 1 row")
    for b in range(B):
        if qo_indptr[b + 1] - qo_indptr[b] > kv_lens[b] or kv_lens[b] >= max_position:
            raise ValueError(f"kv_lens must be >= each sequence's new tokens and < {max_position}")
    for b in range(B):
        q = qo_indptr[b + 1] - qo_indptr[b]
        start = <int64_t>kv_lens[b] - q
        for i in range(qo_indptr[b], qo_indptr[b + 1]):
            if positions[i] != start + (i - qo_indptr[b]):
                raise ValueError("positions must be kv_len - q_len .. kv_len - 1 for each sequence")


def check_step_pages(const int32_t[::1] slot_pages not None, const int32_t[::1] slot_offsets not None,
                     const int32_t[::1] kv_lens not None, const int32_t[:, ::1] block_tables not None,
                     const int32_t[::1] positions not None, const int32_t[::1] qo_indptr not None,
                     int64_t max_pages, int64_t page_size):
    """Every slot and every block-table entry the kernels will touch is a page of a pool of
    ``max_pages`` pages of ``page_size`` tokens, and each token's slot is where its
    sequence's block table puts its position (else its K/V would land in another
    sequence's page). The layout passed :func:`check_step_layout`. IndexError for a page
    or offset out of range, ValueError for a short or inconsistent block table."""
    cdef Py_ssize_t n = slot_pages.shape[0], B = kv_lens.shape[0], W = block_tables.shape[1], b, i
    cdef int64_t need, p
    if slot_offsets.shape[0] != n or positions.shape[0] != n or qo_indptr.shape[0] != B + 1 \
            or block_tables.shape[0] != B or qo_indptr[0] != 0 or qo_indptr[B] != n:
        raise ValueError("slots, positions, qo_indptr, kv_lens and block_tables disagree in shape")
    for b in range(B):
        if qo_indptr[b + 1] < qo_indptr[b]:
            raise ValueError("qo_indptr must not decrease")
    for i in range(n):
        if slot_pages[i] < 0 or slot_pages[i] >= max_pages or slot_offsets[i] < 0 \
                or slot_offsets[i] >= page_size:
            raise IndexError(f"slot pages must be in [0, {max_pages}) and offsets in [0, {page_size})")
    need = 0
    for b in range(B):
        need = max(need, (kv_lens[b] + page_size - 1) // page_size)
    if need > W:
        raise ValueError(f"block_tables has {W} columns, {need} are needed")
    for b in range(B):
        for i in range((kv_lens[b] + page_size - 1) // page_size):
            if block_tables[b, i] < 0 or block_tables[b, i] >= max_pages:
                raise IndexError(f"block_tables hold page ids outside [0, {max_pages})")
    for b in range(B):
        for i in range(qo_indptr[b], qo_indptr[b + 1]):
            p = positions[i]
            if p < 0 or p // page_size >= W:
                raise ValueError(f"position {p} is outside the block table's {W * page_size} tokens")
            if block_tables[b, p // page_size] != slot_pages[i] or p % page_size != slot_offsets[i]:
                raise ValueError("slot_pages/slot_offsets must be each token's page and offset in "
                                 "its sequence's block table (block_tables[b, pos // page_size], "
                                 "pos % page_size)")


def touched_blocks(const int32_t[:, ::1] block_tables not None, const int64_t[::1] kv_lens not None,
                   const int64_t[::1] q_lens not None, int64_t page_size):
    """The blocks a step writes: ``(seq, blk, pages)``, intp / intp / int32, one entry for
    each block ``blk`` of sequence ``seq`` that holds one of its last ``q_lens[seq]`` of
    ``kv_lens[seq]`` tokens, in batch and block order, and the page ``block_tables[seq,
    blk]`` it is now (what copy-on-write looks at before the step's slots are laid out).
    ValueError unless ``1 <= q_lens[b] <= kv_lens[b] <= W * page_size``."""
    cdef Py_ssize_t B = kv_lens.shape[0], b, k, n = 0
    cdef int64_t q, kv
    _new_tokens(block_tables, kv_lens, q_lens, page_size)
    for b in range(B):
        q, kv = q_lens[b], kv_lens[b]
        n += (kv - 1) // page_size - (kv - q) // page_size + 1
    seq = np.empty(n, np.intp)
    blk = np.empty(n, np.intp)
    pages = np.empty(n, np.int32)
    cdef Py_ssize_t[::1] S = seq, K = blk
    cdef int32_t[::1] P = pages
    n = 0
    for b in range(B):
        q, kv = q_lens[b], kv_lens[b]
        for k in range((kv - q) // page_size, (kv - 1) // page_size + 1):
            S[n], K[n], P[n] = b, k, block_tables[b, k]
            n += 1
    return seq, blk, pages


def first_bad_q_len(q_lens, const int64_t[::1] kv_lens not None):
    """The first ``b`` without ``1 <= q_lens[b] <= kv_lens[b]``, or -1 when there is none,
    for ``q_lens`` an int64 C-contiguous ``[B]`` array (``B = len(kv_lens)``); -2 for any
    other ``q_lens``, which the caller then checks and converts itself. One pass in C: a
    decode step checks its q_lens twice, right after the LM head, when NumPy's calls run
    cold (~40 us for the five of the general check)."""
    if type(q_lens) is not np.ndarray:
        return -2
    cdef cnp.ndarray a = <cnp.ndarray>q_lens
    if (cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or not cnp.PyArray_ISNOTSWAPPED(a) or a.ndim != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(a) or a.shape[0] != kv_lens.shape[0]):
        return -2
    cdef const int64_t *q = <const int64_t *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t b
    for b in range(kv_lens.shape[0]):
        if q[b] < 1 or q[b] > kv_lens[b]:
            return b
    return -1
