"""One engine thread bridged to asyncio.

The thread owns the ``LLMEngine`` (which is single-threaded): it takes commands (add, abort,
abort all, stop) from a thread-safe queue, calls ``step()`` while any request is unfinished,
and hands each step's outputs to the event loop in one ``call_soon_threadsafe`` call. The loop
only ever puts commands on the queue and reads per-request ``asyncio.Queue`` s, so it never
waits for model work.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Optional

from pagedcy.server.errors import APIError

logger = logging.getLogger("pagedcy.server")

_ADD, _ABORT, _ABORT_ALL, _STOP = "add", "abort", "abort_all", "stop"


@dataclass(frozen=True)
class Aborted:
    """The last item of a request the server aborted (shutdown or :meth:`AsyncEngine.abort`):
    it finished with reason "abort", and its text is what the consumer last received."""
    request_id: str
    finished: bool = True


@dataclass(eq=False)
class _Stream:
    """The loop-side end of one request: outputs (or an exception) arrive on ``queue``."""
    request_id: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False


class AsyncEngine:
    """Runs ``engine`` on its own thread; ``generate`` yields its ``RequestOutput`` s.

    ``max_waiting``: requests submitted but not yet running beyond this count are refused
    with a 503 (``None`` = unbounded). ``stats`` is the engine's ``EngineStats`` as of the
    last step or command, safe to read from any thread.
    """

    def __init__(self, engine, *, max_waiting: Optional[int] = None):
        self.engine = engine
        self.max_waiting = max_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}      # owned by the engine thread
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._submitted = 0          # written by the loop only
        self._admitted = 0           # published by the engine thread together with stats
        self._admitted_now = 0       # the engine thread's own count
        self._accepting = True
        self.stats = engine.stats()
        self._pending: list = []
        self.error: Optional[BaseException] = None

    # --- loop side ----------------------------------------------------------------------

    def start(self, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        """Start the engine thread, delivering to ``loop`` (default: the running loop)."""
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="pagedcy-engine", daemon=True)
        self._thread.start()

    def num_waiting(self) -> int:
        """Requests not yet running: queued for the thread plus the engine's waiting queue."""
        return max(0, self._submitted - self._admitted) + self.stats.num_waiting

    def is_alive(self) -> bool:
        """True while the engine thread runs and has not failed."""
        return self._thread is not None and self._thread.is_alive() and self.error is None

    async def generate(self, request_id: str, prompt: Any, params) -> AsyncGenerator[Any, None]:
        """Submit a request and yield its cumulative ``RequestOutput`` s until it finishes
        (or an :class:`Aborted` when the server stops or :meth:`abort` ends it).

        Raises ``APIError`` 400 if the engine refuses the request, 503 if the waiting queue is
        full or the server is stopping. Closing the generator early aborts the request.
        """
        if not self._accepting or not self.is_alive():
            raise APIError(503, "the server is shutting down" if not self._accepting
                           else "the engine is not running", code="unavailable")
        if self.max_waiting is not None and self.num_waiting() >= self.max_waiting:
            raise APIError(503, f"too many requests waiting (--max-waiting {self.max_waiting}); "
                                "retry later", code="queue_full")
        stream = _Stream(request_id)
        self._submitted += 1
        self._commands.put((_ADD, stream, prompt, params))
        try:
            while True:
                item = await stream.queue.get()
                # outputs are cumulative: a consumer that fell behind skips to the latest
                while (not isinstance(item, BaseException) and not item.finished
                       and not stream.queue.empty()):
                    item = stream.queue.get_nowait()
                if isinstance(item, BaseException):
                    stream.finished = True
                    raise item
                yield item
                if item.finished:
                    stream.finished = True
                    return
        finally:
            if not stream.finished:
                self._commands.put((_ABORT, request_id))

    def abort(self, request_id: str) -> None:
        """Abort one request (thread-safe; unknown ids are ignored)."""
        self._commands.put((_ABORT, request_id))

    def stop_accepting(self) -> None:
        """Refuse new requests (503) and abort every running one (thread-safe)."""
        self._accepting = False
        self._commands.put((_ABORT_ALL,))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything and join the engine thread."""
        self.stop_accepting()
        self._commands.put((_STOP,))
        if self._thread is not None:
            self._thread.join(timeout)

    def _dispatch(self, batch) -> None:
        for stream, item in batch:
            stream.queue.put_nowait(item)

    # --- engine thread ------------------------------------------------------------------

    def _deliver(self, batch) -> None:
        if batch and self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._dispatch, batch)
            except RuntimeError:        # the loop closed between the check and the call
                pass

    def _handle(self, cmd, batch) -> bool:
        kind = cmd[0]
        if kind == _ADD:
            _, stream, prompt, params = cmd
            self._admitted_now += 1
            if not self._accepting:
                batch.append((stream, APIError(503, "the server is shutting down", code="unavailable")))
                return True
            try:
                self.engine.add_request(stream.request_id, prompt, params)
            except (ValueError, TypeError) as exc:
                batch.append((stream, APIError(400, str(exc), code="invalid_value")))
            except Exception as exc:      # e.g. MemoryError: this request fails, the rest run
                logger.exception("engine refused request %s", stream.request_id)
                batch.append((stream, APIError(500, f"engine error: {exc}", code="engine_error")))
            else:
                self._streams[stream.request_id] = stream
        elif kind == _ABORT:
            stream = self._streams.pop(cmd[1], None)
            if stream is not None:
                self.engine.abort_request(cmd[1])
                # its generate() may still be waiting (abort() from elsewhere): end it
                batch.append((stream, Aborted(cmd[1])))
        elif kind == _ABORT_ALL:
            self._abort_all(batch)
        elif kind == _STOP:
            self._abort_all(batch)
            return False
        return True

    def _abort_all(self, batch, error: Optional[BaseException] = None) -> None:
        ids = list(self._streams)
        if ids:
            self.engine.abort_request(ids)
        for rid in ids:
            stream = self._streams.pop(rid)
            batch.append((stream, error or Aborted(rid)))

    def _run(self) -> None:
        try:
            self._loop_steps()
        except BaseException as exc:  # a bug or a broken engine: fail what is left, loudly
            logger.exception("the engine thread failed")
            self.error = exc
            err = APIError(500, f"engine error: {exc}", code="engine_error")
            self._deliver(self._pending + [(s, err) for s in self._streams.values()])
            self._streams.clear()
        finally:
            self._accepting = False
            left = []
            while True:                   # requests queued after the stop never ran
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    break
                if cmd[0] == _ADD:
                    left.append((cmd[1], APIError(503, "the server is shutting down",
                                                  code="unavailable")))
            self._deliver(left)

    def _loop_steps(self) -> None:
        running = True
        while running:
            batch: list = []
            self._pending = batch         # delivered by _run if this iteration fails
            idle = not self.engine.has_unfinished_requests()
            try:
                cmd = self._commands.get(block=idle, timeout=1.0 if idle else None)
            except queue.Empty:
                cmd = None
            while cmd is not None and running:
                running = self._handle(cmd, batch)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if running and self.engine.has_unfinished_requests():
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # the engine is broken: fail its requests, keep serving
                    logger.exception("engine step failed; aborting its requests")
                    self._abort_all(batch, APIError(500, f"engine error: {exc}", code="engine_error"))
                    outputs = []
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is None:
                        continue
                    if out.finished:
                        del self._streams[out.request_id]
                    batch.append((stream, out))
            self.stats = self.engine.stats()
            self._admitted = self._admitted_now
            self._deliver(batch)


