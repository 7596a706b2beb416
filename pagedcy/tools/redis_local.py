"""A throwaway local ``redis-server`` for benches and tests: a unix socket (and a loopback
port) in a temporary directory, no persistence, stopped by its pid.

>>> with RedisServer() as srv:          # doctest: +SKIP
...     LLM(model, kv_store=srv.url)

The binary is Debian's ``redis-server`` (``apt-get install redis-server``); :data:`BINARY` is
None when it is missing. redis-py is imported only by :meth:`RedisServer.client`.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

from pagedcy.tools.ports import free_port

BINARY = shutil.which("redis-server") or ("/usr/bin/redis-server"
                                          if os.path.exists("/usr/bin/redis-server") else None)


class RedisServer:
    """``start()`` / ``kill()`` / ``restart()`` / ``close()`` one redis-server.

    ``url`` is its unix socket (``unix://...``), ``tcp_url`` the same server on a loopback
    port (``redis://127.0.0.1:port/0``); ``client()`` is a redis-py client on the socket.
    ``directory`` (default: a new temporary one, removed by :meth:`close`) holds the socket.
    ``extra`` are more ``redis-server`` arguments (e.g. ``["--maxmemory", "64mb"]``)."""

    def __init__(self, directory=None, extra=()):
        if BINARY is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
        self._own_dir = directory is None
        self.dir = tempfile.mkdtemp(prefix="pagedcy-redis-") if directory is None else directory
        self.sock = os.path.join(self.dir, "redis.sock")
        self.url = f"unix://{self.sock}"
        self.port = free_port()             # a free loopback port (released for the server)
        self.tcp_url = f"redis://127.0.0.1:{self.port}/0"
        self.extra = list(extra)
        self.proc = None

    def start(self, timeout=10.0):
        """Start the server and wait until it answers PING; returns self."""
        self.proc = subprocess.Popen(
            [BINARY, "--port", str(self.port), "--bind", "127.0.0.1",
             "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = self.client()
        end = time.monotonic() + timeout
        while True:
            try:
                c.ping()
                return self
            except Exception:
                if time.monotonic() > end or self.proc.poll() is not None:
                    self.kill()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.02)

    def client(self):
        """A redis-py client on the unix socket."""
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
        """Kill and start again: an empty server on the same socket and port."""
        self.kill()
        return self.start()

    def close(self):
        """Kill the server and remove its directory if this object made it."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.close()
