"""Sequence handles: :class:`PagedKVCacheHandle` (one sequence's block table and token
count) and :class:`HandleTable` (a manager's live handles by request id)."""
import itertools

import numpy as np

from pagedcy import _validate

__all__ = ["PagedKVCacheHandle", "HandleTable"]


class PagedKVCacheHandle:
    """One sequence's view of the cache: its block table and token count.

    Obtained from :meth:`PagedKVCacheManager.allocate` / ``fork``; every operation on the
    K/V data goes through the manager. After ``deallocate`` every method raises ValueError.
    """

    __slots__ = ("_mgr", "_lock", "_pool", "_page_size", "request_id", "_blocks", "_table",
                 "_num_tokens", "_cached", "_max_len", "_swap_blocks", "_prompt", "_progress",
                 "_alive", "__weakref__")

    def __init__(self, mgr, lock, pool, page_size, request_id, max_len):
        self._mgr = mgr            # the owning manager, for "another manager's handle" checks
        self._lock = lock          # the manager's lock
        self._pool = pool
        self._page_size = page_size
        self.request_id = request_id
        self._blocks = []          # physical page ids, logical order
        self._table = None         # (the _blocks list it copies, read-only int32 copy)
        self._num_tokens = 0
        self._cached = 0
        self._max_len = max_len
        self._swap_blocks = None   # swap-pool page ids while swapped out
        self._prompt = None        # read-only int64 prompt token ids, if given
        self._progress = None      # PromptProgress while prompt pages await registration
        self._alive = True

    def _check(self):
        if not self._alive:
            raise ValueError(f"handle {self.request_id!r} was deallocated")

    def _set_blocks(self, blocks):
        # always a new list: block_table() tells a cached copy's list by identity
        self._blocks = blocks
        self._table = None

    def num_tokens(self):
        """Tokens the sequence holds (positions ``0 .. num_tokens()-1``; attention's kv_len)."""
        return self._num_tokens

    def set_num_tokens(self, n):
        """Set the token count. ValueError if ``n`` < 0, above the allocated capacity
        (``num_blocks() * block_size()``) or above ``max_sequence_length``."""
        with self._lock:
            self._check()
            n = _validate.check_count(n, "num_tokens")
            cap = self.capacity()
            if n > cap:
                raise ValueError(f"num_tokens {n} exceeds the {cap} tokens of the allocated blocks")
            if self._max_len is not None and n > self._max_len:
                raise ValueError(f"num_tokens {n} exceeds max_sequence_length {self._max_len}")
            self._num_tokens = n

    def capacity(self):
        """Tokens the allocated blocks can hold (also while swapped out)."""
        return self.num_blocks() * self._page_size

    def num_blocks(self):
        """Number of blocks (pages) the sequence holds (in the swap pool while swapped out)."""
        return len(self._swap_blocks) if self._swap_blocks is not None else len(self._blocks)

    def block_table(self):
        """The physical page ids in logical order: read-only int32 ``[num_blocks()]``
        (empty while swapped out). A new array after every change; never mutated."""
        # No lock: the cached copy is tagged with the list it copies, so a reader that
        # races a change (another thread's extend or copy-on-write) cannot leave a stale
        # table behind (one did, and a step then wrote into another sequence's page 0).
        blocks, cached = self._blocks, self._table
        if cached is not None and cached[0] is blocks:
            return cached[1]
        t = np.array(blocks, dtype=np.int32)
        t.flags.writeable = False
        self._table = (blocks, t)
        return t

    def ref_count(self):
        """The smallest pool reference count over the handle's pages: 1 when at least one
        page is private, ``k`` when every page is shared by ``k`` holders (right after a
        fork, 2). A handle without pages (or swapped out) reports 1 -- only itself."""
        with self._lock:
            if not self._blocks:
                return 1
            return int(self._pool.ref_counts()[self.block_table()].min())

    def num_cached_tokens(self):
        """Prompt tokens served from the prefix cache at allocation (a multiple of the
        block size, always < the prompt length); the caller computes only the rest."""
        return self._cached

    def prompt_tokens(self):
        """The prompt token ids given at allocation (read-only int64 ``[n]``; a fork
        shares its parent's), or None."""
        return self._prompt

    def is_swapped(self):
        """True while the sequence's pages live in the swap pool."""
        return self._swap_blocks is not None

    def is_alive(self):
        """False once deallocated."""
        return self._alive

    def __repr__(self):
        state = "swapped" if self.is_swapped() else ("freed" if not self._alive else "resident")
        return (f"PagedKVCacheHandle({self.request_id!r}, tokens={self._num_tokens}, "
                f"blocks={self.num_blocks()}, cached={self._cached}, {state})")


