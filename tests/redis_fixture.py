"""A throwaway redis-server for the KV store tests: on a unix socket in a temporary
directory, no persistence, stopped by its pid. ``redis_server`` (a pytest fixture) skips
the test only when the redis-server binary is missing (.ci/run installs it)."""
import pytest

from pagedcy.tools.redis_local import BINARY, RedisServer


@pytest.fixture
def redis_server():
    """A fresh, empty redis-server for one test."""
    if BINARY is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    pytest.importorskip("redis")
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.close()
