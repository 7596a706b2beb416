"""A KV page store shared by engines: full prompt pages in Redis, written behind, read ahead.

:class:`KVStore` keeps two daemon threads on one :class:`~pagedcy.kvcache.kvstore_redis.
RedisPages`: a writer that sends the pages :meth:`KVStore.put` queued (many per pipeline,
after the step that filled them: a step never waits on Redis) and a reader that answers
:meth:`KVStore.lookup` (the longest run of stored pages, fetched with MGETs of growing
batches, stopping at the first missing or invalid value) into a results queue the
scheduler polls. Every failure only means fewer pages served: the caller recomputes them.
Values are encoded and checked by :class:`~pagedcy.kvcache.kvstore_format.PageCodec`.
"""
import collections
import dataclasses
import threading
import time
import weakref
import atexit

from pagedcy.kvcache.kvstore_redis import RedisPages, StoreUnavailable

__all__ = ["KVStore", "StoreCounters", "LookupResult"]

_MAX_SEEN = 1 << 18          # hashes remembered as stored (an LRU)
_FIRST_BATCH, _MAX_BATCH = 4, 64
_WRITE_BATCH_BYTES, _WRITE_BATCH_PAGES = 8 << 20, 64     # per pipeline


@dataclasses.dataclass
class StoreCounters:
    """Running totals of one store (pages unless named otherwise).

    hit: pages a lookup found valid; missed: pages looked up and not served (missing,
    rejected, after a miss, or the store failing); loaded: pages copied into the pool
    (counted by the engine); stored: pages written; dropped: pages not sent (the store was
    backing off or the write queue was full); rejected: values that failed validation;
    errors: failed store calls and refused SETs; bytes_in / bytes_out: value bytes read /
    written; lookups and load_seconds: lookups answered and their total latency.
    """

    hit: int = 0
    missed: int = 0
    loaded: int = 0
    stored: int = 0
    dropped: int = 0
    rejected: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    lookups: int = 0
    load_seconds: float = 0.0


@dataclasses.dataclass
class LookupResult:
    """The answer to one :meth:`KVStore.lookup`: ``token`` as given, ``payloads`` (one
    page's bytes each, the leading run of the hashes asked for), ``asked`` (hashes asked)."""

    token: object
    payloads: list
    asked: int