class HandleTable:
    """The live handles of one manager by request id, and the checks that turn an
    argument (a handle or a request id) into one of them. Not locked: the manager
    serialises calls."""

    def __init__(self, owner):
        self._owner = owner
        self._by_id = {}
        self._ids = itertools.count()

    def __len__(self):
        return len(self._by_id)

    def __contains__(self, request_id):
        return request_id in self._by_id

    def values(self):
        """Live handles in allocation order (a list)."""
        return list(self._by_id.values())

    def lookup(self, request_id):
        """The live handle of ``request_id``, or None."""
        return self._by_id.get(request_id)

    def new_id(self, rid):
        """``rid`` if it is free (ValueError if in use), or a fresh ``req-<n>`` for None."""
        if rid is None:
            rid = f"req-{next(self._ids)}"
            while rid in self._by_id:
                rid = f"req-{next(self._ids)}"
        elif rid in self._by_id:
            raise ValueError(f"request_id {rid!r} is already allocated")
        return rid

    def add(self, h):
        """Register a new handle under its request id."""
        self._by_id[h.request_id] = h

    def remove(self, h):
        """Forget a deallocated handle."""
        del self._by_id[h.request_id]

    def get(self, h):
        """The live handle ``h`` is or names. ValueError for another manager's or a
        deallocated handle, KeyError for an unknown request id."""
        if isinstance(h, PagedKVCacheHandle):
            if h._mgr is not self._owner:
                raise ValueError("handle belongs to another manager")
            if not h._alive:
                h._check()
            return h
        try:
            return self._by_id[h]
        except (KeyError, TypeError):
            raise KeyError(f"no live handle with request_id {h!r}") from None

    def resident(self, h):
        """:meth:`get`, and ValueError if the handle is swapped out."""
        h = self.get(h)
        if h._swap_blocks is not None:
            raise ValueError(f"handle {h.request_id!r} is swapped out; swap_in first")
        return h

    def resident_batch(self, handles, what):
        """Distinct live resident handles (a list) from a sequence of handle objects:
        TypeError for anything else, ValueError for a repeat (``what`` names the call)."""
        if isinstance(handles, PagedKVCacheHandle):
            raise TypeError("handles must be a sequence of PagedKVCacheHandle, got one handle")
        try:
            hs = list(handles)
        except TypeError:
            raise TypeError("handles must be a sequence of PagedKVCacheHandle") from None
        owner = self._owner
        for h in hs:
            # one cheap test per handle on the hot path; the slow path names the problem
            if type(h) is not PagedKVCacheHandle or h._mgr is not owner or not h._alive \
                    or h._swap_blocks is not None:
                if not isinstance(h, PagedKVCacheHandle):
                    raise TypeError(f"handles must be PagedKVCacheHandle objects, got "
                                    f"{type(h).__name__}")
                self.resident(h)
        if len(set(hs)) != len(hs):
            raise ValueError(f"a handle appears twice in one {what}")
        return hs

    def num_swapped(self):
        """Handles swapped out."""
        return sum(1 for h in self._by_id.values() if h._swap_blocks is not None)
