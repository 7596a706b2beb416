"""A free loopback port for a server a bench or test is about to start."""
import random
import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1, drawn from [20000, 30000): below Linux's ephemeral range
    (32768 and up), where the processes of a local Ray cluster bind their random ports (one
    of them, a metrics server, once took the port a bench's server was about to bind and
    answered its health check), and above Ray's worker ports (10002-19999). The port is
    released before returning, so a race stays possible, only rarer."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
