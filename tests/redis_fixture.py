"""A throwaway redis-server for the KV store tests: on a unix socket in a temporary
directory, no persistence, stopped by its pid. ``redis_server`` (a pytest fixture) skips
the test only when the redis-server binary is missing (.ci/run installs it)."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

BINARY = shutil.which("redis-server") or ("/usr/bin/redis-server"
                                          if os.path.exists("/usr/bin/redis-server") else None)


class RedisServer:
    """``start()`` / ``kill()`` / ``restart()`` one redis-server; ``url`` (unix://...),
    ``tcp_url`` (redis://127.0.0.1:port/0, the same server), ``client()`` (redis-py)."""

    def __init__(self, directory):
        self.dir = directory
        self.sock = os.path.join(directory, "redis.sock")
        self.url = f"unix://{self.sock}"
        with socket.socket() as s:          # a free loopback port (released for the server)
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.tcp_url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [BINARY, "--port", str(self.port), "--bind", "127.0.0.1",
             "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = self.client()
        end = time.monotonic() + 10
        while True:
            try:
                c.ping()
                return self
            except Exception:
                if time.monotonic() > end or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.02)

    def client(self):
        import redis
        return redis.Redis(unix_socket_path=self.sock, socket_timeout=5)

    def kill(self):
        """SIGKILL the server (a crash) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if os.path.exists(self.sock):
            os.unlink(self.sock)

    def restart(self):
        self.kill()
        return self.start()


@pytest.fixture
def redis_server():
    """A fresh, empty redis-server for one test."""
    if BINARY is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    pytest.importorskip("redis")
    d = tempfile.mkdtemp(prefix="pagedcy-redis-")
    srv = RedisServer(d).start()
    try:
        yield srv
    finally:
        srv.kill()
        shutil.rmtree(d, ignore_errors=True)
