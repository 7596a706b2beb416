"""The engine of the HTTP front end when the engines are Ray Serve replicas.

:class:`RemoteEngine` offers what the routes use of an :class:`AsyncEngine` (``generate``,
``stats``, ``is_alive``, ``start``/``shutdown``, ``engine.tokenizer``/``max_model_len``/...),
so :func:`pagedcy.server.app.build_app` serves it unchanged. Each request becomes one streaming
call to the engine deployment, whose router picks the replica; the replica sends
:class:`OutputDelta` s (only what is new since the last one: a stream's outputs would otherwise
carry the whole prompt and text each time) and :class:`OutputAccumulator` turns them back into
the cumulative ``RequestOutput`` s the routes expect.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, AsyncGenerator, Optional

from pagedcy.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from pagedcy.server.async_engine import Aborted
from pagedcy.server.errors import APIError
from pagedcy.server.routing import page_keys

logger = logging.getLogger("pagedcy.server")


@dataclass
class ReplicaRequest:
    """One request for an engine replica: ``page_keys`` are its prompt's page keys
    (:func:`pagedcy.server.routing.page_keys`), which the router scores replicas by."""
    request_id: str
    prompt_token_ids: list
    params: Any
    page_keys: list = field(default_factory=list)

    @property
    def prompt(self) -> str:
        """The prompt's token ids as text, one character each, for routers that match
        prompt text (Ray's ``PrefixCacheAffinityRouter``, ``--router ray-prefix``)."""
        # skip the surrogate block, which a str may hold but not every codec takes
        return "".join(chr(t if t < 0xD800 else t + 0x800) for t in self.prompt_token_ids)


@dataclass
class CompletionDelta:
    """What one completion gained: text and token ids (and their logprobs) appended."""
    index: int
    text: str
    token_ids: list
    logprobs: Optional[list]
    cumulative_logprob: Optional[float]
    finish_reason: Optional[str]
    stop_reason: Any


@dataclass
class OutputDelta:
    """One item of a replica's stream. ``error``: (status, message, code, param) of a
    refused request; ``aborted``: the replica aborted it (it is stopping); ``stats``: the
    replica's ``EngineStats``, on the last item."""
    replica: str
    completions: list = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    aborted: bool = False
    error: Optional[tuple] = None
    stats: Optional[EngineStats] = None


class DeltaEncoder:
    """Replica side: each cumulative ``RequestOutput`` as the delta since the previous one."""

    def __init__(self, replica: str):
        self.replica = replica
        self._sent: dict[int, tuple[int, int]] = {}     # index -> (text chars, tokens) sent

    def encode(self, out: RequestOutput, stats: Optional[EngineStats] = None) -> OutputDelta:
        """The delta of ``out``."""
        comps = []
        for c in out.outputs:
            chars, tokens = self._sent.get(c.index, (0, 0))
            self._sent[c.index] = (len(c.text), len(c.token_ids))
            comps.append(CompletionDelta(
                c.index, c.text[chars:], list(c.token_ids[tokens:]),
                None if c.logprobs is None else list(c.logprobs[tokens:]),
                c.cumulative_logprob, c.finish_reason, c.stop_reason))
        return OutputDelta(self.replica, comps, out.finished, out.num_cached_tokens, stats=stats)


class OutputAccumulator:
    """Front end side: deltas back into cumulative ``RequestOutput`` s."""

    def __init__(self, request_id: str, prompt_token_ids: list):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self._outputs: dict[int, CompletionOutput] = {}

    def apply(self, delta: OutputDelta) -> RequestOutput:
        """The cumulative output after ``delta`` (fresh objects: the routes may keep them)."""
        for d in delta.completions:
            prev = self._outputs.get(d.index)
            if prev is None:
                prev = CompletionOutput(d.index, "", [], None, None if d.logprobs is None else [])
            self._outputs[d.index] = CompletionOutput(
                d.index, prev.text + d.text, prev.token_ids + d.token_ids, d.cumulative_logprob,
                None if d.logprobs is None else (prev.logprobs or []) + d.logprobs,
                d.finish_reason, d.stop_reason)
        outs = [self._outputs[i] for i in sorted(self._outputs)]
        return RequestOutput(self.request_id, None, self.prompt_token_ids, outs, delta.finished,
                             delta.num_cached_tokens)


def sum_stats(stats) -> EngineStats:
    """Field-wise sum of several ``EngineStats`` (zeros for none)."""
    names = [f.name for f in dataclasses.fields(EngineStats)]
    totals = {n: 0 for n in names}
    for s in stats:
        for n in names:
            totals[n] += getattr(s, n)
    return EngineStats(**totals)


def _replica_failure(exc: BaseException) -> Optional[APIError]:
    """The 5xx for a Ray error of the call to a replica, or None for anything else."""
    import ray.exceptions as rex
    from ray.serve import exceptions as sex
    if isinstance(exc, rex.RayActorError):
        return APIError(503, "the replica serving this request stopped (Serve restarts it); "
                             "retry", code="replica_died")
    if isinstance(exc, (sex.BackPressureError, sex.DeploymentUnavailableError)):
        return APIError(503, f"no replica can take the request: {exc}", code="unavailable")
    if isinstance(exc, rex.RayError):
        return APIError(500, f"replica error: {type(exc).__name__}", code="replica_error")
    return None


class RemoteEngine:
    """An :class:`AsyncEngine` look-alike over a Serve handle to the engine deployment.

    ``handle``: the deployment's ``DeploymentHandle``; ``info``: a replica's :meth:`info`
    (model_dir, max_model_len, max_num_seqs, page_size); ``tokenizer``: the front end's own.
    ``stats`` sums the last ``EngineStats`` each replica sent; ``replicas()`` lists them.
    """

    def __init__(self, handle, info: dict, tokenizer):
        self.engine = SimpleNamespace(model_dir=info["model_dir"], tokenizer=tokenizer,
                                      max_model_len=int(info["max_model_len"]),
                                      max_num_seqs=int(info["max_num_seqs"]))
        self.page_size = int(info["page_size"])
        self._handle = handle.options(stream=True)
        self._stats: dict[str, EngineStats] = {}
        self._requests: dict[str, int] = {}
        self._accepting = True
        self._started = False
        self.in_flight = 0

    # --- the AsyncEngine surface the app uses --------------------------------------------

    @property
    def stats(self) -> EngineStats:
        """The replicas' last reported stats, summed."""
        return sum_stats(self._stats.values())

    def start(self, loop=None) -> None:
        """Mark the front end started (the replicas run on their own)."""
        self._started = True

    def is_alive(self) -> bool:
        """True while started and accepting requests."""
        return self._started and self._accepting

    def stop_accepting(self) -> None:
        """Refuse new requests with 503."""
        self._accepting = False

    def shutdown(self, timeout: float = 10.0) -> None:
        """Refuse new requests (running calls end with their replicas)."""
        self.stop_accepting()

    async def drain(self, timeout: float) -> int:
        """Refuse new requests and wait up to ``timeout`` s for the running ones to end;
        the number still running."""
        import asyncio
        import time
        self.stop_accepting()
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight

    def replicas(self) -> dict:
        """{replica id: {"requests": finished here, **its last EngineStats}}."""
        return {r: {"requests": self._requests.get(r, 0), **dataclasses.asdict(s)}
                for r, s in sorted(self._stats.items())}

    async def generate(self, request_id: str, prompt: dict, params) -> AsyncGenerator[Any, None]:
        """Run the request on a replica; yield cumulative ``RequestOutput`` s (or an
        :class:`Aborted`). APIError 400 for what the engine refuses, 503 when the replica
        dies under the request or the front end is stopping. Closing early cancels the call,
        which aborts the request on its replica."""
        if not self._accepting:
            raise APIError(503, "the server is shutting down", code="unavailable")
        ids = [int(t) for t in prompt["prompt_token_ids"]]
        call = self._handle.generate.remote(
            ReplicaRequest(request_id, ids, params, page_keys(ids, self.page_size)))
        acc = OutputAccumulator(request_id, ids)
        done = False
        self.in_flight += 1
        try:
            try:
                async for delta in call:
                    if delta.error is not None:
                        done = True
                        status, message, code, param = delta.error
                        raise APIError(status, message, code=code, param=param)
                    if delta.stats is not None:
                        self._stats[delta.replica] = delta.stats
                    if delta.aborted:
                        done = True
                        yield Aborted(request_id)
                        return
                    out = acc.apply(delta)
                    done = out.finished
                    if done:
                        self._requests[delta.replica] = self._requests.get(delta.replica, 0) + 1
                    yield out
                    if done:
                        return
            except APIError:
                raise
            except Exception as exc:
                err = _replica_failure(exc)
                if err is None:
                    raise
                done = True
                logger.warning("request %s failed on its replica: %r", request_id, exc)
                raise err from None
            done = True
            raise APIError(500, "the replica ended the stream before the request finished",
                           code="replica_error")
        finally:
            self.in_flight -= 1
            if not done:
                call.cancel()
