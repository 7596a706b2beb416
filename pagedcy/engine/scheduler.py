"""Continuous batching: which sequences run in the next step, and how many tokens each.

One step is one flat batch under a token budget (``max_num_batched_tokens``) and a
sequence cap (``max_num_seqs``), vLLM v1 style: the running sequences first (each
decode costs one token; a prompt still being prefilled takes what budget is left, so a
long prompt is split across steps), then swapped-out sequences coming back, then new
ones from the waiting queue. In the batch, decode rows come first, then prefill chunks.

When the page pool cannot hold the next step, the lowest-priority running sequence
(the last admitted) is preempted: by recompute (its pages are freed and it goes back
to the front of the waiting queue with its prompt plus generated tokens as the new
prompt; the prefix cache usually still holds most of it) or, with
``preemption_mode="swap"`` and room in the swap pool, by swap-out (its pages are copied
to the swap pool and come back bit-exact). Either way its output does not change.
"""
from collections import deque

import numpy as np

from pagedcy.engine.inflight import PrefillsInFlight
from pagedcy.engine.sequence import SeqStatus
from pagedcy.errors import PoolExhaustedError
from pagedcy.kvcache.manager import AllocationRequest

__all__ = ["Scheduler", "ScheduledBatch"]


class ScheduledBatch:
    """One step's work: ``seqs`` (decode rows first, then prefill chunks) and
    ``q_lens`` int64 ``[len(seqs)]`` (new tokens of each: the manager's dtype, so
    ``prepare_step`` / ``commit_step`` take it as it is); ``num_decodes`` leading rows are
    decodes (q_len 1)."""

    __slots__ = ("seqs", "q_lens", "num_decodes")

    def __init__(self, scheduled):
        dec = [s for s, q in scheduled if s.is_decoding()]
        pre = [(s, q) for s, q in scheduled if not s.is_decoding()]
        self.num_decodes = len(dec)
        self.seqs = dec + [s for s, _ in pre]
        self.q_lens = np.ones(len(self.seqs), dtype=np.int64)
        if pre:
            self.q_lens[len(dec):] = [q for _, q in pre]

    def __len__(self):
        return len(self.seqs)

    def token_ids(self):
        """The flat model input, int32 ``[sum(q_lens)]``."""
        nd = self.num_decodes
        if nd == len(self.seqs):
            return np.fromiter((s.output[-1] for s in self.seqs), np.int32, nd)
        out = np.empty(int(self.q_lens.sum()), dtype=np.int32)
        out[:nd] = [s.output[-1] for s in self.seqs[:nd]]
        pos = nd
        for s, q in zip(self.seqs[nd:], self.q_lens[nd:].tolist()):
            out[pos:pos + q] = s.tokens[s.num_computed:s.num_computed + q]
            pos += q
        return out


