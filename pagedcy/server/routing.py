"""Prefix-aware replica choice, without Ray: which replica holds the longest prefix of a prompt.

A prompt's *page keys* are the engine's own chained page hashes
(:meth:`pagedcy.kvcache.prefix.PrefixCache.prompt_hashes`: blake2b over the int64 token ids of
each full page and the previous page's hash, so the same in every process), cut to
:data:`KEY_BYTES` bytes. Replicas report the keys of the pages in their prefix cache
(:func:`pack_keys`); a :class:`PrefixIndex` adds the prompts routed since a replica's last
report (their pages are being written or were written after it), and :func:`rank` orders the
replicas: longest leading run of held pages first among those whose load is within
``max_load_gap`` requests of the least loaded; then the less loaded, then the one holding
fewer pages (room for a new prefix), then a random draw.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Hashable, Iterable, Optional, Sequence

import numpy as np

#: Bytes of a page hash a key keeps: a collision only misroutes a request.
KEY_BYTES = 8


def page_keys(token_ids, page_size: int) -> list[bytes]:
    """Keys of the full pages of ``token_ids`` (any int sequence), as the engine hashes them."""
    from pagedcy.kvcache.prefix import PrefixCache
    cache = PrefixCache(page_size, 1, True, None)     # prompt_hashes reads only page_size
    return [h[:KEY_BYTES] for h in cache.prompt_hashes(np.asarray(token_ids, dtype=np.int64))]


def pack_keys(hashes: Iterable[bytes]) -> bytes:
    """One sorted blob of the keys of ``hashes`` (page hashes, 16 bytes each), for the
    routing stats a replica reports: sorted, so an unchanged cache reports equal bytes."""
    return b"".join(sorted({bytes(h[:KEY_BYTES]) for h in hashes}))


def unpack_keys(blob: bytes) -> frozenset:
    """The keys in a :func:`pack_keys` blob (ValueError if its length is not whole keys)."""
    if len(blob) % KEY_BYTES:
        raise ValueError(f"a key blob has a multiple of {KEY_BYTES} bytes, got {len(blob)}")
    return frozenset(blob[i:i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES))


def leading_match(keys: Sequence[bytes], holds) -> int:
    """How many of ``keys``, from the first, satisfy ``holds(key)`` without a gap: the pages
    a replica can skip (the engine matches only the leading run)."""
    n = 0
    for k in keys:
        if not holds(k):
            break
        n += 1
    return n


@dataclass(frozen=True)
class Candidate:
    """One replica as :func:`rank` sees it: ``load`` requests in flight, ``match`` leading
    pages of the prompt held, ``pages`` pages held in all."""
    replica: Hashable
    load: int
    match: int
    pages: int


def rank(candidates: Sequence[Candidate], *, max_load_gap: int,
         rng: Optional[random.Random] = None) -> list:
    """Replicas of ``candidates``, best first.

    Those within ``max_load_gap`` requests of the least loaded come first, by longest match,
    then lower load, then fewer pages, then a random draw (``rng``); the rest follow by load.
    So a prefix follows its pages until its replica is ``max_load_gap`` requests busier than
    another, and then goes to the least loaded.
    """
    if not candidates:
        return []
    if max_load_gap < 0:
        raise ValueError(f"max_load_gap must be >= 0, got {max_load_gap}")
    rng = rng or random  # type: ignore[assignment]  # the module's shared generator
    low = min(c.load for c in candidates)
    draw = {id(c): rng.random() for c in candidates}  # type: ignore[union-attr]
    near = [c for c in candidates if c.load - low <= max_load_gap]
    far = [c for c in candidates if c.load - low > max_load_gap]
    near.sort(key=lambda c: (-c.match, c.load, c.pages, draw[id(c)]))
    far.sort(key=lambda c: (c.load, draw[id(c)]))
    return [c.replica for c in near + far]


class PrefixIndex:
    """The page keys each replica is known or expected to hold, and its requests in flight.

    ``report(replica, keys, at)``: the replica's prefix cache as of time ``at``;
    ``routed`` / ``completed``: a request sent to a replica and its end. A request's keys
    count as held from the moment it is routed until a report taken after it completed
    (which shows whether the pages are still there). Times are ``time.time()`` seconds.
    """

    def __init__(self) -> None:
        self._reported: dict = {}       # replica -> (at, frozenset of keys)
        self._inflight: dict = {}       # replica -> {request_id: keys}
        self._recent: dict = {}         # replica -> [(completed_at, keys)]

    def report(self, replica, keys: frozenset, at: float) -> None:
        """Record what ``replica`` held at ``at`` (older reports than the last are ignored)."""
        last = self._reported.get(replica)
        if last is not None and last[0] >= at:
            return
        self._reported[replica] = (at, frozenset(keys))
        self._recent[replica] = [(t, k) for t, k in self._recent.get(replica, ()) if t >= at]

    def last_report(self, replica) -> Optional[float]:
        """The time of ``replica``'s last report, or None."""
        last = self._reported.get(replica)
        return None if last is None else last[0]

    def routed(self, replica, request_id, keys: Sequence[bytes]) -> None:
        """``request_id`` (with prompt ``keys``) was sent to ``replica``."""
        self._inflight.setdefault(replica, {})[request_id] = tuple(keys)

    def completed(self, replica, request_id, at: float) -> None:
        """``request_id`` on ``replica`` ended at ``at`` (unknown ids are ignored)."""
        keys = self._inflight.get(replica, {}).pop(request_id, None)
        if keys:
            self._recent.setdefault(replica, []).append((at, keys))

    def forget(self, replica) -> None:
        """Drop everything about ``replica`` (it died or left)."""
        for table in (self._reported, self._inflight, self._recent):
            table.pop(replica, None)

    def retain(self, replicas: Iterable) -> None:
        """Forget every replica not in ``replicas``."""
        keep = set(replicas)
        for r in {*self._reported, *self._inflight, *self._recent} - keep:
            self.forget(r)

    def inflight(self, replica) -> int:
        """Requests routed to ``replica`` and not completed."""
        return len(self._inflight.get(replica, ()))

    def candidate(self, replica, keys: Sequence[bytes], load: Optional[int] = None) -> Candidate:
        """``replica`` as a :class:`Candidate` for a prompt with ``keys`` (``load``: its
        requests in flight, default those this index routed)."""
        reported = self._reported.get(replica, (0.0, frozenset()))[1]
        expected = [k for k in self._inflight.get(replica, {}).values()]
        expected += [k for _, k in self._recent.get(replica, ())]
        extra = set().union(*expected) - reported if expected else set()

        def holds(key):
            return key in reported or key in extra
        return Candidate(replica, self.inflight(replica) if load is None else int(load),
                         leading_match(keys, holds), len(reported) + len(extra))
