"""One engine step's token slots: where each new token's K/V goes and what attention reads.

An engine step runs the model once over a flat, variable-length batch: B sequences, each
contributing ``q_len`` new tokens (a prefill chunk or one decode row). :class:`StepSlots`
carries everything that call needs from the cache manager as int32 arrays, computed in one
compiled pass over the batch (``pagedcy._libs._slots``: no per-token Python).
"""
from dataclasses import dataclass

import numpy as np

from pagedcy import _validate
from pagedcy._libs._slots import first_bad_q_len, step_slot_arrays

__all__ = ["StepSlots", "step_slots", "check_q_lens"]


@dataclass(frozen=True)
class StepSlots:
    """Slots of one step's new tokens; every array is int32 and C-contiguous.

    positions: ``[N]`` absolute position of each new token (N = sum of q_lens; sequences
    in batch order, sequence b's tokens are ``kv_lens[b]-q_len .. kv_lens[b]-1``).
    slot_pages, slot_offsets: ``[N]`` page id and in-page offset where token i's K/V go
    (what ``pagedcy._libs._manager_ops.write_token_rows`` takes).
    qo_indptr: ``[B+1]``; sequence b owns rows ``qo_indptr[b]:qo_indptr[b+1]``.
    block_tables: ``[B, W]`` zero-padded page ids; kv_lens: ``[B]`` tokens each sequence
    attends over (its ``num_tokens()``), as ``batch_paged_attention`` takes them.
    """

    positions: np.ndarray
    slot_pages: np.ndarray
    slot_offsets: np.ndarray
    qo_indptr: np.ndarray
    block_tables: np.ndarray
    kv_lens: np.ndarray

    @property
    def num_tokens(self):
        """N, the number of new tokens in the step."""
        return int(self.positions.shape[0])

    @property
    def batch_size(self):
        """B, the number of sequences in the step."""
        return int(self.kv_lens.shape[0])


def check_q_lens(q_lens, handles, kv_lens):
    """``q_lens`` as int64 ``[B]`` with ``1 <= q_lens[i] <= kv_lens[i]`` (int64 ``[B]``,
    the tokens of ``handles[i]``): TypeError for non-integers, ValueError otherwise. An
    int64 C-contiguous ``q_lens`` in range (the engine's) is returned as it is."""
    if first_bad_q_len(q_lens, kv_lens) == -1:
        return q_lens
    ql = np.asarray(q_lens)
    if ql.size == 0 and ql.dtype.kind == "f":     # [] arrives as float64
        ql = ql.astype(np.int64)
    ql = _validate.int_array(ql, "q_lens")
    B = kv_lens.shape[0]
    if ql.shape != (B,):
        raise ValueError(f"q_lens must have shape ({B},), got {ql.shape}")
    bad = np.nonzero((ql < 1) | (ql > kv_lens))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"q_len {int(ql[i])} of {handles[i].request_id!r} must be in "
                         f"[1, {int(kv_lens[i])}] (its num_tokens())")
    return ql.astype(np.int64)


def step_slots(block_tables, kv_lens, q_lens, page_size):
    """:class:`StepSlots` of a batch whose sequence b adds its last ``q_lens[b]`` of
    ``kv_lens[b]`` tokens. block_tables: int32 ``[B, W]``; kv_lens, q_lens: int64 ``[B]``
    with ``1 <= q_lens <= kv_lens`` and ``kv_lens <= W * page_size`` (checked by the caller).
    """
    block_tables = np.ascontiguousarray(block_tables, dtype=np.int32)
    positions, pages, offsets, indptr = step_slot_arrays(
        block_tables, np.ascontiguousarray(kv_lens, dtype=np.int64),
        np.ascontiguousarray(q_lens, dtype=np.int64), page_size)
    return StepSlots(
        positions=positions,
        slot_pages=pages,
        slot_offsets=offsets,
        qo_indptr=indptr,
        block_tables=block_tables,
        kv_lens=kv_lens.astype(np.int32),
    )