class Scheduler:
    """Queues of sequences over one :class:`PagedKVCacheManager`.

    Scheduler(manager, *, max_num_seqs, max_num_batched_tokens, preemption_mode,
              store_lookups=None):
    ``preemption_mode`` "recompute" or "swap" (swap falls back to recompute when the
    swap pool is full or absent). ``store_lookups``: a
    :class:`~pagedcy.engine.store_lookups.StoreLookups` (the KV page store) or None.
    """

    def __init__(self, manager, *, max_num_seqs, max_num_batched_tokens, preemption_mode,
                 store_lookups=None):
        self.manager = manager
        self.lookups = store_lookups
        self.inflight = PrefillsInFlight(manager)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption_mode = preemption_mode
        self.page_size = manager.block_size()
        self.waiting = deque()
        self.running = []
        self.swapped = deque()
        self.num_preemptions = 0
        # Pages left free while admitting new work next to running sequences, so their
        # next decode pages do not force an immediate preemption (vLLM's watermark).
        self.watermark = max(1, manager.total_blocks() // 100)

    # -- queues ------------------------------------------------------------------------
    def add(self, seq):
        """Queue a new sequence for prefill."""
        self.waiting.append(seq)

    def add_running(self, seq):
        """A sequence forked from a running one (it holds shared pages already)."""
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def num_running(self):
        """Sequences holding pages in the pool."""
        return len(self.running)

    def has_work(self):
        """True while any sequence is queued, running or swapped out."""
        return bool(self.waiting or self.running or self.swapped)

    def free(self, seq):
        """Release a sequence's pages (swap pages too); it leaves every queue at the
        next :meth:`drop_finished` (running) or now (waiting / swapped)."""
        if seq.handle is not None:
            self.manager.deallocate(seq.handle)
            seq.handle = None
        if self.lookups is not None:
            self.lookups.forget(seq)
        if seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status == SeqStatus.SWAPPED:
            self.swapped.remove(seq)
        elif seq.status == SeqStatus.RUNNING:
            self.running.remove(seq)
        seq.status = SeqStatus.FINISHED

    def finish(self, seq):
        """Release a running sequence that just finished (removed by drop_finished)."""
        if seq.handle is not None:
            self.manager.deallocate(seq.handle)
            seq.handle = None
        seq.status = SeqStatus.FINISHED

    def drop_finished(self):
        """Remove finished sequences from the running list (once per step)."""
        self.running = [s for s in self.running if s.status == SeqStatus.RUNNING]

    # -- page accounting -----------------------------------------------------------------
    def _pages_needed(self, seq, q):
        """(new blocks, pages needed) for ``q`` more tokens of running ``seq``: blocks past
        its table, plus one when the first block written is shared (its copy-on-write
        copy). Only completions of a request with n > 1 share a page they write: prefix
        cache hits are full pages, never written again."""
        h = seq.handle
        ps = self.page_size
        nb = h.num_blocks()
        nc = seq.num_computed
        grow = -(-(nc + q) // ps) - nb
        if grow < 0:
            grow = 0
        need = grow
        if seq.request.params.n > 1 and nc // ps < nb and \
                self.manager.pool.ref_count(int(h.block_table()[nc // ps])) > 1:
            need += 1
        return grow, need

    def _extend(self, seq, q, grow):
        """Count ``q`` more tokens in ``seq``'s handle (``manager.extend`` when it needs
        blocks; a plain token count otherwise, the same thing without the allocation)."""
        if grow:
            self.manager.extend(seq.handle, q)
        else:
            seq.handle.set_num_tokens(seq.num_computed + q)

    def _preempt(self, seq):
        """Take ``seq`` out of the pool: swap it out when allowed and possible, else free
        it for recomputation."""
        mgr = self.manager
        h = seq.handle
        h.set_num_tokens(seq.num_computed)
        self.num_preemptions += 1
        if self.preemption_mode == "swap" and mgr.swap_free_blocks() >= h.num_blocks():
            try:
                mgr.swap_out(h)
            except PoolExhaustedError:
                pass
            else:
                seq.status = SeqStatus.SWAPPED
                # victims leave lowest priority first: the last one out is the first back
                self.swapped.appendleft(seq)
                return
        mgr.deallocate(h)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def preempt_last(self):
        """Preempt the lowest-priority running sequence (after a failed step)."""
        if self.running:
            self._preempt(self.running.pop())

    # -- the step --------------------------------------------------------------------------
    def schedule(self):
        """Choose this step's :class:`ScheduledBatch`; handles are extended by their
        q_lens (``manager.extend``), so ``prepare_step`` can run next."""
        mgr = self.manager
        budget = self.max_num_batched_tokens
        if self.lookups is not None:
            self.lookups.poll()
        scheduled = []
        preempted = False
        free = mgr.free_blocks()
        # copy-on-write pages the scheduled sequences take in prepare_step: free_blocks()
        # does not show them yet, and admitting a prompt into them made every step fail
        # (a livelock the state-machine test found: admit, fail, preempt, admit again)
        cow = 0
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            q = min(seq.pending(), budget)
            grow, need = self._pages_needed(seq, q)
            while need > free:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                free = mgr.free_blocks()
                if victim is seq:
                    break
            else:
                self._extend(seq, q, grow)
                free -= need
                cow += need - grow
                scheduled.append((seq, q))
                budget -= q
                i += 1
                continue
            break
        if not preempted:
            budget = self._resume_swapped(scheduled, budget, cow)
            if not self.swapped:
                self._admit_waiting(scheduled, budget, cow)
                if not scheduled and self.lookups is not None and self.lookups.has_pending():
                    # nothing else to run: wait a little for the store instead of spinning
                    self.lookups.wait(0.05)
                    self.lookups.poll()
                    self._admit_waiting(scheduled, budget, cow)
        return ScheduledBatch(scheduled)

    def _resume_swapped(self, scheduled, budget, cow):
        mgr = self.manager
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[0]
            h = seq.handle
            nb = h.num_blocks()
            q = min(seq.pending(), budget)
            grow = max(0, -(-(seq.num_computed + q) // self.page_size) - nb)
            reserve = self.watermark if self.running else 0
            if nb + grow + reserve + cow > mgr.free_blocks():
                break
            mgr.swap_in(h)
            self.swapped.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            self._extend(seq, q, grow)
            scheduled.append((seq, q))
            budget -= q
        return budget

    def _admit_waiting(self, scheduled, budget, cow):
        mgr = self.manager
        ps = self.page_size
        lookups = self.lookups
        waiting = self.waiting
        inflight = self.inflight
        inflight.start()
        i = 0
        while i < len(waiting) and budget > 0:
            seq = waiting[i]
            if inflight.defers(seq):
                i += 1          # a running prefill computes its next pages: cache hits soon
                continue
            if lookups is not None and lookups.blocks(seq):
                i += 1          # its KV store lookup is in flight: the next one may go
                continue
            # completion 0 of a request with n > 1 brings its siblings at its first token
            seats = 1 + sum(1 for s in seq.request.seqs if s.status == SeqStatus.FORK_PENDING)
            if len(self.running) + seats > self.max_num_seqs:
                break
            req = AllocationRequest(request_id=seq.seq_id, prompt_tokens=seq.tokens,
                                    max_sequence_length=seq.request.prompt_len
                                    + seq.request.max_tokens)
            if not mgr.can_allocate(req):
                break
            # (counting the whole prompt: an upper bound when the prefix cache hits)
            if self.running and mgr.free_blocks() - cow - (-(-seq.tokens.shape[0] // ps)) \
                    < self.watermark:
                break
            h = mgr.allocate(req)
            del waiting[i]
            cached = h.num_cached_tokens()
            if lookups is not None:
                cached += lookups.load(seq, h)
            h.set_num_tokens(cached)
            seq.handle = h
            seq.num_computed = cached
            if seq.index == 0 and not seq.output:
                seq.request.num_cached_tokens = cached
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            inflight.admitted(seq)
            q = min(seq.pending(), budget)
            self._extend(seq, q, 0)     # the prompt's pages are allocated already
            scheduled.append((seq, q))
            budget -= q

    def rollback(self, batch):
        """Undo :meth:`schedule`'s extensions (the step did not run)."""
        for seq in batch.seqs:
            if seq.handle is not None:
                seq.handle.set_num_tokens(seq.num_computed)
