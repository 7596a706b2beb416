"""The scheduler's side of the KV page store: look up a waiting prompt's next pages in the
background, then load what arrived into its fresh pages at admission.

A waiting sequence whose full prompt pages go past what the local prefix cache holds is
looked up once (the store's reader thread fetches the run of pages that follow the local
hits); it stays waiting, without holding back the other requests, until the answer
arrives or ``lookup_timeout`` passes, and is then admitted with those pages loaded and
counted as computed. A late or stale answer is dropped. The pages a step completes go to
the store through the manager's page listener (:func:`attach_writes`).
"""
import itertools
import time

__all__ = ["StoreLookups", "attach_writes"]


def attach_writes(manager, store):
    """Send every full prompt page that enters ``manager``'s prefix cache to ``store``
    (once: pages the store holds or was asked to hold are skipped)."""
    def on_page(page_hash, page):
        if store.wants(page_hash):
            store.put(page_hash, manager.page_bytes(page))
    manager.set_page_listener(on_page)


class StoreLookups:
    """Lookups of waiting sequences in one :class:`~pagedcy.kvcache.kvstore.KVStore`.

    StoreLookups(store, manager, lookup_timeout=None)

    lookup_timeout: seconds a sequence waits for its answer before it is admitted without
    (None: 4 replies' timeouts, at least 2 s).
    """

    def __init__(self, store, manager, lookup_timeout=None):
        self.store = store
        self.manager = manager
        self.page_size = manager.block_size()
        if lookup_timeout is None:
            lookup_timeout = max(2.0, 4 * (store.conn.timeout or 1.0))
        self.lookup_timeout = lookup_timeout
        self._ids = itertools.count()
        self._pending = {}   # seq -> (token, first block, deadline)
        self._ready = {}     # seq -> (first block, payloads)
        self._by_token = {}  # token -> seq

    def has_pending(self):
        """True while some lookup has not answered."""
        return bool(self._pending)

    def poll(self):
        """Take the answers that arrived."""
        for res in self.store.results():
            seq = self._by_token.pop(res.token, None)
            if seq is None:
                continue                    # its sequence was admitted or freed meanwhile
            _, first, _ = self._pending.pop(seq)
            self._ready[seq] = (first, res.payloads)

    def wait(self, timeout):
        """Block up to ``timeout`` seconds for an answer (when nothing else can run)."""
        if self._pending:
            self.store.wait_results(timeout)

    def blocks(self, seq):
        """True if ``seq`` must keep waiting for its lookup; starts one the first time its
        prompt has full pages past the local prefix cache (and the store is up)."""
        if seq in self._ready:
            return False
        entry = self._pending.get(seq)
        if entry is not None:
            if time.monotonic() < entry[2]:
                return True
            self._forget_pending(seq)      # too slow: admit it without the store
            self._ready[seq] = (0, [])
            return False
        hashes, local = self.manager.match_prefix(seq.tokens)
        limit = min(len(hashes), (seq.tokens.shape[0] - 1) // self.page_size)
        if local >= limit or not self.store.conn.available():
            self._ready[seq] = (local, [])
            return False
        token = next(self._ids)
        self._pending[seq] = (token, local, time.monotonic() + self.lookup_timeout)
        self._by_token[token] = seq
        self.store.lookup(token, hashes[local:limit])
        return True

    def load(self, seq, handle):
        """Load the pages the lookup of ``seq`` found into ``handle`` (just allocated, with
        ``handle.num_cached_tokens()`` local hits) past its local hits; returns the tokens
        loaded (0 if the local cache now reaches past them or no longer reaches them)."""
        first, payloads = self._ready.pop(seq, (0, []))
        have = handle.num_cached_tokens() // self.page_size
        if not payloads or have < first or have >= first + len(payloads):
            return 0
        use = payloads[have - first:]
        try:
            self.manager.load_pages(handle, have, use)
        except ValueError:       # nothing was copied: prefill them instead
            return 0
        self.store.note_loaded(len(use))
        return len(use) * self.page_size

    def _forget_pending(self, seq):
        entry = self._pending.pop(seq, None)
        if entry is not None:
            self._by_token.pop(entry[0], None)

    def forget(self, seq):
        """Drop whatever is known about ``seq`` (freed, or admitted without a lookup)."""
        self._forget_pending(seq)
        self._ready.pop(seq, None)
