"""Prompt pages that running prefills are computing now.

When requests that share a prefix arrive together (a system prompt, a document asked
several questions), admitting them in the same step makes each compute the shared pages:
none of them is in the prefix cache yet. A waiting prompt whose next uncached page is being
computed by a running prefill waits instead (the requests behind it may go), and is admitted
a step later with those pages as prefix-cache hits. Output is unchanged: a page's K/V does
not depend on which request computed it.
"""

__all__ = ["PrefillsInFlight"]


class PrefillsInFlight:
    """The full prompt pages running sequences have still to prefill, by chained hash.

    PrefillsInFlight(manager): ``admitted(seq)`` after each admission, ``start()`` once per
    admission pass, then ``defers(seq)`` per waiting sequence. Never defers with the prefix
    cache off (no hashes)."""

    def __init__(self, manager):
        self.manager = manager
        self.page_size = manager.block_size()
        self._hashes = {}       # running seq -> its prompt's page hashes
        self._now = set()

    def admitted(self, seq):
        """Note a sequence just admitted (its ``num_computed`` counts its cache hits)."""
        hashes, _ = self.manager.match_prefix(seq.tokens)
        if len(hashes) * self.page_size > seq.num_computed:
            self._hashes[seq] = hashes
            self._now.update(hashes[seq.num_computed // self.page_size:])

    def start(self):
        """Collect the pages in flight now (sequences that left prefill are dropped)."""
        from pagedcy.engine.sequence import SeqStatus
        ps = self.page_size
        now = set()
        for seq, hashes in list(self._hashes.items()):
            if seq.status != SeqStatus.RUNNING or len(hashes) * ps <= seq.num_computed:
                del self._hashes[seq]
            else:
                now.update(hashes[seq.num_computed // ps:])
        self._now = now

    def defers(self, seq):
        """True if ``seq``'s next uncached prompt page is in flight (as of :meth:`start`)."""
        if not self._now:
            return False
        hashes, local = self.manager.match_prefix(seq.tokens)
        return local < len(hashes) and hashes[local] in self._now
