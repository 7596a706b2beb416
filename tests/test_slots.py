"""pagedcy._libs._slots against the NumPy code it replaced (kept here as the reference):
the same arrays for random batches, and the same exception type and message for every
kind of bad step layout, one fault at a time and in random combinations."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcy._libs._slots import (check_step_layout, check_step_pages, step_slot_arrays,
                                  touched_blocks)

MAX_POSITION = 1 << 24


# -- the NumPy references (pagedcy's code before _slots) ------------------------------------
def ref_slots(tables, kv, ql, ps):
    B = kv.shape[0]
    indptr = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(ql, out=indptr[1:])
    n = int(indptr[-1])
    seq = np.repeat(np.arange(B, dtype=np.intp), ql)
    positions = np.arange(n, dtype=np.int64) + np.repeat(kv - ql - indptr[:-1], ql)
    return (positions.astype(np.int32), tables[seq, positions // ps].astype(np.int32),
            (positions % ps).astype(np.int32), indptr.astype(np.int32))


def ref_touched(tables, kv, ql, ps):
    first = (kv - ql) // ps
    nblk = (kv - 1) // ps - first + 1
    seq = np.repeat(np.arange(kv.shape[0]), nblk)
    blk = np.arange(seq.shape[0]) - np.repeat(np.cumsum(nblk) - nblk - first, nblk)
    return seq, blk, tables[seq, blk]


def ref_layout(ids, pos, indptr, lens, vocab):
    n = ids.shape[0]
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"token ids must be in [0, {vocab})")
    if indptr[0] != 0 or indptr[-1] != n or np.any(np.diff(indptr) < 1):
        raise ValueError(f"qo_indptr must start at 0, end at {n} and give every sequence >= 1 row")
    q_lens = np.diff(indptr)
    if np.any(q_lens > lens) or lens.max() >= MAX_POSITION:
        raise ValueError(f"kv_lens must be >= each sequence's new tokens and < {MAX_POSITION}")
    if np.any(pos != np.repeat(lens - indptr[1:], q_lens) + np.arange(n, dtype=np.int32)):
        raise ValueError("positions must be kv_len - q_len .. kv_len - 1 for each sequence")


def ref_pages(maxp, ps, pages, offs, lens, tables, pos, indptr):
    if pages.min() < 0 or pages.max() >= maxp or offs.min() < 0 or offs.max() >= ps:
        raise IndexError(f"slot pages must be in [0, {maxp}) and offsets in [0, {ps})")
    need = (lens + ps - 1) // ps
    if need.max() > tables.shape[1]:
        raise ValueError(f"block_tables has {tables.shape[1]} columns, {need.max()} are needed")
    used = tables[np.arange(tables.shape[1]) < need[:, None]]
    if used.min() < 0 or used.max() >= maxp:
        raise IndexError(f"block_tables hold page ids outside [0, {maxp})")
    seq = np.repeat(np.arange(lens.shape[0]), np.diff(indptr))
    if np.any(tables[seq, pos // ps] != pages) or np.any(pos % ps != offs):
        raise ValueError("slot_pages/slot_offsets must be each token's page and offset in "
                         "its sequence's block table (block_tables[b, pos // page_size], "
                         "pos % page_size)")


def outcome(fn, *args):
    try:
        fn(*args)
    except (ValueError, IndexError) as e:
        return type(e), str(e)
    return None


@st.composite
def batches(draw):
    """A consistent step: page size, pool size, block tables (distinct pages in random
    order, zero padded), kv_lens and q_lens."""
    ps = draw(st.sampled_from([1, 2, 4, 16]))
    B = draw(st.integers(1, 6))
    kv = np.array([draw(st.integers(1, 40)) for _ in range(B)], np.int64)
    ql = np.array([draw(st.integers(1, int(k))) for k in kv], np.int64)
    need = (kv + ps - 1) // ps
    W = int(need.max()) + draw(st.integers(0, 2))
    maxp = int(need.sum()) + draw(st.integers(0, 5))
    perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(maxp).astype(np.int32)
    tables = np.zeros((B, W), np.int32)
    at = 0
    for b in range(B):
        tables[b, :need[b]] = perm[at:at + need[b]]
        at += need[b]
    return ps, maxp, tables, kv, ql


@settings(max_examples=200, deadline=None)
@given(batches())
def test_slot_arrays_and_touched_blocks_equal_numpy(batch):
    ps, maxp, tables, kv, ql = batch
    for got, want in zip(step_slot_arrays(tables, kv, ql, ps), ref_slots(tables, kv, ql, ps)):
        assert got.dtype == np.int32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    for got, want in zip(touched_blocks(tables, kv, ql, ps), ref_touched(tables, kv, ql, ps)):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=300, deadline=None)
@given(batches(), st.lists(st.tuples(st.sampled_from(
    ["id", "indptr0", "indptr_end", "indptr_empty", "qlen", "maxpos", "pos", "page", "offset",
     "table", "narrow", "slot"]), st.integers(0, 1 << 20)), max_size=3))
def test_checks_raise_what_numpy_raised(batch, faults):
    """Valid steps pass; each mutation (alone or several) gets the reference's error."""
    ps, maxp, tables, kv, ql = batch
    pos, pages, offs, indptr = (a.copy() for a in ref_slots(tables, kv, ql, ps))
    lens = kv.astype(np.int32)
    vocab = 50
    ids = (np.arange(pos.shape[0]) % vocab).astype(np.int32)
    n, B = ids.shape[0], lens.shape[0]
    for kind, r in faults:
        i, b = r % n, r % B
        if kind == "id":
            ids[i] = vocab + r % 3 if r % 2 else -1 - r % 3
        elif kind == "indptr0" and B > 1:
            indptr[0] = 1
        elif kind == "indptr_end":
            indptr[-1] = n + 1
        elif kind == "indptr_empty" and B > 1:
            indptr[b + 1] = indptr[b]
        elif kind == "qlen":
            lens[b] = max(0, int(indptr[b + 1] - indptr[b]) - 1)
        elif kind == "maxpos":
            lens[b] = MAX_POSITION + r % 2
        elif kind == "pos":
            pos[i] += 1 + r % 2
        elif kind == "page":
            pages[i] = maxp + r % 2 if r % 2 else -1
        elif kind == "offset":
            offs[i] = ps
        elif kind == "table" and tables.shape[1]:     # (a narrowed table may have no column)
            tables[b, 0] = maxp if r % 2 else -1
        elif kind == "narrow":
            tables = np.ascontiguousarray(tables[:, :max(0, tables.shape[1] - 1 - r % 2)])
        elif kind == "slot":
            pages[i] = (pages[i] + 1) % maxp
    want = outcome(ref_layout, ids, pos, indptr, lens, vocab)
    assert outcome(check_step_layout, ids, pos, indptr, lens, vocab, MAX_POSITION) == want
    if want is None:   # the model checks the pages only of a layout that passed
        want = outcome(ref_pages, maxp, ps, pages, offs, lens, tables, pos, indptr)
        assert outcome(check_step_pages, pages, offs, lens, tables, pos, indptr, maxp, ps) == want
    if not faults:
        assert want is None


