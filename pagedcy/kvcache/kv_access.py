"""Reads and writes of sequences' K/V through their block tables: copy-on-write before
writes, single rows, ranges, one row per sequence, engine-step slots and attention.

:class:`KVAccess` is the data path of :class:`~pagedcy.kvcache.manager.PagedKVCacheManager`
(whose methods of the same names document the arguments and errors); it owns no state of
its own and works on the manager's store, handles, allocator and prefix cache under the
manager's lock.
"""
import operator

import numpy as np

from pagedcy import _validate
from pagedcy._libs._manager_ops import build_block_table, write_token_rows
from pagedcy._libs._slots import touched_blocks
from pagedcy.kvcache.handle import PagedKVCacheHandle
from pagedcy.kvcache.step import check_q_lens, step_slots

__all__ = ["KVAccess", "attention_kernel"]

_num_tokens = operator.attrgetter("_num_tokens")


def attention_kernel():
    """``pagedcy._libs._attention.batch_paged_attention``."""
    # Imported lazily so the manager (allocation, swap, prefix cache) works in a build
    # that is still missing the attention extension.
    from pagedcy._libs._attention import batch_paged_attention
    return batch_paged_attention


class KVAccess:
    """K/V reads, writes and attention for the handles of one manager.

    KVAccess(parts): parts is the manager's :class:`~pagedcy.kvcache.parts.ManagerParts`.
    """

    def __init__(self, parts):
        self._p = parts
        self.config = parts.config
        self.page_size = parts.config.page_size

    def _written(self, h, layers, start, end):
        """Positions ``start .. end-1`` of ``layers`` of ``h`` hold K/V now: register the
        prompt pages that became complete."""
        pr = h._progress
        if pr is not None and pr.advance(layers, start, end) \
                and self._p.prefix.register(h._blocks, pr):
            h._progress = None

    # -- K/V data ---------------------------------------------------------------------
    def _own(self, hs, seq, blk, pages):
        """Copy-on-write before writing block ``blk[i]`` (page ``pages[i]``) of
        ``hs[seq[i]]`` (``seq`` None: every entry is ``hs[0]``'s): see
        :meth:`BlockAllocator.make_private`. Returns ``(indices, new_pages)`` of the
        entries that were copied."""
        idx, new = self._p.allocator.make_private(pages)
        if new:
            changed = {}
            for i, q in zip(idx.tolist(), new):
                s = 0 if seq is None else int(seq[i])
                if s not in changed:
                    changed[s] = list(hs[s]._blocks)
                changed[s][blk[i]] = q
            for s, blocks in changed.items():
                hs[s]._set_blocks(blocks)
        return idx, new

    def _writable(self, h, layer, start, n):
        """Check a write of positions ``start .. start+n-1`` and make their pages private."""
        layer = _validate.check_index(layer, self.config.num_layers, "layer")
        cap = len(h._blocks) * self.page_size
        if start + n > cap:
            raise ValueError(f"positions {start}..{start + n - 1} are past the {cap} tokens of "
                             f"the blocks of {h.request_id!r}")
        if n:
            first, last = start // self.page_size, (start + n - 1) // self.page_size
            self._own([h], None, range(first, last + 1), h.block_table()[first:last + 1])
        return layer

    def write_kv(self, handle, layer, position, key, value):
        """:meth:`PagedKVCacheManager.write_kv`."""
        cfg = self.config
        k = _validate.as_f32_rows(key, "key", cfg.num_kv_heads, cfg.head_dim, 1)
        v = _validate.as_f32_rows(value, "value", cfg.num_kv_heads, cfg.head_dim, 1)
        with self._p.lock:
            h = self._p.handles.resident(handle)
            pos = _validate.as_int(position, "position")
            cap = len(h._blocks) * self.page_size
            if pos < 0 or pos >= cap:
                raise IndexError(f"position {pos} out of range [0, {cap}) of {h.request_id!r}")
            layer = self._writable(h, layer, pos, 1)
            self._p.store.write(h.block_table(), layer, pos, k, v)
            self._written(h, (layer,), pos, pos + 1)

    def write_kv_tokens(self, handle, layer, start, keys, values):
        """:meth:`PagedKVCacheManager.write_kv_tokens`."""
        cfg = self.config
        k = _validate.as_f32_rows(keys, "keys", cfg.num_kv_heads, cfg.head_dim)
        v = _validate.as_f32_rows(values, "values", cfg.num_kv_heads, cfg.head_dim, k.shape[0])
        n = k.shape[0]
        start = _validate.check_count(start, "start")
        # The copy runs under the manager lock (the store drops the GIL for it, so other
        # threads still run): a concurrent deallocate/fork of this handle can then never
        # hand its pages to someone else mid-copy.
        with self._p.lock:
            h = self._p.handles.resident(handle)
            layer = self._writable(h, layer, start, n)
            if n:
                self._p.store.write(h.block_table(), layer, start, k, v)
                self._written(h, (layer,), start, start + n)

    def write_kv_batch(self, handles, layer, positions, keys, values):
        """:meth:`PagedKVCacheManager.write_kv_batch`."""
        cfg = self.config
        hs = list(handles)
        B = len(hs)
        k = _validate.as_f32_rows(keys, "keys", cfg.num_kv_heads, cfg.head_dim, B)
        v = _validate.as_f32_rows(values, "values", cfg.num_kv_heads, cfg.head_dim, B)
        pos = np.asarray(positions)
        if pos.shape != (B,) or (B and pos.dtype.kind not in "iu"):
            raise ValueError(f"positions must be {B} integers")
        layer = _validate.check_index(layer, cfg.num_layers, "layer")
        ps = self.page_size
        with self._p.lock:
            hs = [self._p.handles.resident(h) for h in hs]
            if len(set(hs)) != B:
                raise ValueError("a handle appears twice in one batched write")
            pl = pos.tolist()
            for h, p in zip(hs, pl):
                if p < 0 or p >= len(h._blocks) * ps:
                    raise IndexError(f"position {p} out of range [0, {len(h._blocks) * ps}) "
                                     f"of {h.request_id!r}")
            blk = (pos // ps).astype(np.intp)
            pages = np.fromiter((h._blocks[b] for h, b in zip(hs, blk.tolist())), np.int32, B)
            idx, new = self._own(hs, np.arange(B), blk, pages)
            pages[idx] = new
            write_token_rows(self._p.store, pages, (pos % ps).astype(np.int32), layer, k, v)
            for h, p in zip(hs, pl):
                if h._progress is not None:
                    self._written(h, (layer,), p, p + 1)

    def load_pages(self, handle, first_block, payloads):
        """:meth:`PagedKVCacheManager.load_pages`."""
        first = _validate.check_count(first_block, "first_block")
        nbytes = self.config.bytes_per_page()
        data = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
        for d in data:
            if d.shape[0] != nbytes:
                raise ValueError(f"a page has {nbytes} bytes, got {d.shape[0]}")
        with self._p.lock:
            h = self._p.handles.resident(handle)
            pages = h._blocks[first:first + len(data)]
            if len(pages) != len(data):
                raise ValueError(f"blocks {first}..{first + len(data) - 1} are past the "
                                 f"{len(h._blocks)} blocks of {h.request_id!r}")
            pool = self._p.store.pool
            for p in pages:
                if pool.ref_count(p) != 1 or p in self._p.prefix:
                    raise ValueError(f"page {p} is shared or cached: only a sequence's own "
                                     f"fresh pages can be loaded")
            for p, d in zip(pages, data):
                pool.page_data_mut(p).view(np.uint8)[:] = d
            if data:
                ps = self.page_size
                self._written(h, range(self.config.num_layers), first * ps,
                              (first + len(data)) * ps)

    def read_kv(self, handle, layer, start, n, *, float32=True):
        """:meth:`PagedKVCacheManager.read_kv`."""
        cfg = self.config
        start = _validate.check_count(start, "start")
        n = _validate.check_count(n, "n")
        with self._p.lock:
            h = self._p.handles.resident(handle)
            layer = _validate.check_index(layer, cfg.num_layers, "layer")
            cap = len(h._blocks) * self.page_size
            if start + n > cap:
                raise ValueError(f"positions {start}..{start + n - 1} are past the {cap} "
                                 f"tokens of the blocks of {h.request_id!r}")
            table = h.block_table()
            k = self._p.store.read(table, layer, 0, start, n, float32=float32)
            v = self._p.store.read(table, layer, 1, start, n, float32=float32)
        # stored int8 rows end with each head's scale: the row width says the head's
        shape = (n, cfg.num_kv_heads, k.shape[1] // cfg.num_kv_heads)
        return k.reshape(shape), v.reshape(shape)

    # -- engine step ----------------------------------------------------------------------
    def _step(self, handles, q_lens):
        hs = self._p.handles.resident_batch(handles, "step")
        kv = np.array(list(map(_num_tokens, hs)), dtype=np.int64)
        return hs, check_q_lens(q_lens, hs, kv), kv

    def prepare_step(self, handles, q_lens):
        """:meth:`PagedKVCacheManager.prepare_step`."""
        ps = self.page_size
        with self._p.lock:
            hs, ql, kv = self._step(handles, q_lens)
            tables = self._tables(hs)
            seq, blk, pages = touched_blocks(tables, kv, ql, ps)
            idx, new = self._own(hs, seq, blk, pages)
            if new:           # (no copy: skip three cold NumPy calls on empty indices)
                tables[seq[idx], blk[idx]] = new
            return step_slots(tables, kv, ql, ps)

    def commit_step(self, handles, q_lens):
        """:meth:`PagedKVCacheManager.commit_step`."""
        layers = range(self.config.num_layers)
        with self._p.lock:
            hs, ql, kv = self._step(handles, q_lens)
            for h, q, n in zip(hs, ql.tolist(), kv.tolist()):
                if h._progress is not None:
                    self._written(h, layers, n - q, n)

    # -- attention ----------------------------------------------------------------------
    @staticmethod
    def _tables(hs):
        """Zero-padded int32 ``[B, max blocks]`` block tables of handles ``hs``."""
        tabs = list(map(PagedKVCacheHandle.block_table, hs))
        return build_block_table(tabs, max(map(len, tabs), default=0) or 1)

    def batch_tables(self, handles):
        """:meth:`PagedKVCacheManager.batch_tables`."""
        with self._p.lock:
            hs = [self._p.handles.resident(h) for h in handles]
            return self._tables(hs), np.array(list(map(_num_tokens, hs)), dtype=np.int32)

    def attention(self, layer, query, handles, q_lens=None, **kernel_options):
        """:meth:`PagedKVCacheManager.attention`."""
        hs = list(handles)
        B = len(hs)
        q = np.asarray(query)
        if q.ndim != 3:
            raise ValueError(f"query must be [total_q, num_heads, head_dim], got {q.shape}")
        if q_lens is None:
            ql = np.ones(B, dtype=np.int64)
        else:
            # validated as given: a cast first would floor floats, drop imaginary parts
            # and wrap integers too large for int64
            ql = _validate.int_array(q_lens, "q_lens").reshape(-1)
            if ql.shape[0] != B:
                raise ValueError(f"q_lens has {ql.shape[0]} entries for {B} handles")
            if B and (ql.min() < 0 or ql.max() > q.shape[0]):
                raise ValueError(f"q_lens must be in [0, {q.shape[0]}] (the query's rows)")
            ql = ql.astype(np.int64)
        indptr = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(ql, out=indptr[1:])
        if indptr[-1] != q.shape[0]:
            raise ValueError(f"query has {q.shape[0]} rows, q_lens add up to {int(indptr[-1])}")
        tables, lens = self.batch_tables(hs)
        bad = np.nonzero(ql > lens)[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"q_len {int(ql[i])} of {hs[i].request_id!r} exceeds its "
                             f"{int(lens[i])} tokens")
        layer = _validate.check_index(layer, self.config.num_layers, "layer")
        return attention_kernel()(q, indptr, self._p.store.pages(), layer, tables, lens,
                                  **kernel_options)
