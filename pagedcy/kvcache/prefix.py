"""The prefix cache: chained hashes of full prompt pages, lookup and registration.

A page's hash covers its tokens *and* the hash of the page before it (vLLM's chained
block hashes), so a page is reused only when the whole prompt up to and including it is
the same: K/V depend on every earlier token, not just the page's own.
"""
import hashlib

import numpy as np

__all__ = ["PrefixCache", "PromptProgress", "block_hash"]

_ROOT = b"pagedcy-root"


def block_hash(parent, tokens, salt=None):
    """16-byte hash of one page: ``parent`` (the previous page's hash, or the root),
    the optional ``salt`` and the page's ``tokens`` as little-endian int64. No per-process
    seed: the same in every process and on every machine (the KV store's keys)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent)
    if salt:
        h.update(b"salt:" + salt)
    h.update(np.asarray(tokens).astype("<i8", copy=False).tobytes())
    return h.digest()


class PromptProgress:
    """How far one sequence's full prompt pages are written, to register them once
    every layer of a page is (vLLM registers a block once it is full of computed tokens).

    hashes: the chained hashes of the prompt's full pages; registered: pages
    ``[0, registered)`` are registered or were prefix hits; marks: per layer, the prompt
    tokens written contiguously from position 0.
    """

    __slots__ = ("hashes", "registered", "marks")

    def __init__(self, hashes, registered, written, num_layers):
        self.hashes = hashes
        self.registered = registered
        self.marks = [written] * num_layers

    def advance(self, layers, start, end):
        """Record that positions ``start .. end-1`` of ``layers`` are written; True if
        a mark moved (only a write that reaches a mark extends it)."""
        moved = False
        m = self.marks
        for layer in layers:
            if start <= m[layer] < end:
                m[layer] = end
                moved = True
        return moved

    def written_pages(self, page_size):
        """Full prompt pages whose every layer is written."""
        return min(min(self.marks) // page_size, len(self.hashes))


class PrefixCache:
    """Maps chained page hashes to pages of one pool and back.

    PrefixCache(page_size, max_pages, enabled, counters)

    Holds no pool references itself: pages held by handles are counted by the pool, and
    the :class:`~pagedcy.kvcache.allocator.BlockAllocator` keeps the one reference of an
    evictable page and calls :meth:`forget` when it evicts one. Disabled, it still
    answers (nothing is ever cached).
    """

    def __init__(self, page_size, max_pages, enabled, counters):
        self.page_size = page_size
        self.enabled = bool(enabled)
        self._counters = counters
        self._hash_to_page = {}
        self._page_hash = {}
        self._mask = np.zeros(max_pages, dtype=bool)   # page -> cached, for batched lookups
        self.listener = None     # fn(hash, page) on each registration (the KV store's writes)

    # -- lookup ------------------------------------------------------------------------
    def prompt_hashes(self, prompt, salt=None):
        """Chained hashes of the full pages of ``prompt`` (int64 ``[n]``); ``salt``
        goes into the first page's hash (and so into every later one)."""
        ps = self.page_size
        out = []
        parent = _ROOT
        for i in range(len(prompt) // ps):
            parent = block_hash(parent, prompt[i * ps:(i + 1) * ps], salt if i == 0 else None)
            out.append(parent)
        return out

    def match(self, hashes, prompt_len):
        """Pages of the leading run of ``hashes`` that are cached, leaving at least one
        prompt token uncached: its query produces the first logits."""
        limit = min(len(hashes), (prompt_len - 1) // self.page_size)
        pages = []
        for i in range(limit):
            p = self._hash_to_page.get(hashes[i])
            if p is None:
                break
            pages.append(p)
        return pages

    def leading(self, prompt, salt=None):
        """``(hashes, n)``: the prompt's page hashes and how many of them :meth:`match`
        finds cached, counting nothing (the KV store asks what follows them)."""
        if not self.enabled or prompt is None or not len(prompt):
            return [], 0
        hashes = self.prompt_hashes(prompt, salt)
        return hashes, len(self.match(hashes, len(prompt)))

    def lookup(self, prompt, salt):
        """``(hashes, matched_pages)`` for a prompt (both empty when disabled or no prompt)."""
        if not self.enabled or prompt is None or not len(prompt):
            return [], []
        hashes = self.prompt_hashes(prompt, salt)
        return hashes, self.match(hashes, len(prompt))

    def start(self, prompt_len, hashes, matched, num_layers):
        """Count a lookup of ``prompt_len`` tokens with ``matched`` pages hit and return
        the :class:`PromptProgress` that registers the rest (None if nothing is left)."""
        hit = len(matched) * self.page_size
        self._counters.prefix_queries += prompt_len
        self._counters.prefix_hits += hit
        if hashes and len(matched) < len(hashes):
            return PromptProgress(hashes, len(matched), hit, num_layers)
        return None

    # -- membership -----------------------------------------------------------------------
    def __contains__(self, page):
        return page in self._page_hash

    def cached_mask(self, pages):
        """bool array: which of ``pages`` (int array) are cached."""
        return self._mask[pages]

    def hash_of(self, page):
        """The hash of a cached page (KeyError otherwise)."""
        return self._page_hash[page]

    def page_hashes(self):
        """{page: hash} of every cached page (a copy)."""
        return dict(self._page_hash)

    # -- changes -----------------------------------------------------------------------
    def register(self, blocks, progress):
        """Register the pages of ``blocks`` (a handle's block list) that ``progress`` says
        are fully written. Returns True once every full prompt page is registered."""
        done = progress.written_pages(self.page_size)
        for i in range(progress.registered, done):
            page = blocks[i]
            hsh = progress.hashes[i]
            # an identical prompt in flight may have registered the hash first
            if hsh not in self._hash_to_page and page not in self._page_hash:
                self._hash_to_page[hsh] = page
                self._page_hash[page] = hsh
                self._mask[page] = True
                if self.listener is not None:
                    self.listener(hsh, page)
        progress.registered = max(progress.registered, done)
        return progress.registered >= len(progress.hashes)

    def forget(self, page):
        """Drop a cached page (evicted)."""
        del self._hash_to_page[self._page_hash.pop(page)]
        self._mask[page] = False

    def clear(self):
        """Forget every hash."""
        self._hash_to_page.clear()
        self._page_hash.clear()
        self._mask[:] = False

    def check(self, ref_counts):
        """AssertionError unless both maps agree and every cached page is allocated."""
        for hsh, p in self._hash_to_page.items():
            if self._page_hash.get(p) != hsh or ref_counts[p] == 0:
                raise AssertionError(f"hash map broken at page {p}")
        if len(self._page_hash) != len(self._hash_to_page) \
                or int(self._mask.sum()) != len(self._page_hash):
            raise AssertionError("prefix cache maps disagree")
