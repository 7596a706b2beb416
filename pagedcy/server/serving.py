"""Request handling shared by both endpoints: validation, prompt and sampling parameters, and
running a request on the :class:`AsyncEngine` (to completion, or as a stream of deltas).
"""
from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import AsyncIterator, Awaitable, Callable, Optional

from pagedcy.server.async_engine import Aborted, AsyncEngine
from pagedcy.server.errors import APIError, bad_request, logger, sse_error
from pagedcy.server.protocol import UsageInfo
from pagedcy.server.tracker import ChoiceDelta, RequestTracker


#: Most top logprobs a request may ask for (vLLM's default max_logprobs; OpenAI allows 20).
MAX_LOGPROBS = 20


def json_logprob(value) -> float:
    """A logprob JSON can carry: -inf (and NaN) become -9999.0, as vLLM sends them."""
    v = float(value)
    return v if v > -9999.0 else -9999.0


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


async def until_disconnected(request) -> None:
    """Return when the client of ``request`` (a starlette Request, body read) disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(awaitable: Awaitable, request):
    """``await awaitable`` unless the client disconnects first: then cancel it, raise ClientGone."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work in done:
        return work.result()
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, Exception):
        pass
    raise ClientGone()


def _own_tokenizer(engine):
    """A tokenizer for the event loop's thread, apart from the one the engine thread decodes
    with: a ``tokenizers.Tokenizer`` shared between threads can fail with "Already
    borrowed" (huggingface/tokenizers#537)."""
    model_dir = getattr(engine, "model_dir", None)
    if engine.tokenizer is not None and model_dir is not None:
        from pagedcy.engine.tokenizer import load_tokenizer
        try:
            own = load_tokenizer(model_dir)
        except (OSError, ValueError):
            own = None
        if own is not None:
            return own
    return engine.tokenizer