class KVStore:
    """Pages of one model on one Redis, keyed by chained prefix hash.

    KVStore(url, codec, *, max_pending_bytes=256 MiB, timeout=1.0)

    url: a redis-py URL (``redis.Redis.from_url``); codec: a
    :class:`~pagedcy.kvcache.kvstore_format.PageCodec`. ``max_pending_bytes``: pages
    queued for writing beyond this are dropped (counted). ``before_fetch``: a test hook
    called with each batch of keys just before it is fetched. ValueError for a bad URL.
    """

    def __init__(self, url, codec, *, max_pending_bytes=256 << 20, timeout=1.0):
        self.codec = codec
        self.conn = RedisPages(url, timeout=timeout)
        self.counters = StoreCounters()
        self.before_fetch = None
        self._max_pending = max_pending_bytes
        self._cv = threading.Condition()
        self._writes = collections.deque()     # (hash, payload bytes)
        self._pending_bytes = 0
        self._writing = 0                      # pages taken by the writer, not yet sent
        self._lookups = collections.deque()    # (token, hashes)
        self._results = collections.deque()    # LookupResult
        self._seen = collections.OrderedDict()  # hash -> None: in the store, as far as we know
        self._unsent = set()                   # hashes queued or being written
        self._closed = False
        self._threads = [threading.Thread(target=self._writer, name="pagedcy-kvstore-writer",
                                          daemon=True),
                         threading.Thread(target=self._reader, name="pagedcy-kvstore-reader",
                                          daemon=True)]
        for t in self._threads:
            t.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (s := ref()) is not None and s.close(timeout=2.0))

    # -- bookkeeping -------------------------------------------------------------------
    def _count(self, **deltas):
        with self._cv:
            c = self.counters
            for k, v in deltas.items():
                setattr(c, k, getattr(c, k) + v)

    def _remember(self, page_hash):
        s = self._seen
        s[page_hash] = None
        s.move_to_end(page_hash)
        if len(s) > _MAX_SEEN:
            s.popitem(last=False)

    def note_loaded(self, n):
        """Count ``n`` pages the engine copied into its pool."""
        self._count(loaded=n)

    def snapshot(self):
        """A copy of the :class:`StoreCounters`."""
        with self._cv:
            return dataclasses.replace(self.counters)

    # -- writes ------------------------------------------------------------------------
    def wants(self, page_hash):
        """False if the page is known to be stored (or queued) already, or the store is
        backing off (the page is then counted as dropped)."""
        with self._cv:
            if self._closed or page_hash in self._seen:
                return False
        if not self.conn.available():
            self._count(dropped=1)
            return False
        return True

    def put(self, page_hash, payload):
        """Queue one full page (``payload``: its bytes, a private copy) for writing."""
        with self._cv:
            if self._closed or page_hash in self._seen:
                return
            if self._pending_bytes + len(payload) > self._max_pending:
                self.counters.dropped += 1
                return
            self._remember(page_hash)
            self._unsent.add(page_hash)
            self._writes.append((page_hash, payload))
            self._pending_bytes += len(payload)
            self._cv.notify_all()

    def _take_writes(self):
        with self._cv:
            while not self._writes and not self._closed:
                self._cv.wait()
            batch, size = [], 0
            while self._writes and size < _WRITE_BATCH_BYTES \
                    and len(batch) < _WRITE_BATCH_PAGES:
                item = self._writes.popleft()
                batch.append(item)
                size += len(item[1])
            self._pending_bytes -= size
            self._writing = len(batch)
            return batch

    def _writer(self):
        codec = self.codec
        while True:
            batch = self._take_writes()
            if not batch:
                return
            keys = [codec.key(h) for h, _ in batch]
            items = [(k, codec.encode(k, p)) for k, (_, p) in zip(keys, batch)]
            try:
                failed = self.conn.set_many(items)
            except StoreUnavailable:
                failed = None
            except Exception:         # never let the thread die: count and go on
                failed = None
            with self._cv:
                self._unsent.difference_update(h for h, _ in batch)
                c = self.counters
                if failed is None:
                    c.errors += 1
                    c.dropped += len(batch)
                    for h, _ in batch:
                        self._seen.pop(h, None)
                else:
                    c.errors += failed
                    c.stored += len(batch) - failed
                    c.bytes_out += sum(len(v) for _, v in items)
                    if failed:                  # which ones is not worth tracking: retry all
                        for h, _ in batch:
                            self._seen.pop(h, None)
                self._writing = 0
                self._cv.notify_all()

    def flush(self, timeout=None):
        """Wait until every queued page is sent (or dropped); False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._writes or self._writing:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    # -- reads -------------------------------------------------------------------------
    def lookup(self, token, hashes):
        """Ask for the leading run of ``hashes`` (list of 16-byte page hashes); the answer
        arrives as a :class:`LookupResult` with ``token`` in :meth:`results`. Returns at
        once."""
        with self._cv:
            if self._closed:                   # answered at once: nothing found
                self._results.append(LookupResult(token, [], len(hashes)))
            else:
                self._lookups.append((token, list(hashes), time.perf_counter()))
            self._cv.notify_all()

    def results(self):
        """The lookup answers that arrived since the last call (list)."""
        with self._cv:
            out = list(self._results)
            self._results.clear()
            return out

    def wait_results(self, timeout):
        """Wait up to ``timeout`` seconds for a lookup answer; True if one is ready."""
        with self._cv:
            if not self._results:
                self._cv.wait(timeout)
            return bool(self._results)

    def _take_lookup(self):
        with self._cv:
            while not self._lookups and not self._closed:
                self._cv.wait()
            return self._lookups.popleft() if self._lookups else None

    def _fetch(self, hashes, got):
        """Append to ``got`` the leading run of valid stored pages of ``hashes`` (their
        payloads); StoreUnavailable (what arrived stays in ``got``) if the store fails."""
        codec = self.codec
        size = _FIRST_BATCH
        i = 0
        while i < len(hashes):
            batch = hashes[i:i + size]
            keys = [codec.key(h) for h in batch]
            if self.before_fetch is not None:
                self.before_fetch(keys)
            values = self.conn.get_many(keys)
            for h, key, v in zip(batch, keys, values):
                if v is None:
                    with self._cv:
                        if h not in self._unsent:   # evicted: write it again when computed
                            self._seen.pop(h, None)
                    return
                self._count(bytes_in=len(v))
                try:
                    payload = codec.decode(key, v)
                except (ValueError, TypeError):
                    self._count(rejected=1)
                    return
                got.append(payload)
                with self._cv:
                    self._remember(h)
            i += len(batch)
            size = min(size * 2, _MAX_BATCH)

    def _reader(self):
        while True:
            job = self._take_lookup()
            if job is None:
                return
            token, hashes, t0 = job
            got = []
            try:
                if self.conn.available():
                    self._fetch(hashes, got)
            except Exception:       # StoreUnavailable, a failing hook: serve what arrived
                self._count(errors=1)
            with self._cv:
                c = self.counters
                c.hit += len(got)
                c.missed += len(hashes) - len(got)
                c.lookups += 1
                c.load_seconds += time.perf_counter() - t0
                self._results.append(LookupResult(token, got, len(hashes)))
                self._cv.notify_all()

    # -- life --------------------------------------------------------------------------
    def close(self, timeout=1.0):
        """Send what is queued (up to ``timeout`` seconds), stop the threads and close the
        connections. Idempotent."""
        if self._closed:
            return
        self.flush(timeout)
        with self._cv:
            self._closed = True
            self._writes.clear()
            self._unsent.clear()
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout)
        self.conn.close()
