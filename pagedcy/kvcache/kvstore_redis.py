"""The KV page store's Redis connection: pipelined reads and writes, and backing off.

:class:`RedisPages` wraps one ``redis.Redis`` (redis-py, imported here only) made by
``redis.Redis.from_url``: ``redis://``, ``rediss://`` and ``unix://`` URLs, passwords and
query options (``?socket_timeout=0.2``) pass through as redis-py reads them. A failed
call (connection refused or lost, a timeout) marks the store down for a delay that
doubles with each failure (0.25 s to 30 s): calls while it is down fail at once without
touching the network, and the first call after the delay tries again.
"""
import threading
import time

__all__ = ["RedisPages", "StoreUnavailable"]

#: seconds to wait for a connection or a reply unless the URL says otherwise
DEFAULT_TIMEOUT = 1.0
BACKOFF = (0.25, 30.0)


class StoreUnavailable(Exception):
    """The store is down or backing off (the caller recomputes instead)."""


class RedisPages:
    """Pipelined GET/SET of page values on one Redis.

    RedisPages(url, *, timeout=DEFAULT_TIMEOUT, backoff=BACKOFF)

    ValueError for a URL redis-py cannot parse; ImportError without redis-py. No
    connection is made here: a server that is down at start only makes the first calls
    fail. Thread-safe (redis-py's connection pool; the backoff state is locked).
    """

    def __init__(self, url, *, timeout=DEFAULT_TIMEOUT, backoff=BACKOFF):
        if not isinstance(url, str):
            raise TypeError(f"kv_store must be a URL string, got {type(url).__name__}")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:
            raise ImportError("kv_store needs redis-py: pip install 'pagedcy[kvstore]'") from e
        self._errors = (redis.RedisError, OSError)
        self._response_error = redis.ResponseError
        try:
            # no retries inside redis-py: a failure backs off here instead of blocking a
            # lookup for several timeouts
            self.client = redis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0), health_check_interval=0)
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad kv_store URL: {e}") from None
        #: seconds a reply may take (the URL's socket_timeout wins over ``timeout``)
        self.timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        self._lock = threading.Lock()
        self._backoff = backoff
        self._delay = backoff[0]
        self._down_until = 0.0
        self.failures = 0          # failed calls (connection, timeout, protocol)

    # -- health ------------------------------------------------------------------------
    def available(self):
        """False while backing off after a failure."""
        return time.monotonic() >= self._down_until

    def _check(self):
        if not self.available():
            raise StoreUnavailable("the KV store is backing off after an error")

    def _failed(self):
        with self._lock:
            self.failures += 1
            self._down_until = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, self._backoff[1])

    def _ok(self):
        with self._lock:
            self._delay = self._backoff[0]

    def _run(self, fill):
        """Run a non-transactional pipeline filled by ``fill(pipe)``; its replies (errors
        of single commands as exception objects). StoreUnavailable on any failure of
        the connection."""
        self._check()
        try:
            pipe = self.client.pipeline(transaction=False)
            fill(pipe)
            out = pipe.execute(raise_on_error=False)
        except self._errors as e:
            self._failed()
            raise StoreUnavailable(str(e)) from None
        self._ok()
        return out

    # -- data --------------------------------------------------------------------------
    def get_many(self, keys):
        """The values of ``keys`` (bytes, or None for a missing key), one MGET.
        StoreUnavailable when the store cannot answer."""
        out = self._run(lambda p: p.mget(keys))[0]
        if isinstance(out, Exception) or not isinstance(out, list) or len(out) != len(keys):
            self._failed()
            raise StoreUnavailable(f"MGET answered {type(out).__name__}")
        return out

    def set_many(self, items):
        """SET each ``(key, value)`` of ``items`` in one pipeline; returns the number that
        failed (e.g. OOM under maxmemory). StoreUnavailable when the store cannot answer."""
        def fill(p):
            for k, v in items:
                p.set(k, v)
        return sum(1 for r in self._run(fill) if isinstance(r, Exception))

    def close(self):
        """Close the client's connections."""
        try:
            self.client.close()
        except self._errors:
            pass