def test_guards_against_inconsistent_arguments():
    """Called directly, with shapes no step has: ValueError, never a read out of bounds."""
    t = np.zeros((2, 1), np.int32)
    one, two = np.ones(1, np.int64), np.ones(2, np.int64)
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    with pytest.raises(ValueError, match="same sequences"):
        step_slot_arrays(t, two, one, 4)
    with pytest.raises(ValueError, match="q_len"):
        step_slot_arrays(t, two * 9, two, 4)           # 9 tokens in a 4-token table
    with pytest.raises(ValueError, match="page_size"):
        touched_blocks(t, two, two, 0)
    with pytest.raises(ValueError, match="q_len"):
        touched_blocks(t, two, two * 2, 4)             # q_len > kv_len
    with pytest.raises(ValueError, match="positions must have"):
        check_step_layout(i32(1, 2), i32(0), i32(0, 2), i32(2), 10, MAX_POSITION)
    with pytest.raises(ValueError, match="disagree"):
        check_step_pages(i32(0), i32(0), i32(1), t, i32(0), i32(0, 1), 4, 4)
    with pytest.raises(ValueError, match="outside the block table"):
        check_step_pages(i32(0), i32(0), i32(1), t[:1], i32(-5), i32(0, 1), 4, 4)
    with pytest.raises(ValueError, match="not decrease"):
        check_step_pages(i32(0, 0), i32(0, 0), i32(1, 1), t, i32(0, 0), i32(0, 3, 2), 4, 4)


@settings(max_examples=200, deadline=None)
@given(kv=st.lists(st.integers(1, 50), min_size=0, max_size=6), data=st.data())
def test_first_bad_q_len(kv, data):
    """The compiled range check of an engine step's q_lens against the NumPy reference; any
    array but int64 C-contiguous [B] is left to the general check (-2)."""
    from pagedcy._libs._slots import first_bad_q_len
    from pagedcy.kvcache.step import check_q_lens
    kv_lens = np.array(kv, dtype=np.int64)
    q = np.array([data.draw(st.integers(-1, k + 1)) for k in kv], dtype=np.int64)
    bad = np.nonzero((q < 1) | (q > kv_lens))[0]
    assert first_bad_q_len(q, kv_lens) == (int(bad[0]) if bad.size else -1)
    for other in (q.astype(np.int32), q.tolist(), q.astype(np.float64), q.reshape(1, -1),
                  np.concatenate([q, q])[::2] if q.size > 1 else q[:0].astype(np.int32)):
        assert first_bad_q_len(other, kv_lens) == -2
    if q.size:
        assert first_bad_q_len(q[:-1], kv_lens) == -2          # the wrong length

    class H:
        request_id = "r"
    handles = [H()] * len(kv)
    if bad.size:
        # the general check's message, whichever path found the fault
        with pytest.raises(ValueError, match=r"q_len -?\d+ of 'r' must be in \[1, \d+\]"):
            check_q_lens(q, handles, kv_lens)
    else:
        assert check_q_lens(q, handles, kv_lens) is q          # the engine's array, as it is
        got = check_q_lens(q.astype(np.int32), handles, kv_lens)
        assert got.dtype == np.int64 and np.array_equal(got, q)