class RequestRunner:
    """Checks requests against the model and runs them on the engine.

    ``model_names``: names accepted in the ``model`` field (the first is reported);
    ``metrics``: a ServerMetrics or None.
    """

    def __init__(self, engine: AsyncEngine, model_names: list[str], metrics=None):
        self.engine = engine
        self.model_names = list(model_names)
        self.metrics = metrics
        self.tokenizer = _own_tokenizer(engine.engine)
        self.max_model_len = int(engine.engine.max_model_len)

    @property
    def model_name(self) -> str:
        """The name responses report."""
        return self.model_names[0]

    def check_model(self, name: Optional[str]) -> None:
        """404 for a model this server does not serve (None means the served one)."""
        if name is not None and name not in self.model_names:
            raise APIError(404, f"the model '{name}' does not exist; this server serves "
                                f"'{self.model_name}'", param="model", code="model_not_found")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (400 when the model has no tokenizer)."""
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer: send the prompt as token ids",
                              param="prompt")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:   # JSON allows lone surrogates ("\ud800")
            raise bad_request(f"the text is not valid Unicode: {exc.reason} at position "
                              f"{exc.start}", param="prompt", code="invalid_text") from None
        if not add_special_tokens:
            try:
                return list(self.tokenizer.encode(text, add_special_tokens=False))
            except TypeError:     # a tokenizer whose encode adds no special tokens anyway
                pass
        return list(self.tokenizer.encode(text))

    def decode_token(self, token_id: int) -> str:
        """One token as logprobs show it: its text, or ``"bytes:\\xe4"`` for bytes that are
        part of a character (OpenAI's form); the id as a string without a tokenizer."""
        tok = self.tokenizer
        if tok is None:
            return str(token_id)
        if hasattr(tok, "token_text"):
            return tok.token_text(int(token_id))
        return tok.decode([int(token_id)])

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token adds to the text (logprobs' ``bytes``)."""
        tok = self.tokenizer
        if tok is not None and hasattr(tok, "token_bytes"):
            return tok.token_bytes(int(token_id))
        return self.decode_token(token_id).encode()

    def text_offsets(self, token_ids, start: int) -> list[int]:
        """Where each token's text begins, counted in characters from ``start``: the
        tokens' bytes decoded as UTF-8 in order, so a token inside a character starts
        where that character does."""
        import codecs
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        offsets = []
        for tid in token_ids:
            offsets.append(start)
            start += len(dec.decode(self.token_bytes(tid)))
        return offsets

    def check_length(self, prompt_ids: list[int], max_tokens: Optional[int]) -> int:
        """``max_tokens`` checked against the context; None means 'up to the context length'."""
        n = len(prompt_ids)
        if n == 0:
            raise bad_request("the prompt is empty", param="prompt")
        if max_tokens is None:
            max_tokens = self.max_model_len - n
            if max_tokens <= 0:
                raise bad_request(f"the prompt has {n} tokens, the model's context length is "
                                  f"{self.max_model_len}", param="messages",
                                  code="context_length_exceeded")
        elif max_tokens <= 0:
            raise bad_request(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        if n + max_tokens > self.max_model_len:
            raise bad_request(f"this model's maximum context length is {self.max_model_len} "
                              f"tokens; the request has {n} prompt tokens plus max_tokens "
                              f"{max_tokens}", param="max_tokens", code="context_length_exceeded")
        return max_tokens

    def sampling_params(self, req, *, max_tokens: int, logprobs: Optional[int]):
        """``SamplingParams`` of ``req`` (OpenAI defaults for unset fields); 400 if refused."""
        from pagedcy.engine import SamplingParams
        if req.n < 1:
            raise bad_request(f"n must be at least 1, got {req.n}", param="n")
        # here, before anything of size n is built for the request
        limit = self.engine.engine.max_num_seqs
        if req.n > limit:
            raise bad_request(f"n={req.n} exceeds the server's max_num_seqs ({limit})", param="n")
        try:
            return SamplingParams(
                n=req.n, max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=0 if req.top_k is None else req.top_k,
                min_p=0.0 if req.min_p is None else req.min_p,
                seed=req.seed, stop=req.stop_list(), stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos, logprobs=logprobs)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), code="invalid_value") from exc

    # --- running ------------------------------------------------------------------------

    def _received(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_received()

    def _finish(self, tracker: RequestTracker) -> None:
        if self.metrics is not None:
            self.metrics.observe_request(
                ttft=tracker.ttft(), tpot=tracker.tpot(), finish_reasons=tracker.finish_reasons,
                prompt_tokens=tracker.prompt_tokens, completion_tokens=tracker.completion_tokens)

    async def run(self, request_id: str, prompt_ids: list[int], params, tracker: RequestTracker,
                  raw_request) -> RequestTracker:
        """Run to completion (aborting if the client leaves); the tracker holds the result."""
        async def consume():
            async with aclosing(self.engine.generate(
                    request_id, {"prompt_token_ids": prompt_ids}, params)) as gen:
                async for out in gen:
                    if isinstance(out, Aborted):
                        tracker.abort()
                    else:
                        tracker.update(out)
        self._received()
        try:
            await race_disconnect(consume(), raw_request)
        except ClientGone:
            tracker.abort()
            raise
        finally:
            if tracker.finished:
                self._finish(tracker)
        return tracker

    async def stream(self, request_id: str, prompt_ids: list[int], params,
                     tracker: RequestTracker, raw_request,
                     render: Callable[[list[ChoiceDelta]], list[str]],
                     make_chunk: Callable, include_usage: bool) -> AsyncIterator[str]:
        """Start the request and return an iterator of SSE lines.

        The first engine output is awaited here, so a request the engine refuses fails
        with its status code instead of a broken stream. ``render`` turns deltas into
        events; with ``include_usage``, ``make_chunk([], usage)`` is the last chunk before
        ``data: [DONE]``.
        """
        self._received()
        gen = self.engine.generate(request_id, {"prompt_token_ids": prompt_ids}, params)
        try:
            first = await race_disconnect(gen.__anext__(), raw_request)
        except ClientGone:
            await gen.aclose()
            tracker.abort()
            self._finish(tracker)
            raise
        except BaseException:
            await gen.aclose()
            raise
        async def never_started():
            await gen.aclose()
            tracker.abort()
            self._finish(tracker)
        return EventStream(self._events(gen, first, tracker, render,
                                        make_chunk if include_usage else None), never_started)

    async def _events(self, gen, first, tracker, render, make_chunk) -> AsyncIterator[str]:
        try:
            async with aclosing(gen):
                out = first
                while True:
                    deltas = tracker.abort() if isinstance(out, Aborted) else tracker.update(out)
                    for event in render(deltas):
                        yield event
                    if out.finished:
                        break
                    out = await gen.__anext__()
            if make_chunk is not None:
                yield sse(make_chunk([], UsageInfo(**tracker.usage())))
        except APIError as err:          # the engine failed after the stream started
            yield sse_error(err)
        except Exception as exc:         # a bug: tell the client in the stream, keep serving
            logger.exception("stream failed")
            yield sse_error(APIError(500, f"internal error: {type(exc).__name__}"))
        finally:
            if not tracker.finished:      # the client left: generate() aborted the request
                tracker.abort()
            self._finish(tracker)
        yield "data: [DONE]\n\n"


class EventStream:
    """An async iterator over ``events`` whose ``aclose`` also ends the request when the
    response never started iterating (the client left between the first output and the
    first byte): closing an unstarted async generator runs none of its code."""

    def __init__(self, events, on_close_unstarted: Callable[[], Awaitable[None]]):
        self._events = events
        self._on_close_unstarted: Optional[Callable[[], Awaitable[None]]] = on_close_unstarted

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        self._on_close_unstarted = None
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Close the events; end the request if they never started."""
        pending, self._on_close_unstarted = self._on_close_unstarted, None
        if pending is not None:
            await pending()
        await self._events.aclose()


def sse(model) -> str:
    """One server-sent event carrying a pydantic model (None fields left out)."""
    return f"data: {model.model_dump_json(exclude_none=True)}\n\n"
